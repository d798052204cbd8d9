"""The durable step loop: load ?? initial, one step, one guarded save, repeat."""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from typing import TYPE_CHECKING, Any

from cairn.errors import (
    CairnError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    StaleWrite,
    Superseded,
    Transient,
    UnknownRun,
    WindowTooLarge,
)
from cairn.steps import registry
from cairn.steps.context import Context
from cairn.steps.registry import DONE, StepResult
from cairn.steps.window import compact, grown_size, json_size
from cairn.store.checkpoints import START, TERMINAL, Checkpoint, PgStore
from cairn.store.lease import Lease, Leases
from cairn.workers import metrics
from cairn.workers.hooks import NO_HOOKS, StepHooks
from cairn.workers.settings import Settings

if TYPE_CHECKING:
    from cairn.steps.model import ModelClient

logger = logging.getLogger(__name__)


class Deferred(CairnError):
    """Another live worker holds the run's lease: try again later, never concurrently."""

    def __init__(self, run_id: str, holder: str | None) -> None:
        super().__init__(f"run {run_id} is held by {holder}")
        self.holder = holder


@dataclasses.dataclass(frozen=True, kw_only=True)
class Deps:
    settings: Settings
    store: PgStore
    leases: Leases
    model: ModelClient | None
    hooks: StepHooks = NO_HOOKS


def run(run_id: str, deps: Deps) -> str:
    """Drive one run to its end, or until this worker loses it. Returns the final status.

    Raises Deferred (held elsewhere), Transient (retry later), Superseded (another
    worker has the run: stop, touch nothing).
    """
    store = deps.store
    try:
        cp = store.load(run_id)
    except (IncompatibleCheckpoint, CorruptCheckpoint) as exc:
        logger.error("%s", exc)
        store.mark_failed_raw(run_id, str(exc))
        return "failed"
    if cp is None:
        raise UnknownRun(f"no run {run_id!r}: enqueue it with cairn.Client().enqueue()")
    if cp.status in TERMINAL:
        # A warm shutdown or a reaper race can deliver a finished run again.
        logger.info("run %s is already %s; nothing to do", run_id, cp.status)
        return cp.status

    claimed_before = cp.epoch > 0  # some worker started this run before us
    lease = _acquire(run_id, cp.epoch, deps)
    lease.start_heartbeat()
    try:
        claimed = store.claim(run_id, lease.epoch)  # the freshest row, fenced to our epoch
        if claimed is None:
            raise StaleWrite(run_id, cp.seq, lease.epoch)
        cp = claimed
        if cp.status in TERMINAL:
            return cp.status
        resumed = claimed_before or cp.status == "running"
        flow = registry.get(cp.workflow)
        # The enqueuer may not have the workflow's code: its input is checked, and its
        # first step found, here (validators are pure, so every delivery agrees).
        cp = dataclasses.replace(
            cp,
            input=flow.validate(cp.input),
            cursor=(flow.first or DONE) if cp.cursor == START else cp.cursor,
            epoch=lease.epoch,
            status="running",
            resumes=cp.resumes + int(resumed),
        )
        if resumed:
            logger.warning("run %s: resuming at %r (seq %d)", run_id, cp.cursor, cp.seq)
            metrics.RESUMES.labels(cp.workflow).inc()
        while cp.cursor != DONE:
            cp = _step(cp, flow, lease, deps)
        return "done"
    except CairnError as exc:
        if isinstance(exc, (Transient, Superseded)):
            raise
        logger.error("run %s failed: %s", run_id, exc)
        store.mark_failed(cp, str(exc))
        return "failed"
    finally:
        lease.release()


def _acquire(run_id: str, floor: int, deps: Deps) -> Lease:
    """The run's lease, or Deferred. A lease whose owner is a dead process on this host
    (a SIGKILLed pool child) is broken at once instead of waiting out its TTL: the
    fencing epoch keeps even a wrong guess safe."""
    leases, ttl = deps.leases, deps.settings.lease_ttl
    lease = leases.acquire(run_id, ttl, floor=floor)
    if lease is not None:
        return lease
    holder = leases.holder(run_id)
    if holder and holder.dead_here() and leases.break_dead(run_id, holder):
        logger.warning("run %s: owner %s is dead; taking the run over", run_id, holder)
        lease = leases.acquire(run_id, ttl, floor=floor)
        if lease is not None:
            return lease
    raise Deferred(run_id, str(holder) if holder else None)


