//! `reserve_paths`: take patterns for this window, all or nothing (or, with
//! `partial`, whatever is free).
//!
//! One transaction: the write fence, then the project's advisory lock (held
//! to the commit: the reservers of one project run one at a time, so the
//! live rows read below stay true until this one's rows are written), the
//! project's expired rows deleted, its live rows read, the decision made in
//! Rust with the one overlap rule, the rows written, commit, then the wake-up
//! event. A refusal rolls everything back, the deletion of expired rows too.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use acs_wire::globs::PathGlob;

use super::{
    Live, PER_PROJECT_MAX, PER_WINDOW_MAX, PROJECT_LOCK, Reservation, Row, WindowPresence,
    check_reason, check_ttl, live_rows, of_window, parse_patterns, parsed, project_phrase,
    window_presence,
};
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};
use crate::store::requests::Writer;
use crate::store::{address, identity::sessions};

/// Refused patterns a conflict's text names (the rest are counted).
const REFUSALS_SHOWN: usize = 10;
/// Holders a conflict's text names per refused pattern.
const HOLDERS_SHOWN: usize = 3;

/// What `reserve_paths` was asked.
#[derive(Clone, Debug)]
pub struct ReserveRequest<'a> {
    pub paths: &'a [String],
    /// Default true.
    pub exclusive: Option<bool>,
    pub ttl_seconds: Option<i64>,
    pub reason: Option<&'a str>,
    /// Take what is free and answer what is not, instead of refusing the call.
    pub partial: bool,
}

/// `reserve_paths`' answer.
#[derive(Clone, Debug, Serialize)]
pub struct Reserved {
    /// The project the reservations belong to (`""`: the window names none).
    pub project: String,
    pub granted: Vec<Granted>,
    /// Only with `partial`: the patterns not taken and what overlaps each.
    pub refused: Vec<RefusedPattern>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Granted {
    #[serde(flatten)]
    pub reservation: Reservation,
    /// True when this window already held the pattern and the call moved its
    /// expiry (and set `exclusive`, and `reason` when given).
    pub extended: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct RefusedPattern {
    pub pattern: String,
    /// Other windows' live reservations that overlap it.
    pub conflicts: Vec<Reservation>,
}

/// What the live rows allow: the patterns to write (and whether this window
/// held each already), and the refused ones with what overlaps them.
struct Decision<'l> {
    granted: Vec<(PathGlob, bool)>,
    refused: Vec<(PathGlob, Vec<&'l Row>)>,
}

/// The rule, once: a request conflicts with another window's overlapping
/// reservation when either of the two is exclusive; the caller's own window
/// never conflicts with itself.
fn decide<'l>(
    mine: impl Fn(&Row) -> bool,
    globs: Vec<PathGlob>,
    exclusive: bool,
    live: &'l [Live],
) -> Decision<'l> {
    let mut decision = Decision {
        granted: Vec::new(),
        refused: Vec::new(),
    };
    for glob in globs {
        let mut held = false;
        let mut conflicts = Vec::new();
        for other in live {
            if mine(&other.row) {
                held |= other.row.pattern == glob.as_str();
                continue;
            }
            // `overlaps` compares the literal prefixes first: disjoint
            // directories cost a string comparison.
            if (exclusive || other.row.exclusive) && glob.overlaps(&other.glob) {
                conflicts.push(&other.row);
            }
        }
        if conflicts.is_empty() {
            decision.granted.push((glob, held));
        } else {
            decision.refused.push((glob, conflicts));
        }
    }
    decision
}

