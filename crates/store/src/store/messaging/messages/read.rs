//! Reading messages: pages by scope and the per-window cursors `only_new`
//! moves (what is unread without moving a cursor is `unread.rs`).
//!
//! A direct message to the agent as a whole is read once per agent
//! (migration 0041): beside its windows' cursors the agent has one, and such
//! a DM is new or unread for a window only past both. A read whose page
//! holds one moves the agent's cursor in its own statement; a direct message
//! read on its own (`message_reads`: an `ask_agent` answer its call
//! returned) is neither new nor unread.
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
//!
//! A read is one statement, without a transaction around it: the write
//! fence, the cursor, the page, its gaps and the cursor's move (a compare and
//! set on the position the statement read, so two reads of the same window
//! and scope never hand out the same page twice). A read that finds nothing
//! new writes nothing; the wait for a gap's writer is a statement of its own.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde::Serialize;
use sqlx::postgres::PgArguments;
use sqlx::postgres::PgRow;
use sqlx::query::Query;
use sqlx::{FromRow, PgPool, Postgres, Row};
use uuid::Uuid;

use super::{MessageView, check_limit};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::fenced::BindCaller;
use crate::store::{identity::sessions, messaging::channels};

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
/// `only_new` with `all_sessions`: the DMs to each window of the agent (those
/// to the agent as a whole are [`DMS_TO_EVERY_WINDOW`], past the agent's
/// cursor too).
const DMS_TO_SOME_WINDOW: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id = $2 AND recipient_session IS NOT NULL";
const DMS_FROM_THIS_WINDOW: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id IS NOT NULL AND sender_id = $2 AND sender_session = $5";
const DMS_FROM_THE_AGENT: &str = "SELECT id, position FROM messages
     WHERE team_id = $1 AND recipient_id IS NOT NULL AND sender_id = $2";

/// `only_new`: past the cursor (read in the same statement; for DMs to the
/// agent as a whole, past the agent's cursor too) and at most $8, oldest
/// first, at most the page ($7). This window's own posts are on the page
/// (`mine`) so that the cursor moves past them, and left out of the answer:
/// filtered out here instead, a window that mostly posts walked its own
/// posts past the cursor again on every read, and one that wrote to itself
/// never moved its cursor at all. `{after}` is the cursor, `{not_read}` what
/// a DM branch adds (a DM read on its own is not new).
const PAST_CURSOR: &str = " AND position > {after} AND position <= $8{not_read}
     ORDER BY {key} position LIMIT $7";
const WINDOW_AFTER: &str = "(SELECT after FROM cursor)";
const AGENT_AFTER: &str = "greatest((SELECT after FROM cursor), (SELECT after FROM agent_cursor))";
/// A direct message read on its own (`message_reads`: an `ask_agent` answer
/// its call returned) is neither new nor unread. A probe of that small
/// table's key per DM of the page (not keyed on `reply_to`: a prune clears
/// the `reply_to` of a reply whose question it removed), made only when the
/// team has such a row (`read_alone`, once per statement): an anti-join in
/// every DM branch cost `post_read` about 15 % (docs/benchmarks.md).
const NOT_READ_ALONE: &str = "
     AND (NOT (SELECT present FROM read_alone) OR NOT EXISTS (
         SELECT 1 FROM message_reads x WHERE x.team_id = $1 AND x.message_id = messages.id))";
/// The latest page ($7), newest first.
const LATEST: &str = " ORDER BY {key_desc} position DESC LIMIT $7";

/// Whether this window posted the page's row `m`: on the page (a read past
/// a position moves past it), not in the answer.
pub(super) const MINE: &str = "(m.sender_id = $2 AND m.sender_session = $5)";

/// The write fence (`agent_write_refusal`, migration 0016) as the first `WITH`
/// item of a read: its function takes the lock and reads the credential in a
/// snapshot of its own, so a revocation committed while it waited is seen.
/// Binds: $1 team, $2 agent, $10 token, $11 window credential, $12 epoch.
pub(super) const FENCE: &str = "fence AS MATERIALIZED (
         SELECT refusal, session_epoch, refused_since
         FROM agent_write_refusal($1, $2, $10, $11, $12, false))";

