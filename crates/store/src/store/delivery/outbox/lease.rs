//! Taking slots: the next due ones (`lease`, `lease_due`, `SKIP LOCKED`, an
//! attempt counted) or one named slot for the reconciler (`lease_one`, none
//! counted); and putting a leased slot back without an outcome (`release`,
//! `unlease`), fenced on the generation only.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{LEASE_SECS, Lease};
use crate::backend::BackendKind;
use crate::error::BusResult;

/// A due slot taken, with when it was enqueued (to hand them out in order).
#[derive(sqlx::FromRow)]
struct Due {
    #[sqlx(flatten)]
    lease: Lease,
    created_at: DateTime<Utc>,
}

/// The columns a lease returns, `uncertain` read from the slot's message by
/// its primary key (one lookup per slot taken).
macro_rules! lease_returning {
    () => {
        " RETURNING o.message_id, o.conversation_id, o.team_id, o.backend, o.payload,
                    o.publish_key, o.generation, o.attempts,
                    EXISTS (SELECT 1 FROM conversation_messages m
                             WHERE m.team_id = o.team_id AND m.id = o.message_id
                               AND m.uncertain_at IS NOT NULL) AS uncertain"
    };
}

/// Take the next due slot, oldest first (O4). `SKIP LOCKED`, so N workers
/// never take the same one; the generation and the attempts are bumped here.
pub async fn lease(pool: &PgPool, worker: &str) -> BusResult<Option<Lease>> {
    Ok(lease_due(pool, worker, None, 1).await?.pop())
}

/// Take up to `limit` due slots at once, oldest first, under the same rules
/// as [`lease`]; `backends` narrows them to slots this worker can publish
/// (a replica without a broker leaves the broker's slots to one that has it).
/// On a pool the lease commits at once; on an open transaction its row locks
/// are held until that commits, and every other lease skips those slots.
pub async fn lease_due<'e>(
    db: impl sqlx::PgExecutor<'e>,
    worker: &str,
    backends: Option<&[BackendKind]>,
    limit: i64,
) -> BusResult<Vec<Lease>> {
    // The due slots are picked and locked once, in a sub-select the update
    // only reads as an array (an init plan, run once before the update), and
    // the update finds exactly those rows by primary key. Joined instead (a
    // CTE, or `IN (sub-select)`), the planner does not know how few rows
    // the sub-select returns and hashed the whole outbox to find them: a
    // scan of every slot per lease, 27 of the 48 ms a 256-slot lease took
    // at a 20 000-slot backlog. (As a `WHERE message_id IN (sub-select FOR
    // UPDATE SKIP LOCKED)` the sub-select is also part of the update's
    // plan: with many drains leasing and settling the same rows, one such
    // lease was seen re-checking rows for minutes while holding its locks.)
    let mut due: Vec<Due> = sqlx::query_as(concat!(
        "UPDATE conversation_outbox o
            SET state = 'leased', leased_by = $1,
                lease_expires_at = now() + make_interval(secs => $2),
                generation = o.generation + 1, attempts = o.attempts + 1, updated_at = now()
          WHERE o.message_id = ANY(ARRAY(
              SELECT message_id FROM conversation_outbox
               WHERE state IN ('pending', 'leased')
                 AND next_attempt_at <= now()
                 AND (lease_expires_at IS NULL OR lease_expires_at < now())
                 AND ($3::text[] IS NULL OR backend = ANY($3))
               ORDER BY next_attempt_at, created_at
               LIMIT $4
               FOR UPDATE SKIP LOCKED))",
        lease_returning!(),
        ", o.created_at"
    ))
    .bind(worker)
    .bind(LEASE_SECS as f64)
    .bind(backends)
    .bind(limit)
    .fetch_all(db)
    .await?;
    // RETURNING has no order; hand them out oldest first.
    due.sort_by_key(|d| d.created_at);
    Ok(due.into_iter().map(|d| d.lease).collect())
}

/// Take one named slot, for the reconciler (O5): only a slot still in flight,
/// never a `failed` one (a failed slot is terminal; leasing it would hand it
/// back to the ordinary path, which would republish it once the lease ran
/// out). Counts no attempt. Public for the reconciler's callers and for the
/// tests that show the fence.
pub async fn lease_one(pool: &PgPool, worker: &str, message_id: Uuid) -> BusResult<Option<Lease>> {
    let lease: Option<Lease> = sqlx::query_as(concat!(
        "UPDATE conversation_outbox o
            SET state = 'leased', leased_by = $1,
                lease_expires_at = now() + make_interval(secs => $3),
                generation = o.generation + 1, updated_at = now()
          WHERE o.message_id = $2
            AND o.state IN ('pending', 'leased')
            AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())",
        lease_returning!()
    ))
    .bind(worker)
    .bind(message_id)
    .bind(LEASE_SECS as f64)
    .fetch_optional(pool)
    .await?;
    Ok(lease)
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
