//! Conversations: threads with explicit members per window, a gap-free
//! sequence, and per-recipient receipts.
//!
//! This file holds the conversation and membership model and the access rules
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
//! Lock order for every writer: the conversation row first (`FOR UPDATE`; it
//! also allocates the sequence), then member rows, then messages and receipts.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::auth::Identity;
use crate::error::{BusError, BusResult};

pub const TITLE_MAX_BYTES: usize = 200;
pub const MEMBERS_MAX: i64 = 200;

/// The conversation tools: hidden from `tools/list` and refused per call while
/// the team's `conversations` capability is off.
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
    "ack_message",
    "get_message_receipts",
    "fetch_conversation_inbox",
    "confirm_inbox_delivery",
    "conversation_inbox_status",
    "wait_for_conversation_updates",
    "recover_conversation_history",
];

/// Whether the caller's team has conversations on.
pub async fn enabled(pool: &sqlx::PgPool, me: &Identity) -> BusResult<bool> {
    Ok(
        sqlx::query_scalar("SELECT conversations_enabled FROM teams WHERE id = $1")
            .bind(me.team_id)
            .fetch_one(pool)
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

/// A conversation row as the access rules need it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Conversation {
    pub id: Uuid,
    pub title: String,
    /// `private` or `project`.
    pub visibility: String,
    pub project_id: Option<Uuid>,
    pub project: Option<String>,
    pub last_seq: i64,
    pub backend: String,
    /// `sync` or `outbox`.
    pub publication: String,
    pub write_paused_at: Option<DateTime<Utc>>,
    pub archived_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// One window's seat in a conversation.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Seat {
    pub id: Uuid,
    /// `owner`, `moderator`, `participant` or `observer`.
    pub role: String,
    /// `invited`, `active`, `left` or `removed`.
    pub state: String,
    pub history_from_seq: i64,
    pub transfer_to_session: Option<String>,
    pub superseded_by: Option<Uuid>,
}

impl Seat {
    pub fn is_active(&self) -> bool {
        self.state == "active"
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
pub(crate) use conversation_select;

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

/// The one "not found" every invisible conversation gets.
pub fn not_found(id: Uuid) -> BusError {
    BusError::not_found(format!(
        "no conversation {id} visible to this window. list_conversations shows yours."
    ))
}

/// This window's seat in the conversation, if it has one (in any state).
/// `FOR UPDATE` locks it when the caller will change it (after the
/// conversation row, per the lock order).
pub(crate) async fn seat(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
    for_update: bool,
) -> BusResult<Option<Seat>> {
    let sql = if for_update {
        "SELECT id, role, state, history_from_seq, transfer_to_session, superseded_by
         FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND agent_id = $3 AND session = $4 FOR UPDATE"
    } else {
        "SELECT id, role, state, history_from_seq, transfer_to_session, superseded_by
         FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND agent_id = $3 AND session = $4"
    };
    Ok(sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(conversation_id)
        .bind(me.agent_id)
        .bind(&me.session)
        .fetch_optional(&mut *conn)
        .await?)
}

/// Refuse the bare agent token wearing a label that belongs to a live
/// authenticated window: that window's private data needs its credential.
pub(crate) async fn refuse_borrowed_label(conn: &mut PgConnection, me: &Identity) -> BusResult<()> {
    if me.window.is_some() || me.session.is_empty() {
        return Ok(());
    }
    let registered: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM agent_sessions s
                        JOIN agent_tokens t ON t.team_id = s.team_id AND t.id = s.token_id
                        WHERE s.team_id = $1 AND s.agent_id = $2 AND s.label = $3
                          AND s.revoked_at IS NULL AND s.expires_at > now() AND t.revoked_at IS NULL)",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.session)
    .fetch_one(&mut *conn)
    .await?;
    if registered {
        return Err(BusError::forbidden(format!(
            "window `{}` is registered as an authenticated window; its conversations are reached \
             with its session credential (acss_…), not with the agent token and X-Crew-Session.",
            me.session
        )));
    }
    Ok(())
}

/// How the caller may read a conversation.
#[derive(Clone, Debug)]
pub enum ReadAccess {
    /// An active seat: reads from its history boundary, may send (unless observer).
    Member(Seat),
    /// No active seat, but the agent holds the project grant: reads everything.
    ProjectGrant,
}

/// Whether and how this window may read `conversation`. An invited seat is
/// told to join first; anyone else without access gets "not found".
pub(crate) async fn read_access(
    conn: &mut PgConnection,
    me: &Identity,
    conversation: &Conversation,
) -> BusResult<ReadAccess> {
    refuse_borrowed_label(conn, me).await?;
    let seat = seat(conn, me, conversation.id, false).await?;
    if let Some(seat) = &seat
        && seat.is_active()
    {
        return Ok(ReadAccess::Member(seat.clone()));
    }
    if let Some(project_id) = conversation.project_id
        && super::projects::holds_grant(conn, me.team_id, project_id, me.agent_id).await?
    {
        return Ok(ReadAccess::ProjectGrant);
    }
    match seat {
        Some(seat) if seat.state == "invited" => Err(BusError::forbidden(format!(
            "you are invited to conversation {} but have not joined: call join_conversation \
             first. An invitation is not membership.",
            conversation.id
        ))),
        _ => Err(not_found(conversation.id)),
    }
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
    .bind(&me.session)
    .bind(action)
    .bind(subject)
    .bind(detail)
    .execute(&mut *conn)
    .await?;
    Ok(())
}
