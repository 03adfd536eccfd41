//! Receipts: the five facts per (message, recipient seat), `ack_message`,
//! `get_message_receipts`, and `wait_for_conversation_updates`.
//!
//! Each fact is a timestamp written once (COALESCE) by whoever observed it;
//! `resolved` implies `acknowledged`. The recipient list was frozen at send,
//! so the denominator (`total`) is the receipt rows of the message: a member
//! added later is not owed it and is never counted.
//!
//! An ack touches one receipt row and nothing else, so it takes no
//! conversation lock: a single row lock, last in the lock order, cannot
//! deadlock with a writer holding the conversation row.
//!
//! The conversation wait is the long poll of `long_poll.rs`: subscribe to
//! the event hub first, then check the database, then block, re-checking on
//! a timer so a lost notification only delays a wake.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::EventKind;
use crate::store::conversations::messages::{conversation_of, message_not_found};
use crate::store::conversations::{self, ReadAccess};
use crate::store::fenced;
use crate::store::long_poll::{Rechecked, Waited, answer_if_still_valid, recheck_until};
use crate::store::requests::Writer;

pub const NOTE_MAX_BYTES: usize = 1024;

/// One recipient's receipt.
#[derive(Clone, Debug, Serialize, serde::Deserialize, sqlx::FromRow)]
pub struct Receipt {
    /// The recipient window's address.
    pub recipient: String,
    pub stored_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub presented_at: Option<DateTime<Utc>>,
    pub acknowledged_at: Option<DateTime<Utc>>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub note: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Acked {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    pub receipt: Receipt,
    /// Set when this call's note was not stored because the receipt already
    /// holds one (a note, like every fact, is written once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note_not_kept: Option<String>,
}

/// The note an acknowledgement carries (of a conversation message, or of a
/// direct or channel message), checked by `messaging::acks::ack_on` for
/// both: one line, at most 1 KiB; empty is none. `hint` ends the refusal of
/// a longer one.
pub(crate) fn check_note(note: Option<String>, hint: &str) -> BusResult<Option<String>> {
    let note = note
        .map(|n| crate::store::text::one_line("acknowledgement note", &n))
        .transpose()?
        .filter(|n| !n.is_empty());
    if let Some(note) = &note {
        crate::store::limits::bytes_at_most(note.len(), NOTE_MAX_BYTES, "the note", hint)?;
    }
    Ok(note)
}

/// `ack_message`: the recipient seat acknowledges (and with `resolved`,
/// resolves) a message. Each timestamp is written once; a repeat keeps the
/// first time. Audited. One round trip: `store_ack` (migration 0033) runs
/// the write fence, finds the recipient seat, writes the receipt, queues the
/// sender's receipt reference on a broker conversation and the audit row.
/// Reached through `messaging::acks::ack_on`, on its `conn`: inside a
/// caller's transaction, the acknowledgement commits with what else it
/// writes (the dashboard's audit row). That caller has checked the note
/// ([`check_note`]) before it knew which kind of message it acknowledges.
pub(crate) async fn ack_on(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    message_id: Uuid,
    resolved: bool,
    note: Option<String>,
) -> BusResult<Acked> {
    #[derive(serde::Deserialize)]
    struct Stored {
        conversation_id: Option<Uuid>,
        seq: Option<i64>,
        receipt: Option<Receipt>,
    }
    let (outcome, detail) = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM store_ack($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        me,
    )
    .bind(&me.window)
    .bind(bare_label(me))
    .bind(message_id)
    .bind(resolved)
    .bind(&note)
    .bind(me.address())
    .fetch_one(conn)
    .await?
    .outcome(me)?;
    let stored: Stored = fenced::detail(detail)?;
    let (Some(conversation_id), Some(seq), Some(receipt)) =
        (stored.conversation_id, stored.seq, stored.receipt)
    else {
        return Err(recipient_refusal(
            me,
            &outcome,
            message_id,
            stored.conversation_id,
        ));
    };
    let note_not_kept = match (&note, &receipt.note) {
        (Some(given), Some(kept)) if given != kept => Some(
            "this receipt already holds a note (a note is written once, like every fact); \
             yours was not stored and `receipt.note` shows the kept one. Reply with \
             send_conversation_message to add to it."
                .to_owned(),
        ),
        _ => None,
    };
    Ok(Acked {
        message_id,
        conversation_id,
        seq,
        receipt,
        note_not_kept,
    })
}

/// Whether the caller is a bare agent token wearing a window label: such a
/// token is refused a registered window's conversations.
fn bare_label(me: &Identity) -> bool {
    me.session_credential.is_none() && !me.window.is_empty()
}

/// The words for a code of `conversation_recipient_seat` (migration 0033):
/// the same refusal for a message this window cannot see as for one that
/// does not exist.
fn recipient_refusal(
    me: &Identity,
    code: &str,
    message_id: Uuid,
    conversation_id: Option<Uuid>,
) -> BusError {
    match (code, conversation_id) {
        ("borrowed", _) => conversations::borrowed_label(me),
        ("invited", Some(conversation_id)) => conversations::invited_not_joined(conversation_id),
        ("not_a_recipient", _) => not_a_recipient(message_id),
        _ => message_not_found(message_id),
    }
}

/// How many messages one `mark_presented` call may name.
pub const PRESENTED_MAX_IDS: usize = 100;

/// One message whose receipt holds `presented`.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct PresentedMessage {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    /// The first time it was recorded (a repeat keeps it).
    pub presented_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Presented {
    pub messages: Vec<PresentedMessage>,
}

/// `mark_presented`: the client says it put these messages in front of the
/// model. Only the client can know that, so only this call writes the fact
/// (never a read, a fetch or a delivery). All or nothing: one id this window
/// is not a recipient of refuses the call and records none. One round trip:
/// `store_presented` (migration 0033).
pub async fn present(w: &mut Writer, me: &Identity, message_ids: &[Uuid]) -> BusResult<Presented> {
    if message_ids.is_empty() || message_ids.len() > PRESENTED_MAX_IDS {
        return Err(BusError::invalid(format!(
            "message_ids must name 1 to {PRESENTED_MAX_IDS} messages; it names {}. Record the \
             messages shown in one call per {PRESENTED_MAX_IDS}.",
            message_ids.len()
        )));
    }
    let mut ids = message_ids.to_vec();
    // Sorted ids: two calls naming the same receipts lock them in one order.
    ids.sort();
    ids.dedup();
    let (outcome, detail) = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM store_presented($1, $2, $3, $4, $5, $6, $7, $8)",
        me,
    )
    .bind(&me.window)
    .bind(bare_label(me))
    .bind(&ids)
    .fetch_one(w.conn())
    .await?
    .outcome(me)?;
    if outcome == "presented" {
        return Ok(Presented {
            messages: fenced::detail(detail)?,
        });
    }
    #[derive(serde::Deserialize)]
    struct Refused {
        message_id: Uuid,
        conversation_id: Option<Uuid>,
    }
    let refused: Refused = fenced::detail(detail)?;
    Err(recipient_refusal(
        me,
        &outcome,
        refused.message_id,
        refused.conversation_id,
    ))
}

