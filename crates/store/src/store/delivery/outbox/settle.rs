//! Recording the outcome of one attempt: stored (one slot or a batch),
//! retrying with a backoff, waiting on an operator's fix, or failed. Every
//! one is fenced by `held!` (the lease's generation and an unexpired lease),
//! and a confirmation takes the conversation rows first, in the lock order
//! of every conversation writer.

use sqlx::PgPool;
use uuid::Uuid;

use super::uncertain::mark_uncertain;
use super::{Lease, Settled, WAIT_RECHECK_SECS, backoff_secs, gives_up};
use crate::backend::{Locator, Published};
use crate::error::BusResult;
use crate::store::conversations::inbox;

/// The fence every settlement shares: this generation, and a lease that has
/// not run out. A worker whose lease expired no longer owns the slot, whether
/// or not anyone else has picked it up yet.
macro_rules! held {
    () => {
        "message_id = $1 AND generation = $2
         AND lease_expires_at IS NOT NULL AND lease_expires_at > now()"
    };
}

/// `$statement` (an UPDATE or a DELETE of `conversation_outbox`) under the
/// fence, its `$1` and `$2` bound from `$lease` (the statement's own
/// parameters start at `$3`): returns the slot's `message_id` when the lease
/// still held it.
macro_rules! fenced {
    ($statement:literal, $lease:expr) => {
        sqlx::query_scalar(concat!(
            $statement,
            " WHERE ",
            held!(),
            " RETURNING message_id"
        ))
        .bind($lease.message_id)
        .bind($lease.generation)
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
    let deleted: Option<Uuid> = fenced!("DELETE FROM conversation_outbox", lease)
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
    inbox::enqueue_message_references(&mut tx, &[(lease.team_id, lease.message_id)]).await?;
    tx.commit().await?;
    Ok(Settled::Stored)
}

/// Settle many confirmations at once: the same fence and the same writes as
/// a single confirmation (O6, O7), per slot, in one statement (so one round
/// trip and one implicit transaction) whatever the count. Returns the
/// messages that became stored; the others were fenced and nothing was
/// written for them.
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
    // Each conversation once: locking one row 256 times over cost ~8 ms.
    let mut conversations: Vec<(Uuid, Uuid)> = confirmed
        .iter()
        .map(|(l, _)| (l.team_id, l.conversation_id))
        .collect();
    conversations.sort_unstable();
    conversations.dedup();
    let (teams, conversations): (Vec<Uuid>, Vec<Uuid>) = conversations.into_iter().unzip();
    // In the lock order of every conversation writer (see
    // `lock_conversations`): the conversation rows are key-share locked by an
    // init plan of the delete that gates it (`(SELECT count(*) FROM locked)
    // >= 0`), so before any slot, message or receipt row. Each slot is then
    // looked up by primary key from its own (id, generation) pair and locked
    // under the fence (the lateral sub-select with a `LIMIT` cannot be
    // flattened into a join), and deleted by primary key. Written as a plain
    // join of the outbox to the unnested arrays, the planner, trusting that
    // few slots hold a live lease, compared every slot with every pair:
    // 65 000 comparisons, ~30 ms of a 256-slot batch. The references read
    // the statement's snapshot: none of the columns they copy changes here.
    let stored: Vec<(Uuid, Uuid)> = sqlx::query_as(concat!(
        "WITH locked AS MATERIALIZED (
             SELECT c.id FROM conversations c
               JOIN unnest($4::uuid[], $5::uuid[]) AS k(team_id, id)
                 ON c.team_id = k.team_id AND c.id = k.id
              ORDER BY c.id
                FOR KEY SHARE OF c),
         won AS (
             DELETE FROM conversation_outbox o
              WHERE (SELECT count(*) FROM locked) >= 0
                AND o.message_id = ANY(ARRAY(
                  SELECT held.message_id
                    FROM unnest($1::uuid[], $2::bigint[]) AS s(message_id, generation)
                   CROSS JOIN LATERAL (
                       SELECT h.message_id FROM conversation_outbox h
                        WHERE h.message_id = s.message_id AND h.generation = s.generation
                          AND h.lease_expires_at IS NOT NULL AND h.lease_expires_at > now()
                        LIMIT 1
                          FOR UPDATE) AS held))
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
              WHERE r.team_id = located.team_id AND r.message_id = located.message_id),
         refs AS (",
        inbox::message_references_sql!("located"),
        ")
         SELECT team_id, message_id FROM located"
    ))
    .bind(&ids)
    .bind(&generations)
    .bind(&locators)
    .bind(&teams)
    .bind(&conversations)
    .fetch_all(pool)
    .await?;
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
    let give_up = gives_up(lease.attempts);
    let backoff = backoff_secs(lease.attempts);
    let mut tx = pool.begin().await?;
    let updated: Option<Uuid> = fenced!(
        "UPDATE conversation_outbox
            SET state = CASE WHEN $4 THEN 'failed' ELSE 'pending' END,
                leased_by = NULL, lease_expires_at = NULL,
                next_attempt_at = now() + make_interval(secs => $3),
                last_error = $5, updated_at = now()",
        lease
    )
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
    let updated: Option<Uuid> = fenced!(
        "UPDATE conversation_outbox
            SET state = 'pending', leased_by = NULL, lease_expires_at = NULL,
                attempts = GREATEST(attempts - 1, 0),
                next_attempt_at = now() + make_interval(secs => $3),
                last_error = $4, updated_at = now()",
        lease
    )
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
    let updated: Option<Uuid> = fenced!(
        "UPDATE conversation_outbox
            SET state = 'failed', leased_by = NULL, lease_expires_at = NULL,
                last_error = $3, updated_at = now()",
        lease
    )
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
