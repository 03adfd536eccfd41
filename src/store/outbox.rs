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
//! only, as the seed has it: it still lands after expiry while nobody has
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

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::backend::{Backends, Envelope, Locator, MessagingBackend, Published};
use crate::error::{BusError, BusResult};

/// How long a worker holds a slot before it is fair game again.
pub const LEASE_SECS: i64 = 60;
/// Attempts before a slot is marked failed rather than retried forever.
pub const MAX_ATTEMPTS: i32 = 8;
/// Largest payload one slot holds: the ceiling on what a pending slot costs.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// When an uncertain slot is due again.
const UNCERTAIN_RETRY_SECS: f64 = 5.0;
/// When a slot waiting on a condition an operator can fix (a stream missing
/// or full) is tried again: often enough that messages go out soon after the
/// fix, seldom enough that a large backlog costs the broker little.
pub const WAIT_RECHECK_SECS: f64 = 10.0;

/// A slot a worker holds.
#[derive(Clone, Debug)]
pub struct Lease {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub team_id: Uuid,
    /// The backend this slot was enqueued for; a worker for another one must
    /// not publish it.
    pub backend: String,
    pub payload: String,
    pub publish_key: Uuid,
    /// The generation this lease was taken at. A settle that does not match
    /// is a worker someone else has leased the slot from since, and it
    /// changes nothing.
    pub generation: i64,
    pub attempts: i32,
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
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(BusError::invalid(format!(
            "the message body is {} bytes; the outbox holds at most {MAX_PAYLOAD_BYTES} bytes \
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
/// This is the seed's enqueue for a message that already exists.
pub async fn enqueue(
    tx: &mut sqlx::PgConnection,
    message_id: Uuid,
    conversation_id: Uuid,
    team_id: Uuid,
    backend: &str,
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

type LeaseRow = (Uuid, Uuid, Uuid, String, String, Uuid, i64, i32);
type DueRow = (
    Uuid,
    Uuid,
    Uuid,
    String,
    String,
    Uuid,
    i64,
    i32,
    DateTime<Utc>,
);

fn lease_of(row: LeaseRow) -> Lease {
    let (message_id, conversation_id, team_id, backend, payload, publish_key, generation, attempts) =
        row;
    Lease {
        message_id,
        conversation_id,
        team_id,
        backend,
        payload,
        publish_key,
        generation,
        attempts,
    }
}

/// Take the next due slot, oldest first (O4). `SKIP LOCKED`, so N workers
/// never take the same one; the generation and the attempts are bumped here.
pub async fn lease(pool: &PgPool, worker: &str) -> BusResult<Option<Lease>> {
    Ok(lease_due(pool, worker, None, 1).await?.pop())
}

/// Take up to `limit` due slots at once, oldest first, under the same rules
/// as [`lease`]; `backends` narrows them to slots this worker can publish
/// (a replica without a broker leaves the broker's slots to one that has it).
pub async fn lease_due(
    pool: &PgPool,
    worker: &str,
    backends: Option<&[&str]>,
    limit: i64,
) -> BusResult<Vec<Lease>> {
    // The due slots are picked and locked once, in a materialized CTE, and
    // the update joins to exactly those rows. (As a `WHERE message_id IN
    // (sub-select FOR UPDATE SKIP LOCKED)` the sub-select is part of the
    // update's plan: with many drains leasing and settling the same rows,
    // one such lease was seen re-checking rows for minutes while holding
    // its locks, and every settle behind it waited.)
    let rows: Vec<DueRow> = sqlx::query_as(
        "WITH due AS MATERIALIZED (
             SELECT message_id FROM conversation_outbox
              WHERE state IN ('pending', 'leased')
                AND next_attempt_at <= now()
                AND (lease_expires_at IS NULL OR lease_expires_at < now())
                AND ($3::text[] IS NULL OR backend = ANY($3))
              ORDER BY next_attempt_at, created_at
              LIMIT $4
              FOR UPDATE SKIP LOCKED)
         UPDATE conversation_outbox o
            SET state = 'leased', leased_by = $1,
                lease_expires_at = now() + make_interval(secs => $2),
                generation = o.generation + 1, attempts = o.attempts + 1, updated_at = now()
           FROM due
          WHERE o.message_id = due.message_id
          RETURNING o.message_id, o.conversation_id, o.team_id, o.backend, o.payload,
                    o.publish_key, o.generation, o.attempts, o.created_at",
    )
    .bind(worker)
    .bind(LEASE_SECS as f64)
    .bind(backends)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let mut leases: Vec<(DateTime<Utc>, Lease)> = rows
        .into_iter()
        .map(|(m, c, t, b, p, k, g, a, created_at)| {
            (created_at, lease_of((m, c, t, b, p, k, g, a)))
        })
        .collect();
    // RETURNING has no order; hand them out oldest first.
    leases.sort_by_key(|(created_at, _)| *created_at);
    Ok(leases.into_iter().map(|(_, lease)| lease).collect())
}

/// Take one named slot, for the reconciler (O5): only a slot still in flight,
/// never a `failed` one (a failed slot is terminal; leasing it would hand it
/// back to the ordinary path, which would republish it once the lease ran
/// out). Counts no attempt. Public for the reconciler's callers and for the
/// tests that show the fence.
pub async fn lease_one(pool: &PgPool, worker: &str, message_id: Uuid) -> BusResult<Option<Lease>> {
    let row: Option<LeaseRow> = sqlx::query_as(
        "UPDATE conversation_outbox o
            SET state = 'leased', leased_by = $1,
                lease_expires_at = now() + make_interval(secs => $3),
                generation = o.generation + 1, updated_at = now()
          WHERE o.message_id = $2
            AND o.state IN ('pending', 'leased')
            AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
          RETURNING o.message_id, o.conversation_id, o.team_id, o.backend, o.payload,
                    o.publish_key, o.generation, o.attempts",
    )
    .bind(worker)
    .bind(message_id)
    .bind(LEASE_SECS as f64)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(lease_of))
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

/// The fence every settlement shares: this generation, and a lease that has
/// not run out. A worker whose lease expired no longer owns the slot, whether
/// or not anyone else has picked it up yet.
macro_rules! held {
    () => {
        "message_id = $1 AND generation = $2
         AND lease_expires_at IS NOT NULL AND lease_expires_at > now()"
    };
}

/// Record the outcome of one attempt, fenced by the generation the lease was
/// taken at (O6-O9, O16).
pub async fn settle(pool: &PgPool, lease: &Lease, outcome: Published) -> BusResult<Settled> {
    match outcome {
        Published::Confirmed(Locator(locator)) => settle_stored(pool, lease, &locator).await,
        Published::Retryable(why) => settle_retryable(pool, lease, &why).await,
        Published::Blocked(why) => settle_waiting(pool, lease, &why).await,
        Published::Fatal(why) => settle_fatal(pool, lease, &why).await,
        Published::Unanswered(why) => mark_uncertain(pool, lease, &why).await,
    }
}

async fn settle_stored(pool: &PgPool, lease: &Lease, locator: &str) -> BusResult<Settled> {
    let mut tx = pool.begin().await?;
    lock_conversations(&mut tx, &[(lease.team_id, lease.conversation_id)]).await?;
    let deleted: Option<Uuid> = sqlx::query_scalar(concat!(
        "DELETE FROM conversation_outbox WHERE ",
        held!(),
        " RETURNING message_id"
    ))
    .bind(lease.message_id)
    .bind(lease.generation)
    .fetch_optional(&mut *tx)
    .await?;
    if deleted.is_none() {
        return Ok(Settled::Fenced);
    }
    // Stored, and only now: the receipts were written at acceptance with
    // `stored_at` null on this path (O7).
    sqlx::query(
        "WITH stored AS (
             UPDATE conversation_messages
                SET publication_state = 'stored', canonical_locator = $3, uncertain_at = NULL
              WHERE team_id = $1 AND id = $2)
         UPDATE message_receipts SET stored_at = COALESCE(stored_at, now())
          WHERE team_id = $1 AND message_id = $2",
    )
    .bind(lease.team_id)
    .bind(lease.message_id)
    .bind(locator)
    .execute(&mut *tx)
    .await?;
    // The recipients can be told it exists now, in this transaction: no
    // stored message without its references, no reference to a message
    // nobody stored.
    super::inbox::enqueue_message_references(&mut tx, &[(lease.team_id, lease.message_id)]).await?;
    tx.commit().await?;
    Ok(Settled::Stored)
}

/// Settle many confirmations in one transaction: the same fence and the same
/// writes as a single confirmation (O6, O7), per slot, in four statements
/// whatever the count. Returns the messages that became stored; the others
/// were fenced and nothing was written for them.
pub async fn settle_confirmed_batch(
    pool: &PgPool,
    confirmed: &[(Lease, Locator)],
) -> BusResult<Vec<Uuid>> {
    if confirmed.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = confirmed.iter().map(|(l, _)| l.message_id).collect();
    let generations: Vec<i64> = confirmed.iter().map(|(l, _)| l.generation).collect();
    let locators: Vec<String> = confirmed.iter().map(|(_, loc)| loc.0.clone()).collect();
    let conversations: Vec<(Uuid, Uuid)> = confirmed
        .iter()
        .map(|(l, _)| (l.team_id, l.conversation_id))
        .collect();
    let mut tx = pool.begin().await?;
    lock_conversations(&mut tx, &conversations).await?;
    let stored: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "WITH won AS (
             DELETE FROM conversation_outbox o
              USING unnest($1::uuid[], $2::bigint[]) AS s(message_id, generation)
              WHERE o.message_id = s.message_id AND o.generation = s.generation
                AND o.lease_expires_at IS NOT NULL AND o.lease_expires_at > now()
              RETURNING o.team_id, o.message_id),
         located AS (
             SELECT won.team_id, won.message_id, l.locator
               FROM won JOIN unnest($1::uuid[], $3::text[]) AS l(message_id, locator)
                 ON l.message_id = won.message_id),
         marked AS (
             UPDATE conversation_messages m
                SET publication_state = 'stored', canonical_locator = located.locator,
                    uncertain_at = NULL
               FROM located
              WHERE m.team_id = located.team_id AND m.id = located.message_id),
         receipts AS (
             UPDATE message_receipts r SET stored_at = COALESCE(r.stored_at, now())
               FROM located
              WHERE r.team_id = located.team_id AND r.message_id = located.message_id)
         SELECT team_id, message_id FROM located",
    )
    .bind(&ids)
    .bind(&generations)
    .bind(&locators)
    .fetch_all(&mut *tx)
    .await?;
    super::inbox::enqueue_message_references(&mut tx, &stored).await?;
    tx.commit().await?;
    Ok(stored.into_iter().map(|(_, id)| id).collect())
}

/// The lock order of every conversation writer, conversation rows first: a
/// settle writes inbox references, whose keys share-lock the conversation
/// row, after the message and receipt rows a seat transfer also updates
/// under that row. Taken up front (key-share, in id order) the settle queues
/// behind such writers instead of deadlocking with them.
async fn lock_conversations(
    tx: &mut sqlx::PgConnection,
    conversations: &[(Uuid, Uuid)],
) -> BusResult<()> {
    let teams: Vec<Uuid> = conversations.iter().map(|c| c.0).collect();
    let ids: Vec<Uuid> = conversations.iter().map(|c| c.1).collect();
    sqlx::query(
        "SELECT 1 FROM conversations c
           JOIN unnest($1::uuid[], $2::uuid[]) AS k(team_id, id)
             ON c.team_id = k.team_id AND c.id = k.id
          ORDER BY c.id
            FOR KEY SHARE OF c",
    )
    .bind(&teams)
    .bind(&ids)
    .execute(tx)
    .await?;
    Ok(())
}

async fn settle_retryable(pool: &PgPool, lease: &Lease, why: &str) -> BusResult<Settled> {
    // Backs off rather than spinning, gives up rather than retrying for ever
    // (O8). The slot and the message change together: a slot marked failed
    // beside a message still saying pending is a gap nobody resolves.
    let give_up = lease.attempts >= MAX_ATTEMPTS;
    let backoff = (1_i64 << lease.attempts.clamp(0, 6)) as f64;
    let mut tx = pool.begin().await?;
    let updated: Option<Uuid> = sqlx::query_scalar(concat!(
        "UPDATE conversation_outbox
            SET state = CASE WHEN $4 THEN 'failed' ELSE 'pending' END,
                leased_by = NULL, lease_expires_at = NULL,
                next_attempt_at = now() + make_interval(secs => $3),
                last_error = $5, updated_at = now()
          WHERE ",
        held!(),
        "
          RETURNING message_id"
    ))
    .bind(lease.message_id)
    .bind(lease.generation)
    .bind(backoff)
    .bind(give_up)
    .bind(why)
    .fetch_optional(&mut *tx)
    .await?;
    if updated.is_none() {
        return Ok(Settled::Fenced);
    }
    if !give_up {
        tx.commit().await?;
        return Ok(Settled::Retrying {
            attempts: lease.attempts,
        });
    }
    mark_failed(&mut tx, lease).await?;
    tx.commit().await?;
    Ok(Settled::Failed)
}

/// Put a slot back to pending without spending the attempt its lease counted,
/// due again in [`WAIT_RECHECK_SECS`]; fenced like every settlement (the
/// generation and an unexpired lease). `last_error` says what it waits for.
pub async fn settle_waiting(pool: &PgPool, lease: &Lease, why: &str) -> BusResult<Settled> {
    let updated: Option<Uuid> = sqlx::query_scalar(concat!(
        "UPDATE conversation_outbox
            SET state = 'pending', leased_by = NULL, lease_expires_at = NULL,
                attempts = GREATEST(attempts - 1, 0),
                next_attempt_at = now() + make_interval(secs => $3),
                last_error = $4, updated_at = now()
          WHERE ",
        held!(),
        "
          RETURNING message_id"
    ))
    .bind(lease.message_id)
    .bind(lease.generation)
    .bind(WAIT_RECHECK_SECS)
    .bind(why)
    .fetch_optional(pool)
    .await?;
    Ok(match updated {
        Some(_) => Settled::Waiting,
        None => Settled::Fenced,
    })
}

async fn settle_fatal(pool: &PgPool, lease: &Lease, why: &str) -> BusResult<Settled> {
    let mut tx = pool.begin().await?;
    let updated: Option<Uuid> = sqlx::query_scalar(concat!(
        "UPDATE conversation_outbox
            SET state = 'failed', leased_by = NULL, lease_expires_at = NULL,
                last_error = $3, updated_at = now()
          WHERE ",
        held!(),
        "
          RETURNING message_id"
    ))
    .bind(lease.message_id)
    .bind(lease.generation)
    .bind(why)
    .fetch_optional(&mut *tx)
    .await?;
    if updated.is_none() {
        return Ok(Settled::Fenced);
    }
    mark_failed(&mut tx, lease).await?;
    tx.commit().await?;
    Ok(Settled::Failed)
}

async fn mark_failed(conn: &mut sqlx::PgConnection, lease: &Lease) -> BusResult<()> {
    sqlx::query(
        "UPDATE conversation_messages SET publication_state = 'failed'
          WHERE team_id = $1 AND id = $2",
    )
    .bind(lease.team_id)
    .bind(lease.message_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Ask the backend what it holds for a leased slot and settle from its answer
/// (O10): a locator is stored; nothing is an ordinary retry.
pub async fn reconcile<B: MessagingBackend>(
    pool: &PgPool,
    backend: &B,
    lease: &Lease,
) -> BusResult<Settled> {
    match backend.reconcile(&lease.envelope()).await? {
        Some(locator) => settle(pool, lease, Published::Confirmed(locator)).await,
        None => {
            let why = "the backend holds nothing for this key";
            settle(pool, lease, Published::Retryable(why.into())).await
        }
    }
}

/// Publish one leased slot with nothing held, and record what happened (O11).
///
/// On the last attempt a retryable outcome asks the backend before writing a
/// failure: "did not answer" and "does not have it" are different facts, and
/// giving up on the first records the second.
pub async fn publish_leased<B: MessagingBackend>(
    pool: &PgPool,
    backend: &B,
    lease: &Lease,
) -> BusResult<Settled> {
    let outcome = backend.publish(&lease.envelope()).await;
    settle_attempt(pool, backend, lease, outcome).await
}

/// [`publish_leased`]'s settlement, for a caller that ran the publish itself
/// (the drain, which bounds it with a timeout).
pub async fn settle_attempt<B: MessagingBackend>(
    pool: &PgPool,
    backend: &B,
    lease: &Lease,
    outcome: Published,
) -> BusResult<Settled> {
    // A Blocked outcome (the operator's to fix) waits in `settle` without
    // spending an attempt, whatever other attempts reported meanwhile.
    if matches!(outcome, Published::Retryable(_))
        && lease.attempts >= MAX_ATTEMPTS
        && let Some(locator) = backend.reconcile(&lease.envelope()).await?
    {
        return settle(pool, lease, Published::Confirmed(locator)).await;
    }
    settle(pool, lease, outcome).await
}

/// One worker pass: lease, publish outside any transaction, settle. A slot
/// enqueued for another backend is put back without spending an attempt and
/// reported `Fenced` (O12): published here, it would sit where nobody reads.
pub async fn run_once<B: MessagingBackend>(
    pool: &PgPool,
    backend: &B,
    worker: &str,
) -> BusResult<Option<Settled>> {
    let Some(lease) = lease(pool, worker).await? else {
        return Ok(None);
    };
    if lease.backend != backend.name() {
        tracing::warn!(
            slot = %lease.message_id,
            wanted = %lease.backend,
            worker = backend.name(),
            "a worker leased a slot for another backend; releasing it"
        );
        release(pool, &lease, "leased by a worker for another backend").await?;
        return Ok(Some(Settled::Fenced));
    }
    Ok(Some(publish_leased(pool, backend, &lease).await?))
}

/// Put a leased slot back without counting it as an attempt (O12).
pub async fn release(pool: &PgPool, lease: &Lease, why: &str) -> BusResult<()> {
    sqlx::query(
        "UPDATE conversation_outbox
            SET state = 'pending', leased_by = NULL, lease_expires_at = NULL,
                attempts = GREATEST(attempts - 1, 0), last_error = $3, updated_at = now()
          WHERE message_id = $1 AND generation = $2",
    )
    .bind(lease.message_id)
    .bind(lease.generation)
    .bind(why)
    .execute(pool)
    .await?;
    Ok(())
}

/// Put back a slot the reconciler took, as it was (O13): `lease_one` counted
/// no attempt, so none is given back. Fenced on the generation, so a slot
/// someone else holds by now is left alone.
pub async fn unlease(pool: &PgPool, lease: &Lease) -> BusResult<()> {
    sqlx::query(
        "UPDATE conversation_outbox
            SET state = 'pending', leased_by = NULL, lease_expires_at = NULL, updated_at = now()
          WHERE message_id = $1 AND generation = $2",
    )
    .bind(lease.message_id)
    .bind(lease.generation)
    .execute(pool)
    .await?;
    Ok(())
}

/// What is outstanding for a team (O14).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Status {
    pub pending: i64,
    pub leased: i64,
    pub failed: i64,
    /// Age of the oldest slot not failed.
    pub oldest_pending_seconds: Option<i64>,
    /// Bytes waiting for publication (failed slots excluded).
    pub pending_bytes: i64,
    /// Messages whose last attempt ended without an answer.
    pub uncertain: i64,
}

pub async fn status(pool: &PgPool, team_id: Uuid) -> BusResult<Status> {
    status_of(pool, Some(team_id)).await
}

/// [`status`] over every team: what `/health` reports.
pub async fn installation_status(pool: &PgPool) -> BusResult<Status> {
    status_of(pool, None).await
}

async fn status_of(pool: &PgPool, team_id: Option<Uuid>) -> BusResult<Status> {
    // extract(epoch …) is numeric; cast it rather than decode a numeric.
    let row: (i64, i64, i64, Option<i64>, Option<i64>, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE o.state = 'pending'),
                count(*) FILTER (WHERE o.state = 'leased'),
                count(*) FILTER (WHERE o.state = 'failed'),
                extract(epoch FROM now() - min(o.created_at) FILTER (WHERE o.state <> 'failed'))::bigint,
                sum(o.payload_bytes) FILTER (WHERE o.state <> 'failed')::bigint,
                (SELECT count(*) FROM conversation_messages m
                  WHERE ($1::uuid IS NULL OR m.team_id = $1) AND m.uncertain_at IS NOT NULL)
           FROM conversation_outbox o WHERE ($1::uuid IS NULL OR o.team_id = $1)",
    )
    .bind(team_id)
    .fetch_one(pool)
    .await?;
    Ok(Status {
        pending: row.0,
        leased: row.1,
        failed: row.2,
        oldest_pending_seconds: row.3,
        pending_bytes: row.4.unwrap_or(0),
        uncertain: row.5,
    })
}

/// Switch a conversation between synchronous and outbox publication (O15).
///
/// Takes the conversation row, the lock a send takes for its sequence, so no
/// send enqueues work for a mode that has just been switched off. Returning
/// to sync is refused while anything of the conversation is still in flight:
/// nobody would drain it, and readers would see a gap that never closes.
pub async fn set_publication(
    pool: &PgPool,
    team_id: Uuid,
    conversation_id: Uuid,
    outbox: bool,
) -> BusResult<()> {
    let mut tx = pool.begin().await?;
    switch_publication(&mut tx, team_id, conversation_id, outbox).await?;
    tx.commit().await?;
    Ok(())
}

/// [`set_publication`] inside the caller's transaction (an operator's switch
/// writes its audit row in the same one). Answers the mode the conversation
/// had before, `sync` or `outbox`.
pub(crate) async fn switch_publication(
    tx: &mut sqlx::PgConnection,
    team_id: Uuid,
    conversation_id: Uuid,
    outbox: bool,
) -> BusResult<String> {
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT backend, publication FROM conversations WHERE team_id = $1 AND id = $2 FOR UPDATE",
    )
    .bind(team_id)
    .bind(conversation_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((backend, before)) = row else {
        return Err(BusError::not_found(format!(
            "no conversation {conversation_id} in this team."
        )));
    };
    if !outbox && backend != crate::backend::PostgresBackend::NAME {
        return Err(BusError::conflict(format!(
            "conversation {conversation_id} keeps its bodies on {backend}, which only the outbox \
             publishes to. Move it to postgres (`conversations migrate --to postgres`) instead."
        )));
    }
    if !outbox {
        let in_flight: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_outbox
              WHERE conversation_id = $1 AND state <> 'failed'",
        )
        .bind(conversation_id)
        .fetch_one(&mut *tx)
        .await?;
        if in_flight > 0 {
            return Err(BusError::conflict(format!(
                "{in_flight} message(s) of conversation {conversation_id} are still awaiting \
                 publication. Let them settle (`conversations status` shows the outbox) before \
                 returning to synchronous mode, or the thread keeps a gap nobody will close."
            )));
        }
    }
    sqlx::query("UPDATE conversations SET publication = $3 WHERE team_id = $1 AND id = $2")
        .bind(team_id)
        .bind(conversation_id)
        .bind(if outbox { "outbox" } else { "sync" })
        .execute(&mut *tx)
        .await?;
    Ok(before)
}

