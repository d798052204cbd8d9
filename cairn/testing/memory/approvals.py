"""Approvals in dicts, beside a MemoryStore, as store/approvals.py and the save_approval
and decide statements keep them: MemoryStore.approval_store() gives it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import TYPE_CHECKING, Any

from cairn.core.errors import UnknownApproval
from cairn.core.records import Approval, ApprovalFilter, Decision, Rule, Wait
from cairn.core.status import RunStatus
from cairn.testing.memory.rows import _dump, _Row, _Signal

if TYPE_CHECKING:
    from cairn.testing.memory.store import MemoryStore


@dataclasses.dataclass(kw_only=True)
class _Asked:
    """An approvals row (request as JSON text) and its audit row once decided."""

    approval_id: int
    run_id: str
    seq: int
    event: str
    workflow: str
    tool: str | None
    request: str
    created_at: dt.datetime
    tenant: str | None = None  # its run's, copied at the save as workflow is
    decision: Decision | None = None


class _AskTables:
    """The approvals' tables, a part of MemoryStore's (under its lock), and the save's
    part: save_approval's row, decided at once by a standing rule."""

    def __init__(self) -> None:
        self.asked: dict[int, _Asked] = {}
        self.rules: dict[int, Rule] = {}
        self.rule_tenants: dict[int, str | None] = {}  # approval_rules.tenant
        self.next_id = 0

    def ask(self, row: _Row, wait: Wait, stamp: dt.datetime) -> bool:
        """save_approval's row for the wait row now saved; True: a rule decided it."""
        assert wait.event is not None and wait.request is not None
        if any(a.run_id == row.run_id and a.seq == row.seq for a in self.asked.values()):
            return False
        self.next_id += 1
        tool = wait.request.get("tool")
        asked = _Asked(
            approval_id=self.next_id,
            run_id=row.run_id,
            seq=row.seq,
            event=wait.event,
            workflow=row.workflow,
            tool=tool,
            request=_dump(dict(wait.request)),
            created_at=stamp,
            tenant=row.tenant,
        )
        self.asked[asked.approval_id] = asked
        rule = min(
            (
                r.rule_id
                for r in self.rules.values()
                if (r.workflow, r.tool) == (row.workflow, tool)
                and self.rule_tenants.get(r.rule_id) in (None, row.tenant)
            ),
            default=None,
        )
        if rule is None:
            return False
        payload = {"decision": "approve", "args": None, "approval_id": asked.approval_id,
                   "rule_id": rule}  # fmt: skip
        asked.decision = Decision(decision="approve", payload=payload, decided_by=f"rule {rule}",
                                  decided_at=stamp, rule_id=rule)  # fmt: skip
        row.signals.setdefault(
            f"approval-{asked.approval_id}",
            _Signal(event=wait.event, payload=_dump(payload), created_at=stamp),
        )
        return True


class MemoryApprovals:
    """Approvals (store/contract.py) over a MemoryStore's rows."""

    def __init__(self, store: MemoryStore) -> None:
        self._store = store
        self._t = store._asks

    def _waiting(self, a: _Asked) -> bool:
        row = self._store._rows.get(a.run_id)
        return row is not None and row.status == RunStatus.WAITING and row.seq == a.seq

    def _approval(self, a: _Asked) -> Approval:
        return Approval(
            approval_id=a.approval_id,
            run_id=a.run_id,
            workflow=a.workflow,
            event=a.event,
            tool=a.tool,
            request=json.loads(a.request),
            created_at=a.created_at,
            waiting=a.decision is None and self._waiting(a),
            decision=a.decision,
        )

    def list_approvals(self, which: ApprovalFilter) -> list[Approval]:
        with self._store._lock:
            self._forget_swept()
            found = sorted(self._t.asked.values(), key=lambda a: a.approval_id)
            if not which.oldest_first:
                found.reverse()
            if which.after is not None:
                after = which.after
                found = [a for a in found if (a.approval_id > after) == which.oldest_first
                         and a.approval_id != after]  # fmt: skip
            found = [
                a
                for a in found
                if a.decision is None
                and self._waiting(a)
                and which.workflow in (None, a.workflow)
                and which.name in (None, a.event)
                and which.tenant in (None, a.tenant)
            ]
            return [self._approval(a) for a in found[: which.limit]]

    def get(self, approval_id: int, tenant: str | None = None) -> Approval | None:
        with self._store._lock:
            self._forget_swept()
            a = self._t.asked.get(approval_id)
            return self._approval(a) if a and tenant in (None, a.tenant) else None

    def decide(
        self,
        approval_id: int,
        decision: str,
        payload: dict[str, Any],
        decided_by: str,
        traceparent: str | None = None,
        tenant: str | None = None,
        token_id: str | None = None,
    ) -> str:
        text = _dump(payload)
        with self._store._lock:
            self._forget_swept()
            a = self._t.asked.get(approval_id)
            if a is None or tenant not in (None, a.tenant):
                raise UnknownApproval(f"no approval {approval_id}")
            if a.decision is not None or not self._waiting(a):
                raise self._approval(a).refusal()
            stamp = self._store._stamp()
            a.decision = Decision(decision=decision, payload=json.loads(text),
                                  decided_by=decided_by, decided_at=stamp,
                                  decided_token=token_id, decided_tenant=tenant)  # fmt: skip
            self._store._rows[a.run_id].signals.setdefault(
                f"approval-{approval_id}",
                _Signal(event=a.event, payload=text, created_at=stamp, traceparent=traceparent),
            )
            return a.run_id

    def add_rule(
        self, workflow: str, tool: str, created_by: str, tenant: str | None = None
    ) -> tuple[Rule, bool]:
        with self._store._lock:
            for r in self._t.rules.values():
                if (r.workflow, r.tool, self._t.rule_tenants[r.rule_id]) == (
                    workflow,
                    tool,
                    tenant,
                ):
                    return r, False
            self._t.next_id += 1
            rule = Rule(rule_id=self._t.next_id, workflow=workflow, tool=tool,
                        created_by=created_by, created_at=self._store._stamp())  # fmt: skip
            self._t.rules[rule.rule_id] = rule
            self._t.rule_tenants[rule.rule_id] = tenant
            return rule, True

    def rules(self, tenant: str | None = None) -> list[Rule]:
        with self._store._lock:
            mine = [r for r in self._t.rules.values() if self._visible(r.rule_id, tenant)]
            return sorted(mine, key=lambda r: r.rule_id)

    def remove_rule(self, rule_id: int, tenant: str | None = None) -> bool:
        with self._store._lock:
            if rule_id not in self._t.rules or not self._visible(rule_id, tenant):
                return False
            del self._t.rules[rule_id], self._t.rule_tenants[rule_id]
            return True

    def _visible(self, rule_id: int, tenant: str | None) -> bool:
        return tenant is None or self._t.rule_tenants.get(rule_id) == tenant

    def _forget_swept(self) -> None:
        # The foreign key's cascade: a swept run's approvals go with it.
        for k in [k for k, a in self._t.asked.items() if a.run_id not in self._store._rows]:
            del self._t.asked[k]
