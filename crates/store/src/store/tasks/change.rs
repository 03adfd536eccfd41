//! The task writes that are one round trip: `claim_task`, `renew_task_lease`,
//! `release_task` and `complete_task` are each one call of the SQL function
//! `task_change`, `claim_next_task` one call of `task_claim_next` (migration
//! 0032). Inside, in one transaction: the write fence (`agent_write_refusal`,
//! the one rule of who may write), the quota (`complete_task`), the team's
//! dependency lock (claims), the task row locked, the decision, the UPDATE,
//! the `task_events` row and the task read back. A refusal comes back as a
//! code with the figures its words need; the words are Rust's, in the tools'
//! files. The wake-up event is emitted here, after the call has committed.

use chrono::{DateTime, Duration, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{FromRow, Postgres, Row};

use super::row::{TaskRow, emit, no_such_task};
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::fenced::BindCaller;
use crate::store::identity::sessions::Refusal;
use crate::store::messaging::attachments::TEAM_QUOTA_DEFAULT_BYTES;
use crate::store::operations::usage;
use crate::store::requests::Writer;

/// A change `task_change` makes to one task.
#[derive(Clone, Copy)]
pub(super) enum Op<'a> {
    /// `claim_task`; a live claim of this window is renewed instead.
    Claim(Duration),
    Renew(Duration),
    Release,
    /// `complete_task` with its result.
    Complete(&'a str),
}

/// A refusal of the task's own rules: the code `task_change` declined with,
/// and the task as it was locked (nothing was written).
pub(super) struct Declined {
    pub(super) code: String,
    pub(super) row: TaskRow,
}

/// Apply `op` to the task `key` (checked) in one round trip. The fence's,
/// the quota's and a missing task's refusals are worded here; the task's own
/// come back as [`Declined`] for the tool to word. Accepted: the task after
/// the change, with the wake-up emitted.
pub(super) async fn change(
    w: &mut Writer,
    me: &Identity,
    key: &str,
    op: Op<'_>,
) -> BusResult<Result<TaskRow, Declined>> {
    let (name, lease, result) = match op {
        Op::Claim(lease) => ("claim", Some(lease), None),
        Op::Renew(lease) => ("renew", Some(lease), None),
        Op::Release => ("release", None, None),
        Op::Complete(result) => ("complete", None, Some(result)),
    };
    let call = sqlx::query(
        "SELECT r.refusal, r.session_epoch, r.refused_since, r.declined, r.quota_limit,
                r.quota_used, (r.task).*
         FROM task_change($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) r",
    )
    .bind(name)
    .bind_caller(me)
    .bind(key)
    .bind(lease.map(|l| l.num_seconds()))
    .bind(result)
    .bind(TEAM_QUOTA_DEFAULT_BYTES);
    let (code, row) = match answer(w, me, call).await? {
        Ok(task) => return Ok(Ok(task)),
        Err(declined) => declined,
    };
    match code.as_str() {
        "no_task" => Err(no_such_task(me, key)),
        "quota" => Err(usage::quota_refusal(
            row.try_get("quota_limit")?,
            row.try_get("quota_used")?,
            result.map_or(0, |r| r.len() as i64),
            &me.team,
        )),
        _ => Ok(Err(Declined {
            row: TaskRow::from_row(&row)?,
            code,
        })),
    }
}

/// What `task_claim_next` answers when it claimed nothing: how many tasks
/// wait (on dependencies, or being claimed this instant), how many are held
/// and when the first lease ends, how many wait on a cancelled task.
pub(super) struct NothingClaimable {
    pub(super) waiting: i64,
    pub(super) held: i64,
    pub(super) next_expiry: Option<DateTime<Utc>>,
    pub(super) stuck: i64,
}

/// Claim the ready task of the highest priority, the oldest first within one
/// (migration 0049), for this window in one round trip: the task
/// claimed (the wake-up emitted), or why there was none.
pub(super) async fn claim_next(
    w: &mut Writer,
    me: &Identity,
    lease: Duration,
) -> BusResult<Result<TaskRow, NothingClaimable>> {
    let call = sqlx::query(
        "SELECT r.refusal, r.session_epoch, r.refused_since, r.declined, r.waiting, r.held,
                r.next_expiry, r.stuck, (r.task).*
         FROM task_claim_next($1, $2, $3, $4, $5, $6, $7) r",
    )
    .bind_caller(me)
    .bind(lease.num_seconds());
    let (code, row) = match answer(w, me, call).await? {
        Ok(task) => return Ok(Ok(task)),
        Err(declined) => declined,
    };
    match code.as_str() {
        "nothing" => Ok(Err(NothingClaimable {
            waiting: row.try_get("waiting")?,
            held: row.try_get("held")?,
            next_expiry: row.try_get("next_expiry")?,
            stuck: row.try_get("stuck")?,
        })),
        other => Err(unknown_code(other)),
    }
}

/// Run `call`, a one-round-trip task function (`task_change`,
/// `task_claim_next`), and word the fence's refusal. Accepted: the task
/// after the change, with the wake-up emitted. Declined: the code and the
/// row, for the caller to word.
async fn answer(
    w: &mut Writer,
    me: &Identity,
    call: Query<'_, Postgres, PgArguments>,
) -> BusResult<Result<TaskRow, (String, PgRow)>> {
    let row = call.fetch_one(w.conn()).await?;
    Refusal::from_row(&row)?.check(me)?;
    let declined: Option<String> = row.try_get("declined")?;
    match declined {
        None => {
            let task = TaskRow::from_row(&row)?;
            emit(w, me, &task.key);
            Ok(Ok(task))
        }
        Some(code) => Ok(Err((code, row))),
    }
}

/// A code this build does not know: the schema is newer than the words.
pub(super) fn unknown_code(code: &str) -> BusError {
    BusError::Db(sqlx::Error::Protocol(format!(
        "task function declined with unknown code {code}"
    )))
}
