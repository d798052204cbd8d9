-- The OpenAI Agents SDK's sessions (cairn.openai_agents.CairnSession): a conversation's
-- items, oldest first by id, so one chat spans runs. Written inside a step through the
-- step's own transaction (ctx.db), so a turn's items commit with its checkpoint or not at
-- all; run_id says which run wrote an item (NULL: written outside a run).
CREATE TABLE agent_session_items (
    id          bigserial PRIMARY KEY,
    session_id  text NOT NULL,
    item        jsonb NOT NULL,
    run_id      text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
-- get_items (the newest n, in order), pop_item (the newest), clear_session.
CREATE INDEX agent_session_items_session ON agent_session_items (session_id, id);
