-- The reaper walks the runs a worker took (running, or pending with an epoch) in run_id
-- order, a page at a time (the query stalled): this partial index holds those runs alone,
-- so a page reads its rows and never the never-taken pending runs of a backlog (30,000
-- of them after an outage made one unbounded pass take seconds). Neither column changes
-- on a save that keeps the run running, so saves stay HOT updates.
CREATE INDEX checkpoints_taken ON checkpoints (run_id)
    WHERE status = 'running' OR (status = 'pending' AND epoch > 0);
