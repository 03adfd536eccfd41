//! Seats as a membership change handles them: the windows an address names,
//! their seats locked in id order after the conversation row, and the member
//! cap counted under that lock.

use sqlx::PgConnection;
use uuid::Uuid;

use super::{SeatRole, SeatState};
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
