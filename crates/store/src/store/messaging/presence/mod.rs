//! Presence: which agents and windows are around, and what they are doing.
//!
//! One row per (agent, window), upserted by `heartbeat`. A window is *live*
//! while its expiry (last beat + ttl, on the database clock) is in the future;
//! an agent is *online* while any of its windows is live. Nothing here is a
//! lock or a grant: presence is what agents say about themselves, and the
//! labels `project` and `role` only help others find them. `channel` is the
//! channel set for the window, kept here with its labels: the first thing
//! its default channel is decided from (`messages::default_channel_of`).
//!
//! A heartbeat is a partial update: an omitted field keeps its value, `""`
//! clears it. Status and ttl have defaults (`active`, 600 s) on the first beat
//! and are kept when omitted later. Heartbeats emit no bus event: they are
//! frequent, and nobody waits on them.
//!
//! A window that leaves says so (`heartbeat {offline: true}`: the proxy when
//! its host conversation ends, the `session_end` hook): it is offline at
//! once instead of at the end of its ttl; a later heartbeat brings it back.
//! Its locks and path reservations go with it, and its claimed tasks too
//! unless it is back within a grace (`holdings.rs`).
//! Each window has a `state`: `online` (live, any status but idle), `idle`
//! (live, status idle) or `offline`.
//!
//! Listings stay readable with one window per host conversation: a window
//! whose session credential was revoked after it last beat is not listed
//! (`revoke_session` also ends its presence), and a window offline for more
//! than [`OFFLINE_LISTED_HOURS`] is only listed when asked (`all`; list_agents
//! counts them in `older_windows`). Dead rows are kept (they answer "when was
//! alice last seen?") until the presence sweeper deletes those dead for
//! longer than its retention.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{PgPool, postgres::types::PgInterval};

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::messaging::{channels, holdings, reservations};
use crate::store::requests::{self, Writer};
use crate::store::{fenced, limits, text};

pub const TTL_MIN_SECS: i64 = 30;
pub const TTL_MAX_SECS: i64 = 86_400;
pub const TTL_DEFAULT_SECS: i64 = 600;
/// Each of repo, branch, activity, project and role.
pub const FIELD_MAX_BYTES: usize = 256;
pub const PAGE_MAX: i64 = 200;
pub const SESSIONS_PAGE_DEFAULT: i64 = 50;
/// A window offline for longer than this is listed only with `all`.
pub const OFFLINE_LISTED_HOURS: i64 = 24;

acs_wire::text_enum! {
    /// What a window says it is doing, stored as text in `presence.status`.
    /// Whether it is online is not a status: that is its expiry (`online`).
    pub enum PresenceStatus {
        /// The default of a first heartbeat.
        Active = "active",
        Idle = "idle",
        Busy = "busy",
        Blocked = "blocked",
    }
}
crate::text_column!(PresenceStatus);

acs_wire::text_enum! {
    /// Whether a window is here, in one word: `online` while live with any
    /// status but idle, `idle` while live with status idle, `offline` once
    /// its ttl ran out, it said it left, or its agent is disabled.
    #[derive(Default)]
    pub enum Liveness {
        Online = "online",
        Idle = "idle",
        #[default]
        Offline = "offline",
    }
}

impl Liveness {
    /// The state of a window that is `online` (live) with `status`.
    pub fn of(online: bool, status: PresenceStatus) -> Liveness {
        match (online, status) {
            (false, _) => Liveness::Offline,
            (true, PresenceStatus::Idle) => Liveness::Idle,
            (true, _) => Liveness::Online,
        }
    }
}

/// A heartbeat's `status` (trimmed, any case), refused in words that say
/// nothing was written.
impl FromStr for PresenceStatus {
    type Err = BusError;

    fn from_str(raw: &str) -> BusResult<PresenceStatus> {
        let status = raw.trim().to_ascii_lowercase();
        if let Some(known) = Self::from_text(&status) {
            return Ok(known);
        }
        let all: Vec<&str> = Self::ALL.iter().map(|s| s.as_str()).collect();
        Err(BusError::invalid(format!(
            "status {} is not one of {}. Nothing was written. Send one of those, or omit status \
             to keep the current one (`active` on a first heartbeat).",
            text::quote(raw),
            all.join(", ")
        )))
    }
}

/// What one heartbeat says. `None` keeps the stored value; `Some("")` clears it.
#[derive(Clone, Debug, Default)]
pub struct Beat {
    /// As the caller sent it: checked by [`PresenceStatus::from_str`].
    pub status: Option<String>,
    pub repo: Option<String>,
    pub branch: Option<String>,
    pub activity: Option<String>,
    pub project: Option<String>,
    pub role: Option<String>,
    /// The channel set for this window: its default channel before the
    /// project's and the window's (`messages::default_channel_of`).
    pub channel: Option<String>,
    pub ttl_seconds: Option<i64>,
    /// The window is leaving: offline now, whatever its ttl.
    pub offline: bool,
}

