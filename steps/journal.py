"""Journaled calls: ctx.call and ctx.acall, each made at most once per place in a step
visit and recorded (fenced like a save), so a replay after a crash returns the record
instead of calling again; scopes for code a replay may resume part way through."""

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
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar, overload

from cairn.core.errors import (
    CairnError,
    CallFailed,
    CallInterrupted,
    JournalDiverged,
    StaleWrite,
)
from cairn.core.records import STEERED, Call

if TYPE_CHECKING:
    from cairn.core.cuts import Cut
    from cairn.core.records import Checkpoint
    from cairn.steps.context import CallHooks, EventSink
    from cairn.steps.model import ModelClient
    from cairn.store.contract import CheckpointStore, HeldLease, StepTx

logger = logging.getLogger(__name__)
T = TypeVar("T")

PARALLEL_CALLS = 8  # ctx.parallel's threads: calls run at once, the rest wait their turn
CUT_GRACE = 1.0  # seconds a cut async call has to unwind before its step goes on
SHOWN_BYTES = 4096  # a call's result goes into its `call` event up to this size
_SCOPE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")  # it goes into keys, as step names do


@dataclasses.dataclass
class _Frame:
    """The journaled call running in this thread or asyncio task: its key, the effect key
    it asked for, and the cost counted inside it. A context variable, not an attribute, so
    calls awaited side by side (asyncio.gather) each keep their own."""

    ctx: StepParts
    key: str
    pos: int = -1  # its place in the journal: the `call` of the tokens streamed inside it
    effect: str | None = None
    cost: float = 0.0
    tx: StepTx | None = None  # ctx.db inside the call: committed with its record


@dataclasses.dataclass
class Journal:
    """The journal of a step visit, or of one scope in it (a LangGraph task, say): its
    records, read at its first call, and its counters of calls and of calls per name."""

    cursor: str  # the step's, or "<step>/<scope>"
    records: dict[int, Call] | None
    calls: int = 0
    per_name: dict[str, int] = dataclasses.field(default_factory=dict)


def as_json(value: Any, what: str, text: bool = False) -> Any:
    """value's JSON copy: what a replay will return (text: and its JSON text)."""
    try:
        raw = json.dumps(value, allow_nan=False)
        return (json.loads(raw), raw) if text else json.loads(raw)
    except (TypeError, ValueError) as exc:
        raise CairnError(
            f"{what} returned {type(value).__name__}, which cannot be journaled ({exc}); "
            "return JSON: dicts, lists, strings, numbers, bools or None"
        ) from exc


def _spec(call: Sequence[Any]) -> tuple[str, Callable[..., Any], tuple[Any, ...]]:
    """A ctx.parallel item, (name, fn, *args), checked before any call starts."""
    if isinstance(call, (str, bytes)) or len(call) < 2 or not callable(call[1]):
        raise TypeError(
            f"ctx.parallel: {call!r} is not (name, fn, *args); "
            "use functools.partial(fn, key=value) for keyword arguments"
        )
    return str(call[0]), call[1], tuple(call[2:])


def error_of(exc: Exception) -> dict[str, Any]:
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


_frame: contextvars.ContextVar[_Frame | None] = contextvars.ContextVar("cairn_call", default=None)
_scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("cairn_scope", default=None)


class StepParts:
    """What the parts of a step's context share (cairn.steps.context.Context is all of
    them): its run's position, its collaborators, and the checks each part calls."""

    run_id: str
    cursor: str
    seq: int
    visit: int
    cost_usd: float
    _cp: Checkpoint
    _store: CheckpointStore
    _lease: HeldLease
    _model: ModelClient | None
    _hooks: CallHooks | None
    _events: EventSink | None
    _retry_on: tuple[type[BaseException], ...]
    _fresh: bool
    _cap: float | None
    _journals: dict[str, Journal]

    if TYPE_CHECKING:  # the context's own, called by its parts

        def ensure_owner(self, *, cancel: bool = True) -> None: ...

        def _ensure_before_call(self) -> None: ...

        def _cancelled(self, reason: str | None, asked: float) -> None: ...

        def _tell(self, kind: str, data: Any) -> None: ...

        def _count(self, usd: float) -> None: ...

        def _afford(self, worst: float, what: str) -> None: ...

        def _hold(self, pos: int, worst: float, what: str, tokens: int = 0) -> None: ...

        def _crossed(self, scopes: tuple[str, ...]) -> None: ...

        def _inside(self) -> _Frame | None: ...

        def _position(self, name: str) -> tuple[int, int]: ...

        def _scoped(self) -> Journal: ...

        def _call_key(self, name: str, n: int) -> str: ...

        def _recorded(self, pos: int, name: str) -> Call | None: ...

        def _replay(self, call: Call) -> Any: ...

        def _record(self, call: Call, tx: StepTx | None = None) -> None: ...

        def _recordable(self, exc: BaseException) -> TypeGuard[Exception]: ...

        def _delta(self, call: int, text: str) -> None: ...

        def _uncut(self, name: str, pos: int, make: Callable[[Cut | None], T]) -> T: ...

        async def _acut(
            self, name: str, pos: int, make: Callable[[Cut | None], Awaitable[T]]
        ) -> T: ...


