-- Presence (one row per agent window) and notes (the team's shared memory,
-- with every change kept as a revision).
--
-- Like every team-owned row, these carry team_id and reach agents through the
-- composite key (team_id, id): a row pointing into another team is refused by
-- the database itself.

-- One row per (agent, window). `session` is the X-Crew-Session label; '' is
-- the agent's shared window. Optional text fields are NULL when unset (the
-- tools turn "" into NULL), never the empty string. A row is "live" while
-- expires_at is in the future; the presence sweeper deletes rows long dead.
CREATE TABLE presence (
    team_id        uuid        NOT NULL,
    agent_id       uuid        NOT NULL,
    session        text        NOT NULL CHECK (session ~ '^[a-z0-9._:-]{0,64}$'),
    status         text        NOT NULL CHECK (status IN ('active', 'idle', 'busy', 'blocked')),
    repo           text        CHECK (octet_length(repo) BETWEEN 1 AND 256),
    branch         text        CHECK (octet_length(branch) BETWEEN 1 AND 256),
    activity       text        CHECK (octet_length(activity) BETWEEN 1 AND 256),
    project        text        CHECK (octet_length(project) BETWEEN 1 AND 256),
    role           text        CHECK (octet_length(role) BETWEEN 1 AND 256),
    ttl_seconds    integer     NOT NULL CHECK (ttl_seconds BETWEEN 30 AND 86400),
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (team_id, agent_id, session),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id)
);
-- The sweeper's scan (rows dead for longer than the retention).
CREATE INDEX presence_expires_at ON presence (expires_at);

-- The search text of a note: its key, its tags and the first 100,000
-- characters of its value (a tsvector is capped at 1 MiB; a 1 MiB value of
-- short distinct words could exceed that, and an insert must never fail on
-- it). Declared IMMUTABLE so a generated column can use it: array_to_string
-- is only STABLE in general, but over text[] it depends on nothing else.
CREATE FUNCTION note_search_vector(key text, value text, tags text[])
RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT setweight(to_tsvector('english'::regconfig, key), 'A')
        || setweight(to_tsvector('english'::regconfig, array_to_string(tags, ' ')), 'B')
        || setweight(to_tsvector('english'::regconfig, left(value, 100000)), 'C')
$$;

-- One row per (team, scope, key), kept after deletion (deleted_at set, value
-- and tags emptied) so revision numbers keep growing if the key is set again
-- and the history keeps pointing at it.
CREATE TABLE notes (
    id                   uuid        PRIMARY KEY,
    team_id              uuid        NOT NULL REFERENCES teams (id),
    scope                text        NOT NULL CHECK (scope ~ '^[a-z0-9][a-z0-9._:/-]{0,63}$'),
    key                  text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 256),
    value                text        NOT NULL CHECK (octet_length(value) <= 1048576),
    tags                 text[]      NOT NULL DEFAULT '{}'
                                     CHECK (cardinality(tags) <= 16 AND array_position(tags, NULL) IS NULL),
    revision             bigint      NOT NULL CHECK (revision >= 1),
    created_by_agent_id  uuid        NOT NULL,
    created_by_session   text        NOT NULL CHECK (length(created_by_session) <= 64),
    updated_by_agent_id  uuid        NOT NULL,
    updated_by_session   text        NOT NULL CHECK (length(updated_by_session) <= 64),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    deleted_at           timestamptz,
    search               tsvector    GENERATED ALWAYS AS (note_search_vector(key, value, tags)) STORED,
    CHECK (deleted_at IS NULL OR (value = '' AND tags = '{}')),
    UNIQUE (team_id, scope, key),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, created_by_agent_id) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, updated_by_agent_id) REFERENCES agents (team_id, id)
);
CREATE INDEX notes_team_updated ON notes (team_id, updated_at DESC) WHERE deleted_at IS NULL;
CREATE INDEX notes_tags ON notes USING gin (tags);
CREATE INDEX notes_search ON notes USING gin (search);

-- Every change to a note: a `set` carries the value and tags it set, a
-- `delete` carries neither. Trimmed only by `team prune`, never by a tool.
CREATE TABLE note_revisions (
    team_id         uuid        NOT NULL,
    note_id         uuid        NOT NULL,
    revision        bigint      NOT NULL CHECK (revision >= 1),
    action          text        NOT NULL CHECK (action IN ('set', 'delete')),
    value           text        CHECK (octet_length(value) <= 1048576),
    tags            text[],
    author_agent_id uuid        NOT NULL,
    author_session  text        NOT NULL CHECK (length(author_session) <= 64),
    at              timestamptz NOT NULL DEFAULT now(),
    CHECK ((action = 'set') = (value IS NOT NULL AND tags IS NOT NULL)),
    PRIMARY KEY (team_id, note_id, revision),
    FOREIGN KEY (team_id, note_id) REFERENCES notes (team_id, id),
    FOREIGN KEY (team_id, author_agent_id) REFERENCES agents (team_id, id)
);
CREATE INDEX note_revisions_team_at ON note_revisions (team_id, at);