/// Settle a lease whose publish ended without an answer (O16): the message is
/// neither stored nor failed, and claiming either would be a guess. The slot
/// goes back to pending (due again shortly, under the same key), the message
/// is marked uncertain once, and [`resolve_uncertain`] asks the backend.
pub async fn mark_uncertain(pool: &PgPool, lease: &Lease, why: &str) -> BusResult<Settled> {
    let mut tx = pool.begin().await?;
    let held: Option<Uuid> = sqlx::query_scalar(
        "UPDATE conversation_outbox
            SET state = 'pending', leased_by = NULL, lease_expires_at = NULL,
                next_attempt_at = now() + make_interval(secs => $3),
                last_error = $4, updated_at = now()
          WHERE message_id = $1 AND generation = $2
          RETURNING message_id",
    )
    .bind(lease.message_id)
    .bind(lease.generation)
    .bind(UNCERTAIN_RETRY_SECS)
    .bind(why)
    .fetch_optional(&mut *tx)
    .await?;
    if held.is_none() {
        return Ok(Settled::Fenced);
    }
    sqlx::query(
        "UPDATE conversation_messages SET uncertain_at = COALESCE(uncertain_at, now())
          WHERE team_id = $1 AND id = $2",
    )
    .bind(lease.team_id)
    .bind(lease.message_id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Settled::Retrying {
        attempts: lease.attempts,
    })
}

