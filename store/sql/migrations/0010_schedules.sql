-- Schedules (Client.add_schedule, `cairn schedules`): each tick starts one run whose id
-- is the schedule's name and the tick's time, so a tick fired twice is still one run.
CREATE TABLE schedules (
    name           text PRIMARY KEY,
    workflow       text NOT NULL,
    input          jsonb NOT NULL DEFAULT '{}',
    cron           text,                      -- a cron expression, in UTC; or
    every_seconds  integer CONSTRAINT schedules_every_check CHECK (every_seconds > 0),
    catch_up       text NOT NULL DEFAULT 'latest'
                   CONSTRAINT schedules_catch_up_check CHECK (catch_up IN ('latest', 'all', 'skip')),
    paused         boolean NOT NULL DEFAULT false,
    -- the next tick to fire: moved only by a compare-and-set from the tick a firer read
    next_at        timestamptz NOT NULL,
    last_fired_at  timestamptz,               -- the tick of the last run it started
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_one_timing CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);
-- The firer's question every CAIRN_SCHEDULE_TICK: which active schedules are due?
CREATE INDEX schedules_due ON schedules (next_at) WHERE NOT paused;
