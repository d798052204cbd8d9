-- A worker that takes a run over fences the run's stream at its epoch, then reads what
-- the last writer left: from here no older writer's event is added (emit.lua), so the
-- newest entries returned are the whole tail the new owner must account for.
-- KEYS[1]  cairn:events:<run_id>        the stream
-- KEYS[2]  cairn:events:<run_id>:epoch  the newest lease epoch that wrote or claimed
-- ARGV[1]  the new owner's epoch
-- ARGV[2]  how many of the newest entries to return
-- ARGV[3]  TTL in seconds
-- Returns the newest entries, newest first (XREVRANGE's reply); none: no stream.
local newest = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) > newest then
  redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
end
return redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[2])
