"""Would the code loaded in this process carry the live runs on? (`cairn deploy check`)

For each live run: its workflow and step still exist (a renamed step under its new
name), its saved state upgrades to this code's version and its input still validates,
and the step it goes on with, replayed against its journal, makes the journaled calls
its record holds, in the same order and under the same names. A run at a step's start
(pending, or waiting for a signal, an approval or a sleep's end: no journal yet) is
replayed the same way, on its upgraded state, up to its first call; a waiting run's
timeout step too, and the step that made it wait must still wait for the same signal.
The replay serves every recorded call (and every done `ctx.once`) from the record and
stops at the first thing the record does not hold: a new call, a model call, an effect,
`ctx.db`, the payload of a signal not sent yet. So nothing is sent, written or called. Code that acts outside ctx (a bare HTTP call in a step) is not
replay-safe to begin with, and runs in the check as it would on a replay.

The runs come from the store, or from a file `cairn runs export` wrote (`exported`: each
run's checkpoint row and the journal of the step visit it is in, and of a waiting
run's visit that made it wait, one JSON object a line), which the check reads with no database: CI holds new code to production's runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from cairn.core.errors import CairnError, JournalDiverged
from cairn.core.records import Call
from cairn.core.status import RunStatus
from cairn.steps import registry
from cairn.steps.context import Context
from cairn.steps.registry import DONE, StepResult
from cairn.workers import asyncsteps
from cairn.workers.loop import Stop, _going_on, _step_function, checked, renamed_from

if TYPE_CHECKING:
    from cairn.core.records import Checkpoint
    from cairn.store.contract import CheckpointStore, RunStore

# A line's format; a reader refuses another.
EXPORT_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Finding:
    """One live run's verdict: ok, or the first thing that breaks (problem); and how far
    the replay of its step went (replayed of recorded calls, and what it stopped at)."""

    run_id: str
    workflow: str
    step: str
    ok: bool
    problem: str = ""
    replayed: int = 0
    recorded: int = 0
    stopped_at: str = ""


class _Beyond(BaseException):
    """The replay reached work its record does not hold (what: a new call, an effect,
    ctx.db): where the check stops. A BaseException, so a step's `except Exception`
    cannot swallow it."""


class _Lease:
    """No lease: nothing the replay does writes."""

    def __init__(self, cp: Checkpoint) -> None:
        self.run_id, self.epoch, self.token = cp.run_id, cp.epoch, "deploy-check"

    def ensure(self, fresh: bool = False) -> None:
        pass


class _Model:
    """Recorded answers decoded as the worker's client does; no request is ever sent."""

    @staticmethod
    def decode(data: Any) -> Any:
        from cairn.steps.model import ModelClient

        return ModelClient.decode(data)

    def create(self, **request: Any) -> Any:
        raise _Beyond("a new model call")

    def worst_cost(self, **request: Any) -> float:
        return 0.0


class _Replay(Context):
    """A step's context that serves its journal and stops before anything new."""

    # The run waits for a signal that has not come: the step's read of it is past what
    # the check can know (its payload), and the replay stops there.
    unsent = False

    @property
    def signal(self) -> Any:
        if self.unsent:
            raise _Beyond("the signal it waits for, not sent yet")
        return self._signal

    @signal.setter
    def signal(self, payload: Any) -> None:
        self._signal = payload

    def ensure_owner(self, *, cancel: bool = True) -> None:
        raise _Beyond("an effect")  # ctx.once, ctx.idempotency_key: an effect is next

    def _ensure_before_call(self) -> None:
        raise _Beyond("a new call")  # the record holds no call at this place

    @property
    def db(self) -> Any:
        raise _Beyond("ctx.db")  # the step's own writes


def check_row(store: CheckpointStore | Exported, row: dict[str, Any]) -> Finding:
    """The verdict on one live run's checkpoint row as stored (load_row's): one this code
    cannot read (another payload version, a corrupt row) is broken too."""
    from cairn.store.rows import _checkpoint

    try:
        cp = _checkpoint(row)
    except CairnError as exc:  # IncompatibleCheckpoint, CorruptCheckpoint
        return Finding(row["run_id"], row["workflow"], row["cursor"], False, str(exc))
    return check_run(store, cp)


