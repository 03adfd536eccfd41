//! Messages: channel posts and direct messages, per-window read cursors, and
//! full-text search over what the caller may see.
//!
//! Visibility: a channel message is seen by the whole team; a direct message
//! only by its sender and its recipient. A DM to `agent` reaches every window
//! of that agent; a DM to `agent/window` reaches exactly that window (even if
//! the window has never connected: it waits there).
//!
//! Cursors: one per (agent, window, scope). Reading order is (xact_id, seq);
//! `only_new` reads return only rows whose writing transaction is below the
//! snapshot's xmin horizon, so a message committed late by a slow transaction
//! is returned by a later read instead of being skipped (see migration 0003).
//!
//! Size: about 680 lines, past the ~600 the layout asks for: posting, reading
//! with cursors and search are three seams. Issue 19 reworks reading and
//! search for cost bounded by the page; the file splits along them then.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::limits::{self, BODY_MAX_BYTES};
use super::{attachments, channels, normalize_agent_name, sessions, text};
use crate::Bus;
use crate::auth::{self, Identity};
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};

pub const PAGE_MAX: i64 = 200;
pub const PAGE_DEFAULT: i64 = 50;
const PAGE: limits::Page = limits::Page {
    default: PAGE_DEFAULT,
    max: PAGE_MAX,
};
pub const QUERY_MAX_BYTES: usize = 256;
/// How long a read waits for an older, still-open writer before answering
/// with what is settled (and `more: true`): up to 2 s in 5 ms steps. The
/// horizon is the whole server's, so on a busy shared PostgreSQL an unrelated
/// slow transaction can hold it back; 200 ms proved too short under load.
const SETTLE_WAIT_STEP: std::time::Duration = std::time::Duration::from_millis(5);
const SETTLE_WAIT_ROUNDS: u32 = 400;

/// A message as a reader sees it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct MessageView {
    pub id: Uuid,
    /// The sender's address: `agent`, or `agent/window`.
    pub from: String,
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
    #[serde(skip)]
    pub xact_id: i64,
    #[serde(skip)]
    pub seq: i64,
}

