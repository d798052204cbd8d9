-- The wake pass rolls the tenants' budgets whose UTC day or month is over (the query
-- roll_tenant_budgets), every CAIRN_SCHEDULE_TICK: this partial index holds the tenants'
-- rows alone, so a pass reads those and never the budgets of every run tree (a seq scan
-- of 50,000 trees' rows took 7.7 ms a pass).
CREATE INDEX budgets_periods ON budgets (period_start) WHERE period IS NOT NULL;
