-- Forks and rewinds (Client.fork, Client.rewind): each saved step's history row keeps
-- what a run needs to go on from the checkpoint it saved: the next cursor, the visits,
-- the window's range (its messages are append-only, so the range is enough), the cost so
-- far, the workflow version, and the state when the step changed it (NULL: as the row
-- before), so the bytes a step adds stay flat in the run's length.
ALTER TABLE step_history ADD COLUMN next_cursor text;
ALTER TABLE step_history ADD COLUMN visits jsonb;
ALTER TABLE step_history ADD COLUMN win_start integer;
ALTER TABLE step_history ADD COLUMN win_end integer;
ALTER TABLE step_history ADD COLUMN total_cost double precision;
ALTER TABLE step_history ADD COLUMN flow_version integer;
ALTER TABLE step_history ADD COLUMN state jsonb;

-- A fork's origin: the run and the seq it was forked from.
ALTER TABLE runs ADD COLUMN forked_from text;
ALTER TABLE runs ADD COLUMN forked_at bigint;
CREATE INDEX runs_forks ON runs (forked_from) WHERE forked_from IS NOT NULL;
