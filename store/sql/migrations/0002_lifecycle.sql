-- A run's whole life: bounded retries, poison detection, cancel, budgets, waiting for
-- signals, a visible state for checkpoints this code cannot read, and a step history.

ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_status_check;
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_status_check CHECK (status IN (
    'pending', 'running', 'waiting', 'done', 'failed', 'cancelled', 'budget_exceeded',
    'incompatible'));

ALTER TABLE checkpoints
    -- failed attempts of the step at cursor (reset by a save): survive crashes
    ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    -- claims since the last save: a run redelivered over and over without progress is
    -- poison (a step that kills its process)
    ADD COLUMN deliveries integer NOT NULL DEFAULT 0,
    -- a retry is scheduled for then: the reaper leaves the run alone until it is due
    ADD COLUMN retry_at timestamptz,
    -- cancel was asked for: the run stops at its next step boundary, before any effect
    ADD COLUMN cancel_reason text,
    -- status waiting: the event it waits for, until when, and where it goes on timeout
    ADD COLUMN wait_event text,
    ADD COLUMN wait_until timestamptz,
    ADD COLUMN wait_timeout_cursor text,
    -- the workflow version whose code wrote the state (NULL: not written by a step yet)
    ADD COLUMN flow_version integer;

CREATE INDEX checkpoints_waiting ON checkpoints (wait_until) WHERE status = 'waiting';

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
    PRIMARY KEY (run_id, signal_id)
);
CREATE INDEX signals_pending ON signals (run_id, event, created_at) WHERE consumed_seq IS NULL;

-- The lease epoch under which a ctx.once effect ran (0: before this was recorded).
ALTER TABLE effects ADD COLUMN epoch bigint NOT NULL DEFAULT 0;

-- Listing runs newest first, a page at a time (keyset on created_at, run_id).
CREATE INDEX runs_newest ON runs (created_at DESC, run_id DESC);

-- The per-run cost cap (NULL: the workers' CAIRN_MAX_COST_USD, 0 there means none).
ALTER TABLE runs ADD COLUMN max_cost_usd double precision;

-- One row per step attempt that ended: saved, retried, failed, cancelled. Appended in the
-- statement that saves the step, so the per-step write stays one round trip.
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
    error       text,
    -- one index, the one reads use: the per-step write pays for a single index entry
    PRIMARY KEY (run_id, id)
);
