"""The run's life under chaos: payment signals sent to invoice runs that wait for them
(some before the run waits, some twice with one signal id) and runs cancelled while they
work; then whether any signal was lost and any effect came after a cancel."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from cairn.core.records import RunFilter
from cairn.core.status import RunStatus

if TYPE_CHECKING:
    from cairn.client.client import Client
    from cairn.store import CheckpointStore


class Lifecycle:
    """Seeded: which runs get their signal early, which twice, which are cancelled."""

    def __init__(self, seed: int, run_ids: list[str], signals: bool, cancel_rate: float) -> None:
        rng = random.Random(f"{seed}-lifecycle")
        self.signals = signals
        self._early = {r for r in run_ids if signals and rng.random() < 0.3}
        self._twice = {r for r in run_ids if signals and rng.random() < 0.3}
        self._to_cancel = set(rng.sample(run_ids, round(cancel_rate * len(run_ids))))
        self._signalled: set[str] = set()
        self.sent = 0
        self.cancelled_at: dict[str, float] = {}

    def start(self, client: Client, run_ids: list[str] | None = None) -> None:
        """Signals sent before their run has even started: they must not be lost. Only
        to run_ids when given (the runs enqueued so far)."""
        early = self._early if run_ids is None else self._early & set(run_ids)
        for run_id in sorted(early - self._to_cancel):
            self._signal(client, run_id)

    def tick(self, client: Client, store: CheckpointStore) -> None:
        runs = {r.run_id: r.status for r in store.list_runs(RunFilter(limit=100_000))}
        for run_id, status in runs.items():
            if run_id in self._to_cancel and run_id not in self.cancelled_at:
                # A fast run may never be seen running: one already waiting is cancelled
                # there, else nobody would signal or cancel it and it would wait forever.
                if status in (RunStatus.RUNNING, RunStatus.WAITING):
                    client.cancel(run_id, "chaos")
                    # After the commit: a step attempt that begins later must see it.
                    self.cancelled_at[run_id] = time.time()
            elif self.signals and status == RunStatus.WAITING and run_id not in self._signalled:
                self._signal(client, run_id)

    def _signal(self, client: Client, run_id: str) -> None:
        self._signalled.add(run_id)
        for _ in range(2 if run_id in self._twice else 1):
            client.signal(run_id, "payment", {"run": run_id}, signal_id=f"pay-{run_id}")
            self.sent += 1

    def verdict(
        self, final: list[dict[str, Any]], events: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], list[str]]:
        """The report's lifecycle section and its problems: a signalled run that did not
        end paid (a lost signal), a send by a step attempt that began after its run's
        cancel was committed."""
        problems: list[str] = []
        by_run = {r["run_id"]: r for r in final}
        paid = [r for r in final if r.get("outcome") == "paid"]
        unpaid = [
            r
            for r in final
            if self.signals
            and r["run_id"] not in self.cancelled_at
            and r["status"] == RunStatus.DONE
            and r.get("outcome") != "paid"
        ]
        if unpaid:
            problems.append(f"{len(unpaid)} run(s) lost their signal (e.g. {unpaid[0]['run_id']})")
        after_cancel = []
        for e in events:
            run_id, _, _, attempt_ns = (e.get("step") or "- - - 0").split(" ")
            asked = self.cancelled_at.get(run_id)
            if asked is not None and int(attempt_ns) / 1e9 > asked:
                after_cancel.append(run_id)
        if after_cancel:
            problems.append(f"{len(after_cancel)} send(s) after a cancel (e.g. {after_cancel[0]})")
        cancelled = [
            r for r in self.cancelled_at if by_run.get(r, {}).get("status") == RunStatus.CANCELLED
        ]
        section = {
            "signals_sent": self.sent,
            "signals_duplicated": len(self._twice & self._signalled),
            "signals_early": len(self._early & self._signalled),
            "runs_paid": len(paid),
            "signals_lost": len(unpaid),
            "cancels_asked": len(self.cancelled_at),
            "runs_cancelled": len(cancelled),
            "sends_after_cancel": len(after_cancel),
        }
        return section, problems