def check_run(store: CheckpointStore | Exported, cp: Checkpoint) -> Finding:
    """The verdict on one live run's checkpoint (store: to read its journal): the step it
    goes on with replayed, whether the run is inside it (its journal served) or at its
    start (pending, or waiting for a signal, an approval, a sleep's end), as the worker
    would run it; a wait's other way on (its timeout's step) too; and a wait for a signal
    held to the step that made it wait."""
    flow = registry.find(cp.workflow)
    if flow is None:
        return Finding(
            cp.run_id, cp.workflow, cp.cursor, False, f"no workflow {cp.workflow!r} in this code"
        )
    # Waiting for a signal that has not come: a signal takes it to its cursor, its
    # timeout (if it has one) to the timeout's step, with no signal (wait_over, as beat
    # wakes it).
    unsent = (
        cp.status == RunStatus.WAITING
        and cp.wait_event is not None
        and cp.signal is None
        and not cp.wait_over
    )
    found = _goes_on(store, flow, cp, unsent)
    if unsent and found.ok and cp.wait_timeout_cursor not in (None, cp.cursor):
        timeout = _goes_on(store, flow, dataclasses.replace(cp, wait_over=True), False)
        if not timeout.ok:
            found = dataclasses.replace(
                timeout, problem=f"on its wait's timeout: {timeout.problem}"
            )
    if unsent and found.ok and not (cp.wait_event or "").startswith("cairn."):
        found = _waits_as_before(store, flow, cp) or found
    return found


def _goes_on(
    store: CheckpointStore | Exported, flow: registry.Workflow, cp: Checkpoint, unsent: bool
) -> Finding:
    """The verdict on the step cp goes on with, replayed on its journal (none at the
    step's start) up to its end or the first thing the record does not hold."""

    def found(ok: bool, problem: str = "", step: str | None = None, **more: Any) -> Finding:
        return Finding(cp.run_id, cp.workflow, step or cp.cursor, ok, problem, **more)

    try:
        going = _going_on(cp, flow, _Lease(cp), resumed=False)  # type: ignore[arg-type]
    except Stop as exc:
        return found(False, str(exc))
    except Exception as exc:  # noqa: BLE001 (the input's validator: the user's code)
        return found(False, f"its input no longer validates: {type(exc).__name__}: {exc}")
    if going.cursor == DONE:
        return found(True)
    try:
        fn = _step_function(going, flow)
    except Exception as exc:  # noqa: BLE001 (Stop, or past max_steps)
        return found(False, str(exc), going.cursor)
    # A step renamed while the run was inside it: the worker goes on with the visit under
    # the name it began as (its journal, its keys), and so does the replay.
    begun_as = renamed_from(cp.cursor, going.cursor, flow)
    at = going if begun_as is None else dataclasses.replace(going, cursor=begun_as)
    replay = _replay(store, flow, at, fn, going.cursor, unsent)
    problem = replay.problem
    if not problem and replay.returned and replay.calls < replay.recorded:
        problem = (
            f"the step returned after {replay.calls} of the {replay.recorded} calls its "
            "journal recorded: this code skips calls the run already made"
        )
    return found(
        not problem,
        problem,
        going.cursor,
        replayed=replay.served,
        recorded=replay.recorded,
        stopped_at=replay.stopped_at,
    )


@dataclasses.dataclass(frozen=True)
class _Replayed:
    """How one replay of a step went: what it returned (result, when it ran to its end),
    or the problem it met, or where it stopped (past its record); the calls it made,
    served of recorded."""

    recorded: int
    calls: int = 0
    served: int = 0
    returned: bool = False
    result: Any = None
    problem: str = ""
    stopped_at: str = ""