/// Ask the backend about every uncertain slot of a team and settle each one
/// (O17). Each slot is taken with its own lease (never a failed one): settling
/// is fenced on holding a lease, and reconciling without one would write
/// nothing and then report success. Returns how many became stored.
pub async fn resolve_uncertain<B: MessagingBackend>(
    pool: &PgPool,
    backend: &B,
    team_id: Uuid,
) -> BusResult<usize> {
    let slots: Vec<Uuid> = sqlx::query_scalar(
        "SELECT o.message_id
           FROM conversation_outbox o
           JOIN conversation_messages m ON m.team_id = o.team_id AND m.id = o.message_id
          WHERE o.team_id = $1 AND o.backend = $2 AND o.state <> 'failed'
            AND m.uncertain_at IS NOT NULL
          ORDER BY o.created_at",
    )
    .bind(team_id)
    .bind(backend.name())
    .fetch_all(pool)
    .await?;
    let mut resolved = 0;
    for message_id in slots {
        let Some(lease) = lease_one(pool, "reconciler", message_id).await? else {
            continue;
        };
        match backend.reconcile(&lease.envelope()).await {
            Ok(Some(locator)) => {
                if settle(pool, &lease, Published::Confirmed(locator)).await? == Settled::Stored {
                    resolved += 1;
                }
            }
            // Nothing landed: back to pending, where the ordinary retry path
            // takes it at once. Left leased, it would sit out a whole lease.
            Ok(None) => unlease(pool, &lease).await?,
            Err(e) => {
                // The reconcile error is the one worth reporting; a slot that
                // cannot be put back comes back when its lease runs out.
                if let Err(unlease_error) = unlease(pool, &lease).await {
                    tracing::warn!(error = %unlease_error, slot = %message_id,
                        "could not put back a slot after a failed reconcile");
                }
                return Err(e);
            }
        }
    }
    sqlx::query(
        "UPDATE conversation_messages SET uncertain_at = NULL
          WHERE team_id = $1 AND uncertain_at IS NOT NULL AND publication_state = 'stored'",
    )
    .bind(team_id)
    .execute(pool)
    .await?;
    Ok(resolved)
}

