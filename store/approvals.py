"""Approvals in Postgres: the inbox's list, a decision (the approval marked, its audit row
and the run's signal in one statement), and the standing rules. The request's row itself
is written by the save that parks the run (queries.sql: save_approval)."""

from __future__ import annotations

from typing import Any

from cairn.core.errors import UnknownApproval
from cairn.core.records import Approval, ApprovalFilter, Rule
from cairn.store.db import Database
from cairn.store.payloads import Payload


class ApprovalStore:
    """Approvals (store/contract.py) on one Database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def list_approvals(self, which: ApprovalFilter) -> list[Approval]:
        """A page of the approvals still waiting, newest (or oldest) first."""
        rows = self.db.all(
            "approvals_oldest" if which.oldest_first else "approvals_newest",
            {
                "workflow": which.workflow,
                "event": which.name,
                "after": which.after,
                "limit": which.limit,
                "tenant": which.tenant,
            },
        )
        return [Approval.from_row(r) for r in rows]

    def get(self, approval_id: int, tenant: str | None = None) -> Approval | None:
        """The approval (tenant: only of that tenant's runs), or None."""
        row = self.db.one("approval", {"approval_id": approval_id, "tenant": tenant})
        return Approval.from_row(row) if row else None

    def decide(
        self,
        approval_id: int,
        decision: str,
        payload: dict[str, Any],
        decided_by: str,
        traceparent: str | None = None,
        tenant: str | None = None,
    ) -> str:
        """Mark the approval decided, write its audit row and store the signal its run
        waits on, in one transaction; the run's id. Raises UnknownApproval (tenant: one of
        another tenant's runs too), AlreadyDecided (a second decision, racing or not), or
        ApprovalGone (its run no longer waits)."""
        row = self.db.one(
            "decide",
            {
                "approval_id": approval_id,
                "decision": decision,
                "payload": Payload(payload),
                "decided_by": decided_by,
                "traceparent": traceparent,
                "tenant": tenant,
            },
        )
        if row is not None:
            return str(row["run_id"])
        now = self.get(approval_id, tenant)
        if now is None:
            raise UnknownApproval(f"no approval {approval_id}")
        raise now.refusal()

    def add_rule(
        self, workflow: str, tool: str, created_by: str, tenant: str | None = None
    ) -> tuple[Rule, bool]:
        """A standing rule (the same workflow, tool and tenant twice is one; tenant: for
        that tenant's runs only); whether it is new."""
        row = self.db.one(
            "add_rule",
            {"workflow": workflow, "tool": tool, "created_by": created_by, "tenant": tenant},
        )
        assert row is not None
        created = bool(row.pop("created"))
        return Rule(**row), created

    def rules(self, tenant: str | None = None) -> list[Rule]:
        return [Rule(**r) for r in self.db.all("rules", {"tenant": tenant})]

    def remove_rule(self, rule_id: int, tenant: str | None = None) -> bool:
        return self.db.one("remove_rule", {"rule_id": rule_id, "tenant": tenant}) is not None
