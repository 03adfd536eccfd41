-- Issue 37, item 1: path reservations. A window reserves the paths it is
-- about to edit (gitignore-style globs, relative to the repository root),
-- exclusively or shared, for a time; another window's overlapping
-- reservation refuses it. The overlap rule is Rust's (acs-wire's globs), so
-- a reserve runs under a per-(team, project) advisory lock: read the live
-- reservations, decide, write, commit.
--
-- `project` is the holder window's project when it reserved ('' when the
-- window names none): reservations of different projects never meet.
-- `pattern` is the glob as normalised (no leading `/`, no `./`, no empty
-- segment). A row is live while expires_at is in the future (the
-- database's clock); a window that ends (session_end, revocation, the
-- presence sweeper's idle timeout) has its rows deleted. Rows that merely
-- expire are deleted by the next reserve of the project or the sweeper, so
-- the live-rows index below bounds every check by what is live, not by
-- history.
CREATE TABLE path_reservations (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    team_id          uuid        NOT NULL REFERENCES teams (id),
    project          text        NOT NULL DEFAULT '' CHECK (octet_length(project) <= 256),
    holder_agent_id  uuid        NOT NULL,
    holder_session   text        NOT NULL,
    pattern          text        NOT NULL CHECK (octet_length(pattern) BETWEEN 1 AND 1024),
    exclusive        boolean     NOT NULL,
    reason           text        CHECK (octet_length(reason) BETWEEN 1 AND 256),
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    FOREIGN KEY (team_id, holder_agent_id) REFERENCES agents (team_id, id),
    UNIQUE (team_id, project, holder_agent_id, holder_session, pattern),
    CHECK (expires_at > created_at)
);
-- check_paths / reserve_paths: the live reservations of one project.
CREATE INDEX path_reservations_live ON path_reservations (team_id, project, expires_at);
-- A window's own (release_paths, renew_reservations, its end).
CREATE INDEX path_reservations_holder
    ON path_reservations (team_id, holder_agent_id, holder_session);