/// This window's cursor for the scope ($6): the last position read (0 before
/// the first read) and whether the row exists; the agent's cursor for the
/// DMs to it as a whole (migration 0041); and whether the team has any
/// message read on its own ([`NOT_READ_ALONE`] probes only then).
const CURSOR: &str = "cursor AS MATERIALIZED (
         SELECT coalesce(max(last_position), 0) AS after, count(*) AS found
         FROM read_cursors WHERE team_id = $1 AND agent_id = $2 AND session = $5 AND scope = $6),
     agent_cursor AS MATERIALIZED (
         SELECT coalesce(max(last_position), 0) AS after, count(*) AS found
         FROM agent_read_cursors WHERE team_id = $1 AND agent_id = $2),
     read_alone AS MATERIALIZED (
         SELECT EXISTS (SELECT 1 FROM message_reads WHERE team_id = $1) AS present)";

/// After the page and its gaps: the cursors move, only if the fence let the
/// read through and nothing is missing below the page's newest position.
/// The agent's cursor moves first, to the newest DM to the agent as a whole
/// in the page (if there is one), and only if it is still where this
/// statement read it: another window may have handed out the same DMs
/// meanwhile, and then this read does not count and runs again. Then the
/// window's cursor moves to the page's newest, only if the agent's moved (or
/// had nothing to move) and it is still where this statement read it
/// (`moved` says whether it did: another read of the same window and scope
/// may have moved it meanwhile, and then this one reads again from there).
/// A first read creates the window's cursor even when there is nothing to
/// read. A read that finds nothing new writes nothing.
const MOVE_CURSOR: &str = "settled AS (
         SELECT max(position) AS newest,
                max(position) FILTER (WHERE to_agent) AS newest_to_agent FROM page
         WHERE (SELECT refusal FROM fence) IS NULL AND (SELECT gaps FROM gaps) = '{}'),
     agent_moved AS (
         UPDATE agent_read_cursors a SET last_position = s.newest_to_agent, updated_at = now()
         FROM settled s
         WHERE a.team_id = $1 AND a.agent_id = $2 AND s.newest_to_agent IS NOT NULL
           AND a.last_position = (SELECT after FROM agent_cursor)
         RETURNING 1),
     agent_created AS (
         INSERT INTO agent_read_cursors (team_id, agent_id, last_position)
         SELECT $1, $2, s.newest_to_agent FROM settled s
         WHERE s.newest_to_agent IS NOT NULL AND (SELECT found FROM agent_cursor) = 0
         ON CONFLICT DO NOTHING
         RETURNING 1),
     agent_ok AS (
         SELECT (SELECT newest_to_agent FROM settled) IS NULL
                OR EXISTS (SELECT FROM agent_moved) OR EXISTS (SELECT FROM agent_created) AS ok),
     moved AS (
         UPDATE read_cursors r SET last_position = s.newest, updated_at = now()
         FROM settled s
         WHERE r.team_id = $1 AND r.agent_id = $2 AND r.session = $5 AND r.scope = $6
           AND s.newest IS NOT NULL AND r.last_position = (SELECT after FROM cursor)
           AND (SELECT ok FROM agent_ok)
         RETURNING 1),
     created AS (
         INSERT INTO read_cursors (team_id, agent_id, session, scope, last_position)
         SELECT $1, $2, $5, $6, coalesce(s.newest, 0) FROM settled s
         WHERE (SELECT found FROM cursor) = 0 AND (SELECT refusal FROM fence) IS NULL
           AND (SELECT ok FROM agent_ok)
         ON CONFLICT DO NOTHING
         RETURNING 1),
     window_moved AS (
         SELECT EXISTS (SELECT FROM moved) OR EXISTS (SELECT FROM created) AS moved)";

/// The statement's last column: whether the window's cursor moved. When the
/// agent's moved but the window's did not (a read of the same window and
/// scope moved it meanwhile), the DMs to the agent in this page would be
/// marked read without being handed out: `read_cursor_raced` (migration
/// 0041) undoes the statement whole, and the read runs again.
const MOVED: &str = "CASE WHEN (SELECT newest_to_agent FROM settled) IS NOT NULL
                   AND (SELECT ok FROM agent_ok) AND NOT (SELECT moved FROM window_moved)
              THEN read_cursor_raced()
              ELSE (SELECT moved FROM window_moved)::int::bigint END AS moved";

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ScopeKind {
    All,
    Inbox,
    Channel,
}