/// The teams with an uncertain publication, for the reconciler's pass.
pub async fn teams_with_uncertain(pool: &PgPool) -> BusResult<Vec<(Uuid, String)>> {
    Ok(sqlx::query_as(
        "SELECT DISTINCT o.team_id, o.backend
           FROM conversation_outbox o
           JOIN conversation_messages m ON m.team_id = o.team_id AND m.id = o.message_id
          WHERE o.state <> 'failed' AND m.uncertain_at IS NOT NULL",
    )
    .fetch_all(pool)
    .await?)
}

/// Bodies one sweep pass releases at most: a large backlog costs bounded work.
pub const RELEASE_BATCH: usize = 200;
/// Candidates one pass examines at most (also the ceiling on backend reads),
/// higher than the batch so a run of unconfirmable bodies is stepped over.
pub const SCAN_LIMIT: usize = 1_000;
/// Candidates read from PostgreSQL at a time while scanning.
const PAGE: i64 = 200;
/// A migration in one of these states holds its messages' bodies.
macro_rules! no_migration_holds {
    () => {
        "NOT EXISTS (
            SELECT 1 FROM conversation_migration_items i
              JOIN conversation_migrations g ON g.id = i.migration_id
             WHERE i.message_id = m.id
               AND g.state IN ('planned', 'copying', 'verified', 'cut_over'))"
    };
}

