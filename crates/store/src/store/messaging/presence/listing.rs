//! The listings of presence: `list_agents` (every agent of the team with
//! its listed windows, the people apart) and `list_sessions` (windows by
//! discovery label). Which windows are listed is the parent's `listed!`
//! rule; a window's columns are its `window_columns!`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::{PAGE_MAX, PresenceStatus, SESSIONS_PAGE_DEFAULT, Window, check_field_size};
use crate::Bus;
use crate::auth::Identity;
use crate::error::BusResult;
use crate::store::messaging::reservations;
use crate::store::{limits, text};

/// `list_agents` shows the live reservations of at most this many windows
/// (each with at most `reservations::HELD_SHOWN` and its count).
const WINDOWS_HOLDING_MAX: i64 = 200;

/// One agent with its windows; the summary fields come from its summary window.
#[derive(Clone, Debug, Serialize)]
pub struct AgentPresence {
    pub agent: String,
    pub agent_id: Uuid,
    /// True while any window is live (and the agent is not disabled).
    pub online: bool,
    /// Only present (true) for a disabled agent: it is refused everywhere.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// Address of the window the summary comes from (absent: never seen).
    pub summary_window: Option<String>,
    pub status: Option<PresenceStatus>,
    pub activity: Option<String>,
    pub repo: Option<String>,
    pub branch: Option<String>,
    pub project: Option<String>,
    pub role: Option<String>,
    pub last_seen_at: Option<DateTime<Utc>>,
    /// Summary window first, then in the same order: live, named, most recent.
    /// Without `all`, not those offline for more than a day.
    pub windows: Vec<Window>,
    /// Windows offline for more than a day, not in `windows` (0 with `all`).
    pub older_windows: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct AgentList {
    /// Agents with at least one live window (not windows).
    pub online_count: usize,
    pub agents: Vec<AgentPresence>,
    /// The team's people (they sign in to the dashboard, not /mcp): reached
    /// by name like an agent (post_message `to`, ask_agent), never counted
    /// online, never holding claims, locks or reservations.
    pub people: Vec<PersonEntry>,
}

/// A person of the team, as `list_agents` shows them.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct PersonEntry {
    pub name: String,
    /// Only present (true) for a revoked person.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// Their newest dashboard sign-in still kept (sign-ins last 8 hours).
    pub last_signed_in_at: Option<DateTime<Utc>>,
}

/// Which windows `list_sessions` lists.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionFilter<'a> {
    /// Only windows with this `project` label.
    pub project: Option<&'a str>,
    /// Only windows with this `role` label.
    pub role: Option<&'a str>,
    /// Only live windows.
    pub online_only: bool,
    /// Windows offline for more than a day too.
    pub all: bool,
}

/// One window in a discovery listing.
#[derive(Clone, Debug, Serialize)]
pub struct SessionEntry {
    pub agent: String,
    /// True when `address` reaches exactly this one window: always for
    /// `agent/window`; for a bare `agent` only while the agent has no other
    /// window (a heartbeat kept or a live registered session).
    pub exact: bool,
    #[serde(flatten)]
    pub window: Window,
}

#[derive(Clone, Debug, Serialize)]
pub struct SessionList {
    pub sessions: Vec<SessionEntry>,
    /// True when more windows matched than `limit` allowed.
    pub truncated: bool,
}

/// A discovery filter: a lookup ([`text::lookup`]); empty means no filter.
fn check_filter(name: &str, raw: Option<&str>) -> BusResult<Option<String>> {
    raw.map(|raw| check_field_size(name, text::lookup(raw)))
        .transpose()
        .map(|value| value.filter(|value| !value.is_empty()))
}

fn check_limit(limit: Option<i64>, default: i64) -> BusResult<i64> {
    limits::page_limit(
        limit,
        limits::Page {
            default,
            max: PAGE_MAX,
        },
        "Narrow the listing with project, role or online_only instead of asking for more.",
    )
}

/// The order that picks an agent's summary window: live before dead, a named
/// window before the shared one, then the most recent.
macro_rules! summary_order {
    () => {
        "(p.expires_at > now()) DESC, (p.session <> '') DESC, p.last_seen_at DESC, p.session"
    };
}

