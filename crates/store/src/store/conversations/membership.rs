//! Membership changes to one seat: `invite_to_conversation` (a new
//! invitation, an invitation again, a re-admission, or a role change),
//! `join_conversation`, `leave_conversation` and `remove_conversation_member`.
//! A join that completes a transfer hands over to `transfer.rs`.

use sqlx::PgConnection;
use uuid::Uuid;

use super::access::{not_found, open, require_manager, visible, visible_unlocked};
use super::seats::{
    MEMBERS_MAX, SeatRow, Window, cap_reached, lock_seats, parse_window, resolve_window,
    seats_taken,
};
use super::transfer::transfer_complete;
use super::{Conversation, Membership, SeatRole, SeatState, audit};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::text;

/// The roles `invite_to_conversation` hands out. `owner` is only ever the
/// creator's seat (or a seat transferred from one).
pub const INVITE_ROLES: &[SeatRole] = &[
    SeatRole::Moderator,
    SeatRole::Participant,
    SeatRole::Observer,
];

fn check_invite_role(role: &str) -> BusResult<SeatRole> {
    let role = role.trim().to_ascii_lowercase();
    INVITE_ROLES
        .iter()
        .copied()
        .find(|invitable| invitable.as_str() == role)
        .ok_or_else(|| {
            BusError::invalid(format!(
                "role {} cannot be handed out: use moderator, participant or observer. The owner \
                 seat is the creator's (transfer_membership moves it to another window of yours).",
                text::quote(&role)
            ))
        })
}

/// What a manager's change to another window's seat starts from.
struct Managed {
    conversation: Conversation,
    target: Window,
    /// The caller's and the target's seats (those that exist), locked.
    seats: Vec<SeatRow>,
    /// The caller's seat: an active owner or moderator.
    manager: SeatRow,
}

/// The common start of invite and remove: the conversation row locked,
/// visibility checked before anything about the target is looked up (so an
/// invisible conversation answers "not found" whatever the address), the
/// target resolved, both seats locked in id order, the caller confirmed as
/// an owner or moderator.
async fn manage(
    tx: &mut PgConnection,
    me: &Identity,
    id: Uuid,
    target: &(String, String),
    what: &str,
) -> BusResult<Managed> {
    let (conversation, grant) = open(tx, me, id).await?;
    if !visible_unlocked(tx, me, &conversation, grant).await? {
        return Err(not_found(id));
    }
    let target = resolve_window(tx, me, target).await?;
    let seats = lock_seats(
        tx,
        me,
        id,
        &[
            (me.agent_id, &me.window),
            (target.agent_id, &target.session),
        ],
    )
    .await?;
    let mine = seats.iter().find(|s| s.is(me.agent_id, &me.window));
    if !visible(mine, grant) {
        return Err(not_found(id));
    }
    let manager = require_manager(id, mine, what)?.clone();
    Ok(Managed {
        conversation,
        target,
        seats,
        manager,
    })
}