type Candidate = (Uuid, Uuid, String, String, Vec<u8>, DateTime<Utc>);

/// Drop the local copy of bodies whose backend confirms, now, that it holds
/// them (O18). Until then a body lives in both places on purpose: losing it
/// to a failed publish would be worse than storing it twice for a while.
///
/// The confirmation is read at sweep time, never taken from flags written at
/// publish time: the locator must resolve now and the body must hash to the
/// recorded digest. An unreachable broker, or one that lost its stream,
/// confirms nothing, and the local copy (then the last readable one) stays.
/// Never a postgres-backed message (the row is the storage) and never one a
/// migration holds. `min_age_secs` is the grace period during which a reader
/// still gets the local copy without a round trip to the backend.
pub async fn release_published_bodies(
    pool: &PgPool,
    backends: &Backends,
    conversation: Option<Uuid>,
    min_age_secs: i64,
) -> BusResult<u64> {
    match backends.broker_reachable().await {
        Some(true) => {}
        // Unreachable: nothing can be confirmed. Not configured: whether a
        // broker comes back is not this process's to decide.
        Some(false) | None => return Ok(0),
    }
    let mut cursor: Option<(DateTime<Utc>, Uuid)> = None;
    let mut examined = 0usize;
    let mut confirmed: Vec<Uuid> = Vec::new();
    // A backend that fails is skipped for the rest of this pass, per team:
    // other teams' bodies are still confirmable.
    let mut unusable: HashSet<(String, Uuid)> = HashSet::new();
    'scan: while examined < SCAN_LIMIT && confirmed.len() < RELEASE_BATCH {
        let page: Vec<Candidate> =
            sqlx::query_as(concat!(
        "SELECT m.id, m.team_id, m.backend, m.canonical_locator, m.body_sha256, m.created_at
               FROM conversation_messages m
               JOIN conversations c ON c.team_id = m.team_id AND c.id = m.conversation_id
              WHERE ($1::uuid IS NULL OR m.conversation_id = $1)
                AND c.backend <> 'postgres' AND m.backend <> 'postgres'
                AND m.publication_state = 'stored'
                AND m.canonical_locator IS NOT NULL
                AND m.body <> ''
                AND m.created_at <= now() - make_interval(secs => $2)
                AND ($4::timestamptz IS NULL OR (m.created_at, m.id) > ($4, $5))
                AND ", no_migration_holds!(), "
              ORDER BY m.created_at, m.id
              LIMIT $3"
    ))
            .bind(conversation)
            .bind(min_age_secs as f64)
            .bind(PAGE)
            .bind(cursor.map(|c| c.0))
            .bind(cursor.map(|c| c.1))
            .fetch_all(pool)
            .await?;
        if page.is_empty() {
            break;
        }
        for (message_id, team_id, backend_name, locator, digest, created_at) in page {
            cursor = Some((created_at, message_id));
            examined += 1;
            if unusable.contains(&(backend_name.clone(), team_id)) {
                continue;
            }
            let backend = match backends.for_message(&backend_name, team_id) {
                Ok(backend) => backend,
                Err(e) => {
                    tracing::debug!(error = %e, %team_id, "this backend cannot be opened; its bodies stay");
                    unusable.insert((backend_name, team_id));
                    continue;
                }
            };
            match backend.fetch_once(&Locator(locator), message_id).await {
                Ok(Some(body)) if body_digest(&body)[..] == digest[..] => {
                    confirmed.push(message_id)
                }
                Ok(Some(_)) => tracing::warn!(%message_id,
                    "the backend holds a different body under this locator; keeping the local copy"),
                Ok(None) => tracing::warn!(%message_id,
                    "the backend no longer holds this body; keeping the local copy"),
                Err(e) => {
                    tracing::debug!(error = %e, %message_id, "the backend did not answer; its bodies stay");
                    unusable.insert((backend_name, team_id));
                }
            }
            if confirmed.len() >= RELEASE_BATCH || examined >= SCAN_LIMIT {
                break 'scan;
            }
        }
    }
    if confirmed.is_empty() {
        return Ok(0);
    }
    // The whole predicate again at clearing time: a cutover that committed
    // while this pass talked to the backend may have made the row
    // postgres-authoritative, and then that copy is the history.
    let cleared = sqlx::query(concat!(
        "UPDATE conversation_messages m
            SET body = ''
           FROM conversations c
          WHERE m.id = ANY($1)
            AND c.team_id = m.team_id AND c.id = m.conversation_id
            AND c.backend <> 'postgres' AND m.backend <> 'postgres'
            AND m.publication_state = 'stored'
            AND m.canonical_locator IS NOT NULL
            AND m.body <> ''
            AND ",
        no_migration_holds!(),
        ""
    ))
    .bind(&confirmed)
    .execute(pool)
    .await?;
    Ok(cleared.rows_affected())
}

