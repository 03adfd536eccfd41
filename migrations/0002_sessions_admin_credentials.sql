-- Authenticated windows (session credentials) and admin credentials.

-- A token belongs to one agent of one team; sessions point at (team, agent,
-- token) together so a session can never hang off another agent's token.
ALTER TABLE agent_tokens ADD CONSTRAINT agent_tokens_team_agent_id UNIQUE (team_id, agent_id, id);

-- One row per (agent, label). A dead row (revoked, expired, parent token
-- revoked) is taken over by the next registration with its epoch bumped, so
-- the epoch only ever grows for a label and fences every older connection.
CREATE TABLE agent_sessions (
    id              uuid        PRIMARY KEY,
    team_id         uuid        NOT NULL,
    agent_id        uuid        NOT NULL,
    token_id        uuid        NOT NULL,
    label           text        NOT NULL CHECK (label ~ '^[a-z0-9._:-]{1,64}$'),
    secret_sha256   bytea       NOT NULL UNIQUE CHECK (length(secret_sha256) = 32),
    display_prefix  text        NOT NULL CHECK (length(display_prefix) <= 16),
    epoch           bigint      NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    expires_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, agent_id, label),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, agent_id, token_id) REFERENCES agent_tokens (team_id, agent_id, id)
);
CREATE INDEX agent_sessions_token ON agent_sessions (token_id) WHERE revoked_at IS NULL;

-- Admin credentials: global (team_id NULL) or confined to one team. They
-- manage teams, agents, tokens and credentials over /admin; they never post,
-- read or claim.
CREATE TABLE admin_credentials (
    id              uuid        PRIMARY KEY,
    team_id         uuid        REFERENCES teams (id),
    secret_sha256   bytea       NOT NULL UNIQUE CHECK (length(secret_sha256) = 32),
    display_prefix  text        NOT NULL CHECK (length(display_prefix) <= 16),
    label           text        CHECK (length(label) <= 64),
    created_by      text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_used_at    timestamptz,
    revoked_at      timestamptz
);
