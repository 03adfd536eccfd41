//! Reading tasks: `list_tasks`, `get_task` with its history, and the count
//! of live claims `whoami` shows.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::checks::{check_key, check_list_limit, check_status_filter};
use super::row::{TaskRow, read_task, summary_columns};
use super::{
    EVENTS_SHOWN_MAX, StatusFilter, TaskDetail, TaskEvent, TaskEventKind, TaskList, TaskStatus,
    TaskSummary,
};
use crate::Bus;
use crate::auth::Identity;
use crate::error::BusResult;
use crate::store::{address, limits};

/// The status filter of `list_tasks` as SQL text, one statement each: a
/// generic plan cannot fold a `CASE` on a bound status, so written that way
/// it walked every task of the team (done ones included) instead of the
/// queue's partial index, once the pool forced generic plans (`db::connect`).
fn status_where(status: StatusFilter) -> &'static str {
    match status {
        StatusFilter::Any => "true",
        // A claim whose lease lapsed counts as open.
        StatusFilter::Is(TaskStatus::Open) => {
            "(t.status = 'open' OR (t.status = 'claimed' AND t.lease_expires_at <= now()))"
        }
        StatusFilter::Is(TaskStatus::Claimed) => {
            "t.status = 'claimed' AND t.lease_expires_at > now()"
        }
        StatusFilter::Is(TaskStatus::Done) => "t.status = 'done'",
        StatusFilter::Is(TaskStatus::Cancelled) => "t.status = 'cancelled'",
    }
}

/// `mine_only`: tasks this window holds (or held, lapsed) or completed.
const MINE_ONLY: &str = " AND ((t.holder_agent_id = $3 AND t.holder_session = $4)
                              OR (t.completer_id = $3 AND t.completed_session = $4))";

/// `list_tasks`: open and claimed tasks in queue order (highest priority
/// first, then oldest first); done,
/// cancelled and `any` most recently changed first. `mine_only`: tasks this
/// window holds (or held, lapsed) or completed.
pub async fn list(
    bus: &Bus,
    me: &Identity,
    status: Option<&str>,
    mine_only: bool,
    limit: Option<i64>,
) -> BusResult<TaskList> {
    let status = check_status_filter(status)?;
    let limit = check_list_limit(limit)?;
    let order = if matches!(
        status,
        StatusFilter::Is(TaskStatus::Open | TaskStatus::Claimed)
    ) {
        "t.priority DESC, t.created_at, t.seq"
    } else {
        "t.updated_at DESC, t.seq DESC"
    };
    let query = format!(
        "SELECT {columns} FROM task_rows t
         WHERE t.team_id = $1 AND {status}{mine}
         ORDER BY {order} LIMIT $2",
        columns = summary_columns!(),
        status = status_where(status),
        mine = if mine_only { MINE_ONLY } else { "" },
    );
    // Built from this module's constants only: no value is in the text.
    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(query))
        .bind(me.team_id)
        .bind(limit + 1);
    if mine_only {
        query = query.bind(me.agent_id).bind(&me.window);
    }
    let mut rows: Vec<TaskRow> = query.fetch_all(&bus.pool).await?;
    let more = limits::cut_page(&mut rows, limit);
    let tasks: Vec<TaskSummary> = rows.into_iter().map(TaskRow::into_summary).collect();
    Ok(TaskList {
        status,
        mine_only,
        count: tasks.len(),
        more,
        tasks,
    })
}

/// `get_task`: the task with everything it holds and its latest events.
pub async fn get(bus: &Bus, me: &Identity, key: &str) -> BusResult<TaskDetail> {
    #[derive(sqlx::FromRow)]
    struct EventRow {
        at: DateTime<Utc>,
        kind: TaskEventKind,
        agent: String,
        session: String,
        detail: Value,
        total: i64,
    }
    let key = check_key(key)?;
    let mut conn = bus.pool.acquire().await?;
    let row = read_task(&mut conn, me, &key).await?;
    let mut events: Vec<EventRow> = sqlx::query_as(
        "SELECT e.at, e.kind, a.name AS agent, e.session, e.detail, count(*) OVER () AS total
         FROM task_events e JOIN agents a ON a.team_id = e.team_id AND a.id = e.agent_id
         WHERE e.team_id = $1 AND e.task_id = $2
         ORDER BY e.id DESC LIMIT $3",
    )
    .bind(me.team_id)
    .bind(row.id)
    .bind(EVENTS_SHOWN_MAX)
    .fetch_all(&mut *conn)
    .await?;
    events.reverse();
    let events_total = events.first().map(|e| e.total).unwrap_or(0);
    Ok(TaskDetail {
        task: row.into_task(),
        events_total,
        events: events
            .into_iter()
            .map(|e| TaskEvent {
                by: address(&e.agent, &e.session),
                at: e.at,
                kind: e.kind,
                detail: e.detail,
            })
            .collect(),
    })
}
