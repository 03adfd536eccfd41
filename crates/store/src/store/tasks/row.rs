//! The task row as every reader and writer sees it: its columns (the lapse
//! decided on the database clock), reading it, locking it for a change, the
//! `task_events` row a change writes and the wake-up event after commit.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::{Holder, Task, TaskEventKind, TaskPriority, TaskStatus, TaskSummary};
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};
use crate::store::requests::Writer;
use crate::store::{address, at, window_phrase};

/// The columns of a task as a listing reads them from the view `task_rows`
/// (migration 0032, the one definition of a task's columns: the lapse decided
/// on the database clock, the agents' names, the dependency arrays), the
/// large ones left out.
macro_rules! summary_columns {
    () => {
        "t.id, t.key, t.title, NULL::text AS description, '{}'::jsonb AS metadata, t.status,
         t.lapsed, t.holder_agent_id, t.holder_agent, t.holder_session, t.claimed_at,
         t.lease_expires_at, t.lease_seconds_left, t.creator_id, t.created_by,
         t.created_session, t.created_at, t.updated_at, t.completed_by, t.completed_session,
         t.completed_at, NULL::text AS result, t.cancelled_by, t.cancelled_session,
         t.cancelled_at, NULL::text AS cancel_reason, '{}'::text[] AS depends_on, t.blocked_by,
         t.blocked_by_cancelled, t.priority"
    };
}
pub(super) use summary_columns;

#[derive(sqlx::FromRow)]
pub(super) struct TaskRow {
    pub(super) id: Uuid,
    pub(super) key: String,
    pub(super) title: String,
    pub(super) description: Option<String>,
    pub(super) metadata: Value,
    pub(super) status: TaskStatus,
    pub(super) lapsed: bool,
    pub(super) holder_agent_id: Option<Uuid>,
    pub(super) holder_agent: Option<String>,
    pub(super) holder_session: Option<String>,
    pub(super) claimed_at: Option<DateTime<Utc>>,
    pub(super) lease_expires_at: Option<DateTime<Utc>>,
    pub(super) lease_seconds_left: Option<i64>,
    pub(super) creator_id: Uuid,
    pub(super) created_by: String,
    pub(super) created_session: String,
    pub(super) created_at: DateTime<Utc>,
    pub(super) updated_at: DateTime<Utc>,
    pub(super) completed_by: Option<String>,
    pub(super) completed_session: Option<String>,
    pub(super) completed_at: Option<DateTime<Utc>>,
    pub(super) result: Option<String>,
    pub(super) cancelled_by: Option<String>,
    pub(super) cancelled_session: Option<String>,
    pub(super) cancelled_at: Option<DateTime<Utc>>,
    pub(super) cancel_reason: Option<String>,
    pub(super) depends_on: Vec<String>,
    pub(super) blocked_by: Vec<String>,
    pub(super) blocked_by_cancelled: Vec<String>,
    /// The rank, 0 (low) ..= 3 (urgent) ([`TaskPriority`]).
    pub(super) priority: i16,
}

impl TaskRow {
    pub(super) fn holder(&self) -> Option<Holder> {
        let agent = self.holder_agent.clone()?;
        let session = self.holder_session.clone().unwrap_or_default();
        Some(Holder {
            address: address(&agent, &session),
            agent,
            session,
            claimed_at: self.claimed_at,
            lease_expires_at: self.lease_expires_at?,
            lease_seconds_left: self.lease_seconds_left.unwrap_or(0),
        })
    }

    /// The live holder and the lapsed one: at most one of them is set.
    pub(super) fn holders(&self) -> (Option<Holder>, Option<Holder>) {
        if self.lapsed {
            (None, self.holder())
        } else {
            (self.holder(), None)
        }
    }

    /// The status as every reader sees it: a lapsed claim reads open.
    fn effective_status(&self) -> TaskStatus {
        if self.lapsed {
            TaskStatus::Open
        } else {
            self.status
        }
    }

    pub(super) fn held_by(&self, me: &Identity) -> bool {
        self.holder_agent_id == Some(me.agent_id)
            && self.holder_session.as_deref() == Some(me.window.as_str())
    }

    pub(super) fn holder_phrase(&self) -> String {
        window_phrase(
            self.holder_agent.as_deref().unwrap_or("?"),
            self.holder_session.as_deref().unwrap_or(""),
        )
    }

    pub(super) fn lease_phrase(&self) -> String {
        match self.lease_expires_at {
            Some(expiry) => format!(
                "its lease expires at {} (in {} s)",
                at(expiry),
                self.lease_seconds_left.unwrap_or(0)
            ),
            None => "it holds no lease".into(),
        }
    }

