-- Append a batch of one run's events to its stream.
-- KEYS[1]  cairn:events:<run_id>        the stream (XADD with an approximate MAXLEN)
-- KEYS[2]  cairn:events:<run_id>:n      events counted toward the run's cap, over its life
-- KEYS[3]  cairn:lease:<run_id>
-- KEYS[4]  cairn:events:<run_id>:epoch  the newest lease epoch that wrote to the stream
-- ARGV[1]  the writer's lease token "<owner>|<epoch>"
-- ARGV[2]  MAXLEN, ARGV[3] TTL in seconds (all keys), ARGV[4] the cap (0: none)
-- ARGV[5..] one event each: a flag character then its JSON. "f": written before the
--          step's commit: only while the writer holds the lease, and counted (a step's
--          own, and model tokens); "g": refused only while another worker holds the
--          lease, not counted (cairn's own markers before a commit: they carry no
--          content, and may come after our own release); "s": neither (cairn's own,
--          written after a fenced commit succeeded).
-- Every event is fenced by its writer's epoch too: once a newer epoch has written (or
-- claimed the stream, claim.lua), an older writer's events are refused, whatever the
-- lease says then. So a worker paused between its commit and its events cannot add them
-- after the worker that took the run over told the stream what that commit did.
-- Returns one entry per event: its stream id, or 0 (fenced) or 1 (over the cap).
local out = {}
local held = redis.call('GET', KEYS[3])
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
local cap = tonumber(ARGV[4])
local writer = tonumber(string.match(ARGV[1], '|(%d+)$') or '0')
local newest = tonumber(redis.call('GET', KEYS[4]) or '0')
local stale = writer < newest
local added = 0
for i = 5, #ARGV do
  local flag = string.sub(ARGV[i], 1, 1)
  if stale or (flag == 'f' and held ~= ARGV[1]) or (flag == 'g' and held and held ~= ARGV[1]) then
    out[#out + 1] = 0
  elseif flag == 'f' and cap > 0 and n >= cap then
    out[#out + 1] = 1
  else
    if flag == 'f' then n = n + 1 end
    added = added + 1
    out[#out + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'e',
                               string.sub(ARGV[i], 2))
  end
end
if added > 0 then
  redis.call('SET', KEYS[2], n, 'EX', ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  if writer > newest then
    redis.call('SET', KEYS[4], writer, 'EX', ARGV[3])
  else
    redis.call('EXPIRE', KEYS[4], ARGV[3])
  end
end
return out
