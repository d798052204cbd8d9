-- The schedules' named queries (store/schedules.py), in queries.sql's layout.

-- name: add_schedule
-- A new schedule; an existing name is left as it is (the caller compares).
INSERT INTO schedules (name, workflow, input, cron, every_seconds, catch_up, next_at)
VALUES (%(name)s, %(workflow)s, %(input)s, %(cron)s, %(every)s, %(catch_up)s, %(next_at)s)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: replace_schedule
-- add_schedule(replace=True): the new definition. A paused schedule stays paused, and one
-- whose timing is unchanged keeps its next tick (a deploy that re-adds it skips none).
INSERT INTO schedules AS s (name, workflow, input, cron, every_seconds, catch_up, next_at)
VALUES (%(name)s, %(workflow)s, %(input)s, %(cron)s, %(every)s, %(catch_up)s, %(next_at)s)
ON CONFLICT (name) DO UPDATE
   SET workflow = EXCLUDED.workflow, input = EXCLUDED.input, catch_up = EXCLUDED.catch_up,
       cron = EXCLUDED.cron, every_seconds = EXCLUDED.every_seconds,
       next_at = CASE WHEN (s.cron, s.every_seconds)
                           IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_seconds)
                      THEN s.next_at ELSE EXCLUDED.next_at END
RETURNING *;

-- name: get_schedule
SELECT * FROM schedules WHERE name = %(name)s;

-- name: list_schedules
SELECT * FROM schedules ORDER BY name;

-- name: pause_schedule
UPDATE schedules SET paused = true WHERE name = %(name)s RETURNING *;

-- name: resume_schedule
-- Goes on at next_at, the first tick after now: ticks while paused are not fired. Only
-- a paused schedule with the timing next_at was computed from (not one replaced meanwhile).
UPDATE schedules SET paused = false, next_at = %(next_at)s
 WHERE name = %(name)s AND paused
   AND (cron, every_seconds) IS NOT DISTINCT FROM (%(cron)s::text, %(every)s::integer)
RETURNING *;

-- name: remove_schedule
DELETE FROM schedules WHERE name = %(name)s RETURNING name;

-- name: due_schedules
-- The active schedules whose next tick has come, oldest first.
SELECT * FROM schedules
 WHERE NOT paused AND next_at <= %(now)s
 ORDER BY next_at, name
 LIMIT %(limit)s;

-- name: advance_schedule
-- The compare-and-set that makes a tick fire once: next_at moves only from the tick this
-- firer read. A second firer's update waits on the row lock, then finds next_at moved and
-- updates nothing; so does one racing a pause, a replace or a remove. Returns what the
-- runs are made of, as the row stands under the lock.
UPDATE schedules SET next_at = %(next_at)s, last_fired_at = coalesce(%(fired)s, last_fired_at)
 WHERE name = %(name)s AND next_at = %(seen)s AND NOT paused
RETURNING workflow, input;
