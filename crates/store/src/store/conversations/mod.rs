//! Conversations: threads with explicit members per window, a gap-free
//! sequence, and per-recipient receipts.
//!
//! This module holds the conversation and membership model and the access rules
//! every conversation tool goes through:
//!
//! - A conversation the caller may not see answers "not found", the same
//!   answer a foreign team's id gets, so existence cannot be probed.
//! - `private`: only members see it. `project`: members, plus read access for
//!   agents holding the project grant.
//! - An invitation is not membership: reading (as a member) and sending need
//!   the seat `active`. A seat reads from its `history_from_seq`.
//! - A label registered as an authenticated window cannot be worn by the bare
//!   agent token for private conversation data: that window's data is reached
//!   with its session credential.
//!
//! Lock order for every writer: the conversation row first (`FOR UPDATE`, or
//! the send's update that allocates the sequence), then member rows, then messages and receipts.
//!
//! Membership changes (create, invite and role changes, join, leave, remove,
//! archive, transfer) are each one transaction that takes the conversation row
//! `FOR UPDATE` first, then the seats it touches in id order, validates,
//! writes, and records its `conversation_audit` row before committing. Because
//! every writer queues on the conversation row, concurrent invites, removals
//! and role changes serialise instead of deadlocking, and the member cap is
//! counted under that lock. Recovery only reads (its one write is its audit row).
//!
//! Visibility is the same rule as reading: a window sees a conversation when it
//! holds an invited or active seat in it, or (project conversations) when its
//! agent holds the project grant. Anything else answers [`not_found`], exactly
//! like a foreign team's id.
//!
//! The files:
//!
//! - `mod.rs`: the capability gate, the model (a conversation, a seat, the
//!   view one window gets, what a membership call did) and the audit row.
//! - `access.rs`: who may see and read a conversation, and who may manage it.
//! - `seats.rs`: seats as a membership change locks them, the windows they
//!   belong to, and the member cap.
//! - `lifecycle.rs`: create, list and archive; titles.
//! - `membership.rs`: invite (and role changes), join, leave, remove.
//! - `transfer.rs`: moving a seat to another window of the same agent.
//! - `recovery.rs`: read-only history for an agent whose windows are all gone.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::auth::Identity;
use crate::backend::BackendKind;
use crate::error::{BusError, BusResult};

mod access;
pub mod inbox;
mod lifecycle;
mod membership;
pub mod messages;
pub mod operator;
pub mod projects;
pub mod receipts;
mod recovery;
mod seats;
mod transfer;

pub use access::{ReadAccess, not_found};
pub(crate) use access::{
    borrowed_label, invited_not_joined, read_access, refuse_borrowed_label, registered_window,
};
pub use lifecycle::{Placement, TITLE_MAX_BYTES, archive, check_title, create, list};
pub use membership::{INVITE_ROLES, invite, join, leave, remove};
pub use recovery::{
    EntitledRange, RECOVER_PAGE_DEFAULT, RECOVER_PAGE_MAX, RecoveredMessage, Recovery, recover,
};
pub use seats::MEMBERS_MAX;
pub use transfer::transfer;

/// The conversation tools: hidden from `tools/list` and refused per call while
/// the team's `conversations` capability is off. Not `ack_message`, which also
/// acknowledges direct and channel messages (`messaging::acks`; it refuses a
/// conversation message itself while the capability is off).
pub const TOOLS: &[&str] = &[
    "create_project",
    "list_projects",
    "grant_project_access",
    "create_conversation",
    "list_conversations",
    "invite_to_conversation",
    "join_conversation",
    "leave_conversation",
    "remove_conversation_member",
    "archive_conversation",
    "transfer_membership",
    "send_conversation_message",
    "read_conversation",
    "get_conversation_message",
    "get_message_receipts",
    "fetch_conversation_inbox",
    "confirm_inbox_delivery",
    "conversation_inbox_status",
    "wait_for_conversation_updates",
    "recover_conversation_history",
];

/// Whether the caller's team has conversations on.
pub async fn enabled(db: impl sqlx::PgExecutor<'_>, me: &Identity) -> BusResult<bool> {
    Ok(
        sqlx::query_scalar("SELECT conversations_enabled FROM teams WHERE id = $1")
            .bind(me.team_id)
            .fetch_one(db)
            .await?,
    )
}

/// The refusal for a conversation tool while the capability is off.
pub fn disabled_error(me: &Identity) -> BusError {
    BusError::forbidden(format!(
        "conversations are off for team `{}`. An operator turns them on with `ai-crew-sync team \
         capability --team {} --conversations on`.",
        me.team, me.team
    ))
}

/// Who sees a conversation, stored as `conversations.visibility` (a text
/// domain). Chosen at creation ([`Placement`]); it never changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Visibility {
    /// Members only.
    Private,
    /// Members, plus read access for agents holding the project's grant.
    Project,
}

