//! A task's priority and who may change it: `set_task_priority`, and the
//! rights a caller acts with ([`Rights`]) for it and for cancelling.
//!
//! A priority is one of four words, `low`, `normal` (the default), `high`,
//! `urgent`, stored as the rank 0..=3 in `tasks.priority` (migration 0049) so
//! "highest first" is one ORDER BY: `claim_next_task` takes the highest
//! priority first, then the oldest; `list_tasks` lists open and claimed tasks
//! in that order.
//!
//! Who may change it: with [`Rights::Creator`] (every MCP tool), the agent
//! that created the task, from any of its windows, as for
//! `set_task_dependencies`; with [`Rights::Overseer`] (a person overseeing
//! the team on the dashboard), anyone. Either way only a task that is open
//! or claimed: a finished task's priority no longer matters. The write fence
//! (`sessions::guard`) runs first either way, so "who may write at all" is
//! decided in one place for agents and people alike. Setting the priority a
//! task already has changes nothing and records nothing.

use super::row::emit;
use crate::store::requests::{self, Writer};
use serde_json::json;

use super::checks::check_key;
use super::row::lock_task;
use super::transition::finish;
use super::{Task, TaskEventKind};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::{address, identity::sessions, window_phrase};

acs_wire::text_enum! {
    /// How urgent a task is. Stored as its rank ([`TaskPriority::rank`]).
    #[derive(Default)]
    pub enum TaskPriority {
        /// Taken after every other ready task.
        Low = "low",
        /// The default.
        #[default]
        Normal = "normal",
        High = "high",
        /// Taken before every other ready task.
        Urgent = "urgent",
    }
}

impl TaskPriority {
    /// The rank stored in `tasks.priority`: 0 (low) ..= 3 (urgent).
    pub fn rank(self) -> i16 {
        match self {
            TaskPriority::Low => 0,
            TaskPriority::Normal => 1,
            TaskPriority::High => 2,
            TaskPriority::Urgent => 3,
        }
    }

    /// The priority of a stored rank (the column's CHECK keeps it 0..=3; an
    /// out-of-range value reads as the nearest end).
    pub fn from_rank(rank: i16) -> Self {
        match rank {
            i16::MIN..=0 => TaskPriority::Low,
            1 => TaskPriority::Normal,
            2 => TaskPriority::High,
            _ => TaskPriority::Urgent,
        }
    }
}

/// The rights a caller changes or cancels a task with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rights {
    /// An agent's own rights, those of the MCP tools: the task's creator
    /// (from any window); for a cancel, also the window holding its live
    /// lease.
    Creator,
    /// A person overseeing the team (the dashboard): any task of the team
    /// that is not finished.
    Overseer,
}

/// A priority word as a caller gives it (trimmed, any case): the priority,
/// or a refusal naming the four words.
pub fn check_priority(raw: &str) -> BusResult<TaskPriority> {
    let word = raw.trim().to_ascii_lowercase();
    TaskPriority::from_text(&word).ok_or_else(|| {
        BusError::invalid(format!(
            "priority {raw:?} is not one of low, normal, high, urgent. Give one of those four \
             words (normal is the default; claim_next_task takes urgent first, then high, \
             normal, low, the oldest first within each). Nothing was changed."
        ))
    })
}

/// `create_task`'s optional priority: absent is `normal`.
pub(super) fn check_new_priority(raw: Option<&str>) -> BusResult<TaskPriority> {
    match raw {
        None => Ok(TaskPriority::Normal),
        Some(raw) => check_priority(raw).map_err(|_| {
            BusError::invalid(format!(
                "priority {raw:?} is not one of low, normal, high, urgent. Give one of those \
                 four words, or leave priority out for normal. Nothing was created."
            ))
        }),
    }
}

/// `set_task_priority`: set the priority of `key` to `priority` (a word).
/// `rights`: [`Rights::Creator`] for an agent's tool call, [`Rights::Overseer`]
/// for a person on the dashboard. Refused for a finished task, and with
/// creator rights for anyone but the task's creator; the same priority again
/// changes nothing. Accepted: a `priority_changed` event and a wake-up.
pub async fn set_priority(
    bus: &Bus,
    me: &Identity,
    key: &str,
    priority: &str,
    rights: Rights,
) -> BusResult<Task> {
    requests::plain(bus, |mut w| async move {
        let task = set_priority_in(&mut w, me, key, priority, rights).await;
        (w, task)
    })
    .await
}

/// [`set_priority`] on `w`.
pub async fn set_priority_in(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    priority: &str,
    rights: Rights,
) -> BusResult<Task> {
    let key = check_key(key)?;
    let priority = check_priority(priority)?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let row = lock_task(&mut tx, me, &key).await?;
    if row.status.is_finished() {
        return Err(BusError::conflict(format!(
            "task `{key}` is already {}{}; a finished task's priority no longer matters and \
             cannot change. Nothing was changed.",
            row.status,
            row.finished_phrase()
        )));
    }
    if rights == Rights::Creator && row.creator_id != me.agent_id {
        return Err(BusError::forbidden(format!(
            "task `{key}` was created by {}; only its creator (agent `{}`, from any window) may \
             change its priority, and this window is {}. Nothing was changed. Ask them \
             (post_message) to re-prioritise it.",
            address(&row.created_by, &row.created_session),
            row.created_by,
            window_phrase(&me.agent, &me.window)
        )));
    }
    let from = TaskPriority::from_rank(row.priority);
    if from == priority {
        tx.rollback().await?;
        return Ok(row.into_task());
    }
    sqlx::query("UPDATE tasks SET priority = $2, updated_at = now() WHERE id = $1")
        .bind(row.id)
        .bind(priority.rank())
        .execute(&mut *tx)
        .await?;
    let mut detail = json!({ "from": from, "to": priority });
    if rights == Rights::Overseer {
        detail["as"] = json!("overseer");
    }
    let event = TaskEventKind::PriorityChanged;
    let task = finish(tx, me, row.id, &key, event, detail).await?;
    emit(w, me, &key);
    Ok(task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_ranks_round_trip_in_order() {
        let mut last = -1;
        for priority in TaskPriority::ALL {
            assert_eq!(TaskPriority::from_rank(priority.rank()), priority);
            assert!(priority.rank() > last, "ranks rise from low to urgent");
            last = priority.rank();
        }
        assert_eq!(TaskPriority::default(), TaskPriority::Normal);
    }

    #[test]
    fn a_priority_word_is_checked() {
        assert_eq!(check_priority(" Urgent ").unwrap(), TaskPriority::Urgent);
        let err = check_priority("5").unwrap_err().to_string();
        assert!(err.contains("low, normal, high, urgent"), "{err}");
        assert_eq!(check_new_priority(None).unwrap(), TaskPriority::Normal);
        assert!(check_new_priority(Some("asap")).is_err());
    }
}
