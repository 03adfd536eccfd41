//! Conversation messages: `send_conversation_message`, `read_conversation`
//! and `get_conversation_message`, on the synchronous path (every body lives
//! in PostgreSQL, so `stored` is true because the send committed) and into the
//! outbox (accepted now, stored when the backend confirms).
//!
//! A send is one transaction in the lock order every conversation writer
//! follows: the write fence (`agent_write_refusal`, the guard's shared lock
//! on the agent), then the conversation row (it is the sequence allocator, so
//! sequence numbers are gap-free and commit in order), then the seats it
//! reads, then the message and its receipts. The recipient list is frozen
//! there: the active seats other than the sender's (in a project
//! conversation, only agents still holding the grant), one receipt row each.
//!
//! That transaction is one round trip: the statements run server-side in
//! `store_conversation_message` (migrations 0014, 0016, 0034), which checks
//! the team's quota, stores only a send nothing stands in the way of and
//! otherwise declines, writing nothing. Why it declined (and every refusal's
//! wording) is worked out here, in Rust, the way every other writer starts:
//! see [`explain_unstored`].
//!
//! `request_id` makes a send safe to retry: the unique key (conversation,
//! sender, request_id) is checked under the conversation lock, so two
//! concurrent retries queue on it and the second gets the first's message
//! instead of storing the body twice.
//!
//! Reading never writes a receipt; receipts are in `receipts.rs`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::backend::{BackendKind, Locator, MessagingBackend};
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};
use crate::store::conversations::{self, Conversation, Publication, PublicationState, ReadAccess};
use crate::store::messaging::messages::{check_body, check_limit, normalize_metadata};
use crate::store::{
    conversations::projects, delivery::lost_bodies, delivery::outbox, identity::sessions,
};

/// What `send_conversation_message` was asked to do.
#[derive(Clone, Debug)]
pub struct NewConversationMessage {
    pub conversation_id: Uuid,
    pub body: String,
    /// A UUID from the caller: the same id is the same send.
    pub request_id: String,
    pub reply_to: Option<Uuid>,
    pub metadata: Option<Value>,
}

/// The answer to a send (or to its retry).
#[derive(Clone, Debug, Serialize)]
pub struct Sent {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    /// True when the authoritative backend holds the body (on the Postgres
    /// path: the send committed).
    pub stored: bool,
    pub publication: PublicationState,
    /// The frozen recipient list, as addresses.
    pub recipients: Vec<String>,
    pub created_at: DateTime<Utc>,
    /// True when this answer is an earlier send with the same request_id:
    /// nothing new was stored.
    pub replayed: bool,
}

/// This seat's receipt for a message, when it is a recipient.
#[derive(Clone, Debug, Serialize)]
pub struct MyReceipt {
    pub stored_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub presented_at: Option<DateTime<Utc>>,
    pub acknowledged_at: Option<DateTime<Utc>>,
    pub resolved_at: Option<DateTime<Utc>>,
}

/// Why a body cannot be shown, in a word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnavailableReason {
    /// Not confirmed by its backend yet.
    PendingPublication,
    /// Its publication failed for good.
    Failed,
    /// An operator removed it.
    Tombstoned,
    /// Its backend did not answer for it now.
    Unreachable,
}

/// Why a body cannot be shown.
#[derive(Clone, Debug, Serialize)]
pub struct Unavailable {
    pub reason: UnavailableReason,
    /// The tombstone's reason, or what to do.
    pub detail: String,
}

/// One message slot as a reader sees it.
#[derive(Clone, Debug, Serialize)]
pub struct ConversationMessage {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    /// The sender's address.
    pub from: String,
    /// Null when `unavailable` says why.
    pub body: Option<String>,
    pub reply_to: Option<Uuid>,
    pub metadata: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub my_receipt: Option<MyReceipt>,
    pub publication: PublicationState,
    pub unavailable: Option<Unavailable>,
}

