//! Membership changes to one seat: `invite_to_conversation` (a new
//! invitation, an invitation again, a re-admission, or a role change),
//! `join_conversation`, `leave_conversation` and `remove_conversation_member`.
//! A join that completes a transfer hands over to `transfer.rs`.

use sqlx::PgConnection;
use uuid::Uuid;

use super::access::{not_found, open, require_manager, visible, visible_unlocked};
use super::seats::{
    MEMBERS_MAX, SeatChange, SeatRow, Window, cap_reached, invite_new_seat, lock_seats,
    parse_window, resolve_window, seats_taken,
};
use super::transfer::transfer_complete;
use super::{Conversation, Membership, SeatRole, SeatState, audit};
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::requests::Writer;
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
    w: &mut Writer,
    me: &Identity,
    id: Uuid,
    address: &str,
    role: &str,
    history_from_start: bool,
) -> BusResult<Membership> {
    let target = parse_window(address)?;
    let role = check_invite_role(role)?;
    let mut tx = w.begin().await?;
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
    let asked = Invitation {
        me,
        id,
        address: target.address(),
        role,
        history_from_start,
        from_now: conversation.last_seq + 1,
        manager: &manager,
    };
    let result = match existing {
        None => asked.new_seat(&mut tx, &target).await?,
        Some(seat) if seat.state == SeatState::Active => asked.change_role(&mut tx, &seat).await?,
        Some(seat) => asked.invite_again(&mut tx, &seat).await?,
    };
    tx.commit().await?;
    Ok(result)
}

/// What `invite_to_conversation` asked, and of whom: one method per state
/// the target's seat is in.
struct Invitation<'a> {
    me: &'a Identity,
    id: Uuid,
    address: String,
    role: SeatRole,
    history_from_start: bool,
    /// The seq the next message will take: a seat invited from now reads
    /// from it.
    from_now: i64,
    manager: &'a SeatRow,
}

impl Invitation<'_> {
    fn history(&self) -> i64 {
        if self.history_from_start {
            1
        } else {
            self.from_now
        }
    }

    fn answer(
        &self,
        state: SeatState,
        history_from_seq: i64,
        outcome: &'static str,
        note: Option<String>,
    ) -> Membership {
        Membership {
            conversation_id: self.id,
            address: self.address.clone(),
            role: self.role,
            state,
            history_from_seq,
            outcome,
            note,
        }
    }

    /// No seat yet: a new invited one, within the member cap.
    async fn new_seat(&self, tx: &mut PgConnection, target: &Window) -> BusResult<Membership> {
        let taken = seats_taken(tx, self.me, self.id).await?;
        if taken >= MEMBERS_MAX {
            return Err(cap_reached(self.id, taken));
        }
        let history = self.history();
        invite_new_seat(tx, self.me, self.id, target, self.role, history).await?;
        Ok(self.answer(SeatState::Invited, history, "invited", None))
    }

    /// An active seat: its role changes (never one's own; an owner's only by
    /// an owner); its history boundary stays.
    async fn change_role(&self, tx: &mut PgConnection, seat: &SeatRow) -> BusResult<Membership> {
        let (id, address) = (self.id, &self.address);
        if seat.id == self.manager.id {
            return Err(BusError::invalid(
                "you cannot change your own role. Another owner or moderator can; to step \
                 away, use leave_conversation.",
            ));
        }
        if seat.role == SeatRole::Owner && self.manager.role != SeatRole::Owner {
            return Err(BusError::forbidden(format!(
                "{address} is an owner of conversation {id}; only an owner changes an owner's \
                 role, and you are a {}. Ask an owner.",
                self.manager.role
            )));
        }
        if seat.role == self.role {
            return Ok(self.answer(SeatState::Active, seat.history_from_seq, "unchanged", None));
        }
        sqlx::query("UPDATE conversation_members SET role = $2, updated_at = now() WHERE id = $1")
            .bind(seat.id)
            .bind(self.role)
            .execute(&mut *tx)
            .await?;
        audit(
            tx,
            self.me,
            Some(id),
            "role",
            address,
            serde_json::json!({ "from": seat.role, "to": self.role }),
        )
        .await?;
        let note = self.history_from_start.then(|| {
            "history_from_start applies to invitations only; this active seat keeps its history \
             boundary."
                .to_string()
        });
        Ok(self.answer(
            SeatState::Active,
            seat.history_from_seq,
            "role_changed",
            note,
        ))
    }

    /// An invited, left or removed seat: invited again (a removed one
    /// re-admitted from now), within the member cap when it held none.
    async fn invite_again(&self, tx: &mut PgConnection, seat: &SeatRow) -> BusResult<Membership> {
        let address = &self.address;
        if seat.state == SeatState::Invited
            && seat.role == SeatRole::Owner
            && self.manager.role != SeatRole::Owner
        {
            return Err(BusError::forbidden(format!(
                "{address} holds an owner seat; only an owner changes it. Ask an owner."
            )));
        }
        if seat.state != SeatState::Invited {
            let taken = seats_taken(tx, self.me, self.id).await?;
            if taken >= MEMBERS_MAX {
                return Err(cap_reached(self.id, taken));
            }
        }
        // A removed seat comes back only from now: whatever was said while
        // it was out stays out of its reach.
        let (action, outcome, history, note) = if seat.state == SeatState::Removed {
            let note = self.history_from_start.then(|| {
                "a removed seat is re-admitted from now; history_from_start does not apply to it."
                    .to_string()
            });
            ("readmit", "readmitted", self.from_now, note)
        } else {
            ("invite", "reinvited", self.history(), None)
        };
        sqlx::query(
            "UPDATE conversation_members
             SET role = $2, state = 'invited', history_from_seq = $3, invited_by = $4,
                 transfer_to_session = NULL, superseded_by = NULL, updated_at = now()
             WHERE id = $1",
        )
        .bind(seat.id)
        .bind(self.role)
        .bind(history)
        .bind(self.me.agent_id)
        .execute(&mut *tx)
        .await?;
        audit(
            tx,
            self.me,
            Some(self.id),
            action,
            address,
            serde_json::json!({
                "role": self.role, "history_from_seq": history, "previous_state": seat.state,
            }),
        )
        .await?;
        Ok(self.answer(SeatState::Invited, history, outcome, note))
    }
}

