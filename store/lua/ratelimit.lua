-- Fleet-wide model rate limits: a GCRA bucket for requests and one for tokens, and the
-- back-off the provider asked for, shared by every worker. Times are Redis's own (TIME,
-- in ms), so workers on hosts with skewed clocks agree.
-- KEYS[1]  cairn:ratelimit:<provider>:<model>:<key hash>  hash of ms timestamps: r and t, each
--          bucket's theoretical arrival time (TAT); b, no call starts before it. The key
--          expires once all three have passed: an absent key is full buckets.
-- ARGV[1]  op: take | settle | backoff
-- take     ARGV[2] ms per request (0: no limit)   ARGV[3] ms per token (0: no limit)
--          ARGV[4] tokens to reserve (at most a minute's)   ARGV[5] longest wait in ms
--          Returns {1, wait in µs}: the call is booked to start after that wait; or
--          {0, wait in µs}: it would wait longer than allowed, and nothing was booked.
-- settle   ARGV[2] ms per token   ARGV[3] tokens to give back (negative: to take more)
-- backoff  ARGV[2] ms from now before which no call starts (a later one already set stays)
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + tonumber(now[2]) / 1000
local key, op = KEYS[1], ARGV[1]
local r = tonumber(redis.call('HGET', key, 'r')) or now
local t = tonumber(redis.call('HGET', key, 't')) or now
local b = tonumber(redis.call('HGET', key, 'b')) or now

local function save()
  redis.call('HSET', key, 'r', string.format('%.3f', r), 't', string.format('%.3f', t),
             'b', string.format('%.3f', b))
  redis.call('PEXPIRE', key, math.ceil(math.max(r, t, b) - now) + 1000)
end

if op == 'take' then
  local per_req, per_tok = tonumber(ARGV[2]), tonumber(ARGV[3])
  local tokens, longest = tonumber(ARGV[4]), tonumber(ARGV[5])
  -- The earliest start each bucket allows: requests have room for one (evenly spaced,
  -- so the provider's per-second enforcement is never met), tokens for a minute's.
  local start = math.max(now, b)
  if per_req > 0 then start = math.max(start, r) end
  if per_tok > 0 then start = math.max(start, t + (tokens * per_tok) - 60000) end
  local wait = start - now
  if wait > longest then
    return {0, math.ceil(wait * 1000)}
  end
  -- Booked from the start itself, so callers queued behind a wait are spaced after it.
  if per_req > 0 then r = math.max(r, start) + per_req end
  if per_tok > 0 then t = math.max(t, start) + tokens * per_tok end
  save()
  return {1, math.ceil(wait * 1000)}
elseif op == 'settle' then
  t = math.max(math.max(t, now) - tonumber(ARGV[3]) * tonumber(ARGV[2]), now)
  save()
elseif op == 'backoff' then
  b = math.max(b, now + tonumber(ARGV[2]))
  save()
end
return {1, 0}
