-- Conversations on PostgreSQL: the team capability, projects and their
-- grants, conversations, memberships per window, messages with a gap-free
-- sequence, per-recipient receipts, and the conversation audit log.
--
-- The message columns are shaped for what comes after the synchronous path
-- (see ../shared/seeds): each message records its authoritative backend, its
-- publication state, the locator of its confirmed body, the body's SHA-256,
-- and tombstones; a conversation records its publication mode and a write
-- pause. A released body is '' (never NULL), as the body sweep leaves it.
--
-- Lock order for every writer of a conversation: the conversation row first
-- (FOR UPDATE: it is also the sequence allocator), then member rows, then
-- messages and receipts.

ALTER TABLE teams
    ADD COLUMN conversations_enabled boolean NOT NULL DEFAULT false,
    ADD COLUMN conversation_backend  text    NOT NULL DEFAULT 'postgres'
        CHECK (conversation_backend IN ('postgres', 'jetstream'));

CREATE TABLE projects (
    id          uuid        PRIMARY KEY,
    team_id     uuid        NOT NULL REFERENCES teams (id),
    name        text        NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    created_by  uuid        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, name),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, created_by) REFERENCES agents (team_id, id)
);

-- Access to a project is an explicit grant per agent.
CREATE TABLE project_grants (
    team_id     uuid        NOT NULL,
    project_id  uuid        NOT NULL,
    agent_id    uuid        NOT NULL,
    granted_by  uuid        NOT NULL,
    granted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (team_id, project_id, agent_id),
    FOREIGN KEY (team_id, project_id) REFERENCES projects (team_id, id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, granted_by) REFERENCES agents (team_id, id)
);
CREATE INDEX project_grants_agent ON project_grants (team_id, agent_id);

CREATE TABLE conversations (
    id               uuid        PRIMARY KEY,
    team_id          uuid        NOT NULL REFERENCES teams (id),
    title            text        NOT NULL CHECK (octet_length(title) BETWEEN 1 AND 200),
    visibility       text        NOT NULL CHECK (visibility IN ('private', 'project')),
    project_id       uuid,
    created_by       uuid        NOT NULL,
    created_session  text        NOT NULL,
    -- The sequence allocator: a send sets last_seq = last_seq + 1 under this
    -- row's lock, so sequence numbers are gap-free per conversation.
    last_seq         bigint      NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    backend          text        NOT NULL DEFAULT 'postgres' CHECK (backend IN ('postgres', 'jetstream')),
    publication      text        NOT NULL DEFAULT 'sync' CHECK (publication IN ('sync', 'outbox')),
    write_paused_at  timestamptz,
    archived_at      timestamptz,
    archived_by      uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((visibility = 'project') = (project_id IS NOT NULL)),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, project_id) REFERENCES projects (team_id, id),
    FOREIGN KEY (team_id, created_by) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, archived_by) REFERENCES agents (team_id, id)
);
CREATE INDEX conversations_project ON conversations (team_id, project_id) WHERE project_id IS NOT NULL;

-- Memberships are per window: (conversation, agent, session label).
CREATE TABLE conversation_members (
    id                   uuid        PRIMARY KEY,
    team_id              uuid        NOT NULL,
    conversation_id      uuid        NOT NULL,
    agent_id             uuid        NOT NULL,
    session              text        NOT NULL CHECK (session ~ '^[a-z0-9._:-]{0,64}$'),
    role                 text        NOT NULL CHECK (role IN ('owner', 'moderator', 'participant', 'observer')),
    state                text        NOT NULL CHECK (state IN ('invited', 'active', 'left', 'removed')),
    -- The first seq this seat may read (an invitee reads "from now" by default).
    history_from_seq     bigint      NOT NULL CHECK (history_from_seq >= 1),
    invited_by           uuid,
    -- A proposed transfer of this seat to another window of the same agent,
    -- completed when that window joins.
    transfer_to_session  text        CHECK (transfer_to_session ~ '^[a-z0-9._:-]{0,64}$'),
    -- Set on a seat a completed transfer replaced.
    superseded_by        uuid,
    created_at           timestamptz NOT NULL DEFAULT now(),
    joined_at            timestamptz,
    left_at              timestamptz,
    removed_at           timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, conversation_id, agent_id, session),
    UNIQUE (team_id, conversation_id, id),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, conversation_id) REFERENCES conversations (team_id, id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, invited_by) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, superseded_by) REFERENCES conversation_members (team_id, id)
);
CREATE INDEX conversation_members_window ON conversation_members (team_id, agent_id, session);
CREATE INDEX conversation_members_active ON conversation_members (team_id, conversation_id)
    WHERE state = 'active';