/// One window as others see it.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow)]
pub struct Window {
    /// The window label; `""` is the agent's shared window.
    pub session: String,
    /// How to reach it: `agent` for the shared window, `agent/window` otherwise.
    pub address: String,
    /// True while the last heartbeat's ttl has not run out (and the agent is
    /// not disabled).
    pub online: bool,
    /// `online`, `idle` or `offline` ([`Liveness::of`] `online` and `status`).
    #[sqlx(skip)]
    #[serde(default)]
    pub state: Liveness,
    pub status: PresenceStatus,
    pub repo: Option<String>,
    pub branch: Option<String>,
    pub activity: Option<String>,
    pub project: Option<String>,
    pub role: Option<String>,
    /// The channel set for this window (heartbeat `channel`), if any.
    #[serde(default)]
    pub channel: Option<String>,
    pub ttl_seconds: i32,
    pub last_seen_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Its live path reservations (`list_agents` only; absent when none).
    #[sqlx(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservations: Option<reservations::HeldPaths>,
}

impl Window {
    /// The window with its `state` filled in from `online` and `status`.
    fn settled(mut self) -> Window {
        self.state = Liveness::of(self.online, self.status);
        self
    }
}

/// The answer to a heartbeat: the window as now stored.
#[derive(Clone, Debug, Serialize)]
pub struct Heartbeat {
    pub agent: String,
    #[serde(flatten)]
    pub window: Window,
}

/// A presence field (repo, branch, activity, project, role): one line
/// ([`text::one_line`]); `""` means clear (returned as `Some(None)`).
fn check_label(name: &str, raw: Option<&str>) -> BusResult<Option<Option<String>>> {
    let Some(raw) = raw else { return Ok(None) };
    let value = check_field_size(name, text::one_line(name, raw)?)?;
    Ok(Some((!value.is_empty()).then_some(value)))
}

fn check_field_size(name: &str, value: String) -> BusResult<String> {
    limits::bytes_at_most_spelled(
        value.len(),
        FIELD_MAX_BYTES,
        name,
        "Nothing was written. Shorten it (a summary, not a log), or send \"\" to clear it.",
    )?;
    Ok(value)
}

/// The channel set for a window: a channel name (the one rule,
/// `channels::normalize_name`) that is not a `read_messages` scope; `""`
/// clears it (`Some(None)`).
fn check_channel(raw: Option<&str>) -> BusResult<Option<Option<String>>> {
    let Some(raw) = raw else { return Ok(None) };
    if raw.trim().is_empty() {
        return Ok(Some(None));
    }
    let name = channels::normalize_name(raw).map_err(|e| {
        BusError::invalid(format!(
            "{e} Nothing was written. Send a channel name for this window's default channel, \
             or \"\" to clear it."
        ))
    })?;
    if channels::RESERVED_NAMES.contains(&name.as_str()) {
        return Err(BusError::invalid(format!(
            "`{name}` cannot be a default channel: `inbox` and `all` are read_messages scopes, \
             not channels. Nothing was written. Pick another name (for example `{name}-team`), \
             or send \"\" to clear it."
        )));
    }
    Ok(Some(Some(name)))
}

fn check_ttl(ttl_seconds: Option<i64>) -> BusResult<Option<i32>> {
    let Some(ttl) = ttl_seconds else {
        return Ok(None);
    };
    let ttl = limits::within(
        "ttl_seconds",
        ttl,
        TTL_MIN_SECS..=TTL_MAX_SECS,
        " (24 h)",
        &format!(
            "Nothing was written. Omit it to keep the current ttl ({TTL_DEFAULT_SECS} s on a \
             first heartbeat), and beat again before it runs out."
        ),
    )?;
    Ok(Some(ttl as i32))
}

/// The columns of a [`Window`] over `presence p JOIN agents a`; a macro so
/// queries can `concat!` a literal.
macro_rules! window_columns {
    () => {
        "p.session,
         CASE WHEN p.session = '' THEN a.name ELSE a.name || '/' || p.session END AS address,
         (p.expires_at > now() AND a.disabled_at IS NULL) AS online,
         p.status, p.repo, p.branch, p.activity, p.project, p.role, p.channel,
         p.ttl_seconds, p.last_seen_at, p.expires_at"
    };
}

/// Whether the window of presence row `p` is listed: not when its session
/// credential was revoked after its last heartbeat (a provisional window a
/// proxy retired, a window its agent ended), and, unless `$all` is true, not
/// when it has been offline for more than [`OFFLINE_LISTED_HOURS`].
macro_rules! listed {
    ($all:literal) => {
        concat!(
            "NOT EXISTS (SELECT 1 FROM agent_sessions rs
                         WHERE rs.team_id = p.team_id AND rs.agent_id = p.agent_id
                           AND rs.label = p.session AND rs.revoked_at >= p.last_seen_at)
             AND (",
            $all,
            " OR p.expires_at > now() - make_interval(hours => 24))"
        )
    };
}
pub(crate) use listed;

mod listing;
pub use listing::{
    AgentList, AgentPresence, PersonEntry, SessionEntry, SessionFilter, SessionList, list_agents,
    list_sessions,
};

