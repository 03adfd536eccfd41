//! `recover_conversation_history`: with the agent token, once every session
//! of the agent is dead, read the history its seats were entitled to (the seq
//! ranges during which one of them was active), paged and audited. It never
//! writes anything else.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::access::not_found;
use super::{Conversation, audit_own, load};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::identity::sessions;

pub const RECOVER_PAGE_MAX: i64 = 200;
pub const RECOVER_PAGE_DEFAULT: i64 = 50;

/// One message as recovery returns it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct RecoveredMessage {
    pub message_id: Uuid,
    pub seq: i64,
    /// The sender's address.
    pub from: String,
    /// None when the body cannot be shown (`unavailable` says why).
    pub body: Option<String>,
    pub reply_to: Option<Uuid>,
    pub metadata: Option<Value>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Recovery {
    pub conversation_id: Uuid,
    /// The earliest seq any seat of this agent could read.
    pub history_from_seq: i64,
    /// The seq ranges a seat of this agent was active for, the only ones
    /// recovery returns (`to_seq` null: a seat is still active). Messages
    /// between them were sent while no seat of the agent was in.
    pub entitled: Vec<EntitledRange>,
    /// Pass as `after_seq` for the next page.
    pub next_after_seq: i64,
    pub messages: Vec<RecoveredMessage>,
    /// Always true: recovery reads, it never posts or acknowledges.
    pub read_only: bool,
    /// On an empty page: read past which seq, as of when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// `recover_conversation_history`: with the agent token, once every session
/// of the agent is dead (revoked, expired, or its parent token revoked), read
/// the history of a conversation any window of the agent held a seat in, only
/// the seq ranges during which one of those seats was active.
/// Read-only: the only write is its audit row; no seat, receipt or message
/// changes, and nothing here lets the caller post or acknowledge.
pub async fn recover(
    bus: &Bus,
    me: &Identity,
    id: Uuid,
    after_seq: Option<i64>,
    limit: Option<i64>,
) -> BusResult<Recovery> {
    let after_seq = after_seq.unwrap_or(0);
    if after_seq < 0 {
        return Err(BusError::invalid(format!(
            "after_seq must be 0 or more (got {after_seq}); use the next_after_seq of the \
             previous page."
        )));
    }
    let limit = crate::store::limits::page_limit(
        limit,
        crate::store::limits::Page {
            default: RECOVER_PAGE_DEFAULT,
            max: RECOVER_PAGE_MAX,
        },
        "Page with next_after_seq.",
    )?;
    if me.session_credential.is_some() {
        return Err(BusError::forbidden(
            "recover_conversation_history takes the agent token (acs_…), not a session \
             credential: it is for when every window of the agent is gone. A live window reads \
             with read_conversation.",
        ));
    }
    let mut tx = bus.pool.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let live: Vec<String> = sqlx::query_scalar(
        "SELECT s.label FROM agent_sessions s
         JOIN agent_tokens t ON t.team_id = s.team_id AND t.id = s.token_id
         WHERE s.team_id = $1 AND s.agent_id = $2
           AND s.revoked_at IS NULL AND s.expires_at > now() AND t.revoked_at IS NULL
         ORDER BY s.label",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .fetch_all(&mut *tx)
    .await?;
    if !live.is_empty() {
        return Err(BusError::forbidden(format!(
            "recovery is only for when every session of agent `{}` is dead, and {} still live \
             ({}). Read through that window's credential with read_conversation, or revoke it \
             (revoke_session) if it is truly lost, then recover.",
            me.agent,
            if live.len() == 1 {
                "1 session is".to_string()
            } else {
                format!("{} sessions are", live.len())
            },
            live.join(", ")
        )));
    }
    let conversation = load(&mut tx, me, id, false).await?;
    // The agent is entitled to what one of its seats could read while it was
    // active: the union of those activations (migration 0017 records them
    // with every seat state change). Nothing sent while every seat was out
    // (left, removed, not yet re-admitted) is returned.
    let (activations, first_boundary): (i64, Option<i64>) = sqlx::query_as(
        "SELECT count(*), min(a.from_seq) FROM conversation_seat_activity a
         JOIN conversation_members s ON s.team_id = a.team_id AND s.id = a.member_id
         WHERE a.team_id = $1 AND a.conversation_id = $2 AND s.agent_id = $3",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .fetch_one(&mut *tx)
    .await?;
    if activations == 0 {
        return Err(not_found(id));
    }
    recover_entitled(tx, me, &conversation, after_seq, limit, first_boundary).await
}

/// One range of seq an agent may recover: a seat of it was active from
/// `from_seq` through `to_seq` (None: still active).
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct EntitledRange {
    pub from_seq: i64,
    pub to_seq: Option<i64>,
}

/// The page of [`recover`] for an agent that held an active seat at some point.
async fn recover_entitled(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    me: &Identity,
    conversation: &Conversation,
    after_seq: i64,
    limit: i64,
    first_boundary: Option<i64>,
) -> BusResult<Recovery> {
    let id = conversation.id;
    if after_seq > conversation.last_seq {
        return Err(BusError::invalid(format!(
            "after_seq {after_seq} is ahead of the newest seq {} of this conversation: nothing \
             is there. Pass the next_after_seq of your last page, or omit after_seq to recover \
             from the start. Nothing was read.",
            conversation.last_seq
        )));
    }
    // Overlapping activations (a seat that left and was invited back with
    // history from the start, or a transferred seat beside its successor)
    // merge into disjoint ranges, so a message is returned once.
    let entitled: Vec<EntitledRange> = sqlx::query_as(
        "SELECT lower(r) AS from_seq, upper(r) - 1 AS to_seq
         FROM unnest((SELECT range_agg(int8range(a.from_seq, a.to_seq + 1))
                      FROM conversation_seat_activity a
                      JOIN conversation_members s ON s.team_id = a.team_id AND s.id = a.member_id
                      WHERE a.team_id = $1 AND a.conversation_id = $2 AND s.agent_id = $3)) r
         ORDER BY 1",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .fetch_all(&mut *tx)
    .await?;
    let from: Vec<i64> = entitled.iter().map(|r| r.from_seq).collect();
    let to: Vec<i64> = entitled
        .iter()
        .map(|r| r.to_seq.unwrap_or(i64::MAX))
        .collect();
    // Each range is read in seq order up to `limit` on the index, so a long
    // stretch the agent was out of costs nothing.
    let messages: Vec<RecoveredMessage> = sqlx::query_as(
        "SELECT x.* FROM unnest($3::bigint[], $4::bigint[]) AS r(from_seq, to_seq)
         CROSS JOIN LATERAL (
           SELECT m.id AS message_id, m.seq,
                  CASE WHEN m.sender_session = '' THEN a.name ELSE a.name || '/' || m.sender_session END AS \"from\",
                  CASE WHEN m.tombstoned_at IS NULL AND m.publication_state = 'stored' AND m.body <> ''
                       THEN m.body END AS body,
                  m.reply_to, m.metadata, m.created_at,
                  CASE WHEN m.tombstoned_at IS NOT NULL THEN 'tombstoned: ' || m.tombstone_reason
                       WHEN m.publication_state <> 'stored' THEN m.publication_state
                       WHEN m.body = '' THEN 'unreachable' END AS unavailable
           FROM conversation_messages m
           JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
           WHERE m.team_id = $1 AND m.conversation_id = $2
             AND m.seq > $5 AND m.seq >= r.from_seq AND m.seq <= r.to_seq
           ORDER BY m.seq
           LIMIT $6) x
         ORDER BY x.seq
         LIMIT $6",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(&from)
    .bind(&to)
    .bind(after_seq)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let next_after_seq = messages.last().map_or(after_seq, |m| m.seq);
    let note = messages.is_empty().then(|| {
        format!(
            "nothing after seq {next_after_seq} that this agent may recover (the newest is {}; \
             as of {})",
            conversation.last_seq,
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    });
    audit_own(
        &mut tx,
        me,
        conversation.id,
        "recover",
        serde_json::json!({
            "after_seq": after_seq, "returned": messages.len(), "next_after_seq": next_after_seq,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(Recovery {
        conversation_id: id,
        history_from_seq: first_boundary.unwrap_or(1),
        entitled,
        next_after_seq,
        messages,
        read_only: true,
        note,
    })
}
