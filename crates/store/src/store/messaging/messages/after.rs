//! `read_messages {after}`: a page from an explicit position, for a window
//! that lost its place, and the shape every `read_messages` answer takes
//! (issue 38 item 4: never silently empty).
//!
//! A read from a position reads what the scope holds past it that this
//! window would get as new (its own posts left out), oldest first, and moves
//! no cursor. A position the bus cannot answer for is refused, never
//! answered with an empty page: one ahead of the team's newest position
//! (nothing there yet, and a later message could get a position below it),
//! or one behind what `team prune` deleted in the scope (migration 0048's
//! marks: what is left would look like all there was). A position missing
//! below the page's newest may still commit: the read waits for its writer
//! and reads again, as a cursor read does (`read.rs`).

use chrono::Utc;
use sqlx::{FromRow, PgPool, Row};

use super::read::{FENCE, MINE, Reader, Rows, ScopeKind, branches, gaps_cte};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::identity::sessions;

/// The team's newest position (what is committed, or pruned) and the
/// scope's prune mark. Binds: $1 team, $2 the channel (the scope's one, or
/// NULL for every channel), $3 whether channels count, $4 the agent, $5
/// whether its direct messages count.
const BOUNDS: &str = "SELECT
     greatest(coalesce((SELECT max(position) FROM messages WHERE team_id = $1), 0),
              coalesce((SELECT max(pruned_through) FROM message_prune_marks
                         WHERE team_id = $1), 0)) AS newest,
     coalesce((SELECT max(pruned_through) FROM message_prune_marks
                WHERE team_id = $1
                  AND ((kind = 'channel' AND $3 AND ($2::uuid IS NULL OR key = $2))
                       OR (kind = 'direct' AND $5 AND key = $4))), 0) AS pruned";

/// Each branch past `$13` (the position asked) up to `$8`, oldest first, at
/// most the page; this window's own posts are on it (`mine`: the position
/// read up to passes them) and left out of the answer, as `read.rs` does.
const PAST_POSITION: &str = " AND position > $13 AND position <= $8
     ORDER BY {key} position LIMIT $7";

/// The statement: the write fence (as every read takes it), the page, and
/// the team's positions missing between `$9` (settled below) or `$13` and
/// the page's newest. Binds as `read.rs`, plus $13 the position asked.
fn after_sql(scope: ScopeKind, all_sessions: bool) -> String {
    let union: Vec<String> = branches(scope, true, all_sessions)
        .iter()
        .map(|branch| {
            let key = if branch.contains("recipient_session IS NULL") {
                "recipient_session,"
            } else {
                ""
            };
            format!("({branch}{})", PAST_POSITION.replace("{key}", key))
        })
        .collect();
    format!(
        "WITH {FENCE},
              page AS MATERIALIZED (
                  SELECT {columns}, {MINE} AS mine
                  FROM (SELECT id FROM ({union}) picked ORDER BY position LIMIT $7){lookup}
                       {joins}
                  WHERE m.team_id = $1),
              {gaps}
         SELECT f.refusal, f.session_epoch, f.refused_since, p.*, g.gaps
         FROM fence f LEFT JOIN (page p CROSS JOIN gaps g) ON true
         ORDER BY p.position",
        columns = view_columns_from!(),
        lookup = page_lookup!(),
        joins = view_joins!(),
        union = union.join(" UNION "),
        gaps = gaps_cte("$13"),
    )
}

