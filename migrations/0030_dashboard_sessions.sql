-- Dashboard sign-ins kept on the server (issue 33 item 7). The signed cookie
-- names one of these rows besides its principal, and every request checks
-- that the row is still there: "Sign out" deletes it, so a copy of the
-- cookie (from a shared machine, a backup, a proxy log) stops working at
-- once on every replica, which a signed cookie alone cannot do.
--
-- A row lives as long as its cookie (8 hours). `store::dashboard` keeps the
-- table small without a worker: each sign-in deletes a batch of expired rows
-- and keeps at most 16 live sign-ins per principal (the oldest ends first).
-- A revoked token or admin credential ends its sign-ins through the
-- principal re-check on every request; their rows go with the expiry.

CREATE TABLE dashboard_sessions (
    id            uuid        PRIMARY KEY,
    team_id       uuid        NOT NULL REFERENCES teams (id),
    -- Who signed in: an agent token or an admin credential, by id.
    principal     text        NOT NULL CHECK (principal IN ('agent', 'admin')),
    principal_id  uuid        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);

CREATE INDEX dashboard_sessions_by_principal ON dashboard_sessions (principal_id, created_at);
CREATE INDEX dashboard_sessions_by_expiry ON dashboard_sessions (expires_at);