#[derive(sqlx::FromRow)]
struct MessageRow {
    id: Uuid,
    team_id: Uuid,
    conversation_id: Uuid,
    seq: i64,
    from: String,
    body: String,
    reply_to: Option<Uuid>,
    metadata: Option<Value>,
    created_at: DateTime<Utc>,
    publication_state: PublicationState,
    tombstone_reason: Option<String>,
    backend: BackendKind,
    canonical_locator: Option<String>,
    body_sha256: Vec<u8>,
    uncertain: bool,
    /// A released body whose locator was written under another identity of
    /// its stream than the one recorded now: see `lost_bodies`.
    stream_replaced: bool,
    has_receipt: bool,
    stored_at: Option<DateTime<Utc>>,
    delivered_at: Option<DateTime<Utc>>,
    presented_at: Option<DateTime<Utc>>,
    acknowledged_at: Option<DateTime<Utc>>,
    resolved_at: Option<DateTime<Utc>>,
}

/// The columns of a [`MessageRow`] over `conversation_messages m`; `$3` is
/// the reading seat's id (NULL for a reader without a seat).
macro_rules! message_select {
    () => {
        "SELECT m.id, m.team_id, m.conversation_id, m.seq,
                CASE WHEN m.sender_session = '' THEN a.name ELSE a.name || '/' || m.sender_session END AS from,
                m.body, m.reply_to, m.metadata, m.created_at, m.publication_state, m.tombstone_reason,
                m.backend, m.canonical_locator, m.body_sha256, m.uncertain_at IS NOT NULL AS uncertain,
                m.body = '' AND COALESCE(m.stream_created_at <> (
                    SELECT s.created_at_broker FROM team_streams s
                     WHERE s.team_id = m.team_id
                       AND s.stream = split_part(m.canonical_locator, ':', 2)), false)
                    AS stream_replaced,
                r.message_id IS NOT NULL AS has_receipt, r.stored_at, r.delivered_at, r.presented_at,
                r.acknowledged_at, r.resolved_at
         FROM conversation_messages m
         JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
         LEFT JOIN message_receipts r
                ON r.team_id = m.team_id AND r.message_id = m.id AND r.member_id = $3"
    };
}

impl From<MessageRow> for ConversationMessage {
    fn from(row: MessageRow) -> ConversationMessage {
        let unavailable = if let Some(reason) = row.tombstone_reason {
            Some(Unavailable {
                reason: UnavailableReason::Tombstoned,
                detail: reason,
            })
        } else {
            match row.publication_state {
                PublicationState::PendingPublication => Some(Unavailable {
                    reason: UnavailableReason::PendingPublication,
                    detail: if row.uncertain {
                        "the last publish ended without an answer; the bus is asking the backend \
                         whether it holds the body. Read again shortly."
                    } else {
                        "the body is not confirmed by its backend yet; read again shortly."
                    }
                    .into(),
                }),
                PublicationState::Failed => Some(Unavailable {
                    reason: UnavailableReason::Failed,
                    detail: if row.uncertain {
                        // Given up after attempts nobody answered: not a
                        // refusal, and a resend could store it twice.
                        "the backend never answered the publishes of this body and the bus gave \
                         up; whether it holds it is not known. An operator publishes it again \
                         with `conversations retry` once the broker answers (sent again instead, \
                         it would be stored twice if the backend did keep it)."
                    } else {
                        "the backend refused this body for good; the sender may send it again."
                    }
                    .into(),
                }),
                PublicationState::Stored => None,
            }
        };
        let my_receipt = row.has_receipt.then_some(MyReceipt {
            stored_at: row.stored_at,
            delivered_at: row.delivered_at,
            presented_at: row.presented_at,
            acknowledged_at: row.acknowledged_at,
            resolved_at: row.resolved_at,
        });
        ConversationMessage {
            message_id: row.id,
            conversation_id: row.conversation_id,
            seq: row.seq,
            from: row.from,
            body: unavailable.is_none().then_some(row.body),
            reply_to: row.reply_to,
            metadata: row.metadata,
            created_at: row.created_at,
            my_receipt,
            publication: row.publication_state,
            unavailable,
        }
    }
}

mod read;
mod send;

pub(crate) use read::conversation_of;
pub use read::{ReadPage, ReadRequest, get, message_not_found, read};
pub use send::send;
