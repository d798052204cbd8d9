-- LangGraph's checkpoints on cairn's store (cairn.langgraph.CairnSaver): one row a
-- checkpoint, its channels' values as versioned blobs, and the pending writes of its tasks.
-- Values are LangGraph's serializer's bytes; metadata is JSON, for list()'s filters.
CREATE TABLE graph_checkpoints (
    thread_id       text NOT NULL,
    ns              text NOT NULL DEFAULT '',
    checkpoint_id   text NOT NULL,             -- LangGraph's ids sort in time order
    parent_id       text,
    type            text NOT NULL,
    checkpoint      bytea NOT NULL,            -- with its small values inline, not its blobs
    versions        jsonb NOT NULL DEFAULT '{}', -- channel -> version of each value in a blob
    metadata        jsonb NOT NULL DEFAULT '{}',
    run_id          text,                      -- the cairn run that wrote it, if any
    epoch           bigint,                    -- and that run's lease epoch then
    PRIMARY KEY (thread_id, ns, checkpoint_id)
);
CREATE INDEX graph_checkpoints_runs ON graph_checkpoints ((metadata ->> 'run_id'));

-- A channel's value at a version. A list that extends the value of an earlier version is
-- stored as the tail it appends (base_version: that version; length: the whole list's),
-- so a message history costs each step only its new messages.
CREATE TABLE graph_blobs (
    thread_id       text NOT NULL,
    ns              text NOT NULL DEFAULT '',
    channel         text NOT NULL,
    version         text NOT NULL,
    type            text NOT NULL,
    blob            bytea,
    base_version    text,
    length          integer,
    PRIMARY KEY (thread_id, ns, channel, version)
);

CREATE TABLE graph_writes (
    thread_id       text NOT NULL,
    ns              text NOT NULL DEFAULT '',
    checkpoint_id   text NOT NULL,
    task_id         text NOT NULL,
    idx             integer NOT NULL,
    channel         text NOT NULL,
    type            text NOT NULL,
    blob            bytea NOT NULL,
    task_path       text NOT NULL DEFAULT '',
    PRIMARY KEY (thread_id, ns, checkpoint_id, task_id, idx)
);
