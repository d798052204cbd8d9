-- cairn's schema as it stands: what migrations/0001..0028 build, in one file to read.
-- Databases are made and upgraded by the migrations (`cairn db upgrade`);
-- tests/integration/test_schema.py builds one database from them and one from this file and asserts
-- their schema-only dumps are equal, so this file cannot drift. A new migration edits
-- this file too.

-- Runs are immutable once enqueued; checkpoints change after every step. Keeping them
-- apart keeps the per-step row small (the input is never rewritten).
CREATE TABLE runs (
    run_id        text PRIMARY KEY,
    workflow      text NOT NULL,
    input         jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- the per-run cost cap (NULL: the workers' CAIRN_MAX_COST_USD, 0 there means none)
    max_cost_usd  double precision,
    -- a child run (StepResult.spawn): its parent, the parent's spawn (the seq the spawning
    -- step saved), and how deep it is (bounded: a workflow that spawns itself forever)
    parent_id     text,
    parent_seq    bigint,
    depth         integer NOT NULL DEFAULT 0,
    -- at most the key's limit of this workflow's runs with one concurrency key run at a
    -- time (the slots and queued tables); priority orders the key's queue and the broker's
    concurrency_key    text,
    concurrency_limit  integer,
    priority      integer NOT NULL DEFAULT 0,
    -- the W3C traceparent of the span that enqueued it: every delivery continues its trace
    traceparent   text,
    -- a fork (Client.fork): the run and the seq it was forked from
    forked_from   text,
    forked_at     bigint,
    -- the customer it is for (Client(tenant=), or the token that enqueued it; NULL: none);
    -- a child and a fork keep their origin's (migration 0021)
    tenant        text,
    -- the budget scopes it spends against (migration 0023): 'run:<id>' of the run that
    -- enqueued the tree with budget_usd, inherited by its children
    budgets       text[]
);

-- Listing runs newest first, a page at a time (keyset on created_at, run_id).
CREATE INDEX runs_newest ON runs (created_at DESC, run_id DESC);
-- A run's forks (Client.fork).
CREATE INDEX runs_forks ON runs (forked_from) WHERE forked_from IS NOT NULL;
-- A tenant's runs newest first (a tenant token's lists).
CREATE INDEX runs_tenant_newest ON runs (tenant, created_at DESC, run_id DESC)
    WHERE tenant IS NOT NULL;
-- A budget's runs (raise_budget); runs without one are not indexed (migration 0023).
CREATE INDEX runs_budgets ON runs USING gin (budgets) WHERE budgets IS NOT NULL;

-- fillfactor leaves room on each page so the per-step update can be HOT (no index
-- column changes per step: status changes only at start and end).
CREATE TABLE checkpoints (
    run_id      text PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE,
    seq         bigint NOT NULL,
    cursor      text NOT NULL,
    state       jsonb NOT NULL,
    visits      jsonb NOT NULL DEFAULT '{}',
    win_start   integer NOT NULL DEFAULT 0,
    win_end     integer NOT NULL DEFAULT 0,
    cost_usd    double precision NOT NULL DEFAULT 0,
    version     integer NOT NULL,
    -- cairn.RunStatus, value for value (tests/integration/test_schema.py)
    status      text NOT NULL CONSTRAINT checkpoints_status_check CHECK (status IN (
        'pending', 'running', 'waiting', 'done', 'failed', 'cancelled', 'budget_exceeded',
        'incompatible', 'unknown', 'queued')),
    -- why it stopped, or its last attempt's error (a JSON string, sealed: migration 0028)
    error       jsonb,
    epoch       bigint NOT NULL DEFAULT 0,  -- fencing epoch of the lease that wrote it
    resumes     integer NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- failed attempts of the step at cursor (reset by a save): survive crashes
    attempts    integer NOT NULL DEFAULT 0,
    -- claims since the last save: a run redelivered over and over without progress is
    -- poison (a step that kills its process)
    deliveries  integer NOT NULL DEFAULT 0,
    -- a retry is scheduled for then: the reaper leaves the run alone until it is due
    retry_at    timestamptz,
    -- cancel was asked for: the run stops at its next step boundary, before any effect
    -- (the reason given, a JSON string, sealed: migration 0028)
    cancel_reason  jsonb,
    -- status waiting: the event it waits for, until when, and where it goes on timeout
    wait_event  text,
    wait_until  timestamptz,
    wait_timeout_cursor  text,
    -- the workflow version whose code wrote the state (NULL: not written by a step yet)
    flow_version  integer,
    -- a copy of the run's created_at, set by create_run's one statement and never
    -- changed, so lists filtered by status walk one index (checkpoints_status_newest)
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- a debounced run: the enqueues of this workflow and key collapse into it while it
    -- waits at seq 0 for its quiet period (migration 0015)
    debounce_workflow  text,
    debounce_key       text,
    -- the code version (CAIRN_CODE_VERSION) of the worker that started the run: its first
    -- claim sets it (NULL: not claimed yet, or claimed before migration 0017)
    started_version    text,
    -- its workflow pins its version (versions="pin"): it goes on only on workers of
    -- started_version; set by its first claim, from the claiming worker's workflows
    pinned      boolean NOT NULL DEFAULT false
) WITH (fillfactor = 70);

