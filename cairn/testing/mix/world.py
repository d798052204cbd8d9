"""What one execution of a program was told, kept for the checks: each run it created
(its id, workflow, tenant, the input it should read back, whether the write was accepted,
refused or rolled back, the signals and steer messages accepted for it), each schedule,
and the violations found."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from cairn.testing.mix.program import Names

# What became of a write: accepted (it must read back), refused (nothing written),
# rolled back (the caller's transaction ended so: nothing may remain), unknown (the
# surface could not be reached: either may be true).
ACCEPTED, REFUSED, ROLLED_BACK, UNKNOWN = "accepted", "refused", "rolled_back", "unknown"


@dataclasses.dataclass
class RunModel:
    name: str  # the program's name for it ("r0")
    id: str
    flow: str
    tenant: str | None
    input: Any  # what it must read back
    origin: str  # the operation that made it
    fate: str = ACCEPTED
    ops: list[int] = dataclasses.field(default_factory=list)  # the operations on it
    signals: list[Any] = dataclasses.field(default_factory=list)  # accepted, in order
    steers: list[Any] = dataclasses.field(default_factory=list)
    cancelled: bool = False  # a cancel of it was accepted
    faulted: bool = False  # a fault aimed at it
    rewound: bool = False
    decided: str | None = None
    budget: float | None = None


@dataclasses.dataclass(frozen=True)
class Violation:
    """An invariant that did not hold: its name, a short kind (what a shrunk program must
    show again), what was seen, and the program's names involved."""

    invariant: str
    kind: str
    detail: str
    names: tuple[str, ...] = ()

    @property
    def signature(self) -> str:
        return f"{self.invariant}:{self.kind}"

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.detail}"


@dataclasses.dataclass
class World:
    names: Names
    started: dt.datetime  # the database's clock when the program began
    runs: dict[str, RunModel] = dataclasses.field(default_factory=dict)
    schedules: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    outcomes: list[str] = dataclasses.field(default_factory=list)  # one per operation
    violations: list[Violation] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # seen, within what is promised
    faults: int = 0  # faults that landed
    checks: int = 0  # invariant checks made
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # where time went

    def by_id(self, run_id: str) -> RunModel | None:
        return next((r for r in self.runs.values() if r.id == run_id), None)

    def accepted(self) -> list[RunModel]:
        return [r for r in self.runs.values() if r.fate == ACCEPTED]

    def violate(self, invariant: str, kind: str, detail: str, *names: str) -> None:
        self.violations.append(Violation(invariant, kind, detail, tuple(n for n in names if n)))
