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
    PRIMARY KEY (run_id, cursor, visit, pos)
);
