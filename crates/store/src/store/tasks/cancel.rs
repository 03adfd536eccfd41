//! `cancel_task`: end a task without doing it.
//!
//! Who may, with [`Rights::Creator`] (the MCP tool): the agent that created
//! the task (from any of its windows: the work was its to ask for) or the
//! window holding the task's live lease (the work is its to give up); with
//! [`Rights::Overseer`] (a person overseeing the team, on the dashboard):
//! anyone. Nobody for a task already done or cancelled: both are final, so a
//! second cancel is refused rather than rewriting who cancelled and why.
//!
//! One transaction: the session guard, the task row locked, the row set to
//! `cancelled` with who, when and why (any lease ends with it), a `cancelled`
//! event; the wake-up event after commit, so a holder or a waiter learns at
//! once. A cancelled task is never done, so the tasks that depend on it stay
//! blocked and say so (`blocked_by_cancelled`); the answer names them, since
//! their creators must re-point or cancel them.

use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::checks::check_key;
use super::row::TaskRow;
use super::transition::{Change, transition_and};
use super::{Rights, Task, TaskEventKind, TaskStatus};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::requests;
use crate::store::requests::Writer;
use crate::store::{address, window_phrase};

pub const CANCEL_REASON_MAX_BYTES: usize = 4096;
/// The answer names at most this many waiting dependents (and counts them all).
const DEPENDENTS_SHOWN_MAX: i64 = 50;

/// `cancel_task`'s answer: the task as it now is, and who is left waiting.
#[derive(Clone, Debug, Serialize)]
pub struct CancelledTask {
    #[serde(flatten)]
    pub task: Task,
    /// Unfinished tasks that depend on this one, oldest first (at most 50):
    /// they stay blocked until their creators re-point or cancel them.
    pub dependents: Vec<String>,
    pub dependents_total: i64,
    pub message: String,
}

fn check_reason(reason: &str) -> BusResult<()> {
    if reason.trim().is_empty() {
        return Err(BusError::invalid(
            "a reason is required to cancel a task: one or two sentences saying why (for \
             example \"duplicate of api-auth\" or \"no longer needed after the rewrite\"); it is \
             kept on the task and in its history.",
        ));
    }
    crate::store::limits::bytes_at_most(
        reason.len(),
        CANCEL_REASON_MAX_BYTES,
        "reason",
        "Say why in a few sentences and keep longer text in a note (set_note) whose key you \
         mention.",
    )
}

/// Refuse unless `me` created the task (any window) or holds its live lease.
fn require_may_cancel(row: &TaskRow, me: &Identity) -> BusResult<()> {
    let live_holder = row.status == TaskStatus::Claimed && !row.lapsed;
    if row.creator_id == me.agent_id || (live_holder && row.held_by(me)) {
        return Ok(());
    }
    let key = &row.key;
    let creator = address(&row.created_by, &row.created_session);
    let claim = if live_holder {
        let sibling = if row.holder_agent_id == Some(me.agent_id) {
            " (a claim belongs to the window that took it, not to its agent's other windows)"
        } else {
            ""
        };
        format!(
            "it is claimed by {}{sibling}",
            window_phrase(
                row.holder_agent.as_deref().unwrap_or("?"),
                row.holder_session.as_deref().unwrap_or("")
            )
        )
    } else {
        "nobody holds a live lease on it".to_string()
    };
    Err(BusError::forbidden(format!(
        "task `{key}` was created by {creator} and {claim}; only its creator (agent `{}`, from \
         any window) or the window holding its live lease may cancel it, and this window ({}) is \
         neither. Nothing was changed. Ask {creator} to cancel it (post_message), or leave it.",
        row.created_by,
        window_phrase(&me.agent, &me.window)
    )))
}

/// `cancel_task`: set the task `cancelled` with `reason`, ending any lease,
/// with an agent's own rights ([`Rights::Creator`]).
pub async fn cancel(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    reason: &str,
) -> BusResult<CancelledTask> {
    cancel_with_in(w, me, key, reason, Rights::Creator).await
}

