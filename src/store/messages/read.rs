//! Reading messages: pages by scope, the per-window cursors `only_new`
//! moves, and the unread direct messages `whoami` and waits report.
//!
//! Every read is an index range on `position` (see migration 0021): a scope
//! is one or a few branches (the team's channel messages, one channel, the
//! DMs to this agent, the DMs it sent), each walked in position order from
//! the cursor (or back from the newest) and cut at the page, then merged. So
//! a read costs its page, not the team's history. An `only_new` page also
//! lists, in the same snapshot, the team's positions missing between the
//! cursor and the page's newest; if there are any, the read waits for their
//! writers (`message_positions_wait`, migration 0031: its own team's only)
//! and reads again up to the same newest position (module overview).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde::Serialize;
use uuid::Uuid;

use super::{MessageView, check_limit};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::{channels, sessions};

/// Counts of unread messages stop here: past it the answer is "at least".
pub const UNREAD_COUNT_CAP: i64 = 1000;
/// Counts made once per channel (list_channels' unread, team_digest's
/// messages) stop here, so a call walks at most this many entries a channel.
pub const CHANNEL_COUNT_CAP: i64 = 100;

/// Branches of a scope: each selects `id, position` of what a window may read.
/// Binds: $1 team, $2 agent, $3 channel, $5 window ($4, all_sessions, picks
/// the branches instead).
const TEAM_CHANNELS: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND channel_id IS NOT NULL";
const ONE_CHANNEL: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND channel_id = $3";
/// Its suffix orders by `recipient_session` too (constant here), so the
/// planner walks the window index instead of filtering the agent's.
const DMS_TO_EVERY_WINDOW: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id = $2 AND recipient_session IS NULL";
const DMS_TO_THIS_WINDOW: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id = $2 AND recipient_session = $5";
const DMS_TO_THE_AGENT: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id = $2";
const DMS_FROM_THIS_WINDOW: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id IS NOT NULL AND sender_id = $2 AND sender_session = $5";
const DMS_FROM_THE_AGENT: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id IS NOT NULL AND sender_id = $2";

/// `only_new`: past the cursor ($6) and at most $8, not this window's own
/// posts, oldest first, at most the page ($7).
const PAST_CURSOR: &str = " AND position > $6 AND position <= $8
     AND NOT (sender_id = $2 AND sender_session = $5)
     ORDER BY {key} position LIMIT $7";
/// The latest page ($7), newest first (the cursor bind $6 is unused).
const LATEST: &str = " ORDER BY {key_desc} position DESC LIMIT $7";

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum ScopeKind {
    All,
    Inbox,
    Channel,
}

/// The branches of one read, each an index range of its own (a generic plan
/// cannot drop an OR branch that a bound flag turns off, nor walk two
/// indexes in one order). `all_sessions` reads the DMs of every window of
/// the agent; otherwise this window's and those to the whole agent.
fn branches(scope: ScopeKind, only_new: bool, all_sessions: bool) -> Vec<&'static str> {
    let mut branches = Vec::new();
    match scope {
        ScopeKind::Channel => return vec![ONE_CHANNEL],
        ScopeKind::All => branches.push(TEAM_CHANNELS),
        ScopeKind::Inbox => {}
    }
    if all_sessions {
        branches.push(DMS_TO_THE_AGENT);
    } else {
        branches.extend([DMS_TO_EVERY_WINDOW, DMS_TO_THIS_WINDOW]);
    }
    if !only_new {
        branches.push(if all_sessions {
            DMS_FROM_THE_AGENT
        } else {
            DMS_FROM_THIS_WINDOW
        });
    }
    branches
}

