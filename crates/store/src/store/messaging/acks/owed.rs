//! `list_owed` and the owed acknowledgements `pending_for_me` shows: what
//! this window owes (`i_owe`) and what others owe it (`owed_to_me`), oldest
//! first, across direct, channel and conversation messages (see the module
//! overview for who owes what).
//!
//! Each list is a union of bounded branches, each cut at the page (plus one,
//! for `more`): the debts of direct and channel messages walk the team's
//! ack-required messages (`messages_ack_required`, a partial index: only
//! messages that asked), anti-joined against `message_acks`; those of
//! conversation messages walk this window's unacknowledged receipts (`i_owe`)
//! or the conversation messages it sent (`owed_to_me`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::BusResult;
use crate::store::limits;

pub const LIST_DEFAULT: i64 = 20;
pub const LIST_MAX: i64 = 100;
/// `pending_for_me` lists this many owed acks, and counts up to
/// [`PENDING_COUNTED`].
pub const PENDING_SHOWN: usize = 10;
pub const PENDING_COUNTED: i64 = 100;

/// One message owed an acknowledgement.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow)]
pub struct OwedAck {
    pub message_id: Uuid,
    /// `dm`, `channel` or `conversation`.
    pub kind: String,
    /// The sender's address.
    pub from: String,
    /// The recipient's address (a direct message or, in `i_owe`, a
    /// conversation message: this window).
    pub to: Option<String>,
    /// The channel, for a channel message.
    pub channel: Option<String>,
    /// The conversation, for a conversation message.
    pub conversation_id: Option<Uuid>,
    pub conversation_title: Option<String>,
    pub seq: Option<i64>,
    pub sent_at: DateTime<Utc>,
    /// When the acknowledgement is due (absent: no due time, never overdue).
    pub due_at: Option<DateTime<Utc>>,
    pub overdue: bool,
    /// `owed_to_me` only: who still owes it (agent names; windows for a
    /// conversation message), at most 50.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owed_by: Option<Vec<String>>,
    /// `owed_to_me` only: how many still owe it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owed_by_count: Option<i64>,
}

