//! A task's life apart from claiming: `create_task`, and the holder's
//! `renew_task_lease`, `release_task` and `complete_task`.

use chrono::Duration;
use serde_json::json;
use uuid::Uuid;

use super::checks::{
    check_dependencies, check_description, check_key, check_lease, check_metadata, check_new_key,
    check_result, check_title,
};
use super::row::TaskRow;
use super::transition::{Change, Lock, Update, finish, transition};
use super::{NewTask, Task, dependencies};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::{at, sessions, usage, window_phrase};

/// `create_task`: the task, its dependency rows and its `created` event in one
/// transaction. A missing dependency or a taken key writes nothing.
pub async fn create(bus: &Bus, me: &Identity, new: NewTask) -> BusResult<Task> {
    let key = check_new_key(&new.key)?;
    let title = check_title(&new.title)?;
    let description = check_description(new.description)?;
    let metadata = check_metadata(new.metadata)?;
    let depends_on = check_dependencies(&key, &new.depends_on)?;

    let mut tx = bus.pool.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let incoming =
        title.len() + description.as_ref().map_or(0, |d| d.len()) + metadata.to_string().len();
    usage::check_quota(&mut *tx, me.team_id, &me.team, incoming).await?;
    let found = dependencies::resolve(&mut tx, me, &depends_on, "Nothing was created.").await?;
    let task_id = Uuid::new_v4();
    let inserted = sqlx::query(
        "INSERT INTO tasks (id, team_id, key, title, description, metadata, created_by, created_session)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
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
    let detail = json!({ "depends_on": depends_on });
    finish(tx, bus, me, task_id, &key, "created", detail).await
}

/// Refuse unless this window holds a live claim on `row`. `action` names the
/// tool, for the message.
fn require_live_claim(row: &TaskRow, me: &Identity, action: &str) -> BusResult<()> {
    let key = &row.key;
    match row.status.as_str() {
        "done" | "cancelled" => Err(BusError::conflict(format!(
            "task `{key}` is already {}{}; {action} applies to a task you hold. Nothing was \
             changed.",
            row.status,
            row.finished_phrase()
        ))),
        "open" => Err(BusError::conflict(format!(
            "task `{key}` is not claimed by anyone, so this window cannot {action} it. claim_task \
             it first. Nothing was changed."
        ))),
        _ if row.held_by(me) && row.lapsed => Err(BusError::conflict(format!(
            "your lease on task `{key}` lapsed at {}; the task is open to anyone again and \
             nothing was changed. claim_task it again (if nobody else has), then {action}.",
            row.lease_expires_at.map(at).unwrap_or_default()
        ))),
        _ if row.held_by(me) => Ok(()),
        _ if row.lapsed => Err(BusError::conflict(format!(
            "task `{key}` is not claimed by this window: the lease of {} lapsed at {}, so the \
             task is open. claim_task it first, then {action}. Nothing was changed.",
            row.holder_phrase(),
            row.lease_expires_at.map(at).unwrap_or_default()
        ))),
        _ => {
            let sibling = if row.holder_agent_id == Some(me.agent_id) {
                " A claim belongs to the window that took it: another window of the same agent \
                 cannot renew, release or complete it."
            } else {
                ""
            };
            Err(BusError::conflict(format!(
                "task `{key}` is claimed by {}, not by this window ({}); {}. Only the holding \
                 window can {action} it. Nothing was changed.{sibling}",
                row.holder_phrase(),
                window_phrase(&me.agent, &me.window),
                row.lease_phrase()
            )))
        }
    }
}

/// `renew_task_lease`: push this window's live lease to now + lease_seconds.
/// A lapsed lease is not renewed: someone else may already have the task.
pub async fn renew(
    bus: &Bus,
    me: &Identity,
    key: &str,
    lease_seconds: Option<i64>,
) -> BusResult<Task> {
    let key = check_key(key)?;
    let lease = check_lease(lease_seconds)?;
    transition(bus, me, &key, Lock::Row, |row| {
        require_live_claim(row, me, "renew_task_lease")?;
        let detail = json!({ "lease_seconds": lease.num_seconds() });
        Ok(Change::new(extend_lease(row, lease), "renewed", detail))
    })
    .await
}

/// The UPDATE that pushes the lease of a task its holder keeps to now +
/// `lease` (a renewal, or a claim by the window that holds it already).
pub(super) fn extend_lease(row: &TaskRow, lease: Duration) -> Update {
    sqlx::query("UPDATE tasks SET lease_expires_at = now() + $2, updated_at = now() WHERE id = $1")
        .bind(row.id)
        .bind(lease)
}

/// `release_task`: hand the task back, open. The holding window only; its
/// own lapsed claim may be released too (it was open already, and this
/// clears the lapsed holder).
pub async fn release(bus: &Bus, me: &Identity, key: &str) -> BusResult<Task> {
    let key = check_key(key)?;
    transition(bus, me, &key, Lock::Row, |row| {
        if !(row.status == "claimed" && row.held_by(me)) {
            require_live_claim(row, me, "release_task")?;
        }
        let update = sqlx::query(
            "UPDATE tasks
             SET status = 'open', holder_agent_id = NULL, holder_session = NULL,
                 lease_expires_at = NULL, claimed_at = NULL, updated_at = now()
             WHERE id = $1",
        )
        .bind(row.id);
        let detail = json!({ "lease_had_lapsed": row.lapsed });
        Ok(Change::new(update, "released", detail))
    })
    .await
}

/// `complete_task`: mark the task done with `result`. The window holding a
/// live claim only; a lapsed claim must be claimed again first.
pub async fn complete(bus: &Bus, me: &Identity, key: &str, result: &str) -> BusResult<Task> {
    let key = check_key(key)?;
    check_result(result)?;
    // Read before the transition (the quota row is read without a lock, so
    // where it is read changes nothing); a refusal writes nothing.
    usage::check_quota(&bus.pool, me.team_id, &me.team, result.len()).await?;
    transition(bus, me, &key, Lock::Row, |row| {
        require_live_claim(row, me, "complete_task")?;
        let update = sqlx::query(
            "UPDATE tasks
             SET status = 'done', holder_agent_id = NULL, holder_session = NULL,
                 lease_expires_at = NULL, completed_by = $2, completed_session = $3,
                 completed_at = now(), result = $4, updated_at = now()
             WHERE id = $1",
        )
        .bind(row.id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(result);
        let detail = json!({ "result_bytes": result.len() });
        Ok(Change::new(update, "completed", detail))
    })
    .await
}
