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
//! - The counts stop at [`COUNTED_MAX`] and then say "at least"; they run
//!   in `inbox_owed_counts` (migration 0051) on its generic plan.

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
    /// A bare agent token wears the label of a live registered window:
    /// refused, nothing counted.
    pub borrowed: bool,
    /// References not yet confirmed.
    pub queued: i64,
    /// Of those, handed out in the last [`HANDOUT_SECS`].
    pub handed_out: i64,
    /// Receipts owed that no reference names yet.
    pub unqueued: i64,
    /// Some count stopped at [`COUNTED_MAX`]: the total is a lower bound.
    pub at_least: bool,
}

/// Counts bounded by [`COUNTED_MAX`], after the borrowed-label refusal, in
/// one call: `inbox_owed_counts` (migration 0051), which always runs its
/// generic plan (as a prepared statement sent from here, it was planned
/// again for every call once the team's history was large: issue 34).
/// Receipts not yet referenced are counted only while the references are
/// under the cap: for a seat with a mark, the owed receipts of the messages
/// after it (below it every owed receipt has its reference); for one
/// without, among at most [`COUNTED_MAX`] of its undelivered receipts.
pub(super) async fn counts(pool: &sqlx::PgPool, me: &Identity, key: &str) -> BusResult<Counts> {
    let counts: Counts = sqlx::query_as(
        "SELECT borrowed, queued, handed_out, unqueued, at_least
         FROM inbox_owed_counts($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(me.session_credential.is_none() && !me.window.is_empty())
    .bind(key)
    .bind(HANDOUT_SECS)
    .bind(COUNTED_MAX)
    .fetch_one(pool)
    .await?;
    if counts.borrowed {
        return Err(crate::store::conversations::borrowed_label(me));
    }
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