acs_wire::text_enum! {
    /// A seat's role, stored as text in `conversation_members.role`.
    pub enum SeatRole {
        /// The creator's seat (or a seat transferred from one); never handed out.
        Owner = "owner",
        Moderator = "moderator",
        Participant = "participant",
        /// Reads, never sends.
        Observer = "observer",
    }
}
crate::text_column!(SeatRole);

impl SeatRole {
    /// Owners and moderators invite, remove, change roles and archive (with
    /// an active seat).
    pub fn manages(self) -> bool {
        match self {
            SeatRole::Owner | SeatRole::Moderator => true,
            SeatRole::Participant | SeatRole::Observer => false,
        }
    }

    /// Every role but observer sends (with an active seat).
    pub fn sends(self) -> bool {
        match self {
            SeatRole::Owner | SeatRole::Moderator | SeatRole::Participant => true,
            SeatRole::Observer => false,
        }
    }
}

acs_wire::text_enum! {
    /// A seat's state, stored as text in `conversation_members.state`.
    pub enum SeatState {
        /// Invited, not joined: sees the conversation, reads and sends nothing.
        Invited = "invited",
        /// A member: reads from its history boundary and (unless observer) sends.
        Active = "active",
        /// Left, declined, or superseded by a transfer.
        Left = "left",
        /// Removed by an owner or moderator; comes back only when re-admitted.
        Removed = "removed",
    }
}
crate::text_column!(SeatState);

impl SeatState {
    /// Invited or active: the seat makes the conversation visible and counts
    /// toward the member cap.
    pub fn holds(self) -> bool {
        match self {
            SeatState::Invited | SeatState::Active => true,
            SeatState::Left | SeatState::Removed => false,
        }
    }
}

acs_wire::text_enum! {
    /// How a conversation's bodies reach their backend, stored as
    /// `conversations.publication` (a text domain).
    pub enum Publication {
        /// Body, recipients and receipts commit in the send's transaction.
        Sync = "sync",
        /// The send enqueues an outbox slot; a worker publishes it later.
        Outbox = "outbox",
    }
}
crate::text_column!(Publication);

impl Publication {
    /// An operator's `sync` or `outbox` (any case, trimmed).
    pub fn parse(raw: &str) -> BusResult<Publication> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "sync" => Ok(Publication::Sync),
            "outbox" => Ok(Publication::Outbox),
            _ => Err(BusError::invalid(format!(
                "publication {} is not a mode: use `sync` (the body commits with the send; \
                 postgres conversations only) or `outbox` (a worker publishes the body after \
                 the send).",
                super::text::quote(raw)
            ))),
        }
    }

    /// The mode a conversation on `backend` is created with, and a move to
    /// `backend` cuts over to: bodies off PostgreSQL go through the outbox.
    pub fn for_backend(backend: BackendKind) -> Publication {
        match backend {
            BackendKind::Postgres => Publication::Sync,
            BackendKind::Jetstream => Publication::Outbox,
        }
    }
}

acs_wire::text_enum! {
    /// Where a message's body stands, stored as
    /// `conversation_messages.publication_state` (a text domain).
    pub enum PublicationState {
        /// Accepted, and its outbox slot not yet confirmed by the backend.
        PendingPublication = "pending_publication",
        /// The authoritative backend holds the body.
        Stored = "stored",
        /// The backend refused the body for good.
        Failed = "failed",
    }
}
crate::text_column!(PublicationState);

/// A conversation row as the access rules need it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Conversation {
    pub id: Uuid,
    pub title: String,
    pub visibility: Visibility,
    pub project_id: Option<Uuid>,
    pub project: Option<String>,
    pub last_seq: i64,
    pub backend: BackendKind,
    pub publication: Publication,
    pub write_paused_at: Option<DateTime<Utc>>,
    pub archived_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// One window's seat in a conversation.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Seat {
    pub id: Uuid,
    pub role: SeatRole,
    pub state: SeatState,
    pub history_from_seq: i64,
    pub transfer_to_session: Option<String>,
    pub superseded_by: Option<Uuid>,
}

impl Seat {
    pub fn is_active(&self) -> bool {
        self.state == SeatState::Active
    }
}

/// The columns of a [`Conversation`], over `conversations c`.
macro_rules! conversation_select {
    () => {
        "SELECT c.id, c.title, c.visibility, c.project_id, p.name AS project, c.last_seq, c.backend,
                c.publication, c.write_paused_at, c.archived_at, c.created_at
         FROM conversations c LEFT JOIN projects p ON p.team_id = c.team_id AND p.id = c.project_id"
    };
}

/// The conversation `id` of the caller's team, locked `FOR UPDATE` when
/// `for_update` (every writer takes this lock first). Not found otherwise.
pub(crate) async fn load(
    conn: &mut PgConnection,
    me: &Identity,
    id: Uuid,
    for_update: bool,
) -> BusResult<Conversation> {
    let sql = if for_update {
        concat!(
            conversation_select!(),
            " WHERE c.team_id = $1 AND c.id = $2 FOR UPDATE OF c"
        )
    } else {
        concat!(
            conversation_select!(),
            " WHERE c.team_id = $1 AND c.id = $2"
        )
    };
    sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| not_found(id))
}

