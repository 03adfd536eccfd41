//! What `team prune` may remove, one predicate per kind, each used both by
//! the dry run's count and by the batches `--apply` runs, so the two agree by
//! construction. Binds in every predicate: `$1` the team, `$2` the cut-off
//! time (the kind's own: `--older-than-days`, the audit retention, or for
//! conversations the prune's "now", each conversation's retention applied
//! to it).

/// A channel message older than the cut-off that every live reader of its
/// channel has read. A reader is a window with a cursor on the channel
/// (`#name`) or on `all`, of an agent not disabled; what it has read is the
/// higher of the two (as `list_channels` counts unread). Its own posts never
/// wait for it. A window that never read with `only_new` has no cursor and
/// holds nothing back; disabling an agent releases what its cursors held.
macro_rules! channel_message_prunable {
    () => {
        "m.team_id = $1 AND m.channel_id IS NOT NULL AND m.created_at < $2
         AND NOT EXISTS (
             SELECT 1 FROM read_cursors r
               JOIN channels c ON c.team_id = r.team_id AND c.id = m.channel_id
               JOIN agents a ON a.team_id = r.team_id AND a.id = r.agent_id
              WHERE r.team_id = m.team_id AND r.scope IN ('#' || c.name, 'all')
                AND a.disabled_at IS NULL
                AND NOT (r.agent_id = m.sender_id AND r.session = m.sender_session)
              GROUP BY r.agent_id, r.session
             HAVING max(r.last_position) < m.position)"
    };
}

/// A direct message older than the cut-off that its recipient has read: one
/// to the agent as a whole that the agent's cursor passed (any window of it
/// read it, migration 0041), one read on its own (`message_reads`), or one
/// that every window of the recipient with an `inbox` or `all` cursor (only
/// the named window, for a message to one window) is at or past.
macro_rules! direct_message_prunable {
    () => {
        "m.team_id = $1 AND m.recipient_id IS NOT NULL AND m.created_at < $2
         AND ((m.recipient_session IS NULL AND EXISTS (
                  SELECT 1 FROM agent_read_cursors g
                   WHERE g.team_id = m.team_id AND g.agent_id = m.recipient_id
                     AND g.last_position >= m.position))
              OR EXISTS (SELECT 1 FROM message_reads x
                          WHERE x.team_id = m.team_id AND x.message_id = m.id)
              OR NOT EXISTS (
             SELECT 1 FROM read_cursors r
               JOIN agents a ON a.team_id = r.team_id AND a.id = r.agent_id
              WHERE r.team_id = m.team_id AND r.agent_id = m.recipient_id
                AND r.scope IN ('inbox', 'all') AND a.disabled_at IS NULL
                AND (m.recipient_session IS NULL OR r.session = m.recipient_session)
                AND NOT (r.agent_id = m.sender_id AND r.session = m.sender_session)
              GROUP BY r.session
             HAVING max(r.last_position) < m.position))"
    };
}

/// What a channel or direct message weighs (as `team usage` counts it).
macro_rules! message_bytes {
    () => {
        "(octet_length(m.body) + coalesce(octet_length(m.metadata::text), 0))"
    };
}

/// An attachment on a message that goes.
macro_rules! attachment_prunable {
    () => {
        concat!(
            "x.team_id = $1 AND x.message_id IN (SELECT m.id FROM messages m WHERE (",
            channel_message_prunable!(),
            ") OR (",
            direct_message_prunable!(),
            "))"
        )
    };
}

/// A note revision older than the cut-off that is not its note's current
/// one (the current value, or a deletion, always stays).
macro_rules! note_revision_prunable {
    () => {
        "x.team_id = $1 AND x.at < $2
         AND x.revision < (SELECT n.revision FROM notes n
                            WHERE n.team_id = x.team_id AND n.id = x.note_id)"
    };
}

/// An event older than the cut-off of a task that is finished (done or
/// cancelled); an open or claimed task keeps its whole history.
macro_rules! task_event_prunable {
    () => {
        "x.team_id = $1 AND x.at < $2
         AND EXISTS (SELECT 1 FROM tasks t WHERE t.team_id = x.team_id AND t.id = x.task_id
                                              AND t.status IN ('done', 'cancelled'))"
    };
}

