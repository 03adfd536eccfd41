//! What each window holds, for the listings that show windows
//! (`list_agents`, `team_digest`): every live reservation of the team,
//! grouped by holding window, at most [`HELD_SHOWN`] per window with the
//! window's count. One statement over the team's live rows (the live-rows
//! index), so the cost follows what is live, never history.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::error::BusResult;

/// Reservations shown per window (the count says how many it holds).
pub const HELD_SHOWN: i64 = 10;

/// One live reservation, as a window's listing shows it.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow)]
pub struct HeldPath {
    /// The glob as normalised.
    pub pattern: String,
    pub exclusive: bool,
    /// The project it was taken in (`""`: the window named none).
    pub project: String,
    pub reason: Option<String>,
    pub expires_at: DateTime<Utc>,
}

/// A window's live reservations: how many, and the first [`HELD_SHOWN`]
/// (by project, then pattern).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HeldPaths {
    pub count: i64,
    pub items: Vec<HeldPath>,
}

/// One window's live reservations, naming the window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WindowPaths {
    /// The holder's agent id (not shown: listings match windows by it).
    #[serde(skip)]
    pub agent_id: Uuid,
    /// The holder's window label (`""`: the shared session).
    #[serde(skip)]
    pub session: String,
    /// `agent` or `agent/window`.
    pub holder: String,
    #[serde(flatten)]
    pub held: HeldPaths,
}

/// Every window of the team holding a live reservation, by holder, at most
/// `windows` of them.
pub async fn held_by_window(
    executor: impl PgExecutor<'_>,
    team_id: Uuid,
    windows: i64,
) -> BusResult<Vec<WindowPaths>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        agent_id: Uuid,
        session: String,
        holder: String,
        total: i64,
        #[sqlx(flatten)]
        path: HeldPath,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT r.holder_agent_id AS agent_id, r.holder_session AS session,
                CASE WHEN r.holder_session = '' THEN a.name
                     ELSE a.name || '/' || r.holder_session END AS holder,
                r.total, r.pattern, r.exclusive, r.project, r.reason, r.expires_at
           FROM (SELECT holder_agent_id, holder_session, pattern, exclusive, project, reason,
                        expires_at,
                        row_number() OVER (PARTITION BY holder_agent_id, holder_session
                                           ORDER BY project, pattern) AS rn,
                        count(*) OVER (PARTITION BY holder_agent_id, holder_session) AS total,
                        dense_rank() OVER (ORDER BY holder_agent_id, holder_session) AS window_rank
                   FROM path_reservations
                  WHERE team_id = $1 AND expires_at > now()) r
           JOIN agents a ON a.team_id = $1 AND a.id = r.holder_agent_id
          WHERE r.rn <= $2 AND r.window_rank <= $3
          ORDER BY holder, r.project, r.pattern",
    )
    .bind(team_id)
    .bind(HELD_SHOWN)
    .bind(windows)
    .fetch_all(executor)
    .await?;
    let mut out: Vec<WindowPaths> = Vec::new();
    for row in rows {
        let same = out
            .last()
            .is_some_and(|w| w.agent_id == row.agent_id && w.session == row.session);
        if !same {
            out.push(WindowPaths {
                agent_id: row.agent_id,
                session: row.session,
                holder: row.holder,
                held: HeldPaths {
                    count: row.total,
                    items: Vec::new(),
                },
            });
        }
        if let Some(window) = out.last_mut() {
            window.held.items.push(row.path);
        }
    }
    Ok(out)
}
