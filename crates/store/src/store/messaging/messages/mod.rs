//! Messages: channel posts and direct messages, per-window read cursors, and
//! full-text search over what the caller may see.
//!
//! Visibility: a channel message is seen by the whole team; a direct message
//! only by its sender and its recipient. A DM to `agent` reaches every window
//! of that agent and is read once for all of them (whichever reads it); a DM
//! to `agent/window` reaches exactly that window (even if the window has
//! never connected: it waits there).
//!
//! Order: every message has a per-team `position` from the team's own
//! sequence, taken in the statement that inserts it (migration 0031), so a
//! team's posts commit in parallel: positions may commit out of order, and a
//! post that rolls back leaves its position empty for good. A cursor (one per
//! agent, window and scope: the last position read) must never pass a
//! message that commits later (issue 19's guarantee a), and a read must wait
//! for no transaction but its own team's writers (b). So a writer, in that
//! statement, takes the team's entry lock shared, then its position, then the
//! position's lock exclusively, all held to its commit. A read that finds a
//! position missing below the newest it would return waits for that
//! position's writer (its lock), reads again, and for a position still
//! missing waits once for the team's entry lock exclusively: every writer
//! that took a position below the newest visible one took the entry lock
//! first, so after that wait the position has committed or never will.
//! Every position up to a cursor is thus settled (`read.rs`). Counts never
//! subtract positions: they count rows.
//!
//! Seams: the model and argument checks here; `post.rs` writes a message,
//! `read.rs` reads pages and cursors, `search.rs` searches.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::Bus;
use crate::auth::{self, Identity};
use crate::error::{BusError, BusResult};
use crate::store::limits::{self, BODY_MAX_BYTES};
use crate::store::{messaging::attachments, messaging::channels, normalize_agent_name, text};

pub const PAGE_MAX: i64 = 200;
pub const PAGE_DEFAULT: i64 = 50;
const PAGE: limits::Page = limits::Page {
    default: PAGE_DEFAULT,
    max: PAGE_MAX,
};
pub const QUERY_MAX_BYTES: usize = 256;

/// A message as a reader sees it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct MessageView {
    pub id: Uuid,
    /// The sender's address: `agent`, or `agent/window`.
    pub from: String,
    /// Present (true) when the sender is a person of the team (signed in to
    /// the dashboard), not an agent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_person: bool,
    /// The channel, for channel messages.
    pub channel: Option<String>,
    /// The recipient's address, for direct messages.
    pub to: Option<String>,
    pub body: String,
    pub announce: bool,
    pub question: bool,
    pub reply_to: Option<Uuid>,
    pub metadata: Option<Value>,
    /// `[{id, filename, content_type, size_bytes}]`; get_attachment fetches one.
    pub attachments: Value,
    pub created_at: DateTime<Utc>,
    /// The sender asked for an acknowledgement (ack_message; list_owed).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ack_required: bool,
    /// When that acknowledgement is due (absent: no due time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_due_at: Option<DateTime<Utc>>,
    /// On a message asking this reader's agent for an acknowledgement:
    /// whether it acknowledged it (`acks::mark_acked`, after the page).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[sqlx(default)]
    pub acked: Option<bool>,
    /// The team-wide position (cursors compare it; see the overview).
    #[serde(skip)]
    pub position: i64,
}

/// The columns of a [`MessageView`], for `concat!` into queries over `messages m`.
macro_rules! view_columns {
    () => {
        concat!(view_columns_from!(), " FROM messages m", view_joins!())
    };
}

/// The columns of a [`MessageView`] before their `FROM`, for a query whose
/// `m` is not the table (the post's inserted row).
macro_rules! view_columns_from {
    () => {
        "m.id, m.body, m.announce, m.is_question AS question, m.reply_to, m.metadata,
         m.created_at, m.position, c.name AS channel, m.ack_required, m.ack_due_at,
         (SELECT coalesce(jsonb_agg(jsonb_build_object('id', a.id, 'filename', a.filename,
                 'content_type', a.content_type, 'size_bytes', a.size_bytes) ORDER BY a.created_at), '[]')
          FROM attachments a WHERE a.team_id = m.team_id AND a.message_id = m.id) AS attachments,
         CASE WHEN m.sender_session = '' THEN s.name ELSE s.name || '/' || m.sender_session END AS from,
         s.kind = 'person' AS from_person,
         CASE WHEN m.recipient_id IS NULL THEN NULL
              WHEN m.recipient_session IS NULL THEN r.name
              ELSE r.name || '/' || m.recipient_session END AS to"
    };
}

