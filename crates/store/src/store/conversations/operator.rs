//! What an operator does to one conversation that no agent may: switch its
//! publication between `sync` and `outbox` (O15), and tombstone one message
//! deliberately with a reason (O19). The outbox module has both; these
//! are the commands that reach them (`conversations publication`,
//! `conversations tombstone`).
//!
//! Each is one transaction that takes the conversation row first (the lock a
//! send, a move's pause, cutover and abort take, so they queue instead of
//! racing) and writes its `audit_log` row beside the change. An answer that
//! changed nothing writes no audit row; a refusal writes nothing at all.
//!
//! What this deliberately does not do: rewrite a tombstone (the first reason
//! and time stay; a second one is refused), erase a body (a tombstone
//! explains a gap to readers; it is not a purge), or switch a conversation a
//! move is working on (the cutover decides its publication).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::{BusError, BusResult};
use crate::store::conversations::Publication;
use crate::store::{Actor, delivery::outbox, identity::audit, identity::teams};

/// What `conversations publication` did.
#[derive(Clone, Debug, Serialize)]
pub struct PublicationSwitched {
    pub conversation_id: Uuid,
    pub before: Publication,
    pub after: Publication,
    /// False when the conversation already had that mode (nothing written).
    pub changed: bool,
}

/// Switch one conversation's publication, audited (O15). Back to `sync` is
/// refused while any slot of it is still in flight (the outbox's rule, in
/// [`outbox::switch_publication`]); either way is refused while a move
/// between backends is open on it.
pub async fn set_publication(
    pool: &PgPool,
    team_slug: &str,
    conversation_id: Uuid,
    mode: Publication,
    actor: &Actor,
) -> BusResult<PublicationSwitched> {
    let team = teams::find(pool, team_slug).await?;
    let mut tx = pool.begin().await?;
    // The admin fence before the conversation's row, as a prune batch takes
    // them: the other order closes a cycle with a prune and a queued
    // revocation of the same credential.
    audit::fence(&mut tx, actor, "nothing was changed").await?;
    // The outbox's switch takes the conversation row (the lock a send
    // takes), so what follows runs under it too.
    let before = outbox::switch_publication(&mut tx, team.id, conversation_id, mode).await?;
    // An open move sets the publication itself when it cuts over (under this
    // row), so a switch now would be silently undone. Refused: the
    // transaction rolls back and nothing is changed.
    let open_move: Option<(String, String)> = sqlx::query_as(
        "SELECT direction, state FROM conversation_migrations
          WHERE conversation_id = $1 AND state IN ('planned', 'copying', 'verified')",
    )
    .bind(conversation_id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((direction, state)) = open_move {
        return Err(BusError::conflict(format!(
            "conversation {conversation_id} has an open move ({direction}, {state}); the move \
             sets its publication when it cuts over. Nothing was changed. Finish it (run the \
             same `conversations migrate … --apply` again) and switch afterwards."
        )));
    }
    let changed = before != mode;
    if changed {
        audit::record(
            &mut tx,
            Some(team.id),
            actor,
            "conversation.publication",
            &conversation_id.to_string(),
            json!({ "conversation_id": conversation_id, "before": before, "after": mode }),
        )
        .await?;
        tx.commit().await?;
    }
    Ok(PublicationSwitched {
        conversation_id,
        before,
        after: mode,
        changed,
    })
}

/// The longest reason a tombstone keeps (what a reader is shown).
pub const TOMBSTONE_REASON_MAX_BYTES: usize = 500;

/// What `conversations tombstone` did.
#[derive(Clone, Debug, Serialize)]
pub struct Tombstoned {
    pub conversation_id: Uuid,
    pub message_id: Uuid,
    pub seq: i64,
    pub tombstoned_at: DateTime<Utc>,
    /// What a reader is shown in place of the body (`unavailable.detail`).
    pub reason: String,
}

/// Tombstone message `seq` of a conversation deliberately, audited (O19):
/// `tombstoned_at` and the reason are set once; the message, its seq, its
/// recipients and its receipts stay, and readers get `unavailable:
/// tombstoned` with the reason instead of the body. A move skips it (M5). A
/// message already tombstoned is refused, naming the first reason.
pub async fn tombstone_message(
    pool: &PgPool,
    team_slug: &str,
    conversation_id: Uuid,
    seq: i64,
    reason: &str,
    actor: &Actor,
) -> BusResult<Tombstoned> {
    let reason = check_reason(reason)?;
    // Readers are told who decided, so a deliberate gap never reads like a
    // lost body.
    let shown = format!("tombstoned by an operator: {reason}");
    let team = teams::find(pool, team_slug).await?;
    let mut tx = pool.begin().await?;
    let last_seq = lock_conversation(&mut tx, team.id, &team.slug, conversation_id).await?;
    // Only a message without a tombstone: the first time and reason stay,
    // whoever recorded them (a reader records one for a released body gone
    // from its backend, without this row lock).
    let done: Option<(Uuid, DateTime<Utc>)> = sqlx::query_as(
        "UPDATE conversation_messages
            SET tombstoned_at = now(), tombstone_reason = $4
          WHERE team_id = $1 AND conversation_id = $2 AND seq = $3 AND tombstoned_at IS NULL
          RETURNING id, tombstoned_at",
    )
    .bind(team.id)
    .bind(conversation_id)
    .bind(seq)
    .bind(&shown)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((message_id, tombstoned_at)) = done else {
        let earlier: Option<(Option<DateTime<Utc>>, Option<String>)> = sqlx::query_as(
            "SELECT tombstoned_at, tombstone_reason FROM conversation_messages
              WHERE team_id = $1 AND conversation_id = $2 AND seq = $3",
        )
        .bind(team.id)
        .bind(conversation_id)
        .bind(seq)
        .fetch_optional(&mut *tx)
        .await?;
        return Err(match earlier {
            Some((at, earlier_reason)) => BusError::conflict(format!(
                "message seq {seq} of conversation {conversation_id} was already tombstoned at \
                 {} (reason: {}). A tombstone is recorded once and never rewritten; nothing was \
                 changed.",
                at.map(|at| at.to_rfc3339()).unwrap_or_default(),
                earlier_reason.unwrap_or_default()
            )),
            None => BusError::not_found(format!(
                "conversation {conversation_id} has no message with seq {seq} (its seqs run from \
                 1 to {last_seq}). Nothing was changed."
            )),
        });
    };
    audit::record(
        &mut tx,
        Some(team.id),
        actor,
        "conversation.tombstone",
        &message_id.to_string(),
        json!({ "conversation_id": conversation_id, "message_id": message_id, "seq": seq,
                "reason": reason }),
    )
    .await?;
    tx.commit().await?;
    Ok(Tombstoned {
        conversation_id,
        message_id,
        seq,
        tombstoned_at,
        reason: shown,
    })
}

fn check_reason(reason: &str) -> BusResult<String> {
    let reason = crate::store::text::one_line("tombstone reason", reason)?;
    if reason.is_empty() {
        return Err(BusError::invalid(
            "a tombstone needs a reason: readers see it instead of the body (e.g. \"the stream \
             holding it was lost\"). Nothing was changed.",
        ));
    }
    if reason.len() > TOMBSTONE_REASON_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "the reason is {} bytes; a tombstone keeps at most {TOMBSTONE_REASON_MAX_BYTES}. Say \
             it shorter. Nothing was changed.",
            reason.len()
        )));
    }
    Ok(reason)
}

/// The conversation row, locked; its `last_seq`. A conversation of another
/// team reads as missing.
async fn lock_conversation(
    tx: &mut sqlx::PgConnection,
    team_id: Uuid,
    team_slug: &str,
    conversation_id: Uuid,
) -> BusResult<i64> {
    sqlx::query_scalar(
        "SELECT last_seq FROM conversations WHERE team_id = $1 AND id = $2 FOR UPDATE",
    )
    .bind(team_id)
    .bind(conversation_id)
    .fetch_optional(tx)
    .await?
    .ok_or_else(|| {
        BusError::not_found(format!(
            "team `{team_slug}` has no conversation {conversation_id}. `ai-crew-sync \
             conversations status --team {team_slug}` lists those off the plain path; an agent's \
             `list_conversations` shows the rest."
        ))
    })
}
