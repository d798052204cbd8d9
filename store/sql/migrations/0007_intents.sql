-- At-most-once effects (ctx.once(..., at_most_once=True)): an effect row is first written
-- as an intent (done false), fenced and committed before the effect runs; its done mark
-- follows the effect. An intent found without its mark means the outcome is unknown: the
-- effect is never run again, and the run stops as 'unknown' until someone resolves it.
ALTER TABLE effects ADD COLUMN done boolean NOT NULL DEFAULT true;
CREATE INDEX effects_open ON effects (run_id) WHERE NOT done;

ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_status_check;
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_status_check CHECK (status IN (
    'pending', 'running', 'waiting', 'done', 'failed', 'cancelled', 'budget_exceeded',
    'incompatible', 'unknown'));
