//! `pending_for_me`: what needs this window now, in one bounded call. Made
//! for the moments a host lets a client speak to the model (a session
//! start, a prompt, a stop), where a hook has a second or two and one round
//! trip: unread direct messages (oldest first, without moving the read
//! cursor), questions asked of this window that it has not answered,
//! conversations owing its acknowledgement (and the oldest such messages,
//! previewed), its tasks whose lease is about to lapse, announcements
//! since a time, and what it holds (claimed tasks, locks, path reservations:
//! `holdings.rs`), which the host's Stop hook asks it to finish or release,
//! and the direct and channel messages asking its agent for an
//! acknowledgement (`acks/owed.rs`), which the Stop hook names too.
//!
//! Every list is cut to a few entries and every read walks a bounded slice
//! of an index (the newest direct messages to the agent, the team's newest
//! messages), so the cost does not grow with the team's history.
//!
//! Nothing here writes: reading what is pending marks nothing read. Unread
//! direct messages are counted as `whoami` counts them: a DM to the agent as
//! a whole that any window of the agent read is not unread here.

use std::sync::LazyLock;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use sqlx::types::Json;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::conversations::receipts::{self, Pending};
use crate::store::messaging::acks::owed::{self as owed, OwedAck, PendingAcks};
use crate::store::messaging::holdings::{self, Holdings};
use crate::store::messaging::messages::{self, BoundedCount};

/// Unread direct messages shown (the count says how many there are).
const DIRECT_SHOWN: i64 = 5;
/// Open questions shown, found among the newest direct messages to the agent.
const QUESTIONS_SHOWN: i64 = 10;
const QUESTIONS_SCANNED: i64 = 200;
/// Announcements shown, found among the team's newest messages.
const ANNOUNCEMENTS_SHOWN: i64 = 5;
const ANNOUNCEMENTS_SCANNED: i64 = 1_000;
const CONVERSATIONS_SHOWN: i64 = 20;
/// Conversation messages awaiting this window's acknowledgement, shown with
/// a preview (the oldest first).
const AWAITING_SHOWN: i64 = 5;
const TASKS_SHOWN: i64 = 20;
/// `lease_within_seconds`: default and bounds.
pub const LEASE_WITHIN_DEFAULT: i64 = 300;
const LEASE_WITHIN_MAX: i64 = 86_400;
/// `since` reaches back at most this far.
const SINCE_MAX: Duration = Duration::days(7);

/// A message, shortened.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Preview {
    pub message_id: Uuid,
    pub from: String,
    /// The channel, for an announcement.
    pub channel: Option<String>,
    pub at: DateTime<Utc>,
    /// The body's first 280 characters.
    pub preview: String,
    /// True when the body is longer than the preview.
    pub truncated: bool,
}

/// A conversation message addressed to this window, not yet acknowledged.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AwaitingAck {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub title: String,
    pub seq: i64,
    pub from: String,
    pub at: DateTime<Utc>,
    /// The body's first 280 characters; None when the body is not held here
    /// (on the broker, or tombstoned): read it with read_conversation.
    pub preview: Option<String>,
    /// True when a client already put it in front of this window's model
    /// (`mark_presented`): a hook does not show it again.
    pub presented: bool,
}

/// A task of this window whose lease is about to lapse.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExpiringTask {
    pub key: String,
    pub title: String,
    pub lease_expires_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PendingForMe {
    /// How many direct messages this window has not read (capped like whoami's).
    pub unread_direct_messages: BoundedCount,
    /// The oldest of them (read_messages still returns them as new).
    pub direct_messages: Vec<Preview>,
    /// Questions (ask_agent) to this window or its whole agent that the
    /// agent has not replied to, newest first.
    pub open_questions: Vec<Preview>,
    /// Conversations where this window owes acknowledgements.
    pub conversations: Vec<Pending>,
    /// The oldest conversation messages it has not acknowledged, with previews.
    pub awaiting_ack: Vec<AwaitingAck>,
    /// Tasks this window holds whose lease lapses within `lease_within_seconds`.
    pub expiring_tasks: Vec<ExpiringTask>,
    /// Announcements after `since`, newest first (none without `since`).
    pub announcements: Vec<Preview>,
    /// What this window holds: each kind counted and its first few listed.
    pub holdings: Holdings,
    /// Direct and channel messages asking this window's agent for an
    /// acknowledgement it has not given: counted, the oldest ten listed,
    /// overdue ones marked (conversation messages are `conversations`).
    pub owed_acks: PendingAcks,
}

