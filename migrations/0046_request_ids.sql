-- Issue 38, item 2: retries that never double. A write tool called with a
-- `request_id` (a UUID the caller chose) records it here in the same
-- transaction as the write, with the answer it gave: a retry with the same id
-- from the same window returns that answer and changes nothing; the same id
-- with other arguments (`digest`: the tool's name and its arguments without
-- `request_id`, as JSON with sorted keys, SHA-256) or another tool is refused,
-- naming the first call. A refused or failed write rolls back with its row, so
-- its retry runs again.
--
-- Ids are the window's: (team, agent, window label). A row older than 24 h
-- no longer counts (a retry after it runs anew): the pruner deletes them in
-- batches through the index on created_at, and a new call over a stale row
-- takes its place.
CREATE TABLE request_ids (
    team_id       uuid        NOT NULL REFERENCES teams (id),
    agent_id      uuid        NOT NULL,
    window_label  text        NOT NULL,
    request_id    uuid        NOT NULL,
    tool          text        NOT NULL CHECK (octet_length(tool) BETWEEN 1 AND 64),
    digest        text        NOT NULL,
    answer        jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, agent_id, window_label, request_id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id)
);
-- The pruner's batches, oldest first.
CREATE INDEX request_ids_created_at ON request_ids (created_at);
