//! One inbox reference as `fetch_conversation_inbox` hands it out: what the
//! server answers and what the agent side keeps in its spool, one shape.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

crate::text_enum! {
    /// What an inbox reference is about (stored as text in
    /// `inbox_references.kind`).
    pub enum InboxKind {
        /// A message for the window.
        Message = "message",
        /// The window's own message was acknowledged (or resolved).
        Receipt = "receipt",
    }
}

/// One reference handed to a window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InboxReference {
    /// Pass to `confirm_inbox_delivery` once the reference reached you.
    pub delivery_id: Uuid,
    pub kind: InboxKind,
    pub conversation_id: Uuid,
    pub message_id: Uuid,
    pub seq: i64,
    /// message: the sender; receipt: who acknowledged.
    pub from: String,
    /// receipt: `acknowledged` or `resolved`.
    #[serde(default)]
    pub receipt: Option<String>,
    pub queued_at: DateTime<Utc>,
}
