-- Extend the lease if we still hold it.
-- KEYS[1]  cairn:lease:<run_id>
-- ARGV[1]  our token "<owner>|<epoch>"
-- ARGV[2]  ttl in ms
-- Returns 1 if renewed, else the current token (false when the lease expired).
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return held
