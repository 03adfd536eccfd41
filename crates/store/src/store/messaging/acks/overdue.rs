//! Overdue acknowledgements: the `ack.overdue` webhook event, fired once per
//! (message, debtor) by a worker pass (`workers/ack_overdue.rs` in the
//! server), and the dashboard's list of what is overdue now.
//!
//! Once, across replicas: a pass claims overdue messages not yet marked
//! (`ack_overdue_fired_at IS NULL`, rows locked FOR UPDATE SKIP LOCKED, so two
//! replicas never claim the same one), marks them, and enqueues one delivery
//! per debtor who has not acked then (`webhook_enqueue`, migrations 0025 and
//! 0027), all in one statement: the mark and the deliveries commit together
//! or not at all. A debtor who acks later is not told again; one who never
//! acks is not told twice.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::BusResult;

/// Messages one pass claims.
pub const FIRE_BATCH: i64 = 100;

/// Who still owes `m` (a claimed or listed message): its DM recipient, or
/// every other agent that existed when it was posted; disabled agents owe
/// nothing; those who acked are gone.
macro_rules! debtors_of_m {
    () => {
        " JOIN agents a ON a.team_id = m.team_id AND a.disabled_at IS NULL
            AND CASE WHEN m.recipient_id IS NOT NULL THEN a.id = m.recipient_id
                     ELSE a.id <> m.sender_id AND a.created_at <= m.created_at END
            AND NOT EXISTS (SELECT 1 FROM message_acks k
                            WHERE k.team_id = m.team_id AND k.message_id = m.id
                              AND k.agent_id = a.id)"
    };
}

/// One pass: fire `ack.overdue` for up to `batch` messages whose due time
/// passed. Returns how many deliveries it queued (hooks × debtors).
pub async fn fire_overdue(pool: &PgPool, batch: i64) -> BusResult<u64> {
    let queued: i64 = sqlx::query_scalar(concat!(
        "WITH claimed AS (
             UPDATE messages m SET ack_overdue_fired_at = now()
             FROM (SELECT team_id, id FROM messages
                    WHERE ack_required AND ack_due_at IS NOT NULL
                      AND ack_overdue_fired_at IS NULL AND ack_due_at <= now()
                    ORDER BY ack_due_at LIMIT $1
                    FOR UPDATE SKIP LOCKED) due
             WHERE m.team_id = due.team_id AND m.id = due.id
             RETURNING m.team_id, m.id, m.channel_id, m.sender_id, m.sender_session,
                       m.recipient_id, m.recipient_session, m.created_at, m.ack_due_at
         ), fired AS (
             SELECT webhook_enqueue(
                        m.team_id, 'ack', 'ack.overdue', c.name,
                        jsonb_build_object(
                            'message_id', m.id,
                            'kind', CASE WHEN m.channel_id IS NULL THEN 'dm' ELSE 'channel' END,
                            'channel', c.name,
                            'from', webhook_address(m.team_id, m.sender_id, m.sender_session),
                            'to', CASE WHEN m.recipient_id IS NULL THEN NULL
                                       ELSE webhook_address(m.team_id, m.recipient_id,
                                                            m.recipient_session) END,
                            'debtor', a.name,
                            'sent_at', m.created_at,
                            'due_at', m.ack_due_at)) AS queued
             FROM claimed m
             LEFT JOIN channels c ON c.team_id = m.team_id AND c.id = m.channel_id",
        debtors_of_m!(),
        "    WHERE EXISTS (SELECT 1 FROM webhooks w WHERE w.team_id = m.team_id)
         )
         SELECT (SELECT count(*) FROM fired)"
    ))
    .bind(batch)
    .fetch_one(pool)
    .await?;
    Ok(queued as u64)
}

/// One overdue debt, as the dashboard shows it: never a body.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct OverdueAck {
    pub message_id: Uuid,
    /// `dm` or `channel`.
    pub kind: String,
    pub from: String,
    /// The recipient's address, for a direct message.
    pub to: Option<String>,
    pub channel: Option<String>,
    /// The agent that owes it.
    pub debtor: String,
    pub sent_at: DateTime<Utc>,
    pub due_at: DateTime<Utc>,
}

/// A team's overdue debts, the longest overdue first, at most `limit`.
pub async fn overdue_in_team(
    pool: &PgPool,
    team_id: Uuid,
    limit: i64,
) -> BusResult<Vec<OverdueAck>> {
    Ok(sqlx::query_as(concat!(
        "SELECT m.id AS message_id,
                CASE WHEN m.channel_id IS NULL THEN 'dm' ELSE 'channel' END AS kind,
                webhook_address(m.team_id, m.sender_id, m.sender_session) AS from,
                CASE WHEN m.recipient_id IS NULL THEN NULL
                     ELSE webhook_address(m.team_id, m.recipient_id, m.recipient_session) END AS to,
                c.name AS channel, a.name AS debtor, m.created_at AS sent_at, m.ack_due_at AS due_at
         FROM messages m
         LEFT JOIN channels c ON c.team_id = m.team_id AND c.id = m.channel_id",
        debtors_of_m!(),
        " WHERE m.team_id = $1 AND m.ack_required AND m.ack_due_at <= now()
          ORDER BY m.ack_due_at, m.id, a.name LIMIT $2"
    ))
    .bind(team_id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}