CREATE INDEX checkpoints_active ON checkpoints (status) WHERE status IN ('pending', 'running');
CREATE INDEX checkpoints_waiting ON checkpoints (wait_until) WHERE status = 'waiting';
CREATE INDEX checkpoints_status_newest ON checkpoints (status, created_at DESC, run_id DESC);
-- Pinned runs under way, per version (migration 0020): unpinned runs never enter it.
CREATE INDEX checkpoints_pinned ON checkpoints (started_version)
    WHERE pinned AND status IN ('pending', 'running', 'waiting');
-- One debounced run per (workflow, key) until it starts: two enqueuers racing meet here.
CREATE UNIQUE INDEX checkpoints_debounce ON checkpoints (debounce_workflow, debounce_key)
    WHERE status = 'waiting' AND seq = 0 AND debounce_key IS NOT NULL;

-- The model window, append-only: a save writes only the messages that are new.
-- The live window is the rows idx in [win_start, win_end) of the checkpoint.
CREATE TABLE window_messages (
    run_id   text NOT NULL,
    idx      integer NOT NULL,
    message  jsonb NOT NULL,
    PRIMARY KEY (run_id, idx)
);

-- Done-ledger for downstreams without idempotency (ctx.once), with the lease epoch under
-- which the effect ran (0: before this was recorded). An at-most-once effect's row is
-- first an intent (done false), committed before the effect runs.
CREATE TABLE effects (
    key         text PRIMARY KEY,
    run_id      text NOT NULL,
    result      jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    epoch       bigint NOT NULL DEFAULT 0,
    done        boolean NOT NULL DEFAULT true
);
CREATE INDEX effects_open ON effects (run_id) WHERE NOT done;