/// `pending_for_me`.
pub async fn pending_for_me(
    bus: &Bus,
    me: &Identity,
    since: Option<DateTime<Utc>>,
    lease_within_seconds: Option<i64>,
) -> BusResult<PendingForMe> {
    let within = lease_within_seconds.unwrap_or(LEASE_WITHIN_DEFAULT);
    if !(1..=LEASE_WITHIN_MAX).contains(&within) {
        return Err(BusError::invalid(format!(
            "lease_within_seconds must be 1..{LEASE_WITHIN_MAX}; got {within}. Omit it for \
             {LEASE_WITHIN_DEFAULT} (leases lapsing in the next five minutes)."
        )));
    }
    let now = Utc::now();
    if since.is_some_and(|s| s > now + Duration::minutes(5)) {
        return Err(BusError::invalid(
            "since is in the future; give the time you last looked (RFC 3339), or omit it \
             for no announcements",
        ));
    }
    let since = since.map(|s| s.max(now - SINCE_MAX));
    let Lists {
        unread,
        direct,
        questions,
        expiring,
        announcements,
        conversations,
        awaiting,
        holdings,
        owed,
    } = lists(bus, me, within, since).await?;
    Ok(PendingForMe {
        unread_direct_messages: BoundedCount::of(unread, messages::UNREAD_COUNT_CAP),
        direct_messages: direct.0,
        open_questions: questions.0,
        conversations: conversations.0,
        awaiting_ack: awaiting.0,
        expiring_tasks: expiring.0,
        announcements: announcements.0,
        holdings: holdings.holdings(),
        owed_acks: PendingAcks::of(owed.0),
    })
}

/// A [`Preview`] of message `m` (its sender joined as `s`, its channel as
/// `c`): the sender's address (`agent` or `agent/window`), and the body's
/// first 280 characters.
macro_rules! preview_columns {
    () => {
        "m.id AS message_id,
         CASE WHEN m.sender_session = '' THEN s.name ELSE s.name || '/' || m.sender_session END AS from,
         c.name AS channel, m.created_at AS at,
         left(m.body, 280) AS preview, char_length(m.body) > 280 AS truncated"
    };
}

/// Every list of [`PendingForMe`] in one statement (one round trip, one
/// hand-out of a pooled connection): the window's unread direct messages
/// (counted as `unread_direct` counts them, up to the cap, and the oldest
/// [`DIRECT_SHOWN`] previewed), the questions asked of it not yet answered
/// (among the newest [`QUESTIONS_SCANNED`] direct messages to its agent),
/// its claims whose lease lapses within `within` seconds, with `since` the
/// announcements after it (among the team's newest
/// [`ANNOUNCEMENTS_SCANNED`] messages), the conversations where it owes
/// acknowledgements and, only when there are some, the oldest such
/// messages, what it holds ([`holdings`]) and what its agent owes
/// ([`owed`]). Each list comes as JSON.
#[derive(sqlx::FromRow)]
struct Lists {
    unread: i64,
    direct: Json<Vec<Preview>>,
    questions: Json<Vec<Preview>>,
    expiring: Json<Vec<ExpiringTask>>,
    announcements: Json<Vec<Preview>>,
    conversations: Json<Vec<Pending>>,
    awaiting: Json<Vec<AwaitingAck>>,
    #[sqlx(flatten)]
    holdings: holdings::HoldingsRow,
    owed: Json<Vec<OwedAck>>,
}