/// The statement for one read: the branches' pages merged (UNION: a DM an
/// agent sent itself is in two branches), cut to the page, in position order.
fn read_sql(only_new: bool, scope: ScopeKind, all_sessions: bool) -> String {
    let suffix = if only_new { PAST_CURSOR } else { LATEST };
    let union: Vec<String> = branches(scope, only_new, all_sessions)
        .iter()
        .map(|branch| {
            let (key, key_desc) = if *branch == DMS_TO_EVERY_WINDOW {
                ("recipient_session,", "recipient_session DESC,")
            } else {
                ("", "")
            };
            let suffix = suffix.replace("{key}", key).replace("{key_desc}", key_desc);
            format!("({branch}{suffix})")
        })
        .collect();
    let direction = if only_new { "" } else { " DESC" };
    let page = format!(
        "SELECT {columns}
         WHERE m.team_id = $1 AND m.id IN (
             SELECT id FROM ({union}) picked ORDER BY position{direction} LIMIT $7)
         ORDER BY m.position",
        columns = view_columns!(),
        union = union.join(" UNION "),
    );
    if !only_new {
        return page;
    }
    // With the page, in the same snapshot: the team's positions missing
    // between $9 (below it every position is settled) and the page's newest.
    format!(
        "WITH page AS ({page}),
              gaps AS (
                  SELECT coalesce(array_agg(g.p ORDER BY g.p), '{{}}') AS gaps
                  FROM generate_series($9 + 1, (SELECT max(position) FROM page)) AS g(p)
                  WHERE NOT EXISTS (SELECT 1 FROM messages x
                                    WHERE x.team_id = $1 AND x.position = g.p))
         SELECT page.*, gaps.gaps FROM page, gaps ORDER BY page.position"
    )
}

/// A row of an `only_new` page: the message, and the gaps below the page's
/// newest position (the same on every row).
#[derive(sqlx::FromRow)]
struct PageRow {
    #[sqlx(flatten)]
    message: MessageView,
    gaps: Vec<i64>,
}

/// Per team, a position at or below which every position is settled
/// (committed, or gone for good): what some read of this process saw
/// settled. A fact that stays true, so a read starts its gap check here when
/// its cursor is further behind (a sparse scope in a busy team), and a
/// process that has not seen the team yet starts from the cursor.
fn settled() -> &'static Mutex<HashMap<Uuid, i64>> {
    static SETTLED: OnceLock<Mutex<HashMap<Uuid, i64>>> = OnceLock::new();
    SETTLED.get_or_init(Default::default)
}

fn settled_through(team: Uuid) -> i64 {
    let settled = settled().lock().unwrap_or_else(|e| e.into_inner());
    settled.get(&team).copied().unwrap_or(0)
}