-- The shipped invoice workflow's ledger: written through ctx.db, in the checkpoint's
-- transaction.
CREATE TABLE invoice_ledger (
    idempotency_key  text PRIMARY KEY,
    run_id           text NOT NULL,
    customer         text NOT NULL,
    amount_cents     bigint NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Signals sent to runs, kept until the run is swept: one sent before the run waits is
-- not lost, and the same signal id twice is one signal. consumed_seq: the save of the
-- step that received it.
CREATE TABLE signals (
    run_id        text NOT NULL,
    signal_id     text NOT NULL,
    event         text NOT NULL,
    payload       jsonb,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    consumed_seq  bigint,
    -- the span that sent it (cairn.otel): the step it wakes links to that trace
    traceparent   text,
    PRIMARY KEY (run_id, signal_id)
);
CREATE INDEX signals_pending ON signals (run_id, event, created_at) WHERE consumed_seq IS NULL;

-- One row per step attempt that ended: saved, retried, failed, cancelled. Appended in the
-- statement that saves the step, so the per-step write stays one round trip. Partitioned
-- by the month the run was created (run_created, a copy of its created_at), so all of a
-- run's rows are in one partition and retention drops a month whole (migration 0018).
CREATE TABLE step_history (
    run_id      text NOT NULL,
    id          bigint GENERATED ALWAYS AS IDENTITY,
    seq         bigint NOT NULL,          -- the seq the step started from
    cursor      text NOT NULL,
    visit       integer NOT NULL,
    outcome     text NOT NULL,
    started_at  timestamptz NOT NULL,
    ended_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    worker      text NOT NULL,
    epoch       bigint NOT NULL,
    cost_usd    double precision NOT NULL DEFAULT 0,
    effect_key  text,
    error       jsonb,                    -- a JSON string, sealed (migration 0028)
    -- a saved step's checkpoint, what a fork or a rewind goes on from (migration 0013):
    -- the next cursor, visits, window range, cost so far, workflow version, and the state
    -- when the step changed it (NULL: as the row before)
    next_cursor   text,
    visits        jsonb,
    win_start     integer,
    win_end       integer,
    total_cost    double precision,
    flow_version  integer,
    state         jsonb,
    -- the code version (CAIRN_CODE_VERSION) of the worker that wrote the row (migration 0017)
    code_version  text,
    run_created   timestamptz NOT NULL,
    -- one index, the one reads use: the per-step write pays for a single index entry
    PRIMARY KEY (run_id, id, run_created)
) PARTITION BY RANGE (run_created);
-- Rows of a month nobody made a partition for: dropped by no one, swept row by row.
CREATE TABLE step_history_default PARTITION OF step_history DEFAULT;

-- Runs per status without scanning checkpoints (a GROUP BY took ~160 ms at 1M runs).
-- Every status change appends delta rows in the transaction that makes it, and the reaper
-- folds them into one total per status; count_by_status sums totals plus deltas in one
-- snapshot, so it is exact. Insert-only on purpose: counter rows updated by each change
-- made every run's transition wait on that status row's lock. Triggers, not the store's
-- statements, so no statement that changes a status can forget to count.
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
-- The wake pass counts its batch itself, one row per status, and says so with the
-- transaction's setting cairn.counted (queries.sql: wake; migration 0016).
CREATE TRIGGER checkpoints_count_insert AFTER INSERT ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION cairn_count_change();
CREATE TRIGGER checkpoints_count_update AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       AND current_setting('cairn.counted', true) IS DISTINCT FROM 'on')
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

-- Journaled calls inside a step (ctx.call, ctx.model): each call's outcome in the order the
-- step made them, so a replay of the step's visit returns what was recorded instead of
-- calling again. Kept with the run for its history, and swept with it (no foreign key,
-- like the other per-run tables: the sweep deletes them in one statement).
CREATE TABLE journal (
    run_id      text NOT NULL,
    cursor      text NOT NULL,
    visit       integer NOT NULL,
    pos         integer NOT NULL,          -- the call's place in the visit, from 0
    name        text NOT NULL,
    seq         bigint NOT NULL,           -- the seq the step started from
    epoch       bigint NOT NULL,           -- the lease epoch that recorded it
    result      jsonb,                     -- what the call returned, or
    error       jsonb,                     -- the permanent error it raised
    cost_usd    double precision NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    run_created timestamptz NOT NULL,          -- its run's created_at: its partition
    PRIMARY KEY (run_id, cursor, visit, pos, run_created)
) PARTITION BY RANGE (run_created);
CREATE TABLE journal_default PARTITION OF journal DEFAULT;

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

SELECT cairn_partitions(now(), 3);

-- Client.wait: whoever waits for a run hears it stop or park instead of polling. One
-- channel per run ('cairn_' and the first 16 hex digits of md5(run_id): a channel name is
-- at most 63 bytes, a run id up to 200), notified by the transaction that moves its status
-- to a stopped one or to waiting: about once per run, so commits rarely queue on it.
CREATE FUNCTION cairn_notify_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cairn_' || left(md5(NEW.run_id), 16), NEW.status);
    RETURN NULL;