/// Cancel the task `key` with `reason` and the given `rights`:
/// [`Rights::Overseer`] (a person on the dashboard) may cancel any task of
/// the team that is not finished. The same row change, `cancelled` event
/// (its detail says `"as": "overseer"`) and wake-up as `cancel_task`.
pub async fn cancel_with(
    bus: &Bus,
    me: &Identity,
    key: &str,
    reason: &str,
    rights: Rights,
) -> BusResult<CancelledTask> {
    requests::plain(bus, |mut w| async move {
        let cancelled = cancel_with_in(&mut w, me, key, reason, rights).await;
        (w, cancelled)
    })
    .await
}

/// [`cancel_with`] on `w`.
pub async fn cancel_with_in(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    reason: &str,
    rights: Rights,
) -> BusResult<CancelledTask> {
    let key = check_key(key)?;
    check_reason(reason)?;
    let (task, (holder, (dependents, dependents_total))) = transition_and(
        w,
        me,
        &key,
        |row| {
            if row.status.is_finished() {
                return Err(BusError::conflict(format!(
                    "task `{key}` is already {}{}; a finished task cannot be cancelled. Nothing \
                     was changed.",
                    row.status,
                    row.finished_phrase()
                )));
            }
            if rights == Rights::Creator {
                require_may_cancel(row, me)?;
            }
            let (holder, lapsed_holder) = row.holders();
            let update = sqlx::query(
                "UPDATE tasks
                 SET status = 'cancelled', holder_agent_id = NULL, holder_session = NULL,
                     lease_expires_at = NULL, claimed_at = NULL, cancelled_by = $2,
                     cancelled_session = $3, cancelled_at = now(), cancel_reason = $4,
                     updated_at = now()
                 WHERE id = $1",
            )
            .bind(row.id)
            .bind(me.agent_id)
            .bind(&me.window)
            .bind(reason);
            let mut detail = json!({
                "reason": reason,
                "holder": holder.as_ref().map(|h| &h.address),
                "lapsed_holder": lapsed_holder.as_ref().map(|h| &h.address),
            });
            if rights == Rights::Overseer {
                detail["as"] = json!("overseer");
            }
            Ok(Change::new(update, TaskEventKind::Cancelled, detail))
        },
        // The holder whose lease ends with the task, and who is left waiting.
        async |conn, row| Ok((row.holders().0, waiting_dependents(conn, me, row.id).await?)),
    )
    .await?;

    let mut message = format!(
        "task `{key}` is cancelled: nobody can claim or complete it any more, and it is kept \
         with its reason and history."
    );
    if let Some(holder) = holder.filter(|h| h.address != address(&me.agent, &me.window)) {
        message.push_str(&format!(
            " The live lease of {} ended with it.",
            window_phrase(&holder.agent, &holder.session)
        ));
    }
    if dependents_total > 0 {
        let names: Vec<String> = dependents.iter().map(|k| format!("`{k}`")).collect();
        message.push_str(&format!(
            " {dependents_total} unfinished task(s) depend on it and stay blocked ({}{}): each \
             creator can re-point them with set_task_dependencies or cancel them with \
             cancel_task.",
            names.join(", "),
            if dependents_total > dependents.len() as i64 {
                ", …"
            } else {
                ""
            }
        ));
    }
    Ok(CancelledTask {
        task,
        dependents,
        dependents_total,
        message,
    })
}

/// The open (or claimed) tasks that depend on `task_id`, oldest first.
async fn waiting_dependents(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    task_id: Uuid,
) -> BusResult<(Vec<String>, i64)> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT t.key, count(*) OVER ()
         FROM task_dependencies d
         JOIN tasks t ON t.team_id = d.team_id AND t.id = d.task_id
         WHERE d.team_id = $1 AND d.depends_on_id = $2 AND t.status IN ('open', 'claimed')
         ORDER BY t.created_at, t.seq LIMIT $3",
    )
    .bind(me.team_id)
    .bind(task_id)
    .bind(DEPENDENTS_SHOWN_MAX)
    .fetch_all(&mut *conn)
    .await?;
    let total = rows.first().map(|(_, total)| *total).unwrap_or(0);
    Ok((rows.into_iter().map(|(key, _)| key).collect(), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_required_and_bounded() {
        assert!(check_reason("  \n ").is_err());
        assert!(check_reason("duplicate of api-auth").is_ok());
        let err = check_reason(&"x".repeat(CANCEL_REASON_MAX_BYTES + 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("4096"), "{err}");
    }
}
