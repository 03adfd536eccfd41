-- Attachments on messages and tasks, the per-team byte quota they count
-- against, and an index for the digest. The quota row is the lock two
-- concurrent uploads take turns on, so they cannot both take the last bytes.

CREATE TABLE team_quotas (
    team_id                 uuid   PRIMARY KEY REFERENCES teams (id),
    attachment_bytes_limit  bigint NOT NULL CHECK (attachment_bytes_limit >= 0),
    attachment_bytes_used   bigint NOT NULL DEFAULT 0 CHECK (attachment_bytes_used >= 0)
);

CREATE TABLE attachments (
    id                uuid        PRIMARY KEY,
    team_id           uuid        NOT NULL REFERENCES teams (id),
    message_id        uuid,
    task_id           uuid,
    filename          text        NOT NULL CHECK (octet_length(filename) BETWEEN 1 AND 255),
    content_type      text        NOT NULL CHECK (octet_length(content_type) BETWEEN 1 AND 127),
    size_bytes        integer     NOT NULL CHECK (size_bytes BETWEEN 0 AND 262144),
    data              bytea       NOT NULL CHECK (octet_length(data) = size_bytes),
    sha256            bytea       NOT NULL CHECK (length(sha256) = 32),
    uploaded_by       uuid        NOT NULL,
    uploaded_session  text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((message_id IS NULL) <> (task_id IS NULL)),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, message_id) REFERENCES messages (team_id, id),
    FOREIGN KEY (team_id, task_id) REFERENCES tasks (team_id, id),
    FOREIGN KEY (team_id, uploaded_by) REFERENCES agents (team_id, id)
);
CREATE INDEX attachments_message ON attachments (team_id, message_id) WHERE message_id IS NOT NULL;
CREATE INDEX attachments_task ON attachments (team_id, task_id) WHERE task_id IS NOT NULL;

-- team_digest reads a period of channel activity.
CREATE INDEX messages_channel_recent ON messages (team_id, created_at) WHERE channel_id IS NOT NULL;
