"""Shrinking a failing program to one that still fails the same way (the same invariant,
the same kind: a Violation's signature), on the same fleet, each try under fresh names.

Real processes make each try cost seconds, so the search is short and guided:

1. the slice: the operations on the names the violation involves and on the names those
   operations involve (a fork's origin, the tenant acting), to a fixed point; then, if
   that does not fail, with the operations on no name too (a model fault, a restart);
2. the operations skipped in the last failing try (on a name no longer made) go;
3. chunks go, halves first, then quarters, down to single operations, each removal kept
   if the program still fails (a 1-minimal program at the end), until the time is up.

A try that does not fail is not proof: a timing-dependent failure may need a second
chance, so the strict slice is tried twice before it is given up.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cairn.testing.mix.program import Program, refs
from cairn.testing.mix.world import World

# Runs a program under fresh names and returns its world (outcomes and violations).
Replay = Callable[[Program], World]


def fails(world: World, signature: str) -> bool:
    return any(v.signature == signature for v in world.violations)


def sliced(program: Program, names: set[str], *, strict: bool = False) -> Program:
    """The operations on `names` and on what those operations name, to a fixed point;
    unless strict, the operations that name nothing too."""
    keep = set(names)
    while True:
        more = set(keep)
        for op in program:
            if refs(op) & keep:
                more |= refs(op)
        if more == keep:
            break
        keep = more
    return [op for op in program if refs(op) & keep or (not strict and not refs(op))]


def shrink(
    program: Program,
    signature: str,
    names: set[str],
    replay: Replay,
    budget: float,
    say: Callable[[str], None] = print,
    first: World | None = None,
) -> tuple[Program, int]:
    """The smallest program found in `budget` seconds that still fails with `signature`,
    and how many tries it took. first: the program's own failing world (its outcomes)."""
    end = time.monotonic() + budget
    tries = 0
    current = program

    def attempt(candidate: Program, chances: int = 1) -> World | None:
        nonlocal tries
        for _ in range(chances):
            if time.monotonic() >= end:
                return None
            tries += 1
            world = replay(candidate)
            if fails(world, signature):
                return world
        return None

    world = first
    tried: list[Program] = []
    for strict, chances in ((True, 2), (False, 1)):
        cut = sliced(program, names, strict=strict)
        if len(cut) == len(current) or cut in tried:
            continue
        tried.append(cut)
        if (found := attempt(cut, chances)) is not None:
            current, world = cut, found
            break
    say(f"shrink: {len(program)} -> {len(current)} operations (slice)")
    if world is not None:
        outcomes = zip(current, world.outcomes, strict=False)
        live = [op for op, out in outcomes if not out.startswith("skipped")]
        if len(live) < len(current) and (again := attempt(live)) is not None:
            current, world = live, again
    size = max(1, len(current) // 2)
    while size >= 1 and len(current) > 1 and time.monotonic() < end:
        i = len(current)
        while i > 0 and len(current) > 1 and time.monotonic() < end:
            lo = max(0, i - size)
            candidate = current[:lo] + current[i:]
            if candidate and attempt(candidate) is not None:
                current = candidate
                say(f"shrink: {len(current)} operations")
            i = lo
        size //= 2
    return current, tries
