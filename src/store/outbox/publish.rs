//! One worker pass over a slot: publish it with nothing held, then settle;
//! and asking the backend before a last retryable attempt is written off.

use sqlx::PgPool;

use super::lease::{lease, release};
use super::settle::settle;
use super::{ATTEMPTS_MAX, Lease, Settled};
use crate::backend::{MessagingBackend, Published};
use crate::error::BusResult;

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
        && lease.attempts >= ATTEMPTS_MAX
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
    if lease.backend != backend.kind() {
        tracing::warn!(
            slot = %lease.message_id,
            wanted = %lease.backend,
            worker = %backend.kind(),
            "a worker leased a slot for another backend; releasing it"
        );
        release(pool, &lease, "leased by a worker for another backend").await?;
        return Ok(Some(Settled::Fenced));
    }
    Ok(Some(publish_leased(pool, backend, &lease).await?))
}
