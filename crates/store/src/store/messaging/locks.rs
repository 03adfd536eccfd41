//! Advisory locks: team-wide names ("deploy:prod", "src/schema.sql") that one
//! window at a time may hold for a while.
//!
//! A lock belongs to the window that took it, the (agent, session label) pair:
//! that window may extend it by acquiring again, and only it may release it.
//! Another window of the same agent is another holder. Every lock expires
//! (`ttl_seconds`, on the database's clock), so a crashed holder blocks nobody
//! for long; an expired row is taken over in place by the next acquire and is
//! never listed. Nothing sweeps expired rows: there is one per name ever used.
//!
//! Acquire is one upsert whose `WHERE` decides who may take the row, so two
//! windows racing for a free name cannot both win: the second one's upsert
//! waits on the first one's row and then finds it held.
//!
//! Acquire and release are one round trip each: a call of
//! `acquire_team_lock` / `release_team_lock` (migration 0033), which runs the
//! write fence, the write and the holder's read-back in one statement
//! ([`fenced`]); the refusals are worded here.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};
use crate::store::requests::{self, Writer};
use crate::store::{address, at, fenced, limits, text, window_phrase};

pub const NAME_MAX_BYTES: usize = 256;
pub const PURPOSE_MAX_BYTES: usize = 256;
pub const TTL_MIN_SECS: i64 = 5;
pub const TTL_MAX_SECS: i64 = 86_400;
pub const TTL_DEFAULT_SECS: i64 = 300;
/// `list_locks` shows at most this many (nearest expiry last) and says so.
pub const LISTED_MAX: i64 = 200;

#[derive(Clone, Debug, Serialize)]
pub struct Lock {
    pub name: String,
    pub agent: String,
    /// The holding window's label; `""` is the agent's shared session.
    pub session: String,
    /// `agent` or `agent/session`.
    pub holder: String,
    pub purpose: Option<String>,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Whole seconds until it expires.
    pub seconds_left: i64,
}

/// `acquire_lock`'s answer.
#[derive(Clone, Debug, Serialize)]
pub struct Acquired {
    #[serde(flatten)]
    pub lock: Lock,
    /// True when this window already held it and the call only moved the expiry.
    pub extended: bool,
}

