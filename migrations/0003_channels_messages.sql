-- Channels, messages (channel posts and direct messages) and per-window read
-- cursors.
--
-- Reading order is (xact_id, seq): the writing transaction's id, then the
-- row's sequence. Readers only return rows whose transaction is below the
-- snapshot's xmin horizon, i.e. every transaction that could still commit a
-- row ordered before them has finished. So a cursor never passes a message
-- that commits late: a row from a slow transaction is simply returned on the
-- next read, never skipped.

CREATE TABLE channels (
    id          uuid        PRIMARY KEY,
    team_id     uuid        NOT NULL REFERENCES teams (id),
    name        text        NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    topic       text        CHECK (octet_length(topic) <= 256),
    created_by  uuid        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, name),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, created_by) REFERENCES agents (team_id, id)
);

CREATE TABLE messages (
    id                 uuid        PRIMARY KEY,
    team_id            uuid        NOT NULL REFERENCES teams (id),
    seq                bigint      GENERATED ALWAYS AS IDENTITY,
    xact_id            bigint      NOT NULL DEFAULT (pg_current_xact_id()::text::bigint),
    channel_id         uuid,
    sender_id          uuid        NOT NULL,
    sender_session     text        NOT NULL,
    -- Direct messages: the recipient agent; its window, or NULL for every window.
    recipient_id       uuid,
    recipient_session  text,
    body               text        NOT NULL CHECK (octet_length(body) BETWEEN 1 AND 1048576),
    announce           boolean     NOT NULL DEFAULT false,
    is_question        boolean     NOT NULL DEFAULT false,
    reply_to           uuid,
    metadata           jsonb       CHECK (metadata IS NULL OR jsonb_typeof(metadata) = 'object'),
    created_at         timestamptz NOT NULL DEFAULT now(),
    search             tsvector    GENERATED ALWAYS AS (to_tsvector('simple', body)) STORED,
    CHECK ((channel_id IS NULL) <> (recipient_id IS NULL)),
    CHECK (recipient_session IS NULL OR recipient_id IS NOT NULL),
    CHECK (NOT announce OR channel_id IS NOT NULL),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, channel_id) REFERENCES channels (team_id, id),
    FOREIGN KEY (team_id, sender_id) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, recipient_id) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, reply_to) REFERENCES messages (team_id, id)
);
CREATE INDEX messages_channel_order ON messages (team_id, channel_id, xact_id, seq) WHERE channel_id IS NOT NULL;
CREATE INDEX messages_dm_order ON messages (team_id, recipient_id, xact_id, seq) WHERE recipient_id IS NOT NULL;
CREATE INDEX messages_team_order ON messages (team_id, xact_id, seq);
CREATE INDEX messages_reply_to ON messages (team_id, reply_to) WHERE reply_to IS NOT NULL;
CREATE INDEX messages_search ON messages USING gin (search);

-- One position per (agent, window, scope): `all`, `inbox`, or `#<channel>`.
CREATE TABLE read_cursors (
    team_id     uuid        NOT NULL,
    agent_id    uuid        NOT NULL,
    session     text        NOT NULL,
    scope       text        NOT NULL CHECK (length(scope) BETWEEN 1 AND 80),
    last_xact   bigint      NOT NULL,
    last_seq    bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, agent_id, session, scope),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id)
);
