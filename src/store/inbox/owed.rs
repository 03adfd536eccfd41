//! What a window is owed, read a page at a time: the top-up that turns its
//! undelivered receipts into references, the hand-out page, and the counts
//! `conversation_inbox_status` shows. Each is bounded by its page, not by
//! the conversation's history or the window's backlog (issue 19):
//!
//! - The top-up walks each seat's conversation in seq order from a mark
//!   (`inbox_topup_marks`, migration 0022) at most [`TOP_UP_STEP`] messages
//!   per fetch. A seat without a mark (its first fetch, after a transfer
//!   moved receipts onto it, or after references owed to a dead window were
//!   released) starts just before its oldest undelivered receipt: that one
//!   read is as long as what the seat is owed.
//! - The hand-out reads each conversation's first owed page from an index,
//!   conversations found by a skip scan.
//! - The counts stop at [`COUNTED_MAX`] and then say "at least".

use super::{Delivery, HANDOUT_SECS};
use crate::auth::Identity;
use crate::error::BusResult;

/// Messages of one seat's conversation the top-up walks per fetch, at most.
pub const TOP_UP_STEP: i64 = 100;
/// `conversation_inbox_status` counts references and receipts up to this
/// many of each; past it the count is a lower bound (`owed_at_least`). Three
/// fetch pages, past one top-up step: enough to tell "a page or two" from
/// "a backlog", and the status costs the same however deep the backlog is.
pub const COUNTED_MAX: i64 = 150;

