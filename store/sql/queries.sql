-- name: create_run
-- Enqueue: the run and its initial checkpoint (seq 0). An existing run is left as is,
-- so enqueueing a known run id resumes it and never starts it over.
WITH new_run AS (
    INSERT INTO runs (run_id, workflow, input, max_cost_usd, priority, traceparent, tenant,
                      budgets)
    VALUES (%(run_id)s, %(workflow)s, %(input)s, %(max_cost_usd)s, %(priority)s,
            %(traceparent)s, %(tenant)s, %(budgets)s)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
)
INSERT INTO checkpoints (run_id, seq, cursor, state, version, status)
SELECT run_id, 0, %(cursor)s, %(state)s, %(version)s, 'pending' FROM new_run
RETURNING run_id;

-- name: create_keyed_run
-- Enqueue with a concurrency key: the run goes in queued, its key's row upserted (locked
-- until commit, so this key's slots are counted by one transaction at a time, and its
-- limit is this enqueue's); `admit`, in the same transaction, lets it start if a slot is
-- free. scope: the key's workflow, or 'cairn.tenant' for a tenant's key (migration 0021).
WITH k AS (
    INSERT INTO concurrency_keys (workflow, key, lim)
    VALUES (%(scope)s, %(key)s, %(limit)s)
    ON CONFLICT (workflow, key) DO UPDATE SET lim = EXCLUDED.lim
), new_run AS (
    INSERT INTO runs (run_id, workflow, input, max_cost_usd, concurrency_key,
                      concurrency_limit, priority, traceparent, tenant, budgets)
    VALUES (%(run_id)s, %(workflow)s, %(input)s, %(max_cost_usd)s, %(key)s, %(limit)s,
            %(priority)s, %(traceparent)s, %(tenant)s, %(budgets)s)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
), q AS (
    INSERT INTO queued (run_id, workflow, key, priority)
    SELECT run_id, %(scope)s, %(key)s, %(priority)s FROM new_run
)
INSERT INTO checkpoints (run_id, seq, cursor, state, version, status)
SELECT run_id, 0, %(cursor)s, %(state)s, %(version)s, 'queued' FROM new_run
RETURNING run_id;

-- name: debounce
-- A debounced enqueue: the (workflow, key)'s run that has not started, made new or given
-- this input and a later start: `debounce` seconds from now, but no later than `max_wait`
-- from its first enqueue (NULL: no bound). The run waits at seq 0 for the wake pass,
-- which sends it once, as it does a sleep's end; nothing is sent from here. The guard is
-- the partial unique index checkpoints_debounce: an enqueuer that races another waits for
-- its insert and then updates that run (or, if the wake pass moved it out of waiting
-- first, inserts a new one), so a key never has two runs waiting to start. The runs row
-- joins on the checkpoint's upsert (FK checked at the end of the statement).
WITH c AS (
    INSERT INTO checkpoints AS c (run_id, seq, cursor, state, version, status, wait_until,
                                  debounce_workflow, debounce_key)
    VALUES (%(run_id)s, 0, %(cursor)s, %(state)s, %(version)s, 'waiting',
            now() + make_interval(secs => %(debounce)s), %(workflow)s, %(key)s)
    ON CONFLICT (debounce_workflow, debounce_key)
       WHERE status = 'waiting' AND seq = 0 AND debounce_key IS NOT NULL
    DO UPDATE SET wait_until = least(now() + make_interval(secs => %(debounce)s),
                                     c.created_at + make_interval(secs => %(max_wait)s)),
                  updated_at = now()
    RETURNING c.run_id, c.xmax = 0 AS created
), new_run AS (
    INSERT INTO runs (run_id, workflow, input, max_cost_usd, priority, traceparent, tenant)
    SELECT run_id, %(workflow)s, %(input)s, %(max_cost_usd)s, %(priority)s, %(traceparent)s,
           %(tenant)s
      FROM c WHERE created
), latest AS (
    UPDATE runs r SET input = %(input)s, max_cost_usd = %(max_cost_usd)s,
                      priority = %(priority)s
      FROM c WHERE NOT c.created AND r.run_id = c.run_id
)
SELECT run_id, created FROM c;

-- name: admit
-- Fill the key's free slots from its queue (cairn_admit, migration 0011).
SELECT cairn_admit(%(scope)s, %(key)s) AS run_id;

-- name: admitted
-- The key's admitted runs whose message is not sent yet, marked sent: the caller sends
-- them. SKIP LOCKED: two callers never send one run twice.
UPDATE slots s SET sent = true
  FROM runs r
 WHERE s.run_id IN (SELECT run_id FROM slots
                     WHERE workflow = %(workflow)s AND key = %(key)s AND NOT sent
                       FOR UPDATE SKIP LOCKED)
   AND r.run_id = s.run_id
RETURNING s.run_id, r.priority;

-- name: existing_run
-- A retried enqueue of a known run id: the same workflow and input is the same run;
-- anything else is a conflict. The input is compared by the caller (rows.conflict), once
-- opened: a sealed input (CAIRN_PAYLOAD_KEYS) differs from every other sealing of it. As
-- text, loaded by the caller whatever loaders the connection has (an enqueue's may be
-- the caller's own).
SELECT r.workflow = %(workflow)s AS same_workflow, r.input::text AS input_text, r.workflow,
       c.status,
       r.tenant IS NOT DISTINCT FROM %(tenant)s AS same_tenant
  FROM runs r JOIN checkpoints c USING (run_id)
 WHERE r.run_id = %(run_id)s;

-- name: rearm_failed
-- Enqueueing a failed run again resumes it at its cursor (after the cause is fixed, or
-- code that reads its checkpoint is deployed), with its retries counted afresh.
UPDATE checkpoints SET status = 'pending', error = NULL, attempts = 0, deliveries = 0,
       retry_at = NULL, updated_at = now()
WHERE run_id = %(run_id)s AND status IN ('failed', 'incompatible')
RETURNING run_id;

-- name: unclaim
-- A claim given back by a worker that lacks the key a payload of the run is sealed under
-- (a key deploy under way): its delivery is not counted toward poison, so a run handed
-- around until a worker with the key takes it is never failed as poison; and the reaper
-- leaves it alone for `hold` seconds (retry_at, as for a retry), while the run task's
-- hand-back chain sends it again, so chains do not pile up. Fenced: only the claim at
-- this epoch (a waiting run's claim counted no delivery).
UPDATE checkpoints
   SET deliveries = CASE WHEN status = 'waiting' THEN deliveries
                         ELSE greatest(deliveries - 1, 0) END,
       retry_at = now() + make_interval(secs => %(hold)s)
 WHERE run_id = %(run_id)s AND epoch = %(epoch)s
RETURNING run_id;

-- name: load
-- The checkpoint with its live model window, in one round trip.
SELECT {{checkpoint_columns}}
  FROM checkpoints c JOIN runs r USING (run_id)
 WHERE c.run_id = %(run_id)s;

-- name: claim
-- Fence: raise the stored epoch to the new lease's, so a zombie holding an older lease
-- can no longer save even before the new owner's first step ends. Returns the fenced
-- checkpoint as `load` does: a delivery's first and only read. A claim is a sign of life
-- like a save (updated_at): the reaper does not list a run a worker has just taken. A run
-- that has stopped, or is queued for its concurrency key, is left as it is (no row: the
-- worker loads it to see why). A run's first claim (epoch 0: never claimed; a fork's too)
-- records the worker's code version as the one that started it, and pins the run when
-- its workflow is among the worker's pinned ones (%(pinned)s; the subquery runs at a
-- first claim only). A pinned run of another version is not claimed: the worker loads
-- it, sees its pinned_to, and sends it to that version's queue, its row untouched.
WITH c AS (
    UPDATE checkpoints
       SET epoch = %(epoch)s, retry_at = NULL, updated_at = now(),
           deliveries = deliveries + CASE WHEN status = 'waiting' THEN 0 ELSE 1 END,
           started_version = coalesce(started_version,
                                      CASE WHEN epoch = 0 THEN %(code_version)s::text END),
           pinned = CASE WHEN epoch = 0 AND cardinality(%(pinned)s::text[]) > 0
                         THEN (SELECT r.workflow FROM runs r WHERE r.run_id = %(run_id)s)
                              = ANY(%(pinned)s::text[])
                         ELSE pinned END
     WHERE run_id = %(run_id)s AND epoch < %(epoch)s
       AND status NOT IN ('done', 'failed', 'cancelled', 'budget_exceeded', 'incompatible',
                          'unknown', 'queued')
       AND (NOT pinned OR started_version = %(code_version)s::text)
    RETURNING *
)
SELECT {{checkpoint_columns}}
  FROM c JOIN runs r USING (run_id);

-- fragment: checkpoint_columns
-- What `load` and `claim` return (c: the checkpoint, r: its run): a Checkpoint's fields,
-- the oldest signal of the awaited event not yet consumed, and the live model window.
-- budgets: the run's own, and its tenant's ('tenant:<name>') while that row exists, so a
-- tenant's budget counts its runs from their next claim (a primary-key probe, and only
-- for a run with a tenant).
c.run_id, r.workflow, r.input, c.seq, c.cursor, c.state, c.visits, c.win_start,
       c.win_end, c.cost_usd, c.version, c.status, c.error, c.epoch, c.resumes, c.updated_at,
       c.attempts, c.deliveries, c.cancel_reason, r.max_cost_usd, c.wait_event,
       c.wait_timeout_cursor, coalesce(c.wait_until <= now(), false) AS wait_over,
       c.flow_version, r.parent_id, r.depth, r.concurrency_key, r.priority, r.traceparent,
       r.forked_from, r.forked_at, r.tenant,
       CASE WHEN r.tenant IS NOT NULL
                 AND EXISTS (SELECT 1 FROM budgets b WHERE b.scope = 'tenant:' || r.tenant)
            THEN coalesce(r.budgets, '{}') || ('tenant:' || r.tenant)
            ELSE r.budgets END AS budgets,
       CASE WHEN c.pinned THEN c.started_version END AS pinned_to,
       (SELECT jsonb_build_object('id', s.signal_id, 'payload', s.payload)
               || CASE WHEN s.traceparent IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('traceparent', s.traceparent) END
          FROM signals s
         WHERE s.run_id = c.run_id AND s.event = c.wait_event AND s.consumed_seq IS NULL
         ORDER BY s.created_at, s.signal_id LIMIT 1) AS signal,
       (SELECT coalesce(jsonb_agg(w.message ORDER BY w.idx), '[]'::jsonb)
          FROM window_messages w
         WHERE w.run_id = c.run_id AND w.idx >= c.win_start AND w.idx < c.win_end) AS window

