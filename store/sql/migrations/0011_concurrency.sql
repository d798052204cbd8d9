-- Concurrency keys and priorities (Client.enqueue(concurrency_key=, concurrency_limit=,
-- priority=)): at most `lim` runs of a workflow with one key hold a slot at a time, from
-- their start until they stop (a waiting run keeps its slot); the others wait as
-- 'queued', in Postgres, holding no worker and no broker message.
ALTER TABLE runs ADD COLUMN concurrency_key text;
ALTER TABLE runs ADD COLUMN concurrency_limit integer;
ALTER TABLE runs ADD COLUMN priority integer NOT NULL DEFAULT 0;

ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_status_check;
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_status_check CHECK (status IN (
        'pending', 'running', 'waiting', 'done', 'failed', 'cancelled', 'budget_exceeded',
        'incompatible', 'unknown', 'queued'));

-- One row per key with runs holding or waiting for its slots: its limit (the last
-- enqueue's). Locked by whoever grants or frees its slots, so no slot is granted twice.
CREATE TABLE concurrency_keys (
    workflow  text NOT NULL,
    key       text NOT NULL,
    lim       integer NOT NULL CONSTRAINT concurrency_keys_lim_check CHECK (lim > 0),
    PRIMARY KEY (workflow, key)
);

-- The runs holding a key's slots. A row goes in the transaction that admits the run and
-- out in the one that stops it (the trigger below): never leaked, whatever stops it.
-- sent: its message is on the broker (an admitted run not yet sent is sent by whoever
-- freed the slot, after its commit; the reaper sends a pending run whose message is lost).
CREATE TABLE slots (
    run_id    text PRIMARY KEY,
    workflow  text NOT NULL,
    key       text NOT NULL,
    sent      boolean NOT NULL DEFAULT false
);
CREATE INDEX slots_key ON slots (workflow, key);

-- The runs waiting for a slot, best first: priority, then enqueue order.
CREATE TABLE queued (
    run_id    text PRIMARY KEY,
    workflow  text NOT NULL,
    key       text NOT NULL,
    priority  integer NOT NULL,
    n         bigserial NOT NULL
);
CREATE INDEX queued_next ON queued (workflow, key, priority DESC, n);

-- Fill the key's free slots from its queue; returns the runs admitted (now 'pending').
-- A queued run another transaction has locked (being cancelled) is skipped, not waited
-- for: the canceller may be waiting for this key's lock, which would deadlock.
CREATE FUNCTION cairn_admit(w text, k text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    l integer;
    n bigint;
    r text;
BEGIN
    SELECT lim INTO l FROM concurrency_keys WHERE workflow = w AND key = k FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM slots WHERE workflow = w AND key = k;
    WHILE n < l LOOP
        SELECT q.run_id INTO r FROM queued q JOIN checkpoints c USING (run_id)
         WHERE q.workflow = w AND q.key = k
         ORDER BY q.priority DESC, q.n LIMIT 1
           FOR UPDATE OF c SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        DELETE FROM queued WHERE run_id = r;
        INSERT INTO slots (run_id, workflow, key) VALUES (r, w, k);
        UPDATE checkpoints SET status = 'pending', updated_at = now()
         WHERE run_id = r AND status = 'queued';
        n := n + 1;
        RETURN NEXT r;
    END LOOP;
    IF n = 0 AND NOT EXISTS (SELECT 1 FROM queued WHERE workflow = w AND key = k) THEN
        DELETE FROM concurrency_keys WHERE workflow = w AND key = k;  -- idle: forget it
    END IF;
END $$;

-- A run that stops tells its parent's spawn (in the transaction that stops it, whatever
-- stops it: a save, a failure, a cancel): once enough of the spawn's children stopped,
-- the parent gets the signal 'cairn.children:<seq>' it waits for, which wakes it like any
-- signal. The spawn's row is locked first, so two children stopping at once both count
-- each other (each statement of a plpgsql function reads a fresh snapshot after the lock).
-- A cancelled run cancels its children (which cancel theirs: the trigger fires again).
-- A run with a concurrency key gives back its slot (or its place in the queue), and the
-- key's next run is admitted in the same transaction.
CREATE OR REPLACE FUNCTION cairn_run_stopped() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    p text;
    s bigint;
    w text;
    k text;
    g record;
    n bigint;
BEGIN
    SELECT parent_id, parent_seq, workflow, concurrency_key INTO p, s, w, k
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

DROP TRIGGER checkpoints_run_stopped ON checkpoints;
CREATE TRIGGER checkpoints_run_stopped AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IN ('pending', 'running', 'waiting', 'queued')
                       AND NEW.status NOT IN ('pending', 'running', 'waiting', 'queued'))
    EXECUTE FUNCTION cairn_run_stopped();

-- A stopped run with a concurrency key re-armed (enqueued again after a failure, or
-- resolved): it takes a free slot, or goes back to the queue. Whoever re-armed it sends
-- its message; a queued run's delivery does nothing.
CREATE FUNCTION cairn_run_rearmed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
    n bigint;
BEGIN
    SELECT workflow, concurrency_key AS key, concurrency_limit AS lim, priority INTO r
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

CREATE TRIGGER checkpoints_run_rearmed AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IN ('failed', 'incompatible', 'unknown')
                       AND NEW.status = 'pending')
    EXECUTE FUNCTION cairn_run_rearmed();
