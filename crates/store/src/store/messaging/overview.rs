//! Overviews: `whoami`'s pending work and `team_digest`.
//!
//! The digest is a fixed handful of queries whatever the team's size: one for
//! channel activity (a window function keeps the last few per channel), one
//! each for tasks, notes, agents and the live path reservations. Its cost follows the activity in the
//! period, never the number of channels. It never shows direct messages or
//! private conversation bodies.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::BusResult;
use crate::store::fenced::BindCaller as _;
use crate::store::messaging::presence::listed;
use crate::store::messaging::{channels, messages, reservations};

pub const DIGEST_HOURS_MAX: i32 = 336;
pub const DIGEST_HOURS_DEFAULT: i32 = 24;
const LATEST_PER_CHANNEL: i64 = 3;
/// The digest shows at most this many latest messages in all, the newest
/// (at most [`LATEST_PER_CHANNEL`] of a channel); a channel past them is
/// listed with its count and no message. Without it the answer grew with
/// the team's active channels (issue 34 item 7).
pub const DIGEST_LATEST_MAX: i64 = 20;
const DIGEST_LIST_MAX: i64 = 50;
/// A channel's messages in the period are counted among its newest this
/// many + 1, so every active channel costs the same few index entries
/// whatever its traffic; past it the count says "at least". Lower than
/// `list_channels`' unread cap: a digest tells where the activity is, and
/// its cost is this cap times the team's active channels.
pub const DIGEST_COUNT_CAP: i64 = 10;
const PREVIEW_CHARS: i32 = 280;

#[derive(Clone, Debug, Serialize)]
pub struct WhoAmI {
    pub agent: String,
    pub agent_id: Uuid,
    pub team: String,
    pub team_id: Uuid,
    /// The window label; empty for the agent's shared session.
    pub session: String,
    /// How other agents reach exactly this caller: `agent` or `agent/session`.
    pub address: String,
    /// `agent_token`, or `session` for a session credential.
    pub credential: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// This window's discovery labels (from heartbeat).
    pub project: Option<String>,
    pub role: Option<String>,
    /// The channel set for this window (heartbeat `channel`), if any.
    pub channel: Option<String>,
    /// Where post_message goes without `channel` or `to`, and what
    /// team_digest focuses on: the channel set for this window, else its
    /// project's, else its window label's (`messages::default_channel_of`).
    pub default_channel: Option<String>,
    /// What named the default channel: `set` (the channel set for this
    /// window), `project` or `window`; absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_channel_from: Option<messages::ChannelSource>,
    /// Unread direct messages to this window, counted up to 1000.
    pub unread_direct_messages: i64,
    /// True when the count stopped at 1000: there are at least that many.
    pub unread_direct_messages_at_least: bool,
    /// Tasks this window holds with a live lease.
    pub open_claimed_tasks: i64,
}

pub async fn whoami(bus: &Bus, me: &Identity) -> BusResult<WhoAmI> {
    // One statement, one round trip: the window's labels (for both the
    // answer and the default channel), its unread direct messages (counted
    // as `unread_direct` counts them) and its live claims.
    #[derive(sqlx::FromRow)]
    struct Reads {
        project: Option<String>,
        role: Option<String>,
        channel: Option<String>,
        unread: i64,
        claimed: i64,
    }
    static WHOAMI: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{cursor} SELECT p.project, p.role, p.channel, {unread} AS unread,
                    (SELECT count(*) FROM tasks t
                      WHERE t.team_id = $1 AND t.holder_agent_id = $2 AND t.holder_session = $3
                        AND t.status = 'claimed' AND t.lease_expires_at > now()) AS claimed
             FROM (SELECT 1) one
             LEFT JOIN presence p ON p.team_id = $1 AND p.agent_id = $2 AND p.session = $3",
            cursor = messages::UNREAD_DM_CURSOR,
            unread = messages::UNREAD_DM_COUNT,
        )
    });
    let reads: Reads = sqlx::query_as(WHOAMI.as_str())
        .bind_window(me)
        .bind(messages::UNREAD_COUNT_CAP + 1)
        .fetch_one(&bus.pool)
        .await?;
    let (project, role, channel) = (reads.project, reads.role, reads.channel);
    let default_channel = messages::default_channel_of(
        &messages::ChannelLabels {
            channel: channel.clone(),
            project: project.clone(),
        },
        me,
    );
    let unread = messages::BoundedCount::of(reads.unread, messages::UNREAD_COUNT_CAP);
    let open_claimed_tasks = reads.claimed;
    Ok(WhoAmI {
        agent: me.agent.clone(),
        agent_id: me.agent_id,
        team: me.team.clone(),
        team_id: me.team_id,
        session: me.window.clone(),
        address: me.address(),
        credential: if me.session_credential.is_some() {
            "session"
        } else {
            "agent_token"
        },
        epoch: me.session_credential.map(|w| w.epoch),
        project,
        role,
        channel,
        default_channel_from: default_channel.as_ref().map(|d| d.from),
        default_channel: default_channel.map(|d| d.name),
        unread_direct_messages: unread.count,
        unread_direct_messages_at_least: unread.at_least,
        open_claimed_tasks,
    })
}