/// Queue a reference for each owed receipt of the next [`TOP_UP_STEP`]
/// messages of every seat this window holds, and move the seats' marks.
/// Messages still pending publication are walked past: their references
/// are queued when they are confirmed (`store::outbox` settle). Returns
/// whether some seat's walk stopped at the step (more may be owed).
pub(super) async fn top_up(
    tx: &mut sqlx::PgConnection,
    me: &Identity,
    key: &str,
) -> BusResult<bool> {
    let walked_full: bool = sqlx::query_scalar(
        "WITH seats AS (
             SELECT w.id, w.conversation_id, k.through_seq AS marked,
                    COALESCE(k.through_seq,
                             -- One probe per undelivered receipt (a scalar
                             -- subquery, never a scan of the messages).
                             (SELECT min((SELECT m.seq FROM conversation_messages m
                                           WHERE m.team_id = r.team_id
                                             AND m.id = r.message_id)) - 1
                                FROM message_receipts r
                               WHERE r.team_id = w.team_id AND r.member_id = w.id
                                 AND r.delivered_at IS NULL),
                             c.last_seq) AS after_seq
               FROM conversation_members w
               JOIN conversations c ON c.team_id = w.team_id AND c.id = w.conversation_id
               LEFT JOIN inbox_topup_marks k
                      ON k.team_id = w.team_id AND k.member_id = w.id AND k.recipient_key = $3
              WHERE w.team_id = $1 AND w.agent_id = $2 AND w.session = $4),
         walked AS (
             SELECT s.id AS member_id, m.*
               FROM seats s
               CROSS JOIN LATERAL (
                   SELECT m.id, m.seq, m.conversation_id, m.created_at, m.publication_state,
                          m.sender_id, m.sender_session
                     FROM conversation_messages m
                    WHERE m.team_id = $1 AND m.conversation_id = s.conversation_id
                      AND m.seq > s.after_seq
                    ORDER BY m.seq LIMIT $5) m),
         queued AS (
             INSERT INTO inbox_references
                 (id, team_id, recipient_key, recipient_id, recipient_session, kind,
                  conversation_id, message_id, seq, actor, created_at)
             SELECT gen_random_uuid(), $1, $3, $2, $4, 'message', m.conversation_id, m.id, m.seq,
                    CASE WHEN m.sender_session = '' THEN a.name
                         ELSE a.name || '/' || m.sender_session END,
                    -- Owed since the send committed (the synchronous path's confirmation).
                    m.created_at
               FROM walked m
               JOIN message_receipts r
                 ON r.team_id = $1 AND r.message_id = m.id AND r.member_id = m.member_id
               JOIN agents a ON a.team_id = $1 AND a.id = m.sender_id
              WHERE r.delivered_at IS NULL AND m.publication_state = 'stored'
                -- Per row (a scalar subquery): one probe of the unique index.
                AND (SELECT true FROM inbox_references i
                      WHERE i.team_id = $1 AND i.recipient_key = $3
                        AND i.kind = 'message' AND i.message_id = m.id LIMIT 1) IS NULL
             ON CONFLICT DO NOTHING),
         marked AS (
             INSERT INTO inbox_topup_marks (team_id, member_id, recipient_key, through_seq)
             SELECT $1, s.id, $3,
                    COALESCE((SELECT max(w.seq) FROM walked w WHERE w.member_id = s.id),
                             s.after_seq, 0)
               FROM seats s
              -- A mark is written only when it moves: an idle fetch writes nothing.
              WHERE s.marked IS NULL OR EXISTS (SELECT 1 FROM walked w WHERE w.member_id = s.id)
             ON CONFLICT (team_id, member_id, recipient_key)
             DO UPDATE SET through_seq = EXCLUDED.through_seq
                     WHERE inbox_topup_marks.through_seq < EXCLUDED.through_seq)
         SELECT EXISTS (SELECT 1 FROM walked GROUP BY member_id HAVING count(*) >= $5)",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(key)
    .bind(&me.window)
    .bind(TOP_UP_STEP)
    .fetch_one(&mut *tx)
    .await?;
    Ok(walked_full)
}

/// The next `limit + 1` references owed to this window, locked: in seq
/// order within each conversation, conversations by their oldest owed
/// reference; none handed out in the last [`HANDOUT_SECS`].
///
/// The conversations holding owed references are found by a skip scan (one
/// index probe each); each gives its oldest owed reference (its place in
/// the order) and its first page, from `inbox_references_owed_first` and
/// `_owed_order` (migration 0022). Each ORDER BY leads with the
/// conversation so that only those indexes serve it. The rows are locked by
/// the outer query: a row another fetch of this window holds is skipped, so
/// two concurrent fetches never hand out the same reference.
pub(super) async fn page(
    tx: &mut sqlx::PgConnection,
    me: &Identity,
    key: &str,
    limit: i64,
) -> BusResult<Vec<Delivery>> {
    Ok(sqlx::query_as(
        "WITH RECURSIVE conversations AS (
             (SELECT conversation_id FROM inbox_references
               WHERE team_id = $1 AND recipient_key = $2 AND delivered_at IS NULL
               ORDER BY conversation_id LIMIT 1)
             UNION ALL
             SELECT (SELECT i.conversation_id FROM inbox_references i
                      WHERE i.team_id = $1 AND i.recipient_key = $2 AND i.delivered_at IS NULL
                        AND i.conversation_id > c.conversation_id
                      ORDER BY i.conversation_id LIMIT 1)
               FROM conversations c WHERE c.conversation_id IS NOT NULL),
         owed AS (
             SELECT first.at AS conversation_first, page.id
               FROM conversations c
               CROSS JOIN LATERAL (
                   SELECT i.created_at AS at FROM inbox_references i
                    WHERE i.team_id = $1 AND i.recipient_key = $2 AND i.delivered_at IS NULL
                      AND i.conversation_id = c.conversation_id
                      AND (i.handed_out_at IS NULL
                           OR i.handed_out_at < now() - make_interval(secs => $4))
                    ORDER BY i.conversation_id, i.created_at LIMIT 1) first
               CROSS JOIN LATERAL (
                   SELECT i.id FROM inbox_references i
                    WHERE i.team_id = $1 AND i.recipient_key = $2 AND i.delivered_at IS NULL
                      AND i.conversation_id = c.conversation_id
                      AND (i.handed_out_at IS NULL
                           OR i.handed_out_at < now() - make_interval(secs => $4))
                    ORDER BY i.conversation_id, i.seq, i.kind, i.id LIMIT $3 + 1) page
              WHERE c.conversation_id IS NOT NULL)
         SELECT i.id AS delivery_id, i.kind, i.conversation_id, i.message_id, i.seq,
                i.actor AS from, NULLIF(i.receipt, '') AS receipt, i.created_at AS queued_at
           FROM inbox_references i JOIN owed o ON o.id = i.id
          ORDER BY o.conversation_first, i.conversation_id, i.seq, i.kind, i.id
          LIMIT $3 + 1
          FOR UPDATE OF i SKIP LOCKED",
    )
    .bind(me.team_id)
    .bind(key)
    .bind(limit)
    .bind(HANDOUT_SECS)
    .fetch_all(&mut *tx)
    .await?)
}

