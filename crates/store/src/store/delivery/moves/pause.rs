//! The write pause a move holds while it copies the tail and cuts over:
//! lifting one that no open move owns (after an abort, or an operator's
//! `conversations unpause`), and whether a conversation is paused now.

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::{lock_conversation, open_run_of};
use crate::error::{BusError, BusResult};
use crate::store::{Actor, identity::audit};

/// Lift the conversation's pause unless an open run owns it; whether it was
/// lifted. The caller holds the conversation's lock.
pub(super) async fn lift_orphaned_pause(
    conn: &mut sqlx::PgConnection,
    team_id: Uuid,
    conversation_id: Uuid,
) -> BusResult<bool> {
    let lifted = sqlx::query(
        "UPDATE conversations c SET write_paused_at = NULL
          WHERE c.team_id = $1 AND c.id = $2 AND c.write_paused_at IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM conversation_migrations g
                             WHERE g.conversation_id = c.id
                               AND g.state IN ('planned', 'copying', 'verified'))",
    )
    .bind(team_id)
    .bind(conversation_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(lifted > 0)
}

/// What `conversations unpause` did.
#[derive(Clone, Debug, Serialize)]
pub struct Unpaused {
    pub conversation_id: Uuid,
    /// How long writes had been paused, when they were; `None`: they were
    /// not, and nothing was changed.
    pub paused_seconds: Option<i64>,
}

/// Lift a pause no move owns (an operator's way out of a thread left paused
/// by a crash or an older version), audited. Refused while any move of the
/// conversation is open: that move owns the pause, and the same migrate
/// command resumes it (or fails it and lifts the pause).
pub async fn unpause(
    pool: &PgPool,
    team_id: Uuid,
    conversation_id: Uuid,
    actor: &Actor,
) -> BusResult<Unpaused> {
    let mut tx = pool.begin().await?;
    lock_conversation(&mut tx, team_id, conversation_id).await?;
    if let Some((run, direction)) = open_run_of(&mut tx, conversation_id).await? {
        return Err(BusError::conflict(format!(
            "move {run} of conversation {conversation_id} ({}) is open and owns the pause; \
             nothing was changed. Run `conversations migrate --to {} --conversation \
             {conversation_id} --apply` again to resume it: it either finishes or fails and \
             lifts the pause.",
            direction.in_words(),
            direction.target()
        )));
    }
    let paused_seconds: Option<i64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - write_paused_at)::bigint FROM conversations
          WHERE team_id = $1 AND id = $2",
    )
    .bind(team_id)
    .bind(conversation_id)
    .fetch_one(&mut *tx)
    .await?;
    if paused_seconds.is_none() {
        return Ok(Unpaused {
            conversation_id,
            paused_seconds: None,
        });
    }
    lift_orphaned_pause(&mut tx, team_id, conversation_id).await?;
    audit::record(
        &mut tx,
        Some(team_id),
        actor,
        "conversation.unpause",
        &conversation_id.to_string(),
        serde_json::json!({ "paused_seconds": paused_seconds }),
    )
    .await?;
    tx.commit().await?;
    Ok(Unpaused {
        conversation_id,
        paused_seconds,
    })
}

/// Whether a conversation's writes are paused right now (M13): what an
/// operator is told after a failed move, rather than assuming it reopened.
/// An unknown conversation is an error, not "not paused".
pub async fn is_paused(pool: &PgPool, conversation_id: Uuid) -> BusResult<bool> {
    let paused: Option<bool> =
        sqlx::query_scalar("SELECT write_paused_at IS NOT NULL FROM conversations WHERE id = $1")
            .bind(conversation_id)
            .fetch_optional(pool)
            .await?;
    paused.ok_or_else(|| {
        BusError::not_found(format!(
            "no conversation {conversation_id}; `conversations status --team T` lists a team's \
             conversations."
        ))
    })
}

/// Moves still open, and how many of their conversations have writes
/// paused now (for `/metrics`). Read through the index of open runs, so
/// the cost follows the moves in progress, never the conversations' count;
/// a pause no open move owns (left by a crash, lifted by `unpause`) is not
/// among them.
pub async fn open_counts(pool: &PgPool) -> BusResult<(i64, i64)> {
    let counts = sqlx::query_as(
        "SELECT count(*),
                count(*) FILTER (WHERE EXISTS (
                    SELECT 1 FROM conversations c
                     WHERE c.team_id = g.team_id AND c.id = g.conversation_id
                       AND c.write_paused_at IS NOT NULL))
           FROM conversation_migrations g
          WHERE g.state IN ('planned', 'copying', 'verified')",
    )
    .fetch_one(pool)
    .await?;
    Ok(counts)
}
