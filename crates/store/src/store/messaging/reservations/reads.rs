//! `list_reservations` and `check_paths`: a project's live reservations
//! (the window's own project unless one is named), read without a lock.
//!
//! Both read the project's live rows through one index
//! (`path_reservations_live`: bounded by what is live, never by history)
//! and match in Rust, each pattern's literal prefix first so a path is
//! matched only against the patterns that could cover it; patterns are
//! parsed once per process ([`super::PARSED`]). A reservation whose holder's
//! presence has expired counts nowhere.

use std::sync::Arc;

use acs_wire::globs::PathGlob;
use serde::Serialize;
use uuid::Uuid;

use super::{
    LISTED_MAX, Reservation, Row, columns, covers, globs_of, holder_present, joined, live_rows,
    parse_path, parse_paths, project_to_read,
};
use crate::Bus;
use crate::auth::Identity;
use crate::error::BusResult;
use crate::store::text;

/// `list_reservations`' answer.
#[derive(Clone, Debug, Serialize)]
pub struct ReservationList {
    /// The project listed (`""`: the windows that name none).
    pub project: String,
    pub count: usize,
    /// More matched than were listed.
    pub more: bool,
    pub reservations: Vec<Reservation>,
}

/// `check_paths`' answer.
#[derive(Clone, Debug, Serialize)]
pub struct PathCheck {
    pub project: String,
    /// Each path asked, in order, with the live reservations covering it.
    pub paths: Vec<CheckedPath>,
    /// The paths another window holds exclusively: do not edit these.
    pub exclusive_elsewhere: Vec<String>,
    /// Live reservations whose stored pattern this server cannot read (a
    /// pattern stored under other glob rules): what they cover is unknown,
    /// so no path is known free of them. Absent when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Reservation>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CheckedPath {
    pub path: String,
    /// Empty: nobody has reserved it.
    pub reservations: Vec<Covering>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Covering {
    #[serde(flatten)]
    pub reservation: Reservation,
    /// This window holds it.
    pub mine: bool,
}

/// `list_reservations`: the project's live reservations, oldest first;
/// `path` keeps those whose pattern covers it, `agent` those an agent holds
/// (any of its windows).
pub async fn list(
    bus: &Bus,
    me: &Identity,
    path: Option<&str>,
    agent: Option<&str>,
    project: Option<&str>,
) -> BusResult<ReservationList> {
    let path = path.map(parse_path).transpose()?;
    let agent = agent.map(text::lookup_lower).filter(|a| !a.is_empty());
    if let Some(agent) = &agent {
        // A name nobody has would list nothing, as if nothing were reserved.
        let known: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM agents WHERE team_id = $1 AND name = $2)",
        )
        .bind(me.team_id)
        .bind(agent)
        .fetch_one(&bus.pool)
        .await?;
        if !known {
            return Err(crate::error::BusError::not_found(format!(
                "no agent `{agent}` in your team, so no reservation of theirs to list. \
                 list_agents shows the team's agents; omit `agent` to list every holder."
            )));
        }
    }
    let project = project_to_read(bus, me, project).await?;
    let mut rows = live_rows(&bus.pool, me, &project).await?;
    if let Some(agent) = &agent {
        rows.retain(|row| &row.agent == agent);
    }
    let mut rows = match &path {
        // A pattern that does not parse may cover the path: kept, not
        // left out as if it did not exist.
        Some(path) => {
            let globs = globs_of(rows.iter().map(|row| row.pattern.as_str()));
            rows.into_iter()
                .zip(globs)
                .filter(|(_, glob)| glob.as_ref().is_none_or(|glob| covers(glob, path)))
                .map(|(row, _)| row)
                .collect()
        }
        None => rows,
    };
    let more = rows.len() > LISTED_MAX;
    rows.truncate(LISTED_MAX);
    let reservations: Vec<Reservation> = rows.into_iter().map(|r| r.into_reservation()).collect();
    Ok(ReservationList {
        project,
        count: reservations.len(),
        more,
        reservations,
    })
}