/// `heartbeat`: upsert this window's presence. Validates everything first;
/// one statement writes the row, so concurrent beats of one window never
/// interleave field by field. One round trip: `store_heartbeat` (migration
/// 0033) runs the write fence and the upsert.
pub async fn heartbeat(bus: &Bus, me: &Identity, beat: &Beat) -> BusResult<Heartbeat> {
    requests::plain(bus, |mut w| async move {
        let done = heartbeat_in(&mut w, me, beat).await;
        (w, done)
    })
    .await
}

/// [`heartbeat`] on `w`.
pub async fn heartbeat_in(w: &mut Writer, me: &Identity, beat: &Beat) -> BusResult<Heartbeat> {
    let status = beat
        .status
        .as_deref()
        .map(PresenceStatus::from_str)
        .transpose()?;
    let repo = check_label("repo label", beat.repo.as_deref())?;
    let branch = check_label("branch label", beat.branch.as_deref())?;
    let activity = check_label("activity", beat.activity.as_deref())?;
    let project = check_label("project label", beat.project.as_deref())?;
    let role = check_label("role label", beat.role.as_deref())?;
    let channel = check_channel(beat.channel.as_deref())?;
    let ttl = check_ttl(beat.ttl_seconds)?;

    // Each optional field travels as (given, value): not given keeps the
    // stored value on update; given with NULL clears it.
    let write = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM store_heartbeat($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                              $16, $17, $18, $19, $20, $21)",
        me,
    )
    .bind(&me.window)
    .bind(status)
    .bind(repo.is_some())
    .bind(repo.flatten())
    .bind(branch.is_some())
    .bind(branch.flatten())
    .bind(activity.is_some())
    .bind(activity.flatten())
    .bind(project.is_some())
    .bind(project.flatten())
    .bind(role.is_some())
    .bind(role.flatten())
    .bind(channel.is_some())
    .bind(channel.flatten())
    .bind(ttl)
    .bind(TTL_DEFAULT_SECS as i32);
    if !beat.offline {
        let (_, detail) = write.fetch_one(w.conn()).await?.outcome(me)?;
        let window: Window = fenced::detail(detail)?;
        return Ok(Heartbeat {
            agent: me.agent.clone(),
            window: window.settled(),
        });
    }
    // Leaving: the beat as given, then its expiry brought to now and its
    // locks and reservations released, in one transaction (the fence ran in
    // the first statement).
    let mut tx = w.begin().await?;
    write.fetch_one(&mut *tx).await?.outcome(me)?;
    let window: Window = sqlx::query_as(concat!(
        "UPDATE presence p SET expires_at = least(p.expires_at, now())
         FROM agents a
         WHERE a.team_id = p.team_id AND a.id = p.agent_id
           AND p.team_id = $1 AND p.agent_id = $2 AND p.session = $3
         RETURNING ",
        window_columns!()
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_one(&mut *tx)
    .await?;
    holdings::release_on_leave(&mut tx, me).await?;
    tx.commit().await?;
    Ok(Heartbeat {
        agent: me.agent.clone(),
        window: window.settled(),
    })
}

/// This window's discovery labels `(project, role)`, as its heartbeats last
/// set them (whether or not the window is live now); `(None, None)` before
/// its first heartbeat.
pub async fn window_labels(
    pool: &PgPool,
    me: &Identity,
) -> BusResult<(Option<String>, Option<String>)> {
    let labels: Option<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT project, role FROM presence WHERE team_id = $1 AND agent_id = $2 AND session = $3",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(pool)
    .await?;
    Ok(labels.unwrap_or((None, None)))
}

/// Delete at most `batch` presence rows whose expiry lies more than
/// `retention` in the past; returns how many went. Rows another transaction
/// holds (a heartbeat reviving them) are skipped, and the expiry is checked
/// again on the row deleted, so a window that just beat is never swept.
pub async fn delete_dead_batch(
    pool: &PgPool,
    retention: std::time::Duration,
    batch: i64,
) -> BusResult<u64> {
    let retention = PgInterval::try_from(retention).map_err(|_| {
        BusError::invalid("the presence retention is too long to express as an interval")
    })?;
    let deleted = sqlx::query(
        "DELETE FROM presence p
         USING (SELECT team_id, agent_id, session FROM presence
                WHERE expires_at < now() - $1
                LIMIT $2 FOR UPDATE SKIP LOCKED) dead
         WHERE p.team_id = dead.team_id AND p.agent_id = dead.agent_id AND p.session = dead.session
           AND p.expires_at < now() - $1",
    )
    .bind(retention)
    .bind(batch)
    .execute(pool)
    .await?;
    Ok(deleted.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_online_idle_or_offline() {
        assert_eq!(Liveness::of(true, PresenceStatus::Busy), Liveness::Online);
        assert_eq!(Liveness::of(true, PresenceStatus::Idle), Liveness::Idle);
        assert_eq!(
            Liveness::of(false, PresenceStatus::Active),
            Liveness::Offline
        );
    }

    #[test]
    fn the_listing_rule_keeps_offline_windows_for_the_documented_hours() {
        let rule = listed!("false");
        assert!(
            rule.contains(&format!("make_interval(hours => {OFFLINE_LISTED_HOURS})")),
            "{rule}"
        );
    }
}