END $$;

CREATE TRIGGER checkpoints_notify_status AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       AND NEW.status NOT IN ('pending', 'running'))
    EXECUTE FUNCTION cairn_notify_status();

-- LangGraph's checkpoints on cairn's store (cairn.langgraph.CairnSaver): one row a
-- checkpoint, its channels' values as versioned blobs, and the pending writes of its tasks.
-- Values are LangGraph's serializer's bytes; metadata is JSON, for list()'s filters.
CREATE TABLE graph_checkpoints (
    thread_id       text NOT NULL,
    ns              text NOT NULL DEFAULT '',
    checkpoint_id   text NOT NULL,             -- LangGraph's ids sort in time order
    parent_id       text,
    type            text NOT NULL,
    checkpoint      bytea NOT NULL,            -- with its small values inline, not its blobs
    versions        jsonb NOT NULL DEFAULT '{}', -- channel -> version of each value in a blob
    metadata        jsonb NOT NULL DEFAULT '{}',
    run_id          text,                      -- the cairn run that wrote it, if any
    epoch           bigint,                    -- and that run's lease epoch then
    PRIMARY KEY (thread_id, ns, checkpoint_id)
);
CREATE INDEX graph_checkpoints_runs ON graph_checkpoints ((metadata ->> 'run_id'));

-- A channel's value at a version. A list that extends the value of an earlier version is
-- stored as the tail it appends (base_version: that version; length: the whole list's),
-- so a message history costs each step only its new messages.
CREATE TABLE graph_blobs (
    thread_id       text NOT NULL,
    ns              text NOT NULL DEFAULT '',
    channel         text NOT NULL,
    version         text NOT NULL,
    type            text NOT NULL,
    blob            bytea,
    base_version    text,
    length          integer,
    PRIMARY KEY (thread_id, ns, channel, version)
);

CREATE TABLE graph_writes (
    thread_id       text NOT NULL,
    ns              text NOT NULL DEFAULT '',
    checkpoint_id   text NOT NULL,
    task_id         text NOT NULL,
    idx             integer NOT NULL,
    channel         text NOT NULL,
    type            text NOT NULL,
    blob            bytea NOT NULL,
    task_path       text NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, ns, checkpoint_id, task_id, idx)
);

-- Child runs: the parent's spawns, and what tells them a child stopped.
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

-- Concurrency keys (Client.enqueue(concurrency_key=, concurrency_limit=, priority=)): at
-- most `lim` runs of a workflow with one key hold a slot at a time, from their start until
-- they stop (a waiting run keeps its slot); the others wait as 'queued', in Postgres,
-- holding no worker and no broker message.
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
CREATE FUNCTION cairn_run_stopped() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER checkpoints_run_rearmed AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IN ('failed', 'incompatible', 'unknown', 'budget_exceeded')
                       AND NEW.status = 'pending')
    EXECUTE FUNCTION cairn_run_rearmed();

-- Schedules (Client.add_schedule, `cairn schedules`): each tick starts one run whose id
-- is the schedule's name and the tick's time, so a tick fired twice is still one run.
CREATE TABLE schedules (
    name           text PRIMARY KEY,
    workflow       text NOT NULL,
    input          jsonb NOT NULL DEFAULT '{}',
    cron           text,                      -- a cron expression, in UTC; or
    every_seconds  integer CONSTRAINT schedules_every_check CHECK (every_seconds > 0),
    catch_up       text NOT NULL DEFAULT 'latest'
                   CONSTRAINT schedules_catch_up_check CHECK (catch_up IN ('latest', 'all', 'skip')),
    paused         boolean NOT NULL DEFAULT false,
    -- the next tick to fire: moved only by a compare-and-set from the tick a firer read
    next_at        timestamptz NOT NULL,
    last_fired_at  timestamptz,               -- the tick of the last run it started
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_one_timing CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);
-- The firer's question every CAIRN_SCHEDULE_TICK: which active schedules are due?
CREATE INDEX schedules_due ON schedules (next_at) WHERE NOT paused;

