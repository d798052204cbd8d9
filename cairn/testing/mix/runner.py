"""run_mix: programs from a seed on one fleet until a budget of time is spent; a program
that breaks an invariant is shrunk and reported as a pytest test and a file to replay.
check_program: one program again (a pasted test, `cairn chaos mix --replay FILE`)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.markup import escape

from cairn.testing import fleet as fleet_mod
from cairn.testing.mix.check import INVARIANTS, check
from cairn.testing.mix.execute import Execution
from cairn.testing.mix.generate import Generator
from cairn.testing.mix.program import FAULTS, Program, as_pytest, dumps
from cairn.testing.mix.rig import FleetOptions, MixFleet, mix_redis_url
from cairn.testing.mix.shrink import shrink
from cairn.testing.mix.world import Violation, World

STATE = fleet_mod.STATE / "mix"


def execute(fleet: MixFleet, program: Program, prefix: str, say: Callable[[str], None]) -> World:
    """The program on the fleet under prefix's names, checked (against the twin too),
    then cleaned up after."""
    run = Execution(fleet, program, prefix, say)
    try:
        world = run.run()
        began = time.monotonic()
        check(fleet, world, program, fleet.twin())
        world.seconds["checks"] = time.monotonic() - began
    finally:
        run.cleanup()
    spent = ", ".join(f"{k} {v:.1f}s" for k, v in world.seconds.items())
    say(f"{prefix}: {len(program)} operations, {len(world.violations)} violations ({spent})")
    return world


def fleet_options(
    *,
    database_url: str | None = None,
    redis_url: str | None = None,
    workflows: str = "",
    workers: int = 2,
    concurrency: int = 2,
    lease_ttl: float = 2.0,
    state_dir: Path | None = None,
    keep: bool = False,
) -> FleetOptions:
    """The fleet's options, what is not given from the environment (Settings)."""
    from cairn.core.settings import Settings

    env = Settings.from_env()
    modules = tuple(m.strip() for m in workflows.split(",") if m.strip())
    if modules:
        from cairn.steps import registry

        registry.import_modules(modules)  # UnknownWorkflow names a module that is not there
    return FleetOptions(
        base_db=database_url or env.database_url,
        redis_url=redis_url or mix_redis_url(env.redis_url),
        state=state_dir or STATE / time.strftime("%Y%m%d_%H%M%S"),
        workers=workers,
        concurrency=concurrency,
        lease_ttl=lease_ttl,
        modules=modules,
        keep=keep,
    )


