"""A run's history taken up again (AdminStore's fork, rewind, replay and forks): from
the snapshot a step's history row kept of the checkpoint it saved."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from cairn.core.records import Attempt, Run
from cairn.core.status import REARMABLE, STOPPED, RunStatus
from cairn.store.rows import forked, replay_params, rewound
from cairn.testing.memory.rows import _dump, _Row, _Snap
from cairn.testing.memory.tables import _Tables


class _Forks(_Tables):
    """Fork a run, rewind it, replay many: each as its query in store/sql/queries.sql."""

    def fork(
        self,
        origin: str,
        at: int,
        run_id: str,
        patch: dict[str, Any] | None = None,
        traceparent: str | None = None,
    ) -> bool:
        """Create run_id, pending, from the checkpoint origin saved at seq `at` (fork in
        the SQL): its input patched, its state, cursor, visits and window there, its cost
        at 0, a `forked` mark in its history. False if run_id existed (unchanged). Raises
        UnknownRun, or InvalidInput when origin saved no checkpoint at that seq."""
        extra = json.loads(_dump(patch or {}))
        with self._lock:
            src = self._rows.get(origin)
            found = self._snapshot(src, at) if src is not None else None
            made = src is not None and found is not None and run_id not in self._rows
            if made:
                assert src is not None and found is not None
                cursor, snap = found
                stamp = self._stamp()
                row = self._new_row(
                    run_id, src.workflow, _dump({**json.loads(src.input), **extra}), stamp,
                    cursor, src.max_cost_usd, priority=src.priority, traceparent=traceparent,
                    forked_from=origin, forked_at=at, seq=at, visits=snap.visits,
                    win_start=snap.win_start, win_end=snap.win_end,
                    flow_version=snap.flow_version, tenant=src.tenant,
                )  # fmt: skip
                row.status = RunStatus.DONE if cursor == RunStatus.DONE else RunStatus.PENDING
                row.state = snap.state or "{}"
                row.window = {
                    i: src.window[i] for i in range(snap.win_start, snap.win_end) if i in src.window
                }
                mark = self._history(
                    at - 1, cursor, 0, "forked", Attempt(started=stamp.timestamp(), worker="client"),
                    0, 0.0, f"forked from {origin} at seq {at}", stamp, cursor,
                )  # fmt: skip
                row.history.append((mark, dataclasses.replace(snap, total_cost=0.0)))
            answer = {
                "origin_found": src is not None,
                "found": found is not None,
                "run_id": run_id if made else None,
            }
        return forked(answer, origin, at)

    def rewind(self, run_id: str, at: int) -> int:
        """Move the stopped run back to the checkpoint it saved at seq `at`, in place (rewind
        in the SQL): at a new seq, its visits past every visit it ever made of each step,
        its cost kept, a `rewound` mark in its history; its new seq. Raises UnknownRun,
        InvalidInput (no checkpoint at that seq), or RunNotStopped."""
        with self._lock:
            row = self._rows.get(run_id)
            found = self._snapshot(row, at) if row is not None else None
            answer: dict[str, Any] = {
                "status": row.status if row is not None else None,
                "found": found is not None,
                "seq": None,
            }
            if row is not None and found is not None and row.status in STOPPED:
                cursor, snap = found
                used: dict[str, int] = {}  # each step's next unused visit
                steps = [(h["cursor"], h["visit"]) for h, _ in row.history]
                for step, visit in steps + [(c, v) for c, v, _ in row.journal]:
                    used[step] = max(used.get(step, 0), visit + 1)
                kept = json.loads(snap.visits)
                visits = {k: max(kept.get(k, 0), used.get(k, 0)) for k in {*kept, *used}}
                old, stamp = row.status, self._stamp()
                row.seq, row.cursor, row.state = row.seq + 1, cursor, snap.state or "{}"
                row.visits, row.win_start, row.win_end = _dump(visits), snap.win_start, snap.win_end
                row.flow_version, row.error = snap.flow_version, None
                row.status = RunStatus.DONE if cursor == RunStatus.DONE else RunStatus.PENDING
                row.attempts, row.deliveries, row.retry_at, row.cancel_reason = 0, 0, None, None
                row.cancelled_by = None
                row.wait_event = row.wait_until = row.wait_timeout_cursor = None
                row.updated_at = stamp
                mark = self._history(
                    row.seq - 1, cursor, 0, "rewound",
                    Attempt(started=stamp.timestamp(), worker="client"), row.epoch, 0.0,
                    f"rewound to seq {at}", stamp, cursor,
                )  # fmt: skip
                moved = dataclasses.replace(snap, visits=row.visits, total_cost=row.cost_usd)
                row.history.append((mark, moved))
                if old in REARMABLE or old == RunStatus.UNKNOWN:  # cairn_run_rearmed
                    self._rearmed(row)
                answer["seq"] = row.seq
        return rewound(answer, run_id, at)

    def replay(
        self,
        workflow: str,
        statuses: tuple[RunStatus, ...],
        since: dt.datetime,
        until: dt.datetime,
        limit: int,
        *,
        dry_run: bool = False,
    ) -> list[Run]:
        """Re-arm up to limit of the workflow's runs that stopped in one of the statuses in
        [since, until) (by their last change), oldest first, each as it stopped (replay
        in the SQL); dry_run: only which."""
        replay_params(workflow, statuses, since, until, limit)  # the same refusals
        with self._lock:
            picked = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.status in statuses
                    and r.workflow == workflow
                    and since <= r.updated_at < until
                ),
                key=lambda r: (r.updated_at, r.run_id),
            )[:limit]
            out = [Run(**self._listed(r)) for r in picked]
            if not dry_run:
                for r in picked:
                    r.status, r.error, r.attempts, r.deliveries = RunStatus.PENDING, None, 0, 0
                    r.retry_at, r.updated_at = None, self._stamp()
                    self._rearmed(r)
            return out

    def forks(self, run_id: str) -> list[Run]:
        """The runs forked from run_id, oldest first."""
        with self._lock:
            found = sorted(
                (r for r in self._rows.values() if r.forked_from == run_id),
                key=lambda r: (r.created_at, r.run_id),
            )
            keep = ("parent_id", "concurrency_key", "priority")  # not among forks' columns
            return [
                Run(
                    **{k: v for k, v in self._listed(r).items() if k not in keep},
                    forked_from=r.forked_from,
                    forked_at=r.forked_at,
                )
                for r in found
            ]

    def _snapshot(self, row: _Row, at: int) -> tuple[str, _Snap] | None:
        """The snapshot fragment: the checkpoint the run saved at seq `at` (the latest
        history row that saved it, or a fork's or a rewind's mark), with the state as of
        then (the last row up to it that changed it): (its cursor, the snapshot)."""
        for i in range(len(row.history) - 1, -1, -1):
            shown, snap = row.history[i]
            if snap is None or shown["seq"] != at - 1 or shown["next_cursor"] is None:
                continue
            if shown["outcome"] not in ("saved", "forked", "rewound"):
                continue
            state = next(
                (s.state for _, s in reversed(row.history[: i + 1]) if s and s.state), None
            )
            return shown["next_cursor"], dataclasses.replace(snap, state=state)
        return None
