//! Claiming: `claim_task` for a named task, `claim_next_task` for the most
//! urgent ready one, the oldest first within a priority (each one round trip,
//! [`change`](super::change)), and the words of their refusals and of why
//! nothing was claimable.

use super::change::{self, Declined, NothingClaimable, Op, unknown_code};
use super::checks::{check_key, check_lease};
use super::row::TaskRow;
use super::{NextTask, Task};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::requests::{self, Writer};
use crate::store::{address, at};

/// `claim_task`: claim `key` for this window. Re-claiming a task this window
/// holds extends its lease; a lapsed lease, anyone's, may be taken over.
pub async fn claim(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    lease_seconds: Option<i64>,
) -> BusResult<Task> {
    let key = check_key(key)?;
    let lease = check_lease(lease_seconds)?;
    let Declined { code, row } = match change::change(w, me, &key, Op::Claim(lease)).await? {
        Ok(row) => return Ok(row.into_task()),
        Err(declined) => declined,
    };
    Err(match code.as_str() {
        "finished" => BusError::conflict(format!(
            "task `{key}` is already {}{}; there is nothing to claim. claim_next_task finds \
             open work.",
            row.status,
            row.finished_phrase()
        )),
        "held" => BusError::conflict(format!(
            "task `{key}` is claimed by {}; {}. Nothing was changed. Wait for it to be \
             released, completed or to lapse (wait_for_updates), or take other work with \
             claim_next_task.",
            row.holder_phrase(),
            row.lease_phrase()
        )),
        "blocked" => blocked(&row),
        other => unknown_code(other),
    })
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

/// `claim_next_task`: the open (or lapsed) task of the highest priority, the
/// oldest first within one, whose dependencies are all done, claimed for
/// this window. Nothing claimable is an answer, not a
/// refusal: it says why, in numbers.
pub async fn claim_next(
    bus: &Bus,
    me: &Identity,
    lease_seconds: Option<i64>,
) -> BusResult<NextTask> {
    requests::plain(bus, |mut w| async move {
        let next = claim_next_in(&mut w, me, lease_seconds).await;
        (w, next)
    })
    .await
}

/// [`claim_next`] on `w`.
pub async fn claim_next_in(
    w: &mut Writer,
    me: &Identity,
    lease_seconds: Option<i64>,
) -> BusResult<NextTask> {
    let lease = check_lease(lease_seconds)?;
    let task = match change::claim_next(w, me, lease).await? {
        Ok(row) => row.into_task(),
        Err(nothing) => {
            return Ok(NextTask {
                claimed: false,
                task: None,
                message: nothing_claimable(me, nothing),
            });
        }
    };
    let expiry = task
        .summary
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
            task.summary.key
        ),
        task: Some(task),
    })
}

/// Why `claim_next_task` found nothing, in numbers the caller can act on.
fn nothing_claimable(me: &Identity, nothing: NothingClaimable) -> String {
    let NothingClaimable {
        waiting,
        held,
        next_expiry,
        stuck,
    } = nothing;
    if waiting == 0 && held == 0 {
        return format!(
            "nothing to claim: team `{}` has no open tasks. create_task adds work; \
             wait_for_updates with kinds [\"task\"] wakes you when some arrives.",
            me.team
        );
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
    format!(
        "nothing to claim right now: {}. list_tasks shows them; wait_for_updates with kinds \
         [\"task\"] wakes you when one becomes ready.",
        parts.join("; ")
    )
}
