//! What a window has not read yet, counted or listed without moving a
//! cursor (`whoami`, `pending_for_me`, waits), and the direct messages read
//! on their own: an `ask_agent` answer, found and marked read by the call
//! that returns it (`message_reads`, migration 0041).

use uuid::Uuid;

use serde::Serialize;

use super::MessageView;
use super::read::UNREAD_COUNT_CAP;
use crate::Bus;
use crate::auth::Identity;
use crate::error::BusResult;
use crate::store::fenced::BindCaller as _;

/// The direct messages to this window that it has not read yet: those to
/// this window past both its `inbox` and its `all` cursor (either read
/// consumes them), those to the whole agent past the agent's cursor too (a
/// DM to the agent is read once, by any window of it), none read on its own
/// (`message_reads`), the oldest `$4`, from the two window indexes.
/// Binds: $1 team, $2 agent, $3 window, $4 how many.
macro_rules! unread_dm_ids {
    () => {
        "SELECT id, position FROM (
             (SELECT id, position FROM messages
              WHERE team_id = $1 AND recipient_id = $2 AND recipient_session IS NULL
                AND position > (SELECT since FROM agent_cursor)
                AND NOT (sender_id = $2 AND sender_session = $3)
                AND (NOT (SELECT present FROM read_alone) OR NOT EXISTS (
                    SELECT 1 FROM message_reads x
                    WHERE x.team_id = $1 AND x.message_id = messages.id))
              ORDER BY recipient_session, position LIMIT $4)
             UNION ALL
             (SELECT id, position FROM messages
              WHERE team_id = $1 AND recipient_id = $2 AND recipient_session = $3
                AND position > (SELECT since FROM cursor)
                AND NOT (sender_id = $2 AND sender_session = $3)
                AND (NOT (SELECT present FROM read_alone) OR NOT EXISTS (
                    SELECT 1 FROM message_reads x
                    WHERE x.team_id = $1 AND x.message_id = messages.id))
              ORDER BY position LIMIT $4)) unread
         ORDER BY position LIMIT $4"
    };
}

/// The cursors [`unread_dm_ids`] reads past, as `WITH` items: the window's,
/// and for DMs to the whole agent the higher of it and the agent's; and
/// whether the team has a message read on its own (probed only then, as in
/// [`NOT_READ_ALONE`]).
macro_rules! unread_dm_cursor {
    () => {
        "WITH cursor AS (
             SELECT coalesce(max(last_position), 0) AS since FROM read_cursors
             WHERE team_id = $1 AND agent_id = $2 AND session = $3 AND scope IN ('inbox', 'all')),
         agent_cursor AS (
             SELECT greatest((SELECT since FROM cursor), coalesce((
                 SELECT last_position FROM agent_read_cursors
                 WHERE team_id = $1 AND agent_id = $2), 0)) AS since),
         read_alone AS MATERIALIZED (
             SELECT EXISTS (SELECT 1 FROM message_reads WHERE team_id = $1) AS present) "
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
/// [`unread_dm_ids`] as text, to put beside [`UNREAD_DM_CURSOR`] in a
/// statement of its own (`pending_for_me`'s lists). Binds as there.
pub(crate) const UNREAD_DM_IDS: &str = unread_dm_ids!();
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
        view_columns_from!(),
        " FROM (",
        unread_dm_ids!(),
        ")",
        page_lookup!(),
        view_joins!(),
        " WHERE m.team_id = $1 ORDER BY m.position"
    ))
    .bind_window(me)
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
    let mut answer: Option<MessageView> = sqlx::query_as(concat!(
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
    .await?;
    if let Some(answer) = answer.as_mut() {
        crate::store::messaging::acks::mark_acked(bus, me, std::slice::from_mut(answer)).await?;
    }
    Ok(answer)
}

/// Mark one direct message to this window (or its whole agent) read on its
/// own, outside the cursors: `ask_agent`'s answer, returned by the call.
/// Another agent's message, or one to a sibling window, is left alone.
pub async fn mark_read(bus: &Bus, me: &Identity, message_id: Uuid) -> BusResult<()> {
    sqlx::query(
        "INSERT INTO message_reads (team_id, message_id)
         SELECT m.team_id, m.id FROM messages m
         WHERE m.team_id = $1 AND m.id = $2 AND m.recipient_id = $3
           AND (m.recipient_session IS NULL OR m.recipient_session = $4)
         ON CONFLICT DO NOTHING",
    )
    .bind(me.team_id)
    .bind(message_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .execute(&bus.pool)
    .await?;
    Ok(())
}
