-- Debounced enqueues (Client.enqueue(debounce_key=..., debounce=...)): a debounced run
-- waits at seq 0 (status waiting, wait_until its start) until the wake pass sends it, as
-- a sleeping run does. Its workflow and key say which enqueues collapse into it; the
-- unique index holds one such run per (workflow, key) while it has not started, so two
-- enqueuers racing meet on it (INSERT ... ON CONFLICT) and never make two. A run woken,
-- cancelled or past seq 0 (a later sleep) leaves the index and frees its key.
ALTER TABLE checkpoints ADD COLUMN debounce_workflow text, ADD COLUMN debounce_key text;
CREATE UNIQUE INDEX checkpoints_debounce ON checkpoints (debounce_workflow, debounce_key)
    WHERE status = 'waiting' AND seq = 0 AND debounce_key IS NOT NULL;
