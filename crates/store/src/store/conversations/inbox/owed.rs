//! What a window is owed, read a page at a time: the top-up that turns its
//! undelivered receipts into references, the hand-out page (both run by
//! `fetch_inbox_page`, migration 0039, in one call) and the counts
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

use super::HANDOUT_SECS;
use crate::auth::Identity;
use crate::error::BusResult;

/// Messages of one seat's conversation the top-up walks per fetch, at most.
pub const TOP_UP_STEP: i64 = 100;
/// `conversation_inbox_status` counts what is owed up to this many; at it
/// the count is a lower bound (`owed_at_least`). One full fetch page: the
/// status tells "less than a page, exactly this many" from "at least a
/// page: fetch", and costs the same however deep the backlog is (issue 34:
/// 150 let a large history cost 3-4 times a small one).
pub const COUNTED_MAX: i64 = super::FETCH_MAX;

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

/// Counts bounded by [`COUNTED_MAX`]. Receipts not yet referenced, counted
/// only while the references are under the cap: for a seat with a mark,
/// the owed receipts of the messages after it (below it every owed receipt
/// has its reference); for one without, among at most [`COUNTED_MAX`] of
/// its undelivered receipts.
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
         -- Receipts are examined only when the references have not
         -- already reached the cap.
         SELECT q.n AS queued,
                (SELECT n FROM handed_out) AS handed_out,
                CASE WHEN q.n >= $6 THEN 0 ELSE (SELECT count(*) FROM unqueued) END AS unqueued,
                q.n >= $6
                OR EXISTS (SELECT 1 FROM examined GROUP BY member_id HAVING count(*) >= $6)
                AS at_least
           FROM queued q",
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
