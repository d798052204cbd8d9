-- Compare-and-delete: release only the lease we hold, never a successor's.
-- KEYS[1]  cairn:lease:<run_id>
-- KEYS[2]  (optional) cairn:epoch:<run_id>: the run has ended, its counter goes too
-- ARGV[1]  our token "<owner>|<epoch>"
-- Returns 1 if deleted, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if KEYS[2] then
    redis.call('DEL', KEYS[2])
  end
  return redis.call('DEL', KEYS[1])
end
return 0
