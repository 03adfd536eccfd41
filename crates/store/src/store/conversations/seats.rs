//! Seats as a membership change handles them: the windows an address names,
//! their seats locked in id order after the conversation row, and the member
//! cap counted under that lock.

use sqlx::PgConnection;
use uuid::Uuid;

use super::{Membership, SeatRole, SeatState};
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::{self, messaging::messages};

/// Invited plus active seats one conversation may hold.
pub const MEMBERS_MAX: i64 = 200;

/// A seat as a membership change needs it (locked).
#[derive(Clone, Debug, sqlx::FromRow)]
pub(super) struct SeatRow {
    pub(super) id: Uuid,
    pub(super) agent_id: Uuid,
    pub(super) session: String,
    pub(super) role: SeatRole,
    pub(super) state: SeatState,
    pub(super) history_from_seq: i64,
    pub(super) transfer_to_session: Option<String>,
}

impl SeatRow {
    pub(super) fn is(&self, agent_id: Uuid, session: &str) -> bool {
        self.agent_id == agent_id && self.session == session
    }

    pub(super) fn holds(&self) -> bool {
        self.state.holds()
    }

    pub(super) fn manages(&self) -> bool {
        self.state == SeatState::Active && self.role.manages()
    }
}

/// The one way a seat changes state: the row (with the timestamp its new
/// state keeps, and no transfer pending any more), then its audit row, then
/// the membership the tool answers. `superseded_by` names the seat a
/// transfer moved this one to (a transfer's source only). Invitations, which
/// also set a role and a history boundary, write their own row.
pub(super) struct SeatChange<'a> {
    pub(super) conversation_id: Uuid,
    pub(super) seat: &'a SeatRow,
    pub(super) address: String,
    pub(super) to: SeatState,
    pub(super) superseded_by: Option<Uuid>,
    /// The audit action and its detail.
    pub(super) action: &'static str,
    pub(super) detail: serde_json::Value,
    pub(super) outcome: &'static str,
}

impl SeatChange<'_> {
    pub(super) async fn apply(
        self,
        conn: &mut PgConnection,
        me: &Identity,
    ) -> BusResult<Membership> {
        sqlx::query(
            "UPDATE conversation_members
             SET state = $2,
                 joined_at = CASE WHEN $2 = 'active' THEN now() ELSE joined_at END,
                 left_at = CASE WHEN $2 = 'left' THEN now() ELSE left_at END,
                 removed_at = CASE WHEN $2 = 'removed' THEN now() ELSE removed_at END,
                 superseded_by = $3, transfer_to_session = NULL, updated_at = now()
             WHERE id = $1",
        )
        .bind(self.seat.id)
        .bind(self.to)
        .bind(self.superseded_by)
        .execute(&mut *conn)
        .await?;
        super::audit(
            conn,
            me,
            Some(self.conversation_id),
            self.action,
            &self.address,
            self.detail,
        )
        .await?;
        Ok(Membership {
            conversation_id: self.conversation_id,
            address: self.address,
            role: self.seat.role,
            state: self.to,
            history_from_seq: self.seat.history_from_seq,
            outcome: self.outcome,
            note: None,
        })
    }
}

/// A new invited seat for `window`, and its `invite` audit row (a
/// conversation's creation and `invite_to_conversation` both invite so).
pub(super) async fn invite_new_seat(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
    window: &Window,
    role: SeatRole,
    history_from_seq: i64,
) -> BusResult<()> {
    sqlx::query(
        "INSERT INTO conversation_members
             (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq, invited_by)
         VALUES ($1, $2, $3, $4, $5, $6, 'invited', $7, $8)",
    )
    .bind(Uuid::new_v4())
    .bind(me.team_id)
    .bind(conversation_id)
    .bind(window.agent_id)
    .bind(&window.session)
    .bind(role)
    .bind(history_from_seq)
    .bind(me.agent_id)
    .execute(&mut *conn)
    .await?;
    super::audit(
        conn,
        me,
        Some(conversation_id),
        "invite",
        &window.address(),
        serde_json::json!({ "role": role, "history_from_seq": history_from_seq }),
    )
    .await
}

/// A window named by an address, resolved in the caller's team.
#[derive(Clone, Debug)]
pub(super) struct Window {
    pub(super) agent_id: Uuid,
    pub(super) agent: String,
    pub(super) session: String,
}

impl Window {
    pub(super) fn address(&self) -> String {
        store::address(&self.agent, &self.session)
    }
}

/// Validate an address (`agent` or `agent/window`) without touching the database.
pub(super) fn parse_window(raw: &str) -> BusResult<(String, String)> {
    let (agent, window) = messages::parse_address(raw)?;
    Ok((agent, window.unwrap_or_default()))
}

pub(super) async fn resolve_window(
    conn: &mut PgConnection,
    me: &Identity,
    (agent, session): &(String, String),
) -> BusResult<Window> {
    let agent_id: Uuid =
        sqlx::query_scalar("SELECT id FROM agents WHERE team_id = $1 AND name = $2")
            .bind(me.team_id)
            .bind(agent)
            .fetch_optional(&mut *conn)
            .await?
            .ok_or_else(|| {
                BusError::not_found(format!(
                    "no agent `{agent}` in your team. list_agents shows them; an address is \
                     `agent` (its shared window) or `agent/window`."
                ))
            })?;
    Ok(Window {
        agent_id,
        agent: agent.clone(),
        session: session.clone(),
    })
}

/// Lock the existing seats of `windows` in id order (after the conversation row).
pub(super) async fn lock_seats(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
    windows: &[(Uuid, &str)],
) -> BusResult<Vec<SeatRow>> {
    let agents: Vec<Uuid> = windows.iter().map(|w| w.0).collect();
    let sessions: Vec<String> = windows.iter().map(|w| w.1.to_string()).collect();
    Ok(sqlx::query_as(
        "SELECT m.id, m.agent_id, m.session, m.role, m.state, m.history_from_seq, m.transfer_to_session
         FROM conversation_members m
         JOIN unnest($3::uuid[], $4::text[]) AS w(agent_id, session)
           ON w.agent_id = m.agent_id AND w.session = m.session
         WHERE m.team_id = $1 AND m.conversation_id = $2
         ORDER BY m.id
         FOR UPDATE OF m",
    )
    .bind(me.team_id)
    .bind(conversation_id)
    .bind(&agents)
    .bind(&sessions)
    .fetch_all(&mut *conn)
    .await?)
}

/// Invited plus active seats: what the member cap counts.
pub(super) async fn seats_taken(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
) -> BusResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND state IN ('invited', 'active')",
    )
    .bind(me.team_id)
    .bind(conversation_id)
    .fetch_one(&mut *conn)
    .await?)
}

pub(super) fn cap_reached(conversation_id: Uuid, taken: i64) -> BusError {
    BusError::conflict(format!(
        "conversation {conversation_id} already has {taken} members (invited or active); the limit \
         is {MEMBERS_MAX}. Remove a member (remove_conversation_member) or start another \
         conversation, then invite again."
    ))
}
