"""A mix program: a list of operations, each a JSON object {"op": kind, ...}, that names
its runs, tenants and schedules symbolically ("r0", "t1", "s0"); each execution gives
them ids of its own (Names), so one fleet runs many programs, and the same program again,
without one seeing another's. What each kind takes:

    enqueue      run, flow, input, via (client | async | http), as (a tenant or null:
                 the admin), priority, key (a concurrency key), budget (usd)
    enqueue_tx   run, flow, input, end (commit | rollback), idle (the enqueue is the
                 connection's first statement), as
    debounce     run, flow, input, key, wait (seconds), as
    fork         run, new, at (first | last), patch, via, as
    rewind       run, to (first | last), as
    replay       flow (the runs of it that failed since the program began)
    signal       run, payload, id, via, as            (the event "go")
    steer        run, message, via, as
    cancel       run, via, as
    decide       run, decision (approve | deny | edit), as
    resolve      run, done
    raise_budget run, usd
    tenant_budget  tenant, action (set | delete), usd
    schedule_add   schedule, flow, input, every (seconds)
    schedule     schedule, action (list | pause | resume | remove), as
    read         what (get | list | counts | history | calls | children | forks |
                 events), run, via, as
    settle       run (or null: all of the program's), timeout
  faults:
    model_429_pause  run: the run's next model request is answered 429 (retry-after
                     1 s) and its sender SIGSTOPped inside that back-off until another
                     process took the run over (at most 20 s), then SIGCONTed
    model_fail       status (429 | 500 | 503 | 529), n: the next n model requests
    model_slow       ms: every model answer that much later, until the program ends
    kill_at          run, point: the run's worker SIGKILLs itself at that point
                     (cairn/testing/faults.py: before_effect, after_effect,
                     after_save, before_call:0, after_call:0)
    kill_holder      run, whole: SIGKILL the process holding the run (whole: its
                     worker, which is replaced)
    pause_holder     run: SIGSTOP it past the lease, SIGCONT once taken over
    restart          what (serve | beat): SIGKILL it, start it again
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Op = dict[str, Any]
Program = list[Op]

# The operations that are faults: counted apart in the report.
FAULTS = frozenset(
    {
        "model_429_pause",
        "model_fail",
        "model_slow",
        "kill_at",
        "kill_holder",
        "pause_holder",
        "restart",
    }
)
# The fields an operation refers to its objects by.
REFS = ("run", "new", "schedule", "tenant", "as")


class Names:
    """The ids one execution gives a program's symbolic names: `<prefix>-r0` for runs and
    schedules, `<prefix>t0` for tenants, and marker strings `<prefix>mk<n>` that the
    program's payloads carry (found in clear in a store, one is a leak)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def run(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def tenant(self, name: str | None) -> str | None:
        return None if name is None else f"{self.prefix}{name}"

    def schedule(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    @property
    def mark(self) -> str:
        """What every marker of this execution starts with."""
        return f"{self.prefix}mk"

    def fill(self, value: Any) -> Any:
        """value as sent: each "@mk<n>" in its strings made this execution's marker, and
        each {"@deep": n, "leaf": x} an object nested n deep ({"a": {"a": ... x}})."""
        if isinstance(value, str):
            return value.replace("@mk", self.mark)
        if isinstance(value, list):
            return [self.fill(v) for v in value]
        if isinstance(value, dict):
            if set(value) == {"@deep", "leaf"}:
                nested = self.fill(value["leaf"])
                for _ in range(int(value["@deep"])):
                    nested = {"a": nested}
                return nested
            return {self.fill(k): self.fill(v) for k, v in value.items()}
        return value


def refs(op: Op) -> set[str]:
    """The symbolic names an operation refers to."""
    return {str(op[f]) for f in REFS if op.get(f) is not None}


def dumps(program: Program) -> str:
    """The program as JSON, one operation a line."""
    return "[\n" + ",\n".join("  " + json.dumps(op, sort_keys=False) for op in program) + "\n]"


def load(path: str | Path) -> Program:
    """A program from a file written by dumps (or any JSON list of operations)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list) or not all(isinstance(op, dict) and "op" in op for op in data):
        raise ValueError(f"{path}: not a mix program (a JSON list of {{'op': ...}} objects)")
    return data


def as_pytest(program: Program, *, seed: int, found: str, modules: tuple[str, ...] = ()) -> str:
    """A pytest test that runs the program again and fails as it did (Python literals, one
    operation a line), on the session's fleet: the `mix_fleet` fixture (tests/mix's, or
    `mix_fleet = cairn.testing.mix.mix_fleet_fixture()` in a conftest)."""
    ops = "".join(f"        {op!r},\n" for op in program)
    extra = f", modules={modules!r}" if modules else ""
    found = found.replace('"""', "'''").replace("\\", "/")
    return (
        f"def test_mix_seed_{seed}(mix_fleet) -> None:\n"
        f'    """Found by `cairn chaos mix --seed {seed}`: {found}"""\n'
        "    from cairn.testing.mix import check_program\n\n"
        f"    program = [\n{ops}    ]\n"
        f"    check_program(program, fleet=mix_fleet{extra})\n"
    )
