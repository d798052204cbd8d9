-- A tenant's budget per UTC day or month (Client.set_tenant_budget): the budgets row of
-- scope 'tenant:<name>'. Its runs spend against it from their next claim (the claim's
-- columns append the scope to runs.budgets when the row exists), so a budget set while
-- runs are in flight counts their next calls and nothing before. period_start: the start
-- of the period spent_* counts; the first check in a later period resets them (holds in
-- flight stay held). NULL period: a tree's budget, which never rolls.
ALTER TABLE budgets ADD COLUMN period text CHECK (period IN ('day', 'month'));
ALTER TABLE budgets ADD COLUMN period_start timestamptz;
ALTER TABLE budgets ADD CONSTRAINT budgets_period_start
    CHECK ((period IS NULL) = (period_start IS NULL));