/// The branches of one read, each an index range of its own (a generic plan
/// cannot drop an OR branch that a bound flag turns off, nor walk two
/// indexes in one order). `all_sessions` reads the DMs of every window of
/// the agent; otherwise this window's and those to the whole agent.
pub(super) fn branches(scope: ScopeKind, only_new: bool, all_sessions: bool) -> Vec<&'static str> {
    let mut branches = Vec::new();
    match scope {
        ScopeKind::Channel => return vec![ONE_CHANNEL],
        ScopeKind::All => branches.push(TEAM_CHANNELS),
        ScopeKind::Inbox => {}
    }
    if all_sessions && !only_new {
        branches.push(DMS_TO_THE_AGENT);
    } else if all_sessions {
        branches.extend([DMS_TO_EVERY_WINDOW, DMS_TO_SOME_WINDOW]);
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

/// The page of one read: the branches' pages merged (UNION: a DM an agent
/// sent itself is in two branches), cut to the page. Each row says whether
/// this window posted it (`mine`) and whether it is a DM to the agent as a
/// whole that another window sent (`to_agent`: it moves the agent's cursor;
/// one this window sent stays new for the agent's other windows).
fn page_sql(only_new: bool, scope: ScopeKind, all_sessions: bool) -> String {
    let suffix = if only_new { PAST_CURSOR } else { LATEST };
    let union: Vec<String> = branches(scope, only_new, all_sessions)
        .iter()
        .map(|branch| {
            let (key, key_desc) = if *branch == DMS_TO_EVERY_WINDOW {
                ("recipient_session,", "recipient_session DESC,")
            } else {
                ("", "")
            };
            let after = if *branch == DMS_TO_EVERY_WINDOW {
                AGENT_AFTER
            } else {
                WINDOW_AFTER
            };
            let not_read = if [TEAM_CHANNELS, ONE_CHANNEL].contains(branch) {
                ""
            } else {
                NOT_READ_ALONE
            };
            let suffix = suffix
                .replace("{key}", key)
                .replace("{key_desc}", key_desc)
                .replace("{after}", after)
                .replace("{not_read}", not_read);
            format!("({branch}{suffix})")
        })
        .collect();
    let direction = if only_new { "" } else { " DESC" };
    format!(
        "SELECT {columns}, {MINE} AS mine,
                m.recipient_id IS NOT NULL AND m.recipient_id = $2
                    AND m.recipient_session IS NULL AND NOT {MINE} AS to_agent
         FROM (SELECT id FROM ({union}) picked ORDER BY position{direction} LIMIT $7){lookup}
              {joins}
         WHERE m.team_id = $1",
        columns = view_columns_from!(),
        lookup = page_lookup!(),
        joins = view_joins!(),
        union = union.join(" UNION "),
    )
}

/// The statement for one read, in one round trip: the fence, then the page
/// in position order, each row beside the fence's answer (one row of NULL
/// message columns when the page is empty). `only_new` also reads the cursor,
/// lists the team's positions missing between $9 (below it every position is
/// settled) and the page's newest, in the same snapshot as the page, and
/// moves the cursor (`MOVE_CURSOR`).
fn read_sql(only_new: bool, scope: ScopeKind, all_sessions: bool) -> String {
    let page = page_sql(only_new, scope, all_sessions);
    if !only_new {
        return format!(
            "WITH {FENCE}, page AS ({page})
             SELECT f.refusal, f.session_epoch, f.refused_since, p.*
             FROM fence f LEFT JOIN page p ON true ORDER BY p.position"
        );
    }
    format!(
        "WITH {FENCE}, {CURSOR},
              page AS MATERIALIZED ({page}),
              {gaps},
              {MOVE_CURSOR}
         SELECT f.refusal, f.session_epoch, f.refused_since, p.*, g.gaps, {MOVED},
                (SELECT after FROM cursor) AS cursor_after
         FROM fence f LEFT JOIN (page p CROSS JOIN gaps g) ON true
         ORDER BY p.position",
        gaps = gaps_cte("(SELECT after FROM cursor)"),
    )
}

/// The `gaps` item of a read past a position: the team's positions missing
/// past `from` (or $9, below which every position is settled) up to the
/// page's newest. One probe of the position's index entry per position, a
/// scalar subquery the planner keeps as one: written as `NOT EXISTS` it
/// became an anti-join, and the generic plan (which cannot see how short
/// the range is, 1 000 rows to it) hashed every message of the team on every
/// read (13 ms against 0.08 ms for a range of 16 in a team of 8 500).
pub(super) fn gaps_cte(from: &str) -> String {
    format!(
        "gaps AS MATERIALIZED (
             SELECT coalesce(array_agg(g.p ORDER BY g.p), '{{}}') AS gaps
             FROM generate_series(greatest({from}, $9) + 1,
                                  (SELECT max(position) FROM page)) AS g(p)
             WHERE (SELECT 1 FROM messages x
                    WHERE x.team_id = $1 AND x.position = g.p LIMIT 1) IS NULL)"
    )
}

