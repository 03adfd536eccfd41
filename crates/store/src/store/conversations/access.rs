//! The access rules every conversation tool goes through: the one "not
//! found", the borrowed-label refusal, read access (an active seat or the
//! project grant), and, for membership changes, the conversation row locked
//! first, who may see it and who may manage it.

use std::sync::LazyLock;

use sqlx::PgConnection;
use uuid::Uuid;

use super::seats::SeatRow;
use super::{Conversation, Seat, SeatRole, SeatState, load};
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::{conversations::projects, identity::sessions};

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
        .bind(&me.window)
        .fetch_optional(&mut *conn)
        .await?)
}

/// The one rule for "this window is a registered window" (identity.md: a
/// registered window's private data is not for the bare agent token): a
/// live session credential, derived from a live agent token, holds the label
/// (`team`, `agent`, `label` are SQL expressions: parameters or columns).
/// MCP refuses the bare token wearing such a label ([`refuse_borrowed_label`],
/// [`seat_unless_borrowed`]); the dashboard, which signs in with the bare
/// token, leaves such a window's seats out (`store::operations::dashboard`).
pub(crate) fn registered_window(team: &str, agent: &str, label: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM agent_sessions rw_s
                 JOIN agent_tokens rw_t ON rw_t.team_id = rw_s.team_id AND rw_t.id = rw_s.token_id
                 WHERE rw_s.team_id = {team} AND rw_s.agent_id = {agent} AND rw_s.label = {label}
                   AND rw_s.revoked_at IS NULL AND rw_s.expires_at > now()
                   AND rw_t.revoked_at IS NULL)"
    )
}

static REGISTERED: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {}", registered_window("$1", "$2", "$3")));

/// Refuse the bare agent token wearing a label that belongs to a live
/// authenticated window: that window's private data needs its credential.
pub(crate) async fn refuse_borrowed_label(conn: &mut PgConnection, me: &Identity) -> BusResult<()> {
    if me.session_credential.is_some() || me.window.is_empty() {
        return Ok(());
    }
    let registered: bool = sqlx::query_scalar(REGISTERED.as_str())
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .fetch_one(&mut *conn)
        .await?;
    if registered {
        return Err(borrowed_label(me));
    }
    Ok(())
}

pub(crate) fn borrowed_label(me: &Identity) -> BusError {
    BusError::forbidden(format!(
        "window `{}` is registered as an authenticated window; its conversations are reached \
         with its session credential (acss_…), not with the agent token and X-Crew-Session.",
        me.window
    ))
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
    let seat = seat_unless_borrowed(conn, me, conversation.id).await?;
    access_from(conn, me, conversation, seat).await
}

/// The refusal for a window whose seat is invited, not yet joined.
pub(crate) fn invited_not_joined(conversation_id: Uuid) -> BusError {
    BusError::forbidden(format!(
        "you are invited to conversation {conversation_id} but have not joined: call \
         join_conversation first. An invitation is not membership."
    ))
}

/// Read access from this window's seat (if any) and, failing that, the
/// agent's project grant.
async fn access_from(
    conn: &mut PgConnection,
    me: &Identity,
    conversation: &Conversation,
    seat: Option<Seat>,
) -> BusResult<ReadAccess> {
    if let Some(seat) = &seat
        && seat.is_active()
    {
        return Ok(ReadAccess::Member(seat.clone()));
    }
    if let Some(project_id) = conversation.project_id
        && projects::holds_grant(conn, me.team_id, project_id, me.agent_id).await?
    {
        return Ok(ReadAccess::ProjectGrant);
    }
    match seat {
        Some(seat) if seat.state == SeatState::Invited => Err(invited_not_joined(conversation.id)),
        _ => Err(not_found(conversation.id)),
    }
}

/// [`refuse_borrowed_label`] and [`seat`] in one round trip: the read and
/// send paths run on every call.
async fn seat_unless_borrowed(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
) -> BusResult<Option<Seat>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        borrowed: bool,
        id: Option<Uuid>,
        role: Option<SeatRole>,
        state: Option<SeatState>,
        history_from_seq: Option<i64>,
        transfer_to_session: Option<String>,
        superseded_by: Option<Uuid>,
    }
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT ($5 AND {}) AS borrowed,
                    m.id, m.role, m.state, m.history_from_seq, m.transfer_to_session,
                    m.superseded_by
             FROM (SELECT 1) AS one
             LEFT JOIN conversation_members m
                    ON m.team_id = $1 AND m.conversation_id = $2 AND m.agent_id = $3
                   AND m.session = $4",
            registered_window("$1", "$3", "$4")
        )
    });
    let row: Row = sqlx::query_as(SQL.as_str())
        .bind(me.team_id)
        .bind(conversation_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(me.session_credential.is_none() && !me.window.is_empty())
        .fetch_one(&mut *conn)
        .await?;
    if row.borrowed {
        return Err(borrowed_label(me));
    }
    Ok(match (row.id, row.role, row.state, row.history_from_seq) {
        (Some(id), Some(role), Some(state), Some(history_from_seq)) => Some(Seat {
            id,
            role,
            state,
            history_from_seq,
            transfer_to_session: row.transfer_to_session,
            superseded_by: row.superseded_by,
        }),
        _ => None,
    })
}

/// The conversation row locked, whether the agent holds its project grant, and
/// the refusal for a window that may not see it.
pub(super) async fn open(
    conn: &mut PgConnection,
    me: &Identity,
    id: Uuid,
) -> BusResult<(Conversation, bool)> {
    sessions::guard(conn, me).await?;
    refuse_borrowed_label(conn, me).await?;
    let conversation = load(conn, me, id, true).await?;
    let grant = match conversation.project_id {
        Some(project_id) => {
            projects::holds_grant(conn, me.team_id, project_id, me.agent_id).await?
        }
        None => false,
    };
    Ok((conversation, grant))
}

pub(super) fn visible(mine: Option<&SeatRow>, grant: bool) -> bool {
    grant || mine.is_some_and(SeatRow::holds)
}

/// How a refusal describes the caller's standing.
pub(super) fn standing(mine: Option<&SeatRow>) -> String {
    match mine {
        Some(seat) if seat.state == SeatState::Active => format!("an active {}", seat.role),
        Some(seat) => format!("a {} whose seat is {}", seat.role, seat.state),
        None => "not a member (you read it through the project grant)".to_string(),
    }
}

pub(super) fn require_manager<'a>(
    id: Uuid,
    mine: Option<&'a SeatRow>,
    what: &str,
) -> BusResult<&'a SeatRow> {
    match mine {
        Some(seat) if seat.manages() => Ok(seat),
        other => Err(BusError::forbidden(format!(
            "only an active owner or moderator of conversation {id} can {what}; this window is {}. \
             Ask one of its owners or moderators.",
            standing(other)
        ))),
    }
}

/// Whether the caller may see `conversation`, before its seats are locked (the
/// conversation row is already locked, so no seat changes underneath).
pub(super) async fn visible_unlocked(
    conn: &mut PgConnection,
    me: &Identity,
    conversation: &Conversation,
    grant: bool,
) -> BusResult<bool> {
    if grant {
        return Ok(true);
    }
    Ok(seat(conn, me, conversation.id, false)
        .await?
        .is_some_and(|s| s.state.holds()))
}