fn settle(team: Uuid, through: i64) {
    let mut settled = settled().lock().unwrap_or_else(|e| e.into_inner());
    let at = settled.entry(team).or_insert(0);
    *at = (*at).max(through);
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
    // Built from this file's constants only, never from input.
    let sql = read_sql(request.only_new, scope_kind, request.all_sessions);
    let page = |after: i64, through: i64, settled: i64| {
        sqlx::query_as::<_, PageRow>(sqlx::AssertSqlSafe(sql.clone()))
            .bind(me.team_id)
            .bind(me.agent_id)
            .bind(channel_id)
            .bind(request.all_sessions)
            .bind(&me.window)
            .bind(after)
            .bind(limit)
            .bind(through)
            .bind(settled)
    };
    let messages: Vec<MessageView> = if request.only_new {
        let after = cursor_for_update(&mut tx, me, &scope).await?;
        // Every position up to the cursor is settled (a cursor moves only
        // past settled positions); so is what this process saw settled.
        let settled_below = after.max(settled_through(me.team_id));
        let mut rows = page(after, i64::MAX, settled_below)
            .fetch_all(&mut *tx)
            .await?;
        let gaps = rows.first().map(|row| row.gaps.clone()).unwrap_or_default();
        if !gaps.is_empty() {
            // A position below the page's newest is missing: its writer may
            // commit later. Wait for those writers (of this team only), then
            // read again up to the same newest position, now all settled.
            let newest = rows.last().map_or(after, |row| row.message.position);
            sqlx::query("SELECT message_positions_wait($1, $2)")
                .bind(me.team_id)
                .bind(&gaps)
                .execute(&mut *tx)
                .await?;
            rows = page(after, newest, newest).fetch_all(&mut *tx).await?;
        }
        let messages: Vec<MessageView> = rows.into_iter().map(|row| row.message).collect();
        if let Some(last) = messages.last() {
            settle(me.team_id, last.position);
        }
        messages
    } else {
        sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
            .bind(me.team_id)
            .bind(me.agent_id)
            .bind(channel_id)
            .bind(request.all_sessions)
            .bind(&me.window)
            .bind(0_i64)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?
    };
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
/// its `inbox` and its `all` cursor (either read consumes them), the oldest
/// `$4`, from the two window indexes (to the whole agent, to this window).
/// Binds: $1 team, $2 agent, $3 window, $4 how many.
macro_rules! unread_dm_ids {
    () => {
        "SELECT id, position FROM (
             (SELECT id, position FROM messages
              WHERE team_id = $1 AND recipient_id = $2 AND recipient_session IS NULL
                AND position > (SELECT since FROM cursor)
                AND NOT (sender_id = $2 AND sender_session = $3)
              ORDER BY recipient_session, position LIMIT $4)
             UNION ALL
             (SELECT id, position FROM messages
              WHERE team_id = $1 AND recipient_id = $2 AND recipient_session = $3
                AND position > (SELECT since FROM cursor)
                AND NOT (sender_id = $2 AND sender_session = $3)
              ORDER BY position LIMIT $4)) unread
         ORDER BY position LIMIT $4"
    };
}

/// The cursor [`unread_dm_ids`] reads past, as a `WITH` item.
macro_rules! unread_dm_cursor {
    () => {
        "WITH cursor AS (
             SELECT coalesce(max(last_position), 0) AS since FROM read_cursors
             WHERE team_id = $1 AND agent_id = $2 AND session = $3 AND scope IN ('inbox', 'all')) "
    };
}

/// A count that stops at a cap: `at_least` says it stopped there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BoundedCount {
    pub count: i64,
    pub at_least: bool,
}

impl BoundedCount {
    /// From a count of at most `cap + 1` rows.
    pub fn of(counted: i64, cap: i64) -> Self {
        BoundedCount {
            count: counted.min(cap),
            at_least: counted > cap,
        }
    }
}

/// The statement [`unread_direct`] runs, as text for a read model that puts
/// the count beside other columns of one statement (`whoami`): a `WITH` item
/// and a scalar subquery. Binds: $1 team, $2 agent, $3 window, $4 the cap + 1.
pub(crate) const UNREAD_DM_CURSOR: &str = unread_dm_cursor!();
pub(crate) const UNREAD_DM_COUNT: &str =
    concat!("(SELECT count(*) FROM (", unread_dm_ids!(), ") counted)");

/// How many direct messages this window has not read, for `whoami`; counts
/// stop at [`UNREAD_COUNT_CAP`].
pub async fn unread_direct(bus: &Bus, me: &Identity) -> BusResult<BoundedCount> {
    let counted: i64 = sqlx::query_scalar(concat!(
        unread_dm_cursor!(),
        "SELECT count(*) FROM (",
        unread_dm_ids!(),
        ") counted"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(UNREAD_COUNT_CAP + 1)
    .fetch_one(&bus.pool)
    .await?;
    Ok(BoundedCount::of(counted, UNREAD_COUNT_CAP))
}

/// The oldest `limit` unread direct messages of this window; no cursor moves.
pub async fn unread_direct_messages(
    bus: &Bus,
    me: &Identity,
    limit: i64,
) -> BusResult<Vec<MessageView>> {
    Ok(sqlx::query_as(concat!(
        unread_dm_cursor!(),
        "SELECT ",
        view_columns!(),
        " WHERE m.team_id = $1 AND m.id IN (SELECT id FROM (",
        unread_dm_ids!(),
        ") unread) ORDER BY m.position"
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
