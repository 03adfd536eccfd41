//! The outbox: accept a message now, publish its body to a backend later, and
//! be honest in between.
//!
//! A conversation with `publication = outbox` enqueues a slot in the send's
//! own transaction, so there is no accepted message without a slot and no slot
//! without a message. Workers lease slots like every other unit of work on
//! this bus (`FOR UPDATE SKIP LOCKED`), fenced by a generation, bounded in
//! attempts and payload size. A worker that comes back after its lease
//! expired records no outcome: confirmed (single and batch), retryable and
//! fatal settles need the generation and an unexpired lease. Putting a slot
//! back (`mark_uncertain`, `release`, `unlease`) is fenced on the generation
//! only, on purpose: it still lands after expiry while nobody has
//! leased the slot again, and only returns the slot to pending. The states a slot reaches are the ones a reader is told
//! about: pending, stored, failed, and "uncertain" while nobody knows.
//!
//! Network work never happens inside a transaction here: a worker leases in
//! one short transaction, publishes with nothing held, and settles in another.
//! A publish that takes a minute costs a lease, not a lock.
//!
//! What the outbox deliberately does not do: report `stored` on acceptance,
//! let a reader's cursor walk past a pending message, or replay a side effect
//! (every attempt presents the same `publish_key`, and the backend resolves a
//! duplicate to one canonical locator).
//!
//! Layout: this file holds the limits, the types a worker sees (`Lease`,
//! `Settled`) and `enqueue`; `lease` taking slots and putting them back
//! (`release`, `unlease`, fenced on the generation only); `settle` recording
//! an attempt's outcome under the shared fence (`held!`) and the
//! conversation lock order; `publish` one worker pass (publish with nothing
//! held, then settle); `uncertain` a publish nobody knows the end of and the
//! reconciler that asks the backend; `mode` switching a conversation between
//! sync and outbox; `bodies` releasing local copies the backend confirms, and
//! tombstones; `status` what is outstanding, per team and per installation.

use uuid::Uuid;

use crate::backend::{BackendKind, Envelope};
use crate::error::{BusError, BusResult};

mod bodies;
mod lease;
mod mode;
mod publish;
mod settle;
mod status;
mod uncertain;
pub use bodies::{
    RELEASE_BATCH, SCAN_LIMIT, body_digest, release_published_bodies, tombstone, tombstone_released,
};
pub use lease::{lease, lease_due, lease_one, release, unlease};
pub use mode::set_publication;
pub(crate) use mode::switch_publication;
pub use publish::{attempt, publish_leased, reconcile, run_once, settle_attempt};
pub use settle::{settle, settle_confirmed_batch, settle_waiting};
pub use status::{
    ConversationPublication, Status, TeamBacklog, TeamPublication, backlog_by_team,
    installation_status, status, team_report,
};
pub use uncertain::{mark_uncertain, resolve_uncertain, teams_with_uncertain};

/// How long a worker holds a slot before it is fair game again.
pub const LEASE_SECS: i64 = 60;
/// Attempts before a slot is marked failed rather than retried forever.
pub const ATTEMPTS_MAX: i32 = 8;

/// When a slot whose attempt `attempts` was refused for now (O8) or went
/// unanswered (O16) is due again: 2^min(attempts,6) s, so a backend that
/// keeps failing is asked less and less often, never more than a minute
/// apart. One rule for both outcomes.
pub fn backoff_secs(attempts: i32) -> f64 {
    (1_i64 << attempts.clamp(0, 6)) as f64
}

/// Whether attempt `attempts` was the last one: the slot ends `failed`
/// rather than being retried for ever (O8, O16).
pub fn gives_up(attempts: i32) -> bool {
    attempts >= ATTEMPTS_MAX
}
/// Largest payload one slot holds: the ceiling on what a pending slot costs.
/// A slot holds one body, so this is the bus's body cap.
pub const PAYLOAD_MAX_BYTES: usize = crate::store::limits::BODY_MAX_BYTES;
/// When a slot waiting on a condition an operator can fix (a stream missing
/// or full) is tried again: often enough that messages go out soon after the
/// fix, seldom enough that a large backlog costs the broker little.
pub const WAIT_RECHECK_SECS: f64 = 10.0;

