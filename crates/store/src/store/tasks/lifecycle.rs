//! A task's life apart from claiming: `create_task`, and the holder's
//! `renew_task_lease`, `release_task` and `complete_task` (each one round
//! trip, [`change`](super::change)).

use serde_json::json;
use uuid::Uuid;

use super::change::{self, Declined, Op, unknown_code};
use super::checks::{
    check_dependencies, check_description, check_key, check_lease, check_metadata, check_new_key,
    check_result, check_title,
};
use super::row::emit;
use super::transition::finish;
use super::{NewTask, Task, TaskEventKind, dependencies, priority};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::requests::{self, Writer};
use crate::store::{at, identity::sessions, operations::usage, window_phrase};

/// `create_task`: the task, its dependency rows and its `created` event in one
/// transaction. A missing dependency or a taken key writes nothing.
pub async fn create(bus: &Bus, me: &Identity, new: NewTask) -> BusResult<Task> {
    requests::plain(bus, |mut w| async move {
        let task = create_in(&mut w, me, new).await;
        (w, task)
    })
    .await
}

/// [`create`] on `w`.
pub async fn create_in(w: &mut Writer, me: &Identity, new: NewTask) -> BusResult<Task> {
    let key = check_new_key(&new.key)?;
    let title = check_title(&new.title)?;
    let description = check_description(new.description)?;
    let metadata = check_metadata(new.metadata)?;
    let depends_on = check_dependencies(&key, &new.depends_on)?;
    let priority = priority::check_new_priority(new.priority.as_deref())?;

    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let incoming =
        title.len() + description.as_ref().map_or(0, |d| d.len()) + metadata.to_string().len();
    usage::check_quota(&mut *tx, me.team_id, &me.team, incoming).await?;
    let found = dependencies::resolve(&mut tx, me, &depends_on, "Nothing was created.").await?;
    let task_id = Uuid::new_v4();
    let inserted = sqlx::query(
        "INSERT INTO tasks (id, team_id, key, title, description, metadata, created_by,
                            created_session, priority)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (team_id, key) DO NOTHING",
    )
    .bind(task_id)
    .bind(me.team_id)
    .bind(&key)
    .bind(&title)
    .bind(&description)
    .bind(&metadata)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(priority.rank())
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(BusError::conflict(format!(
            "a task with key `{key}` already exists in team `{}`; nothing was created. get_task \
             {{\"key\": \"{key}\"}} shows it; pick another key for new work.",
            me.team
        )));
    }
    if !found.is_empty() {
        let ids: Vec<Uuid> = found.iter().map(|(id, _)| *id).collect();
        sqlx::query(
            "INSERT INTO task_dependencies (team_id, task_id, depends_on_id)
             SELECT $1, $2, unnest($3::uuid[])",
        )
        .bind(me.team_id)
        .bind(task_id)
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    }
    let detail = json!({ "depends_on": depends_on, "priority": priority });
    let task = finish(tx, me, task_id, &key, TaskEventKind::Created, detail).await?;
    emit(w, me, &key);
    Ok(task)
}

/// Why this window may not `action` the task: the code `task_change`
/// declined with (migration 0032 decides: finished, not_claimed,
/// lapsed_mine, lapsed_other, held_other), in words. `action` names the tool.
fn live_claim_refusal(declined: Declined, me: &Identity, action: &str) -> BusError {
    let Declined { code, row } = declined;
    let key = &row.key;
    match code.as_str() {
        "finished" => BusError::conflict(format!(
            "task `{key}` is already {}{}; {action} applies to a task you hold. Nothing was \
             changed.",
            row.status,
            row.finished_phrase()
        )),
        "not_claimed" => BusError::conflict(format!(
            "task `{key}` is not claimed by anyone, so this window cannot {action} it. claim_task \
             it first. Nothing was changed."
        )),
        "lapsed_mine" => BusError::conflict(format!(
            "your lease on task `{key}` lapsed at {}; the task is open to anyone again and \
             nothing was changed. claim_task it again (if nobody else has), then {action}.",
            row.lease_expires_at.map(at).unwrap_or_default()
        )),
        "lapsed_other" => BusError::conflict(format!(
            "task `{key}` is not claimed by this window: the lease of {} lapsed at {}, so the \
             task is open. claim_task it first, then {action}. Nothing was changed.",
            row.holder_phrase(),
            row.lease_expires_at.map(at).unwrap_or_default()
        )),
        "held_other" => {
            let sibling = if row.holder_agent_id == Some(me.agent_id) {
                " A claim belongs to the window that took it: another window of the same agent \
                 cannot renew, release or complete it."
            } else {
                ""
            };
            BusError::conflict(format!(
                "task `{key}` is claimed by {}, not by this window ({}); {}. Only the holding \
                 window can {action} it. Nothing was changed.{sibling}",
                row.holder_phrase(),
                window_phrase(&me.agent, &me.window),
                row.lease_phrase()
            ))
        }
        other => unknown_code(other),
    }
}

/// The holder's tools: `op` on the task `key` in one round trip, or the
/// refusal in words.
async fn holder_change(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    op: Op<'_>,
    action: &str,
) -> BusResult<Task> {
    match change::change(w, me, key, op).await? {
        Ok(row) => Ok(row.into_task()),
        Err(declined) => Err(live_claim_refusal(declined, me, action)),
    }
}

/// `renew_task_lease`: push this window's live lease to now + lease_seconds.
/// A lapsed lease is not renewed: someone else may already have the task.
pub async fn renew(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    lease_seconds: Option<i64>,
) -> BusResult<Task> {
    let key = check_key(key)?;
    let lease = check_lease(lease_seconds)?;
    holder_change(w, me, &key, Op::Renew(lease), "renew_task_lease").await
}

/// `release_task`: hand the task back, open. The holding window only; its
/// own lapsed claim may be released too (it was open already, and this
/// clears the lapsed holder).
pub async fn release(w: &mut Writer, me: &Identity, key: &str) -> BusResult<Task> {
    let key = check_key(key)?;
    holder_change(w, me, &key, Op::Release, "release_task").await
}

/// `complete_task`: mark the task done with `result`. The window holding a
/// live claim only; a lapsed claim must be claimed again first. The quota is
/// checked in the same call, before anything else (a refusal writes nothing).
pub async fn complete(bus: &Bus, me: &Identity, key: &str, result: &str) -> BusResult<Task> {
    requests::plain(bus, |mut w| async move {
        let task = complete_in(&mut w, me, key, result).await;
        (w, task)
    })
    .await
}

/// [`complete`] on `w`.
pub async fn complete_in(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    result: &str,
) -> BusResult<Task> {
    let key = check_key(key)?;
    check_result(result)?;
    holder_change(w, me, &key, Op::Complete(result), "complete_task").await
}