/// The SQLSTATE `read_cursor_raced` raises (migration 0041).
const RACED: &str = "AC041";

fn raced(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == RACED)
}

/// The messages of one read statement's rows (a row of NULL message columns,
/// an empty page, is none of them).
pub(super) struct Rows {
    /// What the answer holds: with `past` (a read past a position), not this
    /// window's own posts.
    pub(super) messages: Vec<MessageView>,
    /// The page's newest position, this window's own posts included: where a
    /// read past a position got to.
    pub(super) newest: Option<i64>,
    /// The page was full (own posts count): more may be waiting.
    pub(super) full: bool,
}

impl Rows {
    pub(super) fn of(rows: &[PgRow], limit: i64, past: bool) -> BusResult<Rows> {
        let mut read = Rows {
            messages: Vec::with_capacity(rows.len()),
            newest: None,
            full: false,
        };
        let mut count = 0;
        for row in rows {
            if row.try_get::<Option<Uuid>, _>("id")?.is_none() {
                continue;
            }
            count += 1;
            let message = MessageView::from_row(row)?;
            read.newest = read.newest.max(Some(message.position));
            if !(past && row.try_get::<bool, _>("mine")?) {
                read.messages.push(message);
            }
        }
        read.full = count == limit;
        Ok(read)
    }
}

/// What one read statement answered.
struct Page {
    read: Rows,
    /// `only_new`: the team's positions missing below the page's newest.
    gaps: Vec<i64>,
    /// `only_new`: whether this statement moved (or created) the cursor.
    moved: bool,
    /// `only_new`: the statement was undone whole (`read_cursor_raced`):
    /// nothing was handed out or moved, read again.
    raced: bool,
    /// `only_new`: the window's cursor for the scope, as the statement read it.
    cursor: i64,
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
    /// Read from this position instead of the cursor (`after.rs`).
    pub after: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReadResult {
    pub scope: String,
    pub messages: Vec<MessageView>,
    /// True when the page was full: more may be waiting, read again.
    pub more: bool,
    /// The position reached: the page's newest, else the cursor or `after`.
    pub read_up_to: i64,
    /// On an empty page: what was read, past where, as of when (`after.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One read's statement and what it binds besides its bounds.
pub(super) struct Reader<'a> {
    me: &'a Identity,
    sql: String,
    pub(super) scope: &'a str,
    pub(super) channel_id: Option<Uuid>,
    pub(super) all_sessions: bool,
    only_new: bool,
    pub(super) limit: i64,
}

impl<'a> Reader<'a> {
    /// `sql` (built from constants only) with what every read binds: $1
    /// team, $2 agent, $3 channel, $4 all_sessions, $5 window, $6 scope, $7
    /// page, $8 `through` (the newest position read), $9 `settled` (every
    /// position up to it is settled), $10..$12 the fence's credential. A
    /// statement of `after.rs` binds its own after these.
    pub(super) fn query(
        &self,
        sql: String,
        through: i64,
        settled: i64,
    ) -> Query<'a, Postgres, PgArguments> {
        let me: &'a Identity = self.me;
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(me.team_id)
            .bind(me.agent_id)
            .bind(self.channel_id)
            .bind(self.all_sessions)
            .bind(&me.window)
            .bind(self.scope)
            .bind(self.limit)
            .bind(through)
            .bind(settled)
            .bind_credential(me)
    }