/// `reserve_paths`.
pub async fn reserve(
    w: &mut Writer,
    me: &Identity,
    request: ReserveRequest<'_>,
) -> BusResult<Reserved> {
    let globs = parse_patterns(
        request.paths,
        "Give the patterns you are about to edit, e.g. [\"src/api/**\", \"README.md\"].",
    )?;
    let exclusive = request.exclusive.unwrap_or(true);
    let ttl = check_ttl(request.ttl_seconds)?;
    let reason = check_reason(request.reason)?;

    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let WindowPresence { project, gone } = window_presence(&mut *tx, me).await?;
    if gone {
        return Err(BusError::conflict(
            "this window has left (its presence ended: `heartbeat {offline: true}`, or no \
             heartbeat within its ttl), and a window that left holds nothing. Nothing was \
             reserved. Send a heartbeat to come back, then reserve again.",
        ));
    }
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(PROJECT_LOCK)
        .bind(format!("{}/{project}", me.team_id))
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "DELETE FROM path_reservations
         WHERE team_id = $1 AND project = $2 AND expires_at <= now()",
    )
    .bind(me.team_id)
    .bind(&project)
    .execute(&mut *tx)
    .await?;
    let live = parsed(live_rows(&mut *tx, me, &project).await?);
    let decision = decide(|row| row.is_mine(me), globs, exclusive, &live);
    if !decision.refused.is_empty() && !request.partial {
        return Err(conflict(me, &project, exclusive, &decision));
    }
    let new = decision.granted.iter().filter(|(_, held)| !held).count() as i64;
    refuse_past_caps(&mut tx, me, &project, live.len() as i64, new).await?;
    let refused: Vec<RefusedPattern> = decision
        .refused
        .iter()
        .map(|(glob, rows)| RefusedPattern {
            pattern: glob.as_str().to_string(),
            conflicts: rows
                .iter()
                .map(|row| (*row).clone().into_reservation())
                .collect(),
        })
        .collect();
    if decision.granted.is_empty() {
        // Nothing to write; the transaction's deletions go with it.
        return Ok(Reserved {
            project,
            granted: Vec::new(),
            refused,
        });
    }
    let patterns: Vec<&str> = decision.granted.iter().map(|(g, _)| g.as_str()).collect();
    let written: Vec<Written> = sqlx::query_as(
        "INSERT INTO path_reservations AS r
             (team_id, project, holder_agent_id, holder_session, pattern, exclusive, reason,
              expires_at)
         SELECT $1, $2, $3, $4, p, $6, $7, now() + $8 FROM unnest($5::text[]) AS p
         ON CONFLICT (team_id, project, holder_agent_id, holder_session, pattern) DO UPDATE
           SET exclusive = EXCLUDED.exclusive,
               reason = coalesce(EXCLUDED.reason, r.reason),
               expires_at = EXCLUDED.expires_at
         RETURNING r.pattern, r.reason, r.created_at, r.expires_at,
                   greatest(0, ceil(extract(epoch FROM r.expires_at - now())))::bigint
                     AS seconds_left",
    )
    .bind(me.team_id)
    .bind(&project)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(&patterns)
    .bind(exclusive)
    .bind(&reason)
    .bind(ttl)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    emit(w, me, &patterns);

    let granted = decision
        .granted
        .iter()
        .filter_map(|(glob, held)| {
            let row = written.iter().find(|w| w.pattern == glob.as_str())?;
            Some(Granted {
                reservation: row.reservation(me, &project, exclusive),
                extended: *held,
            })
        })
        .collect();
    Ok(Reserved {
        project,
        granted,
        refused,
    })
}

/// A row as the upsert returns it; the rest of it is the caller's.
#[derive(sqlx::FromRow)]
struct Written {
    pattern: String,
    reason: Option<String>,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    seconds_left: i64,
}

