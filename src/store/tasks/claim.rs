//! Claiming: `claim_task` for a named task, `claim_next_task` for the oldest
//! ready one, and what they share (the refusal of a blocked task, why
//! nothing was claimable).

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use super::checks::{check_key, check_lease};
use super::lifecycle::extend_lease;
use super::row::TaskRow;
use super::transition::{Change, Lock, finish, transition};
use super::{NextTask, Task, dependencies};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::{address, at, sessions};

/// `claim_task`: claim `key` for this window. Re-claiming a task this window
/// holds extends its lease; a lapsed lease, anyone's, may be taken over.
pub async fn claim(
    bus: &Bus,
    me: &Identity,
    key: &str,
    lease_seconds: Option<i64>,
) -> BusResult<Task> {
    let key = check_key(key)?;
    let lease = check_lease(lease_seconds)?;
    transition(bus, me, &key, Lock::DependenciesThenRow, |row| {
        match row.status.as_str() {
            "done" | "cancelled" => Err(BusError::conflict(format!(
                "task `{key}` is already {}{}; there is nothing to claim. claim_next_task finds \
                 open work.",
                row.status,
                row.finished_phrase()
            ))),
            "claimed" if !row.lapsed && row.held_by(me) => {
                let detail = json!({ "lease_seconds": lease.num_seconds(), "via": "claim_task" });
                Ok(Change::new(extend_lease(row, lease), "renewed", detail))
            }
            "claimed" if !row.lapsed => Err(BusError::conflict(format!(
                "task `{key}` is claimed by {}; {}. Nothing was changed. Wait for it to be \
                 released, completed or to lapse (wait_for_updates), or take other work with \
                 claim_next_task.",
                row.holder_phrase(),
                row.lease_phrase()
            ))),
            _ => {
                if !row.blocked_by.is_empty() {
                    return Err(blocked(row));
                }
                let lapsed_holder = row.holder().map(|h| h.address);
                let update = sqlx::query(
                    "UPDATE tasks
                     SET status = 'claimed', holder_agent_id = $2, holder_session = $3,
                         lease_expires_at = now() + $4, claimed_at = now(), updated_at = now()
                     WHERE id = $1",
                )
                .bind(row.id)
                .bind(me.agent_id)
                .bind(&me.window)
                .bind(lease);
                let detail =
                    json!({ "lease_seconds": lease.num_seconds(), "lapsed_holder": lapsed_holder });
                Ok(Change::new(update, "claimed", detail))
            }
        }
    })
    .await
}

fn blocked(row: &TaskRow) -> BusError {
    let key = &row.key;
    let names: Vec<String> = row
        .blocked_by
        .iter()
        .map(|b| {
            if row.blocked_by_cancelled.contains(b) {
                format!("`{b}` (cancelled)")
            } else {
                format!("`{b}`")
            }
        })
        .collect();
    let cancelled = if row.blocked_by_cancelled.is_empty() {
        String::new()
    } else {
        format!(
            " A cancelled task is never done: until its creator ({}) re-points `{key}` with \
             set_task_dependencies or cancels it with cancel_task, it stays blocked.",
            address(&row.created_by, &row.created_session)
        )
    };
    BusError::conflict(format!(
        "task `{key}` is blocked by unfinished dependencies: {}. It can be claimed once they are \
         done. Nothing was changed.{cancelled} Work on a blocker instead, or call claim_next_task \
         for a task that is ready.",
        names.join(", ")
    ))
}

