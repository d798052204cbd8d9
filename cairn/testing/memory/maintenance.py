"""The store's upkeep (Maintenance): the reaper's candidates and the sweep."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from cairn.core.records import budget_scope, tenant_scope
from cairn.core.status import TERMINAL, RunStatus
from cairn.store.rows import FOLD_BATCH, WAKE_BATCH
from cairn.testing.memory.rows import _unconsumed
from cairn.testing.memory.tables import _Tables

UNDER_WAY = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)


class _Maintenance(_Tables):
    """Maintenance: what the reaper and the sweep ask of the store."""

    def fold_counts(self, batch: int = FOLD_BATCH) -> int:
        """0: counts are read from the rows themselves, so there are no deltas to fold."""
        return 0

    def roll_budgets(self, batch: int = WAKE_BATCH) -> list[str]:
        """Tenant budgets whose period is over rolled, and up to batch runs stopped over
        their tenant's budget before its period began re-armed (see the SQL's
        roll_tenant_budgets): each returned once."""
        with self._lock:
            tenants = sorted(s for s, b in self._budgets.items() if b.get("period") is not None)
            self._roll(tenants[:batch])
            stopped = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status == RunStatus.BUDGET_EXCEEDED
                    and r.tenant is not None
                    and (b := self._budgets.get(tenant_scope(r.tenant))) is not None
                    and b.get("period") is not None
                    and r.updated_at < b["period_start"]
                    and f" budget {tenant_scope(r.tenant)} has " in (r.error or "")
                ),
                key=lambda r: r.updated_at,
            )[:batch]
            chosen = {r.run_id for r in stopped}
            return self._rearm_over_budget(lambda row: row.run_id in chosen)

    def routes(self, run_ids: list[str]) -> dict[str, str]:
        """The pinned runs among run_ids, each with the version it is pinned to."""
        with self._lock:
            rows = [self._rows.get(run_id) for run_id in run_ids]
            return {
                r.run_id: r.started_version for r in rows if r and r.pinned and r.started_version
            }

    def pinned_runs(self) -> dict[str, tuple[int, int]]:
        """Pinned runs under way per version: (runs, of which waiting)."""
        found: dict[str, tuple[int, int]] = {}
        with self._lock:
            for r in self._rows.values():
                if r.pinned and r.started_version and r.status in UNDER_WAY:
                    runs, waiting = found.get(r.started_version, (0, 0))
                    found[r.started_version] = (runs + 1, waiting + (r.status == RunStatus.WAITING))
        return dict(sorted(found.items()))

    def stalled(self, pending_after: float, running_after: float) -> list[dict[str, Any]]:
        """Reaper candidates: {run_id, status, epoch, updated_at} (see the SQL's stalled)."""
        with self._lock:
            now = self._now()
            running_since = now - dt.timedelta(seconds=running_after)
            pending_since = now - dt.timedelta(seconds=pending_after)
            found = []
            for r in self._rows.values():
                claimed = r.status == RunStatus.RUNNING or (
                    r.status == RunStatus.PENDING and r.epoch > 0
                )
                quiet = (claimed and r.updated_at < running_since) or (
                    r.status == RunStatus.PENDING and r.updated_at < pending_since
                )
                due = r.retry_at is None or r.retry_at < running_since
                # A wait whose time came is wake()'s (see the SQL's stalled).
                woken = r.status == RunStatus.WAITING and any(
                    s.created_at < running_since for _, s in _unconsumed(r, r.wait_event)
                )
                if (quiet or woken) and due:
                    found.append(
                        {
                            "run_id": r.run_id,
                            "status": str(r.status),
                            "epoch": r.epoch,
                            "updated_at": r.updated_at,
                        }
                    )
            return found

    def wake(
        self, batch: int = WAKE_BATCH, before_commit: Callable[[list[str]], None] | None = None
    ) -> list[str]:
        """Up to batch waiting runs whose time came, the most overdue first, moved to
        pending (their wait kept, read as over): each returned once (see the SQL's wake)."""
        with self._lock:
            now, stamp = self._now(), self._stamp()
            due = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status == RunStatus.WAITING
                    and r.wait_until is not None
                    and r.wait_until < now
                ),
                key=lambda r: (r.wait_until, r.run_id),
            )[:batch]
            if due and before_commit is not None:
                before_commit([r.run_id for r in due])
            for r in due:
                r.status, r.updated_at = RunStatus.PENDING, stamp
            return [r.run_id for r in due]

    def unclaimed(self, older_than: float, limit: int = 10_000) -> list[dict[str, Any]]:
        """Pending runs no worker has taken, sent over older_than seconds ago, oldest
        first: {run_id, epoch, updated_at}."""
        with self._lock:
            since = self._now() - dt.timedelta(seconds=older_than)
            found = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status == RunStatus.PENDING and r.epoch == 0 and r.updated_at < since
                ),
                key=lambda r: (r.updated_at, r.run_id),
            )
            return [
                {"run_id": r.run_id, "epoch": r.epoch, "updated_at": r.updated_at}
                for r in found[:limit]
            ]

    def unchanged(self, rows: list[dict[str, Any]]) -> set[str]:
        """The run ids among rows (as stalled or unclaimed listed them) whose epoch and
        updated_at are still the same."""
        with self._lock:
            return {
                r["run_id"]
                for r in rows
                if (row := self._rows.get(r["run_id"])) is not None
                and (row.epoch, row.updated_at) == (r["epoch"], r["updated_at"])
            }

    def sweep(
        self,
        older_than: float,
        batch: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete terminal runs older than older_than seconds with their window, ledger,
        history, signals and approvals (with their audit; the rules stay), batch runs at a
        time; returns how many went."""
        total = 0
        while True:
            with self._lock:
                since = self._now() - dt.timedelta(seconds=older_than)
                old = [
                    r.run_id
                    for r in self._rows.values()
                    if r.status in TERMINAL and r.updated_at < since
                ][:batch]
                for run_id in old:
                    del self._rows[run_id]
                gone = set(old)
                for key in [k for k, (run_id, *_) in self._effects.items() if run_id in gone]:
                    del self._effects[key]
                scopes = {budget_scope(run_id) for run_id in old}
                for scope in scopes & self._budgets.keys():
                    del self._budgets[scope]
                for hold in [h for h in self._holds if h[4] in scopes]:
                    del self._holds[hold]
                asked = self._asks.asked  # an approval's audit row is its `decision`
                for approval_id in [k for k, a in asked.items() if a.run_id in gone]:
                    del asked[approval_id]
            total += len(old)
            if progress is not None and old:
                progress(total)
            if len(old) < batch:
                return total
