-- Budgets over a run tree (Client.enqueue(budget_usd=...)): one row per scope, the spend
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
    CONSTRAINT budgets_some_limit CHECK (limit_usd IS NOT NULL OR limit_tokens IS NOT NULL)
);

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

ALTER TABLE runs ADD COLUMN budgets text[];
-- raise_budget finds a budget's runs (a tree's) by it; runs without one are not indexed.
CREATE INDEX runs_budgets ON runs USING gin (budgets) WHERE budgets IS NOT NULL;

-- A run stopped over budget is re-armed when its budget is raised (raise_budget): with a
-- concurrency key it takes a slot again, or queues, as a re-armed failed run does.
DROP TRIGGER checkpoints_run_rearmed ON checkpoints;
CREATE TRIGGER checkpoints_run_rearmed AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IN ('failed', 'incompatible', 'unknown', 'budget_exceeded')
                       AND NEW.status = 'pending')
    EXECUTE FUNCTION cairn_run_rearmed();