    /// Who finished the task and when (and why, for a cancellation), for
    /// refusals; empty when not finished or not known.
    pub(super) fn finished_phrase(&self) -> String {
        if let (Some(agent), Some(when)) = (&self.cancelled_by, self.cancelled_at) {
            let reason: String = self
                .cancel_reason
                .as_deref()
                .unwrap_or_default()
                .chars()
                .take(200)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            return format!(
                " (cancelled by {} at {}: \"{reason}\")",
                address(agent, self.cancelled_session.as_deref().unwrap_or("")),
                at(when)
            );
        }
        match (&self.completed_by, self.completed_at) {
            (Some(agent), Some(when)) => format!(
                " (completed by {} at {})",
                address(agent, self.completed_session.as_deref().unwrap_or("")),
                at(when)
            ),
            _ => String::new(),
        }
    }

    fn completed_by_address(&self) -> Option<String> {
        self.completed_by
            .as_deref()
            .map(|a| address(a, self.completed_session.as_deref().unwrap_or("")))
    }

    fn cancelled_by_address(&self) -> Option<String> {
        self.cancelled_by
            .as_deref()
            .map(|a| address(a, self.cancelled_session.as_deref().unwrap_or("")))
    }

    pub(super) fn into_task(self) -> Task {
        let (holder, lapsed_holder) = self.holders();
        let status = self.effective_status();
        let cancelled_by = self.cancelled_by_address();
        Task {
            summary: TaskSummary {
                status,
                priority: TaskPriority::from_rank(self.priority),
                holder,
                lapsed_holder,
                created_by: address(&self.created_by, &self.created_session),
                completed_by: self.completed_by_address(),
                key: self.key,
                title: self.title,
                blocked_by: self.blocked_by,
                blocked_by_cancelled: self.blocked_by_cancelled,
                created_at: self.created_at,
                updated_at: self.updated_at,
                completed_at: self.completed_at,
                cancelled_by,
                cancelled_at: self.cancelled_at,
            },
            description: self.description,
            metadata: self.metadata,
            depends_on: self.depends_on,
            result: self.result,
            cancel_reason: self.cancel_reason,
        }
    }

    /// The task as a listing shows it: [`into_task`](Self::into_task) less
    /// the description, metadata, dependencies and result.
    pub(super) fn into_summary(self) -> TaskSummary {
        self.into_task().summary
    }
}

pub(super) fn no_such_task(me: &Identity, key: &str) -> BusError {
    BusError::not_found(format!(
        "no task with key `{key}` in team `{}`. list_tasks shows the team's tasks; create_task \
         makes one.",
        me.team
    ))
}

/// The one task the team ($1) holds under the key ($2).
const SELECT_TASK: &str = "SELECT * FROM task_rows t WHERE t.team_id = $1 AND t.key = $2";

pub(super) async fn read_task(
    conn: &mut PgConnection,
    me: &Identity,
    key: &str,
) -> BusResult<TaskRow> {
    find_task(conn, me, key, SELECT_TASK).await
}

/// The task row locked for a change (through the view, which locks the task
/// row only): the changes of one task queue up here (`task_change`, migration
/// 0032, locks the same way). `NO KEY UPDATE` because no change touches the
/// key columns, so foreign-key checks (a new task depending on this one, an
/// event row) are not made to wait behind it.
pub(super) async fn lock_task(
    conn: &mut PgConnection,
    me: &Identity,
    key: &str,
) -> BusResult<TaskRow> {
    const QUERY: &str = "SELECT * FROM task_rows t WHERE t.team_id = $1 AND t.key = $2 \
                         FOR NO KEY UPDATE";
    find_task(conn, me, key, QUERY).await
}

/// The row `query` finds for the team and `key` ($1, $2), or the refusal
/// naming the missing task.
async fn find_task(
    conn: &mut PgConnection,
    me: &Identity,
    key: &str,
    query: &'static str,
) -> BusResult<TaskRow> {
    let row: Option<TaskRow> = sqlx::query_as(query)
        .bind(me.team_id)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
    row.ok_or_else(|| no_such_task(me, key))
}

pub(super) async fn record_event(
    conn: &mut PgConnection,
    me: &Identity,
    task_id: Uuid,
    kind: TaskEventKind,
    detail: Value,
) -> BusResult<()> {
    // The event and, when the team has a hook, its webhook event
    // (`task_event_webhook`, migration 0050), with the task as this
    // transaction's earlier statements left it.
    sqlx::query(
        "WITH e AS (
             INSERT INTO task_events (team_id, task_id, kind, agent_id, session, detail)
             VALUES ($1, $2, $3, $4, $5, $6)
             RETURNING team_id, task_id, kind, agent_id, session, detail)
         SELECT task_event_webhook(e.team_id, e.task_id, t.key, t.title, t.status, e.kind,
                                   e.agent_id, e.session, e.detail)
         FROM e JOIN tasks t ON t.team_id = e.team_id AND t.id = e.task_id",
    )
    .bind(me.team_id)
    .bind(task_id)
    .bind(kind)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(detail)
    .execute(conn)
    .await?;
    Ok(())
}

pub(super) fn emit(w: &mut Writer, me: &Identity, key: &str) {
    w.emit(BusEvent::new(me.team_id, EventKind::Task, key).by(me));
}