fn not_a_recipient(message_id: Uuid) -> BusError {
    BusError::forbidden(format!(
        "this window is not a recipient of message {message_id}: recipients are frozen when a \
         message is sent (the active members then, other than the sender), and only they \
         acknowledge it. get_message_receipts shows who they are."
    ))
}

#[derive(Clone, Debug, Serialize)]
pub struct Receipts {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    /// The frozen recipient count: the denominator of every count below.
    pub total: i64,
    pub stored: i64,
    pub delivered: i64,
    pub presented: i64,
    pub acknowledged: i64,
    pub resolved: i64,
    pub recipients: Vec<Receipt>,
}

/// `get_message_receipts`: for the window that sent the message, or an
/// active member who may read it.
pub async fn receipts(bus: &Bus, me: &Identity, message_id: Uuid) -> BusResult<Receipts> {
    let mut conn = bus.pool.acquire().await?;
    conversations::refuse_borrowed_label(&mut conn, me).await?;
    let (conversation_id, seq, sent_it) = conversation_of(&mut conn, me, message_id).await?;
    // The sending window sees its receipts even after leaving; a sibling
    // window of the same agent is just another window.
    if !sent_it {
        let conversation = conversations::load(&mut conn, me, conversation_id, false)
            .await
            .map_err(|_| message_not_found(message_id))?;
        match conversations::read_access(&mut conn, me, &conversation).await {
            Err(BusError::NotFound(_)) => return Err(message_not_found(message_id)),
            Err(other) => return Err(other),
            Ok(ReadAccess::Member(seat)) if seq >= seat.history_from_seq => {}
            Ok(ReadAccess::Member(_)) => return Err(message_not_found(message_id)),
            Ok(ReadAccess::ProjectGrant) => {
                return Err(BusError::forbidden(format!(
                    "receipts of message {message_id} are shown to its sender and the \
                     conversation's members; your project grant lets you read the message, not \
                     its receipts."
                )));
            }
        }
    }
    let recipients = receipts_of(&mut conn, me, message_id).await?;
    let count = |fact: fn(&Receipt) -> bool| recipients.iter().filter(|r| fact(r)).count() as i64;
    Ok(Receipts {
        message_id,
        conversation_id,
        seq,
        total: recipients.len() as i64,
        stored: count(|r| r.stored_at.is_some()),
        delivered: count(|r| r.delivered_at.is_some()),
        presented: count(|r| r.presented_at.is_some()),
        acknowledged: count(|r| r.acknowledged_at.is_some()),
        resolved: count(|r| r.resolved_at.is_some()),
        recipients,
    })
}

