-- The wake pass counts the runs it moves out of waiting itself, one delta row per status
-- (queries.sql: wake), where this row trigger wrote two rows per run: 4.7 of a pass's
-- 16.6 ms at 1,000 due runs (bench/sleep.py). The pass says so with the transaction-local
-- setting cairn.counted; every other status change is the trigger's, as before (code of
-- an older release, which never sets it, is counted by the trigger as it was).
DROP TRIGGER checkpoints_count_update ON checkpoints;
CREATE TRIGGER checkpoints_count_update AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       AND current_setting('cairn.counted', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION cairn_count_change();