impl Written {
    fn reservation(&self, me: &Identity, project: &str, exclusive: bool) -> Reservation {
        Reservation {
            pattern: self.pattern.clone(),
            project: project.to_string(),
            exclusive,
            reason: self.reason.clone(),
            agent: me.agent.clone(),
            session: me.window.clone(),
            holder: me.address(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            seconds_left: self.seconds_left,
        }
    }
}

/// One event per call, named by its first pattern (and how many more), so a
/// `wait_for_updates` on kind `reservation` wakes.
fn emit(w: &mut Writer, me: &Identity, patterns: &[&str]) {
    let id = match patterns {
        [one] => (*one).to_string(),
        [first, rest @ ..] => format!("{first} (+{} more)", rest.len()),
        [] => return,
    };
    w.emit(BusEvent::new(me.team_id, EventKind::Reservation, id).by(me));
}

/// Refuse when the new rows would take this window past [`PER_WINDOW_MAX`]
/// or the project past [`PER_PROJECT_MAX`] live reservations. Under the
/// project's lock, so the project's count cannot go stale before the insert.
async fn refuse_past_caps(
    conn: &mut PgConnection,
    me: &Identity,
    project: &str,
    project_live: i64,
    new: i64,
) -> BusResult<()> {
    if new == 0 {
        return Ok(());
    }
    let window_live: i64 = sqlx::query_scalar(concat!(
        "SELECT count(*) FROM path_reservations",
        of_window!(),
        " AND expires_at > now()"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_one(&mut *conn)
    .await?;
    if window_live + new > PER_WINDOW_MAX {
        return Err(BusError::conflict(format!(
            "this window holds {window_live} live reservations and this call adds {new}; the \
             limit is {PER_WINDOW_MAX} per window. Nothing was reserved. Release what you no \
             longer edit (release_paths), or cover a directory with one glob (`src/api/**`) \
             instead of its files."
        )));
    }
    if project_live + new > PER_PROJECT_MAX {
        return Err(BusError::conflict(format!(
            "{} has {project_live} live reservations and this call adds {new}; the limit is \
             {PER_PROJECT_MAX} per project. Nothing was reserved. list_reservations shows who \
             holds what: ask them to release what they no longer edit, or reserve directories \
             with one glob each.",
            project_phrase(project)
        )));
    }
    Ok(())
}

/// The all-or-nothing refusal: each refused pattern with the windows whose
/// reservations overlap it, and what to do.
fn conflict(me: &Identity, project: &str, exclusive: bool, decision: &Decision) -> BusError {
    let total = decision.granted.len() + decision.refused.len();
    let how = if exclusive { "exclusive" } else { "shared" };
    let mut lines = Vec::new();
    for (glob, rows) in decision.refused.iter().take(REFUSALS_SHOWN) {
        let mut held: Vec<String> = rows
            .iter()
            .take(HOLDERS_SHOWN)
            .map(|row| {
                let sibling = if row.holder_agent_id == me.agent_id {
                    " (another window of your agent: a reservation belongs to the window that \
                     took it)"
                } else {
                    ""
                };
                format!("{}{sibling}", row.phrase())
            })
            .collect();
        if rows.len() > HOLDERS_SHOWN {
            held.push(format!("and {} more", rows.len() - HOLDERS_SHOWN));
        }
        lines.push(format!(
            "- `{}` ({how}) overlaps {}.",
            glob.as_str(),
            held.join("; ")
        ));
    }
    if decision.refused.len() > REFUSALS_SHOWN {
        lines.push(format!(
            "- and {} more refused patterns.",
            decision.refused.len() - REFUSALS_SHOWN
        ));
    }
    let holder = decision
        .refused
        .first()
        .and_then(|(_, rows)| rows.first())
        .map(|row| address(&row.agent, &row.holder_session))
        .unwrap_or_default();
    BusError::conflict(format!(
        "{} of {total} patterns overlap another window's reservation in {}, so nothing was \
         reserved (all or nothing):\n{}\nTo go on: reserve only what is free with \
         partial: true; wait for a release with wait_for_updates {{\"kinds\": \
         [\"reservation\"]}}; ask the holder (ask_agent {{\"to\": \"{holder}\", ...}}); \
         check_paths shows who holds a given path.",
        decision.refused.len(),
        super::project_phrase(project),
        lines.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    fn live(pattern: &str, agent: Uuid, session: &str, exclusive: bool) -> Live {
        let now = Utc::now();
        Live {
            glob: std::sync::Arc::new(PathGlob::from_stored(pattern).unwrap()),
            row: Row {
                id: Uuid::new_v4(),
                pattern: pattern.to_string(),
                project: String::new(),
                exclusive,
                reason: None,
                holder_agent_id: agent,
                agent: "bob".into(),
                holder_session: session.to_string(),
                created_at: now,
                expires_at: now,
                seconds_left: 60,
            },
        }
    }

    fn globs(patterns: &[&str]) -> Vec<PathGlob> {
        patterns
            .iter()
            .map(|p| PathGlob::parse(p).unwrap())
            .collect()
    }

    #[test]
    fn exclusive_meets_everything_shared_meets_only_exclusive_and_self_never() {
        let (me, other) = (Uuid::new_v4(), Uuid::new_v4());
        let rows = [
            live("src/api/**", other, "w1", false),
            live("docs/**", other, "w1", true),
            live("src/mine.rs", me, "w", true),
        ];
        let mine = |row: &Row| row.holder_agent_id == me && row.holder_session == "w";

        let d = decide(
            mine,
            globs(&["src/api/users.rs", "src/mine.rs"]),
            true,
            &rows,
        );
        assert_eq!(
            d.refused.len(),
            1,
            "an exclusive request meets a shared one"
        );
        assert_eq!(d.refused[0].0.as_str(), "src/api/users.rs");
        assert_eq!(d.granted.len(), 1);
        assert!(d.granted[0].1, "its own pattern is extended");

        let d = decide(
            mine,
            globs(&["src/api/users.rs", "docs/a.md"]),
            false,
            &rows,
        );
        assert_eq!(d.granted.len(), 1, "shared beside shared");
        assert_eq!(
            d.refused[0].0.as_str(),
            "docs/a.md",
            "shared beside exclusive"
        );

        // A sibling window of the same agent is another holder.
        let sibling = |row: &Row| row.holder_agent_id == me && row.holder_session == "w2";
        let d = decide(sibling, globs(&["src/**"]), true, &rows);
        assert_eq!(d.refused[0].1.len(), 2, "{:?}", d.refused[0].1);
    }
}