async fn lists(
    bus: &Bus,
    me: &Identity,
    within: i64,
    since: Option<DateTime<Utc>>,
) -> BusResult<Lists> {
    static LISTS: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{cursor}, unread AS MATERIALIZED ({unread_ids}),
             owed_conversations AS MATERIALIZED ({owed_conversations}),
             {holdings_items}
             SELECT
               (SELECT count(*) FROM unread) AS unread,
               (SELECT coalesce(json_agg(p ORDER BY p.position), '[]') FROM (
                  SELECT m.position, {preview}
                  FROM (SELECT id FROM unread ORDER BY position LIMIT $5){lookup} {joins}
                  WHERE m.team_id = $1) p) AS direct,
               (SELECT coalesce(json_agg(q ORDER BY q.position DESC), '[]') FROM (
                  SELECT m.position, {preview}
                  FROM (SELECT * FROM messages
                        WHERE team_id = $1 AND recipient_id = $2
                        ORDER BY position DESC LIMIT $6) m {joins}
                  WHERE m.is_question
                    AND (m.recipient_session IS NULL OR m.recipient_session = $3)
                    AND NOT (m.sender_id = $2 AND m.sender_session = $3)
                    -- A reply from any window of this agent answers it, as
                    -- ask_agent itself counts an answer.
                    AND NOT EXISTS (SELECT 1 FROM messages a
                                    WHERE a.team_id = m.team_id AND a.reply_to = m.id
                                      AND a.sender_id = $2)
                  ORDER BY m.position DESC LIMIT $7) q) AS questions,
               (SELECT coalesce(json_agg(t ORDER BY t.lease_expires_at), '[]') FROM (
                  SELECT key, title, lease_expires_at FROM tasks
                  WHERE team_id = $1 AND holder_agent_id = $2 AND holder_session = $3
                    AND status = 'claimed' AND lease_expires_at > now()
                    AND lease_expires_at <= now() + make_interval(secs => $8)
                  ORDER BY lease_expires_at LIMIT $9) t) AS expiring,
               CASE WHEN $11::timestamptz IS NULL THEN '[]'::json ELSE
                 (SELECT coalesce(json_agg(n ORDER BY n.position DESC), '[]') FROM (
                    SELECT m.position, {preview}
                    FROM (SELECT * FROM messages WHERE team_id = $1
                          ORDER BY position DESC LIMIT $10) m {joins}
                    WHERE m.announce AND m.created_at > $11
                    ORDER BY m.position DESC LIMIT $12) n)
               END AS announcements,
               (SELECT coalesce(json_agg(o ORDER BY o.first_sent_at), '[]')
                  FROM owed_conversations o) AS conversations,
               CASE WHEN NOT EXISTS (SELECT 1 FROM owed_conversations) THEN '[]'::json ELSE
                 (SELECT coalesce(json_agg(w ORDER BY w.at, w.seq), '[]') FROM ({awaiting}) w)
               END AS awaiting,
               {holdings_columns},
               (SELECT coalesce(json_agg(k ORDER BY k.sent_at, k.message_id), '[]')
                  FROM ({owed}) k) AS owed",
            cursor = messages::UNREAD_DM_CURSOR,
            unread_ids = messages::UNREAD_DM_IDS,
            owed_conversations = receipts::owed_conversations!("$13"),
            holdings_items = holdings::holdings_items!("$15"),
            lookup = messages::PAGE_LOOKUP,
            preview = preview_columns!(),
            joins = "JOIN agents s ON s.team_id = m.team_id AND s.id = m.sender_id
                     LEFT JOIN channels c ON c.team_id = m.team_id AND c.id = m.channel_id",
            awaiting = AWAITING_ACK,
            holdings_columns = holdings::holdings_columns!("$16"),
            owed = owed::messages_i_owe!("false", "$17"),
        )
    });
    Ok(sqlx::query_as(LISTS.as_str())
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(messages::UNREAD_COUNT_CAP + 1)
        .bind(DIRECT_SHOWN)
        .bind(QUESTIONS_SCANNED)
        .bind(QUESTIONS_SHOWN)
        .bind(within as f64)
        .bind(TASKS_SHOWN)
        .bind(ANNOUNCEMENTS_SCANNED)
        .bind(since)
        .bind(ANNOUNCEMENTS_SHOWN)
        .bind(CONVERSATIONS_SHOWN)
        .bind(AWAITING_SHOWN)
        .bind(holdings::COUNTED_BIND)
        .bind(holdings::SHOWN_BIND)
        .bind(owed::PENDING_BIND)
        .fetch_one(&bus.pool)
        .await?)
}

/// The conversation messages this window has not acknowledged, oldest
/// first, the first [`AWAITING_SHOWN`] ($14).
const AWAITING_ACK: &str = "SELECT m.id AS message_id, m.conversation_id, c.title, m.seq,
        CASE WHEN m.sender_session = '' THEN a.name
             ELSE a.name || '/' || m.sender_session END AS from,
        m.created_at AS at,
        CASE WHEN m.tombstoned_at IS NULL AND m.body <> '' THEN left(m.body, 280) END
            AS preview,
        r.presented_at IS NOT NULL AS presented
 FROM conversation_members s
 JOIN message_receipts r ON r.team_id = s.team_id AND r.member_id = s.id
 JOIN conversation_messages m ON m.team_id = r.team_id AND m.id = r.message_id
 JOIN conversations c ON c.team_id = m.team_id AND c.id = m.conversation_id
 JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
 WHERE s.team_id = $1 AND s.agent_id = $2 AND s.session = $3 AND s.state = 'active'
   AND r.acknowledged_at IS NULL AND r.stored_at IS NOT NULL
 ORDER BY m.created_at, m.seq LIMIT $14";
