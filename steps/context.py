"""What a step sees: the run's position, its state and window, and effect helpers. The
journaled calls are cairn.steps.journal's part of it, the model calls
cairn.steps.modelcalls'."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import types
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from cairn.core import logs, tracing
from cairn.core.errors import (
    BudgetExceeded,
    Cancelled,
    MultipleEffects,
    OutcomeUnknown,
    StaleWrite,
    Transient,
)
from cairn.core.records import Run
from cairn.steps.journal import Journal, JournaledCalls
from cairn.steps.modelcalls import ModelCalls

if TYPE_CHECKING:
    from cairn.core.records import Checkpoint
    from cairn.steps.model import ModelClient
    from cairn.store.contract import CheckpointStore, HeldLease, StepTx
    from cairn.store.tx import Connection

logger = logging.getLogger(__name__)
T = TypeVar("T")


class CallHooks(Protocol):
    """What a step's context tells the worker around each journaled call it makes (the
    worker's middleware chain, cairn.workers.middleware.Chain)."""

    def before_call(self, cp: Checkpoint, name: str, pos: int) -> None: ...

    def after_call(
        self, cp: Checkpoint, name: str, pos: int, exception: BaseException | None = None
    ) -> None: ...

    def budget_crossed(self, cp: Checkpoint, scope: str) -> None: ...


class EventSink(Protocol):
    """Where a step's events go (the worker's outbox, cairn.workers.outbox.Outbox)."""

    def put(self, run_id: str, token: str, event: str, wait: bool = False) -> str | None: ...

    def put_token(self, run_id: str, token: str, text: str, where: tuple[Any, ...]) -> None: ...

    def over_cap(self, run_id: str) -> bool: ...


_UNKNOWN = object()  # an at-most-once effect's intent without its mark
# How old a read of the run by the step's own statements may be and still stand for a
# journaled call's cancel check (a cancel that lands inside it is seen at the call's record).
CANCEL_FRESH = 0.005
_counting = threading.Lock()

_step: contextvars.ContextVar[Context | None] = contextvars.ContextVar("cairn_step", default=None)


def current() -> Context | None:
    """The Context of the step running in this thread or asyncio task, or None outside a
    cairn step. For code the step calls without passing ctx along: a framework's tool, a
    pydantic-ai or LangGraph integration."""
    return _step.get()


def fence() -> None:
    """The lease check right before a model request goes out: cairn's transport
    (cairn.steps.providers.transport) calls it for every request it sends, a first try
    and each retry alike, after any back-off, wait for the rate limit or lock, whatever
    surface made the call (ctx.model, ctx.amodel, inside ctx.call or ctx.parallel, the
    Agents SDK's and LangGraph's through them); cairn.pydantic_ai calls it before each
    request of an agent's own client. Raises LeaseLost when the step in hand (None outside
    a step: nothing to check) no longer holds its run: a paid request a provider keeps no
    idempotency for is never made for a run another worker has taken over. Cheap in the
    common case: no round trip while the lease was renewed within half its TTL (a process
    resumed after SIGSTOP finds its renewal old and asks Redis, Lease.ensure)."""
    step = _step.get()
    if step is not None:
        step._lease.ensure()