CREATE TABLE conversation_messages (
    id                 uuid        PRIMARY KEY,
    team_id            uuid        NOT NULL,
    conversation_id    uuid        NOT NULL,
    seq                bigint      NOT NULL CHECK (seq >= 1),
    sender_member_id   uuid        NOT NULL,
    sender_id          uuid        NOT NULL,
    sender_session     text        NOT NULL,
    -- Idempotency: the same request_id from the same agent in the same
    -- conversation is the same send.
    request_id         uuid        NOT NULL,
    body               text        NOT NULL CHECK (octet_length(body) <= 1048576),
    body_sha256        bytea       NOT NULL CHECK (length(body_sha256) = 32),
    body_bytes         integer     NOT NULL CHECK (body_bytes BETWEEN 1 AND 1048576),
    reply_to           uuid,
    metadata           jsonb       CHECK (metadata IS NULL OR jsonb_typeof(metadata) = 'object'),
    backend            text        NOT NULL DEFAULT 'postgres' CHECK (backend IN ('postgres', 'jetstream')),
    publication_state  text        NOT NULL DEFAULT 'stored'
                                   CHECK (publication_state IN ('pending_publication', 'stored', 'failed')),
    canonical_locator  text,
    uncertain_at       timestamptz,
    tombstoned_at      timestamptz,
    tombstone_reason   text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((tombstoned_at IS NULL) = (tombstone_reason IS NULL)),
    UNIQUE (team_id, conversation_id, seq),
    UNIQUE (team_id, conversation_id, sender_id, request_id),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, conversation_id) REFERENCES conversations (team_id, id),
    FOREIGN KEY (team_id, conversation_id, sender_member_id)
        REFERENCES conversation_members (team_id, conversation_id, id),
    FOREIGN KEY (team_id, sender_id) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, reply_to) REFERENCES conversation_messages (team_id, id)
);

-- Five facts per (message, recipient seat), each written once by whoever
-- observed it. The recipient list is frozen at send: one row per recipient.
CREATE TABLE message_receipts (
    team_id            uuid        NOT NULL,
    message_id         uuid        NOT NULL,
    member_id          uuid        NOT NULL,
    recipient_id       uuid        NOT NULL,
    recipient_session  text        NOT NULL,
    stored_at          timestamptz,
    delivered_at       timestamptz,
    presented_at       timestamptz,
    acknowledged_at    timestamptz,
    resolved_at        timestamptz,
    ack_note           text        CHECK (octet_length(ack_note) <= 1024),
    CHECK (resolved_at IS NULL OR acknowledged_at IS NOT NULL),
    PRIMARY KEY (team_id, message_id, member_id),
    FOREIGN KEY (team_id, message_id) REFERENCES conversation_messages (team_id, id),
    FOREIGN KEY (team_id, member_id) REFERENCES conversation_members (team_id, id),
    FOREIGN KEY (team_id, recipient_id) REFERENCES agents (team_id, id)
);
CREATE INDEX message_receipts_unacknowledged ON message_receipts (team_id, member_id)
    WHERE acknowledged_at IS NULL;

-- Every membership change, send and ack; never a body.
CREATE TABLE conversation_audit (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id          uuid        NOT NULL REFERENCES teams (id),
    conversation_id  uuid,
    at               timestamptz NOT NULL DEFAULT now(),
    actor_id         uuid        NOT NULL,
    actor_session    text        NOT NULL,
    action           text        NOT NULL CHECK (action IN (
                         'create', 'archive', 'invite', 'join', 'leave', 'remove', 'role',
                         'transfer', 'recover', 'readmit', 'send', 'ack',
                         'project_create', 'project_grant', 'project_revoke')),
    subject          text        CHECK (octet_length(subject) <= 200),
    detail           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    FOREIGN KEY (team_id, conversation_id) REFERENCES conversations (team_id, id),
    FOREIGN KEY (team_id, actor_id) REFERENCES agents (team_id, id)
);
CREATE INDEX conversation_audit_conversation ON conversation_audit (team_id, conversation_id, at);
