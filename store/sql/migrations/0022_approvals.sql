-- Approvals (issue 44 item 3): a run parked on a wait that asks a person something
-- (StepResult.wait(..., request=...), and the integrations' tool approvals), listed across
-- runs (GET /approvals) and decided once. seq: the save that parked the run, so a
-- decision answers this wait and no later one; tool in clear (a request may be sealed),
-- for the standing rules to match. Decided or not, the row goes with its run (swept).
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
    UNIQUE (run_id, seq)
);
-- The inbox, newest or oldest first: only pending rows are in these indexes, and a list
-- reads nothing else (no run or checkpoint looked up a row), so listing costs what it
-- returns, at 1M runs as at 1,000 (bench/approvals.py).
CREATE INDEX approvals_pending ON approvals (approval_id) WHERE pending;
CREATE INDEX approvals_pending_workflow ON approvals (workflow, approval_id) WHERE pending;

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
-- writes none). Kept after the run is swept, as an audit is.
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
    UNIQUE (workflow, tool)
);
