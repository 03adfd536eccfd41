//! Path reservations: the repository paths a window is about to edit,
//! reserved exclusively or shared for a while, so two windows do not edit
//! `src/api/**` at once without knowing it.
//!
//! A reservation is a gitignore-style glob relative to the repository root
//! (`acs_wire::globs`: the one rule for what a pattern means, what a path is,
//! and when two patterns overlap). It belongs to the window that took it,
//! the (agent, session label) pair, like a lock: that window extends it by
//! reserving the same pattern again, and only it releases it; another window
//! of the same agent is another holder. It is scoped to the window's project
//! (its presence `project`, lower-cased; `''` when it names none), and
//! reservations of different projects never meet.
//!
//! Exclusive reservations exclude every other window's overlapping one;
//! shared ones coexist with each other. Two patterns overlap when some path
//! could match both (`PathGlob::overlaps`). Every reservation expires on the
//! database's clock (`ttl_seconds`); a window's end deletes its rows (not
//! here: `messaging/holdings.rs`, called when it leaves, is revoked, or its
//! presence expires), and an expired row is deleted by the next reserve in its
//! project, so every read is bounded by what is live.
//!
//! The overlap rule is Rust's, so a reserve cannot be one SQL statement: it is
//! one transaction that takes the write fence, then a per-(team, project)
//! advisory lock (every reserver of a project waits for the one before it, so
//! two cannot both find a pattern free), reads the project's live rows,
//! decides, writes and commits ([`reserve`]). Release and renew touch only
//! the window's own rows and need no lock beyond the fence ([`window`]); the
//! reads ([`reads`]) take none.
//!
//! Deliberately not here: anything that enforces a reservation (the host
//! hooks and the git guard ask `check_paths`), and the release at a window's
//! end.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use acs_wire::globs::{PathGlob, RepoPath};

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::{address, at, limits, text, window_phrase};

mod held;
mod reads;
mod reserve;
mod window;

pub use held::{HELD_SHOWN, HeldPath, HeldPaths, WindowPaths, held_by_window};
pub use reads::{CheckedPath, Covering, PathCheck, ReservationList, check_paths, list};
pub use reserve::{Granted, RefusedPattern, ReserveRequest, Reserved, reserve};
pub use window::{Released, Renewed, release, renew};

pub const TTL_MIN_SECS: i64 = 5;
pub const TTL_MAX_SECS: i64 = 86_400;
/// An editing session outlives a lock's 5 minutes: 30 minutes by default, so
/// an agent that forgets to renew does not lose its reservation mid-edit,
/// and a window that crashed without ending blocks others for at most that.
pub const TTL_DEFAULT_SECS: i64 = 1_800;
pub const REASON_MAX_BYTES: usize = 256;
/// Patterns in one `reserve_paths` or `release_paths` call.
pub const PATTERNS_PER_CALL_MAX: usize = 100;
/// Paths in one `check_paths` call.
pub const PATHS_PER_CHECK_MAX: usize = 200;
/// Live reservations one window may hold (every project together).
pub const PER_WINDOW_MAX: i64 = 500;
/// Live reservations of one project (every window together).
pub const PER_PROJECT_MAX: i64 = 10_000;
/// `list_reservations` shows at most this many and says `more`.
pub const LISTED_MAX: usize = 200;
/// A project's name, as presence keeps it.
pub const PROJECT_MAX_BYTES: usize = 256;

/// First key of the advisory lock that serialises a project's reservers
/// (ASCII 'ACSr'; the second is a hash of the team and the project).
const PROJECT_LOCK: i32 = 1_094_931_314;

/// One reservation, as every tool answers it.
#[derive(Clone, Debug, Serialize)]
pub struct Reservation {
    /// The glob as normalised (no leading `/`, no `./`, no empty segment).
    pub pattern: String,
    /// The project it was taken in (`""`: the window named none).
    pub project: String,
    pub exclusive: bool,
    pub reason: Option<String>,
    pub agent: String,
    /// The holding window's label; `""` is the agent's shared session.
    pub session: String,
    /// `agent` or `agent/session`.
    pub holder: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Whole seconds until it expires.
    pub seconds_left: i64,
}

