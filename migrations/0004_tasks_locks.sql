-- Tasks (a team's shared work queue with leased claims) and advisory locks.
--
-- A claim or a lock belongs to one window: (agent, session label). Leases and
-- lock expiries are compared with the database's now() only, so replicas with
-- skewed clocks agree on who holds what. A lapsed lease is not cleared by any
-- sweeper: readers treat `claimed` with lease_expires_at <= now() as open, and
-- the next claim overwrites the holder.

CREATE TABLE tasks (
    id                 uuid        PRIMARY KEY,
    team_id            uuid        NOT NULL REFERENCES teams (id),
    -- Creation order, the tie-break of "oldest first" (created_at is the
    -- transaction's start and can repeat).
    seq                bigint      GENERATED ALWAYS AS IDENTITY,
    key                text        NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 128),
    title              text        NOT NULL CHECK (octet_length(title) BETWEEN 1 AND 512),
    description        text        CHECK (octet_length(description) <= 65536),
    -- The store enforces 16 KiB on the compact JSON; jsonb's text form adds
    -- spaces, so the last line of defence here leaves room for them.
    metadata           jsonb       NOT NULL DEFAULT '{}'::jsonb
                                   CHECK (jsonb_typeof(metadata) = 'object'
                                          AND octet_length(metadata::text) <= 32768),
    status             text        NOT NULL DEFAULT 'open'
                                   CHECK (status IN ('open', 'claimed', 'done', 'cancelled')),
    created_by         uuid        NOT NULL,
    created_session    text        NOT NULL,
    -- The window holding (or, once lapsed, last holding) the claim.
    holder_agent_id    uuid,
    holder_session     text,
    lease_expires_at   timestamptz,
    claimed_at         timestamptz,
    completed_by       uuid,
    completed_session  text,
    completed_at       timestamptz,
    result             text        CHECK (octet_length(result) <= 65536),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (team_id, key),
    UNIQUE (team_id, id),
    FOREIGN KEY (team_id, created_by) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, holder_agent_id) REFERENCES agents (team_id, id),
    FOREIGN KEY (team_id, completed_by) REFERENCES agents (team_id, id),
    -- A claimed task always names its window and lease; no other state does.
    CHECK ((status = 'claimed') = (holder_agent_id IS NOT NULL)),
    CHECK ((holder_agent_id IS NULL) = (holder_session IS NULL)
           AND (holder_agent_id IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((status = 'done') = (completed_at IS NOT NULL)),
    CHECK ((completed_by IS NULL) = (completed_at IS NULL)
           AND (completed_by IS NULL) = (completed_session IS NULL))
);

-- claim_next_task: the oldest open-or-claimed task of a team (claimed rows
-- stay in the index so a lapsed lease is found; done ones leave it).
CREATE INDEX tasks_claimable ON tasks (team_id, created_at, seq)
    WHERE status IN ('open', 'claimed');
-- mine_only listings and whoami's count of open claims.
CREATE INDEX tasks_holder ON tasks (team_id, holder_agent_id, holder_session)
    WHERE holder_agent_id IS NOT NULL;
CREATE INDEX tasks_team_updated ON tasks (team_id, updated_at);

-- Fixed at creation: dependencies name tasks that already exist, so a cycle
-- cannot be built.
CREATE TABLE task_dependencies (
    team_id        uuid NOT NULL,
    task_id        uuid NOT NULL,
    depends_on_id  uuid NOT NULL,
    PRIMARY KEY (team_id, task_id, depends_on_id),
    FOREIGN KEY (team_id, task_id) REFERENCES tasks (team_id, id),
    FOREIGN KEY (team_id, depends_on_id) REFERENCES tasks (team_id, id),
    CHECK (task_id <> depends_on_id)
);
CREATE INDEX task_dependencies_prerequisite ON task_dependencies (team_id, depends_on_id);

-- A task's history, written in the transaction of each change. `team prune`
-- may trim it; the task row itself is never pruned.
CREATE TABLE task_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id     uuid        NOT NULL,
    task_id     uuid        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    kind        text        NOT NULL
                            CHECK (kind IN ('created', 'claimed', 'renewed', 'released',
                                            'completed', 'cancelled')),
    agent_id    uuid        NOT NULL,
    session     text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    FOREIGN KEY (team_id, task_id) REFERENCES tasks (team_id, id),
    FOREIGN KEY (team_id, agent_id) REFERENCES agents (team_id, id)
);
CREATE INDEX task_events_task ON task_events (team_id, task_id, id);
CREATE INDEX task_events_team_at ON task_events (team_id, at);

-- Advisory locks: one row per (team, name). An expired row is taken over in
-- place by the next acquire; list_locks shows unexpired rows only.
CREATE TABLE locks (
    team_id          uuid        NOT NULL REFERENCES teams (id),
    name             text        NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 256),
    holder_agent_id  uuid        NOT NULL,
    holder_session   text        NOT NULL,
    purpose          text        CHECK (octet_length(purpose) <= 256),
    acquired_at      timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (team_id, name),
    FOREIGN KEY (team_id, holder_agent_id) REFERENCES agents (team_id, id),
    CHECK (expires_at > acquired_at)
);
CREATE INDEX locks_team_expiry ON locks (team_id, expires_at);
