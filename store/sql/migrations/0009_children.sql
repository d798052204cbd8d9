-- Child runs (StepResult.spawn): a child knows its parent and the parent's spawn (the seq
-- the spawning step saved), and its depth bounds a workflow that spawns itself forever.
ALTER TABLE runs ADD COLUMN parent_id text;
ALTER TABLE runs ADD COLUMN parent_seq bigint;
ALTER TABLE runs ADD COLUMN depth integer NOT NULL DEFAULT 0;
CREATE INDEX runs_children ON runs (parent_id, parent_seq) WHERE parent_id IS NOT NULL;

-- One row per spawn: how many of its children must end before the parent goes on, and
-- whether that happened (the parent's signal is written once).
CREATE TABLE gathers (
    parent_id  text NOT NULL,
    seq        bigint NOT NULL,
    need       integer NOT NULL,
    total      integer NOT NULL,
    fired      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (parent_id, seq)
);

-- A run that stops tells its parent's spawn (in the transaction that stops it, whatever
-- stops it: a save, a failure, a cancel): once enough of the spawn's children stopped,
-- the parent gets the signal 'cairn.children:<seq>' it waits for, which wakes it like any
-- signal. The spawn's
-- row is locked first, so two children stopping at once both count each other (each
-- statement of a plpgsql function reads a fresh snapshot after the lock).
-- A cancelled run cancels its children (which cancel theirs: the trigger fires again).
CREATE FUNCTION cairn_run_stopped() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p text;
    s bigint;
    g record;
    n bigint;
BEGIN
    SELECT parent_id, parent_seq INTO p, s FROM runs WHERE run_id = NEW.run_id;
    IF p IS NOT NULL THEN
        SELECT need, fired INTO g FROM gathers WHERE parent_id = p AND seq = s FOR UPDATE;
        IF FOUND AND NOT g.fired THEN
            SELECT count(*) INTO n FROM runs r JOIN checkpoints c USING (run_id)
             WHERE r.parent_id = p AND r.parent_seq = s
               AND c.status NOT IN ('pending', 'running', 'waiting');
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
               status = CASE WHEN status IN ('pending', 'waiting') THEN 'cancelled' ELSE status END,
               error = CASE WHEN status IN ('pending', 'waiting')
                            THEN coalesce(cancel_reason, 'its parent was cancelled') ELSE error END,
               updated_at = now()
         WHERE run_id IN (SELECT run_id FROM runs WHERE parent_id = NEW.run_id)
           AND status IN ('pending', 'running', 'waiting');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER checkpoints_run_stopped AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IN ('pending', 'running', 'waiting')
                       AND NEW.status NOT IN ('pending', 'running', 'waiting'))
    EXECUTE FUNCTION cairn_run_stopped();
