//! Acknowledgements owed (issue 38, item 3; migration 0047): a direct or
//! channel message may ask for an acknowledgement (`post_message
//! {ack_required, ack_within_seconds}`), `ack_message` records it, and
//! `list_owed`, `pending_for_me`, the dashboard and the `ack.overdue`
//! webhook show what is owed.
//!
//! Who owes:
//! - a DM to `agent` or to `agent/window`: that agent, once. The debt is the
//!   agent's (like a DM's read cursor): any of its windows may ack it, and
//!   every window of it lists it in `i_owe`.
//! - a channel message: every agent of the team that existed when it was
//!   posted and is not disabled, except its sender; each once. One agent's
//!   ack clears its own debt only.
//! - a conversation message: its recipients, as its receipts say (every
//!   conversation message is owed, acked per window with `ack_message`);
//!   it has no due time, so it is never overdue.
//!
//! Posting stays one row and one round trip: the debts are never written,
//! they are an anti-join of the team's ack-required messages (a partial
//! index) against `message_acks`, where an ack is one row (a repeat keeps
//! the first). [`owed`] lists them; [`overdue`] fires the webhook and feeds
//! the dashboard.

pub mod overdue;
pub mod owed;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::conversations;
use crate::store::conversations::receipts::{self, Acked};
use crate::store::{fenced, limits};

/// `ack_within_seconds`: ten seconds to seven days.
pub const ACK_WITHIN_MIN: i64 = 10;
pub const ACK_WITHIN_MAX: i64 = 604_800;

/// The acknowledgement a post asks for: `None` none, `Some(None)` one
/// without a due time, `Some(Some(s))` one due within `s` seconds.
pub fn check_request(required: bool, within: Option<i64>) -> BusResult<Option<Option<i32>>> {
    match (required, within) {
        (false, None) => Ok(None),
        (false, Some(_)) => Err(BusError::invalid(
            "ack_within_seconds applies only with ack_required: true (it says when the \
             acknowledgement you ask for is due). Add ack_required: true, or leave \
             ack_within_seconds out. Nothing was posted.",
        )),
        (true, None) => Ok(Some(None)),
        (true, Some(seconds)) => {
            let seconds = limits::within(
                "ack_within_seconds",
                seconds,
                ACK_WITHIN_MIN..=ACK_WITHIN_MAX,
                " (7 days)",
                "Leave it out to ask for an acknowledgement without a due time. Nothing was \
                 posted.",
            )?;
            Ok(Some(Some(seconds as i32)))
        }
    }
}

/// An acknowledgement of a direct or channel message.
#[derive(Clone, Debug, Serialize)]
pub struct MessageAck {
    pub message_id: Uuid,
    /// `dm` or `channel`.
    pub kind: String,
    /// The first acknowledgement's time (a repeat answers it unchanged).
    pub acked_at: DateTime<Utc>,
    /// The window that acknowledged it first.
    pub acked_from: String,
    pub note: Option<String>,
    /// When it was due (absent: no due time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due_at: Option<DateTime<Utc>>,
    /// True when this call found it acknowledged already and changed nothing.
    pub already_acknowledged: bool,
    /// Set when this call's note was not stored (the first ack's note stays).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note_not_kept: Option<String>,
}

/// What `ack_message` answers: a direct or channel message's ack, or a
/// conversation message's receipt.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum AnyAck {
    Message(MessageAck),
    Conversation(Acked),
}

/// `ack_message`: a direct or channel message asking this agent for an
/// acknowledgement, else a conversation message addressed to this window
/// (`receipts::ack_on`). One round trip for the first (`store_message_ack`,
/// migration 0047); a conversation message costs one more. `resolved`
/// applies to conversation messages only (a direct or channel message has
/// no resolved state; it is not looked at there).
pub async fn ack(
    bus: &Bus,
    me: &Identity,
    message_id: Uuid,
    resolved: bool,
    note: Option<String>,
) -> BusResult<AnyAck> {
    let mut conn = bus.pool.acquire().await?;
    ack_on(&mut conn, me, message_id, resolved, note).await
}