/// The columns of a [`MessageView`], for `concat!` into queries over `messages m`.
macro_rules! view_columns {
    () => {
        "m.id, m.body, m.announce, m.is_question AS question, m.reply_to, m.metadata,
         m.created_at, m.xact_id, m.seq, c.name AS channel,
         (SELECT coalesce(jsonb_agg(jsonb_build_object('id', a.id, 'filename', a.filename,
                 'content_type', a.content_type, 'size_bytes', a.size_bytes) ORDER BY a.created_at), '[]')
          FROM attachments a WHERE a.team_id = m.team_id AND a.message_id = m.id) AS attachments,
         CASE WHEN m.sender_session = '' THEN s.name ELSE s.name || '/' || m.sender_session END AS from,
         CASE WHEN m.recipient_id IS NULL THEN NULL
              WHEN m.recipient_session IS NULL THEN r.name
              ELSE r.name || '/' || m.recipient_session END AS to
         FROM messages m
         JOIN agents s ON s.team_id = m.team_id AND s.id = m.sender_id
         LEFT JOIN agents r ON r.team_id = m.team_id AND r.id = m.recipient_id
         LEFT JOIN channels c ON c.team_id = m.team_id AND c.id = m.channel_id"
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

/// The window's default channel: named after its `project` label, else after
/// its window label, else none. A label that is a reserved scope (`inbox`,
/// `all`) names no channel: the caller named none, so it is not refused for one.
pub async fn default_channel(bus: &Bus, me: &Identity) -> BusResult<Option<String>> {
    let project: Option<String> = super::presence::window_labels(&bus.pool, me).await?.0;
    Ok(default_channel_of(project, me))
}

/// [`default_channel`] from the window's `project` label, already read.
pub fn default_channel_of(project: Option<String>, me: &Identity) -> Option<String> {
    let candidate = project
        .filter(|p| !p.is_empty())
        .or_else(|| Some(me.window.clone()).filter(|s| !s.is_empty()));
    candidate
        .and_then(|name| channels::normalize_name(&name).ok())
        .filter(|name| !channels::RESERVED_NAMES.contains(&name.as_str()))
}

/// `post_message`.
pub async fn post(bus: &Bus, me: &Identity, new: NewMessage) -> BusResult<Posted> {
    check_body(&new.body)?;
    attachments::check_count(new.attachments.len())?;
    let metadata = normalize_metadata(new.metadata)?;
    let channel = match (&new.channel, &new.to) {
        (Some(_), Some(_)) => {
            return Err(BusError::invalid(
                "give either `channel` or `to`, not both: a message goes to one channel or one address.",
            ));
        }
        (Some(channel), None) => Some(channels::normalize_name(channel)?),
        (None, Some(_)) => None,
        (None, None) => Some(default_channel(bus, me).await?.ok_or_else(|| {
            BusError::invalid(
                "no `channel` or `to`, and this window has no default channel (it comes from the \
                 heartbeat `project` label, or the window name; `inbox` and `all` name none, they \
                 are read_messages scopes). Name a channel or an address.",
            )
        })?),
    };
    let recipient = new.to.as_deref().map(parse_address).transpose()?;
    if new.announce && channel.is_none() {
        return Err(BusError::invalid(
            "`announce` applies to channel messages only (it reaches every window whatever it is \
             focused on); a direct message already reaches its recipient.",
        ));
    }

    let mut tx = bus.pool.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let (channel, channel_created) = match &channel {
        Some(name) => {
            let (channel, created) = channels::find_or_create(&mut tx, me, name).await?;
            (Some(channel), created)
        }
        None => (None, false),
    };
    let recipient_id = match &recipient {
        Some((agent, _)) => Some(
            sqlx::query_scalar::<_, Uuid>("SELECT id FROM agents WHERE team_id = $1 AND name = $2")
                .bind(me.team_id)
                .bind(agent)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| {
                    BusError::not_found(format!(
                        "no agent `{agent}` in your team. list_agents shows who is here."
                    ))
                })?,
        ),
        None => None,
    };
    if let Some(reply_to) = new.reply_to {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM messages WHERE team_id = $1 AND id = $2)",
        )
        .bind(me.team_id)
        .bind(reply_to)
        .fetch_one(&mut *tx)
        .await?;
        if !exists {
            return Err(BusError::not_found(format!(
                "reply_to {reply_to} is not a message of your team. Use the id read_messages returned."
            )));
        }
    }
    let id = Uuid::new_v4();
    let recipient_session = recipient.as_ref().and_then(|(_, window)| window.clone());
    sqlx::query(
        "INSERT INTO messages (id, team_id, channel_id, sender_id, sender_session, recipient_id,
                               recipient_session, body, announce, is_question, reply_to, metadata)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(id)
    .bind(me.team_id)
    .bind(channel.as_ref().map(|c| c.id))
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(recipient_id)
    .bind(&recipient_session)
    .bind(&new.body)
    .bind(new.announce)
    .bind(new.question)
    .bind(new.reply_to)
    .bind(&metadata)
    .execute(&mut *tx)
    .await?;
    attachments::insert_all(
        &mut tx,
        me,
        attachments::Owner::Message(id),
        &new.attachments,
    )
    .await?;
    let message: MessageView = sqlx::query_as(concat!(
        "SELECT ",
        view_columns!(),
        " WHERE m.team_id = $1 AND m.id = $2"
    ))
    .bind(me.team_id)
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut event = BusEvent::new(me.team_id, EventKind::Message, id.to_string()).by(me);
    event.channel_id = channel.as_ref().map(|c| c.id);
    event.recipient = recipient_id;
    event.recipient_session = recipient_session;
    event.announce = new.announce;
    bus.events.emit(event);

    let delivered_to = match (&channel, &message.to) {
        (Some(channel), _) => vec![format!("#{}", channel.name)],
        (None, Some(address)) => vec![address.clone()],
        (None, None) => Vec::new(),
    };
    Ok(Posted {
        message,
        delivered_to,
        channel_created,
    })
}

#[derive(Clone, Copy)]
enum ScopeKind {
    All,
    Inbox,
    Channel,
}

/// `read_messages` with `only_new`: past the cursor, not this window's own
/// posts; the caller keeps only the settled prefix (see [`read`]). Binds: $1 team, $2 agent, $3 channel, $4
/// all_sessions, $5 window, $6/$7 cursor, $8 limit.
macro_rules! read_new {
    ($scope:literal) => {
        concat!(
            "SELECT ",
            view_columns!(),
            " WHERE m.team_id = $1 AND ",
            $scope,
            " AND (m.xact_id, m.seq) > ($6, $7)
              AND NOT (m.sender_id = $2 AND m.sender_session = $5)
              ORDER BY m.xact_id, m.seq LIMIT $8"
        )
    };
}

