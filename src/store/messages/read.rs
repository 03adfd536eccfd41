//! Reading messages: pages by scope, the per-window cursors `only_new`
//! moves, and the unread direct messages `whoami` and waits report.
//!
//! Every read is an index range on `position` (see migration 0021): a scope
//! is one or a few branches (the team's channel messages, one channel, the
//! DMs to this agent, the DMs it sent), each walked in position order from
//! the cursor (or back from the newest) and cut at the page, then merged. So
//! a read costs its page, not the team's history, and waits for nobody: the
//! positions a reader can see are a prefix of the team's (module overview).

use serde::Serialize;
use uuid::Uuid;

use super::{MessageView, check_limit};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::{channels, sessions};

/// Counts of unread messages stop here: past it the answer is "at least".
pub const UNREAD_COUNT_CAP: i64 = 1000;

/// Branches of a scope: each selects `id, position` of what a window may read.
/// Binds: $1 team, $2 agent, $3 channel, $4 all_sessions, $5 window.
const TEAM_CHANNELS: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND channel_id IS NOT NULL";
const ONE_CHANNEL: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND channel_id = $3";
const DMS_TO_ME: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id = $2
       AND ($4 OR recipient_session IS NULL OR recipient_session = $5)";
const DMS_FROM_ME: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id IS NOT NULL AND sender_id = $2
       AND ($4 OR sender_session = $5)";

/// `only_new`: past the cursor ($6), not this window's own posts, oldest
/// first, at most the page ($7).
const PAST_CURSOR: &str = " AND position > $6 AND NOT (sender_id = $2 AND sender_session = $5)
     ORDER BY position LIMIT $7";
/// The latest page ($7), newest first (the cursor bind $6 is unused).
const LATEST: &str = " ORDER BY position DESC LIMIT $7";

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum ScopeKind {
    All,
    Inbox,
    Channel,
}

impl ScopeKind {
    /// Branches, each an index range of its own (a generic plan cannot drop
    /// an OR branch that a bound flag turns off, nor walk two indexes in one
    /// order).
    fn branches(self, only_new: bool) -> &'static [&'static str] {
        match (self, only_new) {
            (ScopeKind::All, true) => &[TEAM_CHANNELS, DMS_TO_ME],
            (ScopeKind::All, false) => &[TEAM_CHANNELS, DMS_TO_ME, DMS_FROM_ME],
            (ScopeKind::Inbox, true) => &[DMS_TO_ME],
            (ScopeKind::Inbox, false) => &[DMS_TO_ME, DMS_FROM_ME],
            (ScopeKind::Channel, _) => &[ONE_CHANNEL],
        }
    }
}

/// The statement for one read: the branches' pages merged (UNION: a DM an
/// agent sent itself is in two branches), cut to the page, in position order.
fn read_sql(only_new: bool, scope: ScopeKind) -> String {
    let suffix = if only_new { PAST_CURSOR } else { LATEST };
    let branches: Vec<String> = scope
        .branches(only_new)
        .iter()
        .map(|branch| format!("({branch}{suffix})"))
        .collect();
    let direction = if only_new { "" } else { " DESC" };
    format!(
        "SELECT {columns}
         WHERE m.team_id = $1 AND m.id IN (
             SELECT id FROM ({union}) picked ORDER BY position{direction} LIMIT $7)
         ORDER BY m.position",
        columns = view_columns!(),
        union = branches.join(" UNION "),
    )
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

/// `read_messages`. With `only_new`, returns what came after this window's
/// cursor for the scope (oldest first) and advances it; without, the latest
/// page, leaving the cursor alone.
pub async fn read(bus: &Bus, me: &Identity, request: ReadRequest) -> BusResult<ReadResult> {
    let limit = check_limit(request.limit)?;
    let scope_raw = request.scope.trim();
    let (scope, scope_kind, channel_name) = match scope_raw.to_ascii_lowercase().as_str() {
        "" | "all" => ("all".to_string(), ScopeKind::All, None),
        "inbox" => ("inbox".to_string(), ScopeKind::Inbox, None),
        _ => {
            let name = channels::normalize_name(scope_raw)?;
            (format!("#{name}"), ScopeKind::Channel, Some(name))
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

    let mut tx = bus.pool.begin().await?;
    // Moving a cursor is a mutation: a revoked or stale window moves nothing.
    sessions::guard(&mut tx, me).await?;
    let after = if request.only_new {
        cursor_for_update(&mut tx, me, &scope).await?
    } else {
        0
    };
    let messages: Vec<MessageView> = sqlx::query_as(
        // Built from this file's constants only, never from input.
        sqlx::AssertSqlSafe(read_sql(request.only_new, scope_kind)),
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(channel_id)
    .bind(request.all_sessions)
    .bind(&me.window)
    .bind(after)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    if request.only_new
        && let Some(last) = messages.last()
    {
        sqlx::query(
            "UPDATE read_cursors SET last_position = $5, updated_at = now()
             WHERE team_id = $1 AND agent_id = $2 AND session = $3 AND scope = $4",
        )
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(&scope)
        .bind(last.position)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(ReadResult {
        scope,
        more: messages.len() as i64 == limit,
        messages,
    })
}

/// This window's last position read for `scope`, locked so two reads of the
/// same window and scope take turns instead of returning the same page twice.
async fn cursor_for_update(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    scope: &str,
) -> BusResult<i64> {
    sqlx::query(
        "INSERT INTO read_cursors (team_id, agent_id, session, scope, last_position)
         VALUES ($1, $2, $3, $4, 0) ON CONFLICT DO NOTHING",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(scope)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_scalar(
        "SELECT last_position FROM read_cursors
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
/// its `inbox` and its `all` cursor (either read consumes them), in position
/// order on the recipient index. Binds: $1 team, $2 agent, $3 window.
macro_rules! unread_dm_predicate {
    () => {
        " m.team_id = $1 AND m.recipient_id = $2
          AND (m.recipient_session IS NULL OR m.recipient_session = $3)
          AND NOT (m.sender_id = $2 AND m.sender_session = $3)
          AND m.position > (
              SELECT coalesce(max(last_position), 0) FROM read_cursors
              WHERE team_id = $1 AND agent_id = $2 AND session = $3 AND scope IN ('inbox', 'all')) "
    };
}

/// A count that stops at [`UNREAD_COUNT_CAP`]: `at_least` says it stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BoundedCount {
    pub count: i64,
    pub at_least: bool,
}

impl BoundedCount {
    /// From a count of at most `UNREAD_COUNT_CAP + 1` rows.
    pub fn of(counted: i64) -> Self {
        BoundedCount {
            count: counted.min(UNREAD_COUNT_CAP),
            at_least: counted > UNREAD_COUNT_CAP,
        }
    }
}

/// How many direct messages this window has not read, for `whoami`; counts
/// stop at [`UNREAD_COUNT_CAP`].
pub async fn unread_direct(bus: &Bus, me: &Identity) -> BusResult<BoundedCount> {
    let counted: i64 = sqlx::query_scalar(concat!(
        "SELECT count(*) FROM (SELECT 1 FROM messages m WHERE",
        unread_dm_predicate!(),
        " ORDER BY m.position LIMIT $4) unread"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(UNREAD_COUNT_CAP + 1)
    .fetch_one(&bus.pool)
    .await?;
    Ok(BoundedCount::of(counted))
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
        " ORDER BY m.position LIMIT $4"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(limit)
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
         ORDER BY m.position"
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
          ORDER BY m.position LIMIT 1"
    ))
    .bind(me.team_id)
    .bind(question_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(&bus.pool)
    .await?)
}