/// `invite_to_conversation`: owners and moderators invite a window (or invite
/// it again after it left), re-admit a removed one (from now, audited as
/// `readmit`), or change the role of an active seat (audited as `role`; only
/// an owner changes an owner).
pub async fn invite(
    bus: &Bus,
    me: &Identity,
    id: Uuid,
    address: &str,
    role: &str,
    history_from_start: bool,
) -> BusResult<Membership> {
    let target = parse_window(address)?;
    let role = check_invite_role(role)?;
    let mut tx = bus.pool.begin().await?;
    let Managed {
        conversation,
        target,
        seats,
        manager,
    } = manage(&mut tx, me, id, &target, "invite members or change roles").await?;
    let existing = seats
        .iter()
        .find(|s| s.is(target.agent_id, &target.session))
        .cloned();
    let from_now = conversation.last_seq + 1;
    let history = if history_from_start { 1 } else { from_now };
    let address = target.address();

    let membership = |role, state, history: i64, outcome, note| Membership {
        conversation_id: id,
        address: address.clone(),
        role,
        state,
        history_from_seq: history,
        outcome,
        note,
    };

    let result = match existing {
        None => {
            let taken = seats_taken(&mut tx, me, id).await?;
            if taken >= MEMBERS_MAX {
                return Err(cap_reached(id, taken));
            }
            sqlx::query(
                "INSERT INTO conversation_members
                     (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq, invited_by)
                 VALUES ($1, $2, $3, $4, $5, $6, 'invited', $7, $8)",
            )
            .bind(Uuid::new_v4())
            .bind(me.team_id)
            .bind(id)
            .bind(target.agent_id)
            .bind(&target.session)
            .bind(role)
            .bind(history)
            .bind(me.agent_id)
            .execute(&mut *tx)
            .await?;
            audit(
                &mut tx,
                me,
                Some(id),
                "invite",
                &address,
                serde_json::json!({ "role": role, "history_from_seq": history }),
            )
            .await?;
            membership(role, SeatState::Invited, history, "invited", None)
        }
        Some(seat) if seat.state == SeatState::Active => {
            if seat.id == manager.id {
                return Err(BusError::invalid(
                    "you cannot change your own role. Another owner or moderator can; to step \
                     away, use leave_conversation.",
                ));
            }
            if seat.role == SeatRole::Owner && manager.role != SeatRole::Owner {
                return Err(BusError::forbidden(format!(
                    "{address} is an owner of conversation {id}; only an owner changes an owner's \
                     role, and you are a {}. Ask an owner.",
                    manager.role
                )));
            }
            if seat.role == role {
                membership(
                    role,
                    SeatState::Active,
                    seat.history_from_seq,
                    "unchanged",
                    None,
                )
            } else {
                sqlx::query(
                    "UPDATE conversation_members SET role = $2, updated_at = now() WHERE id = $1",
                )
                .bind(seat.id)
                .bind(role)
                .execute(&mut *tx)
                .await?;
                audit(
                    &mut tx,
                    me,
                    Some(id),
                    "role",
                    &address,
                    serde_json::json!({ "from": seat.role, "to": role }),
                )
                .await?;
                let note = history_from_start.then(|| {
                    "history_from_start applies to invitations only; this active seat keeps \
                     its history boundary."
                        .to_string()
                });
                membership(
                    role,
                    SeatState::Active,
                    seat.history_from_seq,
                    "role_changed",
                    note,
                )
            }
        }
        Some(seat) => {
            if seat.state == SeatState::Invited
                && seat.role == SeatRole::Owner
                && manager.role != SeatRole::Owner
            {
                return Err(BusError::forbidden(format!(
                    "{address} holds an owner seat; only an owner changes it. Ask an owner."
                )));
            }
            if seat.state != SeatState::Invited {
                let taken = seats_taken(&mut tx, me, id).await?;
                if taken >= MEMBERS_MAX {
                    return Err(cap_reached(id, taken));
                }
            }
            // A removed seat comes back only from now: whatever was said while
            // it was out stays out of its reach.
            let (action, outcome, history, note) = if seat.state == SeatState::Removed {
                (
                    "readmit",
                    "readmitted",
                    from_now,
                    history_from_start.then(|| {
                        "a removed seat is re-admitted from now; history_from_start does not \
                         apply to it."
                            .to_string()
                    }),
                )
            } else {
                ("invite", "reinvited", history, None)
            };
            sqlx::query(
                "UPDATE conversation_members
                 SET role = $2, state = 'invited', history_from_seq = $3, invited_by = $4,
                     transfer_to_session = NULL, superseded_by = NULL, updated_at = now()
                 WHERE id = $1",
            )
            .bind(seat.id)
            .bind(role)
            .bind(history)
            .bind(me.agent_id)
            .execute(&mut *tx)
            .await?;
            audit(
                &mut tx,
                me,
                Some(id),
                action,
                &address,
                serde_json::json!({
                    "role": role, "history_from_seq": history, "previous_state": seat.state,
                }),
            )
            .await?;
            membership(role, SeatState::Invited, history, outcome, note)
        }
    };
    tx.commit().await?;
    Ok(result)
}