/// `read_messages` without `only_new`: the latest page, oldest first; the
/// cursor binds ($6, $7) are unused but typed so every variant binds alike.
macro_rules! read_latest {
    ($scope:literal) => {
        concat!(
            "SELECT * FROM (SELECT ",
            view_columns!(),
            " WHERE m.team_id = $1 AND ",
            $scope,
            " AND $6::bigint IS NOT NULL AND $7::bigint IS NOT NULL
              ORDER BY m.xact_id DESC, m.seq DESC LIMIT $8) latest
             ORDER BY xact_id, seq"
        )
    };
}

/// What `read_messages` reads.
#[derive(Clone, Debug)]
pub struct ReadRequest {
    /// `all`, `inbox`, or a channel name.
    pub scope: String,
    pub only_new: bool,
    pub limit: Option<i64>,
    /// Include direct messages addressed to this agent's other windows.
    pub all_sessions: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReadResult {
    pub scope: String,
    pub messages: Vec<MessageView>,
    /// True when the page was full: more may be waiting, read again.
    pub more: bool,
}

pub(crate) fn check_limit(limit: Option<i64>) -> BusResult<i64> {
    limits::page_limit(limit, PAGE, "Page through with repeated calls.")
}

/// `read_messages`. With `only_new`, returns what came after this window's
/// cursor for the scope (oldest first) and advances it; without, the latest
/// page, leaving the cursor alone.
pub async fn read(bus: &Bus, me: &Identity, request: ReadRequest) -> BusResult<ReadResult> {
    let limit = check_limit(request.limit)?;
    let scope_raw = request.scope.trim();
    let (scope, want_channels, want_dms, channel_name) =
        match scope_raw.to_ascii_lowercase().as_str() {
            "" | "all" => ("all".to_string(), true, true, None),
            "inbox" => ("inbox".to_string(), false, true, None),
            _ => {
                let name = channels::normalize_name(scope_raw)?;
                (format!("#{name}"), true, false, Some(name))
            }
        };
    let channel_id = match &channel_name {
        Some(name) => match channels::find(bus, me, name).await? {
            Some(channel) => Some(channel.id),
            None => {
                return Err(BusError::not_found(format!(
                    "no channel `{name}` in your team. list_channels shows them."
                )));
            }
        },
        None => None,
    };

    let scope_kind = match (want_channels, want_dms) {
        (true, true) => ScopeKind::All,
        (false, true) => ScopeKind::Inbox,
        _ => ScopeKind::Channel,
    };
    let mut waited = 0;
    loop {
        let mut tx = bus.pool.begin().await?;
        // The horizon is read first, before this transaction takes an id of
        // its own (the cursor lock gives it one), so it is not held back by itself.
        let horizon: i64 =
            sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                .fetch_one(&mut *tx)
                .await?;
        // Moving a cursor is a mutation: a revoked or stale window moves nothing.
        sessions::guard(&mut tx, me).await?;
        let (after_xact, after_seq) = if request.only_new {
            cursor_for_update(&mut tx, me, &scope).await?
        } else {
            (0, 0)
        };
        let mut messages: Vec<MessageView> = sqlx::query_as(read_sql(request.only_new, scope_kind))
            .bind(me.team_id)
            .bind(me.agent_id)
            .bind(channel_id)
            .bind(request.all_sessions)
            .bind(&me.window)
            .bind(after_xact)
            .bind(after_seq)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        // Rows come in (xact_id, seq) order, so the settled ones are a prefix.
        // A row past it was written by a transaction that started after one
        // still open: returning it could move the cursor past a message that
        // commits a moment later. Such transactions are short; wait for them.
        let settled = messages
            .iter()
            .take_while(|m| !request.only_new || m.xact_id < horizon)
            .count();
        let held_back = settled < messages.len();
        if held_back && waited < SETTLE_WAIT_ROUNDS {
            tx.rollback().await?;
            waited += 1;
            tokio::time::sleep(SETTLE_WAIT_STEP).await;
            continue;
        }
        messages.truncate(settled);
        if request.only_new
            && let Some(last) = messages.last()
        {
            sqlx::query(
                "UPDATE read_cursors SET last_xact = $5, last_seq = $6, updated_at = now()
                 WHERE team_id = $1 AND agent_id = $2 AND session = $3 AND scope = $4",
            )
            .bind(me.team_id)
            .bind(me.agent_id)
            .bind(&me.window)
            .bind(&scope)
            .bind(last.xact_id)
            .bind(last.seq)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        return Ok(ReadResult {
            scope,
            more: held_back || messages.len() as i64 == limit,
            messages,
        });
    }
}

/// The statement for one read: one per scope, so each uses its own index (a
/// generic plan cannot drop an OR branch that a bound flag turns off).
fn read_sql(only_new: bool, scope_kind: ScopeKind) -> &'static str {
    // One statement per scope, so each uses its own index (a generic plan
    // cannot drop an OR branch that a bound flag turns off).
    match (only_new, scope_kind) {
        (true, ScopeKind::All) => read_new!(
            "(m.channel_id IS NOT NULL
              OR (m.recipient_id = $2 AND ($4 OR m.recipient_session IS NULL OR m.recipient_session = $5)))"
        ),
        (true, ScopeKind::Inbox) => read_new!(
            "m.recipient_id = $2 AND ($4 OR m.recipient_session IS NULL OR m.recipient_session = $5)
             AND $3::uuid IS NULL"
        ),
        (true, ScopeKind::Channel) => read_new!("m.channel_id = $3 AND $4::bool IS NOT NULL"),
        (false, ScopeKind::All) => read_latest!(
            "(m.channel_id IS NOT NULL
              OR (m.recipient_id = $2 AND ($4 OR m.recipient_session IS NULL OR m.recipient_session = $5))
              OR (m.recipient_id IS NOT NULL AND m.sender_id = $2 AND ($4 OR m.sender_session = $5)))"
        ),
        (false, ScopeKind::Inbox) => read_latest!(
            "((m.recipient_id = $2 AND ($4 OR m.recipient_session IS NULL OR m.recipient_session = $5))
              OR (m.recipient_id IS NOT NULL AND m.sender_id = $2 AND ($4 OR m.sender_session = $5)))
             AND $3::uuid IS NULL"
        ),
        (false, ScopeKind::Channel) => {
            read_latest!("m.channel_id = $3 AND $4::bool IS NOT NULL AND $2::uuid IS NOT NULL")
        }
    }
}