/// `list_agents`: every agent of the caller's team with its listed windows
/// ([`listed!`]; with `all`, those offline for more than a day too, else
/// only counted). With `online_only`, only online agents and only their live
/// windows. Each window holding live path reservations shows them
/// (`reservations`: its count and the first few), read in the same snapshot.
pub async fn list_agents(
    bus: &Bus,
    me: &Identity,
    online_only: bool,
    all: bool,
) -> BusResult<AgentList> {
    #[derive(sqlx::FromRow)]
    struct AgentRow {
        id: Uuid,
        name: String,
        disabled: bool,
        person: bool,
        last_signed_in_at: Option<DateTime<Utc>>,
    }
    #[derive(sqlx::FromRow)]
    struct WindowRow {
        agent_id: Uuid,
        /// Offline for at most a day.
        recent: bool,
        #[sqlx(flatten)]
        window: Window,
    }
    // One snapshot for both reads, so "online" means the same instant in each.
    let mut tx = bus.pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let agents: Vec<AgentRow> = sqlx::query_as(
        "SELECT a.id, a.name, a.disabled_at IS NOT NULL AS disabled, a.kind = 'person' AS person,
                CASE WHEN a.kind = 'person' THEN
                    (SELECT max(d.created_at) FROM dashboard_sessions d
                       JOIN agent_tokens t ON t.id = d.principal_id
                      WHERE d.principal = 'person' AND t.team_id = a.team_id AND t.agent_id = a.id)
                END AS last_signed_in_at
         FROM agents a WHERE a.team_id = $1 ORDER BY a.name",
    )
    .bind(me.team_id)
    .fetch_all(&mut *tx)
    .await?;
    let windows: Vec<WindowRow> = sqlx::query_as(concat!(
        "SELECT p.agent_id, (",
        listed!("false"),
        ") AS recent, ",
        window_columns!(),
        " FROM presence p JOIN agents a ON a.team_id = p.team_id AND a.id = p.agent_id
          WHERE p.team_id = $1 AND (NOT $2 OR (p.expires_at > now() AND a.disabled_at IS NULL))
            AND ",
        listed!("true"),
        " ORDER BY p.agent_id, ",
        summary_order!()
    ))
    .bind(me.team_id)
    .bind(online_only)
    .fetch_all(&mut *tx)
    .await?;
    let mut held = reservations::held_by_window(&mut *tx, me.team_id, WINDOWS_HOLDING_MAX).await?;
    tx.commit().await?;

    let mut by_agent: std::collections::HashMap<Uuid, Vec<(bool, Window)>> = Default::default();
    for mut row in windows {
        row.window.reservations = held
            .iter()
            .position(|h| h.agent_id == row.agent_id && h.session == row.window.session)
            .map(|k| held.swap_remove(k).held);
        let listed = (all || row.recent, row.window.settled());
        by_agent.entry(row.agent_id).or_default().push(listed);
    }
    let mut out = Vec::with_capacity(agents.len());
    let mut people = Vec::new();
    for agent in agents {
        if agent.person {
            people.push(PersonEntry {
                name: agent.name,
                disabled: agent.disabled,
                last_signed_in_at: agent.last_signed_in_at,
            });
            continue;
        }
        let (listed, older): (Vec<_>, Vec<_>) = by_agent
            .remove(&agent.id)
            .unwrap_or_default()
            .into_iter()
            .partition(|(listed, _)| *listed);
        let windows: Vec<Window> = listed.into_iter().map(|(_, w)| w).collect();
        let online = windows.iter().any(|w| w.online);
        if online_only && !online {
            continue;
        }
        let older_seen = older.iter().map(|(_, w)| w.last_seen_at).max();
        // An agent seen only long ago still says what it last did.
        let summary = windows.first().or(older.first().map(|(_, w)| w));
        out.push(AgentPresence {
            agent: agent.name,
            agent_id: agent.id,
            online,
            disabled: agent.disabled,
            summary_window: summary.map(|w| w.address.clone()),
            status: summary.map(|w| w.status),
            activity: summary.and_then(|w| w.activity.clone()),
            repo: summary.and_then(|w| w.repo.clone()),
            branch: summary.and_then(|w| w.branch.clone()),
            project: summary.and_then(|w| w.project.clone()),
            role: summary.and_then(|w| w.role.clone()),
            last_seen_at: windows
                .iter()
                .map(|w| w.last_seen_at)
                .chain(older_seen)
                .max(),
            older_windows: older.len(),
            windows,
        });
    }
    Ok(AgentList {
        online_count: out.iter().filter(|a| a.online).count(),
        agents: out,
        people,
    })
}

/// `list_sessions`: windows of the caller's team, filtered by the discovery
/// labels (trimmed, case-insensitive; empty = no filter), live ones first;
/// only the listed ones ([`listed!`]: with `all`, those offline for more than
/// a day too).
pub async fn list_sessions(
    bus: &Bus,
    me: &Identity,
    filter: &SessionFilter<'_>,
    limit: Option<i64>,
) -> BusResult<SessionList> {
    let SessionFilter {
        project,
        role,
        online_only,
        all,
    } = *filter;
    let project = check_filter("project", project)?;
    let role = check_filter("role", role)?;
    let limit = check_limit(limit, SESSIONS_PAGE_DEFAULT)?;
    #[derive(sqlx::FromRow)]
    struct Row {
        agent: String,
        exact: bool,
        #[sqlx(flatten)]
        window: Window,
    }
    // A bare `agent` reaches every window of that agent, so it is exact only
    // when no other window is known: no other presence row (live or not yet
    // swept) and no live registered session under another label.
    let mut rows: Vec<Row> = sqlx::query_as(concat!(
        "SELECT a.name AS agent, ",
        window_columns!(),
        ", p.session <> '' OR NOT (
                    EXISTS (SELECT 1 FROM presence o
                            WHERE o.team_id = p.team_id AND o.agent_id = p.agent_id AND o.session <> '')
                    OR EXISTS (SELECT 1 FROM agent_sessions s
                               WHERE s.team_id = p.team_id AND s.agent_id = p.agent_id
                                 AND s.revoked_at IS NULL AND s.expires_at > now())
                ) AS exact
         FROM presence p JOIN agents a ON a.team_id = p.team_id AND a.id = p.agent_id
         WHERE p.team_id = $1
           AND ($2::text IS NULL OR lower(p.project) = lower($2))
           AND ($3::text IS NULL OR lower(p.role) = lower($3))
           AND (NOT $4 OR (p.expires_at > now() AND a.disabled_at IS NULL))
           AND ",
        listed!("$6"),
        " ORDER BY (p.expires_at > now()) DESC, p.last_seen_at DESC, a.name, p.session
         LIMIT $5"
    ))
    .bind(me.team_id)
    .bind(project)
    .bind(role)
    .bind(online_only)
    .bind(limit + 1)
    .bind(all)
    .fetch_all(&bus.pool)
    .await?;
    let truncated = limits::cut_page(&mut rows, limit);
    Ok(SessionList {
        truncated,
        sessions: rows
            .into_iter()
            .map(|r| SessionEntry {
                agent: r.agent,
                exact: r.exact,
                window: r.window.settled(),
            })
            .collect(),
    })
}