/// A webhook delivery older than the cut-off that is settled: delivered, or
/// failed (given up; until now kept until its hook was removed). Its payload
/// carries what the event said, a channel post's body included, so it goes
/// with the messages of its age. One still to be sent (pending, or being
/// sent, or waiting on a paused hook) stays: removing it would drop an
/// event its receiver was promised.
macro_rules! webhook_delivery_prunable {
    () => {
        "x.team_id = $1 AND x.created_at < $2 AND x.state IN ('delivered', 'failed')"
    };
}

/// What a webhook delivery weighs (as `team usage` counts it).
macro_rules! webhook_delivery_bytes {
    () => {
        "(octet_length(x.payload::text) + coalesce(octet_length(x.last_error), 0))"
    };
}

/// What a note revision weighs: its value (none for a deletion).
macro_rules! note_revision_bytes {
    () => {
        "coalesce(octet_length(x.value), 0)"
    };
}

/// What a task event or an audit row weighs: its detail.
macro_rules! detail_bytes {
    () => {
        "octet_length(x.detail::text)"
    };
}

/// An audit row (operator or conversation audit) older than the audit
/// retention.
macro_rules! audit_prunable {
    () => {
        "x.team_id = $1 AND x.at < $2"
    };
}

/// A conversation message past its conversation's retention (`$2` is the
/// prune's now) that nothing still needs: stored (not awaiting publication,
/// no outbox slot), not yet tombstoned, every receipt acknowledged, no inbox
/// reference still owed, its conversation not in an open move.
macro_rules! conversation_message_prunable {
    () => {
        "m.team_id = $1 AND m.tombstoned_at IS NULL AND m.publication_state = 'stored'
         AND EXISTS (SELECT 1 FROM conversations c
                      WHERE c.team_id = m.team_id AND c.id = m.conversation_id
                        AND c.retention_days IS NOT NULL
                        AND m.created_at < $2 - make_interval(days => c.retention_days))
         AND NOT EXISTS (SELECT 1 FROM message_receipts x
                          WHERE x.team_id = m.team_id AND x.message_id = m.id
                            AND x.acknowledged_at IS NULL)
         AND NOT EXISTS (SELECT 1 FROM inbox_references i
                          WHERE i.team_id = m.team_id AND i.message_id = m.id
                            AND i.delivered_at IS NULL)
         AND NOT EXISTS (SELECT 1 FROM conversation_outbox o WHERE o.message_id = m.id)
         AND NOT EXISTS (SELECT 1 FROM conversation_migrations g
                          WHERE g.conversation_id = m.conversation_id
                            AND g.state IN ('planned', 'copying', 'verified'))"
    };
}

/// What a conversation message weighs where its body is kept.
macro_rules! conversation_message_bytes {
    () => {
        "(CASE WHEN m.backend = 'postgres' THEN octet_length(m.body) ELSE m.body_bytes END
          + coalesce(octet_length(m.metadata::text), 0))"
    };
}

/// The dry run's count of what `predicate` allows in `table`: (rows, bytes).
macro_rules! count_of {
    ($table:literal, $alias:literal, $predicate:expr, $bytes:expr) => {
        concat!(
            "SELECT count(*), coalesce(sum(",
            $bytes,
            "), 0)::bigint FROM ",
            $table,
            " ",
            $alias,
            " WHERE ",
            $predicate
        )
    };
}

pub(super) const CHANNEL_MESSAGES_COUNT: &str = count_of!(
    "messages",
    "m",
    channel_message_prunable!(),
    message_bytes!()
);
pub(super) const DIRECT_MESSAGES_COUNT: &str = count_of!(
    "messages",
    "m",
    direct_message_prunable!(),
    message_bytes!()
);
pub(super) const ATTACHMENTS_COUNT: &str =
    count_of!("attachments", "x", attachment_prunable!(), "x.size_bytes");
pub(super) const CONVERSATION_MESSAGES_COUNT: &str = count_of!(
    "conversation_messages",
    "m",
    conversation_message_prunable!(),
    conversation_message_bytes!()
);

/// One batch of channel (or, with the other predicate, direct) messages to
/// remove: ids and channels, unlocked (the removal takes its locks in the
/// posts' order, see `release.rs`). `$3` the batch size.
macro_rules! message_batch {
    ($predicate:expr) => {
        concat!(
            "SELECT m.id, m.channel_id FROM messages m WHERE ",
            $predicate,
            " ORDER BY m.position LIMIT $3"
        )
    };
}

