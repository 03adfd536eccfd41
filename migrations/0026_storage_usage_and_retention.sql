-- What a team stores, counted and capped, and how long a conversation keeps
-- its messages (issue 20, item 4).
--
-- The team's one storage limit stays in `team_quotas.attachment_bytes_limit`
-- (its first name, from when it capped attachments only): it now caps
-- everything the team writes. `storage_bytes_used` is the team's usage as of
-- `storage_counted_at`, written by a recount (the periodic worker,
-- `team usage`, `team quota`, `team prune --apply`), never by a write: a
-- counter every post, send and note bumped would be one row every writer of
-- the team queues on. A write reads it without a lock, so a team can pass its
-- quota by what it writes between two recounts (see store/usage.rs).
ALTER TABLE team_quotas
    ADD COLUMN storage_bytes_used  bigint      NOT NULL DEFAULT 0 CHECK (storage_bytes_used >= 0),
    ADD COLUMN storage_counted_at  timestamptz;

-- Messages of a conversation older than this many days are released by
-- `team prune` (tombstoned, body dropped) once nothing still needs them.
-- NULL: kept for ever.
ALTER TABLE conversations
    ADD COLUMN retention_days integer CHECK (retention_days IS NULL OR retention_days BETWEEN 1 AND 36500);

-- `team prune` walks direct messages by age (channel messages already have
-- messages_channel_recent).
CREATE INDEX messages_direct_recent ON messages (team_id, created_at) WHERE recipient_id IS NOT NULL;
