-- Version pins (cairn.workflow(..., versions="pin")): a pinned run goes on only on workers
-- of the code version that started it (started_version). Set by the run's first claim,
-- from the claiming worker's own workflows, so the policy that holds is the starting
-- code's. The partial index holds pinned runs under way only: an unpinned run never
-- enters it, and what `cairn deploy status` and the reaper's orphan report count per
-- version is read from it.
ALTER TABLE checkpoints ADD COLUMN pinned boolean NOT NULL DEFAULT false;
CREATE INDEX checkpoints_pinned ON checkpoints (started_version)
    WHERE pinned AND status IN ('pending', 'running', 'waiting');
