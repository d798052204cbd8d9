-- Compare-and-delete: release only the lease we hold, never a successor's.
-- KEYS[1]  cairn:lease:<run_id>
-- KEYS[2]  cairn:deliveries: the delivery ends, its run leaves the set
-- KEYS[3]  (optional) cairn:epoch:<run_id>: the run has ended, its counter goes too
-- ARGV[1]  our token "<owner>|<epoch>"
-- ARGV[2]  the run id
-- Returns 1 if deleted, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZREM', KEYS[2], ARGV[2])
  if KEYS[3] then
    redis.call('DEL', KEYS[3])
  end
  return redis.call('DEL', KEYS[1])
end
return 0
