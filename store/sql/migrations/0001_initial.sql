-- Runs are immutable once enqueued; checkpoints change after every step. Keeping them
-- apart keeps the per-step row small (the input is never rewritten).
CREATE TABLE runs (
    run_id      text PRIMARY KEY,
    workflow    text NOT NULL,
    input       jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

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
    status      text NOT NULL CHECK (status IN ('pending', 'running', 'done', 'failed')),
    error       text,
    epoch       bigint NOT NULL DEFAULT 0,
    resumes     integer NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);

CREATE INDEX checkpoints_active ON checkpoints (status) WHERE status IN ('pending', 'running');

-- The model window, append-only: a save writes only the messages that are new.
-- The live window is the rows idx in [win_start, win_end) of the checkpoint.
CREATE TABLE window_messages (
    run_id   text NOT NULL,
    idx      integer NOT NULL,
    message  jsonb NOT NULL,
    PRIMARY KEY (run_id, idx)
);

-- Done-ledger for downstreams without idempotency (ctx.once).
CREATE TABLE effects (
    key         text PRIMARY KEY,
    run_id      text NOT NULL,
    result      jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The shipped invoice workflow's ledger: written through ctx.db, in the checkpoint's
-- transaction.
CREATE TABLE invoice_ledger (
    idempotency_key  text PRIMARY KEY,
    run_id           text NOT NULL,
    customer         text NOT NULL,
    amount_cents     bigint NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now()
);
