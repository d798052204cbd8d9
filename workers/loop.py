"""The durable step loop: load ?? initial, one step, one guarded save, repeat."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from cairn.core import logs
from cairn.core.errors import (
    BudgetExceeded,
    CairnError,
    Cancelled,
    CorruptCheckpoint,
    Deferred,
    HandOff,
    IncompatibleCheckpoint,
    Interrupted,
    JournalDiverged,
    Misrouted,
    OutcomeUnknown,
    RetryLater,
    StaleWrite,
    StoreUnavailable,
    Transient,
    UnknownRun,
    WindowTooLarge,
)
from cairn.core.records import START, Attempt, Checkpoint
from cairn.core.sealing import KeyMissing
from cairn.core.settings import Settings
from cairn.core.status import IDLE, STOPPED, RunStatus
from cairn.steps import registry
from cairn.steps.context import Context
from cairn.steps.context import _step as _current
from cairn.steps.registry import DONE, StepResult
from cairn.steps.window import compact, grown_size, json_size
from cairn.workers import asyncsteps, flow_control, runlog
from cairn.workers.announce import Announcer
from cairn.workers.middleware import NONE, Chain

if TYPE_CHECKING:
    from cairn.steps.model import ModelClient
    from cairn.store.contract import CheckpointStore, HeldLease, LeaseManager
    from cairn.workers.outbox import Outbox

logger = logging.getLogger(__name__)

# A run handed back for a key this worker lacks: the reaper leaves it this long (app.py).
KEY_HOLD = 60.0


class Stop(CairnError):
    """The run stops with status (failed, cancelled, budget_exceeded, incompatible, unknown).
    Raised and caught inside the loop only: run() returns the status."""

    def __init__(
        self,
        status: RunStatus,
        message: str,
        attempt: Attempt | None = None,
        at: Checkpoint | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.attempt, self.at = status, attempt, at


@dataclasses.dataclass(frozen=True, kw_only=True)
class Deps:
    settings: Settings
    store: CheckpointStore
    leases: LeaseManager
    model: ModelClient | None
    middleware: Chain = NONE
    # True once this worker is shutting down: runs are handed back at a step boundary.
    stopping: Callable[[], bool] = lambda: False
    # Run events (steps, tokens, ctx.emit) to Redis; None: the fleet runs without them.
    events: Outbox | None = None
    # Puts a run's message on the broker (resume: on the resume queue); None: nothing is
    # sent, and the reaper finds children and parents waiting for a message.
    send: Callable[[str, bool, int], None] | None = None


def run(run_id: str, deps: Deps) -> RunStatus:
    """Drive one run to its end, or until it waits or this worker lets it go.

    Returns the run's status: done, waiting (parked until a signal or a timeout), or how
    it stopped (failed, cancelled, budget_exceeded, incompatible, unknown), recorded on the run.

    Raises (each a cairn.errors.Interrupted: this delivery ends, the run does not):
        Deferred: another live worker holds the run's lease; deliver it again later.
        RetryLater: a step failed and its Retry policy runs it again after exc.delay.
        HandOff: this worker is stopping, or a new wait's signal had come; send it again.
        Misrouted: the run is pinned to another code version; send it to that version.
        KeyMissing: a payload is sealed under a key this worker lacks (never failing it).
        Transient: Postgres or Redis is down (StoreUnavailable); retry with backoff.
        Superseded: another worker owns the run now; touch nothing more.
    and UnknownRun: no run has this id (nothing to retry).
    """
    deps.middleware.before_run(run_id)
    status: RunStatus | None = None
    try:
        status = _run(run_id, deps)
        return status
    except BaseException as exc:
        deps.middleware.after_run(run_id, exception=exc)
        raise
    finally:
        if status is not None:
            deps.middleware.after_run(run_id, status=status)


def _held(deps: Deps) -> contextlib.AbstractContextManager[None]:
    """A delivery's store calls on one connection, from its claim to its end (a checkout
    per statement is a tenth of a no-op step's CPU), in a process's main thread: a prefork
    pool process or the solo pool, one delivery at a time. Not in the threads pool, whose
    runs, more than its connections, must not each keep one through their steps."""
    if threading.current_thread() is threading.main_thread():
        return deps.store.held()
    return contextlib.nullcontext()


def _run(run_id: str, deps: Deps) -> RunStatus:
    with contextlib.ExitStack() as held:
        return _delivered(run_id, deps, held)


def _delivered(run_id: str, deps: Deps, held: contextlib.ExitStack) -> RunStatus:
    began = time.monotonic()
    try:
        lease, cp = _take(run_id, deps, held)
    except (IncompatibleCheckpoint, CorruptCheckpoint) as exc:
        status = (
            RunStatus.INCOMPATIBLE if isinstance(exc, IncompatibleCheckpoint) else RunStatus.FAILED
        )
        logger.error("%s", exc, extra=logs.run(run_id, "unreadable", status=status))
        deps.store.mark_unreadable(run_id, status, str(exc))
        return status
    status = cp.status
    cut: BaseException | None = None  # what ended the delivery, if it raised
    # This delivery's start and stop lines; it sees the steps' saves as a middleware.
    seen = runlog.Delivery(cp, began)
    try:
        if status in IDLE:
            # A warm shutdown or a reaper race can deliver a finished run again; a queued
            # run is sent when its key's slot frees. A run that stopped is delivered again
            # after a kill between its last commit and its events: the stream is told.
            if status in STOPPED:
                Announcer(deps.events, lease).take_over(cp, deps.store)
            return status
        seen.started()
        lease.start_heartbeat()
        status = _drive(
            cp, lease, dataclasses.replace(deps, middleware=seen.around(deps.middleware))
        )
        if status in STOPPED:
            flow_control.wake_parent(cp, deps)
            flow_control.send_admitted(cp, deps)
        return status
    except BaseException as exc:
        cut = exc
        if isinstance(exc, KeyMissing):
            deps.store.unclaim(run_id, lease.epoch, KEY_HOLD)  # not the run's fault
        raise
    finally:
        if deps.events is not None:
            # What the run's steps emitted before their saves is fenced by this lease: send
            # it before the lease goes (a wait of a few ms at most: the outbox lingers 5).
            deps.events.settle(run_id, timeout=2.0)
        lease.release(ended=status in STOPPED)
        seen.stopped(status, cut)


def _drive(cp: Checkpoint, lease: HeldLease, deps: Deps) -> RunStatus:
    """run() once the run is leased and claimed: its steps, until it ends or waits."""
    store, run_id = deps.store, cp.run_id
    # The run's live events from this delivery. A run that has saved nothing yet may
    # begin its stream here: its first event says so (readers from the start then know
    # the stream holds the whole run).
    fresh_run = cp.seq == (cp.forked_at or 0)
    stream, claimed = Announcer(deps.events, lease, origin=fresh_run), cp
    try:
        # Waiting, or woken by beat (pending, its wait kept and over: see the wake query).
        # A run that saved nothing waited for its debounce's quiet period: it starts afresh.
        waiting = not fresh_run and (
            cp.status == RunStatus.WAITING or (cp.status == RunStatus.PENDING and cp.wait_over)
        )
        # A crash resume: the run was running, or a worker claimed it (our claim is not its
        # first) and died in its first step. (A waiting run was saved and released on
        # purpose; a failed run enqueued again starts its deliveries afresh.)
        resumed = cp.status == RunStatus.RUNNING or (
            cp.status == RunStatus.PENDING and cp.deliveries > 1
        )
        if resumed or waiting or cp.cancel_reason is not None:
            # Before anything this delivery tells or stops: its last worker may have died
            # between a commit and the events that announce it.
            stream.take_over(claimed, store)
        if _idle_wake(cp, deps):
            return RunStatus.WAITING
        _refuse_poison(cp, deps.settings)
        flow = registry.get(cp.workflow)
        cp = _going_on(cp, flow, lease, resumed)
        begun_as = renamed_from(claimed.cursor, cp.cursor, flow)
        if resumed:
            where = f"{cp.cursor!r} (seq {cp.seq})"
            logger.warning("run %s: resuming at %s", run_id, where, extra=logs.at(cp, "resume"))
            deps.middleware.resumed(cp)
        if resumed or waiting:
            why = "worker lost" if resumed else "signal" if cp.signal else "timeout"
            stream.tell(cp, "resumed", {"reason": why})
        # The first step may be a replay; the ones after our own saves are not, and their
        # save read the run not cancelled (at `read`, monotonic).
        read: float | None = None
        while cp.cursor != DONE and cp.status != RunStatus.WAITING:
            if deps.stopping():
                raise HandOff(f"run {run_id}: worker shutting down at {cp.cursor!r}")
            cp, read = _step(cp, flow, lease, deps, stream, read, begun_as)
            begun_as = None
        if cp.status == RunStatus.DONE:
            stream.ended(cp, RunStatus.DONE, None)
        return cp.status
    except Stop as exc:
        logger.warning(
            "run %s %s: %s", run_id, exc.status, exc, extra=logs.at(exc.at or cp, exc.status)
        )
        at = exc.at or cp
        if store.end_attempt(at, exc.status, str(exc), exc.attempt) is not None:
            stream.ended(at, exc.status, str(exc))
        return exc.status
    except Interrupted:
        raise  # this delivery ends, the run does not: the task handles each kind
    except CairnError as exc:
        logger.error("run %s failed: %s", run_id, exc, extra=logs.at(cp, RunStatus.FAILED))
        if store.mark_failed(cp, str(exc)):
            stream.ended(cp, RunStatus.FAILED, str(exc))
        return RunStatus.FAILED


def _idle_wake(cp: Checkpoint, deps: Deps) -> bool:
    """A waiting run woken for nothing (a duplicate message, another event's): True, and
    a parent waiting for its spawn sends the children no worker took. Raises Stop for a
    run that was cancelled."""
    if cp.cancel_reason is not None:
        raise Stop(RunStatus.CANCELLED, cp.cancel_reason)
    if cp.status != RunStatus.WAITING or cp.signal is not None or cp.wait_over:
        return False
    if (cp.wait_event or "").startswith("cairn.children:"):
        flow_control.resend_children(cp, deps)
    return True


def _refuse_poison(cp: Checkpoint, settings: Settings) -> None:
    """Delivered again and again without a save or a recorded failure: the step kills its
    process (OOM, segfault). Stop delivering it."""
    if cp.status != RunStatus.WAITING and cp.deliveries - cp.attempts > settings.max_deliveries:
        raise Stop(
            RunStatus.FAILED,
            f"poison: delivered {cp.deliveries} times without finishing step "
            f"{cp.cursor or '(first)'!r} (CAIRN_MAX_DELIVERIES={settings.max_deliveries})",
        )


def _going_on(
    cp: Checkpoint, flow: registry.Workflow, lease: HeldLease, resumed: bool
) -> Checkpoint:
    """The claimed checkpoint as this delivery goes on from it: its state upgraded to the
    workflow's version, its input checked and its cursor resolved (the enqueuer may not
    have the workflow's code; validators are pure, so every delivery agrees), at this
    lease's epoch. Raises Stop (incompatible) for state no migration reads."""
    state = cp.state
    if cp.flow_version is not None and cp.flow_version != flow.version:
        upgraded = flow.upgrade(cp.state, cp.flow_version)
        if upgraded is None:
            raise Stop(
                RunStatus.INCOMPATIBLE,
                f"run {cp.run_id}: state saved by {flow.name!r} version {cp.flow_version}; "
                f"this code is version {flow.version} and has no migration for it",
            )
        logger.warning(
            "run %s: state migrated from version %d",
            cp.run_id,
            cp.flow_version,
            extra=logs.at(cp, "state_migrated", to_version=flow.version),
        )
        state = upgraded
    # A wait's time came: still waiting (a message came first), or woken by beat (pending,
    # its wait kept). A signal that came first wins.
    timed_out = cp.wait_over and cp.signal is None
    return dataclasses.replace(
        cp,
        input=flow.validate(cp.input),
        state=state,
        flow_version=flow.version,
        # A step renamed since the run saved its cursor goes on under its new name.
        cursor=(flow.first or DONE)
        if cp.cursor == START
        else flow.current((cp.wait_timeout_cursor or cp.cursor) if timed_out else cp.cursor),
        epoch=lease.epoch,
        status=RunStatus.RUNNING,
        resumes=cp.resumes + int(resumed),
    )


def renamed_from(saved: str, going: str, flow: registry.Workflow) -> str | None:
    """The name a step's visit in flight began as (saved), when a deploy renamed the step
    to `going` since: the visit's journal and keys stay under it. None: not renamed."""
    if saved not in (START, going) and flow.current(saved) == going:
        return saved
    return None


def _take(run_id: str, deps: Deps, held: contextlib.ExitStack) -> tuple[HeldLease, Checkpoint]:
    """The run's lease, and its checkpoint claimed (fenced) at the lease's epoch; a run
    that has stopped comes back as it is, unclaimed. Raises Deferred (held elsewhere) or
    UnknownRun. Once the lease is taken, `held` (the delivery's) holds its connection.

    The claim is the delivery's first read: a load before it would cost every delivery
    a round trip. Epochs come from Redis, so a new lease's is above the stored one, unless
    Redis lost the run's counter (its TTL passed, or a restart without persistence); then
    the run is leased again above the stored epoch, which the load that tells these cases
    apart found.
    """
    store, version = deps.store, deps.settings.code_version
    lease = _acquire(run_id, 0, deps)
    try:
        held.enter_context(_held(deps))  # the delivery's connection, from the claim on
        for _ in range(2):
            claimed = store.claim(run_id, lease.epoch, version, registry.pinned())
            if claimed is not None:
                return lease, claimed
            cp = store.load(run_id)
            if cp is None:
                raise UnknownRun(f"no run {run_id!r}: enqueue it with cairn.Client().enqueue()")
            if cp.status in IDLE:
                return lease, cp
            if cp.pinned_to is not None and cp.pinned_to != version:
                raise Misrouted(run_id, cp.pinned_to, version)
            if cp.epoch >= lease.epoch:
                lease.release()
                lease = _acquire(run_id, cp.epoch, deps)
        assert cp is not None  # the loop ran: each pass raised or loaded one
        raise StaleWrite(run_id, cp.seq, lease.epoch)
    except BaseException as exc:
        if isinstance(exc, KeyMissing):  # claimed, but its row did not open here
            store.unclaim(run_id, lease.epoch, KEY_HOLD)
        # A run that does not exist keeps no counter either (this acquire made one).
        lease.release(ended=isinstance(exc, UnknownRun))
        raise


def _acquire(run_id: str, floor: int, deps: Deps) -> HeldLease:
    """The run's lease, or Deferred. A lease whose owner is a dead process on this host
    (a SIGKILLed pool child) is broken at once instead of waiting out its TTL: the
    fencing epoch keeps even a wrong guess safe."""
    leases, ttl = deps.leases, deps.settings.lease_ttl
    lease = leases.acquire(run_id, ttl, floor=floor)
    if lease is not None:
        return lease
    holder = leases.holder(run_id)
    if holder and holder.dead_here() and leases.break_dead(run_id, holder):
        logger.warning(
            "run %s: owner %s is dead; taking the run over",
            run_id,
            holder,
            extra=logs.run(run_id, "take_over", epoch=holder.epoch),
        )
        lease = leases.acquire(run_id, ttl, floor=floor)
        if lease is not None:
            return lease
    raise Deferred(run_id, str(holder) if holder else None)


def _step(
    cp: Checkpoint,
    flow: registry.Workflow,
    lease: HeldLease,
    deps: Deps,
    stream: Announcer,
    read: float | None = None,
    begun_as: str | None = None,
) -> tuple[Checkpoint, float]:
    """Run the step at cp.cursor and save its checkpoint; returns the saved checkpoint and
    when its save (which found the run not cancelled) was sent. read: when this worker's
    save of the step before was, so no journal can hold calls of this one. begun_as: the
    name the visit began under, before a deploy renamed its step (its journal and keys)."""
    settings, store, middleware = deps.settings, deps.store, deps.middleware
    fn = _step_function(cp, flow)
    lease.ensure()
    started = time.perf_counter()
    attempt = Attempt(
        started=time.time(),
        worker=lease.token.owner,
        signal_id=cp.signal["id"] if cp.signal else None,
        code_version=settings.code_version,
    )
    ctx = Context(
        cp if begun_as is None else dataclasses.replace(cp, cursor=begun_as),
        store=store,
        lease=lease,
        model=deps.model,
        config=settings,
        retry_on=flow.retries[cp.cursor].on,
        fresh=read is not None,
        hooks=middleware,
        events=deps.events,
        cancel_read=read,
    )
    try:
        if read is None:  # after the first, step_saved's "next" says which step starts
            stream.tell(cp, "step_started", {})
        middleware.before_step(cp)
        result = _call(fn, ctx, cp, flow, attempt, deps, stream)
        nxt = _next(cp, flow, result, ctx, settings)
        wait, spawned = result.waits_for, None
        if result.spawns is not None:
            spawned = flow_control.spawned(cp, result.spawns, ctx.visit, settings)
            wait = dataclasses.replace(wait, event=nxt.wait_event)
        middleware.after_effect(cp)
        lease.ensure()  # last chance to stop before a write that would be fenced anyway
        asked = time.monotonic()
        saved = store.save(nxt, cp, ctx.transaction, _with_key(attempt, ctx), wait, spawned)
    except BaseException as exc:
        middleware.after_step(cp, started, exception=exc)
        raise
    finally:
        ctx.close()
    middleware.after_step(cp, started, saved=nxt)
    if spawned is not None:
        flow_control.send_children(spawned, deps.send)
    stream.step_saved(cp, nxt)
    if saved.cancel_reason is not None and nxt.cursor != DONE:
        raise Stop(RunStatus.CANCELLED, saved.cancel_reason, at=nxt)
    if saved.signalled:
        raise HandOff(f"run {cp.run_id}: the signal it now waits for had come; going on")
    return nxt, asked


def _step_function(cp: Checkpoint, flow: registry.Workflow) -> Callable[[Context], Any]:
    """The function of the step at cp.cursor; Stop (incompatible) if this code lacks it."""
    fn = flow.steps.get(cp.cursor)
    if fn is None:  # removed by a deploy: this code cannot go on with the run
        raise Stop(
            RunStatus.INCOMPATIBLE,
            f"workflow {flow.name!r} has no step {cp.cursor!r}: it was renamed or removed. "
            f"Declare workflow({flow.name!r}, renamed={{{cp.cursor!r}: 'its new name'}}) or "
            "deploy code that has it, then enqueue the run again",
        )
    if cp.seq >= flow.max_steps:
        raise CairnError(f"run {cp.run_id} passed max_steps={flow.max_steps} without finishing")
    return fn


def _call(
    fn: Callable[[Context], Any],
    ctx: Context,
    cp: Checkpoint,
    flow: registry.Workflow,
    attempt: Attempt,
    deps: Deps,
    stream: Announcer,
) -> Any:
    """The step function's result (whatever it is: _next checks it is a StepResult), or
    what its exception means for the run: a stop, a recorded retry, this delivery's end."""
    current = _current.set(ctx)
    try:
        result: Any = fn(ctx)
        if inspect.iscoroutine(result):  # an async def step
            result = asyncsteps.wait_for(result)
        return result
    except StoreUnavailable:
        raise  # our own store is down: the task retries, bounded
    except Cancelled as exc:
        raise Stop(RunStatus.CANCELLED, str(exc), _with_key(attempt, ctx)) from exc
    except BudgetExceeded as exc:
        raise Stop(RunStatus.BUDGET_EXCEEDED, str(exc), _with_key(attempt, ctx)) from exc
    except OutcomeUnknown as exc:
        raise Stop(RunStatus.UNKNOWN, str(exc), _with_key(attempt, ctx)) from exc
    except JournalDiverged as exc:
        # The journal is one this code cannot replay (a deploy reordered or renamed a
        # call): as a step it lacks, not a step's failure, and never retried.
        raise Stop(RunStatus.INCOMPATIBLE, str(exc), _with_key(attempt, ctx)) from exc
    except Interrupted as exc:
        if not isinstance(exc, Transient):
            raise  # any delivery outcome but "not now": the task's
        # The step's "not now": its Retry policy decides, as for any exception.
        raise _retry_or_stop(cp, flow, exc, _with_key(attempt, ctx), deps, stream) from exc
    except Exception as exc:
        if (down := deps.store.outage(exc)) is not None:  # the step's own ctx.db query
            raise down from exc
        # Recorded on the run, whose checkpoint stays as it was before this step.
        raise _retry_or_stop(cp, flow, exc, _with_key(attempt, ctx), deps, stream) from exc
    finally:
        _current.reset(current)


def _with_key(attempt: Attempt, ctx: Context) -> Attempt:
    return dataclasses.replace(attempt, effect_key=ctx.effect_key) if ctx.effect_key else attempt


def _retry_or_stop(
    cp: Checkpoint,
    flow: registry.Workflow,
    exc: Exception,
    attempt: Attempt,
    deps: Deps,
    stream: Announcer,
) -> CairnError | StaleWrite:
    """What a step's exception becomes: a recorded retry (RetryLater), or the run failing
    (its policy does not retry this exception, or its attempts are spent)."""
    what = f"{type(exc).__name__}: {exc}"
    policy = flow.retries[cp.cursor]
    if not isinstance(exc, policy.on):
        logger.error(
            "run %s step %r raised:\n%s",
            cp.run_id,
            cp.cursor,
            traceback.format_exc(),
            extra=logs.at(cp, "step_raised"),
        )
        return Stop(RunStatus.FAILED, f"step {cp.cursor!r} raised {what}", attempt)
    failed = cp.attempts + 1
    if failed >= policy.attempts:
        return Stop(
            RunStatus.FAILED,
            f"step {cp.cursor!r}: retries exhausted after {failed} attempts; last: {what}",
            attempt,
        )
    delay = policy.delay(failed)
    if deps.store.end_attempt(cp, RunStatus.RUNNING, what, attempt, retry_in=delay) is None:
        return StaleWrite(cp.run_id, cp.seq, cp.epoch)
    stream.tell(cp, "retry", {"error": what, "attempt": failed + 1, "delay": delay})
    logger.warning(
        "run %s step %r: %s; attempt %d of %d in %.1fs",
        cp.run_id,
        cp.cursor,
        what,
        failed + 1,
        policy.attempts,
        delay,
        extra=logs.at(cp, "retry", attempt=failed + 1, delay=delay),
    )
    return RetryLater(cp.run_id, delay)


def checked(cp: Checkpoint, flow: registry.Workflow, result: Any) -> StepResult:
    """The step's result, if it is a StepResult whose next steps this code has; else
    CairnError (the run fails). The deploy check asks the same of a step it replays."""
    if not isinstance(result, StepResult):
        raise CairnError(f"step {cp.cursor!r} returned {type(result).__name__}, not StepResult")
    wait = result.waits_for
    for cursor in (result.cursor, wait.on_timeout if wait else None):
        if cursor is not None and cursor != DONE and cursor not in flow.steps:
            raise CairnError(f"step {cp.cursor!r} returned unknown cursor {cursor!r}")
    return result


def _next(
    cp: Checkpoint, flow: registry.Workflow, result: Any, ctx: Context, settings: Settings
) -> Checkpoint:
    result = checked(cp, flow, result)
    wait = result.waits_for
    # Messages are plain dicts to a step (Context.window, StepResult.window).
    old = cast("tuple[dict[str, Any], ...]", cp.window)
    window: Sequence[dict[str, Any]]
    known = cp.window_bytes if cp.window_bytes >= 0 else json_size(list(old))
    if result.window is None:  # most steps leave the window alone: nothing to compare
        window, extends, size = old, True, known
    else:
        window = list(result.window)
        # Identity makes this prefix check cheap: the step got the very same message dicts.
        extends = window[: len(old)] == list(old)
        size = grown_size(known, len(old), window[len(old) :]) if extends else json_size(window)
    if size // 4 > settings.window_budget_tokens:
        window = compact(list(window), settings.window_budget_tokens)
        extends = window[: len(old)] == list(old)
        size = json_size(window)
    if size > settings.max_window_bytes:
        raise WindowTooLarge(
            f"run {cp.run_id}: window is {size} bytes after compaction, over "
            f"CAIRN_MAX_WINDOW_BYTES={settings.max_window_bytes}; the checkpoint was not written"
        )
    return cp.evolve(
        seq=cp.seq + 1,
        cursor=result.cursor,
        state={**cp.state, **result.state},
        visits={**cp.visits, cp.cursor: ctx.visit + 1},
        window=tuple(window),
        window_bytes=size,
        win_start=cp.win_start if extends else cp.win_end,
        cost_usd=cp.cost_usd + ctx.cost_usd + result.cost_usd,
        status=RunStatus.WAITING
        if wait
        else RunStatus.DONE
        if result.cursor == DONE
        else RunStatus.RUNNING,
        error=None,
        # A spawn's wait names it by the seq this save writes: its children's signal.
        wait_event=(f"cairn.children:{cp.seq + 1}" if result.spawns else wait.event)
        if wait
        else None,
        wait_timeout_cursor=wait.on_timeout if wait else None,
        signal=None,
        wait_over=False,
    )
