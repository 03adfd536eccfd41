//! A task's dependencies: resolving the keys `create_task` and
//! `set_task_dependencies` name, and re-pointing a waiting task.
//!
//! A dependency must exist and must not be cancelled (a cancelled task is
//! never done, so depending on one would block forever). A done one is
//! accepted: it is already satisfied.
//!
//! `set_task_dependencies` replaces the list of a task that is not finished
//! and not held by a live lease (a claimed task's dependencies were all done
//! when it was claimed; changing them under its holder would pull the floor
//! away). Only the task's creator may, from any of its windows: it is the one
//! who said what the task waits for. The typical use: a dependency was
//! cancelled, and the dependent should wait on its replacement instead, or
//! on nothing.
//!
//! No cycle: a new list is refused if any entry already depends on this task,
//! directly or through others. The check runs under a team-wide advisory
//! lock (`lock_task_dependencies`, migration 0032) that every dependency
//! change takes first (and every claim shared, so a claim that waited behind
//! a re-point reads the new dependencies), so two changes in flight
//! cannot each pass the check and together close a cycle. `create_task`
//! takes no lock: a task being created has no dependents.

use std::collections::BTreeSet;

use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::checks::{check_dependencies, check_key};
use super::row::emit;
use super::row::lock_task;
use super::transition::finish;
use super::{Task, TaskEventKind, TaskStatus};
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::requests::Writer;
use crate::store::{address, identity::sessions, window_phrase};

/// The ids of the tasks `keys` names, in the order given; refuses a missing
/// or cancelled one. `nothing` ends the refusal ("Nothing was created.").
/// The rows are read `FOR SHARE`, so a dependency cannot be cancelled between
/// this check and the commit of the edge that names it.
pub(super) async fn resolve(
    conn: &mut PgConnection,
    me: &Identity,
    keys: &[String],
    nothing: &str,
) -> BusResult<Vec<(Uuid, String)>> {
    let found: Vec<(Uuid, String, TaskStatus)> = sqlx::query_as(
        "SELECT id, key, status FROM tasks WHERE team_id = $1 AND key = ANY($2) FOR SHARE",
    )
    .bind(me.team_id)
    .bind(keys)
    .fetch_all(&mut *conn)
    .await?;
    let missing: Vec<String> = keys
        .iter()
        .filter(|k| !found.iter().any(|(_, f, _)| f == *k))
        .map(|k| format!("`{k}`"))
        .collect();
    if !missing.is_empty() {
        return Err(BusError::invalid(format!(
            "depends_on names tasks that do not exist in team `{}`: {}. Dependencies must exist \
             before the task that waits on them: create them first, or drop them. {nothing}",
            me.team,
            missing.join(", ")
        )));
    }
    let cancelled: Vec<String> = found
        .iter()
        .filter(|(_, _, status)| *status == TaskStatus::Cancelled)
        .map(|(_, k, _)| format!("`{k}`"))
        .collect();
    if !cancelled.is_empty() {
        return Err(BusError::invalid(format!(
            "depends_on names cancelled tasks: {}. A cancelled task is never done, so a task \
             waiting on it could never be claimed. Depend on the task that replaces it, or drop \
             it. {nothing}",
            cancelled.join(", ")
        )));
    }
    Ok(keys
        .iter()
        .filter_map(|k| {
            found
                .iter()
                .find(|(_, f, _)| f == k)
                .map(|(id, _, _)| (*id, k.clone()))
        })
        .collect())
}

