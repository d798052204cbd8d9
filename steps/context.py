"""What a step sees: the run's position, its state and window, and effect helpers."""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from cairn import logs
from cairn.errors import BudgetExceeded, Cancelled, MultipleEffects

if TYPE_CHECKING:
    from cairn.steps.model import ModelClient
    from cairn.store import Checkpoint, StepTransaction
    from cairn.store.contract import CheckpointStore, HeldLease
    from cairn.store.tx import Connection

logger = logging.getLogger(__name__)
T = TypeVar("T")


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
        self.window: list[dict[str, Any]] = list(cp.window)
        self.config = config
        # The signal this step was woken by (see StepResult.wait): its payload, its id.
        self.signal: Any = cp.signal["payload"] if cp.signal else None
        self.signal_id: str | None = cp.signal["id"] if cp.signal else None
        self.cost_usd = 0.0  # this step's model cost so far
        self._spent = cp.cost_usd  # the run's, before this step
        cap = cp.max_cost_usd if cp.max_cost_usd is not None else getattr(config, "max_cost_usd", 0)
        self._cap: float | None = cap or None
        self._store, self._lease, self._model = store, lease, model
        self._effect: str | None = None
        self._tx: StepTransaction | None = None

    # -- effects ---------------------------------------------------------------------
    def idempotency_key(self, suffix: str = "") -> str:
        """The key of this step's one externally visible effect.

        Derived from run, cursor and visit, never the attempt, so a replay of this visit
        sends the same key and the downstream dedupes it. Asking for a second, different
        key in one step is an error: split the step at the effect boundary.
        """
        key = f"cairn:{self.run_id}:{self.cursor}:{self.visit}" + (f":{suffix}" if suffix else "")
        if self._effect is not None and self._effect != key:
            raise MultipleEffects(
                f"step {self.cursor!r} of run {self.run_id} asked for a second effect key "
                f"({key!r} after {self._effect!r}); one externally visible effect per step"
            )
        self._ensure()  # a worker that lost the run, or a cancelled run, must not reach it
        self._effect = key
        return key

    @property
    def effect_key(self) -> str | None:
        """The key this step asked for, if any (recorded in the step history)."""
        return self._effect

    def _log(self, action: str, **more: Any) -> dict[str, Any]:
        epoch = self._lease.epoch
        return logs.run(self.run_id, action, cursor=self.cursor, seq=self.seq, epoch=epoch, **more)

    def _ensure(self) -> None:
        """Before an effect: this worker still owns the run, and nobody cancelled it."""
        self._lease.ensure()
        reason = self._store.cancel_reason(self.run_id)
        if reason is not None:
            raise Cancelled(f"run {self.run_id} was cancelled: {reason}")

    def once(self, effect: Callable[[str], T], *, suffix: str = "") -> T:
        """Run effect(key) unless the done-ledger says this visit already ran it.

        For downstreams without idempotency. It narrows the window, not closes it: a
        crash between the effect and mark_done repeats the effect on replay, and so can a
        process paused longer than the lease TTL between its last lease check (asked of
        Redis itself, right before the effect) and the effect.
        """
        key = self.idempotency_key(suffix)
        done, result = self._store.was_done(key)
        if done:
            logger.info(
                "run %s: %s already done, skipping",
                self.run_id,
                key,
                extra=self._log("once_skipped", key=key),
            )
            return result
        self._lease.ensure(fresh=True)  # nothing downstream fences this effect: ask Redis
        result = effect(key)
        self._store.mark_done(key, self.run_id, result, self._lease.epoch)
        return result

    @property
    def db(self) -> Connection:
        """A Postgres connection in a transaction that commits with this step's checkpoint.

        Writes here and the checkpoint land together or not at all: the one way to close
        the replay window, for effects that live in our own database.
        """
        if self._tx is None:
            self._lease.ensure()
            self._tx = self._store.transaction()
        return self._tx.connection

    @property
    def transaction(self) -> StepTransaction | None:
        """The step's transaction if it used ctx.db; the loop's save commits it."""
        return self._tx

    def close(self) -> None:
        """Give the connection back; an uncommitted transaction is rolled back."""
        if self._tx is not None:
            self._tx.close()

    # -- model -----------------------------------------------------------------------
    def model(self, **request: Any) -> Any:
        """messages.create through the anthropic SDK, retried; its cost is counted."""
        if self._model is None:
            raise RuntimeError("no model client configured for this worker")
        # A model call costs money and shapes the run: a worker that lost the run must not
        # make one (a process resumed after SIGSTOP finds out here), nor a cancelled run.
        self._ensure()
        if self._cap is not None:
            worst = self._model.worst_cost(**request)
            spent = self._spent + self.cost_usd
            if spent + worst > self._cap:
                raise BudgetExceeded(
                    f"run {self.run_id}: spent ${spent:.6f}; the next model call could cost "
                    f"up to ${worst:.6f}, over the cap of ${self._cap:.6f}"
                )
        message, cost = self._model.create(**request)
        self.cost_usd += cost
        return message
