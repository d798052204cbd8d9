-- Runs per status without scanning checkpoints (a GROUP BY took ~160 ms at 1M runs).
--
-- Every status change appends delta rows in the transaction that makes it, and the reaper
-- folds them into one total per status; count_by_status sums totals plus deltas in one
-- snapshot, so it is exact. Insert-only on purpose: counter rows updated by each change
-- (tried, reverted) made every run's transition wait on that status row's lock until the
-- other transaction committed.
--
-- Triggers, not the store's statements, so no statement that changes a status (cancel,
-- retention, an operator's UPDATE) can forget to count.

-- Writers wait while the totals are backfilled, so none is counted twice or missed.
LOCK TABLE checkpoints IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE run_counts (
    status  text PRIMARY KEY,
    n       bigint NOT NULL
);

-- No index: appended by every change, read whole (the reaper keeps it short), folded by
-- ctid. An index would be one more write per change for nothing.
CREATE TABLE run_count_deltas (
    status  text NOT NULL,
    n       bigint NOT NULL
);

INSERT INTO run_counts (status, n)
SELECT status, count(*) FROM checkpoints GROUP BY status;

CREATE FUNCTION cairn_count_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO run_count_deltas (status, n) VALUES (NEW.status, 1);
    ELSE
        INSERT INTO run_count_deltas (status, n) VALUES (OLD.status, -1), (NEW.status, 1);
    END IF;
    RETURN NULL;
END $$;

-- Row triggers for inserts and updates: the per-step save is an upsert, and a statement
-- trigger would run on every step; these run only when a row is new or its status moves.
CREATE TRIGGER checkpoints_count_insert AFTER INSERT ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION cairn_count_change();
CREATE TRIGGER checkpoints_count_update AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION cairn_count_change();

-- A statement trigger for deletes: retention's batch of 1,000 (cascaded from runs, which
-- Postgres gathers into one transition table) appends one row per status, not 1,000.
CREATE FUNCTION cairn_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_count_deltas (status, n) SELECT status, -count(*) FROM gone GROUP BY status;
    RETURN NULL;
END $$;

CREATE TRIGGER checkpoints_count_delete AFTER DELETE ON checkpoints
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION cairn_count_delete();

-- TRUNCATE fires no row triggers: it empties the counts with the table.
CREATE FUNCTION cairn_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_count_deltas;
    DELETE FROM run_counts;
    RETURN NULL;
END $$;

CREATE TRIGGER checkpoints_count_truncate AFTER TRUNCATE ON checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION cairn_count_truncate();