/// `claim_next_task`: the oldest open (or lapsed) task whose dependencies are
/// all done, claimed for this window.
pub async fn claim_next(
    bus: &Bus,
    me: &Identity,
    lease_seconds: Option<i64>,
) -> BusResult<NextTask> {
    #[derive(sqlx::FromRow)]
    struct Claimed {
        id: Uuid,
        key: String,
        prev_agent: Option<String>,
        prev_session: Option<String>,
    }
    let lease = check_lease(lease_seconds)?;
    let mut tx = bus.pool.begin().await?;
    sessions::guard(&mut tx, me).await?;
    dependencies::hold_for_claim(&mut tx, me.team_id).await?;
    // SKIP LOCKED: a row another claimer has locked is passed over, and a row
    // it claimed and committed meanwhile fails the re-checked WHERE, so each
    // task goes to exactly one window however many ask at once.
    let claimed: Option<Claimed> = sqlx::query_as(
        "WITH next AS (
             SELECT t.id, pa.name AS prev_agent, t.holder_session AS prev_session
             FROM tasks t
             LEFT JOIN agents pa ON pa.team_id = t.team_id AND pa.id = t.holder_agent_id
             WHERE t.team_id = $1
               AND (t.status = 'open' OR (t.status = 'claimed' AND t.lease_expires_at <= now()))
               AND NOT EXISTS (
                   SELECT 1 FROM task_dependencies d
                   JOIN tasks p ON p.team_id = d.team_id AND p.id = d.depends_on_id
                   WHERE d.team_id = t.team_id AND d.task_id = t.id AND p.status <> 'done')
             ORDER BY t.created_at, t.seq
             LIMIT 1
             FOR NO KEY UPDATE OF t SKIP LOCKED
         )
         UPDATE tasks t
         SET status = 'claimed', holder_agent_id = $2, holder_session = $3,
             lease_expires_at = now() + $4, claimed_at = now(), updated_at = now()
         FROM next
         WHERE t.id = next.id
         RETURNING t.id, t.key, next.prev_agent, next.prev_session",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(lease)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(claimed) = claimed else {
        let message = nothing_claimable(&mut tx, me).await?;
        // Nothing was written; the transaction only held the guard's read.
        tx.rollback().await?;
        return Ok(NextTask {
            claimed: false,
            task: None,
            message,
        });
    };
    let lapsed_holder = claimed
        .prev_agent
        .as_deref()
        .map(|a| address(a, claimed.prev_session.as_deref().unwrap_or("")));
    let detail = json!({ "lease_seconds": lease.num_seconds(), "lapsed_holder": lapsed_holder,
                         "via": "claim_next_task" });
    let task = finish(tx, bus, me, claimed.id, &claimed.key, "claimed", detail).await?;
    let expiry = task
        .holder
        .as_ref()
        .map(|h| at(h.lease_expires_at))
        .unwrap_or_default();
    Ok(NextTask {
        claimed: true,
        message: format!(
            "claimed `{}` for this window until {expiry}. renew_task_lease before then if the \
             work takes longer; complete_task with a result when done, or release_task to hand \
             it back.",
            claimed.key
        ),
        task: Some(task),
    })
}

/// Why `claim_next_task` found nothing, in numbers the caller can act on.
async fn nothing_claimable(conn: &mut PgConnection, me: &Identity) -> BusResult<String> {
    let (waiting, held, next_expiry, stuck): (i64, i64, Option<DateTime<Utc>>, i64) =
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE status = 'open' OR lease_expires_at <= now()),
                count(*) FILTER (WHERE status = 'claimed' AND lease_expires_at > now()),
                min(lease_expires_at) FILTER (WHERE status = 'claimed' AND lease_expires_at > now()),
                count(*) FILTER (WHERE (status = 'open' OR lease_expires_at <= now())
                                   AND EXISTS (
                                       SELECT 1 FROM task_dependencies d
                                       JOIN tasks p ON p.team_id = d.team_id AND p.id = d.depends_on_id
                                       WHERE d.team_id = t.team_id AND d.task_id = t.id
                                         AND p.status = 'cancelled'))
         FROM tasks t WHERE team_id = $1 AND status IN ('open', 'claimed')",
        )
    .bind(me.team_id)
    .fetch_one(&mut *conn)
    .await?;
    if waiting == 0 && held == 0 {
        return Ok(format!(
            "nothing to claim: team `{}` has no open tasks. create_task adds work; \
             wait_for_updates with kinds [\"task\"] wakes you when some arrives.",
            me.team
        ));
    }
    let mut parts = Vec::new();
    if waiting > 0 {
        parts.push(format!(
            "{waiting} open task(s) wait on unfinished dependencies (or are being claimed by \
             another window this instant)"
        ));
        if stuck > 0 {
            parts.push(format!(
                "{stuck} of them wait on a cancelled task, which will never be done, until their \
                 creator re-points them (set_task_dependencies) or cancels them (cancel_task)"
            ));
        }
    }
    if held > 0 {
        let next = next_expiry.map(at).unwrap_or_default();
        parts.push(format!(
            "{held} task(s) are claimed with live leases (the first one ends at {next})"
        ));
    }
    Ok(format!(
        "nothing to claim right now: {}. list_tasks shows them; wait_for_updates with kinds \
         [\"task\"] wakes you when one becomes ready.",
        parts.join("; ")
    ))
}