/// `list_owed`'s answer.
#[derive(Clone, Debug, Serialize)]
pub struct Owed {
    /// What this window (for a DM or channel message: its agent) owes.
    pub i_owe: Vec<OwedAck>,
    /// True when `i_owe` was cut at `limit`: more are owed.
    pub i_owe_more: bool,
    /// What others owe this window, for messages it sent.
    pub owed_to_me: Vec<OwedAck>,
    pub owed_to_me_more: bool,
    pub overdue_only: bool,
    /// When the lists were read.
    pub as_of: DateTime<Utc>,
    /// Set when both lists are empty: what that means.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The columns of an [`OwedAck`] row from a direct or channel message `m`
/// with its sender `s` and channel `c`.
macro_rules! message_columns {
    () => {
        "m.id AS message_id,
         CASE WHEN m.channel_id IS NULL THEN 'dm' ELSE 'channel' END AS kind,
         CASE WHEN m.sender_session = '' THEN s.name ELSE s.name || '/' || m.sender_session END AS from,
         CASE WHEN m.recipient_id IS NULL THEN NULL
              WHEN m.recipient_session IS NULL THEN r.name
              ELSE r.name || '/' || m.recipient_session END AS to,
         c.name AS channel, NULL::uuid AS conversation_id, NULL::text AS conversation_title,
         NULL::bigint AS seq, m.created_at AS sent_at, m.ack_due_at AS due_at,
         coalesce(m.ack_due_at <= now(), false) AS overdue"
    };
}

macro_rules! message_joins {
    () => {
        " FROM messages m
          JOIN agents s ON s.team_id = m.team_id AND s.id = m.sender_id
          LEFT JOIN agents r ON r.team_id = m.team_id AND r.id = m.recipient_id
          LEFT JOIN channels c ON c.team_id = m.team_id AND c.id = m.channel_id"
    };
}

/// The direct and channel messages this agent owes an ack, oldest first.
/// Binds: $1 team, $2 agent; `$overdue` (overdue only) and `$limit` (how
/// many) are placeholders such as `"$4"` or a literal.
macro_rules! messages_i_owe {
    ($overdue:literal, $limit:literal) => {
        concat!(
            "SELECT ",
            $crate::store::messaging::acks::owed::message_columns!(),
            ", NULL::text[] AS owed_by, NULL::bigint AS owed_by_count",
            $crate::store::messaging::acks::owed::message_joins!(),
            " JOIN agents me ON me.team_id = m.team_id AND me.id = $2
              WHERE m.team_id = $1 AND m.ack_required
                AND (m.recipient_id = $2
                     OR (m.channel_id IS NOT NULL AND m.sender_id <> $2
                         AND m.created_at >= me.created_at))
                AND NOT EXISTS (SELECT 1 FROM message_acks k
                                WHERE k.team_id = m.team_id AND k.message_id = m.id
                                  AND k.agent_id = $2)
                AND (NOT ",
            $overdue,
            " OR m.ack_due_at <= now())
              ORDER BY m.created_at, m.id LIMIT ",
            $limit
        )
    };
}

pub(crate) use {message_columns, message_joins, messages_i_owe};

/// `i_owe`: direct and channel messages (the agent's debts) and this
/// window's unacknowledged conversation messages.
/// Binds: $1 team, $2 agent, $3 window, $4 overdue only, $5 how many.
const I_OWE: &str = concat!(
    "(",
    messages_i_owe!("$4", "$5"),
    ") UNION ALL (
     SELECT cm.id AS message_id, 'conversation' AS kind,
            CASE WHEN cm.sender_session = '' THEN s.name
                 ELSE s.name || '/' || cm.sender_session END AS from,
            CASE WHEN st.session = '' THEN me.name ELSE me.name || '/' || st.session END AS to,
            NULL::text AS channel, cm.conversation_id, cv.title AS conversation_title, cm.seq,
            cm.created_at AS sent_at, NULL::timestamptz AS due_at, false AS overdue,
            NULL::text[] AS owed_by, NULL::bigint AS owed_by_count
     FROM conversation_members st
     JOIN agents me ON me.team_id = st.team_id AND me.id = st.agent_id
     JOIN message_receipts rc ON rc.team_id = st.team_id AND rc.member_id = st.id
     JOIN conversation_messages cm ON cm.team_id = rc.team_id AND cm.id = rc.message_id
     JOIN conversations cv ON cv.team_id = cm.team_id AND cv.id = cm.conversation_id
     JOIN agents s ON s.team_id = cm.team_id AND s.id = cm.sender_id
     WHERE st.team_id = $1 AND st.agent_id = $2 AND st.session = $3 AND st.state = 'active'
       AND rc.acknowledged_at IS NULL AND rc.stored_at IS NOT NULL AND NOT $4
     ORDER BY cm.created_at, cm.id LIMIT $5)
     ORDER BY sent_at, message_id LIMIT $5"
);

/// `owed_to_me`: the messages this window sent that someone still owes.
/// Binds: $1 team, $2 agent, $3 window, $4 overdue only, $5 how many.
const OWED_TO_ME: &str = concat!(
    "(SELECT ",
    message_columns!(),
    ", d.owed_by[1:50] AS owed_by, d.owed_by_count",
    message_joins!(),
    " CROSS JOIN LATERAL (
         SELECT array_agg(a.name ORDER BY a.name) AS owed_by, count(*) AS owed_by_count
         FROM agents a
         WHERE a.team_id = m.team_id AND a.disabled_at IS NULL
           AND CASE WHEN m.recipient_id IS NOT NULL THEN a.id = m.recipient_id
                    ELSE a.id <> m.sender_id AND a.created_at <= m.created_at END
           AND NOT EXISTS (SELECT 1 FROM message_acks k
                           WHERE k.team_id = m.team_id AND k.message_id = m.id
                             AND k.agent_id = a.id)) d
     WHERE m.team_id = $1 AND m.sender_id = $2 AND m.sender_session = $3 AND m.ack_required
       AND d.owed_by_count > 0
       AND (NOT $4 OR m.ack_due_at <= now())
     ORDER BY m.created_at, m.id LIMIT $5)
    UNION ALL (
     SELECT cm.id AS message_id, 'conversation' AS kind,
            CASE WHEN cm.sender_session = '' THEN s.name
                 ELSE s.name || '/' || cm.sender_session END AS from,
            NULL::text AS to, NULL::text AS channel, cm.conversation_id,
            cv.title AS conversation_title, cm.seq, cm.created_at AS sent_at,
            NULL::timestamptz AS due_at, false AS overdue,
            d.owed_by[1:50] AS owed_by, d.owed_by_count
     FROM conversation_messages cm
     JOIN conversations cv ON cv.team_id = cm.team_id AND cv.id = cm.conversation_id
     JOIN agents s ON s.team_id = cm.team_id AND s.id = cm.sender_id
     CROSS JOIN LATERAL (
         SELECT array_agg(CASE WHEN rc.recipient_session = '' THEN a.name
                               ELSE a.name || '/' || rc.recipient_session END
                          ORDER BY a.name, rc.recipient_session) AS owed_by,
                count(*) AS owed_by_count
         FROM message_receipts rc JOIN agents a ON a.team_id = rc.team_id AND a.id = rc.recipient_id
         WHERE rc.team_id = cm.team_id AND rc.message_id = cm.id
           AND rc.acknowledged_at IS NULL AND rc.stored_at IS NOT NULL) d
     WHERE cm.team_id = $1 AND cm.sender_id = $2 AND cm.sender_session = $3
       AND d.owed_by_count > 0 AND NOT $4
     ORDER BY cm.created_at, cm.id LIMIT $5)
    ORDER BY sent_at, message_id LIMIT $5"
);

