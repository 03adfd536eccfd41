-- Foundation: teams (the tenant), agents (identities inside a team), agent
-- tokens (credentials that are one agent), and the audit log.
--
-- Every row that belongs to a team carries team_id, and every reference to
-- another team-owned row goes through a composite key (team_id, id), so the
-- database itself refuses a row that points into another team.

CREATE TABLE teams (
    id          uuid        PRIMARY KEY,
    slug        text        NOT NULL UNIQUE
                            CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    name        text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE agents (
    id           uuid        PRIMARY KEY,
    team_id      uuid        NOT NULL REFERENCES teams (id),
    name         text        NOT NULL
                             CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,63}$'),
    disabled_at  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, name),
    UNIQUE (team_id, id)
);

CREATE TABLE agent_tokens (
    id              uuid        PRIMARY KEY,
    team_id         uuid        NOT NULL,
    agent_id        uuid        NOT NULL,
    -- SHA-256 of the whole token; the token itself is never stored.
    token_sha256    bytea       NOT NULL UNIQUE CHECK (length(token_sha256) = 32),
    display_prefix  text        NOT NULL CHECK (length(display_prefix) <= 16),
    label           text        CHECK (length(label) <= 64),
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_used_at    timestamptz,
    revoked_at      timestamptz,
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id)
);
CREATE INDEX agent_tokens_agent ON agent_tokens (team_id, agent_id) WHERE revoked_at IS NULL;

-- One row per issue, grant, revocation, enable/disable and capability change,
-- written in the same transaction as the change. Never a secret: a display
-- prefix at most.
CREATE TABLE audit_log (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    team_id   uuid        REFERENCES teams (id),
    actor     text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    source    text        NOT NULL CHECK (source IN ('cli', 'http', 'mcp')),
    action    text        NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    subject   text        CHECK (length(subject) <= 200),
    detail    jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_team_at ON audit_log (team_id, at);
