"""Would the code loaded in this process carry the live runs on? (`cairn deploy check`)

For each live run: its workflow and step still exist (a renamed step under its new
name), its saved state upgrades to this code's version and its input still validates,
and its current step, replayed against its journal, makes the journaled calls its
record holds, in the same order and under the same names. The replay serves every
recorded call (and every done `ctx.once`) from the record and stops at the first thing
the record does not hold: a new call, a model call, an effect, `ctx.db`. So nothing is
sent, written or called. Code that acts outside ctx (a bare HTTP call in a step) is not
replay-safe to begin with, and runs in the check as it would on a replay.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any

from cairn.core.errors import JournalDiverged
from cairn.core.records import START
from cairn.steps import registry
from cairn.steps.context import Context
from cairn.steps.registry import DONE
from cairn.workers import asyncsteps
from cairn.workers.loop import Stop, _going_on, _step_function, renamed_from

if TYPE_CHECKING:
    from cairn.core.records import Checkpoint
    from cairn.store.contract import CheckpointStore


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

    def ensure_owner(self, *, cancel: bool = True) -> None:
        raise _Beyond("an effect")  # ctx.once, ctx.idempotency_key: an effect is next

    def _ensure_before_call(self) -> None:
        raise _Beyond("a new call")  # the record holds no call at this place

    @property
    def db(self) -> Any:
        raise _Beyond("ctx.db")  # the step's own writes


def check_run(store: CheckpointStore, cp: Checkpoint) -> Finding:
    """The verdict on one live run's checkpoint (store: to read its journal)."""

    def found(ok: bool, problem: str = "", step: str | None = None, **more: Any) -> Finding:
        return Finding(cp.run_id, cp.workflow, step or cp.cursor, ok, problem, **more)

    flow = registry.find(cp.workflow)
    if flow is None:
        return found(False, f"no workflow {cp.workflow!r} in this code")
    try:
        going = _going_on(cp, flow, _Lease(cp), resumed=False)  # type: ignore[arg-type]
    except Stop as exc:
        return found(False, str(exc))
    except Exception as exc:  # noqa: BLE001 (the input's validator: the user's code)
        return found(False, f"its input no longer validates: {type(exc).__name__}: {exc}")
    if going.cursor in (DONE, START):
        return found(True)
    try:
        fn = _step_function(going, flow)
    except Exception as exc:  # noqa: BLE001 (Stop, or past max_steps)
        return found(False, str(exc), going.cursor)
    # A step renamed while the run was inside it: the worker goes on with the visit under
    # the name it began as (its journal, its keys), and so does the replay.
    begun_as = renamed_from(cp.cursor, going.cursor, flow)
    at = going if begun_as is None else dataclasses.replace(going, cursor=begun_as)
    recorded = len(store.journal(at.run_id, at.cursor, at.visits.get(at.cursor, 0)))
    if not recorded:
        return found(True, "", going.cursor)  # no record to hold the code to
    ctx = _Replay(at, store=store, lease=_Lease(at), model=_Model())  # type: ignore[arg-type]

    def verdict(
        ok: bool, problem: str = "", stopped_at: str = "", served: int | None = None
    ) -> Finding:
        return found(
            ok,
            problem,
            going.cursor,
            replayed=min(ctx._calls if served is None else served, recorded),
            recorded=recorded,
            stopped_at=stopped_at,
        )

    try:
        result = fn(ctx)
        if inspect.iscoroutine(result):
            result = asyncsteps.wait_for(result)
    except _Beyond as beyond:
        # A place the record holds is served or diverges; so this is past the record,
        # or an effect or ctx.db before its end: the code agrees as far as it went.
        return verdict(True, stopped_at=str(beyond))
    except JournalDiverged as exc:
        # The diverging call took its place in the count: it was not served.
        return verdict(False, str(exc), served=ctx._calls - 1)
    except Exception as exc:  # noqa: BLE001 (the step's own code, on its recorded answers)
        if isinstance(exc, flow.retries[going.cursor].on):  # its policy retries it: as live
            return verdict(True, stopped_at=f"{type(exc).__name__}, which its step retries")
        return verdict(False, f"the step raised {type(exc).__name__}: {exc}")
    finally:
        ctx.close()
    if ctx._calls < recorded:
        return verdict(
            False,
            f"the step returned after {ctx._calls} of the {recorded} calls its journal "
            "recorded: this code skips calls the run already made",
        )
    return verdict(True)