/// This window's position for `scope`, locked so two reads of the same
/// window and scope take turns instead of returning the same page twice.
async fn cursor_for_update(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    scope: &str,
) -> BusResult<(i64, i64)> {
    sqlx::query(
        "INSERT INTO read_cursors (team_id, agent_id, session, scope, last_xact, last_seq)
         VALUES ($1, $2, $3, $4, 0, 0) ON CONFLICT DO NOTHING",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(scope)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_as(
        "SELECT last_xact, last_seq FROM read_cursors
         WHERE team_id = $1 AND agent_id = $2 AND session = $3 AND scope = $4 FOR UPDATE",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(scope)
    .fetch_one(&mut *conn)
    .await?)
}

/// The direct messages to this window that it has not read yet: past both
/// its `inbox` and its `all` cursor (either read consumes them). Binds: $1
/// team, $2 agent, $3 window.
macro_rules! unread_dm_predicate {
    () => {
        " m.team_id = $1 AND m.recipient_id = $2
          AND (m.recipient_session IS NULL OR m.recipient_session = $3)
          AND NOT (m.sender_id = $2 AND m.sender_session = $3)
          AND (m.xact_id, m.seq) > (
              SELECT x, s FROM (
                  SELECT last_xact AS x, last_seq AS s FROM read_cursors
                  WHERE team_id = $1 AND agent_id = $2 AND session = $3 AND scope IN ('inbox', 'all')
                  UNION ALL SELECT 0, 0) positions
              ORDER BY x DESC, s DESC LIMIT 1) "
    };
}

/// How many direct messages this window has not read, for `whoami`.
pub async fn unread_direct(bus: &Bus, me: &Identity) -> BusResult<i64> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT count(*) FROM messages m WHERE",
        unread_dm_predicate!()
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_one(&bus.pool)
    .await?)
}

/// The oldest `limit` unread direct messages of this window; no cursor moves.
pub async fn unread_direct_messages(
    bus: &Bus,
    me: &Identity,
    limit: i64,
) -> BusResult<Vec<MessageView>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        view_columns!(),
        " WHERE",
        unread_dm_predicate!(),
        " ORDER BY m.xact_id, m.seq LIMIT $4"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(limit)
    .fetch_all(&bus.pool)
    .await?)
}

