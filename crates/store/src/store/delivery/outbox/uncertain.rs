//! A publish that ended without an answer: the slot goes back to pending
//! after the retry backoff, the message is marked uncertain
//! (`mark_uncertain`), and its next attempt, or the reconciler before it
//! (`resolve_uncertain`), asks the backend by key what it holds. Each
//! unanswered attempt counts: the last one ends the slot `failed`, saying
//! that nobody knows whether the body was stored, and how to bring it back.

use sqlx::PgPool;
use uuid::Uuid;

use super::lease::{lease_one, unlease};
use super::settle::settle;
use super::{ATTEMPTS_MAX, Lease, Settled, backoff_secs, gives_up};
use crate::backend::{BackendKind, MessagingBackend, Published};
use crate::error::BusResult;

/// Settle a lease whose publish ended without an answer (O16): the message is
/// neither stored nor failed, and claiming either would be a guess. The slot
/// goes back to pending, due again after the same backoff as a retryable
/// outcome (O8) under the same key, the message is marked uncertain once, and
/// the next attempt asks the backend by key before publishing again. The
/// attempt counted: on the last one the outbox gives up rather than retrying
/// for ever, the slot and the message `failed` together with a reason an
/// operator acts on (`conversations retry` brings it back), the message still
/// marked uncertain because that is what it is.
pub async fn mark_uncertain(pool: &PgPool, lease: &Lease, why: &str) -> BusResult<Settled> {
    let give_up = gives_up(lease.attempts);
    let reason = if give_up {
        let retry = match lease.backend {
            BackendKind::Jetstream => {
                "ai-crew-sync conversations retry --team TEAM --nats-url URL --apply"
            }
            BackendKind::Postgres => "ai-crew-sync conversations retry --team TEAM --apply",
        };
        format!(
            "attempt {} of {ATTEMPTS_MAX} to publish this body to the {} backend ended without an \
             answer ({why}), as the last ones did, and the outbox gave up: whether the backend \
             stored it is not known. Once the broker answers again (`/health`, `ai-crew-sync \
             conversations status --team TEAM`), `{retry}` publishes it again: it asks the \
             broker by the same key first, so a body that did land is not stored twice.",
            lease.attempts, lease.backend
        )
    } else {
        why.to_owned()
    };
    let mut tx = pool.begin().await?;
    let held: Option<Uuid> = sqlx::query_scalar(
        "UPDATE conversation_outbox
            SET state = CASE WHEN $5 THEN 'failed' ELSE 'pending' END,
                leased_by = NULL, lease_expires_at = NULL,
                next_attempt_at = now() + make_interval(secs => $3),
                last_error = $4, updated_at = now()
          WHERE message_id = $1 AND generation = $2
          RETURNING message_id",
    )
    .bind(lease.message_id)
    .bind(lease.generation)
    .bind(backoff_secs(lease.attempts))
    .bind(&reason)
    .bind(give_up)
    .fetch_optional(&mut *tx)
    .await?;
    if held.is_none() {
        return Ok(Settled::Fenced);
    }
    sqlx::query(
        "UPDATE conversation_messages
            SET uncertain_at = COALESCE(uncertain_at, now()),
                publication_state = CASE WHEN $3 THEN 'failed' ELSE publication_state END
          WHERE team_id = $1 AND id = $2",
    )
    .bind(lease.team_id)
    .bind(lease.message_id)
    .bind(give_up)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    if give_up {
        return Ok(Settled::Failed);
    }
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
    .bind(backend.kind())
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
pub async fn teams_with_uncertain(pool: &PgPool) -> BusResult<Vec<(Uuid, BackendKind)>> {
    Ok(sqlx::query_as(
        "SELECT DISTINCT o.team_id, o.backend
           FROM conversation_outbox o
           JOIN conversation_messages m ON m.team_id = o.team_id AND m.id = o.message_id
          WHERE o.state <> 'failed' AND m.uncertain_at IS NOT NULL",
    )
    .fetch_all(pool)
    .await?)
}