/// The SHA-256 of a body, as recorded in `conversation_messages.body_sha256`.
pub fn body_digest(body: &str) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(body.as_bytes()).into()
}

/// [`tombstone`] for a reader that found a released body gone: only if the
/// row is still that released body on that backend and locator (a move that
/// committed meanwhile may have made the row the record again). Unlike
/// [`tombstone`] it keeps a reason already recorded: what a reader found
/// never replaces what an operator wrote.
pub async fn tombstone_released(
    pool: &PgPool,
    message_id: Uuid,
    backend: &str,
    locator: &str,
    reason: &str,
) -> BusResult<bool> {
    let done = sqlx::query(
        "UPDATE conversation_messages
            SET tombstoned_at = COALESCE(tombstoned_at, now()),
                tombstone_reason = COALESCE(tombstone_reason, $4)
          WHERE id = $1 AND body = '' AND backend = $2 AND canonical_locator = $3",
    )
    .bind(message_id)
    .bind(backend)
    .bind(locator)
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Record that a body is no longer retrievable from its backend (O19). The
/// message, its seq, its recipients and its receipts all stay: a gap that is
/// explained is not the same as a gap. As in the seed, the time is set once
/// (when the body was first known gone) and the reason is the latest one
/// given: a deliberate tombstone explains the gap better than what a reader
/// found.
pub async fn tombstone(pool: &PgPool, message_id: Uuid, reason: &str) -> BusResult<()> {
    sqlx::query(
        "UPDATE conversation_messages
            SET tombstoned_at = COALESCE(tombstoned_at, now()), tombstone_reason = $2
          WHERE id = $1",
    )
    .bind(message_id)
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(())
}

/// One conversation's publication, as `conversations status` shows it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ConversationPublication {
    pub conversation_id: Uuid,
    pub title: String,
    pub backend: String,
    /// `sync` or `outbox`.
    pub publication: String,
    /// Seconds writes have been paused for a backend move, if they are.
    pub paused_seconds: Option<i64>,
    pub pending: i64,
    pub failed: i64,
    pub uncertain: i64,
}

