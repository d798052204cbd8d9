"""cairn's benchmark suite: `python -m bench` (or `cairn bench`); see bench/runner.py."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from bench.runner import main as run

    return run(argv)


__all__ = ["main"]