/// Refuse a position the bus cannot answer for (see the module doc).
async fn check_position(
    pool: &PgPool,
    me: &Identity,
    reader: &Reader<'_>,
    scope: ScopeKind,
    scope_name: &str,
    after: i64,
) -> BusResult<()> {
    if after < 0 {
        return Err(BusError::invalid(format!(
            "after must be a position, 0 or more; got {after}. Omit it to read with this \
             window's cursor, or pass the read_up_to of an earlier read_messages."
        )));
    }
    let (channels, direct) = match scope {
        ScopeKind::All => (true, true),
        ScopeKind::Inbox => (false, true),
        ScopeKind::Channel => (true, false),
    };
    let (newest, pruned): (i64, i64) = sqlx::query_as(BOUNDS)
        .bind(me.team_id)
        .bind(reader.channel_id)
        .bind(channels)
        .bind(me.agent_id)
        .bind(direct)
        .fetch_one(pool)
        .await?;
    if after > newest {
        return Err(BusError::invalid(format!(
            "after {after} is ahead of the newest position {newest} of your team: nothing is \
             there, and a message posted next could get a position below it. Start from the \
             newest: omit `after` to read what is new for this window, or pass after: {newest} \
             to read only what comes next. Nothing was read."
        )));
    }
    if after < pruned {
        return Err(BusError::invalid(format!(
            "after {after} is behind what retention pruned in {scope_name}: `team prune` \
             deleted messages there up to position {pruned}, so a page from {after} would \
             look complete while it is not. Start from the oldest kept: pass after: {pruned} \
             (reads from position {}), or omit `after` to read with this window's cursor. \
             Nothing was read.",
            pruned + 1
        )));
    }
    Ok(())
}

/// `read_messages {after}`: the page past `after` and the position read up
/// to (the page's newest, else `after`). Moves no cursor.
pub(super) async fn read_after(
    bus: &Bus,
    me: &Identity,
    reader: &Reader<'_>,
    scope: ScopeKind,
    after: i64,
) -> BusResult<(Rows, i64)> {
    let pool = &bus.pool;
    let scope_name = reader.scope;
    check_position(pool, me, reader, scope, scope_name, after).await?;
    // Built from this file's and read.rs's constants only, never from input.
    let sql = after_sql(scope, reader.all_sessions);
    let (mut through, mut settled) = (i64::MAX, 0);
    loop {
        let rows = reader
            .query(sql.clone(), through, settled)
            .bind(after)
            .fetch_all(pool)
            .await?;
        let Some(first) = rows.first() else {
            return Err(BusError::Db(sqlx::Error::Protocol(
                "read_messages {after} returned no row".into(),
            )));
        };
        sessions::Refusal::from_row(first)?.check(me)?;
        let read = Rows::of(&rows, reader.limit, true)?;
        let gaps: Vec<i64> = first
            .try_get::<Option<Vec<i64>>, _>("gaps")?
            .unwrap_or_default();
        let newest = read.newest.unwrap_or(after);
        if gaps.is_empty() {
            // A prune that committed after the first check (while this read
            // waited for a gap's writer, say) deleted part of the page and
            // raised its mark in one transaction: looking again after the
            // page refuses what would look whole while it is not.
            check_position(pool, me, reader, scope, scope_name, after).await?;
            return Ok((read, newest));
        }
        sqlx::query("SELECT message_positions_wait($1, $2)")
            .bind(me.team_id)
            .bind(&gaps)
            .execute(pool)
            .await?;
        (through, settled) = (newest, newest);
    }
}

/// The answer of every `read_messages`: `more` when the page is full (this
/// window's own posts count), the position it read up to, and on an empty
/// page a note saying what was read, past where, as of when (never a bare
/// `[]`). `past` says the read was past a position (a cursor or `after`),
/// not the latest page.
pub(super) fn answer(scope: String, read: Rows, read_up_to: i64, past: bool) -> super::ReadResult {
    let Rows { messages, full, .. } = read;
    let note = messages.is_empty().then(|| {
        let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        if past {
            format!(
                "nothing in {scope} after position {read_up_to} for this window (as of {now}); \
                 wait_for_updates wakes you when something comes"
            )
        } else {
            format!("{scope} holds no message you may read (as of {now})")
        }
    });
    super::ReadResult {
        more: full,
        scope,
        messages,
        read_up_to,
        note,
    }
}