/// `conversations status --team T`: the team's routing, its outbox, and every
/// conversation that is not plain synchronous PostgreSQL or has anything
/// outstanding.
#[derive(Clone, Debug, Serialize)]
pub struct TeamPublication {
    pub team: String,
    /// Where new conversations go.
    pub conversation_backend: String,
    pub outbox: Status,
    pub conversations: Vec<ConversationPublication>,
}

pub async fn team_report(pool: &PgPool, team: &str) -> BusResult<TeamPublication> {
    let found = super::teams::find(pool, team).await?;
    let conversation_backend: String =
        sqlx::query_scalar("SELECT conversation_backend FROM teams WHERE id = $1")
            .bind(found.id)
            .fetch_one(pool)
            .await?;
    let outbox = status(pool, found.id).await?;
    let conversations: Vec<ConversationPublication> = sqlx::query_as(
        "SELECT c.id AS conversation_id, c.title, c.backend, c.publication,
                extract(epoch FROM now() - c.write_paused_at)::bigint AS paused_seconds,
                count(o.message_id) FILTER (WHERE o.state <> 'failed') AS pending,
                count(o.message_id) FILTER (WHERE o.state = 'failed') AS failed,
                (SELECT count(*) FROM conversation_messages m
                  WHERE m.team_id = c.team_id AND m.conversation_id = c.id
                    AND m.uncertain_at IS NOT NULL) AS uncertain
           FROM conversations c
           LEFT JOIN conversation_outbox o ON o.conversation_id = c.id
          WHERE c.team_id = $1
          GROUP BY c.id
         HAVING c.backend <> 'postgres' OR c.publication <> 'sync'
             OR c.write_paused_at IS NOT NULL OR count(o.message_id) > 0
          ORDER BY c.created_at",
    )
    .bind(found.id)
    .fetch_all(pool)
    .await?;
    Ok(TeamPublication {
        team: found.slug,
        conversation_backend,
        outbox,
        conversations,
    })
}