/// `join_conversation`: this window's invitation becomes an active seat, or a
/// transfer proposed to this window completes.
pub async fn join(w: &mut Writer, me: &Identity, id: Uuid) -> BusResult<Membership> {
    let mut tx = w.begin().await?;
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
                SeatChange {
                    conversation_id: id,
                    seat: &seat,
                    address,
                    to: SeatState::Active,
                    superseded_by: None,
                    action: "join",
                    detail: serde_json::json!({
                        "role": seat.role, "history_from_seq": seat.history_from_seq,
                    }),
                    outcome: "joined",
                }
                .apply(&mut tx, me)
                .await?
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
pub async fn leave(w: &mut Writer, me: &Identity, id: Uuid) -> BusResult<Membership> {
    let mut tx = w.begin().await?;
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
    let left = SeatChange {
        conversation_id: id,
        seat: &seat,
        address: me.address(),
        to: SeatState::Left,
        superseded_by: None,
        action: "leave",
        detail: serde_json::json!({ "role": seat.role, "declined": declined }),
        outcome: if declined { "declined" } else { "left" },
    }
    .apply(&mut tx, me)
    .await?;
    tx.commit().await?;
    Ok(left)
}

/// `remove_conversation_member`: owners and moderators remove an invited or
/// active seat; only an owner removes an owner.
pub async fn remove(
    w: &mut Writer,
    me: &Identity,
    id: Uuid,
    address: &str,
) -> BusResult<Membership> {
    let target = parse_window(address)?;
    let mut tx = w.begin().await?;
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
    let removed = SeatChange {
        conversation_id: id,
        seat: &seat,
        address,
        to: SeatState::Removed,
        superseded_by: None,
        action: "remove",
        detail: serde_json::json!({ "role": seat.role, "previous_state": seat.state }),
        outcome: "removed",
    }
    .apply(&mut tx, me)
    .await?;
    tx.commit().await?;
    Ok(removed)
}
