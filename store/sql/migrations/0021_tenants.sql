-- Tenants: the customer a run is for (Client(tenant=), or the API token that enqueued
-- it); NULL: no tenant. A child run and a fork keep their origin's. A tenant's token sees
-- its tenant's runs only, so its lists walk this index, newest first.
ALTER TABLE runs ADD COLUMN tenant text;
CREATE INDEX runs_tenant_newest ON runs (tenant, created_at DESC, run_id DESC)
    WHERE tenant IS NOT NULL;

-- API tokens (`cairn tokens create`): the secret is shown once and kept only as its
-- SHA-256; a token acts for its tenant, or for all as an admin. A revoked token stays
-- listed with when it was revoked.
CREATE TABLE api_tokens (
    id          text PRIMARY KEY,
    name        text NOT NULL DEFAULT '',
    tenant      text,
    admin       boolean NOT NULL DEFAULT false,
    hash        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CONSTRAINT api_tokens_scope_check CHECK (admin OR tenant IS NOT NULL)
);