/// A conversation as one window sees it, with that window's seat.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ConversationView {
    pub id: Uuid,
    pub title: String,
    pub visibility: Visibility,
    pub project: Option<String>,
    pub last_seq: i64,
    pub backend: BackendKind,
    pub publication: Publication,
    pub write_paused_at: Option<DateTime<Utc>>,
    pub archived_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// `member` (active seat), `invited` (join first), or `project_grant`
    /// (no seat; reads through the agent's project grant).
    pub access: String,
    /// This window's seat, when it has one.
    pub role: Option<SeatRole>,
    pub state: Option<SeatState>,
    pub history_from_seq: Option<i64>,
    /// A proposed transfer of this seat, waiting for that window to join.
    pub transfer_to_session: Option<String>,
    /// Invited plus active seats (the member cap counts these).
    pub members: i64,
}

/// The columns of a [`ConversationView`] for window ($2 agent, $3 session) of
/// team $1, restricted to what that window may see.
macro_rules! view_select {
    () => {
        "SELECT c.id, c.title, c.visibility, p.name AS project, c.last_seq, c.backend,
                c.publication, c.write_paused_at, c.archived_at, c.created_at,
                CASE m.state WHEN 'active' THEN 'member' WHEN 'invited' THEN 'invited'
                             ELSE 'project_grant' END AS access,
                m.role, m.state, m.history_from_seq, m.transfer_to_session,
                (SELECT count(*) FROM conversation_members x
                 WHERE x.team_id = c.team_id AND x.conversation_id = c.id
                   AND x.state IN ('invited', 'active')) AS members
         FROM conversations c
         LEFT JOIN projects p ON p.team_id = c.team_id AND p.id = c.project_id
         LEFT JOIN conversation_members m
                ON m.team_id = c.team_id AND m.conversation_id = c.id AND m.agent_id = $2
               AND m.session = $3 AND m.state IN ('invited', 'active')
         WHERE c.team_id = $1
           AND (m.id IS NOT NULL
                OR EXISTS (SELECT 1 FROM project_grants g
                           WHERE g.team_id = c.team_id AND g.project_id = c.project_id
                             AND g.agent_id = $2))"
    };
}
// Path-scoped, so `lifecycle.rs` (`list`) can use it too.
use view_select;

/// What a membership call did to one seat.
#[derive(Clone, Debug, Serialize)]
pub struct Membership {
    pub conversation_id: Uuid,
    /// The seat's window: `agent` or `agent/window`.
    pub address: String,
    pub role: SeatRole,
    pub state: SeatState,
    pub history_from_seq: i64,
    /// `invited`, `reinvited`, `readmitted`, `role_changed`, `joined`,
    /// `transferred`, `transfer_proposed`, `left`, `declined`, `removed` or
    /// `unchanged`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One conversation as this window sees it (not found when it may not).
async fn view(conn: &mut PgConnection, me: &Identity, id: Uuid) -> BusResult<ConversationView> {
    sqlx::query_as(concat!(view_select!(), " AND c.id = $4"))
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| not_found(id))
}

/// [`audit`] of what the caller did with its own seat of conversation `id`:
/// the subject is the caller's address.
pub(crate) async fn audit_own(
    conn: &mut PgConnection,
    me: &Identity,
    id: Uuid,
    action: &str,
    detail: Value,
) -> BusResult<()> {
    audit(conn, me, Some(id), action, &me.address(), detail).await
}

/// One row of the conversation audit log, in the caller's transaction. Never a body.
pub(crate) async fn audit(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Option<Uuid>,
    action: &str,
    subject: &str,
    detail: Value,
) -> BusResult<()> {
    sqlx::query(
        "INSERT INTO conversation_audit (team_id, conversation_id, actor_id, actor_session, action, subject, detail)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(me.team_id)
    .bind(conversation_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(action)
    .bind(subject)
    .bind(detail)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Publication, PublicationState, SeatRole, SeatState, Visibility};

    /// The JSON answers, `as_str` (refusal wording) and the database (the
    /// same `snake_case` rename) spell every variant the same way.
    #[test]
    fn states_spell_as_stored() {
        for role in [
            SeatRole::Owner,
            SeatRole::Moderator,
            SeatRole::Participant,
            SeatRole::Observer,
        ] {
            assert_eq!(serde_json::to_value(role).unwrap(), role.as_str());
        }
        for state in [
            SeatState::Invited,
            SeatState::Active,
            SeatState::Left,
            SeatState::Removed,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        assert_eq!(
            serde_json::to_value([Visibility::Private, Visibility::Project]).unwrap(),
            serde_json::json!(["private", "project"])
        );
        for mode in [Publication::Sync, Publication::Outbox] {
            assert_eq!(serde_json::to_value(mode).unwrap(), mode.as_str());
            assert_eq!(Publication::parse(mode.as_str()).unwrap(), mode);
        }
        for state in [
            PublicationState::PendingPublication,
            PublicationState::Stored,
            PublicationState::Failed,
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        assert_eq!(format!("{:<6}|", Publication::Sync), "sync  |");
    }
}