/// A row as the reads select it ([`columns!`]).
#[derive(Clone, Debug, sqlx::FromRow)]
struct Row {
    id: Uuid,
    pattern: String,
    project: String,
    exclusive: bool,
    reason: Option<String>,
    holder_agent_id: Uuid,
    agent: String,
    holder_session: String,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    seconds_left: i64,
}

/// The columns of [`Row`], over reservation rows `r` (the table or what an
/// update returns) joined to `agents a` (the holder's name): [`joined!`].
macro_rules! columns {
    () => {
        "r.id, r.pattern, r.project, r.exclusive, r.reason, r.holder_agent_id, a.name AS agent,
         r.holder_session, r.created_at, r.expires_at,
         greatest(0, ceil(extract(epoch FROM r.expires_at - now())))::bigint AS seconds_left"
    };
}
use columns;

/// `FROM rows r JOIN agents a …` for [`columns!`].
macro_rules! joined {
    ($rows:literal) => {
        concat!(
            " FROM ",
            $rows,
            " r JOIN agents a ON a.team_id = r.team_id AND a.id = r.holder_agent_id"
        )
    };
}
use joined;

/// This window's reservations, as a `WHERE` clause over `path_reservations`:
/// $1 team, $2 agent, $3 window (`BindCaller::bind_window`).
macro_rules! of_window {
    () => {
        " WHERE team_id = $1 AND holder_agent_id = $2 AND holder_session = $3"
    };
}
use of_window;

/// A reservation `r` whose holder window is still present: not one whose
/// presence has expired (it left, or stopped beating and was not revived).
/// Such a window's rows are deleted by the departures worker within half a
/// minute; until then no read counts them. A window that never sent a
/// heartbeat has no presence row and holds its reservations to their expiry.
macro_rules! holder_present {
    () => {
        " AND NOT EXISTS (SELECT 1 FROM presence p
                          WHERE p.team_id = r.team_id AND p.agent_id = r.holder_agent_id
                            AND p.session = r.holder_session AND p.expires_at <= now())"
    };
}
use holder_present;

impl Row {
    fn is_mine(&self, me: &Identity) -> bool {
        self.holder_agent_id == me.agent_id && self.holder_session == me.window
    }

    fn into_reservation(self) -> Reservation {
        Reservation {
            holder: address(&self.agent, &self.holder_session),
            pattern: self.pattern,
            project: self.project,
            exclusive: self.exclusive,
            reason: self.reason,
            agent: self.agent,
            session: self.holder_session,
            created_at: self.created_at,
            expires_at: self.expires_at,
            seconds_left: self.seconds_left,
        }
    }

    /// How a refusal names it: "`src/api/**` held exclusively by agent `bob`
    /// in window `w1` (address bob/w1) until … (N s left), reason: …".
    fn phrase(&self) -> String {
        let how = if self.exclusive {
            "exclusively"
        } else {
            "shared"
        };
        let reason = match &self.reason {
            // One line without control or bidirectional characters (the
            // rule it was stored under), so it is shown whole.
            Some(reason) => format!(", reason \"{reason}\""),
            None => String::new(),
        };
        format!(
            "`{}` held {how} by {} until {} ({} s left){reason}",
            self.pattern,
            window_phrase(&self.agent, &self.holder_session),
            at(self.expires_at),
            self.seconds_left
        )
    }
}

/// A live row with its pattern parsed once for the overlap and match checks.
struct Live {
    row: Row,
    glob: Arc<PathGlob>,
}

/// Stored patterns parsed, by their text, for every read of this process: a
/// project's live patterns are read again at every check, and parsing a
/// thousand of them costs more than the read. A pattern's parse depends on
/// its text alone, so an entry never goes stale; past
/// [`PARSED_REMEMBERED`] the map starts again.
static PARSED: LazyLock<Mutex<HashMap<String, Arc<PathGlob>>>> = LazyLock::new(Default::default);
const PARSED_REMEMBERED: usize = 50_000;

/// The project's live rows, each with its glob. A stored pattern always
/// parses (it was stored as parsed); one that would not under a later rule
/// is left out and logged: it can only be released or expire.
fn parsed(rows: Vec<Row>) -> Vec<Live> {
    let globs = globs_of(rows.iter().map(|row| row.pattern.as_str()));
    rows.into_iter()
        .zip(globs)
        .filter_map(|(row, glob)| Some(Live { glob: glob?, row }))
        .collect()
}