/// [`ack`] on `conn`: inside a caller's transaction, the acknowledgement
/// commits with what else it writes (the dashboard's audit row).
pub async fn ack_on(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    message_id: Uuid,
    resolved: bool,
    note: Option<String>,
) -> BusResult<AnyAck> {
    let note = receipts::check_note(
        note,
        "Keep the note to a line; reply with a message for anything longer.",
    )?;
    let (outcome, detail) = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM store_message_ack($1, $2, $3, $4, $5, $6, $7, $8)",
        me,
    )
    .bind(&me.window)
    .bind(message_id)
    .bind(&note)
    .fetch_one(&mut *conn)
    .await?
    .outcome(me)?;
    if outcome == "no_message" {
        if !conversations::enabled(&mut *conn, me).await? {
            return Err(BusError::not_found(format!(
                "no message {message_id} in your team. Use the id read_messages or list_owed \
                 returned."
            )));
        }
        return Ok(AnyAck::Conversation(
            receipts::ack_on(conn, me, message_id, resolved, note).await?,
        ));
    }
    #[derive(serde::Deserialize)]
    struct Stored {
        kind: String,
        first: Option<bool>,
        acked_at: Option<DateTime<Utc>>,
        acked_from: Option<String>,
        note: Option<String>,
        due_at: Option<DateTime<Utc>>,
    }
    let stored: Stored = fenced::detail(detail)?;
    let kind = if stored.kind == "dm" {
        "direct message"
    } else {
        "channel message"
    };
    match outcome.as_str() {
        "not_asked" => {
            return Err(BusError::invalid(format!(
                "{kind} {message_id} does not ask for an acknowledgement (its sender did not \
                 post it with ack_required), so there is nothing to acknowledge; nothing was \
                 recorded. Reply with post_message if you want to answer it."
            )));
        }
        "not_addressed" => {
            return Err(BusError::forbidden(format!(
                "{kind} {message_id} is not owed by you: a direct message is acknowledged by \
                 the agent it was sent to, a channel message by the team's other agents that \
                 existed when it was posted (not its sender). Nothing was recorded. list_owed \
                 shows what you owe."
            )));
        }
        "acked" => {}
        other => {
            return Err(sqlx::Error::Decode(
                format!("store_message_ack answered an unknown outcome {other}").into(),
            )
            .into());
        }
    }
    let (Some(acked_at), Some(acked_from), Some(first)) =
        (stored.acked_at, stored.acked_from, stored.first)
    else {
        return Err(sqlx::Error::Decode("store_message_ack answered no ack".into()).into());
    };
    let note_not_kept = match (&note, &stored.note) {
        (Some(given), kept) if Some(given) != kept.as_ref() => Some(
            "this message was acknowledged already with its own note (or none); an \
             acknowledgement is written once, so yours was not stored. Reply with post_message \
             to add to it."
                .to_owned(),
        ),
        _ => None,
    };
    Ok(AnyAck::Message(MessageAck {
        message_id,
        kind: stored.kind,
        acked_at,
        acked_from,
        note: stored.note,
        due_at: stored.due_at,
        already_acknowledged: !first,
        note_not_kept,
    }))
}

/// `acked` on each message of a page that asks the reader's agent for an
/// acknowledgement: one query, and none for a page without such messages.
pub async fn mark_acked(
    bus: &Bus,
    me: &Identity,
    messages: &mut [crate::store::messaging::messages::MessageView],
) -> BusResult<()> {
    let asked: Vec<Uuid> = messages
        .iter()
        .filter(|m| m.ack_required)
        .map(|m| m.id)
        .collect();
    if asked.is_empty() {
        return Ok(());
    }
    let acked: Vec<Uuid> = sqlx::query_scalar(
        "SELECT message_id FROM message_acks
         WHERE team_id = $1 AND message_id = ANY($2) AND agent_id = $3",
    )
    .bind(me.team_id)
    .bind(&asked)
    .bind(me.agent_id)
    .fetch_all(&bus.pool)
    .await?;
    let me_address = me.agent.as_str();
    for m in messages.iter_mut().filter(|m| m.ack_required) {
        let sent_by_me = m.from == me_address || m.from.starts_with(&format!("{me_address}/"));
        let to_me =
            m.to.as_deref()
                .is_some_and(|to| to == me_address || to.starts_with(&format!("{me_address}/")));
        // Only a message this agent owes (or owed) carries `acked`.
        if (m.channel.is_some() && !sent_by_me) || to_me {
            m.acked = Some(acked.contains(&m.id));
        }
    }
    Ok(())
}
