-- Code versions (CAIRN_CODE_VERSION): on a run's checkpoint the version of the worker that
-- started it, set by its first claim (epoch 0: no worker had claimed it, a fork included;
-- a run claimed before this migration keeps NULL, its start unknown), and on each
-- step_history row the version of the worker that wrote it. Neither column is indexed:
-- the per-step update stays HOT, and the save writes one more value in the statement it
-- already runs.
ALTER TABLE checkpoints ADD COLUMN started_version text;
ALTER TABLE step_history ADD COLUMN code_version text;
