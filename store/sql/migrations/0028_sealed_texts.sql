-- Error texts and cancel reasons are payloads: a step's exception, a model's words, a
-- user's reason. As jsonb they go through the one sealing path every payload does
-- (store/payloads.py) and are opened by the connections' loader (CAIRN_PAYLOAD_KEYS);
-- the texts stored so far become JSON strings, in clear, which `cairn db rotate-key`
-- seals. (Both tables are rewritten: at 1M runs, about as long as a VACUUM FULL.) A
-- cancelled parent's children get its fixed reason as a JSON string.
ALTER TABLE checkpoints
    ALTER COLUMN error TYPE jsonb USING to_jsonb(error),
    ALTER COLUMN cancel_reason TYPE jsonb USING to_jsonb(cancel_reason);
ALTER TABLE step_history ALTER COLUMN error TYPE jsonb USING to_jsonb(error);

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
           SET cancel_reason = coalesce(cancel_reason, '"its parent was cancelled"'::jsonb),
               status = CASE WHEN status IN ('pending', 'waiting', 'queued')
                             THEN 'cancelled' ELSE status END,
               error = CASE WHEN status IN ('pending', 'waiting', 'queued')
                            THEN coalesce(cancel_reason, '"its parent was cancelled"'::jsonb) ELSE error END,
               updated_at = now()
         WHERE run_id IN (SELECT run_id FROM runs WHERE parent_id = NEW.run_id)
           AND status IN ('pending', 'running', 'waiting', 'queued');
    END IF;
    RETURN NULL;
END $$;