/// `release_lock`'s answer.
#[derive(Clone, Debug, Serialize)]
pub struct Released {
    pub name: String,
    pub released: bool,
    /// The lock had already expired when it was released (anyone could have taken it).
    pub had_expired: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct LockList {
    pub count: usize,
    /// More unexpired locks exist than were listed.
    pub more: bool,
    pub locks: Vec<Lock>,
}

/// Lock names to take: one line ([`text::one_line_lower`]), lower-cased,
/// 1..=256 bytes. Anything else is allowed, so a file path or `deploy:prod`
/// is a name as is.
pub fn normalize_name(raw: &str) -> BusResult<String> {
    check_name_size(text::one_line_lower("lock name", raw)?)
}

/// A lock name to release: normalised the same way, never refused for its
/// characters ([`text::lookup_lower`]).
fn lookup_name(raw: &str) -> BusResult<String> {
    check_name_size(text::lookup_lower(raw))
}

fn check_name_size(name: String) -> BusResult<String> {
    if name.is_empty() {
        return Err(BusError::invalid(
            "a lock name is required, e.g. `deploy:prod` or `src/schema.sql` (names are team-wide \
             and lower-cased).",
        ));
    }
    limits::bytes_at_most(
        name.len(),
        NAME_MAX_BYTES,
        "lock name",
        "Name the resource briefly, e.g. `deploy:prod` or a repository-relative path.",
    )?;
    Ok(name)
}

fn check_ttl(ttl_seconds: Option<i64>) -> BusResult<Duration> {
    limits::seconds_to_a_day(
        "ttl_seconds",
        ttl_seconds,
        TTL_DEFAULT_SECS,
        TTL_MIN_SECS..=TTL_MAX_SECS,
        &format!(
            "Omit it for {TTL_DEFAULT_SECS} s, and acquire again before it runs out to extend it."
        ),
    )
}

fn check_purpose(raw: Option<&str>) -> BusResult<Option<String>> {
    text::optional_label(
        "lock purpose",
        raw,
        PURPOSE_MAX_BYTES,
        "One short line saying why you hold the lock is enough.",
    )
}

/// A lock row as `list_locks` selects it and as `team_lock_state`
/// (migration 0033) answers it.
#[derive(sqlx::FromRow, serde::Deserialize)]
struct LockRow {
    name: String,
    holder_agent_id: Uuid,
    agent: String,
    holder_session: String,
    purpose: Option<String>,
    acquired_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    seconds_left: i64,
    expired: bool,
}

/// `list_locks`' columns; `team_lock_state` (migration 0033) gives the same
/// for one lock. The holder's name is a scalar subquery of the current row,
/// so a release that waited out a takeover names the new holder.
macro_rules! lock_columns {
    () => {
        "l.name, l.holder_agent_id,
         (SELECT a.name FROM agents a WHERE a.team_id = l.team_id AND a.id = l.holder_agent_id)
           AS agent,
         l.holder_session, l.purpose, l.acquired_at,
         l.expires_at,
         greatest(0, ceil(extract(epoch FROM l.expires_at - now())))::bigint AS seconds_left,
         l.expires_at <= now() AS expired"
    };
}

impl LockRow {
    /// "held by … until … (N s left)", and why a sibling window does not count.
    fn held_phrase(&self, me: &Identity) -> String {
        let sibling = if self.holder_agent_id == me.agent_id {
            " A lock belongs to the window that took it: another window of the same agent \
             cannot release or take it."
        } else {
            ""
        };
        format!(
            "held by {} until {} ({} s left).{sibling}",
            window_phrase(&self.agent, &self.holder_session),
            at(self.expires_at),
            self.seconds_left
        )
    }