/// A slot a worker holds (read from a lease's `RETURNING` columns).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Lease {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub team_id: Uuid,
    /// The backend this slot was enqueued for; a worker for another one must
    /// not publish it.
    pub backend: BackendKind,
    pub payload: String,
    pub publish_key: Uuid,
    /// The generation this lease was taken at. A settle that does not match
    /// is a worker someone else has leased the slot from since, and it
    /// changes nothing.
    pub generation: i64,
    pub attempts: i32,
    /// The message's last attempt ended without an answer (`uncertain_at`
    /// set): this attempt asks the backend by key before publishing again.
    pub uncertain: bool,
}

impl Lease {
    pub fn envelope(&self) -> Envelope {
        Envelope {
            message_id: self.message_id,
            conversation_id: self.conversation_id,
            team_id: self.team_id,
            body: self.payload.clone(),
            publish_key: self.publish_key,
        }
    }
}

/// The refusal for a payload over the cap, before anything is written (O1).
pub fn check_payload(payload: &str) -> BusResult<()> {
    if payload.len() > PAYLOAD_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "the message body is {} bytes; the outbox holds at most {PAYLOAD_MAX_BYTES} bytes \
             (1 MiB) per message. Send a shorter body, or split it into several messages.",
            payload.len()
        )));
    }
    Ok(())
}

/// Queue a message for publication, inside the sending transaction (O2), and
/// mark it `pending_publication` there too (O3). A second enqueue of the same
/// message writes nothing. Returns the publish key of the message's slot.
///
/// A send does not call this: `store_conversation_message` (migration 0014)
/// inserts its message as `pending_publication` and writes the same slot
/// (same columns, a fresh time-ordered key) in the send's own transaction.
/// This is the outbox's enqueue for a message that already exists (O2, O3).
pub async fn enqueue(
    tx: &mut sqlx::PgConnection,
    message_id: Uuid,
    conversation_id: Uuid,
    team_id: Uuid,
    backend: BackendKind,
    payload: &str,
) -> BusResult<Uuid> {
    check_payload(payload)?;
    let publish_key: Uuid = sqlx::query_scalar(
        "WITH slot AS (
             INSERT INTO conversation_outbox
                 (message_id, conversation_id, team_id, backend, payload, payload_bytes, publish_key)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (message_id) DO NOTHING
             RETURNING publish_key),
         marked AS (
             UPDATE conversation_messages SET publication_state = 'pending_publication'
              WHERE team_id = $3 AND id = $1)
         SELECT publish_key FROM slot
         UNION ALL
         SELECT publish_key FROM conversation_outbox WHERE message_id = $1
         LIMIT 1",
    )
    .bind(message_id)
    .bind(conversation_id)
    .bind(team_id)
    .bind(backend)
    .bind(payload)
    .bind(payload.len() as i32)
    // Time-ordered, like message ids: the unique index on it is appended to.
    .bind(Uuid::now_v7())
    .fetch_one(&mut *tx)
    .await?;
    Ok(publish_key)
}

/// What settling a lease did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Confirmed and recorded: the slot is gone and the message is stored.
    Stored,
    /// Not this time; the slot is due again after a backoff.
    Retrying { attempts: i32 },
    /// It will not be published. The slot stays, visible and explicit.
    Failed,
    /// Refused because of a condition an operator can fix (the team's stream
    /// missing or full): back to pending without spending an attempt, due
    /// again in [`WAIT_RECHECK_SECS`].
    Waiting,
    /// This worker's lease had expired or someone else holds the slot.
    /// Nothing was written: the fence doing its job.
    Fenced,
}