def _replay(
    store: CheckpointStore | Exported,
    flow: registry.Workflow,
    at: Checkpoint,
    fn: Any,
    step: str,
    unsent: bool = False,
) -> _Replayed:
    """Run the step fn at `at` (its cursor: the name the visit began as; step: its name
    now) against the journal of that visit: recorded calls served, and a stop before
    anything the record does not hold (a call, a model request, an effect, ctx.db, a
    signal not sent yet). Nothing is sent or written."""
    recorded = len(store.journal(at.run_id, at.cursor, at.visits.get(at.cursor, 0)))
    runs = cast("RunStore", store)  # an export's answers what the replay asks
    ctx = _Replay(at, store=runs, lease=_Lease(at), model=_Model())  # type: ignore[arg-type]
    ctx.unsent = unsent

    def went(served: int | None = None, **how: Any) -> _Replayed:
        served = ctx._calls if served is None else served
        return _Replayed(recorded, ctx._calls, min(served, recorded), **how)

    try:
        result = fn(ctx)
        if inspect.iscoroutine(result):
            result = asyncsteps.wait_for(result)
    except _Beyond as beyond:
        # A place the record holds is served or diverges; so this is past the record,
        # or an effect or ctx.db before its end: the code agrees as far as it went.
        return went(stopped_at=str(beyond))
    except JournalDiverged as exc:
        # The diverging call took its place in the count: it was not served.
        return went(ctx._calls - 1, problem=str(exc))
    except Exception as exc:  # noqa: BLE001 (the step's own code, on its recorded answers)
        if isinstance(exc, flow.retries[step].on):  # its policy retries it: as live
            return went(stopped_at=f"{type(exc).__name__}, which its step retries")
        return went(problem=f"the step raised {type(exc).__name__}: {exc}")
    finally:
        ctx.close()
    try:  # as the worker's save would take it: a StepResult, to steps this code has
        checked(dataclasses.replace(at, cursor=step), flow, result)
    except CairnError as exc:
        return went(returned=True, result=result, problem=str(exc))
    return went(returned=True, result=result)


def _waits_as_before(
    store: CheckpointStore | Exported, flow: registry.Workflow, cp: Checkpoint
) -> Finding | None:
    """A run waiting for a signal, held to the step that made it wait: that step's visit
    replayed on its journal and the run's state (as the wait saved it) must still wait
    for the same signal, or the signal this code's callers send (its new name) never wakes
    the run. None: no verdict (the step is gone, or its replay stopped before it
    returned, or it returned no wait for a named signal)."""
    saved = [
        h for h in store.history(cp.run_id) if h["seq"] == cp.seq - 1 and h["outcome"] == "saved"
    ]
    if not saved:
        return None
    began, visit = saved[-1]["cursor"], saved[-1]["visit"]
    step = flow.current(began)
    fn = flow.steps.get(step)
    if fn is None:
        return None
    try:
        going = _going_on(cp, flow, _Lease(cp), resumed=False)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 (already judged by the step the run goes on with)
        return None
    at = dataclasses.replace(
        going, cursor=began, visits={**going.visits, began: visit}, signal=None
    )
    replay = _replay(store, flow, at, fn, step)
    wait = replay.result.waits_for if isinstance(replay.result, StepResult) else None
    if wait is None or wait.event is None or wait.event == cp.wait_event:
        return None
    return Finding(
        cp.run_id,
        cp.workflow,
        step,
        False,
        f"the run waits for signal {cp.wait_event!r}, and this code's step {step!r} "
        f"(replayed on its journal) waits for {wait.event!r} instead: a signal "
        f"{wait.event!r} will not wake it. Keep the old name for runs already waiting",
        replayed=replay.served,
        recorded=replay.recorded,
    )


