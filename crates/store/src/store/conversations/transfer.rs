//! `transfer_membership`: a window proposes moving its active seat to another
//! window of the same agent, and that window's `join_conversation` completes
//! the move ([`transfer_complete`]): role, history boundary and receipts go
//! with the seat, nothing is re-timestamped.

use sqlx::PgConnection;
use uuid::Uuid;

use super::access::{not_found, open, standing, visible};
use super::seats::{SeatRow, lock_seats, parse_window};
use super::{Conversation, Membership, SeatState, audit_own};
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store;
use crate::store::requests::Writer;

/// Where `transfer_membership` may send a seat: a window label of the
/// caller's own agent (`""` = its shared window), or an address of it.
fn parse_transfer_target(me: &Identity, raw: &str) -> BusResult<String> {
    if raw.contains('/') {
        let (agent, session) = parse_window(raw)?;
        if agent != me.agent {
            return Err(BusError::invalid(format!(
                "a seat moves only between windows of the same agent; `{raw}` belongs to `{agent}`, \
                 you are `{}`. To bring another agent in, use invite_to_conversation.",
                me.agent
            )));
        }
        return Ok(session);
    }
    crate::auth::normalize_session_label(raw)
}

/// Whether a transfer may land on a window whose seat is in `state`: not on
/// an active seat (it would hold two) nor a removed one (only a re-admission
/// brings that window back).
fn lands_on(state: SeatState) -> bool {
    match state {
        SeatState::Invited | SeatState::Left => true,
        SeatState::Active | SeatState::Removed => false,
    }
}