/// Each stored pattern's glob, through [`PARSED`] (one lock for the lot).
fn globs_of<'p>(patterns: impl Iterator<Item = &'p str>) -> Vec<Option<Arc<PathGlob>>> {
    let mut known = PARSED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if known.len() > PARSED_REMEMBERED {
        known.clear();
    }
    patterns
        .map(|pattern| {
            if let Some(glob) = known.get(pattern) {
                return Some(glob.clone());
            }
            match PathGlob::from_stored(pattern) {
                Ok(glob) => {
                    let glob = Arc::new(glob);
                    known.insert(pattern.to_string(), glob.clone());
                    Some(glob)
                }
                Err(err) => {
                    tracing::warn!(%pattern, %err, "a stored reservation pattern no longer parses");
                    None
                }
            }
        })
        .collect()
}

/// Whether `glob` covers `path`: the literal prefix first, then the rule.
fn covers(glob: &PathGlob, path: &RepoPath) -> bool {
    path.as_str().starts_with(glob.literal_prefix()) && glob.matches(path)
}

/// The window's project: its presence `project` as its heartbeats last set
/// it, lower-cased by [`text::lookup_lower`] (the one rule, also for a
/// project a call names: `Web` and `web` are one project, and so are `ΟΔΟΣ`
/// and `οδος`); `""` when it names none.
async fn project_of<'e>(executor: impl PgExecutor<'e>, me: &Identity) -> BusResult<String> {
    Ok(window_presence(executor, me).await?.project)
}

/// What a reservation needs of the window's presence row.
struct WindowPresence {
    project: String,
    /// The row exists and has expired: the window left (`session_end`) or
    /// stopped beating. It holds nothing until a heartbeat brings it back.
    gone: bool,
}

async fn window_presence<'e>(
    executor: impl PgExecutor<'e>,
    me: &Identity,
) -> BusResult<WindowPresence> {
    let row: Option<(Option<String>, bool)> = sqlx::query_as(
        "SELECT project, expires_at <= now() FROM presence
         WHERE team_id = $1 AND agent_id = $2 AND session = $3",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(executor)
    .await?;
    let (project, gone) = row.unwrap_or((None, false));
    Ok(WindowPresence {
        project: project
            .as_deref()
            .map(text::lookup_lower)
            .unwrap_or_default(),
        gone,
    })
}

/// The project a read looks in: `asked` (lower-cased, as presence keeps
/// projects) when given, else the window's own ([`project_of`]). Any project
/// of the team may be read: `list_agents` shows every window's reservations
/// already.
async fn project_to_read(bus: &Bus, me: &Identity, asked: Option<&str>) -> BusResult<String> {
    let asked = asked.map(text::lookup_lower).filter(|p| !p.is_empty());
    match asked {
        Some(project) => {
            limits::bytes_at_most(
                project.len(),
                PROJECT_MAX_BYTES,
                "project",
                "Give the project's name as `.acs.toml` or heartbeat `project` names it, or omit \
                 it for this window's project.",
            )?;
            Ok(project)
        }
        None => project_of(&bus.pool, me).await,
    }
}

/// The project's live rows, oldest first: one indexed read
/// (`path_reservations_live`).
async fn live_rows<'e>(
    executor: impl PgExecutor<'e>,
    me: &Identity,
    project: &str,
) -> BusResult<Vec<Row>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        columns!(),
        joined!("path_reservations"),
        " WHERE r.team_id = $1 AND r.project = $2 AND r.expires_at > now()",
        holder_present!(),
        " ORDER BY r.created_at, r.pattern"
    ))
    .bind(me.team_id)
    .bind(project)
    .fetch_all(executor)
    .await?)
}

/// How a refusal names the project.
fn project_phrase(project: &str) -> String {
    if project.is_empty() {
        "no project (the windows whose heartbeat names none)".to_string()
    } else {
        format!("project `{project}`")
    }
}

fn check_ttl(ttl_seconds: Option<i64>) -> BusResult<Duration> {
    limits::seconds_to_a_day(
        "ttl_seconds",
        ttl_seconds,
        TTL_DEFAULT_SECS,
        TTL_MIN_SECS..=TTL_MAX_SECS,
        &format!(
            "Omit it for {TTL_DEFAULT_SECS} s (30 min); renew_reservations moves every \
             reservation of this window before it runs out."
        ),
    )
}