-- The OpenAI Agents SDK's sessions (cairn.openai_agents.CairnSession): a conversation's
-- items, oldest first by id, written inside a step through its own transaction (ctx.db)
-- so a turn commits with its checkpoint or not at all; run_id: the run that wrote it.
CREATE TABLE agent_session_items (
    id          bigserial PRIMARY KEY,
    session_id  text NOT NULL,
    item        jsonb NOT NULL,
    run_id      text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX agent_session_items_session ON agent_session_items (session_id, id);

-- Steering (migration 0019): messages for a running agent (Client.steer), numbered in
-- their run in the order they were stored, read by the step at its next ctx.messages()
-- (a journaled read: the journal record says which a visit got, so each is delivered
-- once, and a fenced worker's read records nothing). No delivered flag: the journal is
-- the truth, and a flag beside it could disagree.
CREATE TABLE steer_messages (
    run_id      text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    n           bigint NOT NULL,
    message     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, n)
);

-- API tokens (`cairn tokens create`, migration 0021): the secret is shown once and kept
-- only as its SHA-256; a token acts for its tenant, or for all as an admin. A revoked
-- token stays listed with when it was revoked.
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

-- Budgets over a run tree (migration 0023) (Client.enqueue(budget_usd=...)): one row per scope, the spend
-- ledger. A scope is a key: 'run:<id>' is a parent and all its descendants; a run lists
-- the scopes it spends against (runs.budgets), so another kind of scope is one more key.
-- spent_* grows only in the transaction that journals a call (record_call): the record
-- is the truth, and a call a replay returns from the journal adds nothing. reserved_* is
-- the worst case of the calls in flight (budget_holds), what the hard check counts too.
CREATE TABLE budgets (
    scope            text PRIMARY KEY,
    -- the hard limits (NULL: none of that kind; at least one is set)
    limit_usd        double precision,
    limit_tokens     bigint,
    -- the soft limit as a fraction of each limit: an event and a metric once crossed
    soft             double precision,
    spent_usd        double precision NOT NULL DEFAULT 0,
    reserved_usd     double precision NOT NULL DEFAULT 0,
    spent_tokens     bigint NOT NULL DEFAULT 0,
    reserved_tokens  bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- a tenant's budget ('tenant:<name>', migration 0025) rolls each UTC day or month:
    -- the first check in a later period resets spent_* (holds in flight stay held);
    -- NULL for a tree's, which never rolls
    period           text CHECK (period IN ('day', 'month')),
    period_start     timestamptz,
    CONSTRAINT budgets_some_limit CHECK (limit_usd IS NOT NULL OR limit_tokens IS NOT NULL),
    CONSTRAINT budgets_period_start CHECK ((period IS NULL) = (period_start IS NULL))
);
-- the tenants' rows alone, which the wake pass rolls (migration 0026)
CREATE INDEX budgets_periods ON budgets (period_start) WHERE period IS NOT NULL;

-- One row per call in flight that a budget admitted, keyed as its journal record will be:
-- the record deletes it (settled); an attempt killed in the call leaves it, and the next
-- attempt at the same call finds it (admitted already: a call is admitted once); a hold
-- whose run saved past its seq or stopped is released by the next check of its scope.
CREATE TABLE budget_holds (
    scope   text NOT NULL REFERENCES budgets (scope) ON DELETE CASCADE,
    run_id  text NOT NULL,
    cursor  text NOT NULL,
    visit   integer NOT NULL,
    pos     integer NOT NULL,
    seq     bigint NOT NULL,
    usd     double precision NOT NULL,
    tokens  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, cursor, visit, pos, scope)
);
CREATE INDEX budget_holds_scope ON budget_holds (scope);

