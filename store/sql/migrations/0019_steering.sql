-- Steering: messages for a running agent (Client.steer), each numbered in its run in the
-- order they were stored, read by the step at its next ctx.messages() (a journaled read:
-- which messages a visit got is in its journal record, so a message is delivered once,
-- and a fenced worker's read records nothing). No delivered flag: the journal is the
-- truth, and a flag beside it could disagree.
CREATE TABLE steer_messages (
    run_id      text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    n           bigint NOT NULL,
    message     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, n)
);
