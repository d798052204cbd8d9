-- Step history and the journal grow by a row per step and per call, for ever but for the
-- sweep; deleting a month of them row by row is most of what retention costs (WAL, vacuum,
-- index bloat). Partitioned by month of the run's creation (run_created, a copy of
-- runs.created_at written by the statement that inserts the row), every row of one run
-- lands in one partition however long the run lives, so the primary keys with run_created
-- added stay unique per run, and the journal's ON CONFLICT fence holds across a month's
-- end. A month whose runs are all swept is dropped whole (cairn_drop_partitions).
--
-- The tables are rebuilt: LIKE the old ones and INSERT ... SELECT *, so whatever columns
-- earlier migrations gave them come along. It copies every row, under the migration's
-- lock: on a large database run it in a maintenance window (docs/explanation/scale.md).

-- Monthly partitions of step_history and journal (UTC months) from since's month to
-- `ahead` months past this one; those that exist are left. A month whose rows already
-- sit in the default partition (nobody made it in time) is left to the default.
CREATE FUNCTION cairn_partitions(since timestamptz, ahead integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    lo timestamptz;
    name text;
    made integer := 0;
BEGIN
    FOREACH t IN ARRAY ARRAY['step_history', 'journal'] LOOP
        lo := date_trunc('month', least(since, now()), 'UTC');
        WHILE lo <= date_trunc('month', now(), 'UTC') + make_interval(months => ahead) LOOP
            name := t || '_' || to_char(lo AT TIME ZONE 'UTC', 'YYYY_MM');
            IF to_regclass(name) IS NULL THEN
                BEGIN
                    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                                   name, t, lo, lo + interval '1 month');
                    made := made + 1;
                EXCEPTION WHEN check_violation THEN
                    NULL;
                END;
            END IF;
            lo := lo + interval '1 month';
        END LOOP;
    END LOOP;
    RETURN made;
END $$;

-- Drop the months behind us none of whose runs is left (all swept): their rows belong to
-- no run. A month with one run still live (a long wait) stays until the sweep takes it.
-- A partition whose lock is not had within a second (a long reader) waits for next time.
CREATE FUNCTION cairn_drop_partitions() RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    p record;
BEGIN
    PERFORM set_config('lock_timeout', '1s', true);
    FOR p IN
        SELECT c.oid::regclass::text AS name, b[1]::timestamptz AS lo, b[2]::timestamptz AS hi
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
               regexp_match(pg_get_expr(c.relpartbound, c.oid),
                            'FROM \(''([^'']+)''\) TO \(''([^'']+)''\)') AS b
         WHERE i.inhparent IN ('step_history'::regclass, 'journal'::regclass)
           AND b IS NOT NULL  -- not the default partitions
         ORDER BY 2, 1
    LOOP
        CONTINUE WHEN p.hi > now()
            OR EXISTS (SELECT 1 FROM runs WHERE created_at >= p.lo AND created_at < p.hi);
        BEGIN
            EXECUTE format('DROP TABLE %s', p.name);
            RETURN NEXT p.name;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END LOOP;
END $$;

ALTER TABLE step_history RENAME TO step_history_old;
ALTER INDEX step_history_pkey RENAME TO step_history_old_pkey;
ALTER SEQUENCE step_history_id_seq RENAME TO step_history_old_id_seq;
CREATE TABLE step_history (
    LIKE step_history_old INCLUDING ALL EXCLUDING INDEXES,
    run_created  timestamptz NOT NULL,
    PRIMARY KEY (run_id, id, run_created)
) PARTITION BY RANGE (run_created);
CREATE TABLE step_history_default PARTITION OF step_history DEFAULT;

ALTER TABLE journal RENAME TO journal_old;
ALTER INDEX journal_pkey RENAME TO journal_old_pkey;
CREATE TABLE journal (
    LIKE journal_old INCLUDING ALL EXCLUDING INDEXES,
    run_created  timestamptz NOT NULL,
    PRIMARY KEY (run_id, cursor, visit, pos, run_created)
) PARTITION BY RANGE (run_created);
CREATE TABLE journal_default PARTITION OF journal DEFAULT;

-- The months the rows are from, and three ahead (the hourly sweep keeps three ahead).
SELECT cairn_partitions(coalesce((SELECT min(created_at) FROM runs), now()), 3);

-- A row whose run is gone (swept between its two statements) keeps its own time.
INSERT INTO step_history OVERRIDING SYSTEM VALUE
SELECT h.*, coalesce(r.created_at, h.started_at)
  FROM step_history_old h LEFT JOIN runs r USING (run_id);
SELECT setval(pg_get_serial_sequence('step_history', 'id'),
              coalesce((SELECT max(id) FROM step_history_old), 0) + 1, false);
INSERT INTO journal
SELECT j.*, coalesce(r.created_at, j.created_at)
  FROM journal_old j LEFT JOIN runs r USING (run_id);

DROP TABLE step_history_old;
DROP TABLE journal_old;
