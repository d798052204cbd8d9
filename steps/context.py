"""What a step sees: the run's position, its state and window, and effect helpers."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import importlib
import inspect
import json
import logging
import re
import types
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, TypeVar, cast, overload

from cairn.core import logs, tracing
from cairn.core.errors import (
    BudgetExceeded,
    CairnError,
    CallFailed,
    Cancelled,
    JournalDiverged,
    MultipleEffects,
    OutcomeUnknown,
    StaleWrite,
    Transient,
)
from cairn.core.records import Call, Run

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


class EventSink(Protocol):
    """Where a step's events go (the worker's outbox, cairn.workers.outbox.Outbox)."""

    def put(self, run_id: str, token: str, event: str, wait: bool = False) -> str | None: ...

    def put_token(self, run_id: str, token: str, text: str, where: tuple[Any, ...]) -> None: ...

    def over_cap(self, run_id: str) -> bool: ...


@dataclasses.dataclass
class _Frame:
    """The journaled call running in this thread or asyncio task: its key, the effect key
    it asked for, and the cost counted inside it. A context variable, not an attribute, so
    calls awaited side by side (asyncio.gather) each keep their own."""

    ctx: Context
    key: str
    pos: int = -1  # its place in the journal: the `call` of the tokens streamed inside it
    effect: str | None = None
    cost: float = 0.0
    tx: StepTx | None = None  # ctx.db inside the call: committed with its record


_SHOWN_BYTES = 4096  # a call's result goes into its `call` event up to this size
_SCOPE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")  # it goes into keys, as step names do
_UNKNOWN = object()  # an at-most-once effect's intent without its mark

_frame: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar("cairn_call", default=None)
_step: contextvars.ContextVar[Context | None] = contextvars.ContextVar("cairn_step", default=None)
_scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("cairn_scope", default=None)


@dataclasses.dataclass
class _Journal:
    """The journal of a step visit, or of one scope in it (a LangGraph task, say): its
    records, read at its first call, and its counters of calls and of calls per name."""

    cursor: str  # the step's, or "<step>/<scope>"
    records: dict[int, Call] | None
    calls: int = 0
    per_name: dict[str, int] = dataclasses.field(default_factory=dict)


def current() -> Context | None:
    """The Context of the step running in this thread or asyncio task, or None outside a
    cairn step. For code the step calls without passing ctx along: a framework's tool, a
    pydantic-ai or LangGraph integration."""
    return _step.get()


class Context:
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
    ) -> None:
        self.run_id = cp.run_id
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
        self._journals: dict[str, _Journal] = {}  # by cursor: the step's, and its scopes'

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
        run was cancelled (one Postgres read). The check ctx.idempotency_key() and the
        journaled calls make before an effect, for code with an effect of its own."""
        self._lease.ensure()
        if not cancel:
            return
        reason = self._store.cancel_reason(self.run_id)
        if reason is not None:
            raise Cancelled(f"run {self.run_id} was cancelled: {reason}")

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
        someone resolves it (`cairn resolve`, POST /runs/{id}/resolve, Client.resolve).
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

    # -- journaled calls -------------------------------------------------------------
    def call(
        self,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        max_cost: float | None = None,
        **kwargs: Any,
    ) -> T:
        """fn(*args, **kwargs), made at most once per (run, cursor, visit, name, n-th call
        of name) and journaled: a replay of this step returns the recorded result instead.

        The result must be JSON (dicts, lists, strings, numbers, bools, None); the first
        run returns what a replay will, the JSON copy. A permanent error (one the step's
        Retry policy does not retry) is recorded and replays as the same error; Transient
        and cairn's own errors are not recorded, so the call runs again. Inside fn,
        ctx.idempotency_key() is this call's own key (one keyed effect per call), and
        ctx.add_cost() counts toward what the call records. max_cost: the most it may
        cost, checked against the run's budget first.

        A replay must make its calls in the same order: one that asks for another name at
        a recorded position stops the run with JournalDiverged.
        """
        pos, n, recorded = self._begin(name, max_cost)
        if recorded is not None:
            return self._replay(recorded)  # type: ignore[no-any-return]
        token = self._enter(name, pos, n)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # a stop (lost lease, cancel) too: the frame ends
            self._failed(pos, name, exc, token)
            raise
        return self._returned(pos, name, result, token)  # type: ignore[no-any-return]

    # Two signatures: from `Callable[..., Awaitable[T] | T]` alone a type checker cannot
    # tell T of a coroutine function (mypy infers Never).
    @overload
    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        max_cost: float | None = None,
        **kwargs: Any,
    ) -> T: ...

    @overload
    async def acall(
        self,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        max_cost: float | None = None,
        **kwargs: Any,
    ) -> T: ...

    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[T] | T],
        /,
        *args: Any,
        max_cost: float | None = None,
        **kwargs: Any,
    ) -> T:
        """ctx.call for async code: awaits fn(*args, **kwargs) if it returns an awaitable.
        Calls awaited side by side (asyncio.gather) take their places in the order they
        start, so a replay that starts them in the same order finds each one's record."""
        pos, n, recorded = self._begin(name, max_cost)
        if recorded is not None:
            return self._replay(recorded)  # type: ignore[no-any-return]
        token = self._enter(name, pos, n)
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            self._failed(pos, name, exc, token)
            raise
        return self._returned(pos, name, result, token)  # type: ignore[no-any-return]

    def _enter(self, name: str, pos: int, n: int) -> contextvars.Token[Any]:
        if self._hooks is not None:
            self._hooks.before_call(self._cp, name, pos)
        cursor = self._scoped().cursor
        key = f"cairn:{self.run_id}:{cursor}:{self.visit}:{name}:{n}"
        return _frame.set(_Frame(self, key, pos))

    def _inside(self) -> _Frame | None:
        frame = _frame.get()
        return frame if frame is not None and frame.ctx is self else None

    def _begin(self, name: str, max_cost: float | None) -> tuple[int, int, Call | None]:
        """A call's place, and its record if an earlier attempt made it; else the checks
        before making it."""
        if self._inside() is not None:
            raise CairnError(
                f"ctx.call({name!r}) inside ctx.call of run {self.run_id}: calls do not nest; "
                "make them one after the other"
            )
        pos, n = self._position(name)
        recorded = self._recorded(pos, name)
        if recorded is None:
            self.ensure_owner()
            if max_cost is not None:
                self._afford(max_cost, f"ctx.call({name!r})")
        return pos, n, recorded

    def _failed(
        self, pos: int, name: str, exc: BaseException, token: contextvars.Token[Any]
    ) -> None:
        frame = _frame.get()
        _frame.reset(token)
        tx = frame.tx if frame else None
        try:
            if self._hooks is not None:
                self._hooks.after_call(self._cp, name, pos, exc)
            if self._recordable(exc):
                cost = frame.cost if frame else 0.0
                error = _error_of(exc)
                self._record(Call(pos=pos, name=name, error=error, cost_usd=cost), tx)
                self._tell("call", {"call": pos, "name": name, "error": error["message"]})
        finally:
            if tx is not None:
                tx.close()  # what the record did not commit is rolled back

    def _returned(self, pos: int, name: str, result: Any, token: contextvars.Token[Any]) -> Any:
        frame = _frame.get()
        _frame.reset(token)
        tx = frame.tx if frame else None
        try:
            if self._hooks is not None:
                self._hooks.after_call(self._cp, name, pos)
            value, raw = _as_json(result, f"ctx.call({name!r})", text=True)
            cost = frame.cost if frame else 0.0
            self._record(Call(pos=pos, name=name, result=value, cost_usd=cost), tx)
            if self._events is not None:
                shown = value if len(raw) <= _SHOWN_BYTES else {"truncated": len(raw)}
                self._tell("call", {"call": pos, "name": name, "result": shown})
        finally:
            if tx is not None:
                tx.close()
        return value

    def add_cost(self, usd: float) -> None:
        """Count usd (a call to another provider, a paid API) toward the run's budget: the
        next ctx.model or ctx.call(..., max_cost=) is checked against it."""
        if not usd >= 0:
            raise ValueError(f"add_cost({usd!r}): a cost is a number of dollars, 0 or more")
        self._count(usd)

    def _count(self, usd: float) -> None:
        self.cost_usd += usd
        if (frame := self._inside()) is not None:
            frame.cost += usd  # recorded with the call, so its replay counts it

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Journal the calls made inside under a scope of their own: their places count
        from 0 in the scope, their records and keys carry "<step>/<name>". For code that a
        replay may resume part way through, so that the calls it skips do not shift the
        places of the rest: a LangGraph node (cairn.langgraph.node) resumed from its graph's
        checkpoint. The name must be the same on every replay of the visit."""
        if not _SCOPE_NAME.fullmatch(name):
            raise ValueError(f"scope {name!r}: use ASCII letters, digits, . _ -")
        token = _scope.set(name)
        try:
            yield
        finally:
            _scope.reset(token)

    def _scoped(self) -> _Journal:
        scope = _scope.get()
        cursor = self.cursor if scope is None else f"{self.cursor}/{scope}"
        journal = self._journals.get(cursor)
        if journal is None:
            # A step that follows this worker's own save is fresh: nobody recorded its calls.
            journal = self._journals[cursor] = _Journal(cursor, {} if self._fresh else None)
        return journal

    @property
    def _calls(self) -> int:
        """Journaled calls made (or replayed) so far in this attempt, outside scopes."""
        journal = self._journals.get(self.cursor)
        return journal.calls if journal else 0

    def _position(self, name: str) -> tuple[int, int]:
        """This call's place in the visit (or scope), and its number among the calls of
        name."""
        journal = self._scoped()
        pos, n = journal.calls, journal.per_name.get(name, 0)
        journal.calls, journal.per_name[name] = pos + 1, n + 1
        return pos, n

    def _recorded(self, pos: int, name: str) -> Call | None:
        v = self._scoped()
        if v.records is None:
            v.records = {c.pos: c for c in self._store.journal(self.run_id, v.cursor, self.visit)}
        call = v.records.get(pos)
        if call is None:
            return None
        if call.name != name:
            raise JournalDiverged(
                f"step {self.cursor!r} of run {self.run_id}: call {pos} is {name!r} in this "
                f"attempt but the journal recorded {call.name!r} there; a step must make its "
                "journaled calls in the same order every time (branch on recorded results, "
                "not on the clock or randomness)"
            )
        return call

    def _replay(self, call: Call) -> Any:
        self.cost_usd += call.cost_usd  # counted once: the attempt that paid never saved
        if call.error is not None:
            raise _rebuilt(call.error)
        return call.result

    def _record(self, call: Call, tx: StepTx | None = None) -> None:
        v = self._scoped()
        at = self._cp if v.cursor == self.cursor else dataclasses.replace(self._cp, cursor=v.cursor)
        if not self._store.record_call(at, self.visit, call, tx):
            # Another worker claimed the run: what this call did is not ours to keep.
            raise StaleWrite(self.run_id, self.seq, self._lease.epoch)
        assert v.records is not None
        v.records[call.pos] = call

    def _recordable(self, exc: BaseException) -> TypeGuard[Exception]:
        """A permanent error of the call itself: not cairn's own (cancel, budget, lost
        lease, Transient), not one the step's policy retries, not our store going down,
        not an interrupt of the process."""
        return isinstance(exc, Exception) and not (
            isinstance(exc, (CairnError, *self._retry_on)) or self._store.outage(exc) is not None
        )

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

    # -- model -----------------------------------------------------------------------
    def model(self, *, stream: bool = False, **request: Any) -> Any:
        """messages.create through the anthropic SDK, retried, journaled (a replay of the
        step returns the recorded message, uncalled); its cost is counted once.

        stream=True: through the SDK's streaming API, each text delta a `token` event on
        the run's stream as it arrives (cost from the final usage). Either way the whole
        answer is a `message` event once journaled, and again when a replay returns it."""
        if self._model is None:
            raise RuntimeError("no model client configured for this worker")
        if self._inside() is not None:  # part of the call's own result: not journaled apart
            return self._ask(request, stream=stream)[0]
        pos, _ = self._position("model")
        recorded = self._recorded(pos, "model")
        if recorded is not None:
            return self._replayed_message(pos, recorded)
        try:
            message, cost = self._ask(request, pos, stream)
        except Exception as exc:
            self._model_failed(pos, exc)
            raise
        return self._answered(pos, message, cost)

    async def amodel(self, *, stream: bool = False, **request: Any) -> Any:
        """ctx.model for async steps: the same journal, checks and events; the SDK call
        runs in a worker thread, so the step's event loop goes on with its other tasks."""
        if self._model is None:
            raise RuntimeError("no model client configured for this worker")
        if self._inside() is not None:
            return (await self._aask(request, None, stream))[0]
        pos, _ = self._position("model")
        recorded = self._recorded(pos, "model")
        if recorded is not None:
            return self._replayed_message(pos, recorded)
        try:
            message, cost = await self._aask(request, pos, stream)
        except Exception as exc:
            self._model_failed(pos, exc)
            raise
        return self._answered(pos, message, cost)

    def _replayed_message(self, pos: int, recorded: Call) -> Any:
        assert self._model is not None
        message = _decode(self._model, self._replay(recorded))
        if self._events is not None and isinstance(recorded.result, dict):
            self._tell("message", {"call": pos, **_shown(recorded.result), "replayed": True})
        return message

    def _answered(self, pos: int, message: Any, cost: float) -> Any:
        encoded = _encode(self._model, message)
        self._record(Call(pos=pos, name="model", result=encoded, cost_usd=cost))
        if self._events is not None and isinstance(encoded, dict):
            self._tell("message", {"call": pos, **_shown(encoded), "cost_usd": cost})
        return message

    def _ask(
        self, request: dict[str, Any], pos: int | None = None, stream: bool = False
    ) -> tuple[Any, float]:
        """The model call itself (pos: its journal place; None inside a ctx.call)."""
        assert self._model is not None
        self._check_model(request, pos)
        try:
            if stream:
                message, cost = self._stream(request, pos)
            else:
                message, cost = self._model.create(**request)
        except BaseException as exc:
            self._after_model(pos, exc)
            raise
        self._count(cost)
        tracing.model_answered(request, message, cost, stream)
        self._after_model(pos, None)
        return message, cost

    async def _aask(
        self, request: dict[str, Any], pos: int | None = None, stream: bool = False
    ) -> tuple[Any, float]:
        assert self._model is not None
        self._check_model(request, pos)
        try:
            if stream:
                message, cost = await asyncio.to_thread(self._stream, request, pos)
            else:
                message, cost = await asyncio.to_thread(self._model.create, **request)
        except BaseException as exc:
            self._after_model(pos, exc)
            raise
        self._count(cost)
        tracing.model_answered(request, message, cost, stream)
        self._after_model(pos, None)
        return message, cost

    def _stream(self, request: dict[str, Any], pos: int | None) -> tuple[Any, float]:
        stream = getattr(self._model, "stream", None)
        if stream is None:
            raise RuntimeError(f"{type(self._model).__name__} cannot stream: it has no stream()")
        call = pos if pos is not None else -1  # -1: inside a ctx.call, not journaled apart

        def on_text(text: str) -> None:
            self._delta(call, text)

        def on_restart() -> None:
            self._lease.ensure()  # a retry is a new request: only while the run is ours
            self._tell("model_restart", {"call": call})

        return stream(on_text, on_restart, **request)  # type: ignore[no-any-return]

    def _after_model(self, pos: int | None, exc: BaseException | None) -> None:
        if pos is not None and self._hooks is not None:
            self._hooks.after_call(self._cp, "model", pos, exc)

    def _model_failed(self, pos: int, exc: Exception) -> None:
        if self._recordable(exc):  # a request the API refuses: refused again on replay
            self._record(Call(pos=pos, name="model", error=_error_of(exc)))

    def _check_model(self, request: dict[str, Any], pos: int | None) -> None:
        assert self._model is not None
        # A model call costs money and shapes the run: a worker that lost the run must not
        # make one (a process resumed after SIGSTOP finds out here), nor a cancelled run.
        self.ensure_owner()
        if self._cap is not None:
            self._afford(self._model.worst_cost(**request), "the next model call")
        if pos is not None and self._hooks is not None:
            self._hooks.before_call(self._cp, "model", pos)


