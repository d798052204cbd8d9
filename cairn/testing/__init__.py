"""Test tooling, kept out of the run path: loopback stand-ins (mail API, Messages API),
real worker processes (fleet), fault hooks, `cairn demo` and `cairn chaos`."""
