-- Approvals by tenant (issue 44): the run's tenant copied onto its approval by the save
-- that parks it, as workflow is, so a tenant's inbox reads its own pending rows alone and
-- another tenant's approval is none; standing rules per tenant (NULL: every run's).
ALTER TABLE approvals ADD COLUMN tenant text;
CREATE INDEX approvals_pending_tenant ON approvals (tenant, approval_id)
    WHERE pending AND tenant IS NOT NULL;
ALTER TABLE approval_rules ADD COLUMN tenant text;
ALTER TABLE approval_rules DROP CONSTRAINT approval_rules_workflow_tool_key;
ALTER TABLE approval_rules ADD CONSTRAINT approval_rules_workflow_tool_tenant_key
    UNIQUE NULLS NOT DISTINCT (workflow, tool, tenant);