def run_mix(
    options: FleetOptions,
    *,
    seed: int | None = None,
    budget: float = 300.0,
    shrink_budget: float = 180.0,
    keep_going: bool = False,
    replay: Path | None = None,
    template: dict[str, Any] | None = None,
    fleet: MixFleet | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Programs from seed on a fleet for `budget` seconds (its start not counted); the
    first violation's program shrunk (keep_going: each new kind's, and go on) in at most
    shrink_budget seconds more. With replay, that program's file once instead. Returns the
    report (report["ok"]: nothing found)."""
    seed = random.SystemRandom().randrange(1, 10**6) if seed is None else seed
    say(f"[bold]mix[/]: seed {seed}, budget {budget:g}s (replay: cairn chaos mix --seed {seed})")
    with _fleet(options, fleet, say) as mix:
        if replay is not None:
            from cairn.testing.mix.program import load

            return _replayed(mix, load(replay), seed, say)
        flows = user_flows(options.modules)
        if options.modules and not flows:
            from cairn.core.errors import UnknownWorkflow

            raise UnknownWorkflow(
                f"--workflows {','.join(options.modules)}: no workflow registered"
            )
        return _Mix(mix, seed, budget, shrink_budget, keep_going, flows, template, say).run()


class _fleet:
    """The fleet given, or one started (and closed) for this mix."""

    def __init__(
        self, options: FleetOptions, given: MixFleet | None, say: Callable[[str], None]
    ) -> None:
        self.options, self.given, self.say = options, given, say
        self.started: MixFleet | None = None

    def __enter__(self) -> MixFleet:
        if self.given is not None:
            return self.given
        self.started = MixFleet(self.options, self.say)
        try:
            return self.started.start()
        except BaseException:
            self.started.close()
            raise

    def __exit__(self, *exc: object) -> None:
        if self.started is not None:
            self.started.close()


class _Mix:
    def __init__(
        self,
        fleet: MixFleet,
        seed: int,
        budget: float,
        shrink_budget: float,
        keep_going: bool,
        flows: tuple[str, ...],
        template: dict[str, Any] | None,
        say: Callable[[str], None],
    ) -> None:
        self.fleet, self.seed, self.budget, self.say = fleet, seed, budget, say
        self.shrink_budget, self.keep_going = shrink_budget, keep_going
        rng = random.Random(seed)
        self.gen = Generator(rng, flows, template=template) if flows else Generator(rng)
        self.report: dict[str, Any] = {
            "seed": seed, "budget_s": budget, "programs": 0, "operations": 0, "faults": 0,
            "fault_ops": 0, "checks": 0, "invariants": list(INVARIANTS), "findings": [],
            "notes": [],
        }  # fmt: skip
        self._tries = 0
        self._shrinking = 0.0  # seconds spent shrinking (not counted in the budget)

    def _prefix(self, k: int) -> str:
        self._tries += 1
        return f"m{self.seed}x{k}"

    def _replay(self, k: int) -> Callable[[Program], World]:
        def replay(program: Program) -> World:
            self._tries += 1
            return execute(self.fleet, program, f"m{self.seed}x{k}s{self._tries}", self.say)

        return replay

    def run(self) -> dict[str, Any]:
        start = time.monotonic()
        found: set[str] = set()
        k = 0
        while time.monotonic() - start - self._shrinking < self.budget:
            program = self.gen.program()
            world = execute(self.fleet, program, self._prefix(k), self.say)
            self._count(program, world)
            new = [v for v in world.violations if v.signature not in found]
            for v in _distinct(new):
                found.add(v.signature)
                elapsed = time.monotonic() - start - self._shrinking
                self.say(f"[red]found[/] after {elapsed:.0f}s (program {k}): {escape(str(v))}")
                self._finding(v, program, k, elapsed, world)
                if not self.keep_going:
                    break
            if found and not self.keep_going:
                break
            k += 1
        self.report["elapsed_s"] = round(time.monotonic() - start, 1)
        self.report["shrinking_s"] = round(self._shrinking, 1)
        self.report["ok"] = not self.report["findings"]
        return self.report

    def _count(self, program: Program, world: World) -> None:
        r = self.report
        r["programs"] += 1
        r["operations"] += len(program)
        r["fault_ops"] += sum(1 for op in program if op["op"] in FAULTS)
        r["faults"] += world.faults
        r["checks"] += world.checks
        r["notes"] += world.notes

    def _finding(
        self, v: Violation, program: Program, k: int, elapsed: float, world: World
    ) -> None:
        began = time.monotonic()
        shrunk, tries = shrink(
            program, v.signature, set(v.names), self._replay(k), self.shrink_budget, self.say,
            first=world,
        )  # fmt: skip
        took = time.monotonic() - began
        self._shrinking += took
        path = self.fleet.options.state / f"mix-{self.seed}-{len(self.report['findings'])}.json"
        path.write_text(dumps(shrunk) + "\n")
        self.report["findings"].append(
            {
                "signature": v.signature,
                "invariant": v.invariant,
                "detail": v.detail,
                "found_after_s": round(elapsed, 1),
                "program": k,
                "length": len(program),
                "shrunk": shrunk,
                "shrunk_length": len(shrunk),
                "shrink_tries": tries,
                "shrink_s": round(took, 1),
                "file": str(path),
                "pytest": as_pytest(
                    shrunk, seed=self.seed, found=v.detail, modules=self.fleet.options.modules
                ),
            }
        )


def user_flows(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The workflows the modules registered (their steps are the modules' code)."""
    from cairn.steps import registry

    def theirs(name: str) -> bool:
        fns = registry.get(name).steps.values()
        return any(
            f.__module__ == m or f.__module__.startswith(m + ".") for f in fns for m in modules
        )

    return tuple(n for n in registry.names() if modules and theirs(n))


def _distinct(violations: list[Violation]) -> Iterator[Violation]:
    seen: set[str] = set()
    for v in violations:
        if v.signature not in seen:
            seen.add(v.signature)
            yield v


def _replayed(
    fleet: MixFleet, program: Program, seed: int, say: Callable[[str], None]
) -> dict[str, Any]:
    started = time.monotonic()
    world = execute(fleet, program, f"m{seed}r{int(time.time()) % 100000}", say)
    findings = [
        {
            "signature": v.signature,
            "invariant": v.invariant,
            "detail": v.detail,
            "shrunk": program,
            "shrunk_length": len(program),
        }
        for v in _distinct(world.violations)
    ]
    return {
        "seed": seed, "budget_s": 0, "programs": 1, "operations": len(program),
        "fault_ops": sum(1 for op in program if op["op"] in FAULTS), "faults": world.faults,
        "checks": world.checks, "invariants": list(INVARIANTS), "findings": findings,
        "outcomes": world.outcomes, "elapsed_s": round(time.monotonic() - started, 1),
        "ok": not findings, "replayed": True,
    }  # fmt: skip


def check_program(
    program: Program,
    *,
    fleet: MixFleet | None = None,
    modules: tuple[str, ...] = (),
    tries: int = 2,
    say: Callable[[str], None] = lambda text: None,
) -> None:
    """Run program on a fleet (the one given, or one started from the environment's
    servers); AssertionError naming every invariant it breaks. A program that passes is
    run again (tries times in all): a failure that hangs on timing gets a second chance."""
    options = fleet_options(workflows=",".join(modules))
    with _fleet(options, fleet, say) as mix:
        world = None
        for attempt in range(tries):
            world = execute(mix, program, f"chk{int(time.time() * 1000) % 10**8}a{attempt}", say)
            if world.violations:
                break
    assert world is not None
    if world.violations:
        lines = "\n".join(f"- {v}" for v in _distinct(world.violations))
        outcomes = "\n".join(
            f"  {i}: {op['op']} -> {o}"
            for i, (op, o) in enumerate(zip(program, world.outcomes, strict=False))
        )
        raise AssertionError(f"the program breaks invariants:\n{lines}\noperations:\n{outcomes}")