/// `transfer_membership`: the window holding an active seat proposes moving
/// it to another window of the same agent; that window's
/// `join_conversation` completes the move. A later proposal replaces an
/// earlier one; leaving or being removed cancels it.
pub async fn transfer(w: &mut Writer, me: &Identity, id: Uuid, to: &str) -> BusResult<Membership> {
    let to = parse_transfer_target(me, to)?;
    if to == me.window {
        return Err(BusError::invalid(
            "`to` is this window itself. Name another window of yours (a label such as `w2`, or \
             `\"\"` for your shared window).",
        ));
    }
    let mut tx = w.begin().await?;
    let (_, grant) = open(&mut tx, me, id).await?;
    let seats = lock_seats(
        &mut tx,
        me,
        id,
        &[(me.agent_id, &me.window), (me.agent_id, &to)],
    )
    .await?;
    let mine = seats
        .iter()
        .find(|s| s.is(me.agent_id, &me.window))
        .cloned();
    if !visible(mine.as_ref(), grant) {
        return Err(not_found(id));
    }
    let seat = match mine {
        Some(seat) if seat.state == SeatState::Active => seat,
        other => {
            return Err(BusError::forbidden(format!(
                "only an active seat can be transferred, and this window is {}. Join first \
                 (join_conversation) if you are invited.",
                standing(other.as_ref())
            )));
        }
    };
    let target_address = store::address(&me.agent, &to);
    if let Some(existing) = seats.iter().find(|s| s.is(me.agent_id, &to))
        && !lands_on(existing.state)
    {
        return Err(BusError::conflict(format!(
            "{target_address} already has a{} seat in conversation {id}; a seat moves only to a \
             window without an active or removed one.",
            if existing.state == SeatState::Active {
                "n active"
            } else {
                " removed"
            }
        )));
    }
    let competing: Option<String> = sqlx::query_scalar(
        "SELECT session FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND agent_id = $3
           AND transfer_to_session = $4 AND state = 'active' AND id <> $5",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .bind(&to)
    .bind(seat.id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(other) = competing {
        return Err(BusError::conflict(format!(
            "window `{other}` already proposes moving its seat to {target_address}; one window \
             receives one seat. Let that transfer complete (join_conversation from \
             {target_address}) or pick another window."
        )));
    }
    sqlx::query(
        "UPDATE conversation_members SET transfer_to_session = $2, updated_at = now() WHERE id = $1",
    )
    .bind(seat.id)
    .bind(&to)
    .execute(&mut *tx)
    .await?;
    audit_own(
        &mut tx,
        me,
        id,
        "transfer",
        serde_json::json!({
            "phase": "proposed", "to": target_address, "replaces": seat.transfer_to_session,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(Membership {
        conversation_id: id,
        address: me.address(),
        role: seat.role,
        state: seat.state,
        history_from_seq: seat.history_from_seq,
        outcome: "transfer_proposed",
        note: Some(format!(
            "the seat moves when {target_address} calls join_conversation; until then this \
             window keeps it."
        )),
    })
}

/// The second half of `transfer_membership`, run by the target window's join.
///
/// The new seat takes over the old seat's role and history boundary; the old
/// seat is superseded (state `left`, `superseded_by` = the new seat). Its
/// receipts move to the new seat by changing `member_id` only: every
/// timestamp (stored, delivered, presented, acknowledged, resolved) and
/// `recipient_session` (the window the message was addressed to at send) stay
/// exactly as observed, so nothing is forged or re-timestamped. Messages the
/// old seat sent keep their author. A receipt the new seat already holds for
/// the same message (it was a recipient itself) is kept, and the old seat's
/// duplicate stays with the old seat rather than being merged into it.
pub(super) async fn transfer_complete(
    conn: &mut PgConnection,
    me: &Identity,
    conversation: &Conversation,
    source: &SeatRow,
    mine: Option<&SeatRow>,
) -> BusResult<Membership> {
    let id = conversation.id;
    let new_id = match mine {
        Some(seat) if !lands_on(seat.state) => {
            return Err(BusError::conflict(format!(
                "window `{}` proposes moving its seat here, but this window's own seat is {}; a \
                 transfer can land only on a window without an active or removed seat. {}",
                source.session,
                seat.state,
                if seat.state == SeatState::Active {
                    "Leave with this window first, then join again."
                } else {
                    "An owner or moderator must re-admit this window first."
                }
            )));
        }
        Some(seat) => {
            sqlx::query(
                "UPDATE conversation_members
                 SET role = $2, state = 'active', history_from_seq = $3, joined_at = now(),
                     transfer_to_session = NULL, superseded_by = NULL, updated_at = now()
                 WHERE id = $1",
            )
            .bind(seat.id)
            .bind(source.role)
            .bind(source.history_from_seq)
            .execute(&mut *conn)
            .await?;
            seat.id
        }
        None => {
            let new_id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO conversation_members
                     (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq,
                      invited_by, joined_at)
                 VALUES ($1, $2, $3, $4, $5, $6, 'active', $7, $4, now())",
            )
            .bind(new_id)
            .bind(me.team_id)
            .bind(id)
            .bind(me.agent_id)
            .bind(&me.window)
            .bind(source.role)
            .bind(source.history_from_seq)
            .execute(&mut *conn)
            .await?;
            new_id
        }
    };
    sqlx::query(
        "UPDATE conversation_members
         SET state = 'left', left_at = now(), superseded_by = $2, transfer_to_session = NULL,
             updated_at = now()
         WHERE id = $1",
    )
    .bind(source.id)
    .bind(new_id)
    .execute(&mut *conn)
    .await?;
    let moved = sqlx::query(
        "UPDATE message_receipts r SET member_id = $3
         WHERE r.team_id = $1 AND r.member_id = $2
           AND NOT EXISTS (SELECT 1 FROM message_receipts n
                           WHERE n.team_id = r.team_id AND n.message_id = r.message_id
                             AND n.member_id = $3)",
    )
    .bind(me.team_id)
    .bind(source.id)
    .bind(new_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    // Receipts moved onto a seat the inbox top-up may have walked already
    // (`store::conversations::inbox`): it walks that seat again from what is owed.
    sqlx::query("DELETE FROM inbox_topup_marks WHERE team_id = $1 AND member_id = $2")
        .bind(me.team_id)
        .bind(new_id)
        .execute(&mut *conn)
        .await?;
    let from = store::address(&me.agent, &source.session);
    audit_own(
        conn,
        me,
        id,
        "transfer",
        serde_json::json!({
            "phase": "completed", "from": from, "role": source.role,
            "history_from_seq": source.history_from_seq, "receipts_moved": moved,
        }),
    )
    .await?;
    Ok(Membership {
        conversation_id: id,
        address: me.address(),
        role: source.role,
        state: SeatState::Active,
        history_from_seq: source.history_from_seq,
        outcome: "transferred",
        note: Some(format!(
            "this window took over the seat of {from} ({moved} receipts moved with it, timestamps \
             unchanged); that seat is superseded."
        )),
    })
}