-- fragment: save_upsert
-- The guard is the point: an older writer (lower seq) or a fenced one (older epoch)
-- changes nothing, and then neither does anything joined on the row it returns.
    INSERT INTO checkpoints AS c (run_id, seq, cursor, state, visits, win_start, win_end,
                                  cost_usd, version, status, error, epoch, resumes, updated_at,
                                  wait_event, wait_until, wait_timeout_cursor, flow_version)
    VALUES (%(run_id)s, %(seq)s, %(cursor)s, %(state)s, %(visits)s, %(win_start)s, %(win_end)s,
            %(cost_usd)s, %(version)s, %(status)s, %(error)s, %(epoch)s, %(resumes)s, now(),
            %(wait_event)s, now() + make_interval(secs => %(wait_timeout)s),
            %(wait_timeout_cursor)s, %(flow_version)s)
    ON CONFLICT (run_id) DO UPDATE
       SET seq = EXCLUDED.seq, cursor = EXCLUDED.cursor, state = EXCLUDED.state,
           visits = EXCLUDED.visits, win_start = EXCLUDED.win_start, win_end = EXCLUDED.win_end,
           cost_usd = EXCLUDED.cost_usd, version = EXCLUDED.version, status = EXCLUDED.status,
           error = EXCLUDED.error, epoch = EXCLUDED.epoch, resumes = EXCLUDED.resumes,
           updated_at = now(), attempts = 0, deliveries = 0, retry_at = NULL,
           wait_event = EXCLUDED.wait_event, wait_until = EXCLUDED.wait_until,
           wait_timeout_cursor = EXCLUDED.wait_timeout_cursor, flow_version = EXCLUDED.flow_version
     WHERE c.seq < EXCLUDED.seq AND c.epoch <= EXCLUDED.epoch
    RETURNING c.run_id, c.cancel_reason, c.created_at

-- fragment: save_history
-- The step's history row, written only when the upsert returned its row, with the
-- checkpoint it saved (what a fork or a rewind goes on from; the state only if changed),
-- in its run's month (run_created: the checkpoint's copy of the run's created_at).
    INSERT INTO step_history (run_id, seq, cursor, visit, outcome, started_at, worker, epoch,
                              cost_usd, effect_key, next_cursor, visits, win_start, win_end,
                              total_cost, flow_version, state, code_version, run_created)
    SELECT saved.run_id, %(seq)s - 1, %(step)s, %(visit)s, 'saved', to_timestamp(%(started)s),
           %(worker)s, %(epoch)s, %(step_cost)s, %(effect_key)s, %(cursor)s, %(visits)s,
           %(win_start)s, %(win_end)s, %(cost_usd)s, %(flow_version)s,
           CASE WHEN %(state_changed)s THEN %(state)s END, %(code_version)s, saved.created_at
      FROM saved

-- fragment: save_answer
-- What the save learned. A run saved as waiting whose signal came first goes on at once.
-- (Statements of one query share a snapshot, so the signal consumed in this statement
-- is excluded by hand.)
SELECT run_id, cancel_reason,
       %(wait_event)s::text IS NOT NULL AND {{signal_came_first}} AS signalled
  FROM saved

-- fragment: signal_came_first
-- A signal of the awaited event is there, other than the one this save consumed.
EXISTS (
           SELECT 1 FROM signals s
            WHERE s.run_id = saved.run_id AND s.event = %(wait_event)s
              AND s.consumed_seq IS NULL AND s.signal_id IS DISTINCT FROM %(consumed)s
       )

