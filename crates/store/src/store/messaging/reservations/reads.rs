//! `list_reservations` and `check_paths`: a project's live reservations
//! (the window's own project unless one is named), read without a lock.
//!
//! Both cost one indexed read of the project's live rows
//! (`path_reservations_live`: bounded by what is live, never by history)
//! and a match in Rust, each pattern's literal prefix first so a path is
//! matched only against the patterns that could cover it.

use serde::Serialize;

use super::{
    LISTED_MAX, Live, Reservation, covers, live_rows, parse_path, parse_paths, parsed,
    project_to_read,
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
    let project = project_to_read(bus, me, project).await?;
    let mut rows = live_rows(&bus.pool, me, &project).await?;
    if let Some(agent) = &agent {
        rows.retain(|row| &row.agent == agent);
    }
    let mut rows = match &path {
        Some(path) => parsed(rows)
            .into_iter()
            .filter(|live| covers(&live.glob, path))
            .map(|live| live.row)
            .collect(),
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

/// `check_paths`: for each path, the live reservations of the project
/// (`project`, else the window's) that cover it, and which paths another
/// window holds exclusively.
pub async fn check_paths(
    bus: &Bus,
    me: &Identity,
    paths: &[String],
    project: Option<&str>,
) -> BusResult<PathCheck> {
    let paths = parse_paths(paths)?;
    let project = project_to_read(bus, me, project).await?;
    let live: Vec<Live> = parsed(live_rows(&bus.pool, me, &project).await?);
    let mut checked = Vec::with_capacity(paths.len());
    let mut exclusive_elsewhere = Vec::new();
    for path in &paths {
        let covering: Vec<Covering> = live
            .iter()
            .filter(|live| covers(&live.glob, path))
            .map(|live| Covering {
                mine: live.row.is_mine(me),
                reservation: live.row.clone().into_reservation(),
            })
            .collect();
        if covering.iter().any(|c| c.reservation.exclusive && !c.mine) {
            exclusive_elsewhere.push(path.as_str().to_string());
        }
        checked.push(CheckedPath {
            path: path.as_str().to_string(),
            reservations: covering,
        });
    }
    Ok(PathCheck {
        project,
        paths: checked,
        exclusive_elsewhere,
    })
}
