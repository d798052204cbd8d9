-- Which of a batch of runs the reaper may send, each marked sent: one round trip a batch.
-- KEYS[2i-1]  cairn:lease:<run_id>  held: a worker has the run, nothing to send
-- KEYS[2i]    cairn:sent:<run_id>   "<sends>:<due ms>": a message sent for the run is
--             out and untaken (acquire.lua deletes the key when a worker takes it), and
--             no other goes before due. A bare value (mark_sent's) holds until it expires.
-- ARGV[1]  the first wait in ms; each next send waits twice the last, up to ARGV[2]
-- ARGV[2]  the longest wait in ms
-- ARGV[3]  how many to offer at most (0: all that may go)
-- Returns the 1-based indexes of the runs offered (and marked).
-- The mark outlives its due by the longest wait, so a run whose messages keep going
-- untaken (a backlog of resumes, or lost each time) is sent ever more rarely, never
-- once a window; a taken run starts again from the first wait.
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local first, cap, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 1, #KEYS / 2 do
  if most > 0 and #out >= most then
    break
  end
  if redis.call('EXISTS', KEYS[2 * i - 1]) == 0 then
    local mark = redis.call('GET', KEYS[2 * i])
    local sends = 0
    local free = true
    if mark then
      local n, due = string.match(mark, '^(%d+):(%d+)$')
      if n and now >= tonumber(due) then
        sends = tonumber(n)
      else
        free = false
      end
    end
    if free then
      local wait = math.floor(math.min(first * 2 ^ sends, cap))
      redis.call('SET', KEYS[2 * i], (sends + 1) .. ':' .. (now + wait), 'PX', wait + cap)
      out[#out + 1] = i
    end
  end
end
return out