-- fragment: save_window_history_signal
-- The save's parts after the upsert, each joined on the row it returned: the window's new
-- messages, the history row, the signal consumed.
), appended AS (
    INSERT INTO window_messages (run_id, idx, message)
    SELECT saved.run_id, %(first_idx)s + m.ord - 1, m.msg
      FROM saved, unnest(%(messages)s::jsonb[]) WITH ORDINALITY AS m (msg, ord)
    ON CONFLICT (run_id, idx) DO UPDATE SET message = EXCLUDED.message
), history AS (
{{save_history}}
), consumed AS (
    UPDATE signals s SET consumed_seq = %(seq)s
      FROM saved
     WHERE s.run_id = saved.run_id AND s.signal_id = %(consumed)s

-- name: save
-- The per-step write: one statement, one round trip; the window's new messages and the
-- signal consumed join on the row the guarded upsert returned, so a fenced save writes
-- nothing at all.
WITH saved AS (
{{save_upsert}}
{{save_window_history_signal}}
)
{{save_answer}};

-- name: save_spawn
-- `save` for a step that spawns children (StepResult.spawn): the children's runs and
-- checkpoints and the spawn's gather row join on the row the guarded upsert returned, so
-- they exist exactly when the save does (a replay's save is fenced or finds them made).
WITH saved AS (
{{save_upsert}}
{{save_window_history_signal}}
), kids AS (
    SELECT k.run_id, k.workflow, k.input, k.n - 1 AS ord
      FROM saved, unnest(%(kid_ids)s::text[], %(kid_workflows)s::text[],
                         %(kid_inputs)s::jsonb[]) WITH ORDINALITY AS k (run_id, workflow, input, n)
), new_runs AS (
    INSERT INTO runs (run_id, workflow, input, created_at, parent_id, parent_seq, depth,
                      traceparent, tenant, budgets)
    SELECT run_id, workflow, input, now() + make_interval(secs => ord * 1e-6),
           %(run_id)s, %(seq)s, %(depth)s, %(traceparent)s,
           (SELECT tenant FROM runs WHERE run_id = %(run_id)s),  -- the parent's
           (SELECT budgets FROM runs WHERE run_id = %(run_id)s)  -- a child spends its tree's
      FROM kids
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id, created_at
), new_checkpoints AS (
    INSERT INTO checkpoints (run_id, seq, cursor, state, version, status, created_at)
    SELECT run_id, 0, '', '{}', %(version)s, 'pending', created_at FROM new_runs
), gather AS (
    INSERT INTO gathers (parent_id, seq, need, total)
    SELECT saved.run_id, %(seq)s, %(need)s, cardinality(%(kid_ids)s::text[]) FROM saved
    ON CONFLICT (parent_id, seq) DO NOTHING
)
{{save_answer}};

-- name: save_plain
-- `save` for a step that appends no window message and consumes no signal (most steps):
-- without those two CTEs, whose tables and indexes Postgres opens on every execution
-- even when they write nothing (about a sixth of the statement's server time).
WITH saved AS (
{{save_upsert}}
), history AS (
{{save_history}}
)
{{save_answer}};

-- name: position
-- After an ambiguous save (connection lost around COMMIT): did our write land?
SELECT seq, epoch FROM checkpoints WHERE run_id = %(run_id)s;

-- name: end_attempt
-- A step attempt that did not save: a retry (status stays running, retry_at is set), or
-- the run stopping (failed, cancelled, budget_exceeded, incompatible, unknown). The checkpoint's
-- data stays as it is. Fenced like a save; the history row rides along when a step ran.
WITH c AS (
    UPDATE checkpoints
       SET status = %(status)s, error = %(error)s, attempts = attempts + %(attempt)s,
           retry_at = now() + make_interval(secs => %(retry_in)s), updated_at = now()
     WHERE run_id = %(run_id)s AND epoch <= %(epoch)s AND seq = %(seq)s AND status <> 'done'
    RETURNING run_id, attempts, created_at
), history AS (
    INSERT INTO step_history (run_id, seq, cursor, visit, outcome, started_at, worker, epoch,
                              cost_usd, effect_key, error, code_version, run_created)
    SELECT c.run_id, %(seq)s, %(step)s, %(visit)s, %(outcome)s, to_timestamp(%(started)s),
           %(worker)s, %(epoch)s, 0, %(effect_key)s, %(error)s, %(code_version)s, c.created_at
      FROM c WHERE %(step)s::text IS NOT NULL
)
SELECT run_id, attempts FROM c;

-- name: cancel
-- Ask a run to stop. One that no worker holds (pending, waiting, queued) stops at once; a
-- running one stops at its next step boundary, before any further effect. The first
-- cancel's reason and asker are kept (the SET reads the row as it was).
UPDATE checkpoints
   SET cancel_reason = coalesce(cancel_reason, %(reason)s),
       cancelled_by = CASE WHEN cancel_reason IS NULL THEN %(by)s ELSE cancelled_by END,
       status = CASE WHEN status IN ('pending', 'waiting', 'queued')
                     THEN 'cancelled' ELSE status END,
       error = CASE WHEN status IN ('pending', 'waiting', 'queued')
                    THEN %(reason)s ELSE error END,
       updated_at = now()
 WHERE run_id = %(run_id)s AND status IN ('pending', 'running', 'waiting', 'queued')
RETURNING run_id, status;

-- name: signal
-- Store a signal durably (the same signal id twice is one signal); the run's status says
-- whether a worker should be told. No row: no such run.
WITH run AS (
    SELECT run_id, status FROM checkpoints WHERE run_id = %(run_id)s
), stored AS (
    INSERT INTO signals (run_id, signal_id, event, payload, traceparent)
    SELECT run_id, %(signal_id)s, %(event)s, %(payload)s, %(traceparent)s FROM run
    ON CONFLICT (run_id, signal_id) DO NOTHING
    RETURNING run_id
)
SELECT run.status, EXISTS (SELECT 1 FROM stored) AS stored FROM run;

-- name: steer_lock
-- A steer message's first statement: the run's row lock, which numbers its messages in the
-- order they commit (a read between two sees a prefix of them, never a gap it would
-- skip for good). The next statement takes a new snapshot, so it sees the last one's n.
SELECT c.status FROM runs r JOIN checkpoints c USING (run_id)
 WHERE r.run_id = %(run_id)s
   FOR NO KEY UPDATE OF r;

-- name: steer_insert
-- The message, as the run's next; nothing for a run that has ended (terminal).
INSERT INTO steer_messages (run_id, n, message)
SELECT %(run_id)s, coalesce(max(n), 0) + 1, %(message)s
  FROM steer_messages
 WHERE run_id = %(run_id)s
HAVING EXISTS (SELECT 1 FROM checkpoints
                WHERE run_id = %(run_id)s AND status <> ALL (%(terminal)s))
RETURNING n;

-- name: steer_notify
-- A message sent with interrupt=True: its run's calls in flight hear it once it commits
-- (store/steering.py; the payload is the run, the message stays in its table).
SELECT pg_notify(%(channel)s, %(run_id)s) AS notified;

-- name: steers
-- The steer messages of these numbers (a replayed ctx.messages()), in order.
SELECT n, message FROM steer_messages
 WHERE run_id = %(run_id)s AND n = ANY(%(numbers)s)
 ORDER BY n;

-- name: steers_pending
-- The run's steer messages that no journal record of it delivered (ctx.messages() records
-- the numbers of those it read, [1, 2]), oldest first.
SELECT n, message FROM steer_messages
 WHERE run_id = %(run_id)s AND n > (
       SELECT coalesce(max((m #>> '{}')::bigint), 0)
         FROM journal j CROSS JOIN LATERAL jsonb_array_elements(j.result) m
        WHERE j.run_id = %(run_id)s AND j.name = 'cairn.messages'
          AND jsonb_typeof(j.result) = 'array')
 ORDER BY n;

-- name: save_approval
-- `save` for a step whose wait asks for an approval (StepResult.wait with request=): the
-- request's row joins on the row the guarded upsert returned, so it exists exactly when
-- the save does. A standing rule for its workflow and tool decides it in this statement
-- (the audit row names the rule, the signal is stored): the save answers signalled and
-- the run goes on at once, nobody asked.
WITH saved AS (
{{save_upsert}}
{{save_window_history_signal}}
), owner AS (
    SELECT tenant FROM runs WHERE run_id = %(run_id)s
), rule AS (
    SELECT min(rule_id) AS rule_id FROM approval_rules
     WHERE workflow = %(workflow)s AND tool = %(tool)s
       AND (tenant IS NULL OR tenant = (SELECT tenant FROM owner))
    HAVING count(*) > 0
), asked AS (
    INSERT INTO approvals (run_id, seq, event, workflow, tool, request, decided_at, pending,
                           tenant)
    SELECT saved.run_id, %(seq)s, %(wait_event)s, %(workflow)s, %(tool)s, %(request)s,
           CASE WHEN EXISTS (SELECT 1 FROM rule) THEN now() END, NOT EXISTS (SELECT 1 FROM rule),
           (SELECT tenant FROM owner)
      FROM saved
    ON CONFLICT (run_id, seq) DO NOTHING
    RETURNING approval_id, decided_at
), ruled AS (
    INSERT INTO approval_decisions (approval_id, run_id, workflow, tool, decision, payload,
                                    decided_by, rule_id)
    SELECT asked.approval_id, %(run_id)s, %(workflow)s, %(tool)s, 'approve',
           jsonb_build_object('decision', 'approve', 'args', NULL, 'approval_id',
                              asked.approval_id, 'rule_id', rule.rule_id),
           'rule ' || rule.rule_id, rule.rule_id
      FROM asked, rule
    RETURNING approval_id, rule_id, payload
), ruled_signal AS (
    INSERT INTO signals (run_id, signal_id, event, payload)
    SELECT %(run_id)s, 'approval-' || approval_id, %(wait_event)s, payload FROM ruled
    ON CONFLICT (run_id, signal_id) DO NOTHING
)
SELECT run_id, cancel_reason,
       EXISTS (SELECT 1 FROM ruled) OR {{signal_came_first}} AS signalled
  FROM saved;

-- fragment: approval_columns
a.approval_id, a.run_id, a.workflow, a.event, a.tool, a.request, a.created_at

-- fragment: approvals_live
-- The inbox's rows: the pending approvals (undecided, their run still parked on them),
-- read from approvals_pending (or _workflow) alone, in order, up to `limit`. What a list
-- filters on is a column of the row, copied from the run at its save, as workflow is.
SELECT {{approval_columns}}
  FROM approvals a
 WHERE a.pending
   AND (%(workflow)s::text IS NULL OR a.workflow = %(workflow)s)
   AND (%(event)s::text IS NULL OR a.event = %(event)s)
   AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)

-- name: approvals_newest
-- The inbox newest first, keyset-paged on approval_id (`after`: the previous page's last).
{{approvals_live}}
   AND (%(after)s::bigint IS NULL OR a.approval_id < %(after)s)
 ORDER BY a.approval_id DESC
 LIMIT %(limit)s;

-- name: approvals_oldest
-- approvals_newest, oldest first (the queue a team works through).
{{approvals_live}}
   AND (%(after)s::bigint IS NULL OR a.approval_id > %(after)s)
 ORDER BY a.approval_id
 LIMIT %(limit)s;

-- name: approval
-- One approval, its decision (the audit row) if it has one, and whether it still waits
-- for one (undecided, its run parked on it).
SELECT {{approval_columns}}, a.pending AS waiting,
       d.decision, d.payload, d.decided_by, d.rule_id, d.decided_at, d.decided_token,
       d.decided_tenant
  FROM approvals a
  LEFT JOIN approval_decisions d ON d.approval_id = a.approval_id
 WHERE a.approval_id = %(approval_id)s
   AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s);

-- name: decide
-- A decision: the approval marked decided, the audit row (naming who decided: the token
-- and the tenant it acted for) and the signal its run waits on, in one statement (one
-- transaction). The guard is the UPDATE: an approval decided
-- already, or whose run no longer waits on it (pending false), returns no row and nothing
-- is written; of two racing decisions the second waits on the row lock, then finds it
-- decided.
WITH chosen AS (
    UPDATE approvals a SET decided_at = now(), pending = false
     WHERE a.approval_id = %(approval_id)s AND a.pending
       AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)
    RETURNING a.approval_id, a.run_id, a.event, a.workflow, a.tool
), audit AS (
    INSERT INTO approval_decisions (approval_id, run_id, workflow, tool, decision, payload,
                                    decided_by, decided_token, decided_tenant)
    SELECT approval_id, run_id, workflow, tool, %(decision)s, %(payload)s, %(decided_by)s,
           %(token_id)s, %(tenant)s
      FROM chosen
), sent AS (
    INSERT INTO signals (run_id, signal_id, event, payload, traceparent)
    SELECT run_id, 'approval-' || approval_id, event, %(payload)s, %(traceparent)s
      FROM chosen
    ON CONFLICT (run_id, signal_id) DO NOTHING
)
SELECT run_id FROM chosen;

-- name: add_rule
-- A standing rule; the same workflow and tool twice is one rule (created: whether new).
INSERT INTO approval_rules (workflow, tool, created_by, tenant)
VALUES (%(workflow)s, %(tool)s, %(created_by)s, %(tenant)s)
ON CONFLICT (workflow, tool, tenant) DO UPDATE SET workflow = EXCLUDED.workflow
RETURNING rule_id, workflow, tool, created_by, created_at, (xmax = 0) AS created;

-- name: rules
-- Every rule (a tenant's: its own), oldest first.
SELECT rule_id, workflow, tool, created_by, created_at FROM approval_rules
 WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s
 ORDER BY rule_id;

-- name: remove_rule
DELETE FROM approval_rules
 WHERE rule_id = %(rule_id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
RETURNING rule_id;

-- name: cancel_reason
SELECT cancel_reason FROM checkpoints WHERE run_id = %(run_id)s;

-- fragment: run_month
-- The run's month, so a read of its history or journal opens that one partition.
(SELECT created_at FROM checkpoints WHERE run_id = %(run_id)s)

-- name: history
-- A run's step timeline, oldest first (next_cursor: where a saved step went on).
SELECT seq, cursor, visit, outcome, started_at, ended_at, worker, epoch, cost_usd,
       effect_key, error, next_cursor, code_version
  FROM step_history WHERE run_id = %(run_id)s AND run_created = {{run_month}} ORDER BY id;

-- name: was_done
SELECT result FROM effects WHERE key = %(key)s AND done;

-- name: mark_done
-- The effect ran: its done mark (over its intent, if it had one); the first mark stays.
-- Fenced like every write a step makes: only while the run is at the step's seq and no
-- newer epoch has claimed it (a zombie's late mark must not overwrite what an operator
-- resolved, nor mark an effect the new owner reports unknown). `owned` false: fenced.
WITH fence AS (
    SELECT c.run_id FROM checkpoints c
     WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s AND c.epoch <= %(epoch)s
       FOR SHARE
), marked AS (
    INSERT INTO effects AS e (key, run_id, result, epoch)
    SELECT %(key)s, fence.run_id, %(result)s, %(epoch)s FROM fence
    ON CONFLICT (key) DO UPDATE SET result = EXCLUDED.result, epoch = EXCLUDED.epoch,
                                    done = true
     WHERE NOT e.done
    RETURNING key
)
SELECT EXISTS (SELECT 1 FROM fence) AS owned, EXISTS (SELECT 1 FROM marked) AS marked;

-- name: record_intent
-- An at-most-once effect is about to run: its intent, fenced like a save (written only
-- while no newer epoch has claimed the run) and committed before the effect. A retry whose
-- first try committed meets its own intent (same epoch) and gets it back. Nothing back:
-- fenced, or an intent or mark already there (intent_state tells which).
INSERT INTO effects AS e (key, run_id, result, epoch, done)
SELECT %(key)s, c.run_id, NULL, %(epoch)s, false
  FROM checkpoints c
 WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s AND c.epoch <= %(epoch)s
   FOR SHARE OF c
ON CONFLICT (key) DO UPDATE SET epoch = e.epoch
 WHERE e.epoch = EXCLUDED.epoch AND NOT e.done
RETURNING key;

-- name: intent_state
SELECT done, result, epoch FROM effects WHERE key = %(key)s;

-- name: open_intents
-- A run's at-most-once effects whose outcome is unknown: an intent without its mark.
SELECT key, epoch, created_at FROM effects
 WHERE run_id = %(run_id)s AND NOT done
 ORDER BY created_at, key;

-- name: resolve_intents
-- Someone found out what the unknown effects did: done (with their result) or not done
-- (the intents go, so the replay runs the effect); then the run goes on at its cursor.
WITH marked AS (
    UPDATE effects SET done = true, result = %(result)s
     WHERE run_id = %(run_id)s AND NOT done AND %(done)s
    RETURNING key
), dropped AS (
    DELETE FROM effects
     WHERE run_id = %(run_id)s AND NOT done AND NOT %(done)s
    RETURNING key
), rearmed AS (
    UPDATE checkpoints SET status = 'pending', error = NULL, attempts = 0, deliveries = 0,
           retry_at = NULL, updated_at = now()
     WHERE run_id = %(run_id)s AND status = 'unknown'
    RETURNING run_id
)
SELECT (SELECT count(*) FROM rearmed) AS rearmed,
       ARRAY(SELECT key FROM marked UNION ALL SELECT key FROM dropped) AS keys;

-- name: hold
-- In a step's own transaction (ctx.db), right before its fenced write (the save, a call's
-- record) and its COMMIT: from here the transaction holds the run's row, and may sit idle
-- (its process paused) for at most `hold` before the server ends it, so a claim waits no
-- longer than that for a zombie. Not earlier: a step may keep ctx.db open across a long
-- model call, holding nothing of cairn's.
SELECT set_config('idle_in_transaction_session_timeout', %(hold)s, true);

-- name: journal
-- A step visit's recorded calls, in order: what its replay returns without calling.
SELECT pos, name, result, error, cost_usd
  FROM journal
 WHERE run_id = %(run_id)s AND cursor = %(cursor)s AND visit = %(visit)s
   AND run_created = {{run_month}}
 ORDER BY pos;

-- name: calls
-- A run's journaled calls, in the order they were recorded (the run page's list).
SELECT cursor, visit, pos, name, result, error, cost_usd, created_at
  FROM journal WHERE run_id = %(run_id)s AND run_created = {{run_month}}
 ORDER BY created_at, cursor, visit, pos
 LIMIT %(limit)s;

-- name: record_call
-- One call's outcome, fenced like a save: written only while the run is at the step's
-- seq and no newer epoch has claimed it, so a worker that lost the run records nothing.
-- The fence is a share lock on the run's row (as every fenced write's): a claim waits for
-- a record in flight, and a record that waited for a claim sees its epoch and writes
-- nothing. A plain read would let a record whose check passed commit after the claim.
-- A retry whose first try committed (the reply was lost on the way) meets its own row
-- (same epoch, same name) and gets it back: recorded, not fenced.
-- A record is progress: a step killed again and again while its journal grows is not
-- poison, so its delivery count restarts at this delivery (written only when above 1).
-- It returns the run's cancel reason too: the step's check before its next call.
-- run_created is the run's, never changed: one call's key is unique across the months.
-- commit: 'off' commits it asynchronously (a record alone: see record_call), NULL as the
-- session does (a record with the call's own ctx.db writes).
WITH {{record_insert}}
SELECT recorded.pos, c.cancel_reason,
       set_config('synchronous_commit',
                  coalesce(%(commit)s, current_setting('synchronous_commit')), true)
  FROM recorded JOIN checkpoints c ON c.run_id = recorded.run_id;

-- name: record_budgeted_call
-- record_call for a run that spends against budgets (runs.budgets): in the same
-- statement the call's hold is settled (deleted, its worst case out of reserved_usd) and
-- its cost added to each scope's spent_usd, only when this statement wrote the record
-- (not a retry that met its own row: `before` saw it), so the ledger counts what the
-- journal holds, once. crossed: the scopes whose soft limit this call's cost crossed
-- (spend on one scope is serialized by its row lock, so exactly one record crosses it).
WITH before AS (
    SELECT 1 FROM journal j
     WHERE j.run_id = %(run_id)s AND j.cursor = %(cursor)s AND j.visit = %(visit)s
       AND j.pos = %(pos)s
       AND j.run_created = (SELECT created_at FROM checkpoints WHERE run_id = %(run_id)s)
), {{record_insert}},
new AS (
    SELECT run_id FROM recorded WHERE NOT EXISTS (SELECT 1 FROM before)
), hold AS (
    DELETE FROM budget_holds h USING new
     WHERE h.run_id = new.run_id AND h.cursor = %(cursor)s
       AND h.visit = %(visit)s AND h.pos = %(pos)s
    RETURNING h.scope, h.usd, h.tokens
), spend AS (
    -- A tenant's budget whose period moved on since its last check counts from nothing
    -- (budget_roll's reset, for a record that lands first).
    UPDATE budgets b
       SET spent_usd = CASE WHEN b.period_start < {{period_now}} THEN 0 ELSE b.spent_usd END
                       + %(cost_usd)s,
           spent_tokens = CASE WHEN b.period_start < {{period_now}} THEN 0
                               ELSE b.spent_tokens END + %(tokens)s,
           period_start = greatest(b.period_start, {{period_now}}),
           reserved_usd = greatest(b.reserved_usd
                                   - coalesce((SELECT usd FROM hold WHERE hold.scope = b.scope), 0), 0),
           reserved_tokens = greatest(b.reserved_tokens
                                      - coalesce((SELECT tokens FROM hold WHERE hold.scope = b.scope), 0), 0)
      FROM new
     WHERE b.scope = ANY(%(budgets)s)
    RETURNING b.scope,
              b.soft IS NOT NULL AND (
                  (b.spent_usd >= b.soft * b.limit_usd
                   AND b.spent_usd - %(cost_usd)s < b.soft * b.limit_usd)
                  OR (b.spent_tokens >= b.soft * b.limit_tokens
                      AND b.spent_tokens - %(tokens)s < b.soft * b.limit_tokens)) AS crossed
)
SELECT recorded.pos, c.cancel_reason,
       (SELECT coalesce(array_agg(scope ORDER BY scope), '{}') FROM spend WHERE crossed)
           AS crossed,
       set_config('synchronous_commit',
                  coalesce(%(commit)s, current_setting('synchronous_commit')), true)
  FROM recorded JOIN checkpoints c ON c.run_id = recorded.run_id;

-- fragment: record_insert
-- The record itself, fenced (see record_call), and the delivery count it restarts.
recorded AS (
    INSERT INTO journal AS j (run_id, cursor, visit, pos, name, seq, epoch, result, error,
                              cost_usd, run_created)
    SELECT c.run_id, %(cursor)s, %(visit)s, %(pos)s, %(name)s, c.seq, %(epoch)s, %(result)s,
           %(error)s, %(cost_usd)s, c.created_at
      FROM checkpoints c
     WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s AND c.epoch <= %(epoch)s
       FOR SHARE OF c
    ON CONFLICT (run_id, cursor, visit, pos, run_created) DO UPDATE SET epoch = j.epoch
     WHERE j.epoch = EXCLUDED.epoch AND j.name = EXCLUDED.name
    RETURNING j.run_id, j.pos
), progress AS (
    UPDATE checkpoints c SET deliveries = 1
      FROM recorded
     WHERE c.run_id = recorded.run_id AND c.deliveries > 1
)

-- fragment: run_shown
-- What Client.get shows: position, result and error, not the window.
SELECT c.run_id, r.workflow, c.status, c.cursor, c.seq, c.cost_usd, c.resumes, c.error,
       r.created_at, c.updated_at, r.input, c.state, r.parent_id, r.concurrency_key,
       r.priority, r.traceparent, r.forked_from, r.forked_at, c.started_version, r.tenant,
       CASE WHEN c.status = 'waiting' THEN c.wait_until END AS wakes_at, c.cancelled_by
  FROM checkpoints c JOIN runs r USING (run_id)

-- name: get_run
-- One run, as Client.get shows it.
{{run_shown}}
 WHERE c.run_id = %(run_id)s;

-- name: get_runs
-- The runs a client's waits read at once (store/waits.py): those just waited for, those
-- whose notification came, those due a look; one statement for all of them (bench waits:
-- 700 runs stopped in one commit woke their 700 waiters within 60-100 ms).
{{run_shown}}
 WHERE c.run_id = ANY(%(run_ids)s::text[]);

-- name: children
-- A run's children, each spawn's in the order the step listed them (their ids end in
-- their key; `ord` is the place the spawn gave them).
SELECT c.run_id, r.workflow, c.status, c.cursor, c.seq, c.cost_usd, c.resumes, c.error,
       r.created_at, c.updated_at, c.state, r.parent_id, r.parent_seq, r.concurrency_key,
       r.priority, c.started_version, r.tenant
  FROM runs r JOIN checkpoints c USING (run_id)
 WHERE r.parent_id = %(run_id)s
   AND (%(seq)s::bigint IS NULL OR r.parent_seq = %(seq)s)
 ORDER BY r.parent_seq, r.created_at, r.run_id
 LIMIT %(limit)s;

-- name: gathered
-- After a child stopped: is its parent waiting for a spawn that has now gathered (its
-- signal written, not yet consumed)? Then someone must wake the parent.
SELECT EXISTS (
    SELECT 1 FROM checkpoints c JOIN signals s
        ON s.run_id = c.run_id AND s.event = c.wait_event AND s.consumed_seq IS NULL
     WHERE c.run_id = %(run_id)s AND c.status = 'waiting'
) AS ready;

-- name: list_runs
-- Newest first, a page at a time: `after` is the last run of the previous page (keyset
-- paging on runs_newest, so page 1,000 costs what page 1 does).
SELECT c.run_id, r.workflow, c.status, c.cursor, c.seq, c.cost_usd, c.resumes, c.error,
       r.created_at, c.updated_at, r.parent_id, r.concurrency_key, r.priority,
       c.started_version, r.tenant
  FROM runs r JOIN checkpoints c USING (run_id)
 WHERE (%(status)s::text IS NULL OR c.status = %(status)s)
   AND (%(workflow)s::text IS NULL OR r.workflow = %(workflow)s)
   AND (%(since)s::timestamptz IS NULL OR r.created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR r.created_at < %(until)s)
   AND (%(after)s::text IS NULL
        OR (r.created_at, r.run_id) < (SELECT a.created_at, a.run_id FROM runs a
                                         WHERE a.run_id = %(after)s))
 ORDER BY r.created_at DESC, r.run_id DESC
 LIMIT %(limit)s;

-- name: list_runs_by_status
-- list_runs with a status: the same order and keyset, walked on checkpoints_status_newest
-- (checkpoints.created_at is a copy of the run's), so a rare status costs what the first
-- page does.
SELECT c.run_id, r.workflow, c.status, c.cursor, c.seq, c.cost_usd, c.resumes, c.error,
       c.created_at, c.updated_at, r.parent_id, r.concurrency_key, r.priority,
       c.started_version, r.tenant
  FROM checkpoints c JOIN runs r USING (run_id)
 WHERE c.status = %(status)s
   AND (%(workflow)s::text IS NULL OR r.workflow = %(workflow)s)
   AND (%(tenant)s::text IS NULL OR r.tenant = %(tenant)s)
   AND (%(since)s::timestamptz IS NULL OR c.created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR c.created_at < %(until)s)
   AND (%(after)s::text IS NULL
        OR (c.created_at, c.run_id) < (SELECT a.created_at, a.run_id FROM runs a
                                         WHERE a.run_id = %(after)s))
 ORDER BY c.created_at DESC, c.run_id DESC
 LIMIT %(limit)s;

-- name: list_runs_of_tenant
-- list_runs for one tenant (no status): the same order and keyset, walked on
-- runs_tenant_newest, so a small tenant's page costs what a large one's does.
SELECT c.run_id, r.workflow, c.status, c.cursor, c.seq, c.cost_usd, c.resumes, c.error,
       r.created_at, c.updated_at, r.parent_id, r.concurrency_key, r.priority,
       c.started_version, r.tenant
  FROM runs r JOIN checkpoints c USING (run_id)
 WHERE r.tenant = %(tenant)s
   AND (%(workflow)s::text IS NULL OR r.workflow = %(workflow)s)
   AND (%(since)s::timestamptz IS NULL OR r.created_at >= %(since)s)
   AND (%(until)s::timestamptz IS NULL OR r.created_at < %(until)s)
   AND (%(after)s::text IS NULL
        OR (r.created_at, r.run_id) < (SELECT a.created_at, a.run_id FROM runs a
                                         WHERE a.run_id = %(after)s))
 ORDER BY r.created_at DESC, r.run_id DESC
 LIMIT %(limit)s;

-- name: count_by_status_of_tenant
-- One tenant's runs per status, counted on its rows (the folded totals are the fleet's).
SELECT c.status, count(*)::bigint AS n, 0::bigint AS unfolded
  FROM runs r JOIN checkpoints c USING (run_id)
 WHERE r.tenant = %(tenant)s
 GROUP BY c.status;

-- name: count_by_status
-- Runs per status: the folded totals plus the deltas not folded yet, read in one snapshot,
-- so exact without scanning checkpoints (migration 0003). `unfolded`: how many delta rows
-- were summed (the same on every row), which tells the reader whether to fold.
WITH summed AS (
    SELECT status, n, 0 AS unfolded FROM run_counts
    UNION ALL
    SELECT status, n, 1 FROM run_count_deltas
)
SELECT status, sum(n)::bigint AS n, sum(sum(unfolded)) OVER ()::bigint AS unfolded
  FROM summed GROUP BY status HAVING sum(n) <> 0;

-- name: fold_counts
-- Move up to `batch` delta rows into the totals. SKIP LOCKED: two folders (the reaper,
-- a reader) never wait on each other's rows nor fold a row twice; totals are upserted in
-- status order, so two folds cannot deadlock on them.
WITH moved AS (
    DELETE FROM run_count_deltas
     WHERE ctid = ANY (ARRAY(SELECT ctid FROM run_count_deltas
                              LIMIT %(batch)s FOR UPDATE SKIP LOCKED))
    RETURNING status, n
), summed AS (
    SELECT status, sum(n) AS n, count(*) AS rows FROM moved GROUP BY status
), folded AS (
    INSERT INTO run_counts AS c (status, n)
    SELECT status, n FROM summed ORDER BY status
    ON CONFLICT (status) DO UPDATE SET n = c.n + EXCLUDED.n
)
SELECT coalesce(sum(rows), 0)::bigint AS n FROM summed;

-- name: stalled
-- One page of the reaper's walk: the runs after %(after)s in run_id order, up to %(limit)s,
-- that a worker took (running, or pending with an epoch: claimed and its first step not
-- saved, or sent again after a wait or a hand-off; from their partial index,
-- checkpoints_taken) or that wait with a signal nobody picked up (from the unconsumed
-- signals' partial index, so a million sleeping runs cost the walk nothing). Never-taken
-- pending runs are not walked: their messages are the broker's, counted (unclaimed).
-- Each row says whether it looks abandoned (stale): not saved for a while (a save proves
-- the lease was live within half a TTL), or its signal waits unseen that long. Tested
-- after the page is cut, so a page reads %(limit)s rows however few of them are stale.
-- A run with a retry scheduled is left alone until the retry is overdue: one retry chain
-- per run, never one more per reaper pass. A wait whose time came is `wake`'s, never the
-- reaper's: a send that left the run waiting would let the wake send it a second time.
-- A waiting run handed back for a key its worker lacked (unclaim) is left to that
-- worker's own sends until its hold (retry_at) is over.
WITH page AS (
    (SELECT run_id FROM checkpoints
      WHERE (status = 'running' OR (status = 'pending' AND epoch > 0))
        AND run_id > %(after)s
      ORDER BY run_id
      LIMIT %(limit)s)
    UNION
    (SELECT s.run_id FROM signals s
       JOIN checkpoints c ON c.run_id = s.run_id AND c.wait_event = s.event
      WHERE s.consumed_seq IS NULL AND c.status = 'waiting' AND s.run_id > %(after)s
      ORDER BY s.run_id
      LIMIT %(limit)s)
    ORDER BY run_id
    LIMIT %(limit)s
)
SELECT c.run_id, c.status, c.epoch, c.updated_at,
       CASE WHEN c.status = 'waiting'
            THEN EXISTS (SELECT 1 FROM signals s
                          WHERE s.run_id = c.run_id AND s.event = c.wait_event
                            AND s.consumed_seq IS NULL
                            AND s.created_at < now() - make_interval(secs => %(running_after)s))
            ELSE c.updated_at < now() - make_interval(secs => %(running_after)s)
       END
       AND (c.retry_at IS NULL
            OR c.retry_at < now() - make_interval(secs => %(running_after)s)) AS stale
  FROM page JOIN checkpoints c USING (run_id)
 ORDER BY c.run_id;

-- name: wake
-- Waiting runs whose time came (a sleep's end, a wait's timeout, a debounce's quiet
-- period), up to `batch`, the most overdue first, each moved out of waiting (to pending,
-- with its wait kept: the delivery reads it as over) by this one statement, which the
-- caller commits before it sends them. The guard: rows another waker has locked are
-- skipped, and a row it woke is no longer waiting, so two beats' passes wake a run once.
-- A waker killed after its commit leaves pending runs with no message: the reaper sends
-- them (`stalled`: claimed before they slept; a debounced run never taken is counted
-- among `unclaimed_count`'s, which the broker then holds one message too few for).
-- Walks checkpoints_waiting (wait_until, status = 'waiting'): due rows only. The batch is
-- an array so the update finds its rows by primary key: joined on a subquery instead, the
-- planner hash-joined it with a seq scan of every waiting row (4 ms at 21,000 sleepers).
-- The statement counts its own moves, one delta row per status (`counted`), and tells the
-- row trigger so (cairn.counted, migration 0016): the trigger's two rows per run took
-- 4.7 of a pass's 16.6 ms at 1,000 due (bench/sleep.py). The setting is made in
-- `counting`, which every updated row joins, so it is on before the first row moves; it
-- ends with the transaction.
WITH counting AS MATERIALIZED (
    SELECT set_config('cairn.counted', 'on', true) AS counted
), woken AS (
    UPDATE checkpoints c SET status = 'pending', updated_at = now()
      FROM counting
     WHERE c.run_id = ANY (ARRAY(
               SELECT run_id FROM checkpoints
                WHERE status = 'waiting' AND wait_until < now()
                ORDER BY wait_until
                LIMIT %(batch)s
                  FOR UPDATE SKIP LOCKED))
       AND c.status = 'waiting'
    RETURNING c.run_id
), counted AS (
    INSERT INTO run_count_deltas (status, n)
    SELECT moved.status, moved.n * (SELECT count(*) FROM woken)
      FROM (VALUES ('waiting', -1), ('pending', 1)) AS moved (status, n)
     WHERE EXISTS (SELECT 1 FROM woken)
)
SELECT run_id FROM woken;

-- name: unclaimed_count
-- How many runs were sent over %(older_than)s s ago and never taken by a worker, counted up
-- to %(upto)s: the reaper weighs them against the messages the broker holds (a backlog
-- holds one each). From their partial index alone (checkpoints_untaken): 100,000 of them
-- after an outage are counted without reading a row. Their age is their created_at (the
-- enqueue that sent them; a debounced run's is older than its send, which its wake pass
-- makes a moment after its commit).
SELECT count(*) AS n FROM (
    SELECT 1 FROM checkpoints
     WHERE status = 'pending' AND epoch = 0
       AND created_at < now() - make_interval(secs => %(older_than)s)
     LIMIT %(upto)s
) AS waiting;

-- name: unclaimed
-- Runs sent but never taken by a worker, oldest first, a page after (%(after_at)s,
-- %(after_id)s) on their partial index (checkpoints_untaken): when there are more of them
-- than messages the broker holds, the oldest without a message out are the ones whose
-- message was lost.
SELECT run_id, epoch, updated_at, created_at FROM checkpoints
 WHERE status = 'pending' AND epoch = 0
   AND created_at < now() - make_interval(secs => %(older_than)s)
   AND (created_at, run_id) > (coalesce(%(after_at)s::timestamptz, '-infinity'), %(after_id)s)
 ORDER BY created_at, run_id
 LIMIT %(limit)s;

-- name: routes
-- Which of these runs are pinned, and to which version: where a resume of each is sent
-- (`cairn.resume.v.<version>`; the others to the shared resume queue).
SELECT run_id, started_version AS version FROM checkpoints
 WHERE run_id = ANY(%(run_ids)s::text[]) AND pinned AND started_version IS NOT NULL;

-- name: pinned_runs
-- Pinned runs under way per version, from the partial index checkpoints_pinned: what
-- `cairn deploy status` lists and the reaper's orphan report weighs against live workers.
SELECT started_version AS version, count(*) AS runs,
       count(*) FILTER (WHERE status = 'waiting') AS waiting
  FROM checkpoints
 WHERE pinned AND status IN ('pending', 'running', 'waiting')
 GROUP BY started_version
 ORDER BY started_version;

-- name: unchanged
-- The reaper's second look, after its lease check: which runs are as it listed them
-- (same epoch, same updated_at)? One claimed, saved or ended since had a worker on it,
-- whose lease may be gone by the check because the run ended: not to be sent again.
SELECT c.run_id
  FROM unnest(%(run_ids)s::text[], %(epochs)s::bigint[], %(updated)s::timestamptz[])
       AS s (run_id, epoch, updated_at)
  JOIN checkpoints c
    ON c.run_id = s.run_id AND c.epoch = s.epoch AND c.updated_at = s.updated_at;

-- name: sweep
-- Retention, one batch: up to `batch` terminal runs older than the horizon go, with
-- their window, ledger, history, signal, journal, budget, approval (with its audit row;
-- the standing rules stay) and graph rows. Called until a batch comes back short,
-- so each transaction (and its cascade) stays small. History and journal rows of a run
-- from a month wholly behind the horizon stay: that month's partition is dropped whole
-- once its last run is gone (cairn_drop_partitions); but those in the default partition,
-- which nothing drops.
WITH old AS (
    SELECT run_id FROM checkpoints
     WHERE status IN ('done', 'failed', 'cancelled', 'budget_exceeded')
       AND updated_at < now() - make_interval(secs => %(older_than)s)
     LIMIT %(batch)s
), gone AS (
    DELETE FROM runs r USING old WHERE r.run_id = old.run_id
    RETURNING r.run_id, r.created_at,
              r.created_at >= date_trunc('month', now() - make_interval(secs => %(older_than)s),
                                         'UTC') AS rows
), w AS (
    DELETE FROM window_messages m USING gone WHERE m.run_id = gone.run_id
), e AS (
    DELETE FROM effects f USING gone WHERE f.run_id = gone.run_id
), h AS (
    DELETE FROM step_history s USING gone
     WHERE gone.rows AND s.run_id = gone.run_id AND s.run_created = gone.created_at
), hd AS (
    DELETE FROM step_history_default s USING gone
     WHERE NOT gone.rows AND s.run_id = gone.run_id AND s.run_created = gone.created_at
), sig AS (
    DELETE FROM signals s USING gone WHERE s.run_id = gone.run_id
), bu AS (  -- the budget a run was enqueued with (its holds cascade)
    DELETE FROM budgets b USING gone WHERE b.scope = 'run:' || gone.run_id
), ga AS (
    DELETE FROM gathers g USING gone WHERE g.parent_id = gone.run_id
), j AS (
    DELETE FROM journal j USING gone
     WHERE gone.rows AND j.run_id = gone.run_id AND j.run_created = gone.created_at
), jd AS (
    DELETE FROM journal_default j USING gone
     WHERE NOT gone.rows AND j.run_id = gone.run_id AND j.run_created = gone.created_at
), gc AS (  -- a graph the run drove (cairn.langgraph.workflow: its thread is the run id)
    DELETE FROM graph_checkpoints g USING gone WHERE g.thread_id = gone.run_id
), gb AS (
    DELETE FROM graph_blobs g USING gone WHERE g.thread_id = gone.run_id
), gw AS (
    DELETE FROM graph_writes g USING gone WHERE g.thread_id = gone.run_id
), ad AS (  -- its approvals' audit rows, found through them (by run_id, then by id); the
            -- approvals themselves go by their foreign key's cascade
    DELETE FROM approval_decisions d USING approvals a, gone
     WHERE a.run_id = gone.run_id AND d.approval_id = a.approval_id
)
SELECT count(*) AS n FROM gone;

-- name: partitions
-- After a sweep: step_history's and the journal's partitions made three months ahead
-- (migration 0018), and the months behind none of whose runs is left dropped whole.
SELECT cairn_partitions(now(), 3) AS made,
       ARRAY(SELECT cairn_drop_partitions()) AS dropped;

-- name: ping
SELECT 1 AS ok;

-- name: graph_put_blob
-- A channel's value at a version (LangGraph writes each version once).
INSERT INTO graph_blobs (thread_id, ns, channel, version, type, blob, base_version, length)
VALUES (%(thread_id)s, %(ns)s, %(channel)s, %(version)s, %(type)s, %(blob)s,
        %(base_version)s, %(length)s)
ON CONFLICT (thread_id, ns, channel, version) DO NOTHING;

-- fragment: graph_row
%(thread_id)s, %(ns)s, %(checkpoint_id)s, %(parent_id)s, %(type)s, %(checkpoint)s,
%(versions)s, %(metadata)s, %(run_id)s, %(epoch)s

-- name: graph_put
-- A checkpoint outside a cairn run: LangGraph's upsert (a fork from an older one is fine).
INSERT INTO graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type, checkpoint,
                               versions, metadata, run_id, epoch)
VALUES ({{graph_row}})
ON CONFLICT (thread_id, ns, checkpoint_id) DO UPDATE
   SET type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint,
       versions = EXCLUDED.versions, metadata = EXCLUDED.metadata
RETURNING checkpoint_id;

-- name: graph_put_fenced
-- A checkpoint inside a cairn run (graph_fence has locked the run's row in this
-- transaction): only as the next checkpoint of its thread (its parent the latest, its id
-- later), so a worker that lost the run neither forks nor rewinds the thread.
INSERT INTO graph_checkpoints (thread_id, ns, checkpoint_id, parent_id, type, checkpoint,
                               versions, metadata, run_id, epoch)
SELECT {{graph_row}}
 WHERE (SELECT max(g.checkpoint_id) FROM graph_checkpoints g
         WHERE g.thread_id = %(thread_id)s AND g.ns = %(ns)s)
       IS NOT DISTINCT FROM %(parent_id)s::text
   AND (%(parent_id)s::text IS NULL OR %(checkpoint_id)s > %(parent_id)s)
ON CONFLICT (thread_id, ns, checkpoint_id) DO NOTHING
RETURNING checkpoint_id;

-- name: graph_own
-- A fenced put that wrote nothing: its own earlier try, whose commit reply was lost?
SELECT 1 FROM graph_checkpoints
 WHERE thread_id = %(thread_id)s AND ns = %(ns)s AND checkpoint_id = %(checkpoint_id)s
   AND run_id = %(run_id)s AND epoch = %(epoch)s;

-- name: graph_fence
-- A put's or a task's writes inside a run: the run is still the writer's (its lease
-- epoch), and stays so until this transaction ends. The first statement of the
-- transaction, before anything is written: the share lock makes a claim wait for the
-- writes in flight (and a put that waited for a claim finds the new epoch and writes
-- nothing), so a zombie's late commit can neither fork the thread nor block the new owner
-- on rows it holds. The transaction may then sit idle (its process paused) for at most
-- `hold` before the server ends it, so a claim waits no longer than that for a zombie.
SELECT set_config('idle_in_transaction_session_timeout', %(hold)s, true)
  FROM checkpoints WHERE run_id = %(run_id)s AND epoch = %(epoch)s FOR SHARE;

-- name: graph_put_write
INSERT INTO graph_writes (thread_id, ns, checkpoint_id, task_id, idx, channel, type, blob,
                          task_path)
VALUES (%(thread_id)s, %(ns)s, %(checkpoint_id)s, %(task_id)s, %(idx)s, %(channel)s,
        %(type)s, %(blob)s, %(task_path)s)
ON CONFLICT (thread_id, ns, checkpoint_id, task_id, idx) DO NOTHING;

-- name: graph_put_write_replace
-- LangGraph's special channels (error, interrupt, resume...): the last write wins.
INSERT INTO graph_writes (thread_id, ns, checkpoint_id, task_id, idx, channel, type, blob,
                          task_path)
VALUES (%(thread_id)s, %(ns)s, %(checkpoint_id)s, %(task_id)s, %(idx)s, %(channel)s,
        %(type)s, %(blob)s, %(task_path)s)
ON CONFLICT (thread_id, ns, checkpoint_id, task_id, idx) DO UPDATE
   SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob,
       task_path = EXCLUDED.task_path;

-- fragment: graph_columns
thread_id, ns, checkpoint_id, parent_id, type, checkpoint, versions, metadata

-- name: graph_get
-- One checkpoint, or the thread's latest.
SELECT {{graph_columns}} FROM graph_checkpoints
 WHERE thread_id = %(thread_id)s AND ns = %(ns)s
   AND (%(checkpoint_id)s::text IS NULL OR checkpoint_id = %(checkpoint_id)s)
 ORDER BY checkpoint_id DESC
 LIMIT 1;

-- name: graph_list
-- Checkpoints newest first, by thread, namespace, id, metadata (contains) and before.
SELECT {{graph_columns}} FROM graph_checkpoints
 WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
   AND (%(ns)s::text IS NULL OR ns = %(ns)s)
   AND (%(checkpoint_id)s::text IS NULL OR checkpoint_id = %(checkpoint_id)s)
   AND (%(filter)s::jsonb IS NULL OR metadata @> %(filter)s::jsonb)
   AND (%(before)s::text IS NULL OR checkpoint_id < %(before)s)
 ORDER BY checkpoint_id DESC
 LIMIT %(limit)s;

-- name: graph_blobs_of
-- The blobs of a checkpoint's channel versions, each with the chain of earlier versions
-- its list extends, oldest first: the caller concatenates a chain into the whole list.
WITH RECURSIVE chain AS (
    SELECT b.channel, b.version, b.base_version, b.type, b.blob, 0 AS depth
      FROM jsonb_each_text(%(versions)s::jsonb) v
      JOIN graph_blobs b ON b.thread_id = %(thread_id)s AND b.ns = %(ns)s
                        AND b.channel = v.key AND b.version = v.value
    UNION ALL
    SELECT b.channel, b.version, b.base_version, b.type, b.blob, c.depth + 1
      FROM chain c
      JOIN graph_blobs b ON b.thread_id = %(thread_id)s AND b.ns = %(ns)s
                        AND b.channel = c.channel AND b.version = c.base_version
)
SELECT channel, version, type, blob FROM chain ORDER BY channel, depth DESC;

-- name: graph_writes_of
SELECT task_id, channel, type, blob, task_path, idx FROM graph_writes
 WHERE thread_id = %(thread_id)s AND ns = %(ns)s AND checkpoint_id = %(checkpoint_id)s
 ORDER BY task_path, task_id, idx;

-- name: graph_delete_threads
WITH cp AS (DELETE FROM graph_checkpoints WHERE thread_id = ANY(%(thread_ids)s) RETURNING 1),
     bl AS (DELETE FROM graph_blobs WHERE thread_id = ANY(%(thread_ids)s) RETURNING 1),
     wr AS (DELETE FROM graph_writes WHERE thread_id = ANY(%(thread_ids)s) RETURNING 1)
SELECT (SELECT count(*) FROM cp) AS checkpoints;

-- name: graph_delete_for_runs
-- The checkpoints LangGraph's runs wrote (metadata run_id) and their writes. Blobs stay:
-- a later checkpoint may hold a version, or a list that extends one.
WITH gone AS (
    DELETE FROM graph_checkpoints WHERE metadata ->> 'run_id' = ANY(%(run_ids)s)
    RETURNING thread_id, ns, checkpoint_id
), wr AS (
    DELETE FROM graph_writes w USING gone g
     WHERE w.thread_id = g.thread_id AND w.ns = g.ns AND w.checkpoint_id = g.checkpoint_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS checkpoints;

-- name: graph_copy_thread
WITH cp AS (
    INSERT INTO graph_checkpoints
    SELECT %(target)s, ns, checkpoint_id, parent_id, type, checkpoint, versions, metadata,
           run_id, epoch
      FROM graph_checkpoints WHERE thread_id = %(source)s
    ON CONFLICT DO NOTHING RETURNING 1
), bl AS (
    INSERT INTO graph_blobs
    SELECT %(target)s, ns, channel, version, type, blob, base_version, length
      FROM graph_blobs WHERE thread_id = %(source)s
    ON CONFLICT DO NOTHING RETURNING 1
), wr AS (
    INSERT INTO graph_writes
    SELECT %(target)s, ns, checkpoint_id, task_id, idx, channel, type, blob, task_path
      FROM graph_writes WHERE thread_id = %(source)s
    ON CONFLICT DO NOTHING RETURNING 1
)
SELECT (SELECT count(*) FROM cp) AS checkpoints;

-- name: graph_prune_keep_latest
-- All but each namespace's latest checkpoint, with their writes. Blobs stay: the kept
-- checkpoint's lists may extend older versions.
WITH keep AS (
    SELECT DISTINCT ON (thread_id, ns) thread_id, ns, checkpoint_id
      FROM graph_checkpoints WHERE thread_id = ANY(%(thread_ids)s)
     ORDER BY thread_id, ns, checkpoint_id DESC
), gone AS (
    DELETE FROM graph_checkpoints g
     WHERE g.thread_id = ANY(%(thread_ids)s)
       AND NOT EXISTS (SELECT 1 FROM keep k WHERE k.thread_id = g.thread_id
                          AND k.ns = g.ns AND k.checkpoint_id = g.checkpoint_id)
    RETURNING g.thread_id, g.ns, g.checkpoint_id
), wr AS (
    DELETE FROM graph_writes w USING gone g
     WHERE w.thread_id = g.thread_id AND w.ns = g.ns AND w.checkpoint_id = g.checkpoint_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS checkpoints;

-- fragment: snapshot
-- The checkpoint run %(origin)s saved at seq %(at)s: the history row of the step that
-- saved it (or a fork's or a rewind's mark), with the state as of then (the last row up
-- to it that changed it). Rows from before migration 0013 have no next_cursor: none.
    SELECT h.id, h.next_cursor, h.visits, h.win_start, h.win_end, h.total_cost,
           h.flow_version, h.epoch,
           (SELECT s.state FROM step_history s
             WHERE s.run_id = h.run_id AND s.id <= h.id AND s.state IS NOT NULL
             ORDER BY s.id DESC LIMIT 1) AS state
      FROM step_history h
     WHERE h.run_id = %(origin)s AND h.seq = %(at)s - 1 AND h.next_cursor IS NOT NULL
       AND h.outcome IN ('saved', 'forked', 'rewound')
     ORDER BY h.id DESC LIMIT 1

-- name: run_input
-- A run's input (a fork's patch is merged with it in Python, opened).
SELECT input FROM runs WHERE run_id = %(run_id)s;

-- name: fork
-- A new run from the checkpoint another run saved at seq `at`: its input (the caller's
-- patched copy, else the origin's as stored), its state, cursor, visits and window
-- there, at that seq, pending (done, if the origin ended there: no step is left to run);
-- marked in its history. Its cost starts at 0: it spends
-- its own. The origin is not touched.
WITH snap AS (
{{snapshot}}
), src AS (
    SELECT workflow, input, max_cost_usd, priority, tenant FROM runs WHERE run_id = %(origin)s
), new_run AS (
    INSERT INTO runs (run_id, workflow, input, max_cost_usd, priority, traceparent,
                      forked_from, forked_at, tenant)
    SELECT %(run_id)s, src.workflow, coalesce(%(input)s::jsonb, src.input), src.max_cost_usd,
           src.priority,
           %(traceparent)s, %(origin)s, %(at)s, src.tenant
      FROM src, snap
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id, created_at
), checkpoint AS (
    INSERT INTO checkpoints (run_id, seq, cursor, state, visits, win_start, win_end, cost_usd,
                             version, status, flow_version)
    SELECT new_run.run_id, %(at)s, snap.next_cursor, snap.state, snap.visits, snap.win_start,
           snap.win_end, 0, %(version)s,
           CASE WHEN snap.next_cursor = 'done' THEN 'done' ELSE 'pending' END, snap.flow_version
      FROM new_run, snap
), copied AS (
    INSERT INTO window_messages (run_id, idx, message)
    SELECT new_run.run_id, w.idx, w.message
      FROM new_run, snap, window_messages w
     WHERE w.run_id = %(origin)s AND w.idx >= snap.win_start AND w.idx < snap.win_end
), mark AS (
    INSERT INTO step_history (run_id, seq, cursor, visit, outcome, started_at, worker, epoch,
                              cost_usd, error, next_cursor, visits, win_start, win_end,
                              total_cost, flow_version, state, run_created)
    SELECT new_run.run_id, %(at)s - 1, snap.next_cursor, 0, 'forked', now(), 'client', 0, 0,
           to_jsonb('forked from ' || %(origin)s || ' at seq ' || %(at)s), snap.next_cursor,
           snap.visits, snap.win_start, snap.win_end, 0, snap.flow_version, snap.state,
           new_run.created_at
      FROM new_run, snap
)
SELECT (SELECT run_id FROM new_run) AS run_id, EXISTS (SELECT 1 FROM snap) AS found,
       EXISTS (SELECT 1 FROM src) AS origin_found;

-- name: rewind
-- Move a stopped run back to the checkpoint it saved at seq `at`, in place: its state,
-- cursor and window there, at a new seq (seq only grows: a zombie of the old timeline is
-- fenced), pending (done, at the checkpoint it ended with: no step is left to run). Its
-- visits go past every visit it ever made of each step, so the steps it replays get new
-- visit numbers: new idempotency keys, no journal records to replay. Its cost so far
-- stays (it was spent). Marked in its history.
WITH snap AS (
{{snapshot}}
), cur AS (
    SELECT seq, status, epoch, cost_usd, created_at FROM checkpoints
     WHERE run_id = %(origin)s FOR UPDATE
), used AS (
    SELECT cursor, max(visit) + 1 AS next FROM (
        SELECT cursor, visit FROM step_history WHERE run_id = %(origin)s
        UNION ALL
        SELECT cursor, visit FROM journal WHERE run_id = %(origin)s
    ) v GROUP BY cursor
), visits AS (
    SELECT coalesce(jsonb_object_agg(k, greatest(coalesce((snap.visits ->> k)::int, 0),
                                                 coalesce(used.next, 0))), '{}') AS v
      FROM snap,
           (SELECT jsonb_object_keys(snap.visits) AS k FROM snap
            UNION SELECT cursor FROM used) keys
      LEFT JOIN used ON used.cursor = keys.k
), moved AS (
    UPDATE checkpoints c
       SET seq = cur.seq + 1, cursor = snap.next_cursor, state = snap.state,
           visits = visits.v, win_start = snap.win_start, win_end = snap.win_end,
           flow_version = snap.flow_version,
           status = CASE WHEN snap.next_cursor = 'done' THEN 'done' ELSE 'pending' END,
           error = NULL,
           attempts = 0, deliveries = 0, retry_at = NULL, cancel_reason = NULL,
           cancelled_by = NULL, wait_event = NULL, wait_until = NULL, wait_timeout_cursor = NULL,
           updated_at = now()
      FROM cur, snap, visits
     WHERE c.run_id = %(origin)s
       AND cur.status IN ('done', 'failed', 'cancelled', 'budget_exceeded', 'incompatible',
                          'unknown')
    RETURNING c.seq, c.visits
), mark AS (
    INSERT INTO step_history (run_id, seq, cursor, visit, outcome, started_at, worker, epoch,
                              cost_usd, error, next_cursor, visits, win_start, win_end,
                              total_cost, flow_version, state, run_created)
    SELECT %(origin)s, moved.seq - 1, snap.next_cursor, 0, 'rewound', now(), 'client',
           cur.epoch, 0, to_jsonb('rewound to seq ' || %(at)s), snap.next_cursor, moved.visits,
           snap.win_start, snap.win_end, cur.cost_usd, snap.flow_version, snap.state,
           cur.created_at
      FROM moved, snap, cur
)
SELECT (SELECT status FROM cur) AS status, (SELECT seq FROM moved) AS seq,
       EXISTS (SELECT 1 FROM snap) AS found;

-- name: forks
-- A run's forks, oldest first.
SELECT c.run_id, r.workflow, c.status, c.cursor, c.seq, c.cost_usd, c.resumes, c.error,
       r.created_at, c.updated_at, r.forked_from, r.forked_at, c.started_version, r.tenant
  FROM runs r JOIN checkpoints c USING (run_id)
 WHERE r.forked_from = %(run_id)s
 ORDER BY r.created_at, r.run_id;

-- name: clock
-- The database's time: what updated_at is compared with, whatever the caller's clock says.
SELECT clock_timestamp() AS now;

-- name: replayable
-- Client.replay's choice, and its dry run: the workflow's runs stopped in one of the
-- statuses since a time (by when they stopped: their checkpoint's last change), before
-- `until` (the replay's own start, so a run that fails again is not picked again in the
-- same replay), oldest first.
SELECT c.run_id, r.workflow, c.status, c.cursor, c.seq, c.cost_usd, c.resumes, c.error,
       r.created_at, c.updated_at, r.parent_id, r.concurrency_key, r.priority
  FROM checkpoints c JOIN runs r USING (run_id)
 WHERE c.status = ANY(%(statuses)s) AND r.workflow = %(workflow)s
   AND c.updated_at >= %(since)s AND c.updated_at < %(until)s
 ORDER BY c.updated_at, c.run_id
 LIMIT %(limit)s;

-- name: replay
-- Re-arm a batch of replayable runs at their cursor (their last saved step), retries
-- counted afresh, as enqueueing a failed run again does; a run another transaction holds
-- is skipped, so two replays at once re-arm each run once. A keyed run takes a free slot
-- or queues (the checkpoints_run_rearmed trigger). Returns each run as it stopped.
WITH picked AS (
    SELECT c.run_id FROM checkpoints c JOIN runs r USING (run_id)
     WHERE c.status = ANY(%(statuses)s) AND r.workflow = %(workflow)s
       AND c.updated_at >= %(since)s AND c.updated_at < %(until)s
     ORDER BY c.updated_at, c.run_id
     LIMIT %(limit)s
       FOR UPDATE OF c SKIP LOCKED
), old AS (
    SELECT c.run_id, r.workflow, c.status, c.cursor, c.seq, c.cost_usd, c.resumes, c.error,
           r.created_at, c.updated_at, r.parent_id, r.concurrency_key, r.priority
      FROM picked JOIN checkpoints c USING (run_id) JOIN runs r USING (run_id)
), armed AS (
    UPDATE checkpoints c
       SET status = 'pending', error = NULL, attempts = 0, deliveries = 0, retry_at = NULL,
           updated_at = now()
      FROM picked WHERE c.run_id = picked.run_id
    RETURNING c.run_id
)
SELECT old.* FROM old JOIN armed USING (run_id) ORDER BY old.updated_at, old.run_id;

-- name: live_cursors
-- Where runs that may still go on stand, per workflow: a deploy must have these steps
-- (`cairn db check`). Failed and incompatible runs count: enqueueing them again resumes
-- them at their cursor; so does a waiting run's timeout cursor.
SELECT r.workflow, x.cursor, count(*) AS runs
  FROM checkpoints c JOIN runs r USING (run_id),
       LATERAL (VALUES (c.cursor), (c.wait_timeout_cursor)) AS x (cursor)
 WHERE c.status IN ('pending', 'running', 'waiting', 'queued', 'failed', 'incompatible',
                    'unknown')
   AND x.cursor IS NOT NULL
 GROUP BY r.workflow, x.cursor
 ORDER BY r.workflow, x.cursor;

-- name: agent_session_items
-- An Agents SDK session's newest `limit` items (all when NULL), oldest first.
SELECT item FROM (
    SELECT id, item FROM agent_session_items
     WHERE session_id = %(session_id)s
     ORDER BY id DESC
     LIMIT %(limit)s
) newest
 ORDER BY id;

-- name: agent_session_add
-- Append items (a jsonb array, each a payload) to a session in their order, as one statement. Inside a
-- step it runs in the step's transaction (ctx.db): the turn commits with the checkpoint,
-- or not at all for a killed step or a zombie whose save is fenced.
INSERT INTO agent_session_items (session_id, item, run_id)
SELECT %(session_id)s, e.item, %(run_id)s
  FROM unnest(%(items)s::jsonb[]) WITH ORDINALITY AS e (item, n)
 ORDER BY e.n;

-- name: agent_session_pop
-- Remove a session's newest item and return it (no row: the session is empty).
DELETE FROM agent_session_items
 WHERE id = (SELECT max(id) FROM agent_session_items WHERE session_id = %(session_id)s)
RETURNING item;

-- name: agent_session_clear
DELETE FROM agent_session_items WHERE session_id = %(session_id)s;

-- name: notify_enqueued
-- Enqueue in the caller's transaction (store/transactional.py): beat's dispatcher hears
-- the run id once that transaction commits (Postgres holds a NOTIFY until then, and drops
-- it at a rollback) and sends the run.
SELECT pg_notify('cairn_enqueued', %(run_id)s);

-- name: enqueue_savepoint
-- Enqueue in the caller's transaction: its statements in a savepoint of that transaction,
-- never a transaction block of ours (on an idle connection that is not autocommit a block
-- would open the caller's transaction and commit it at its end). On such a connection this
-- is the statement that begins the caller's transaction, which the caller's commit ends.
SAVEPOINT cairn_enqueue;

-- name: enqueue_rollback
-- A refused enqueue (RunIdConflict, a value Postgres refuses): undone, and the caller's
-- transaction usable again, with whatever the caller wrote before it.
ROLLBACK TO SAVEPOINT cairn_enqueue;

-- name: enqueue_release
-- The enqueue's statements are the caller's transaction's now: they commit or roll back
-- with it.
RELEASE SAVEPOINT cairn_enqueue;

-- name: token_create
-- An API token (cairn tokens create): only its secret's SHA-256 is kept.
INSERT INTO api_tokens (id, name, tenant, admin, hash)
VALUES (%(id)s, %(name)s, %(tenant)s, %(admin)s, %(hash)s)
RETURNING id, name, tenant, admin, created_at, revoked_at;

-- name: token_get
-- A token by its id (the part of the token before its secret), with the hash to compare.
SELECT id, name, tenant, admin, hash, created_at, revoked_at FROM api_tokens
 WHERE id = %(id)s;

-- name: token_list
-- Every token, oldest first, without its hash.
SELECT id, name, tenant, admin, created_at, revoked_at FROM api_tokens
 ORDER BY created_at, id;

-- name: token_revoke
-- Revoke a token; the first revocation's time stays. Its pages' sessions end with it.
WITH ended AS (DELETE FROM page_sessions WHERE token_id = %(id)s)
UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = %(id)s
RETURNING id, name, tenant, admin, created_at, revoked_at;

-- name: page_session_create
-- A page session (a login): the SHA-256 of its cookie's random value, what it was made
-- from, and when it ends. The expired ones go in the same statement.
WITH swept AS (DELETE FROM page_sessions WHERE expires_at <= now())
INSERT INTO page_sessions (hash, token_id, owner, expires_at)
VALUES (%(hash)s, %(token_id)s, %(owner)s, now() + make_interval(secs => %(seconds)s))
RETURNING expires_at;

-- name: page_session_get
-- A live page session: unexpired, and its token (if it has one) live and still the one
-- it was made from (owner = its hash), with the tenant it acts for. No row: no session.
SELECT s.token_id, s.owner, t.tenant, coalesce(t.admin, true) AS admin
  FROM page_sessions s
  LEFT JOIN api_tokens t ON t.id = s.token_id
 WHERE s.hash = %(hash)s AND s.expires_at > now()
   AND (s.token_id IS NULL OR (t.revoked_at IS NULL AND t.hash = s.owner));

-- name: page_session_end
-- Log out: the session's row goes, so its cookie, wherever copied, opens nothing.
DELETE FROM page_sessions WHERE hash = %(hash)s RETURNING token_id;

-- name: create_budget
-- Enqueue with budget_usd: the tree's ledger row, with the run (same transaction). A run
-- enqueued again keeps its row as it is (raise_budget changes the limit).
INSERT INTO budgets (scope, limit_usd, limit_tokens, soft)
SELECT %(budget_scope)s, %(budget_usd)s, %(budget_tokens)s, %(budget_soft)s
 WHERE %(budget_scope)s::text IS NOT NULL
ON CONFLICT (scope) DO NOTHING
RETURNING scope;

-- name: budget_lock
-- The first statement of a budget check: the run's scopes' rows locked (in scope order,
-- so two checks over the same scopes never deadlock). Every later statement of the
-- transaction reads after the lock (READ COMMITTED: a fresh snapshot each), so two
-- children checking at once are checked one after the other.
SELECT count(*) AS n FROM (
    SELECT scope FROM budgets WHERE scope = ANY(%(budgets)s) ORDER BY scope FOR UPDATE
) locked;

-- name: budget_roll
-- A tenant's budget in a later UTC day or month than the one it counts: what was spent is
-- the last period's, so it starts again at nothing. Reserved stays: the calls in flight
-- still hold it, and their records spend it in the new period. After budget_lock (and
-- before reading a budget): the UPDATE's own lock makes two rolls one. A record landing
-- in a new period before any check rolls it too (record_budgeted_call).
UPDATE budgets b
   SET spent_usd = 0, spent_tokens = 0, period_start = {{period_now}}
 WHERE b.scope = ANY(%(budgets)s) AND b.period_start < {{period_now}}
RETURNING b.scope;

-- fragment: period_now
-- The start of the UTC day or month budget b (a tenant's) counts now; NULL for a tree's.
date_trunc(b.period, now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'

-- name: budget_release
-- Holds that can no longer be settled: their run saved past the step that made them (a
-- call abandoned with its attempt), or stopped. Released before the check.
WITH dead AS (
    DELETE FROM budget_holds h USING checkpoints c
     WHERE h.scope = ANY(%(budgets)s) AND c.run_id = h.run_id
       AND (c.seq > h.seq OR c.status IN ('done', 'failed', 'cancelled', 'budget_exceeded',
                                          'incompatible', 'unknown'))
    RETURNING h.scope, h.usd, h.tokens
), freed AS (
    SELECT scope, sum(usd) AS usd, sum(tokens) AS tokens FROM dead GROUP BY scope
)
UPDATE budgets b SET reserved_usd = greatest(b.reserved_usd - freed.usd, 0),
                     reserved_tokens = greatest(b.reserved_tokens - freed.tokens, 0)
  FROM freed WHERE b.scope = freed.scope
RETURNING b.scope;

-- name: budget_reserve
-- The check and the hold, after budget_lock: a call is admitted when, on every scope,
-- spent + reserved + its worst case stays within the limit; then it holds its worst case
-- on each. A call that holds already (an attempt killed in it; this is the next) was
-- admitted then: its hold is renewed unchecked. Fenced like a record (record_call): a
-- worker whose run moved on or was claimed by a newer epoch holds nothing (fenced: true),
-- so a zombie that passed its lease check before the lease lapsed leaves no hold behind.
-- One row: fenced, or the first scope over its limit with the figures (scope NULL:
-- admitted).
WITH fence AS (
    SELECT c.run_id FROM checkpoints c
     WHERE c.run_id = %(run_id)s AND c.seq = %(seq)s
       AND c.epoch <= %(epoch)s
       FOR SHARE OF c
), scopes AS (
    SELECT scope, limit_usd, spent_usd, reserved_usd, limit_tokens, spent_tokens,
           reserved_tokens
      FROM budgets WHERE scope = ANY(%(budgets)s) AND EXISTS (SELECT 1 FROM fence)
), mine AS (
    SELECT scope, usd, tokens FROM budget_holds
     WHERE run_id = %(run_id)s AND cursor = %(cursor)s AND visit = %(visit)s AND pos = %(pos)s
), over AS (
    SELECT s.* FROM scopes s
     WHERE s.scope NOT IN (SELECT scope FROM mine)
       AND (s.spent_usd + s.reserved_usd + %(usd)s > s.limit_usd
            OR s.spent_tokens + s.reserved_tokens + %(tokens)s > s.limit_tokens)
), held AS (
    INSERT INTO budget_holds (scope, run_id, cursor, visit, pos, seq, usd, tokens)
    SELECT scope, %(run_id)s, %(cursor)s, %(visit)s, %(pos)s, %(seq)s, %(usd)s, %(tokens)s
      FROM scopes
     WHERE NOT EXISTS (SELECT 1 FROM over)
    ON CONFLICT (run_id, cursor, visit, pos, scope)
    DO UPDATE SET usd = EXCLUDED.usd, tokens = EXCLUDED.tokens, seq = EXCLUDED.seq
), counted AS (
    UPDATE budgets b
       SET reserved_usd = b.reserved_usd + %(usd)s - coalesce(m.usd, 0),
           reserved_tokens = b.reserved_tokens + %(tokens)s - coalesce(m.tokens, 0)
      FROM scopes s LEFT JOIN mine m USING (scope)
     WHERE b.scope = s.scope AND NOT EXISTS (SELECT 1 FROM over)
)
SELECT NOT EXISTS (SELECT 1 FROM fence) AS fenced, o.*
  FROM (SELECT 1) one LEFT JOIN (
      SELECT scope, limit_usd, spent_usd, reserved_usd, limit_tokens, spent_tokens,
             reserved_tokens
        FROM over ORDER BY scope LIMIT 1
  ) o ON true;

-- name: budget_of
-- A budget's figures (Client.budget, raise_budget's answer).
SELECT scope, limit_usd, soft, spent_usd, reserved_usd, limit_tokens, spent_tokens,
       reserved_tokens, period, period_start
  FROM budgets WHERE scope = %(scope)s;

-- name: set_tenant_budget
-- A tenant's budget set (created, or its limits given changed: set_usd, set_tokens, as
-- raise_budget). A new one counts from the start of this UTC day or month; one whose
-- period changes counts the new period from its start, keeping what it spent so far
-- (spend is kept in total, not by day). No row when a new budget would have no limit
-- (an existing one may change its soft fraction or period alone). The row proposed takes
-- the existing one's limits where none is given: the limits' CHECK holds for it before
-- ON CONFLICT turns it into the update.
INSERT INTO budgets AS b (scope, limit_usd, limit_tokens, soft, period, period_start)
SELECT %(scope)s, coalesce(%(limit_usd)s::double precision, o.limit_usd),
       coalesce(%(limit_tokens)s::bigint, o.limit_tokens), %(soft)s::double precision,
       coalesce(%(period)s, 'day'),
       date_trunc(coalesce(%(period)s, 'day'), now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
  FROM (SELECT 1) one LEFT JOIN budgets o ON o.scope = %(scope)s
 WHERE %(limit_usd)s::double precision IS NOT NULL OR %(limit_tokens)s::bigint IS NOT NULL
    OR o.scope IS NOT NULL
ON CONFLICT (scope) DO UPDATE
   SET limit_usd = CASE WHEN %(set_usd)s THEN %(limit_usd)s ELSE b.limit_usd END,
       limit_tokens = CASE WHEN %(set_tokens)s THEN %(limit_tokens)s ELSE b.limit_tokens END,
       soft = coalesce(%(soft)s, b.soft),
       period = coalesce(%(period)s, b.period),
       period_start = CASE WHEN coalesce(%(period)s, b.period) = b.period THEN b.period_start
                           ELSE date_trunc(%(period)s, now() AT TIME ZONE 'UTC')
                                AT TIME ZONE 'UTC' END
RETURNING scope;

-- name: rearm_tenant_budget
-- A tenant's budget set: its runs stopped over budget re-armed at their cursor, as
-- raise_budget re-arms a tree's (the call that stopped each is checked again, against
-- every budget it spends on). The caller sends them.
UPDATE checkpoints c SET {{rearm_over_budget}}
  FROM runs r
 WHERE c.status = 'budget_exceeded' AND r.run_id = c.run_id AND r.tenant = %(tenant)s
RETURNING c.run_id;

-- name: delete_tenant_budget
-- A tenant's budget deleted (Client.delete_tenant_budget): its holds go with it (ON DELETE
-- CASCADE), and its runs' next checks and records no longer find the row, so they stop
-- spending against it at once; their next claim leaves its scope out. Returns it as it
-- stood, a later period's spend counted from nothing (budget_roll's reset, unwritten). No
-- row: the tenant had no budget. rearm_tenant_budget follows in the same transaction.
DELETE FROM budgets b WHERE b.scope = %(scope)s
RETURNING b.scope, b.limit_usd, b.soft, b.reserved_usd, b.limit_tokens, b.reserved_tokens,
          b.period,
          CASE WHEN b.period_start < {{period_now}} THEN 0 ELSE b.spent_usd END AS spent_usd,
          CASE WHEN b.period_start < {{period_now}} THEN 0 ELSE b.spent_tokens END
              AS spent_tokens,
          greatest(b.period_start, {{period_now}}) AS period_start;

-- fragment: rearm_over_budget
-- A run stopped over budget re-armed at its cursor (as enqueueing a failed run again).
status = 'pending', error = NULL, attempts = 0, deliveries = 0, retry_at = NULL,
       updated_at = now()

-- name: roll_tenant_budgets
-- The wake pass's (CheckpointStore.roll_budgets): tenant budgets whose UTC day or month
-- is over start the new one (budget_roll's reset, up to `batch` of them; rows a check
-- holds are skipped, it rolls them itself), and up to `batch` runs stopped over a tenant's
-- budget in an earlier period than its budget counts now are re-armed: the caller sends
-- them. Whoever rolled the budget (this pass, a check, a record, a read), a run stopped
-- before the period began goes on. Only a stop by the tenant's scope: its error names it
-- (Context._hold), so a run stopped by its own tree's budget stays stopped. A run stopped
-- in this period is not re-armed: the budget that stopped it still stands. The budgets
-- read in `stopped` are the statement's snapshot, before `rolled`: the new start is
-- taken from `rolled`. Re-armed rows are locked (SKIP LOCKED): two passes re-arm a run
-- once. Walks checkpoints_status_newest's budget_exceeded rows only.
WITH rolled AS (
    UPDATE budgets b SET spent_usd = 0, spent_tokens = 0, period_start = {{period_now}}
     WHERE b.scope = ANY (ARRAY(
               SELECT scope FROM budgets b
                WHERE b.period IS NOT NULL AND b.period_start < {{period_now}}
                ORDER BY scope
                LIMIT %(batch)s
                  FOR UPDATE SKIP LOCKED))
       AND b.period_start < {{period_now}}
    RETURNING b.scope, b.period_start
), stopped AS (
    SELECT c.run_id FROM checkpoints c
      JOIN runs r ON r.run_id = c.run_id
      JOIN budgets b ON b.scope = 'tenant:' || r.tenant
      LEFT JOIN rolled n ON n.scope = b.scope
     WHERE c.status = 'budget_exceeded' AND b.period IS NOT NULL
       AND c.updated_at < coalesce(n.period_start, b.period_start)
       AND strpos(c.error #>> '{}', ' budget ' || b.scope || ' has ') > 0
     ORDER BY c.updated_at
     LIMIT %(batch)s
       FOR UPDATE OF c SKIP LOCKED
)
UPDATE checkpoints c SET {{rearm_over_budget}}
  FROM stopped
 WHERE c.run_id = stopped.run_id AND c.status = 'budget_exceeded'
RETURNING c.run_id;

-- name: raise_budget
-- New limits for the scope (set_usd, set_tokens: which; a limit set to NULL is none), and its runs stopped over budget re-armed at their cursor
-- (as enqueueing a failed run again does): the caller sends them.
WITH b AS (
    UPDATE budgets
       SET limit_usd = CASE WHEN %(set_usd)s THEN %(limit_usd)s ELSE limit_usd END,
           limit_tokens = CASE WHEN %(set_tokens)s THEN %(limit_tokens)s ELSE limit_tokens END
     WHERE scope = %(scope)s
    RETURNING scope
)
UPDATE checkpoints c SET {{rearm_over_budget}}
  FROM b, runs r
 WHERE r.budgets @> ARRAY[b.scope] AND c.run_id = r.run_id AND c.status = 'budget_exceeded'
RETURNING c.run_id;
