//! One worker pass over a slot: publish it with nothing held (asking the
//! backend by key first when the last attempt went unanswered), then settle;
//! and asking the backend before a last attempt is written off.

use sqlx::PgPool;

use super::lease::{lease, release};
use super::settle::settle;
use super::{Lease, Settled, gives_up};
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
    let outcome = attempt(backend, lease).await;
    settle_attempt(pool, backend, lease, outcome).await
}

/// One attempt at a leased slot, with nothing held. A slot whose last
/// attempt went unanswered may have landed: the backend is asked by the
/// publish key first (O16), and only "nothing is held under this key" leads
/// to a publish; a landed body is settled from the answer, never published
/// again. A backend that cannot be asked has not answered this attempt
/// either, and it is counted as one.
pub async fn attempt<B: MessagingBackend>(backend: &B, lease: &Lease) -> Published {
    if lease.uncertain {
        match backend.reconcile(&lease.envelope()).await {
            Ok(Some(locator)) => return Published::Confirmed(locator),
            Ok(None) => {}
            Err(e) => {
                return Published::Unanswered(format!(
                    "the {} backend could not be asked whether it holds this body ({e})",
                    lease.backend
                ));
            }
        }
    }
    backend.publish(&lease.envelope()).await
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
    if !gives_up(lease.attempts) {
        return settle(pool, lease, outcome).await;
    }
    match outcome {
        Published::Retryable(_) => {
            if let Some(locator) = backend.reconcile(&lease.envelope()).await? {
                return settle(pool, lease, Published::Confirmed(locator)).await;
            }
        }
        // The last of the slot's attempts went unanswered: asked once more
        // by key, a landed body is stored; otherwise the slot gives up,
        // saying that nobody knows (`mark_uncertain`). A backend that cannot
        // be asked either does not keep the slot in flight: that is the
        // backend that never answers, and the seed gives up on it.
        Published::Unanswered(_) => {
            if let Ok(Some(locator)) = backend.reconcile(&lease.envelope()).await {
                return settle(pool, lease, Published::Confirmed(locator)).await;
            }
        }
        _ => {}
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
