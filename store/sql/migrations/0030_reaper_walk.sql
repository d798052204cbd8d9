-- The reaper's two listings, each a page at a time from an index of its own runs:
-- checkpoints_taken holds the runs a worker took (running, or pending with an epoch),
-- walked in run_id order (the query stalled), and checkpoints_untaken the runs never
-- taken, oldest first, counted and listed against the broker's messages (unclaimed_count,
-- unclaimed). A backlog of 100,000 never-taken runs after an outage is then never read
-- by the walk, and counted from the index alone (before: an unbounded listing each pass,
-- seconds at 30,000). No column of either changes on a save that keeps its run running
-- (status and epoch are indexed already; created_at and run_id never change), so saves
-- stay HOT updates.
CREATE INDEX checkpoints_taken ON checkpoints (run_id)
    WHERE status = 'running' OR (status = 'pending' AND epoch > 0);
CREATE INDEX checkpoints_untaken ON checkpoints (created_at, run_id)
    WHERE status = 'pending' AND epoch = 0;
