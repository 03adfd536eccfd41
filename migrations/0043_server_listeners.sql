-- Issue 36, item 1: where each `serve` listens, recorded in the database it
-- serves, so that local commands on the same database (`quickstart`,
-- `doctor`) find the running server instead of assuming 127.0.0.1:8787.
--
-- One row per address a server announced (several replicas, one row each).
-- `url` is what a client on the server's machine uses (a wildcard bind is
-- recorded as loopback). A server updates its row on every start; a row of a
-- server that stopped stays, so a later command can say where it last ran
-- (and `doctor` that nothing answers there now).
CREATE TABLE server_listeners (
    url        text        PRIMARY KEY CHECK (octet_length(url) BETWEEN 1 AND 512),
    host_name  text        NOT NULL CHECK (octet_length(host_name) <= 255),
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now()
);
