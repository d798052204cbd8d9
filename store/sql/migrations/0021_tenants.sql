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

-- A tenant's concurrency limit (CAIRN_TENANT_CONCURRENCY) is a concurrency key like any
-- other, `cairn.tenant:<tenant>`, whose slots span the tenant's workflows: its key row,
-- slots and queue are under the workflow name 'cairn.tenant' rather than the run's own.
-- The triggers that give back and re-take a run's slot find its key there.
CREATE OR REPLACE FUNCTION cairn_run_stopped() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p text;
    s bigint;
    w text;
    k text;
    g record;
    n bigint;
BEGIN
    -- A tenant's key (cairn.tenant:NAME) spans the tenant's workflows (migration 0021).
    SELECT parent_id, parent_seq,
           CASE WHEN concurrency_key LIKE 'cairn.tenant:%' THEN 'cairn.tenant' ELSE workflow END,
           concurrency_key INTO p, s, w, k
      FROM runs WHERE run_id = NEW.run_id;
    IF k IS NOT NULL THEN
        PERFORM 1 FROM concurrency_keys WHERE workflow = w AND key = k FOR UPDATE;
        DELETE FROM queued WHERE run_id = NEW.run_id;
        DELETE FROM slots WHERE run_id = NEW.run_id;
        IF FOUND THEN
            PERFORM cairn_admit(w, k);
        END IF;
    END IF;
    IF p IS NOT NULL THEN
        SELECT need, fired INTO g FROM gathers WHERE parent_id = p AND seq = s FOR UPDATE;
        IF FOUND AND NOT g.fired THEN
            SELECT count(*) INTO n FROM runs r JOIN checkpoints c USING (run_id)
             WHERE r.parent_id = p AND r.parent_seq = s
               AND c.status NOT IN ('pending', 'running', 'waiting', 'queued');
            IF n >= g.need THEN
                UPDATE gathers SET fired = true WHERE parent_id = p AND seq = s;
                INSERT INTO signals (run_id, signal_id, event, payload)
                VALUES (p, 'cairn.children:' || s, 'cairn.children:' || s,
                        jsonb_build_object('seq', s))
                ON CONFLICT (run_id, signal_id) DO NOTHING;
            END IF;
        END IF;
    END IF;
    IF NEW.status = 'cancelled' THEN
        UPDATE checkpoints
           SET cancel_reason = coalesce(cancel_reason, 'its parent was cancelled'),
               status = CASE WHEN status IN ('pending', 'waiting', 'queued')
                             THEN 'cancelled' ELSE status END,
               error = CASE WHEN status IN ('pending', 'waiting', 'queued')
                            THEN coalesce(cancel_reason, 'its parent was cancelled') ELSE error END,
               updated_at = now()
         WHERE run_id IN (SELECT run_id FROM runs WHERE parent_id = NEW.run_id)
           AND status IN ('pending', 'running', 'waiting', 'queued');
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION cairn_run_rearmed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n bigint;
BEGIN
    SELECT CASE WHEN concurrency_key LIKE 'cairn.tenant:%' THEN 'cairn.tenant' ELSE workflow END AS workflow,
           concurrency_key AS key, concurrency_limit AS lim, priority INTO r
      FROM runs WHERE run_id = NEW.run_id;
    IF r.key IS NULL THEN
        RETURN NULL;
    END IF;
    -- The key's limit stands; an idle key forgotten since has the run's own again.
    INSERT INTO concurrency_keys (workflow, key, lim) VALUES (r.workflow, r.key, r.lim)
    ON CONFLICT (workflow, key) DO UPDATE SET lim = concurrency_keys.lim;  -- and lock it
    SELECT count(*) INTO n FROM slots WHERE workflow = r.workflow AND key = r.key;
    IF n < (SELECT lim FROM concurrency_keys WHERE workflow = r.workflow AND key = r.key) THEN
        INSERT INTO slots (run_id, workflow, key, sent) VALUES (NEW.run_id, r.workflow, r.key, true);
    ELSE
        INSERT INTO queued (run_id, workflow, key, priority)
        VALUES (NEW.run_id, r.workflow, r.key, r.priority);
        UPDATE checkpoints SET status = 'queued' WHERE run_id = NEW.run_id;
    END IF;
    RETURN NULL;
END $$;
