//! The path of a task change made in several statements: begin, the session
//! guard (the write fence: a revoked credential or a replaced window writes
//! nothing), the task row locked, the locked row checked, one UPDATE of it,
//! its `task_events` row, commit, and the wake-up event after commit.
//!
//! `cancel_task` is one call of [`transition_and`]; creating a task and
//! re-pointing dependencies lock differently but end the same way
//! ([`finish`]). The claims and the holder's tools are one round trip each
//! instead ([`change`](super::change), migration 0032).

use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use super::row::{TaskRow, emit, lock_task, read_task, record_event};
use super::{Task, TaskEventKind};
use crate::auth::Identity;
use crate::error::BusResult;
use crate::store::identity::sessions;
use crate::store::requests::Writer;

/// One statement changing the locked task row, its values bound.
pub(super) type Update = Query<'static, Postgres, PgArguments>;

/// What a transition writes once its check has passed: the UPDATE of the
/// locked row, and the event that records it.
pub(super) struct Change {
    update: Update,
    event: TaskEventKind,
    detail: Value,
}

impl Change {
    pub(super) fn new(update: Update, event: TaskEventKind, detail: Value) -> Self {
        Change {
            update,
            event,
            detail,
        }
    }
}

/// Change the task `key` (already checked): `plan` refuses the locked row
/// (nothing is written) or says what to change; then `also` in the same
/// transaction after the change (with the row as it was locked, before the
/// change): what a caller reads besides the task for its answer. Answers the
/// task as it is after the change.
pub(super) async fn transition_and<X>(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    plan: impl FnOnce(&TaskRow) -> BusResult<Change>,
    also: impl AsyncFnOnce(&mut PgConnection, &TaskRow) -> BusResult<X>,
) -> BusResult<(Task, X)> {
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let row = lock_task(&mut tx, me, key).await?;
    let change = plan(&row)?;
    change.update.execute(&mut *tx).await?;
    let extra = also(&mut tx, &row).await?;
    let task = finish(tx, me, row.id, key, change.event, change.detail).await?;
    emit(w, me, key);
    Ok((task, extra))
}

/// How every change ends: its `task_events` row, the task read back in the
/// same transaction, commit; the caller then emits the wake-up event on its
/// [`Writer`] (`row::emit`), sent once the request's transaction commits.
pub(super) async fn finish(
    mut tx: Transaction<'_, Postgres>,
    me: &Identity,
    task_id: Uuid,
    key: &str,
    event: TaskEventKind,
    detail: Value,
) -> BusResult<Task> {
    record_event(&mut tx, me, task_id, event, detail).await?;
    let task = read_task(&mut tx, me, key).await?.into_task();
    tx.commit().await?;
    Ok(task)
}
