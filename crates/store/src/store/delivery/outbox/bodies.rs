//! The local copy of a published body: released once the backend confirms,
//! at sweep time, that it holds it; and tombstones for a body no longer
//! retrievable from anywhere.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::backend::{BackendKind, Backends, Locator, MessagingBackend};
use crate::error::BusResult;

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

type Candidate = (Uuid, Uuid, BackendKind, String, Vec<u8>, DateTime<Utc>);

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
    let mut unusable: HashSet<(BackendKind, Uuid)> = HashSet::new();
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
        for (message_id, team_id, backend_kind, locator, digest, created_at) in page {
            cursor = Some((created_at, message_id));
            examined += 1;
            if unusable.contains(&(backend_kind, team_id)) {
                continue;
            }
            let backend = match backends.for_message(backend_kind, team_id) {
                Ok(backend) => backend,
                Err(e) => {
                    tracing::debug!(error = %e, %team_id, "this backend cannot be opened; its bodies stay");
                    unusable.insert((backend_kind, team_id));
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
                    unusable.insert((backend_kind, team_id));
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
    backend: BackendKind,
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
/// explained is not the same as a gap. The time is set once
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