/// What `search_messages` may return: channel messages and this window's DMs
/// (sent or received; $1 team, $2 agent, $3 window) whose searched part (the
/// first 100,000 characters) holds every literal of $6 and none of $7.
macro_rules! searchable {
    () => {
        "m.team_id = $1
         AND (m.channel_id IS NOT NULL
              OR (m.recipient_id = $2 AND (m.recipient_session IS NULL OR m.recipient_session = $3))
              OR (m.recipient_id IS NOT NULL AND m.sender_id = $2 AND m.sender_session = $3))
         AND NOT EXISTS (SELECT 1 FROM unnest($6::text[]) l WHERE strpos(left(m.body, 100000), l) = 0)
         AND NOT EXISTS (SELECT 1 FROM unnest($7::text[]) l WHERE strpos(left(m.body, 100000), l) > 0)"
    };
}

/// `search_messages`: full text over channel messages and this window's DMs
/// (sent or received), best match first; emoji and other symbols the full
/// text drops match as written ([`text::Literals`]).
pub async fn search(
    bus: &Bus,
    me: &Identity,
    query: &str,
    limit: Option<i64>,
) -> BusResult<Vec<MessageView>> {
    let limit = check_limit(limit)?;
    let query = text::lookup(query);
    if query.is_empty() || query.len() > QUERY_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "query must be 1-{QUERY_MAX_BYTES} bytes of words to look for (got {} bytes); quotes, \
             OR and -word work as in a web search.",
            query.len()
        )));
    }
    let literals = text::Literals::of(&query);
    let sql = if text::has_words(&bus.pool, "simple", &query, &literals).await? {
        concat!(
            "SELECT ",
            view_columns!(),
            " , websearch_to_tsquery('simple', $4) AS q WHERE m.search @@ q AND ",
            searchable!(),
            " ORDER BY ts_rank(m.search, q) DESC, m.created_at DESC LIMIT $5"
        )
    } else {
        // Only symbols: no index helps, so this reads the team's history
        // newest first until it has `limit` hits (much of it, if few match).
        concat!(
            "SELECT ",
            view_columns!(),
            " WHERE ",
            searchable!(),
            " ORDER BY m.xact_id DESC, m.seq DESC LIMIT $5"
        )
    };
    Ok(sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(&query)
        .bind(limit)
        .bind(&literals.required)
        .bind(&literals.excluded)
        .fetch_all(&bus.pool)
        .await?)
}

/// The messages among `ids` this window may see (for wait summaries).
pub async fn visible(bus: &Bus, me: &Identity, ids: &[Uuid]) -> BusResult<Vec<MessageView>> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        view_columns!(),
        " WHERE m.team_id = $1 AND m.id = ANY($4)
           AND (m.channel_id IS NOT NULL
                OR (m.recipient_id = $2 AND (m.recipient_session IS NULL OR m.recipient_session = $3)))
         ORDER BY m.xact_id, m.seq"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(ids)
    .fetch_all(&bus.pool)
    .await?)
}

/// The first reply to `question_id` that answers this window's `ask_agent`
/// question: addressed to this window (or its whole agent) and sent by the
/// agent the question was addressed to, from any of its windows. A reply to
/// the question id from anyone else is an ordinary direct message: it stays
/// in the inbox and never ends the wait.
pub async fn answer_to(
    bus: &Bus,
    me: &Identity,
    question_id: Uuid,
) -> BusResult<Option<MessageView>> {
    // The answerer is read from the question row itself, so a fresh ask and
    // a resumed one apply the same rule.
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        view_columns!(),
        " JOIN messages q ON q.team_id = m.team_id AND q.id = m.reply_to
          WHERE m.team_id = $1 AND m.reply_to = $2 AND m.recipient_id = $3
            AND (m.recipient_session IS NULL OR m.recipient_session = $4)
            AND q.is_question AND q.sender_id = $3 AND q.sender_session = $4
            AND m.sender_id = q.recipient_id
            AND m.sender_id <> $3
          ORDER BY m.xact_id, m.seq LIMIT 1"
    ))
    .bind(me.team_id)
    .bind(question_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(&bus.pool)
    .await?)
}
