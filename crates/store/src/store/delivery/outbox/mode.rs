//! Switching a conversation between synchronous and outbox publication.

use sqlx::PgPool;
use uuid::Uuid;

use crate::backend::BackendKind;
use crate::error::{BusError, BusResult};
use crate::store::conversations::Publication;

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
    mode: Publication,
) -> BusResult<()> {
    let mut tx = pool.begin().await?;
    switch_publication(&mut tx, team_id, conversation_id, mode).await?;
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
    mode: Publication,
) -> BusResult<Publication> {
    let row: Option<(BackendKind, Publication)> = sqlx::query_as(
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
    if mode == Publication::Sync && backend != BackendKind::Postgres {
        return Err(BusError::conflict(format!(
            "conversation {conversation_id} keeps its bodies on {backend}, which only the outbox \
             publishes to. Move it to postgres (`conversations migrate --to postgres`) instead."
        )));
    }
    if mode == Publication::Sync {
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
        .bind(mode)
        .execute(&mut *tx)
        .await?;
    Ok(before)
}
