//! Claiming and settling delivery rows, for the dispatcher
//! (`workers/webhook_dispatcher.rs`).
//!
//! A claim takes due rows with `FOR UPDATE SKIP LOCKED` (replicas skip each
//! other's rows, never wait on them) and leases them: state `delivering`, a
//! lease id, and `next_attempt_at` moved to the lease's end. The claim's
//! transaction is that one statement; the send happens after it committed,
//! with nothing held. While the lease holds, no other replica takes the row;
//! a replica that dies mid-send leaves it to be claimed again when the lease
//! lapses (the receiver may then see the delivery twice, with the same
//! delivery id to de-duplicate on).
//!
//! Every settle names the lease: a row re-claimed after its lease lapsed, or
//! deleted with its hook, is left alone (`false`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::WebhookKind;
use crate::error::BusResult;

/// Attempts before a retryable failure becomes `failed`.
pub const MAX_ATTEMPTS: i32 = 6;
/// Characters of an error kept on the row.
const ERROR_MAX_CHARS: usize = 500;

/// One leased delivery, with what sending it needs.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Claimed {
    pub id: Uuid,
    pub lease_id: Uuid,
    pub webhook_id: Uuid,
    pub team: String,
    pub event: String,
    pub payload: Value,
    /// Counting this one.
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
    pub url: String,
    pub kind: WebhookKind,
    pub secret: String,
    pub allow_private: bool,
}

/// Lease up to `batch` due deliveries (oldest due first) for `lease`, none of
/// a paused hook. The hook's row is locked `FOR SHARE SKIP LOCKED`: a pause
/// being made holds it, so the claim skips that hook's rows rather than
/// read it as active from a snapshot taken before the pause committed, and a
/// pause waits for a claim that locked it first. Once [`super::set_paused`]
/// has returned, no claim leases another of its deliveries. Skipping, not
/// waiting: a hook being removed holds its row while it deletes the
/// deliveries a claim may hold, and waiting there would close a deadlock.
pub async fn claim(pool: &PgPool, batch: i64, lease: Duration) -> BusResult<Vec<Claimed>> {
    let lease_id = Uuid::new_v4();
    Ok(sqlx::query_as(
        "WITH due AS (
             SELECT d.id FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
             WHERE d.state IN ('pending', 'delivering') AND d.next_attempt_at <= now()
               AND w.paused_at IS NULL
             ORDER BY d.next_attempt_at
             LIMIT $1
             FOR UPDATE OF d SKIP LOCKED
             FOR SHARE OF w SKIP LOCKED)
         UPDATE webhook_deliveries d
         SET state = 'delivering', lease_id = $2, attempts = d.attempts + 1,
             next_attempt_at = now() + make_interval(secs => $3)
         FROM due, webhooks w, teams t
         WHERE d.id = due.id AND w.id = d.webhook_id AND t.id = d.team_id
         RETURNING d.id, d.lease_id, d.webhook_id, t.slug AS team, d.event, d.payload,
                   d.attempts, d.created_at, w.url, w.kind, w.secret, w.allow_private",
    )
    .bind(batch)
    .bind(lease_id)
    .bind(lease.as_secs_f64())
    .fetch_all(pool)
    .await?)
}

/// The receiver took it (a 2xx).
pub async fn settle_delivered(pool: &PgPool, claimed: &Claimed, status: u16) -> BusResult<bool> {
    let done = sqlx::query(
        "UPDATE webhook_deliveries
         SET state = 'delivered', delivered_at = now(), lease_id = NULL, last_status = $3,
             last_error = NULL
         WHERE id = $1 AND lease_id = $2",
    )
    .bind(claimed.id)
    .bind(claimed.lease_id)
    .bind(i32::from(status))
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// How a failed attempt was settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Back to pending, due again after the backoff.
    Retrying,
    /// Given up: permanent, or out of attempts.
    Failed,
    /// The lease was no longer ours (or the hook is gone): nothing written.
    Fenced,
}

/// A failed attempt: `permanent` (a 4xx other than 408/429, a refused
/// address) fails at once; otherwise it is retried after `backoff`, until
/// [`MAX_ATTEMPTS`].
pub async fn settle_failed(
    pool: &PgPool,
    claimed: &Claimed,
    status: Option<u16>,
    error: &str,
    permanent: bool,
    backoff: Duration,
) -> BusResult<Settled> {
    let error: String = error.chars().take(ERROR_MAX_CHARS).collect();
    let state: Option<String> = sqlx::query_scalar(
        "UPDATE webhook_deliveries
         SET state = CASE WHEN $5 OR attempts >= $6 THEN 'failed' ELSE 'pending' END,
             next_attempt_at = now() + make_interval(secs => $7),
             lease_id = NULL, last_status = $3, last_error = $4
         WHERE id = $1 AND lease_id = $2
         RETURNING state",
    )
    .bind(claimed.id)
    .bind(claimed.lease_id)
    .bind(status.map(i32::from))
    .bind(&error)
    .bind(permanent)
    .bind(MAX_ATTEMPTS)
    .bind(backoff.as_secs_f64())
    .fetch_optional(pool)
    .await?;
    Ok(match state.as_deref() {
        None => Settled::Fenced,
        Some("failed") => Settled::Failed,
        Some(_) => Settled::Retrying,
    })
}

/// Delete delivered rows older than `keep`, at most `batch`; failed rows
/// stay until their hook is removed, so `webhook list` keeps showing why.
pub async fn prune_delivered(pool: &PgPool, keep: Duration, batch: i64) -> BusResult<u64> {
    Ok(sqlx::query(
        "DELETE FROM webhook_deliveries WHERE id IN (
             SELECT id FROM webhook_deliveries
             WHERE state = 'delivered' AND delivered_at < now() - make_interval(secs => $1)
             LIMIT $2)",
    )
    .bind(keep.as_secs_f64())
    .bind(batch)
    .execute(pool)
    .await?
    .rows_affected())
}