    /// Run the statement once: reads at most up to `through`, with every
    /// position up to `settled` known settled. A refused fence is the error.
    async fn run(&self, pool: &PgPool, through: i64, settled: i64) -> BusResult<Page> {
        let me = self.me;
        let rows = self
            .query(self.sql.clone(), through, settled)
            .fetch_all(pool)
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            // Not an error: the read runs again (an error would be logged).
            Err(err) if raced(&err) => {
                return Ok(Page {
                    read: Rows {
                        messages: Vec::new(),
                        newest: None,
                        full: false,
                    },
                    gaps: Vec::new(),
                    moved: false,
                    raced: true,
                    cursor: 0,
                });
            }
            Err(err) => return Err(err.into()),
        };
        let Some(first) = rows.first() else {
            return Err(BusError::Db(sqlx::Error::Protocol(
                "read_messages returned no row".into(),
            )));
        };
        sessions::Refusal::from_row(first)?.check(me)?;
        let mut page = Page {
            read: Rows::of(&rows, self.limit, self.only_new)?,
            gaps: Vec::new(),
            moved: false,
            raced: false,
            cursor: 0,
        };
        if self.only_new {
            page.gaps = first
                .try_get::<Option<Vec<i64>>, _>("gaps")?
                .unwrap_or_default();
            page.moved = first.try_get::<i64, _>("moved")? > 0;
            page.cursor = first.try_get::<i64, _>("cursor_after")?;
        }
        Ok(page)
    }

    /// `only_new`: the page past the cursor, the cursor moved past it. A
    /// position missing below the page's newest may still commit: wait for
    /// its writer (of this team only), then read again up to the same newest
    /// position, now all settled. If another read of the same window and
    /// scope moved the cursor first, read again from where it left it.
    /// Also the position read up to: the page's newest (this window's own
    /// posts included), or the cursor.
    async fn read_new(&self, pool: &PgPool) -> BusResult<(Rows, i64)> {
        let team = self.me.team_id;
        let (mut through, mut settled) = (i64::MAX, settled_through(team));
        loop {
            let page = self.run(pool, through, settled).await?;
            if page.raced {
                (through, settled) = (i64::MAX, settled_through(team));
                continue;
            }
            if !page.gaps.is_empty() {
                let newest = page.read.newest.unwrap_or(0);
                sqlx::query("SELECT message_positions_wait($1, $2)")
                    .bind(team)
                    .bind(&page.gaps)
                    .execute(pool)
                    .await?;
                (through, settled) = (newest, newest);
                continue;
            }
            let Some(up_to) = page.read.newest else {
                return Ok((page.read, page.cursor));
            };
            if page.moved {
                settle(team, up_to);
                return Ok((page.read, up_to));
            }
            (through, settled) = (i64::MAX, settled_through(team));
        }
    }
}

/// `read_messages`. With `only_new`, returns what came after this window's
/// cursor for the scope (oldest first) and advances it; without, the latest
/// page, leaving the cursor alone. Either is one statement, which takes the
/// write fence first (moving a cursor is a mutation: a revoked or stale
/// window reads and moves nothing).
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

    let reader = Reader {
        me,
        // Built from this file's constants only, never from input.
        sql: read_sql(request.only_new, scope_kind, request.all_sessions),
        scope: &scope,
        channel_id,
        all_sessions: request.all_sessions,
        only_new: request.only_new,
        limit,
    };
    let (mut read, read_up_to) = if let Some(after) = request.after {
        super::after::read_after(bus, me, &reader, scope_kind, after).await?
    } else if request.only_new {
        reader.read_new(&bus.pool).await?
    } else {
        let read = reader.run(&bus.pool, i64::MAX, 0).await?.read;
        let newest = read.newest.unwrap_or(0);
        (read, newest)
    };
    crate::store::messaging::acks::mark_acked(bus, me, &mut read.messages).await?;
    Ok(super::after::answer(
        scope,
        read,
        read_up_to,
        request.only_new || request.after.is_some(),
    ))
}