fn check_limit(limit: Option<i64>) -> BusResult<i64> {
    limits::page_limit(
        limit,
        limits::Page {
            default: LIST_DEFAULT,
            max: LIST_MAX,
        },
        "`more: true` on a list says more are owed: deal with the oldest first, then call again.",
    )
}

async fn list(
    bus: &Bus,
    me: &Identity,
    sql: &'static str,
    overdue_only: bool,
    limit: i64,
) -> BusResult<(Vec<OwedAck>, bool)> {
    let mut rows: Vec<OwedAck> = sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(overdue_only)
        .bind(limit + 1)
        .fetch_all(&bus.pool)
        .await?;
    let more = limits::cut_page(&mut rows, limit);
    Ok((rows, more))
}

/// `list_owed`.
pub async fn list_owed(
    bus: &Bus,
    me: &Identity,
    overdue_only: bool,
    limit: Option<i64>,
) -> BusResult<Owed> {
    let limit = check_limit(limit)?;
    let as_of = Utc::now();
    let (i_owe, i_owe_more) = list(bus, me, I_OWE, overdue_only, limit).await?;
    let (owed_to_me, owed_to_me_more) = list(bus, me, OWED_TO_ME, overdue_only, limit).await?;
    let note = (i_owe.is_empty() && owed_to_me.is_empty()).then(|| {
        let what = if overdue_only {
            "nothing overdue"
        } else {
            "nothing owed"
        };
        format!(
            "{what} as of {}: this window owes no acknowledgement and none is owed to it{}.",
            as_of.to_rfc3339(),
            if overdue_only {
                " past its due time (call without overdue_only for those not yet due)"
            } else {
                ""
            }
        )
    });
    Ok(Owed {
        i_owe,
        i_owe_more,
        owed_to_me,
        owed_to_me_more,
        overdue_only,
        as_of,
        note,
    })
}

/// The direct and channel messages this agent owes an ack, as
/// `pending_for_me` shows them (conversation messages are its
/// `conversations` and `awaiting_ack`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct PendingAcks {
    /// How many are owed (counting stops at 100: `at_least`).
    pub count: i64,
    pub at_least: bool,
    /// How many of those counted are overdue.
    pub overdue: i64,
    /// The oldest ten, `overdue` marked.
    pub items: Vec<OwedAck>,
}

/// What `pending_for_me` binds as [`messages_i_owe`]'s `$limit`: one more
/// than it counts.
pub(crate) const PENDING_BIND: i64 = PENDING_COUNTED + 1;

/// [`PendingAcks`] in one bounded query.
pub async fn pending(db: impl sqlx::PgExecutor<'_>, me: &Identity) -> BusResult<PendingAcks> {
    let rows: Vec<OwedAck> = sqlx::query_as(messages_i_owe!("false", "$3"))
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(PENDING_BIND)
        .fetch_all(db)
        .await?;
    Ok(PendingAcks::of(rows))
}

impl PendingAcks {
    /// From the rows of [`messages_i_owe`] (not only overdue), oldest first.
    pub(crate) fn of(rows: Vec<OwedAck>) -> Self {
        let at_least = rows.len() as i64 > PENDING_COUNTED;
        let counted = &rows[..rows.len().min(PENDING_COUNTED as usize)];
        PendingAcks {
            count: counted.len() as i64,
            at_least,
            overdue: counted.iter().filter(|r| r.overdue).count() as i64,
            items: counted.iter().take(PENDING_SHOWN).cloned().collect(),
        }
    }
}
