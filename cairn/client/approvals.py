"""A Client's approvals: the runs waiting on a person across runs (the inbox), a decision
on one (its run's signal and the audit row naming who decided, at once), and the standing
rules. A tenant's Client reaches its tenant's alone (cairn.client.tenancy)."""

from __future__ import annotations

import builtins
from typing import Any

from cairn.client.base import ClientBase
from cairn.core import tracing
from cairn.core.errors import InvalidInput
from cairn.core.inputs import check_input
from cairn.core.records import DECISIONS, Approval, ApprovalFilter, Rule


class Approvals(ClientBase):
    """Client's approvals."""

    def approvals(
        self,
        *,
        workflow: str | None = None,
        name: str | None = None,
        limit: int = 50,
        after: int | None = None,
        oldest_first: bool = False,
    ) -> builtins.list[Approval]:
        """The runs waiting on a person across runs (StepResult.wait with request=, the
        integrations' tool approvals), newest first (or oldest): each Approval says what it
        asks. Filter by workflow and by the wait's event name; `after`: the last approval
        id of the previous page."""
        if not 1 <= limit <= 1000:
            raise InvalidInput(f"limit={limit}: give 1 to 1000")
        which = ApprovalFilter(workflow, name, limit, after, oldest_first, self.tenant)
        return self.store.approval_store().list_approvals(which)

    def approval(self, approval_id: int) -> Approval | None:
        """One approval, with its decision (who, what, when) once decided; None if none
        (or one of another tenant's runs)."""
        return self.store.approval_store().get(approval_id, self.tenant)

    def decide(
        self,
        approval_id: int,
        decision: str,
        *,
        args: dict[str, Any] | None = None,
        note: str | None = None,
        by: str | None = None,
    ) -> Approval:
        """Decide an approval: "approve", "deny", or "edit" (approve with args, the edited
        arguments). Its run gets the signal it waits on, {"decision", "args", "note",
        "approval_id", "by"}, stored in one transaction with the audit row, which names
        who decided: by, and the tenant and API token this Client acts for
        (Decision.decided_tenant, decided_token; a server's per-request view knows its
        token). A tenant's Client decides its tenant's approvals alone.

        Args:
            approval_id: the approval (Client.approvals lists them).
            decision: "approve", "deny" or "edit".
            args: an edit's arguments for the tool (only with "edit").
            note: why, for the run and the audit.
            by: who decided, as the audit row says it; None: "token <id>" for a view of
                an API token, "tenant <name>" for a tenant's Client, else "admin".

        Returns:
            The approval as decided.

        Raises:
            AlreadyDecided: it was decided already (a request is decided once).
            ApprovalGone: its run no longer waits on it.
            UnknownApproval: none (or one of another tenant's runs).
            InvalidInput: a bad decision, or args with anything but an edit.
        """
        if decision not in DECISIONS:
            raise InvalidInput(f"decision {decision!r}: one of {', '.join(DECISIONS)}")
        if (decision == "edit") != (args is not None):
            raise InvalidInput("an edit gives the edited args (a dict); approve and deny none")
        if args is not None and not isinstance(args, dict):
            raise InvalidInput(f"args: a dict of the tool's arguments, not {type(args).__name__}")
        by = self._by(by)
        payload = {"decision": decision, "args": args, "note": note,
                   "approval_id": approval_id, "by": by}  # fmt: skip
        check_input(payload, self.settings.max_input_bytes, what="decision", envelope=1)
        store = self.store.approval_store()
        with tracing.spanning("cairn.decide", approval_id=approval_id) as trace:
            run_id = store.decide(
                approval_id, decision, payload, by, trace, self.tenant, self.token_id
            )
        self._send(run_id, 0)  # the run waits on it: wake it
        decided = store.get(approval_id, self.tenant)
        assert decided is not None
        return decided

    def add_rule(self, workflow: str, tool: str, *, by: str | None = None) -> Rule:
        """A standing rule: from now on a request of workflow for tool is approved as its
        run saves the wait (the run does not park; the audit row names the rule). The same
        workflow and tool twice is one rule. A tenant's Client makes a rule for its
        tenant's runs only; one with no tenant, for every run. by: who made it (None:
        as decide names who decided)."""
        for what, value in (("workflow", workflow), ("tool", tool)):
            if not isinstance(value, str) or not 0 < len(value) <= 200:
                raise InvalidInput(f"{what} {value!r}: a name of 1-200 characters")
        return self.store.approval_store().add_rule(workflow, tool, self._by(by), self.tenant)[0]

    def rules(self) -> builtins.list[Rule]:
        """Every standing rule (a tenant's Client: its tenant's), oldest first."""
        return self.store.approval_store().rules(self.tenant)

    def remove_rule(self, rule_id: int) -> bool:
        """Delete a standing rule (a tenant's Client: only its own); False if there was
        none."""
        return self.store.approval_store().remove_rule(rule_id, self.tenant)