def _step(cp: Checkpoint, flow: registry.Workflow, lease: Lease, deps: Deps) -> Checkpoint:
    """Run the step at cp.cursor and save its checkpoint; returns the saved checkpoint."""
    settings, store, hooks = deps.settings, deps.store, deps.hooks
    fn = flow.steps.get(cp.cursor)
    if fn is None:
        raise CairnError(f"workflow {flow.name!r} has no step {cp.cursor!r}")
    if cp.seq >= flow.max_steps:
        raise CairnError(f"run {cp.run_id} passed max_steps={flow.max_steps} without finishing")
    lease.ensure()
    started = time.perf_counter()
    ctx = Context(cp, store=store, lease=lease, model=deps.model, config=settings)
    try:
        hooks.before_step(cp)
        try:
            result = fn(ctx)
        except (Transient, Superseded):
            raise
        except Exception as exc:
            if (down := store.outage(exc)) is not None:  # the step's own ctx.db query
                raise down from exc
            logger.error("run %s step %r raised:\n%s", cp.run_id, cp.cursor, traceback.format_exc())
            # run() records it on the run, with the checkpoint as it was before this step.
            raise CairnError(f"step {cp.cursor!r} raised {type(exc).__name__}: {exc}") from exc
        nxt = _next(cp, flow, result, ctx, settings)
        hooks.after_effect(cp)
        lease.ensure()  # last chance to stop before a write that would be fenced anyway
        store.save(nxt, cp, ctx.transaction)
        hooks.after_save(cp)
        metrics.STEPS.labels(cp.workflow, cp.cursor).inc()
        metrics.STEP_SECONDS.labels(cp.workflow).observe(time.perf_counter() - started)
        if nxt.cost_usd > cp.cost_usd:
            metrics.COST.labels(cp.workflow).inc(nxt.cost_usd - cp.cost_usd)
        return nxt
    finally:
        ctx.close()


def _next(
    cp: Checkpoint, flow: registry.Workflow, result: Any, ctx: Context, settings: Settings
) -> Checkpoint:
    if not isinstance(result, StepResult):
        raise CairnError(f"step {cp.cursor!r} returned {type(result).__name__}, not StepResult")
    if result.cursor != DONE and result.cursor not in flow.steps:
        raise CairnError(f"step {cp.cursor!r} returned unknown cursor {result.cursor!r}")
    old = cp.window
    window = list(old) if result.window is None else list(result.window)
    # Identity makes this prefix check cheap: the step got the very same message dicts.
    extends = window[: len(old)] == list(old)
    known = cp.window_bytes if cp.window_bytes >= 0 else json_size(list(old))
    size = grown_size(known, len(old), window[len(old) :]) if extends else json_size(window)
    if size // 4 > settings.window_budget_tokens:
        window = compact(window, settings.window_budget_tokens)
        extends = window[: len(old)] == list(old)
        size = json_size(window)
    if size > settings.max_window_bytes:
        raise WindowTooLarge(
            f"run {cp.run_id}: window is {size} bytes after compaction, over "
            f"CAIRN_MAX_WINDOW_BYTES={settings.max_window_bytes}; the checkpoint was not written"
        )
    return dataclasses.replace(
        cp,
        seq=cp.seq + 1,
        cursor=result.cursor,
        state={**cp.state, **result.state},
        visits={**cp.visits, cp.cursor: ctx.visit + 1},
        window=tuple(window),
        window_bytes=size,
        win_start=cp.win_start if extends else cp.win_end,
        cost_usd=cp.cost_usd + ctx.cost_usd + result.cost_usd,
        status="done" if result.cursor == DONE else "running",
        error=None,
    )
