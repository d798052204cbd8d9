-- Acquire a run's lease and a fencing epoch, atomically.
-- KEYS[1]  cairn:lease:<run_id>   lease token "<owner>|<epoch>", PX ttl
-- KEYS[2]  cairn:epoch:<run_id>   fencing counter (INCR, never expires)
-- KEYS[3]  cairn:sent:<run_id>    a message sent and not yet taken: taken now
-- KEYS[4]  cairn:deliveries       the runs a delivery holds, scored by when it began
-- ARGV[1]  owner (hostname:pid:nonce)
-- ARGV[2]  ttl in ms
-- ARGV[3]  floor: the epoch stored with the checkpoint; the new epoch is above it even
--          if Redis lost the counter (restart without persistence, or its TTL passed)
-- ARGV[4]  the counter's ttl in ms, from this acquisition
-- ARGV[5]  the run id
-- Returns {epoch, token} on success, {0, current token} when another owner holds it.
local held = redis.call('GET', KEYS[1])
if held then
  return {0, held}
end
local epoch = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
local token = ARGV[1] .. '|' .. epoch
redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2])
redis.call('DEL', KEYS[3])
local now = redis.call('TIME')
redis.call('ZADD', KEYS[4], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), ARGV[5])
return {epoch, token}