/// `join_conversation`: this window's invitation becomes an active seat, or a
/// transfer proposed to this window completes.
pub async fn join(bus: &Bus, me: &Identity, id: Uuid) -> BusResult<Membership> {
    let mut tx = bus.pool.begin().await?;
    let (conversation, grant) = open(&mut tx, me, id).await?;
    // A seat of another window of this agent that proposes moving here.
    let source: Option<String> = sqlx::query_scalar(
        "SELECT session FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND agent_id = $3
           AND transfer_to_session = $4 AND state = 'active'
         ORDER BY id LIMIT 1",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(&mut *tx)
    .await?;
    let mut windows = vec![(me.agent_id, me.window.as_str())];
    if let Some(source) = &source {
        windows.push((me.agent_id, source.as_str()));
    }
    let seats = lock_seats(&mut tx, me, id, &windows).await?;
    let mine = seats
        .iter()
        .find(|s| s.is(me.agent_id, &me.window))
        .cloned();
    let source =
        source.and_then(|session| seats.iter().find(|s| s.is(me.agent_id, &session)).cloned());
    let address = me.address();

    let result = if let Some(source) = source {
        transfer_complete(&mut tx, me, &conversation, &source, mine.as_ref()).await?
    } else {
        match mine {
            Some(seat) if seat.state == SeatState::Invited => {
                sqlx::query(
                    "UPDATE conversation_members
                     SET state = 'active', joined_at = now(), updated_at = now() WHERE id = $1",
                )
                .bind(seat.id)
                .execute(&mut *tx)
                .await?;
                audit(
                    &mut tx,
                    me,
                    Some(id),
                    "join",
                    &address,
                    serde_json::json!({ "role": seat.role, "history_from_seq": seat.history_from_seq }),
                )
                .await?;
                Membership {
                    conversation_id: id,
                    address,
                    role: seat.role,
                    state: SeatState::Active,
                    history_from_seq: seat.history_from_seq,
                    outcome: "joined",
                    note: None,
                }
            }
            Some(seat) if seat.state == SeatState::Active => Membership {
                conversation_id: id,
                address,
                role: seat.role,
                state: seat.state,
                history_from_seq: seat.history_from_seq,
                outcome: "unchanged",
                note: Some("this window is already an active member.".into()),
            },
            other if grant => {
                return Err(BusError::forbidden(format!(
                    "this window has no invitation to conversation {id}{}. Your project grant lets \
                     you read it without joining; to become a member, ask an owner or moderator \
                     to invite_to_conversation {address}.",
                    match other {
                        Some(seat) => format!(" (its seat is {})", seat.state),
                        None => String::new(),
                    }
                )));
            }
            _ => return Err(not_found(id)),
        }
    };
    tx.commit().await?;
    Ok(result)
}

/// `leave_conversation`: an active seat leaves; an invited one declines.
pub async fn leave(bus: &Bus, me: &Identity, id: Uuid) -> BusResult<Membership> {
    let mut tx = bus.pool.begin().await?;
    let (_, grant) = open(&mut tx, me, id).await?;
    let seats = lock_seats(&mut tx, me, id, &[(me.agent_id, &me.window)]).await?;
    let mine = seats.into_iter().next();
    let seat = match mine {
        Some(seat) if seat.holds() => seat,
        _ if grant => {
            return Err(BusError::invalid(format!(
                "this window holds no seat in conversation {id} (it reads through the project \
                 grant), so there is nothing to leave."
            )));
        }
        _ => return Err(not_found(id)),
    };
    let declined = seat.state == SeatState::Invited;
    sqlx::query(
        "UPDATE conversation_members
         SET state = 'left', left_at = now(), transfer_to_session = NULL, updated_at = now()
         WHERE id = $1",
    )
    .bind(seat.id)
    .execute(&mut *tx)
    .await?;
    audit(
        &mut tx,
        me,
        Some(id),
        "leave",
        &me.address(),
        serde_json::json!({ "role": seat.role, "declined": declined }),
    )
    .await?;
    tx.commit().await?;
    Ok(Membership {
        conversation_id: id,
        address: me.address(),
        role: seat.role,
        state: SeatState::Left,
        history_from_seq: seat.history_from_seq,
        outcome: if declined { "declined" } else { "left" },
        note: None,
    })
}

/// `remove_conversation_member`: owners and moderators remove an invited or
/// active seat; only an owner removes an owner.
pub async fn remove(bus: &Bus, me: &Identity, id: Uuid, address: &str) -> BusResult<Membership> {
    let target = parse_window(address)?;
    let mut tx = bus.pool.begin().await?;
    let Managed {
        conversation: _,
        target,
        seats,
        manager,
    } = manage(&mut tx, me, id, &target, "remove members").await?;
    let address = target.address();
    let seat = match seats
        .iter()
        .find(|s| s.is(target.agent_id, &target.session))
    {
        Some(seat) if seat.holds() => seat.clone(),
        _ => {
            return Err(BusError::not_found(format!(
                "{address} holds no invited or active seat in conversation {id}; nothing to \
                 remove. list_conversations shows your conversations; addresses are `agent` \
                 (shared window) or `agent/window`."
            )));
        }
    };
    if seat.id == manager.id {
        return Err(BusError::invalid(
            "you cannot remove your own seat; use leave_conversation.",
        ));
    }
    if seat.role == SeatRole::Owner && manager.role != SeatRole::Owner {
        return Err(BusError::forbidden(format!(
            "{address} is an owner of conversation {id}; only an owner removes an owner, and you \
             are a {}. Ask an owner.",
            manager.role
        )));
    }
    sqlx::query(
        "UPDATE conversation_members
         SET state = 'removed', removed_at = now(), transfer_to_session = NULL, updated_at = now()
         WHERE id = $1",
    )
    .bind(seat.id)
    .execute(&mut *tx)
    .await?;
    audit(
        &mut tx,
        me,
        Some(id),
        "remove",
        &address,
        serde_json::json!({ "role": seat.role, "previous_state": seat.state }),
    )
    .await?;
    tx.commit().await?;
    Ok(Membership {
        conversation_id: id,
        address,
        role: seat.role,
        state: SeatState::Removed,
        history_from_seq: seat.history_from_seq,
        outcome: "removed",
        note: None,
    })
}