def _as_json(value: Any, what: str, text: bool = False) -> Any:
    """value's JSON copy: what a replay will return (text: and its JSON text)."""
    try:
        raw = json.dumps(value, allow_nan=False)
        return (json.loads(raw), raw) if text else json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise CairnError(
            f"{what} returned {type(value).__name__}, which cannot be journaled ({exc}); "
            "return JSON: dicts, lists, strings, numbers, bools or None"
        ) from exc


def _shown(message: dict[str, Any]) -> dict[str, Any]:
    from cairn.core.events import message_data

    return message_data(message)


def _encode(model: Any, message: Any) -> Any:
    encode = getattr(model, "encode", None)
    return encode(message) if encode else _as_json(message, "the model client")


def _decode(model: Any, data: Any) -> Any:
    decode = getattr(model, "decode", None)
    return decode(data) if decode else data


def _error_of(exc: Exception) -> dict[str, Any]:
    """A permanent error as the journal keeps it: enough to raise it again."""
    try:
        args = json.loads(json.dumps(exc.args))
    except (TypeError, ValueError):
        args = None
    kind = type(exc)
    return {"type": kind.__qualname__, "module": kind.__module__, "args": args, "message": str(exc)}


def _rebuilt(error: dict[str, Any]) -> Exception:
    """The recorded error, as its own class where that can be rebuilt from its args."""
    try:
        kind = importlib.import_module(error["module"])
        for part in error["type"].split("."):
            kind = getattr(kind, part)
        if isinstance(kind, type) and issubclass(kind, Exception) and error["args"] is not None:
            return kind(*error["args"])
    except Exception:  # a class that moved, or that wants other arguments
        logger.debug("could not rebuild %s", error["type"], exc_info=True)
    return CallFailed(error["type"], error["message"])
