-- Messages get a per-team, commit-ordered position (1..N per team, no gaps),
-- replacing the (xact_id, seq) order whose readers waited for the whole
-- server's xmin horizon (one idle transaction in any database of the server
-- held every read_messages back).
--
-- The allocator is a small row per team (`message_counters`), not a column on
-- `teams`: it is updated by every post, and a narrow row of its own keeps
-- those updates HOT and off the row every request's credential check reads.
-- A post takes it as the last statement before COMMIT (`UPDATE ... RETURNING`
-- inside the statement that inserts the message), so the lock is held only
-- for that statement and the commit, and position p becomes visible only
-- after every position below it has committed: a reader's cursor depends on
-- the team's own writers only, and a late writer is never skipped.
--
-- Rule for set-based seeding (the benchmark): positions per team in insert
-- order, 1..N, and the team's counter row equal to the max; the channel
-- counters below equal count/max/max of the channel's messages.

CREATE TABLE message_counters (
    team_id        uuid   PRIMARY KEY REFERENCES teams (id),
    last_position  bigint NOT NULL CHECK (last_position >= 0)
);

ALTER TABLE messages ADD COLUMN position bigint;
UPDATE messages m SET position = o.position
FROM (SELECT id, row_number() OVER (PARTITION BY team_id ORDER BY xact_id, seq) AS position
      FROM messages) o
WHERE m.id = o.id;
ALTER TABLE messages ALTER COLUMN position SET NOT NULL;
ALTER TABLE messages ADD CONSTRAINT messages_position_positive CHECK (position >= 1);

INSERT INTO message_counters (team_id, last_position)
SELECT team_id, max(position) FROM messages GROUP BY team_id;

-- A cursor now holds the last position read: the last position among the
-- team's messages at or below its old (last_xact, last_seq), else 0.
ALTER TABLE read_cursors ADD COLUMN last_position bigint NOT NULL DEFAULT 0;
UPDATE read_cursors r SET last_position = coalesce((
    SELECT max(m.position) FROM messages m
    WHERE m.team_id = r.team_id AND (m.xact_id, m.seq) <= (r.last_xact, r.last_seq)), 0);
ALTER TABLE read_cursors DROP COLUMN last_xact, DROP COLUMN last_seq;

-- Per-channel counters, kept by the post's last statement under the team's
-- counter lock, so list_channels reads them instead of counting history.
ALTER TABLE channels
    ADD COLUMN message_count    bigint      NOT NULL DEFAULT 0 CHECK (message_count >= 0),
    ADD COLUMN last_position    bigint,
    ADD COLUMN last_message_at  timestamptz;
UPDATE channels c SET message_count = s.n, last_position = s.last_position,
                      last_message_at = s.last_at
FROM (SELECT team_id, channel_id, count(*) AS n, max(position) AS last_position,
             max(created_at) AS last_at
      FROM messages WHERE channel_id IS NOT NULL GROUP BY team_id, channel_id) s
WHERE c.team_id = s.team_id AND c.id = s.channel_id;

-- The order indexes move to position; xact_id and seq go with them.
DROP INDEX messages_channel_order;
DROP INDEX messages_dm_order;
DROP INDEX messages_team_order;
ALTER TABLE messages DROP COLUMN xact_id, DROP COLUMN seq;
CREATE UNIQUE INDEX messages_team_position ON messages (team_id, position);
-- list_channels' unread counts and team_digest's counts read this index
-- alone (an index-only scan once the table is vacuumed).
CREATE INDEX messages_channel_position ON messages (team_id, channel_id, position)
    INCLUDE (created_at, announce, sender_id, sender_session) WHERE channel_id IS NOT NULL;
-- Direct messages: to or from one window (a window's reads), and to or from
-- every window of an agent (`all_sessions`); each read walks one of these in
-- position order from its cursor, so DMs of an agent's other windows are
-- never scanned past.
CREATE INDEX messages_recipient_position ON messages (team_id, recipient_id, position)
    WHERE recipient_id IS NOT NULL;
CREATE INDEX messages_recipient_window_position
    ON messages (team_id, recipient_id, recipient_session, position)
    WHERE recipient_id IS NOT NULL;
CREATE INDEX messages_sender_dm_position ON messages (team_id, sender_id, position)
    WHERE recipient_id IS NOT NULL;
CREATE INDEX messages_sender_window_dm_position
    ON messages (team_id, sender_id, sender_session, position)
    WHERE recipient_id IS NOT NULL;

-- A post with attachments inserts them before its message (the message's
-- insert is the last statement, under the counter lock); the post defers
-- this check to its commit with SET CONSTRAINTS.
ALTER TABLE attachments ALTER CONSTRAINT attachments_team_id_message_id_fkey DEFERRABLE;