/// Delete the batch's messages (`$3` their ids) that the predicate still
/// allows: ids, channels, weights, positions and recipients of what went
/// (the last two for the prune marks, migration 0048).
macro_rules! message_delete {
    ($predicate:expr) => {
        concat!(
            "DELETE FROM messages m WHERE m.id = ANY($3) AND ",
            $predicate,
            " RETURNING m.id, m.channel_id, ",
            message_bytes!(),
            "::bigint, m.position, m.recipient_id"
        )
    };
}

pub(super) const CHANNEL_MESSAGES_BATCH: &str = message_batch!(channel_message_prunable!());
pub(super) const DIRECT_MESSAGES_BATCH: &str = message_batch!(direct_message_prunable!());
pub(super) const CHANNEL_MESSAGES_DELETE: &str = message_delete!(channel_message_prunable!());
pub(super) const DIRECT_MESSAGES_DELETE: &str = message_delete!(direct_message_prunable!());

/// One statement deleting a batch (`$3` rows) of `table` by its key columns
/// (`columns`, comma-separated) that `predicate` allows, skipping rows
/// others hold: (rows, bytes).
macro_rules! delete_batch {
    ($table:literal, $columns:literal, $predicate:expr, $bytes:expr) => {
        concat!(
            "WITH d AS (DELETE FROM ",
            $table,
            " x WHERE (",
            $columns,
            ") IN (SELECT ",
            $columns,
            " FROM ",
            $table,
            " x WHERE ",
            $predicate,
            " LIMIT $3 FOR UPDATE OF x SKIP LOCKED) RETURNING ",
            $bytes,
            " AS bytes) SELECT count(*), coalesce(sum(bytes), 0)::bigint FROM d"
        )
    };
}

/// A kind removed by key: its dry run's count (`$count`) and its batch
/// (`$batch`, by the key columns `$key`) read one table with one predicate
/// and one weight, so the dry run counts what `--apply` removes.
macro_rules! keyed_kind {
    ($count:ident, $batch:ident, $table:literal, $key:literal, $predicate:expr, $bytes:expr) => {
        pub(super) const $count: &str = count_of!($table, "x", $predicate, $bytes);
        pub(super) const $batch: &str = delete_batch!($table, $key, $predicate, $bytes);
    };
}

keyed_kind!(
    NOTE_REVISIONS_COUNT,
    NOTE_REVISIONS_BATCH,
    "note_revisions",
    "x.team_id, x.note_id, x.revision",
    note_revision_prunable!(),
    note_revision_bytes!()
);
keyed_kind!(
    TASK_EVENTS_COUNT,
    TASK_EVENTS_BATCH,
    "task_events",
    "x.id",
    task_event_prunable!(),
    detail_bytes!()
);
keyed_kind!(
    WEBHOOK_DELIVERIES_COUNT,
    WEBHOOK_DELIVERIES_BATCH,
    "webhook_deliveries",
    "x.id",
    webhook_delivery_prunable!(),
    webhook_delivery_bytes!()
);
keyed_kind!(
    AUDIT_COUNT,
    AUDIT_BATCH,
    "audit_log",
    "x.id",
    audit_prunable!(),
    detail_bytes!()
);
keyed_kind!(
    CONVERSATION_AUDIT_COUNT,
    CONVERSATION_AUDIT_BATCH,
    "conversation_audit",
    "x.id",
    audit_prunable!(),
    detail_bytes!()
);

/// A batch of one conversation's (`$4`) messages past retention, released:
/// tombstoned with the reason (`$5`), body and metadata dropped, the row, its
/// seq and its receipts kept (a reader sees `tombstoned` and the reason, never
/// a gap). Returns each released message's backend and locator (a JetStream
/// body is then dropped from the broker) and weight.
pub(super) const CONVERSATION_MESSAGES_BATCH: &str = concat!(
    "WITH b AS (SELECT m.id, m.backend, m.canonical_locator, ",
    conversation_message_bytes!(),
    "::bigint AS bytes FROM conversation_messages m WHERE ",
    conversation_message_prunable!(),
    "             AND m.conversation_id = $4
                ORDER BY m.seq LIMIT $3 FOR UPDATE OF m SKIP LOCKED),
          u AS (UPDATE conversation_messages m
                   SET body = '', metadata = NULL, tombstoned_at = now(), tombstone_reason = $5
                  FROM b WHERE m.id = b.id
              RETURNING b.id, b.backend, b.canonical_locator, b.bytes)
     SELECT id, backend, canonical_locator, bytes FROM u"
);