#[derive(Clone, Debug, Serialize)]
pub struct Digest {
    pub hours: i32,
    pub since: DateTime<Utc>,
    /// The channel the digest focuses on: the window's default channel
    /// (None: it has none, or all_channels).
    pub focus: Option<String>,
    pub all_channels: bool,
    pub channels: Vec<ChannelActivity>,
    pub tasks: Vec<TaskMove>,
    pub notes: Vec<NoteChange>,
    pub agents_seen: Vec<AgentSeen>,
    /// The windows holding live path reservations now (whatever `hours`),
    /// each with its count and first few; at most 50 windows.
    pub reservations: Vec<reservations::WindowPaths>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChannelActivity {
    pub channel: String,
    /// Messages counted in the period (outside the focus: announcements
    /// only), among the channel's newest [`DIGEST_COUNT_CAP`] + 1:
    /// counting stops at the cap.
    pub messages: i64,
    /// True when counting stopped at the cap: at least that many.
    pub messages_at_least: bool,
    /// Its latest messages, at most [`LATEST_PER_CHANNEL`]; the digest shows
    /// [`DIGEST_LATEST_MAX`] in all, the newest: empty past them.
    pub latest: Vec<DigestMessage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DigestMessage {
    pub id: Uuid,
    pub from: String,
    /// Present (true) when the sender is a person of the team.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub from_person: bool,
    pub preview: String,
    pub announce: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct TaskMove {
    pub key: String,
    pub title: String,
    /// Current status; a lapsed claim reads as `open`.
    pub status: crate::store::tasks::TaskStatus,
    /// The latest event in the period: created, claimed, renewed, released, completed, cancelled.
    pub last_event: crate::store::tasks::TaskEventKind,
    pub by: String,
    pub at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct NoteChange {
    pub scope: String,
    pub key: String,
    pub revision: i64,
    pub deleted: bool,
    pub by: String,
    pub at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct AgentSeen {
    pub agent: String,
    pub windows: i64,
    pub last_seen_at: DateTime<Utc>,
}

/// `team_digest {hours, all_channels}`.
pub async fn team_digest(
    bus: &Bus,
    me: &Identity,
    hours: Option<i32>,
    all_channels: bool,
) -> BusResult<Digest> {
    let hours = crate::store::limits::within(
        "hours",
        hours.unwrap_or(DIGEST_HOURS_DEFAULT),
        1..=DIGEST_HOURS_MAX,
        " (two weeks)",
        "",
    )?;
    let focus = if all_channels {
        None
    } else {
        messages::default_channel(bus, me).await?.map(|d| d.name)
    };
    let focus_id = match &focus {
        Some(name) => channels::find(bus, me, name).await?.map(|c| c.id),
        None => None,
    };
    let since: DateTime<Utc> = sqlx::query_scalar("SELECT now() - make_interval(hours => $1)")
        .bind(hours)
        .fetch_one(&bus.pool)
        .await?;

    Ok(Digest {
        hours,
        since,
        focus,
        all_channels,
        channels: channel_activity(bus, me, since, all_channels, focus_id).await?,
        tasks: task_moves(bus, me, since).await?,
        notes: note_changes(bus, me, since).await?,
        agents_seen: agents_seen(bus, me, since).await?,
        reservations: reservations::held_by_window(&bus.pool, me.team_id, DIGEST_LIST_MAX).await?,
    })
}

/// The channels active in the period (all of them, or the focus and
/// announcements), each with its count (capped) and its latest messages.
async fn channel_activity(
    bus: &Bus,
    me: &Identity,
    since: DateTime<Utc>,
    all_channels: bool,
    focus_id: Option<Uuid>,
) -> BusResult<Vec<ChannelActivity>> {
    // The message's columns are NULL on the rows of a channel past
    // DIGEST_LATEST_MAX: it is listed with its count and no message.
    #[derive(sqlx::FromRow)]
    struct Row {
        channel: String,
        total: i64,
        id: Option<Uuid>,
        from: Option<String>,
        from_person: Option<bool>,
        preview: Option<String>,
        announce: Option<bool>,
        created_at: Option<DateTime<Utc>>,
    }
    // Bounded by the page: only channels whose newest message (by the
    // position index) is in the period, and in each only its newest
    // DIGEST_COUNT_CAP + 1 messages, walked back on the channel's position
    // index (which carries created_at and announce), are counted, and of
    // their latest the newest DIGEST_LATEST_MAX in all are shown.
    // `digest_channel_activity` (migration 0051) runs the statement on its
    // generic plan: sent from here as a prepared statement, it was planned
    // again for every call once the team's history was large (issue 34).
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT channel, total, id, preview, announce, created_at, from_person, \"from\"
         FROM digest_channel_activity($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(me.team_id)
    .bind(since)
    .bind(all_channels)
    .bind(focus_id)
    .bind(PREVIEW_CHARS)
    .bind(LATEST_PER_CHANNEL)
    .bind(DIGEST_COUNT_CAP + 1)
    .bind(DIGEST_LATEST_MAX)
    .fetch_all(&bus.pool)
    .await?;
    let mut channel_activity: Vec<ChannelActivity> = Vec::new();
    for row in rows {
        if channel_activity
            .last()
            .is_none_or(|c| c.channel != row.channel)
        {
            channel_activity.push(ChannelActivity {
                channel: row.channel.clone(),
                messages: row.total.min(DIGEST_COUNT_CAP),
                messages_at_least: row.total > DIGEST_COUNT_CAP,
                latest: Vec::new(),
            });
        }
        if let (Some(current), Some(id), Some(from), Some(preview), Some(created_at)) = (
            channel_activity.last_mut(),
            row.id,
            row.from,
            row.preview,
            row.created_at,
        ) {
            current.latest.push(DigestMessage {
                id,
                from,
                from_person: row.from_person.unwrap_or(false),
                preview,
                announce: row.announce.unwrap_or(false),
                created_at,
            });
        }
    }
    Ok(channel_activity)
}

/// The team's newest task moves in the period, each with its latest event.
async fn task_moves(bus: &Bus, me: &Identity, since: DateTime<Utc>) -> BusResult<Vec<TaskMove>> {
    // Bounded by the page: the team's newest task moves, walked on their
    // update-time index, then each task's latest event in the period. The
    // page is taken before the events are joined: every write that sets
    // updated_at records an event in the same transaction, so each of these
    // tasks has one; joined first, the planner read the events of every
    // task moved in the period (13.6 ms against 0.46 on the history
    // benchmark's large team, issue 34). `digest_task_moves` (migration
    // 0051) runs it on its generic plan, never planned again per call.
    Ok(sqlx::query_as(
        "SELECT key, title, status, last_event, at, by FROM digest_task_moves($1, $2, $3)",
    )
    .bind(me.team_id)
    .bind(since)
    .bind(DIGEST_LIST_MAX)
    .fetch_all(&bus.pool)
    .await?)
}

/// The notes changed in the period, newest first.
async fn note_changes(
    bus: &Bus,
    me: &Identity,
    since: DateTime<Utc>,
) -> BusResult<Vec<NoteChange>> {
    // `digest_note_changes` (migration 0051): on its generic plan.
    Ok(sqlx::query_as(
        "SELECT scope, key, revision, deleted, at, by FROM digest_note_changes($1, $2, $3)",
    )
    .bind(me.team_id)
    .bind(since)
    .bind(DIGEST_LIST_MAX)
    .fetch_all(&bus.pool)
    .await?)
}

/// The agents seen in the period, with how many windows (a revoked one, such
/// as a provisional window the proxy retired, does not count).
async fn agents_seen(bus: &Bus, me: &Identity, since: DateTime<Utc>) -> BusResult<Vec<AgentSeen>> {
    Ok(sqlx::query_as(concat!(
        "SELECT a.name AS agent, count(*) AS windows, max(p.last_seen_at) AS last_seen_at
         FROM presence p JOIN agents a ON a.team_id = p.team_id AND a.id = p.agent_id
         WHERE p.team_id = $1 AND p.last_seen_at > $2 AND ",
        listed!("true"),
        " GROUP BY a.name ORDER BY max(p.last_seen_at) DESC LIMIT $3"
    ))
    .bind(me.team_id)
    .bind(since)
    .bind(DIGEST_LIST_MAX)
    .fetch_all(&bus.pool)
    .await?)
}