-- Approvals (migration 0022): a run parked on a wait that asks a person something
-- (StepResult.wait(..., request=...)), listed across runs and decided once; the audit of
-- each decision; the standing rules that decide a request at once.
CREATE TABLE approvals (
    approval_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id       text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    seq          bigint NOT NULL,
    event        text NOT NULL,
    workflow     text NOT NULL,
    tool         text,
    request      jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    decided_at   timestamptz,
    -- what the inbox lists: true until decided, or until its run leaves this wait
    -- otherwise (a timeout, a cancel, a signal of its own): approvals_close
    pending      boolean NOT NULL DEFAULT true,
    -- its run's tenant, copied by the save (migration 0024): a tenant's inbox filters on it
    tenant       text,
    UNIQUE (run_id, seq)
);
-- The inbox, newest or oldest first: only pending rows are in these indexes, and a list
-- reads nothing else (no run or checkpoint looked up a row), so listing costs what it
-- returns, at 1M runs as at 1,000 (bench/approvals.py).
CREATE INDEX approvals_pending ON approvals (approval_id) WHERE pending;
CREATE INDEX approvals_pending_workflow ON approvals (workflow, approval_id) WHERE pending;
CREATE INDEX approvals_pending_tenant ON approvals (tenant, approval_id)
    WHERE pending AND tenant IS NOT NULL;

-- A run leaving a wait (its status no longer waiting, or waiting again at a new seq)
-- closes the request of that wait: once per wait, and a lookup by (run_id, seq) that
-- finds nothing for a wait that asked nobody. Triggered, so every way out of a wait
-- (a save, the wake pass, a cancel) closes it, now and as they change.
CREATE FUNCTION approvals_close() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE approvals SET pending = false
     WHERE run_id = OLD.run_id AND seq = OLD.seq AND pending;
    RETURN NULL;
END $$;
CREATE TRIGGER checkpoints_approvals_close AFTER UPDATE OF status, seq ON checkpoints
    FOR EACH ROW WHEN (OLD.status = 'waiting' AND (NEW.status <> 'waiting' OR NEW.seq <> OLD.seq))
    EXECUTE FUNCTION approvals_close();

-- The audit: who decided what and when, written in the transaction that sends the run its
-- signal. One row per approval (the primary key: a second decision, even a racing one,
-- writes none). Swept with its run, found through its approval (the sweep).
CREATE TABLE approval_decisions (
    approval_id  bigint PRIMARY KEY,
    run_id       text NOT NULL,
    workflow     text NOT NULL,
    tool         text,
    decision     text NOT NULL CHECK (decision IN ('approve', 'deny', 'edit')),
    payload      jsonb NOT NULL,
    decided_by   text NOT NULL,
    rule_id      bigint,
    decided_at   timestamptz NOT NULL DEFAULT now()
);

-- Standing rules: a request of this workflow for this tool is approved as the run saves
-- its wait (the run goes on at once; its audit row names the rule).
CREATE TABLE approval_rules (
    rule_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow    text NOT NULL,
    tool        text NOT NULL,
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- the tenant whose runs it decides (migration 0024); NULL: every run's
    tenant      text,
    CONSTRAINT approval_rules_workflow_tool_tenant_key
        UNIQUE NULLS NOT DISTINCT (workflow, tool, tenant)
);

-- The pages' sessions (migration 0027): a random cookie value, kept only as its SHA-256.
-- Logging out deletes the row; revoking its token deletes the token's (token_revoke).
-- owner: what it was made from, the token's stored hash, or for CAIRN_API_TOKEN
-- (token_id NULL) a MAC of it; a session whose owner no longer matches opens nothing.
CREATE TABLE page_sessions (
    hash        bytea PRIMARY KEY,
    token_id    text REFERENCES api_tokens (id) ON DELETE CASCADE,
    owner       bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX page_sessions_token ON page_sessions (token_id) WHERE token_id IS NOT NULL;
CREATE INDEX page_sessions_expiry ON page_sessions (expires_at);
