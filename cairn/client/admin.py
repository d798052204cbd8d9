"""A Client's operator's operations: replay a workflow's failed runs, the budgets (a run
tree's, a tenant's per day or month), and whether the services answer. Who may call
each is cairn.client.tenancy's (replay and a tenant's limits are an admin's)."""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Callable

from cairn.client.base import ClientBase
from cairn.client.checks import checked_budget, checked_replay, checked_tenant_budget
from cairn.client.tenancy import no_budget
from cairn.core.errors import CairnError, InvalidInput, UnknownBudget, UnknownRun
from cairn.core.inputs import check_tenant
from cairn.core.records import Budget, Run
from cairn.core.status import RunStatus
from cairn.workers import health

# Runs re-armed a transaction by Client.replay, each batch's messages sent after its commit:
# a crash mid-replay leaves the rest failed (replay again), and a batch committed but not
# sent pending, which the reaper sends as it does any run whose message was lost.
REPLAY_BATCH = 500


class Admin(ClientBase):
    """Client's operator's operations."""

    def replay(
        self,
        workflow: str,
        *,
        since: dt.datetime,
        until: dt.datetime | None = None,
        status: RunStatus | str | tuple[RunStatus | str, ...] = RunStatus.FAILED,
        limit: int | None = None,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> builtins.list[Run]:
        """Replay the workflow's runs that failed since a time: each goes on from its last
        saved step (its cursor), retries counted afresh, as enqueueing it again would do.
        A replayed step keeps its visit, so its effects keep their idempotency keys: a
        send that went out before the failure is deduplicated, not made twice.

        since/until: when the runs stopped, [since, until) (until: the replay's start, by
        the database's clock). status: "failed" and/or "incompatible" (after a deploy
        that brings the step back). dry_run: only which runs (nothing written or sent).
        Returns the runs as they stopped, oldest first; progress(n) after each batch.
        Two replays at once re-arm each run once; a run that fails again during this
        replay waits for the next one."""
        statuses, since, until, limit = checked_replay(status, since, until, limit)
        until = until or self.store.clock()
        if dry_run:
            return self.store.replay(workflow, statuses, since, until, limit, dry_run=True)
        replayed: list[Run] = []
        while len(replayed) < limit:
            batch = self.store.replay(
                workflow, statuses, since, until, min(REPLAY_BATCH, limit - len(replayed))
            )
            if not batch:
                break
            for run in batch:  # after the batch's commit; a queued one's delivery waits
                self._send(run.run_id, run.priority)
            replayed += batch
            if progress is not None:
                progress(len(replayed))
        return replayed

    def problems(self) -> builtins.list[str]:
        """One line per service (Postgres, the broker) that does not answer within
        CAIRN_CLIENT_GIVE_UP_AFTER; empty when both do."""
        found = []
        try:
            self.store.ping()
        except CairnError as exc:
            found.append(str(exc))
        if self._sender is not None:  # a send given is the caller's to check
            found += health.broker_problems(self.settings)
        return found

    def budget(self, run_id: str) -> Budget:
        """The budget run_id was enqueued with (budget_usd=): its limit, what the tree's
        journaled calls cost (spent_usd) and what its calls in flight may cost at worst
        (reserved_usd). Raises UnknownRun, or InvalidInput when the run has no budget."""
        got = self.store.budget(run_id)
        if got is None:
            raise self._no_budget(run_id)
        return got

    def raise_budget(
        self, run_id: str, *, usd: float | None = None, tokens: int | None = None
    ) -> Budget:
        """Set the limits given (usd, tokens; higher or lower) of the budget run_id was
        enqueued with, and resume the runs of its tree that stopped as budget_exceeded:
        each goes on at the call that stopped it, which is checked again. Raises
        UnknownRun, or InvalidInput when the run has no budget or neither limit is given
        as a number above 0."""
        if usd is None and tokens is None:
            raise InvalidInput("raise_budget: give usd=, tokens= or both")
        checked_budget(usd, tokens, None, False)
        rearmed = self.store.raise_budget(run_id, usd, tokens)
        if rearmed is None:
            raise self._no_budget(run_id)
        self._send_rearmed(rearmed)
        return self.budget(run_id)

    def set_tenant_budget(
        self,
        tenant: str,
        *,
        usd: float | None = None,
        tokens: int | None = None,
        per: str | None = None,
        soft: float | None = None,
    ) -> Budget:
        """Give the tenant a budget per UTC day or month (per: "day" or "month"), or change
        it: the limits given (usd, tokens), per and soft (None: kept; a new budget counts
        per "day" unless told). Every run of the tenant spends against it from its next
        claim, beside its own tree's budget; a model call that would pass it stops its run
        as budget_exceeded first. Each new period starts from nothing spent. The tenant's
        runs stopped over budget go on (each checked again at the call that stopped it):
        given nothing, it changes nothing else (after a new day, say).
        An admin's: a Client with a tenant gets Forbidden (an InvalidInput), as a bad
        argument gets InvalidInput; a new budget without a limit, UnknownBudget."""
        checked_tenant_budget(tenant, usd, tokens, per, soft)
        rearmed = self.store.set_tenant_budget(tenant, usd, tokens, per, soft)
        if rearmed is None:
            raise UnknownBudget(
                f"tenant {tenant!r} has no budget yet: a new one needs a limit "
                "(usd=, tokens=; cairn budgets set --usd N, --tokens N)"
            )
        self._send_rearmed(rearmed)
        return self.tenant_budget(tenant)

    def delete_tenant_budget(self, tenant: str) -> Budget:
        """Delete the tenant's budget: its runs no longer spend against any (those in
        flight from their next model call), and its runs stopped over budget go on (each
        checked again at the call that stopped it, against its own tree's budget if any).

        Args:
            tenant: the tenant whose budget goes.

        Returns:
            The budget as it stood when deleted (this period's spend).

        Raises:
            UnknownBudget (an InvalidInput): the tenant has no budget.
            InvalidInput: a bad tenant name.
            Forbidden (an InvalidInput): a Client with a tenant (an admin's call).
        """
        check_tenant(tenant)
        got = self.store.delete_tenant_budget(tenant)
        if got is None:
            raise UnknownBudget(f"tenant {tenant!r} has no budget to delete")
        budget, rearmed = got
        self._send_rearmed(rearmed)
        return budget

    def tenant_budget(self, tenant: str) -> Budget:
        """The tenant's budget in this period: its limits, period and period_start, what
        its runs' journaled calls cost since (spent_*) and what their calls in flight may
        cost at worst (reserved_*). A Client with a tenant reads its own only. Raises
        UnknownBudget (an InvalidInput) when the tenant has none."""
        check_tenant(tenant)
        got = self.store.tenant_budget(tenant)
        if got is None:
            raise UnknownBudget(no_budget(tenant))
        return got

    def _no_budget(self, run_id: str) -> Exception:
        if self.store.get(run_id) is None:
            return UnknownRun(f"no run {run_id!r}")
        return InvalidInput(
            f"run {run_id!r} has no budget: enqueue(..., budget_usd=...) gives a run one"
        )