class JournaledCalls(StepParts):
    """The step context's journaled calls (ctx.call, ctx.acall, ctx.scope)."""

    # -- journaled calls -------------------------------------------------------------
    def call(
        self,
        name: str,
        fn: Callable[..., T],
        /,
        *args: Any,
        max_cost: float | None = None,
        interruptible: bool = False,
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

        interruptible: a steer message sent with interrupt=True while fn runs cuts it:
        fn runs in a thread of its own, its result is discarded when it comes, the journal
        records the cut and this raises CallInterrupted (so does a replay, uncalled).

        A replay must make its calls in the same order: one that asks for another name at
        a recorded position stops the run with JournalDiverged.
        """
        pos, n, recorded = self._begin(name, max_cost)
        if recorded is not None:
            return self._replay(recorded)  # type: ignore[no-any-return]
        token = self._enter(name, pos, n)
        try:
            if interruptible:
                result = self._uncut(name, pos, lambda _: fn(*args, **kwargs))
            else:
                result = fn(*args, **kwargs)
        except BaseException as exc:  # a stop (lost lease, cancel) too: the frame ends
            self._failed(pos, name, exc, token)
            raise
        return self._returned(pos, name, result, token)  # type: ignore[no-any-return]

    def messages(self) -> list[Any]:
        """The steer messages sent to this run (Client.steer) that no earlier
        ctx.messages() of the run read, oldest first: each is delivered once. A journaled
        read: a replay of this step gets the same messages at the same place; a worker
        that lost the run records nothing, so the next owner's read gets them; a message
        sent after the read waits for the next one. Call it at each turn of an agent loop
        (before its model call) to take in what its user added meanwhile."""

        # The record holds the messages' numbers, not the messages: they stay in their own
        # table (sealed there too, with CAIRN_PAYLOAD_KEYS), and the SQL that finds the
        # undelivered ones reads the numbers.
        pos, n, recorded = self._begin(STEERED, None)
        if recorded is not None:
            numbers = self._replay(recorded)
            return [m for _, m in self._store.steers(self.run_id, numbers)]
        token = self._enter(STEERED, pos, n)
        try:
            got = self._store.steers_pending(self.run_id)
        except BaseException as exc:
            self._failed(pos, STEERED, exc, token)
            raise
        self._returned(pos, STEERED, [number for number, _ in got], token)
        return [m for _, m in got]

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
        interruptible: bool = False,
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
        interruptible: bool = False,
        **kwargs: Any,
    ) -> T: ...

    async def acall(
        self,
        name: str,
        fn: Callable[..., Awaitable[T] | T],
        /,
        *args: Any,
        max_cost: float | None = None,
        interruptible: bool = False,
        **kwargs: Any,
    ) -> T:
        """ctx.call for async code: awaits fn(*args, **kwargs) if it returns an awaitable.
        Calls awaited side by side (asyncio.gather) take their places in the order they
        start, so a replay that starts them in the same order finds each one's record.
        interruptible: as ctx.call's; the awaitable is cancelled when cut."""
        pos, n, recorded = self._begin(name, max_cost)
        if recorded is not None:
            return self._replay(recorded)  # type: ignore[no-any-return]
        token = self._enter(name, pos, n)

        async def made(_: Cut | None = None) -> Any:
            result = fn(*args, **kwargs)
            return (await result) if inspect.isawaitable(result) else result

        try:
            result = await (self._acut(name, pos, made) if interruptible else made())
        except BaseException as exc:
            self._failed(pos, name, exc, token)
            raise
        return self._returned(pos, name, result, token)  # type: ignore[no-any-return]

    def parallel(
        self,
        calls: Iterable[Sequence[Any]],
        /,
        *,
        max_workers: int = PARALLEL_CALLS,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Journaled calls made side by side, for sync steps (in an async step, gather
        ctx.acall and ctx.amodel with asyncio.gather): each item is (name, fn, *args), one
        ctx.call(name, fn, *args); functools.partial carries keyword arguments.

        Each call takes its journal place in the order of the list before any of them
        starts, never in the order they finish, so a replay finds each one's record; the
        calls recorded by an earlier attempt are replayed, the rest run on at most
        max_workers threads (each with its own key, cost and ctx.db connection: one from
        the worker's Postgres pool, CAIRN_DATABASE_POOL_SIZE, for as long as the call
        holds it).

        Returns:
            The results in the order of the list.

        Raises:
            The failure at the lowest place, once every call has ended (the others'
            records are kept, so a retry of the step does not make them again), with a
            note naming its place; a stop (lost lease, cancel) before a call's own error.
            With return_exceptions=True a call's Exception is returned in its place.
        """
        todo = [_spec(call) for call in calls]
        if max_workers < 1:
            raise ValueError(f"ctx.parallel(max_workers={max_workers}): at least 1")
        # Every place taken here, in program order, before the first call starts.
        begun = [self._begin(name, None) for name, _, _ in todo]
        outcomes: list[Any] = [None] * len(todo)
        failed: dict[int, BaseException] = {}
        fresh = []
        for i, (pos, _, recorded) in enumerate(begun):
            if recorded is None:
                fresh.append(i)
                continue
            try:
                outcomes[i] = self._replay(recorded)
            except Exception as exc:  # noqa: BLE001 (a recorded error: kept in its place)
                failed[i] = exc

        def made(i: int) -> Any:
            name, fn, args = todo[i]
            pos, n, _ = begun[i]
            token = self._enter(name, pos, n)
            try:
                result = fn(*args)
            except BaseException as exc:
                self._failed(pos, name, exc, token)
                raise
            return self._returned(pos, name, result, token)

        if fresh:
            workers = min(max_workers, len(fresh))
            with ThreadPoolExecutor(workers, thread_name_prefix="cairn-call") as pool:
                # Each call in a copy of the step's context: cairn.current(), its scope.
                ran = {i: pool.submit(contextvars.copy_context().run, made, i) for i in fresh}
            for i, future in ran.items():
                error = future.exception()
                if error is None:
                    outcomes[i] = future.result()
                else:
                    failed[i] = error
        if failed:
            for i, error in failed.items():
                pos, name = begun[i][0], todo[i][0]
                where = f"ctx.parallel: call {pos} ({name!r}) of step {self.cursor!r}"
                error.add_note(where)  # str(error) stays the call's own, for retry policies
                logger.info(
                    "run %s: %s raised %s: %s", self.run_id, where, type(error).__name__, error
                )
                outcomes[i] = error
            # A stop (lost lease, cancel) is the loop's to handle before any call's error.
            stops = [i for i, error in failed.items() if not isinstance(error, Exception)]
            raised = stops or ([] if return_exceptions else list(failed))
            if raised:
                raise failed[min(raised)]
        return outcomes

    def _uncut(self, name: str, pos: int, make: Callable[[Cut | None], T]) -> T:
        """make() while a steer message with interrupt=True may cut it: in a thread of its
        own, this one waiting for either. A cut call's thread runs on to its end, and
        what it returns is heard by nobody."""
        with self._store.interrupts(self.run_id) as cut:
            if cut is None:  # the store cannot hear one now: the call runs uncut
                return make(None)
            ended = threading.Event()
            cut.on_fire(ended.set)
            outcome: list[tuple[bool, Any]] = []

            def work() -> None:
                try:
                    outcome.append((True, make(cut)))
                except BaseException as exc:  # noqa: BLE001 (raised again in the step's thread)
                    outcome.append((False, exc))
                finally:
                    ended.set()

            runner = contextvars.copy_context().run  # cairn.current(), the call's frame
            threading.Thread(
                target=runner, args=(work,), name="cairn-cut-call", daemon=True
            ).start()
            ended.wait()
        if not outcome:  # a call that ended as the cut came keeps its result
            raise CallInterrupted(self.run_id, name, pos)
        ok, value = outcome[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    async def _acut(self, name: str, pos: int, make: Callable[[Cut | None], Awaitable[T]]) -> T:
        """_uncut for a step's event loop: the call is a task, cancelled when cut."""
        with self._store.interrupts(self.run_id) as cut:
            if cut is None:
                return await make(None)
            loop = asyncio.get_running_loop()
            cutoff: asyncio.Future[None] = loop.create_future()

            def settle() -> None:
                if not cutoff.done():
                    cutoff.set_result(None)

            def fired() -> None:
                loop.call_soon_threadsafe(settle)

            cut.on_fire(fired)
            task: asyncio.Future[T] = asyncio.ensure_future(make(cut))
            either: set[asyncio.Future[Any]] = {task, cutoff}
            try:
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not task.done():
                    task.cancel()  # cut, or the step itself cancelled: the call goes too
                    # Its unwinding (finally blocks, the request's connection) before the
                    # step goes on, for as long as a call that swallows cancels may hold it.
                    await asyncio.wait({task}, timeout=CUT_GRACE)
        if task.cancelled() or not task.done():
            raise CallInterrupted(self.run_id, name, pos)
        return task.result()

    def _enter(self, name: str, pos: int, n: int) -> contextvars.Token[Any]:
        if self._hooks is not None:
            self._hooks.before_call(self._cp, name, pos)
        return _frame.set(_Frame(self, self._call_key(name, n), pos))

    def _call_key(self, name: str, n: int) -> str:
        """The n-th call of name's key in this visit (or scope): its effects' idempotency
        key, the same on every attempt at the call."""
        return f"cairn:{self.run_id}:{self._scoped().cursor}:{self.visit}:{name}:{n}"

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
            self._ensure_before_call()
            if max_cost is not None:
                self._afford(max_cost, f"ctx.call({name!r})")
                self._hold(pos, max_cost, f"ctx.call({name!r})")
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
                error = error_of(exc)
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
            value, raw = as_json(result, f"ctx.call({name!r})", text=True)
            cost = frame.cost if frame else 0.0
            self._record(Call(pos=pos, name=name, result=value, cost_usd=cost), tx)
            if self._events is not None:
                shown = value if len(raw) <= SHOWN_BYTES else {"truncated": len(raw)}
                self._tell("call", {"call": pos, "name": name, "result": shown})
        finally:
            if tx is not None:
                tx.close()
        return value

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

    def _scoped(self) -> Journal:
        scope = _scope.get()
        cursor = self.cursor if scope is None else f"{self.cursor}/{scope}"
        journal = self._journals.get(cursor)
        if journal is None:
            # A step that follows this worker's own save is fresh: nobody recorded its calls.
            journal = self._journals[cursor] = Journal(cursor, {} if self._fresh else None)
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

    def _at(self) -> Checkpoint:
        """The checkpoint as the journal in hand keys its records (a scope's cursor)."""
        v = self._scoped()
        return (
            self._cp if v.cursor == self.cursor else dataclasses.replace(self._cp, cursor=v.cursor)
        )

    def _record(self, call: Call, tx: StepTx | None = None) -> None:
        v = self._scoped()
        at = self._at()
        asked = time.monotonic()
        recorded = self._store.record_call(at, self.visit, call, tx)
        if recorded is None:
            # Another worker claimed the run: what this call did is not ours to keep.
            raise StaleWrite(self.run_id, self.seq, self._lease.epoch)
        assert v.records is not None
        v.records[call.pos] = call
        if recorded.crossed:
            self._crossed(recorded.crossed)
        self._cancelled(recorded.cancel_reason, asked)  # kept, but the step goes no further

    def _recordable(self, exc: BaseException) -> TypeGuard[Exception]:
        """A permanent error of the call itself: not cairn's own (cancel, budget, lost
        lease, Transient), not one the step's policy retries, not our store going down,
        not an interrupt of the process. A steer message's cut of the call is recorded."""
        if isinstance(exc, CallInterrupted):  # a cut is kept: a replay is cut at its place
            return True
        return isinstance(exc, Exception) and not (
            isinstance(exc, (CairnError, *self._retry_on)) or self._store.outage(exc) is not None
        )