fn check_reason(raw: Option<&str>) -> BusResult<Option<String>> {
    text::optional_label(
        "reservation reason",
        raw,
        REASON_MAX_BYTES,
        "One short line saying what you are editing is enough; nothing was reserved.",
    )
}

/// A list argument's length, refused past `max` (duplicates count) and when
/// empty (`empty` says what to do instead).
fn check_count(what: &str, len: usize, max: usize, empty: &str) -> BusResult<()> {
    if len == 0 {
        return Err(BusError::invalid(format!("{what} is empty. {empty}")));
    }
    if len > max {
        return Err(BusError::invalid(format!(
            "{what} holds {len} entries; the limit is {max} per call. Nothing was changed. Split \
             the call, or cover a directory with one glob (`src/api/**`) instead of its files."
        )));
    }
    Ok(())
}

/// Patterns to reserve or release: each parsed by the one rule, in the
/// order given, duplicates (after normalising) dropped.
fn parse_patterns(paths: &[String], empty: &str) -> BusResult<Vec<PathGlob>> {
    check_count("paths", paths.len(), PATTERNS_PER_CALL_MAX, empty)?;
    let mut globs: Vec<PathGlob> = Vec::with_capacity(paths.len());
    for (i, raw) in paths.iter().enumerate() {
        let glob = PathGlob::parse(raw).map_err(|err| {
            BusError::invalid(format!(
                "paths[{i}] {} is not a pattern a reservation can hold: {err} Nothing was \
                 changed.",
                text::quote(raw)
            ))
        })?;
        if !globs.iter().any(|g| g.as_str() == glob.as_str()) {
            globs.push(glob);
        }
    }
    Ok(globs)
}

/// One repository path (`list_reservations`' `path`).
fn parse_path(raw: &str) -> BusResult<RepoPath> {
    RepoPath::parse(raw).map_err(|err| {
        BusError::invalid(format!(
            "path {} is not a repository path: {err} Give a path relative to the repository \
             root, e.g. `src/api/users.rs`, or omit it to list every reservation.",
            text::quote(raw)
        ))
    })
}

/// Paths to check: each parsed by the one rule (`RepoPath`), in order.
fn parse_paths(paths: &[String]) -> BusResult<Vec<RepoPath>> {
    check_count(
        "paths",
        paths.len(),
        PATHS_PER_CHECK_MAX,
        "Give the repository-relative paths you are about to edit, e.g. [\"src/api/users.rs\"].",
    )?;
    paths
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            RepoPath::parse(raw).map_err(|err| {
                BusError::invalid(format!(
                    "paths[{i}] {} is not a repository path: {err} Give paths relative to the \
                     repository root, e.g. `src/api/users.rs`.",
                    text::quote(raw)
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_reason_and_counts_are_bounded() {
        assert_eq!(check_ttl(None).unwrap(), Duration::seconds(1_800));
        assert!(check_ttl(Some(4)).unwrap_err().to_string().contains("5"));
        assert!(check_ttl(Some(86_401)).is_err());
        assert_eq!(check_reason(Some("  ")).unwrap(), None);
        assert!(check_reason(Some("a\nb")).is_err());
        let long = check_reason(Some(&"x".repeat(257)))
            .unwrap_err()
            .to_string();
        assert!(long.contains("256"), "{long}");
        assert!(check_reason(Some(&"x".repeat(256))).is_ok());
        let many: Vec<String> = (0..101).map(|i| format!("f{i}")).collect();
        let refused = parse_patterns(&many, "").unwrap_err().to_string();
        assert!(
            refused.contains("101") && refused.contains("100"),
            "{refused}"
        );
        assert!(
            parse_patterns(&[], "Omit it.")
                .unwrap_err()
                .to_string()
                .contains("Omit")
        );
    }

    #[test]
    fn duplicate_patterns_count_once() {
        let globs = parse_patterns(&["src/a.rs".into(), "/src/a.rs".into()], "").unwrap();
        assert_eq!(globs.len(), 1);
        assert_eq!(globs[0].as_str(), "src/a.rs");
    }
}
