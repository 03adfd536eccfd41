-- Publication through an outbox, the durable inbox of references, and the
-- records of moves between backends (see ../shared/seeds and the Publication,
-- Backends and Inbox sections of ../shared/spec/conversations.md).

-- One slot per message accepted on the outbox path, written in the send's
-- transaction. pending -> leased -> (deleted when stored | pending again |
-- failed). A lease is fenced by `generation`: a worker settles only the
-- generation it leased, and only while its lease has not expired.
CREATE TABLE conversation_outbox (
    message_id        uuid        PRIMARY KEY,
    team_id           uuid        NOT NULL,
    conversation_id   uuid        NOT NULL,
    backend           text        NOT NULL CHECK (backend IN ('postgres', 'jetstream')),
    payload           text        NOT NULL,
    payload_bytes     integer     NOT NULL CHECK (payload_bytes BETWEEN 0 AND 1048576),
    -- Presented to the backend on every attempt (JetStream: Nats-Msg-Id).
    publish_key       uuid        NOT NULL UNIQUE,
    state             text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'leased', 'failed')),
    generation        bigint      NOT NULL DEFAULT 0,
    attempts          integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    leased_by         text,
    lease_expires_at  timestamptz,
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (team_id, message_id) REFERENCES conversation_messages (team_id, id),
    FOREIGN KEY (team_id, conversation_id) REFERENCES conversations (team_id, id)
);
CREATE INDEX conversation_outbox_due ON conversation_outbox (next_attempt_at, created_at)
    WHERE state IN ('pending', 'leased');
CREATE INDEX conversation_outbox_team ON conversation_outbox (team_id, state);
CREATE INDEX conversation_outbox_conversation ON conversation_outbox (conversation_id)
    WHERE state <> 'failed';

-- The body sweep walks stored, non-postgres messages oldest first.
CREATE INDEX conversation_messages_sweep ON conversation_messages (created_at, id)
    WHERE backend <> 'postgres' AND body <> '';
CREATE INDEX conversation_messages_uncertain ON conversation_messages (team_id)
    WHERE uncertain_at IS NOT NULL;

-- References owed to a recipient window: "message M (seq S) from X is in
-- conversation C" at confirmation, and "your message M was acknowledged by Y"
-- to a sender on JetStream conversations. Never a body. `delivered_at` is
-- written by confirm_inbox_delivery before the broker is acked; PostgreSQL
-- never expires what is owed, so anything a broker lost is rebuilt from here.
CREATE TABLE inbox_references (
    id                 uuid        PRIMARY KEY,
    team_id            uuid        NOT NULL,
    -- Deterministic per window (agent id + session label): survives re-registration.
    recipient_key      text        NOT NULL CHECK (recipient_key ~ '^[0-9a-f]{32}$'),
    recipient_id       uuid        NOT NULL,
    recipient_session  text        NOT NULL,
    kind               text        NOT NULL CHECK (kind IN ('message', 'receipt')),
    conversation_id    uuid        NOT NULL,
    message_id         uuid        NOT NULL,
    seq                bigint      NOT NULL,
    -- message: the sender's address; receipt: who acknowledged.
    actor              text        NOT NULL,
    -- receipt: 'acknowledged' or 'resolved'; '' for a message reference.
    receipt            text        NOT NULL DEFAULT '' CHECK (receipt IN ('', 'acknowledged', 'resolved')),
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- Published to the team's inbox stream (JetStream teams only).
    published_at       timestamptz,
    broker_seq         bigint,
    -- The broker's ack subject of the latest hand-out through the consumer,
    -- acked once `delivered` is written.
    broker_ack         text,
    -- The open hand-out, if any: one per reference.
    handed_out_at      timestamptz,
    delivered_at       timestamptz,
    CHECK ((kind = 'receipt') = (receipt <> '')),
    UNIQUE (team_id, recipient_key, kind, message_id, receipt, actor),
    FOREIGN KEY (team_id, message_id) REFERENCES conversation_messages (team_id, id),
    FOREIGN KEY (team_id, conversation_id) REFERENCES conversations (team_id, id),
    FOREIGN KEY (team_id, recipient_id) REFERENCES agents (team_id, id)
);
CREATE INDEX inbox_references_owed ON inbox_references (team_id, recipient_key, created_at)
    WHERE delivered_at IS NULL;
CREATE INDEX inbox_references_unpublished ON inbox_references (created_at)
    WHERE published_at IS NULL AND delivered_at IS NULL;

-- Moves of one conversation's bodies between backends (../shared/seeds/001).
-- At most one open run per conversation.
CREATE TABLE conversation_migrations (
    id               uuid        PRIMARY KEY,
    team_id          uuid        NOT NULL,
    conversation_id  uuid        NOT NULL,
    direction        text        NOT NULL CHECK (direction IN ('to_jetstream', 'to_postgres')),
    state            text        NOT NULL DEFAULT 'planned'
                                 CHECK (state IN ('planned', 'copying', 'verified', 'cut_over', 'failed')),
    -- When this run paused the conversation's writes (an open run with a
    -- pause owns it; cut_over_at - paused_at is how long writes waited).
    paused_at        timestamptz,
    messages_moved   integer     NOT NULL DEFAULT 0,
    bytes_moved      bigint      NOT NULL DEFAULT 0,
    error            text,
    started_by       text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    cut_over_at      timestamptz,
    failed_at        timestamptz,
    FOREIGN KEY (team_id, conversation_id) REFERENCES conversations (team_id, id)
);
CREATE UNIQUE INDEX conversation_migrations_one_open ON conversation_migrations (conversation_id)
    WHERE state IN ('planned', 'copying', 'verified');

CREATE TABLE conversation_migration_items (
    migration_id     uuid        NOT NULL REFERENCES conversation_migrations (id),
    message_id       uuid        NOT NULL,
    team_id          uuid        NOT NULL,
    body_sha256      bytea       NOT NULL CHECK (length(body_sha256) = 32),
    bytes            integer     NOT NULL CHECK (bytes >= 0),
    -- Where the copy landed on the target, once written.
    target_locator   text,
    -- planned (checksum recorded, nothing written) -> copied -> verified | failed.
    state            text        NOT NULL DEFAULT 'planned'
                                 CHECK (state IN ('planned', 'copied', 'verified', 'failed')),
    last_error       text,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (migration_id, message_id),
    FOREIGN KEY (team_id, message_id) REFERENCES conversation_messages (team_id, id)
);
CREATE INDEX conversation_migration_items_message ON conversation_migration_items (message_id);
