-- Lists filtered by status, newest first, from an index of that status (30-70 ms at 1M
-- runs walking every newer run; see bench/million.py).
--
-- checkpoints keeps a copy of its run's created_at: set by the same statement that inserts
-- the run (create_run), so equal to it, and never changed afterwards, so the per-step save
-- still updates the row in place.
ALTER TABLE checkpoints ADD COLUMN created_at timestamptz;
UPDATE checkpoints c SET created_at = r.created_at FROM runs r WHERE r.run_id = c.run_id;
ALTER TABLE checkpoints ALTER COLUMN created_at SET DEFAULT now(),
                        ALTER COLUMN created_at SET NOT NULL;
CREATE INDEX checkpoints_status_newest ON checkpoints (status, created_at DESC, run_id DESC);