/// The joins a [`MessageView`] reads its names from.
macro_rules! view_joins {
    () => {
        " JOIN agents s ON s.team_id = m.team_id AND s.id = m.sender_id
         LEFT JOIN agents r ON r.team_id = m.team_id AND r.id = m.recipient_id
         LEFT JOIN channels c ON c.team_id = m.team_id AND c.id = m.channel_id"
    };
}

/// After `FROM (<a page of message ids>)`: the page's messages as `m`, each
/// looked up by its primary key, so the page drives the join; the query's
/// `WHERE` keeps `m.team_id = $1`. Written as `m.team_id = $1 AND m.id IN
/// (<page>)`, a generic plan that took the team for one row (statistics
/// from before the team grew, or among many small teams) walked every
/// message of the team and semi-joined each to the page: 1 302 messages and
/// 16 600 buffers for a page of one in the capacity scenario. The lookup is
/// a subquery the planner keeps as one (`OFFSET 0`) and matches on `id`
/// alone, so no team index can stand in for the key.
macro_rules! page_lookup {
    () => {
        " page_ids CROSS JOIN LATERAL (
             SELECT x.* FROM messages x WHERE x.id = page_ids.id OFFSET 0) m"
    };
}

/// What `post_message` was asked to do.
#[derive(Clone, Debug, Default)]
pub struct NewMessage {
    pub channel: Option<String>,
    pub to: Option<String>,
    pub body: String,
    pub announce: bool,
    pub reply_to: Option<Uuid>,
    pub metadata: Option<Value>,
    /// Set by `ask_agent`: the message is a question awaiting a reply.
    pub question: bool,
    /// Files to store with the message (already decoded and checked).
    pub attachments: Vec<attachments::Upload>,
    /// Ask for an acknowledgement, due within this many seconds (`None`:
    /// ask none; `Some(None)`: ask one without a due time). Checked by
    /// [`crate::store::messaging::acks::check_request`].
    pub ack: Option<Option<i32>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Posted {
    pub message: MessageView,
    /// Where it went: `#channel`, `agent` (every window) or `agent/window`.
    pub delivered_to: Vec<String>,
    /// True when posting created the channel.
    pub channel_created: bool,
}

/// An address `agent` or `agent/window`, normalised.
pub fn parse_address(raw: &str) -> BusResult<(String, Option<String>)> {
    let (agent, window) = match raw.trim().split_once('/') {
        Some((agent, window)) => (agent, Some(window)),
        None => (raw.trim(), None),
    };
    let agent = normalize_agent_name(agent).map_err(|_| {
        BusError::invalid(format!(
            "address {} is not `agent` or `agent/window`. list_agents and list_sessions show \
             the addresses of your team.",
            text::quote(raw)
        ))
    })?;
    let window = match window.map(auth::normalize_session_label).transpose()? {
        Some(label) if label.is_empty() => None,
        other => other,
    };
    Ok((agent, window))
}

/// A metadata object: JSON object, or a string holding one, at most 16 KiB.
pub fn normalize_metadata(metadata: Option<Value>) -> BusResult<Option<Value>> {
    limits::metadata(
        metadata,
        limits::MetadataWords {
            string_not_object: "metadata must be a JSON object (or a string holding one), e.g. \
                                {\"pr\": 42}. Put free text in the body instead.",
            not_object: "metadata must be a JSON object, e.g. {\"pr\": 42}. Put free text in the \
                         body instead.",
            too_big_hint: "Keep metadata to small keys and ids; put large content in the body or \
                           an attachment.",
        },
    )
}

pub(crate) fn check_limit(limit: Option<i64>) -> BusResult<i64> {
    limits::page_limit(limit, PAGE, "Page through with repeated calls.")
}

pub(crate) fn check_body(body: &str) -> BusResult<()> {
    if body.trim().is_empty() {
        return Err(BusError::invalid(
            "the message body is empty; write what you want to say.",
        ));
    }
    limits::bytes_at_most(
        body.len(),
        BODY_MAX_BYTES,
        "the message body",
        "Split it into several messages, or share large content as an attachment or a note.",
    )
}

acs_wire::text_enum! {
    /// What named a window's default channel ([`default_channel_of`]).
    pub enum ChannelSource {
        /// The channel set for the window (heartbeat `channel`).
        Set = "set",
        /// The window's heartbeat `project` label.
        Project = "project",
        /// The window label.
        Window = "window",
    }
}

/// A window's default channel and what named it.
#[derive(Clone, Debug, PartialEq)]
pub struct DefaultChannel {
    pub name: String,
    pub from: ChannelSource,
}

/// What a window's default channel is decided from besides its label: the
/// `channel` and `project` its heartbeats last set (kept whether or not the
/// window is live now; none before its first heartbeat).
#[derive(Clone, Debug, Default, sqlx::FromRow)]
pub struct ChannelLabels {
    pub channel: Option<String>,
    pub project: Option<String>,
}

/// The window's default channel: where `post_message` naming neither
/// `channel` nor `to` goes, what `whoami` and the proxy's instructions name,
/// and `team_digest`'s and `wait_for_updates`' focus. Read from its labels,
/// decided by [`default_channel_of`].
pub async fn default_channel(bus: &Bus, me: &Identity) -> BusResult<Option<DefaultChannel>> {
    let labels = channel_labels(&bus.pool, me).await?;
    Ok(default_channel_of(&labels, me))
}

/// This window's [`ChannelLabels`].
pub async fn channel_labels<'c>(
    db: impl sqlx::PgExecutor<'c>,
    me: &Identity,
) -> BusResult<ChannelLabels> {
    let labels: Option<ChannelLabels> = sqlx::query_as(
        "SELECT channel, project FROM presence
         WHERE team_id = $1 AND agent_id = $2 AND session = $3",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(db)
    .await?;
    Ok(labels.unwrap_or_default())
}

/// The one decision of a window's default channel, in this order: the
/// channel set for the window (heartbeat `channel`, which the proxy sends
/// from `configure_session` or `.acs.toml`), else the channel named after
/// its `project` label, else the one named after its window label. The first
/// of these that is set decides: when it is not a channel name, or is a
/// reserved scope (`inbox`, `all`), the window has no default channel (the
/// caller named none, so it is not refused for one).
pub fn default_channel_of(labels: &ChannelLabels, me: &Identity) -> Option<DefaultChannel> {
    let set = |value: &Option<String>| value.clone().filter(|v| !v.trim().is_empty());
    let (candidate, from) = if let Some(channel) = set(&labels.channel) {
        (channel, ChannelSource::Set)
    } else if let Some(project) = set(&labels.project) {
        (project, ChannelSource::Project)
    } else if !me.window.is_empty() {
        (me.window.clone(), ChannelSource::Window)
    } else {
        return None;
    };
    channels::normalize_name(&candidate)
        .ok()
        .filter(|name| !channels::RESERVED_NAMES.contains(&name.as_str()))
        .map(|name| DefaultChannel { name, from })
}

mod after;
mod post;
mod read;
mod search;
mod unread;

pub use post::{post, post_in};
pub use read::{CHANNEL_COUNT_CAP, ReadRequest, ReadResult, UNREAD_COUNT_CAP, read};
pub use search::search;
pub use unread::{
    BoundedCount, answer_to, mark_read, unread_direct, unread_direct_messages, visible,
};
pub(crate) use unread::{UNREAD_DM_COUNT, UNREAD_DM_CURSOR, UNREAD_DM_IDS};
/// `page_lookup!` as text, for a statement outside this module.
pub(crate) const PAGE_LOOKUP: &str = page_lookup!();