/// A live reservation as a check first reads it: enough to match and to
/// tell whose it is. The rest (holder's name, reason, times) is read for
/// the few that cover a path asked about.
struct Key {
    id: Uuid,
    glob: Arc<PathGlob>,
    exclusive: bool,
    mine: bool,
}

/// The project's live reservations as [`Key`]s: one indexed read of five
/// narrow columns, unsorted, without the join the full rows need.
/// Also the ids of live reservations whose stored pattern does not parse
/// (their reach is unknown: reported, never left out as if absent).
async fn live_keys(bus: &Bus, me: &Identity, project: &str) -> BusResult<(Vec<Key>, Vec<Uuid>)> {
    let rows: Vec<(Uuid, String, bool, Uuid, String)> = sqlx::query_as(concat!(
        "SELECT r.id, r.pattern, r.exclusive, r.holder_agent_id, r.holder_session
         FROM path_reservations r
         WHERE r.team_id = $1 AND r.project = $2 AND r.expires_at > now()",
        holder_present!()
    ))
    .bind(me.team_id)
    .bind(project)
    .fetch_all(&bus.pool)
    .await?;
    let globs = globs_of(rows.iter().map(|row| row.1.as_str()));
    let mut keys = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for ((id, _, exclusive, agent, session), glob) in rows.into_iter().zip(globs) {
        match glob {
            Some(glob) => keys.push(Key {
                id,
                glob,
                exclusive,
                mine: agent == me.agent_id && session == me.window,
            }),
            None => unreadable.push(id),
        }
    }
    Ok((keys, unreadable))
}

/// The full rows of `ids` (those still live), oldest first.
async fn rows_by_id(bus: &Bus, me: &Identity, ids: &[Uuid]) -> BusResult<Vec<Row>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        columns!(),
        joined!("path_reservations"),
        " WHERE r.team_id = $1 AND r.id = ANY($2) AND r.expires_at > now()
         ORDER BY r.created_at, r.pattern"
    ))
    .bind(me.team_id)
    .bind(ids)
    .fetch_all(&bus.pool)
    .await?)
}

/// `check_paths`: for each path, the live reservations of the project
/// (`project`, else the window's) that cover it, and which paths another
/// window holds exclusively. Two reads: the project's live reservations,
/// narrow, to match; then the full rows of those that cover a path.
pub async fn check_paths(
    bus: &Bus,
    me: &Identity,
    paths: &[String],
    project: Option<&str>,
) -> BusResult<PathCheck> {
    let paths = parse_paths(paths)?;
    let project = project_to_read(bus, me, project).await?;
    let (keys, unreadable) = live_keys(bus, me, &project).await?;
    let covering: Vec<Vec<&Key>> = paths
        .iter()
        .map(|path| keys.iter().filter(|k| covers(&k.glob, path)).collect())
        .collect();
    let mut ids: Vec<Uuid> = covering.iter().flatten().map(|k| k.id).collect();
    ids.extend(&unreadable);
    ids.sort_unstable();
    ids.dedup();
    let rows = rows_by_id(bus, me, &ids).await?;
    let mut checked = Vec::with_capacity(paths.len());
    let mut exclusive_elsewhere = Vec::new();
    for (path, keys) in paths.iter().zip(covering) {
        // In the rows' order (oldest first); a row released between the two
        // reads is left out.
        let reservations: Vec<Covering> = rows
            .iter()
            .filter(|row| keys.iter().any(|k| k.id == row.id))
            .map(|row| Covering {
                mine: row.is_mine(me),
                reservation: row.clone().into_reservation(),
            })
            .collect();
        if keys.iter().any(|k| k.exclusive && !k.mine) {
            exclusive_elsewhere.push(path.as_str().to_string());
        }
        checked.push(CheckedPath {
            path: path.as_str().to_string(),
            reservations,
        });
    }
    let unreadable = rows
        .iter()
        .filter(|row| unreadable.contains(&row.id))
        .map(|row| row.clone().into_reservation())
        .collect();
    Ok(PathCheck {
        project,
        paths: checked,
        exclusive_elsewhere,
        unreadable,
    })
}