/// The receipts of a message, one per frozen recipient seat, by address.
pub(crate) async fn receipts_of(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    message_id: Uuid,
) -> BusResult<Vec<Receipt>> {
    Ok(sqlx::query_as(
        "SELECT CASE WHEN r.recipient_session = '' THEN a.name
                     ELSE a.name || '/' || r.recipient_session END AS recipient,
                r.stored_at, r.delivered_at, r.presented_at, r.acknowledged_at, r.resolved_at,
                r.ack_note AS note
         FROM message_receipts r JOIN agents a ON a.team_id = r.team_id AND a.id = r.recipient_id
         WHERE r.team_id = $1 AND r.message_id = $2
         ORDER BY 1",
    )
    .bind(me.team_id)
    .bind(message_id)
    .fetch_all(conn)
    .await?)
}

/// A conversation with messages owed an acknowledgement by this window.
#[derive(Clone, Debug, Serialize, Deserialize, sqlx::FromRow)]
pub struct Pending {
    pub conversation_id: Uuid,
    pub title: String,
    /// Stored messages addressed to this seat, not yet acknowledged.
    pub unacknowledged: i64,
    /// The conversation's latest seq.
    pub latest_seq: i64,
    /// The oldest unacknowledged seq: read from just before it.
    pub first_unacknowledged_seq: i64,
}

/// What `wait_for_conversation_updates` found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Conversations {
    pub conversations: Vec<Pending>,
}

/// `wait_for_conversation_updates`'s answer.
pub type ConversationWait = Waited<Conversations>;

/// [`owed_acknowledgements`]'s statement: the conversations where this
/// window owes acknowledgements, the one with the oldest owed message first
/// (`first_sent_at`, not a field of [`Pending`]), cut at `$limit` (a
/// placeholder such as `"$4"`). Binds: $1 team, $2 agent, $3 window.
macro_rules! owed_conversations {
    ($limit:literal) => {
        concat!(
            "SELECT c.id AS conversation_id, c.title, count(*) AS unacknowledged,
                    c.last_seq AS latest_seq, min(m.seq) AS first_unacknowledged_seq,
                    min(m.created_at) AS first_sent_at
             FROM conversation_members s
             JOIN message_receipts r ON r.team_id = s.team_id AND r.member_id = s.id
             JOIN conversation_messages m ON m.team_id = r.team_id AND m.id = r.message_id
             JOIN conversations c ON c.team_id = s.team_id AND c.id = s.conversation_id
             WHERE s.team_id = $1 AND s.agent_id = $2 AND s.session = $3 AND s.state = 'active'
               AND r.acknowledged_at IS NULL AND r.stored_at IS NOT NULL
             GROUP BY c.id, c.title, c.last_seq
             ORDER BY min(m.created_at) LIMIT ",
            $limit
        )
    };
}
pub(crate) use owed_conversations;

/// What this window owes: per conversation where it holds an active seat,
/// its stored, unacknowledged receipts, oldest first (the first `limit`;
/// `None`: all).
pub async fn owed_acknowledgements(
    bus: &Bus,
    me: &Identity,
    limit: impl Into<Option<i64>>,
) -> BusResult<Vec<Pending>> {
    Ok(sqlx::query_as(owed_conversations!("$4"))
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(limit.into())
        .fetch_all(&bus.pool)
        .await?)
}

/// `wait_for_conversation_updates`: returns at once when this window owes
/// acknowledgements, else blocks until a send addressed to it commits, or
/// the timeout. Like `wait_for_updates`, it answers only if the caller's
/// credential still holds when it wakes.
pub async fn wait_for_conversation_updates(
    bus: &Bus,
    me: &Identity,
    timeout: Duration,
) -> BusResult<ConversationWait> {
    // No answer for a credential taken away while the call waited.
    answer_if_still_valid(bus, me, async {
        // Membership decides who a send is for, and only the database knows it:
        // any send by someone else in this team is worth a look.
        let mut events = {
            let (agent, window) = (me.agent_id, me.window.clone());
            bus.events.wait_for(
                me.team_id,
                Box::new(move |event| {
                    event.kind == EventKind::Conversation
                        && !(event.actor == Some(agent)
                            && event.actor_session.as_deref() == Some(window.as_str()))
                }),
            )
        };
        {
            let mut conn = bus.pool.acquire().await?;
            conversations::refuse_borrowed_label(&mut conn, me).await?;
        }
        let deadline = Instant::now() + timeout;
        let owed = recheck_until(&mut events, bus, deadline, || async move {
            let owed = owed_acknowledgements(bus, me, None).await?;
            Ok((!owed.is_empty()).then_some(owed))
        })
        .await?;
        let owed = match owed {
            Rechecked::Found(owed) => owed,
            Rechecked::TimedOut => return Ok(ConversationWait::timed_out()),
            Rechecked::Stopping => {
                return Ok(ConversationWait::restarting(
                    "wait_for_conversation_updates",
                ));
            }
        };
        Ok(ConversationWait::woke(Conversations {
            conversations: owed,
        }))
    })
    .await
}
