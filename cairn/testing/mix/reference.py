"""The reference model: the same program on the in-memory twin (cairn.testing.memory's
MemoryStore under LocalWorker, the real loop in this process, on a clock the mix moves),
without its faults, on stand-ins of its own. Where a run's outcome cannot hang on timing
(nothing but its enqueue, reads, settles and faults touched it, it is not a fork, it
writes through no ctx.db, and no tenant budget changed under it), the fleet must end it
as the twin did: the same status and the same state (but for the mail API's message ids,
which each stand-in numbers its own). Faults must not change what a run computes.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from cairn.testing.mix.program import FAULTS, Names, Op, Program
from cairn.testing.mix.world import RunModel, World

if TYPE_CHECKING:
    from cairn.client.client import Client
    from cairn.testing.local import LocalWorker
    from cairn.testing.memory import ManualClock

# The operations that leave a run's outcome to the program alone.
TIMELESS = frozenset({"enqueue", "enqueue_tx", "read", "settle"}) | FAULTS
VOLATILE = ("keyed", "once", "at_most")  # mail message ids
SETTLE_SECONDS = 120  # how far the twin's clock moves at most for its runs to settle


def comparable(run: RunModel, program: Program, world: World) -> bool:
    """Whether the run's outcome is the program's alone (see the module's docstring)."""
    if run.origin not in ("enqueue", "enqueue_tx") or run.rewound:
        return False
    if isinstance(run.input, dict) and run.input.get("db"):
        return False  # the twin has no database for ctx.db
    touched = (program[i]["op"] for i in run.ops)
    if any(kind not in TIMELESS for kind in touched):
        return False
    budgets = {
        world.names.tenant(op.get("tenant")) for op in program if op["op"] == "tenant_budget"
    }
    return run.tenant not in budgets


class Twin:
    """The in-memory twin with stand-ins of its own: run(program) -> each run's end."""

    def __init__(self) -> None:
        from cairn.core.settings import Settings
        from cairn.steps.model import ModelClient
        from cairn.testing.local import LocalWorker
        from cairn.testing.memory import ManualClock
        from cairn.testing.standins import MailServer, ModelServer

        self.mail = MailServer().start()
        self.model = ModelServer().start()
        self.settings = Settings(mail_url=self.mail.url, anthropic_base_url=self.model.url)
        self._model = ModelClient(base_url=self.model.url, give_up_after=5.0)
        self._made = (LocalWorker, ManualClock)
        self.clock: ManualClock = ManualClock()
        self.worker: LocalWorker = LocalWorker(clock=self.clock, settings=self.settings)

    def close(self) -> None:
        self._model.close()
        self.mail.stop()
        self.model.stop()

    def run(self, program: Program, names: Names) -> dict[str, tuple[str, Any]]:
        """The program's operations but its faults; each run's (status, state) at the end,
        by the program's name for it."""
        from cairn.client.client import Client

        worker_class, clock_class = self._made  # a fresh store and clock for each program
        self.clock = clock_class()
        self.worker = worker_class(clock=self.clock, settings=self.settings, model=self._model)
        client = Client(store=self.worker.store, send=self.worker.send, settings=self.settings)
        ids: dict[str, str] = {}
        for op in program:
            if op["op"] not in FAULTS:
                with contextlib.suppress(Exception):  # a refusal here is the fleet's to judge
                    self._apply(client, op, names, ids)
            self._settle()
        for _ in range(SETTLE_SECONDS):
            self.clock.advance(1.0)
            self._settle()
        ends = {}
        for name, run_id in ids.items():
            got = client.get(run_id)
            if got is not None:
                ends[name] = (str(got.status), _stable(got.state))
        return ends

    def _settle(self) -> None:
        with contextlib.suppress(RuntimeError):  # a run that never settles: the fleet's to judge
            self.worker.run_until_idle(2_000)

    def _apply(self, client: Client, op: Op, names: Names, ids: dict[str, str]) -> None:
        kind, name = op["op"], str(op.get("run"))
        face = client if op.get("as") is None else client.for_tenant(str(names.tenant(op["as"])))
        data = names.fill(op.get("input") or {})
        if kind == "enqueue" or (kind == "enqueue_tx" and op.get("end", "commit") == "commit"):
            key = op.get("key")
            ids[name] = face.enqueue(
                op["flow"], data, run_id=names.run(name), priority=op.get("priority"),
                concurrency_key=names.run(key) if key else None, budget_usd=op.get("budget"),
            )  # fmt: skip
        elif kind == "debounce":
            ids[name] = face.enqueue(
                op["flow"], data, debounce_key=names.run(op.get("key", "d")),
                debounce=float(op.get("wait", 0.5)),
            )  # fmt: skip
        elif kind == "cancel" and name in ids:
            face.cancel(ids[name])
        elif kind == "signal" and name in ids:
            payload = names.fill(op.get("payload"))
            face.signal(ids[name], "go", payload, signal_id=names.run(op.get("id", "g")))
        elif kind == "steer" and name in ids:
            face.steer(ids[name], names.fill(op.get("message")))
        elif kind == "tenant_budget":
            tenant = str(names.tenant(op.get("tenant", "t1")))
            if op.get("action") == "delete":
                client.delete_tenant_budget(tenant)
            else:
                client.set_tenant_budget(tenant, usd=op.get("usd", 1.0))
        elif kind == "settle":
            self.clock.advance(1.0)


def _stable(state: Any) -> Any:
    """The state as JSON, without the values each stand-in makes its own."""
    if not isinstance(state, dict):
        return state
    return json.loads(json.dumps({k: v for k, v in state.items() if k not in VOLATILE}))


def compare(
    world: World, program: Program, twin: Twin, fleet_ends: dict[str, tuple[str, Any]]
) -> None:
    """Violations for the comparable runs whose end differs from the twin's."""
    from cairn.testing.mix.check import allowed  # check imports this module

    ends = twin.run(program, world.names)
    for run in world.accepted():
        if (
            run.name not in ends
            or run.name not in fleet_ends
            or not comparable(run, program, world)
        ):
            continue
        status, state = fleet_ends[run.name]
        want_status, want_state = ends[run.name]
        if status != want_status and status in allowed(run) - {"done"}:
            continue  # a fault's documented outcome (unknown), judged by `ends`
        if status != want_status or state != want_state:
            world.violate(
                "reference", f"{run.flow}:{status}",
                f"run {run.name} ({run.flow}) ended {status} with state {_short(state)}; "
                f"the twin, running the program without its faults, ended it {want_status} "
                f"with {_short(want_state)}",
                run.name,
            )  # fmt: skip


def fleet_end(status: str, state: Any) -> tuple[str, Any]:
    return str(status), _stable(state)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."
