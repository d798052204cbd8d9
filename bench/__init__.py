"""cairn's benchmark suite, run from a checkout: `python -m bench` (`--only SECTION`);
see bench/runner.py. Not installed with cairn, and no `cairn` command runs it. It reaches
cairn through the public API and, for what it measures underneath, bench/internals.py."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from bench.runner import main as run

    return run(argv)


__all__ = ["main"]
