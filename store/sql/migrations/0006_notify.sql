-- Client.wait: whoever waits for a run hears it stop or park instead of polling. One
-- channel per run ('cairn_' and the first 16 hex digits of md5(run_id): a channel name is
-- at most 63 bytes, a run id up to 200), notified by the transaction that moves its status
-- to a stopped one or to waiting: about once per run, so commits rarely queue on it.
CREATE FUNCTION cairn_notify_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cairn_' || left(md5(NEW.run_id), 16), NEW.status);
    RETURN NULL;
END $$;

CREATE TRIGGER checkpoints_notify_status AFTER UPDATE OF status ON checkpoints
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       AND NEW.status NOT IN ('pending', 'running'))
    EXECUTE FUNCTION cairn_notify_status();
