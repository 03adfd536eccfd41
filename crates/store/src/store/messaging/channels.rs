//! Channels: team-wide topics, usually one per repository.
//!
//! Names are normalised (trimmed, lower-cased, a leading `#` dropped) so
//! `#Backend` and `backend` are one channel. Creating is idempotent; posting to
//! a channel that does not exist yet creates it.
//!
//! `inbox` and `all` are [`RESERVED_NAMES`]: they are scopes of
//! `read_messages`, so no new channel gets those names. One created before the
//! rule keeps working and is read as `#inbox` / `#all`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::requests::Writer;
use crate::store::{identity::sessions, messaging::messages, text};

pub const CHANNEL_NAME_MAX_BYTES: usize = 64;
pub const TOPIC_MAX_BYTES: usize = 256;
/// Names `read_messages` takes as scopes, which a channel cannot be created
/// under (`inbox`: this window's direct messages; `all`: everything).
pub const RESERVED_NAMES: &[&str] = &["inbox", "all"];

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Channel {
    pub id: Uuid,
    pub name: String,
    pub topic: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChannelSummary {
    pub name: String,
    pub topic: Option<String>,
    /// Every message the channel holds (counters kept by each post).
    pub messages: i64,
    pub last_message_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// Messages this window has not read in the channel (past its `#name`
    /// and `all` cursors, not its own posts), counted up to 100.
    pub unread: i64,
    /// True when `unread` stopped at 100: at least that many.
    pub unread_at_least: bool,
}

/// `#Backend ` → `backend`; refused unless `[a-z0-9][a-z0-9._-]*`, <= 64 bytes.
pub fn normalize_name(raw: &str) -> BusResult<String> {
    let name = raw.trim().trim_start_matches('#').to_ascii_lowercase();
    if !crate::store::is_name(&name, CHANNEL_NAME_MAX_BYTES, b"-_.") {
        return Err(BusError::invalid(format!(
            "channel name {} is not valid: use 1-{CHANNEL_NAME_MAX_BYTES} ASCII letters, digits \
             and `-_.`, starting with a letter or digit (for example `backend` or `web-app`).",
            text::quote(raw)
        )));
    }
    Ok(name)
}

fn check_topic(topic: Option<&str>) -> BusResult<Option<String>> {
    let Some(topic) = topic
        .map(|topic| text::one_line("channel topic", topic))
        .transpose()?
    else {
        return Ok(None);
    };
    crate::store::limits::bytes_at_most(
        topic.len(),
        TOPIC_MAX_BYTES,
        "channel topic",
        "Shorten it to one line.",
    )?;
    Ok(Some(topic.to_string()))
}

#[derive(Clone, Debug, Serialize)]
pub struct Created {
    pub channel: Channel,
    pub created: bool,
}

/// `create_channel`: idempotent. A topic given replaces the stored one.
pub async fn create(
    w: &mut Writer,
    me: &Identity,
    name: &str,
    topic: Option<&str>,
) -> BusResult<Created> {
    let name = normalize_name(name)?;
    let topic = check_topic(topic)?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let (channel, created) = find_or_create(&mut tx, me, &name).await?;
    let channel = match topic {
        Some(topic) if channel.topic.as_deref() != Some(topic.as_str()) => {
            sqlx::query_as(
                "UPDATE channels SET topic = $3 WHERE team_id = $1 AND id = $2
                 RETURNING id, name, topic, created_at",
            )
            .bind(me.team_id)
            .bind(channel.id)
            .bind(&topic)
            .fetch_one(&mut *tx)
            .await?
        }
        _ => channel,
    };
    tx.commit().await?;
    Ok(Created { channel, created })
}

/// The refusal of a reserved name that names no existing channel.
pub(crate) fn reserved_refused(name: &str) -> BusError {
    BusError::invalid(format!(
        "`{name}` cannot be a channel name: read_messages takes `inbox` as the scope of \
         this window's direct messages and `all` as everything it may read, so a channel \
         called `{name}` could only be read as `#{name}`. Nothing was created. Choose \
         another name, for example `{name}-team`."
    ))
}

/// The channel called `name` (already normalised), created if missing. A
/// reserved name is never created; an existing channel of that name is found.
pub(crate) async fn find_or_create(
    conn: &mut PgConnection,
    me: &Identity,
    name: &str,
) -> BusResult<(Channel, bool)> {
    if RESERVED_NAMES.contains(&name) {
        let existing: Option<Channel> = sqlx::query_as(
            "SELECT id, name, topic, created_at FROM channels WHERE team_id = $1 AND name = $2",
        )
        .bind(me.team_id)
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
        return match existing {
            Some(channel) => Ok((channel, false)),
            None => Err(reserved_refused(name)),
        };
    }
    let inserted: Option<Channel> = sqlx::query_as(
        "INSERT INTO channels (id, team_id, name, created_by) VALUES ($1, $2, $3, $4)
         ON CONFLICT (team_id, name) DO NOTHING
         RETURNING id, name, topic, created_at",
    )
    .bind(Uuid::new_v4())
    .bind(me.team_id)
    .bind(name)
    .bind(me.agent_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(channel) = inserted {
        return Ok((channel, true));
    }
    let channel = sqlx::query_as(
        "SELECT id, name, topic, created_at FROM channels WHERE team_id = $1 AND name = $2",
    )
    .bind(me.team_id)
    .bind(name)
    .fetch_one(&mut *conn)
    .await?;
    Ok((channel, false))
}

/// The channel called `name` in the caller's team, if it exists.
pub async fn find(bus: &Bus, me: &Identity, name: &str) -> BusResult<Option<Channel>> {
    Ok(sqlx::query_as(
        "SELECT id, name, topic, created_at FROM channels WHERE team_id = $1 AND name = $2",
    )
    .bind(me.team_id)
    .bind(name)
    .fetch_optional(&bus.pool)
    .await?)
}

/// `list_channels`: every channel of the team with its message count (the
/// channel row's part plus its stripes in `channel_message_counts`, which
/// each post bumps: migration 0031), its newest message's time and
/// this window's unread count, bounded: each channel walks at most
/// `CHANNEL_COUNT_CAP + 1` entries of its position index past the cursor.
pub async fn list(bus: &Bus, me: &Identity) -> BusResult<Vec<ChannelSummary>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        name: String,
        topic: Option<String>,
        messages: i64,
        last_message_at: Option<DateTime<Utc>>,
        created_at: DateTime<Utc>,
        unread: i64,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT c.name, c.topic, c.created_at,
                c.message_count + coalesce((SELECT sum(k.messages) FROM channel_message_counts k
                                            WHERE k.team_id = c.team_id AND k.channel_id = c.id),
                                           0)::bigint AS messages,
                (SELECT n.created_at FROM messages n
                  WHERE n.team_id = c.team_id AND n.channel_id = c.id
                  ORDER BY n.position DESC LIMIT 1) AS last_message_at,
                (SELECT count(*) FROM (
                     SELECT 1 FROM messages m
                     WHERE m.team_id = c.team_id AND m.channel_id = c.id
                       AND m.position > (
                           SELECT coalesce(max(r.last_position), 0) FROM read_cursors r
                           WHERE r.team_id = $1 AND r.agent_id = $2 AND r.session = $3
                             AND r.scope IN ('#' || c.name, 'all'))
                       AND NOT (m.sender_id = $2 AND m.sender_session = $3)
                     ORDER BY m.position LIMIT $4) past) AS unread
         FROM channels c
         WHERE c.team_id = $1
         ORDER BY c.name",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(messages::CHANNEL_COUNT_CAP + 1)
    .fetch_all(&bus.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let unread = messages::BoundedCount::of(row.unread, messages::CHANNEL_COUNT_CAP);
            ChannelSummary {
                name: row.name,
                topic: row.topic,
                messages: row.messages,
                last_message_at: row.last_message_at,
                created_at: row.created_at,
                unread: unread.count,
                unread_at_least: unread.at_least,
            }
        })
        .collect())
}