/// What `conversation_inbox_status` counts, each up to [`COUNTED_MAX`].
#[derive(sqlx::FromRow)]
pub(super) struct Counts {
    /// References not yet confirmed.
    pub queued: i64,
    /// Of those, handed out in the last [`HANDOUT_SECS`].
    pub handed_out: i64,
    /// Receipts owed that no reference names yet.
    pub unqueued: i64,
    /// Some count stopped at [`COUNTED_MAX`]: the total is a lower bound.
    pub at_least: bool,
}

/// Counts bounded by [`COUNTED_MAX`]. Receipts not yet referenced: for a
/// seat with a mark, the owed receipts of the messages after it (below it
/// every owed receipt has its reference); for one without, among at most
/// [`COUNTED_MAX`] of its undelivered receipts.
pub(super) async fn counts(pool: &sqlx::PgPool, me: &Identity, key: &str) -> BusResult<Counts> {
    let counts = sqlx::query_as(
        "WITH seats AS (
             SELECT w.id, w.conversation_id, k.through_seq
               FROM conversation_members w
               LEFT JOIN inbox_topup_marks k
                      ON k.team_id = w.team_id AND k.member_id = w.id AND k.recipient_key = $2
              WHERE w.team_id = $1 AND w.agent_id = $3 AND w.session = $4),
         examined AS (
             SELECT s.id AS member_id, x.message_id
               FROM seats s
               CROSS JOIN LATERAL (
                   (SELECT m.id AS message_id
                      FROM conversation_messages m
                     WHERE s.through_seq IS NOT NULL
                       AND m.team_id = $1 AND m.conversation_id = s.conversation_id
                       AND m.seq > s.through_seq
                     ORDER BY m.seq LIMIT $6)
                   UNION ALL
                   (SELECT r.message_id FROM message_receipts r
                     WHERE s.through_seq IS NULL
                       AND r.team_id = $1 AND r.member_id = s.id AND r.delivered_at IS NULL
                     ORDER BY r.member_id, r.message_id LIMIT $6)) x),
         unqueued AS (
             SELECT 1 FROM examined e
               JOIN message_receipts r
                 ON r.team_id = $1 AND r.message_id = e.message_id AND r.member_id = e.member_id
               JOIN conversation_messages m ON m.team_id = $1 AND m.id = e.message_id
              WHERE r.delivered_at IS NULL AND m.publication_state = 'stored'
                AND (SELECT true FROM inbox_references i
                      WHERE i.team_id = $1 AND i.recipient_key = $2
                        AND i.kind = 'message' AND i.message_id = e.message_id LIMIT 1) IS NULL),
         queued AS (
             SELECT count(*) AS n FROM (
                 SELECT 1 FROM inbox_references
                  WHERE team_id = $1 AND recipient_key = $2 AND delivered_at IS NULL
                  LIMIT $6) q),
         handed_out AS (
             SELECT count(*) AS n FROM (
                 SELECT 1 FROM inbox_references
                  WHERE team_id = $1 AND recipient_key = $2 AND delivered_at IS NULL
                    AND handed_out_at >= now() - make_interval(secs => $5)
                  LIMIT $6) h)
         SELECT (SELECT n FROM queued) AS queued,
                (SELECT n FROM handed_out) AS handed_out,
                (SELECT count(*) FROM unqueued) AS unqueued,
                (SELECT n FROM queued) >= $6
                OR EXISTS (SELECT 1 FROM examined GROUP BY member_id HAVING count(*) >= $6)
                AS at_least",
    )
    .bind(me.team_id)
    .bind(key)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(HANDOUT_SECS)
    .bind(COUNTED_MAX)
    .fetch_one(pool)
    .await?;
    Ok(counts)
}

/// References not yet delivered to any window of any team, counted up to
/// `cap` (a partial index holds exactly these rows; the count stops at the
/// cap, so `/metrics` costs the same however much is owed).
pub async fn owed_installation(pool: &sqlx::PgPool, cap: i64) -> BusResult<i64> {
    let owed = sqlx::query_scalar(
        "SELECT count(*) FROM (
             SELECT 1 FROM inbox_references WHERE delivered_at IS NULL LIMIT $1) owed",
    )
    .bind(cap)
    .fetch_one(pool)
    .await?;
    Ok(owed)
}