/// `set_task_dependencies`: replace the dependencies of `key` with
/// `depends_on` (empty: none). The creator only; not for a finished task or
/// one held by a live lease. The same set again changes nothing.
pub async fn set_dependencies(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    depends_on: &[String],
) -> BusResult<Task> {
    let key = check_key(key)?;
    let depends_on = check_dependencies(&key, depends_on)?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    // Before anything is read: the cycle check below must see every change
    // that committed before this one took the lock.
    // The team's dependency lock, exclusively (`lock_task_dependencies`,
    // migration 0032): a claim takes it shared before it reads the task.
    sqlx::query("SELECT lock_task_dependencies($1, true)")
        .bind(me.team_id)
        .execute(&mut *tx)
        .await?;
    let row = lock_task(&mut tx, me, &key).await?;
    match row.status {
        TaskStatus::Done | TaskStatus::Cancelled => {
            return Err(BusError::conflict(format!(
                "task `{key}` is already {}{}; a finished task's dependencies no longer matter \
                 and cannot change. Nothing was changed.",
                row.status,
                row.finished_phrase()
            )));
        }
        TaskStatus::Claimed if !row.lapsed => {
            return Err(BusError::conflict(format!(
                "task `{key}` is claimed by {}; {}. The dependencies of a task being worked on \
                 cannot change. Nothing was changed. Ask the holder to release it (release_task) \
                 first, or wait for its lease to lapse.",
                row.holder_phrase(),
                row.lease_phrase()
            )));
        }
        TaskStatus::Claimed | TaskStatus::Open => {}
    }
    if row.creator_id != me.agent_id {
        return Err(BusError::forbidden(format!(
            "task `{key}` was created by {}; only its creator (agent `{}`, from any window) may \
             change what it depends on, and this window is {}. Nothing was changed. Ask them \
             (post_message) to re-point it.",
            address(&row.created_by, &row.created_session),
            row.created_by,
            window_phrase(&me.agent, &me.window)
        )));
    }
    let before: BTreeSet<&String> = row.depends_on.iter().collect();
    if before == depends_on.iter().collect::<BTreeSet<_>>() {
        tx.rollback().await?;
        return Ok(row.into_task());
    }
    let found = resolve(&mut tx, me, &depends_on, "Nothing was changed.").await?;
    let ids: Vec<Uuid> = found.iter().map(|(id, _)| *id).collect();
    refuse_cycle(&mut tx, me, row.id, &key, &ids).await?;
    sqlx::query("DELETE FROM task_dependencies WHERE team_id = $1 AND task_id = $2")
        .bind(me.team_id)
        .bind(row.id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO task_dependencies (team_id, task_id, depends_on_id)
         SELECT $1, $2, unnest($3::uuid[])",
    )
    .bind(me.team_id)
    .bind(row.id)
    .bind(&ids)
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE tasks SET updated_at = now() WHERE id = $1")
        .bind(row.id)
        .execute(&mut *tx)
        .await?;
    let detail = json!({ "from": row.depends_on, "to": depends_on });
    let event = TaskEventKind::DependenciesChanged;
    let task = finish(tx, me, row.id, &key, event, detail).await?;
    emit(w, me, &key);
    Ok(task)
}

/// Refuse if any of `new_dependencies` already waits on `task_id`, directly
/// or through other tasks: depending on it would close a cycle.
async fn refuse_cycle(
    conn: &mut PgConnection,
    me: &Identity,
    task_id: Uuid,
    key: &str,
    new_dependencies: &[Uuid],
) -> BusResult<()> {
    let closing: Option<String> = sqlx::query_scalar(
        "WITH RECURSIVE reach (root, id) AS (
             SELECT r, r FROM unnest($2::uuid[]) AS r
             UNION
             SELECT reach.root, d.depends_on_id
             FROM reach JOIN task_dependencies d ON d.team_id = $1 AND d.task_id = reach.id
         )
         SELECT t.key FROM reach JOIN tasks t ON t.team_id = $1 AND t.id = reach.root
         WHERE reach.id = $3 ORDER BY t.seq LIMIT 1",
    )
    .bind(me.team_id)
    .bind(new_dependencies)
    .bind(task_id)
    .fetch_optional(&mut *conn)
    .await?;
    match closing {
        Some(dependency) => Err(BusError::invalid(format!(
            "task `{dependency}` already depends on `{key}` (directly or through other tasks), \
             so `{key}` cannot depend on it: that would be a cycle nobody can ever start. Nothing \
             was changed. Drop `{dependency}` from depends_on."
        ))),
        None => Ok(()),
    }
}