class Context(JournaledCalls, ModelCalls):
    """One step's view of its run. Built by the loop for every step attempt."""

    def __init__(
        self,
        cp: Checkpoint,
        *,
        store: CheckpointStore,
        lease: HeldLease,
        model: ModelClient | None = None,
        config: Any = None,
        retry_on: tuple[type[BaseException], ...] = (Transient,),
        fresh: bool = False,
        hooks: CallHooks | None = None,
        events: EventSink | None = None,
        cancel_read: float | None = None,
    ) -> None:
        self.run_id = cp.run_id
        self.tenant = cp.tenant  # the customer the run is for (None: none)
        self.cursor = cp.cursor
        self.seq = cp.seq
        # Saved visits to this cursor before this one: a replay after a crash sees the
        # same number (the visit was never saved), a loop's next visit sees one more.
        self.visit = cp.visits.get(cp.cursor, 0)
        self.input: Mapping[str, Any] = types.MappingProxyType(cp.input)
        self.state: Mapping[str, Any] = types.MappingProxyType(cp.state)
        # The very message dicts of the checkpoint (no copy: the loop tells an appended
        # window from a rewritten one by identity). Build new lists; never edit a message.
        # Messages are TypedDicts; a step may build dicts of any shape.
        self.window: list[dict[str, Any]] = cast("list[dict[str, Any]]", list(cp.window))
        self.config = config
        # The signal this step was woken by (see StepResult.wait): its payload, its id.
        self.signal: Any = cp.signal["payload"] if cp.signal else None
        self.signal_id: str | None = cp.signal["id"] if cp.signal else None
        self.cost_usd = 0.0  # this step's cost so far (model calls, add_cost, replays)
        self._spent = cp.cost_usd  # the run's, before this step
        cap = cp.max_cost_usd if cp.max_cost_usd is not None else getattr(config, "max_cost_usd", 0)
        self._cap: float | None = cap or None
        self._cp, self._store, self._lease, self._model = cp, store, lease, model
        self._retry_on, self._hooks, self._events = retry_on, hooks, events
        self._effect: str | None = None
        self._tx: StepTx | None = None
        # The journal of this visit, read at the first journaled call (a step that follows
        # this worker's own save is fresh: nobody can have recorded calls for it).
        self._fresh = fresh
        self._journals: dict[str, Journal] = {}  # by cursor: the step's, and its scopes'
        # When a statement of this step last read the run not cancelled (monotonic; the
        # loop's save before a fresh step counts): see _ensure_before_call.
        self._cancel_read = cancel_read

    @property
    def epoch(self) -> int:
        """The lease epoch this worker holds the run at: what fences its writes (a
        checkpointer's, say) against a worker that took the run over."""
        return self._lease.epoch

    # -- child runs ------------------------------------------------------------------
    def children(self) -> list[Run]:
        """The child runs of the spawn this step waited for (StepResult.spawn), in the
        order that step listed them: each one's status, state (its result once done) and
        error. In a step that did not wait for a spawn: every child the run has spawned."""
        event = self._cp.wait_event or ""
        seq = int(event.rpartition(":")[2]) if event.startswith("cairn.children:") else None
        return self._store.children(self.run_id, seq)

    # -- events ----------------------------------------------------------------------
    def emit(self, kind: str, data: Any = None, *, wait: bool = True) -> str | None:
        """Append an event to the run's live stream (Client.events, GET /runs/{id}/events)
        and return its id once written; None when the workers run without events, or with
        wait=False (queued: the step goes on at once, and a run past its cap drops it).

        Live, not durable: an event reaches readers while the stream keeps it (see
        CAIRN_EVENTS_MAXLEN, CAIRN_EVENTS_TTL), and an attempt cut by a kill or retried has
        its events marked void by the next (attempt_abandoned, retry). What must outlive
        Redis belongs in the step's state or a ctx.call's result. EventRefused: an unknown
        or reserved kind, data not JSON or over CAIRN_MAX_EVENT_BYTES, or the run past
        CAIRN_MAX_EVENTS.
        """
        from cairn.core import events

        limit = getattr(self.config, "max_event_bytes", 65_536)
        events.check(kind, data, limit)
        if self._events is None:
            return None
        return self._events.put(self.run_id, self._token, self._event(kind, data), wait=wait)

    def token(self, text: str) -> None:
        """A text delta of an answer being written (a `token` event), for a model the step
        streams itself: queued, the step does not wait. Inside a ctx.call it belongs to
        that call (its `call` is the call's place); a run past CAIRN_MAX_EVENTS drops them.
        cairn.pydantic_ai.stream_tokens feeds a pydantic-ai agent's text deltas here."""
        frame = self._inside()
        self._delta(frame.pos if frame else -1, str(text))

    def _delta(self, call: int, text: str) -> None:
        events = self._events
        if events is not None and not events.over_cap(self.run_id):
            where = (call, self.cursor, self.visit, self.epoch, self.seq)
            events.put_token(self.run_id, self._token, text, where)

    @property
    def _token(self) -> str:
        return str(self._lease.token)

    def _event(self, kind: str, data: Any) -> str:
        from cairn.core.events import encode

        return encode(
            kind, data, cursor=self.cursor, visit=self.visit, attempt=self.epoch, seq=self.seq
        )

    def _tell(self, kind: str, data: Any) -> None:
        """One of cairn's own events, queued: the step does not wait for Redis."""
        if self._events is not None:
            self._events.put(self.run_id, self._token, self._event(kind, data))

    # -- effects ---------------------------------------------------------------------
    def idempotency_key(self, suffix: str = "") -> str:
        """The key of this step's one externally visible effect.

        Derived from run, cursor and visit, never the attempt, so a replay of this visit
        sends the same key and the downstream dedupes it. Asking for a second, different
        key in one step is an error: split the step at the effect boundary, or make each
        effect a ctx.call, which has a key of its own (run, cursor, visit, call name, n).
        """
        frame = self._inside()
        base = frame.key if frame else f"cairn:{self.run_id}:{self.cursor}:{self.visit}"
        key = base + (f":{suffix}" if suffix else "")
        held = frame.effect if frame else self._effect
        if held is not None and held != key:
            where = f"call {base!r}" if frame else f"step {self.cursor!r}"
            raise MultipleEffects(
                f"{where} of run {self.run_id} asked for a second effect key ({key!r} after "
                f"{held!r}); one externally visible effect per step or per ctx.call"
            )
        self.ensure_owner()  # a worker that lost the run, or a cancelled run, must not reach it
        if frame:
            frame.effect = key
        else:
            self._effect = key
        tracing.note(effect_key=key)  # on the step's span, or the call's
        return key

    @property
    def effect_key(self) -> str | None:
        """The key this step asked for outside its calls, if any (in the step history)."""
        return self._effect

    def _log(self, action: str, **more: Any) -> dict[str, Any]:
        epoch = self._lease.epoch
        return logs.run(self.run_id, action, cursor=self.cursor, seq=self.seq, epoch=epoch, **more)

    def ensure_owner(self, *, cancel: bool = True) -> None:
        """Raise cairn.LeaseLost unless this worker still holds the run (Redis is asked
        when the last renewal is older than half the lease: a process resumed after a
        pause learns here that it lost the run), and with cancel, cairn.Cancelled if the
        run was cancelled (one Postgres read). The check ctx.idempotency_key() makes
        before an effect, for code with an effect of its own."""
        self._lease.ensure()
        if cancel:
            self._check_cancel(0.0)

    def _ensure_before_call(self) -> None:
        """ensure_owner before a journaled call, whose cancel check is the last read of
        the run by this step's own statements (the previous call's record, the save before
        this step) when that is younger than CANCEL_FRESH: a call right after another
        costs one round trip, its record, and a cancel is still seen before the next call
        or at this one's record."""
        self._lease.ensure()
        self._check_cancel(CANCEL_FRESH)

    def _check_cancel(self, fresh: float) -> None:
        read = self._cancel_read
        if read is not None and time.monotonic() - read < fresh:
            return
        asked = time.monotonic()
        self._cancelled(self._store.cancel_reason(self.run_id), asked)

    def _cancelled(self, reason: str | None, asked: float) -> None:
        """A read of the run's cancel reason, by a statement sent at asked (monotonic)."""
        if reason is not None:
            raise Cancelled(f"run {self.run_id} was cancelled: {reason}")
        self._cancel_read = asked

    def once(
        self,
        effect: Callable[[str], T],
        *,
        suffix: str = "",
        at_most_once: bool = False,
        reconcile: Callable[[str], T] | None = None,
    ) -> T:
        """Run effect(key) unless the done-ledger says this visit already ran it.

        For downstreams without idempotency. By default at least once: it narrows the
        window, not closes it. A crash between the effect and its done mark repeats the
        effect on replay, and so can a process paused longer than the lease TTL between
        its last lease check (asked of Redis itself, right before the effect) and the effect.

        at_most_once=True closes it the other way: an intent is committed (fenced by the
        run's epoch) before the effect runs, and a replay that finds the intent without
        its mark never runs the effect again. It calls reconcile(key) for the outcome (and
        records it), or without one stops the run as unknown (cairn.OutcomeUnknown) until
        someone resolves it (`cairn runs resolve`, POST /runs/{id}/resolve, Client.resolve).
        """
        key, done, result = self._ledger(suffix, at_most_once)
        if done:
            return result  # type: ignore[no-any-return]
        if result is _UNKNOWN:
            if reconcile is None:
                raise OutcomeUnknown(self.run_id, key)
            result = reconcile(key)
        else:
            result = effect(key)
        self._mark(key, result)
        return result

    async def aonce(
        self,
        effect: Callable[[str], Awaitable[T]],
        *,
        suffix: str = "",
        at_most_once: bool = False,
        reconcile: Callable[[str], Awaitable[T]] | None = None,
    ) -> T:
        """ctx.once for async code: await effect(key) (or reconcile(key)) the same way."""
        key, done, result = self._ledger(suffix, at_most_once)
        if done:
            return result  # type: ignore[no-any-return]
        if result is _UNKNOWN:
            if reconcile is None:
                raise OutcomeUnknown(self.run_id, key)
            result = await reconcile(key)
        else:
            result = await effect(key)
        self._mark(key, result)
        return result

    def _mark(self, key: str, result: Any) -> None:
        if not self._store.mark_done(self._cp, key, result):
            # Another worker claimed the run meanwhile: its view of this effect (run again,
            # or unknown until resolved) stands, not ours.
            raise StaleWrite(self.run_id, self.seq, self._lease.epoch)

    def _ledger(self, suffix: str, at_most_once: bool) -> tuple[str, bool, Any]:
        """The effect's key, and whether the ledger says it ran (with its result); else
        the checks before it runs, and for an at-most-once effect its intent. _UNKNOWN as
        the result: an earlier attempt's intent has no mark."""
        key = self.idempotency_key(suffix)
        done, result = self._store.was_done(key)
        if done:
            logger.info(
                "run %s: %s already done, skipping",
                self.run_id,
                key,
                extra=self._log("once_skipped", key=key),
            )
            return key, True, result
        self._lease.ensure(fresh=True)  # nothing downstream fences this effect: ask Redis
        if not at_most_once:
            return key, False, None
        state, result = self._store.record_intent(self._cp, key)
        if state == "fenced":
            raise StaleWrite(self.run_id, self.seq, self._lease.epoch)
        if state == "done":
            return key, True, result
        return key, False, _UNKNOWN if state == "open" else None

    def add_cost(self, usd: float) -> None:
        """Count usd (a call to another provider, a paid API) toward the run's budget: the
        next ctx.model or ctx.call(..., max_cost=) is checked against it."""
        if not usd >= 0:
            raise ValueError(f"add_cost({usd!r}): a cost is a number of dollars, 0 or more")
        self._count(usd)

    def _count(self, usd: float) -> None:
        with _counting:  # ctx.parallel's calls count from threads of their own
            self.cost_usd += usd
        if (frame := self._inside()) is not None:
            frame.cost += usd  # recorded with the call, so its replay counts it

    def _hold(self, pos: int, worst: float, what: str, tokens: int = 0) -> None:
        """Admit the journaled call at pos against the run's budgets (its tree's), holding
        its worst case (dollars, tokens) until its record settles it; BudgetExceeded if
        one would pass."""
        if not self._cp.budgets:
            return
        over = self._store.reserve(self._at(), self.visit, pos, worst, tokens)
        if over is None:
            return
        tenant = over.scope.removeprefix("tenant:")
        raise_it = (
            f"cairn budgets set --tenant {tenant}"
            if tenant != over.scope
            else f"cairn runs raise-budget {over.scope.removeprefix('run:')}"
        )
        if over.limit_usd is not None and (
            over.spent_usd + over.reserved_usd + worst > over.limit_usd
        ):
            raise BudgetExceeded(
                f"run {self.run_id}: budget {over.scope} has ${over.spent_usd:.6f} spent and "
                f"${over.reserved_usd:.6f} held by calls in flight; {what} could cost up to "
                f"${worst:.6f}, over its limit of ${over.limit_usd:.6f} (raise it to go on: "
                f"{raise_it} --usd N)"
            )
        raise BudgetExceeded(
            f"run {self.run_id}: budget {over.scope} has {over.spent_tokens} tokens spent and "
            f"{over.reserved_tokens} held by calls in flight; {what} could take up to "
            f"{tokens}, over its limit of {over.limit_tokens} tokens (raise it to go on: "
            f"{raise_it} --tokens N)"
        )

    def _crossed(self, scopes: tuple[str, ...]) -> None:
        """The soft limits a record's cost crossed: an event on the run, and the metric."""
        for scope in scopes:
            logger.info("run %s: budget %s passed its soft limit", self.run_id, scope)
            self._tell("budget_soft", {"scope": scope})
            if self._hooks is not None:
                self._hooks.budget_crossed(self._cp, scope)

    def _afford(self, worst: float, what: str) -> None:
        if self._cap is None:
            return
        spent = self._spent + self.cost_usd
        if spent + worst > self._cap:
            raise BudgetExceeded(
                f"run {self.run_id}: spent ${spent:.6f}; {what} could cost "
                f"up to ${worst:.6f}, over the cap of ${self._cap:.6f}"
            )

    @property
    def db(self) -> Connection:
        """A Postgres connection in a transaction that commits with this step's checkpoint.

        Writes here and the checkpoint land together or not at all: the one way to close
        the replay window, for effects that live in our own database. Inside ctx.call the
        connection is the call's own, committed with the call's journal record instead (a
        replay that returns the recorded result finds the writes made).
        """
        if (frame := self._inside()) is not None:
            if frame.tx is None:
                self._lease.ensure()
                frame.tx = self._store.transaction()
            return frame.tx.connection
        if self._tx is None:
            self._lease.ensure()
            self._tx = self._store.transaction()
        return self._tx.connection

    @property
    def transaction(self) -> StepTx | None:
        """The step's transaction if it used ctx.db; the loop's save commits it."""
        return self._tx

    def close(self) -> None:
        """Give the connection back; an uncommitted transaction is rolled back."""
        if self._tx is not None:
            self._tx.close()