    fn into_lock(self) -> Lock {
        Lock {
            holder: address(&self.agent, &self.holder_session),
            name: self.name,
            agent: self.agent,
            session: self.holder_session,
            purpose: self.purpose,
            acquired_at: self.acquired_at,
            expires_at: self.expires_at,
            seconds_left: self.seconds_left,
        }
    }
}

/// `acquire_lock`: take `name` if it is free or expired, or extend it if this
/// window holds it (expiry = now + ttl; a new purpose replaces the old).
/// One round trip: `acquire_team_lock` (migration 0033) runs the write
/// fence, the upsert whose `WHERE` decides who may take the row, and reads
/// the holder back while the row is still locked by the upsert, so a
/// refusal names the holder that refused it.
pub async fn acquire(
    bus: &Bus,
    me: &Identity,
    name: &str,
    ttl_seconds: Option<i64>,
    purpose: Option<&str>,
) -> BusResult<Acquired> {
    requests::plain(bus, |mut w| async move {
        let acquired = acquire_in(&mut w, me, name, ttl_seconds, purpose).await;
        (w, acquired)
    })
    .await
}

/// [`acquire`] on `w`.
pub async fn acquire_in(
    w: &mut Writer,
    me: &Identity,
    name: &str,
    ttl_seconds: Option<i64>,
    purpose: Option<&str>,
) -> BusResult<Acquired> {
    let name = normalize_name(name)?;
    let ttl = check_ttl(ttl_seconds)?;
    let purpose = check_purpose(purpose)?;
    let (outcome, detail) = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM acquire_team_lock($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        me,
    )
    .bind(&me.window)
    .bind(&name)
    .bind(ttl)
    .bind(&purpose)
    .fetch_one(w.conn())
    .await?
    .outcome(me)?;
    let extended = match outcome.as_str() {
        "taken" => false,
        "extended" => true,
        "vanished" => {
            return Err(BusError::conflict(
                "the lock vanished while it was taken; try again.",
            ));
        }
        _ => {
            let row: LockRow = fenced::detail(detail)?;
            return Err(BusError::conflict(format!(
                "lock `{name}` is {} Nothing was changed. Wait for it to be released or to expire \
                 (wait_for_updates with kinds [\"lock\"]), or ask its holder.",
                row.held_phrase(me)
            )));
        }
    };
    let row: LockRow = fenced::detail(detail)?;
    w.emit(BusEvent::new(me.team_id, EventKind::Lock, name.as_str()).by(me));
    Ok(Acquired {
        lock: row.into_lock(),
        extended,
    })
}

/// `release_lock`: only the holding window. Its own expired lock may be
/// released too (it was free already; this removes the stale row). One round
/// trip: `release_team_lock` (migration 0033) runs the fence, locks the row
/// (a takeover it waits out is read as it is after), and deletes it when
/// this window holds it.
pub async fn release(w: &mut Writer, me: &Identity, name: &str) -> BusResult<Released> {
    let name = lookup_name(name)?;
    let (outcome, detail) = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM release_team_lock($1, $2, $3, $4, $5, $6, $7)",
        me,
    )
    .bind(&me.window)
    .bind(&name)
    .fetch_one(w.conn())
    .await?
    .outcome(me)?;
    match outcome.as_str() {
        "released" => {
            let row: LockRow = fenced::detail(detail)?;
            w.emit(BusEvent::new(me.team_id, EventKind::Lock, name.as_str()).by(me));
            Ok(Released {
                name,
                released: true,
                had_expired: row.expired,
            })
        }
        "held" => {
            let row: LockRow = fenced::detail(detail)?;
            Err(BusError::conflict(format!(
                "lock `{name}` is {} Only the holding window can release it; nothing was changed.",
                row.held_phrase(me)
            )))
        }
        _ => Err(BusError::not_found(format!(
            "lock `{name}` is not held by anyone (free or expired), so there is nothing to \
             release. list_locks shows the locks held now."
        ))),
    }
}

/// `list_locks`: the team's unexpired locks, soonest expiry first.
pub async fn list(bus: &Bus, me: &Identity) -> BusResult<LockList> {
    let mut rows: Vec<LockRow> = sqlx::query_as(concat!(
        "SELECT ",
        lock_columns!(),
        " FROM locks l
         WHERE l.team_id = $1 AND l.expires_at > now()
         ORDER BY l.expires_at, l.name
         LIMIT $2"
    ))
    .bind(me.team_id)
    .bind(LISTED_MAX + 1)
    .fetch_all(&bus.pool)
    .await?;
    let more = limits::cut_page(&mut rows, LISTED_MAX);
    let locks: Vec<Lock> = rows.into_iter().map(LockRow::into_lock).collect();
    Ok(LockList {
        count: locks.len(),
        more,
        locks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_cased_and_bounded() {
        assert_eq!(normalize_name("  Deploy:PROD ").unwrap(), "deploy:prod");
        assert_eq!(normalize_name("src/Main.rs").unwrap(), "src/main.rs");
        assert!(normalize_name(" ").is_err());
        assert!(normalize_name("a\tb").is_err());
        assert!(normalize_name("a\u{202E}b").is_err());
        assert_eq!(lookup_name(" A\u{202E}B ").unwrap(), "a\u{202E}b");
        let long = normalize_name(&"x".repeat(257)).unwrap_err().to_string();
        assert!(long.contains("256"), "{long}");
        assert!(normalize_name(&"x".repeat(256)).is_ok());
        assert!(check_ttl(Some(4)).unwrap_err().to_string().contains("5"));
        assert!(check_ttl(Some(86_401)).is_err());
        assert_eq!(check_ttl(None).unwrap(), Duration::seconds(300));
    }
}