# -- runs exported to a file (`cairn runs export`, `cairn deploy check --runs`) ---------
def export_run(store: CheckpointStore, run_id: str) -> dict[str, Any] | None:
    """One run as a line of an export: its checkpoint row as stored (window included) and
    the calls recorded for the step visit it is in (its scoped calls too); None: no such
    run."""
    row = store.load_row(run_id)
    if row is None:
        return None
    # The visit in flight is the one past the step's saved visits: its calls are recorded
    # under the step's name as saved (a run at seq 0 has not saved its first step's, and a
    # step renamed since keeps the name it began as), whatever the code calls it now.
    # All the run's calls are read to find them (an operator's read, once per release):
    # a scope's ("<step>/<scope>") are recorded apart from the step's own.
    saved = row["visits"] if isinstance(row["visits"], dict) else {}
    # A run waiting for a signal: the step visit that made it wait (its history row), and
    # that visit's calls, which the check replays to hold the wait to this code's.
    waited = None
    if row.get("wait_event") is not None:
        waited = next(
            (
                {k: h[k] for k in ("seq", "cursor", "visit", "outcome")}
                for h in reversed(store.history(run_id))
                if h["seq"] == row["seq"] - 1 and h["outcome"] == "saved"
            ),
            None,
        )
    waited_visit = (waited["cursor"], waited["visit"]) if waited else None
    calls = [
        {k: c[k] for k in ("cursor", "visit", "pos", "name", "result", "error", "cost_usd")}
        for c in store.calls(run_id, limit=1_000_000)
        if c["visit"] == saved.get(step := c["cursor"].split("/", 1)[0], 0)
        or (step, c["visit"]) == waited_visit
    ]
    checkpoint = {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in row.items()}
    return {"cairn_export": EXPORT_FORMAT, "run_id": run_id, "checkpoint": checkpoint,
            "journal": calls, "waited_in": waited}  # fmt: skip


class BadExport(CairnError):
    """A file that is not an export of runs (`cairn runs export`) this code reads."""


def read_export(lines: Iterable[str], where: str) -> Iterator[dict[str, Any]]:
    """The exported runs of lines (a file's, named `where` in errors), each as
    export_run made it, its checkpoint's timestamps parsed again."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadExport(
                f"{where}:{n} is not JSON ({exc}): not a `cairn runs export` file"
            ) from None
        if not isinstance(record, dict) or "checkpoint" not in record:
            raise BadExport(f"{where}:{n} holds no run: not a `cairn runs export` file")
        if record.get("cairn_export") != EXPORT_FORMAT:
            raise BadExport(
                f"{where}:{n} is export format {record.get('cairn_export')!r}, this code reads "
                f"{EXPORT_FORMAT}: export the runs again with this version's `cairn runs export`"
            )
        cp = record["checkpoint"]
        if isinstance(cp.get("updated_at"), str):
            cp["updated_at"] = dt.datetime.fromisoformat(cp["updated_at"])
        yield record


class Exported:
    """What the replay reads of a store, for exported runs: their journals, no database.
    The rest of a run (its children, its ledger) an export does not hold: a step that asks
    stops the replay there, as at anything new."""

    def __init__(self, records: Iterable[dict[str, Any]]) -> None:
        self._calls: dict[tuple[str, str, int], list[Call]] = {}
        records = list(records)
        # A waiting run's history as far as the check reads it: the save that made it wait.
        self._waited = {r["run_id"]: r["waited_in"] for r in records if r.get("waited_in")}
        for record in records:
            for c in record["journal"]:
                key = (record["run_id"], c["cursor"], c["visit"])
                self._calls.setdefault(key, []).append(
                    Call(pos=c["pos"], name=c["name"], result=c["result"], error=c["error"],
                         cost_usd=c["cost_usd"])
                )  # fmt: skip

    def journal(self, run_id: str, cursor: str, visit: int) -> list[Call]:
        return sorted(self._calls.get((run_id, cursor, visit), []), key=lambda c: c.pos)

    def history(self, run_id: str) -> list[dict[str, Any]]:
        waited = self._waited.get(run_id)
        return [waited] if waited else []

    def children(self, run_id: str, seq: int | None = None, limit: int = 10_000) -> Any:
        raise _Beyond("the run's children, which an export does not hold")

    def cancel_reason(self, run_id: str) -> str | None:
        return None

    def steers(self, run_id: str, numbers: list[int]) -> Any:
        raise _Beyond("the run's steer messages, which an export does not hold")

    def was_done(self, key: str) -> tuple[bool, Any]:
        raise _Beyond("an effect")

    def transaction(self) -> Any:
        raise _Beyond("ctx.db")

    @staticmethod
    def outage(exc: BaseException) -> Exception | None:
        return None
