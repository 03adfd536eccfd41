//! The durable inbox: references owed to a recipient window ("message M, seq
//! S, from X, is in conversation C"; "your message M was acknowledged by Y"),
//! never a body.
//!
//! A reference is queued in the transaction that makes it true: at
//! confirmation for an outbox message (no reference to a message nobody
//! stored), at ack for a receipt reference (inside `store_ack`, migration
//! 0033, which computes the same recipient key in SQL). PostgreSQL never expires what is
//! owed, so whatever a broker loses is rebuilt from here and from
//! `message_receipts`. A receipt is owed to the window holding its seat now
//! (a transfer moves the seat; `recipient_session` keeps who it was sent to).
//!
//! What is owed is read a page at a time in `owed.rs` (the top-up walk, the
//! hand-out page, the bounded status counts).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::store::fenced;

mod owed;
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
pub use owed::{COUNTED_MAX, TOP_UP_STEP, owed_installation};

/// `fetch_conversation_inbox` hands out at most this many at once.
pub const FETCH_MAX: i64 = 50;
/// ... and this many when the caller does not say.
pub const FETCH_DEFAULT: i64 = 20;
/// `confirm_inbox_delivery` takes at most this many ids at once.
pub const CONFIRM_MAX: usize = 100;
/// A reference handed out and not confirmed within this long is handed out
/// again (the window may have crashed before it confirmed).
pub const HANDOUT_SECS: f64 = 60.0;

/// The deterministic key of a recipient window: the first 16 bytes of
/// SHA-256 over "<agent id>/<session label>", as 32 hex digits. It survives
/// re-registration of the window (same agent, same label), and names the
/// window's subject and consumer on a broker without exposing either.
pub fn recipient_key(agent_id: Uuid, session: &str) -> String {
    let digest = Sha256::digest(format!("{agent_id}/{session}").as_bytes());
    hex::encode(&digest[..16])
}

/// [`recipient_key`] in SQL, over columns `agent` and `session`.
macro_rules! recipient_key_sql {
    ($agent:literal, $session:literal) => {
        concat!(
            "encode(substring(sha256(convert_to(",
            $agent,
            "::text || '/' || ",
            $session,
            ", 'UTF8')) FROM 1 FOR 16), 'hex')"
        )
    };
}
pub(crate) use recipient_key_sql;

/// The statement that queues one message reference per frozen recipient of
/// each message named by `$source`, a relation with columns `team_id` and
/// `message_id`; a second run queues nothing new. Shared by
/// [`enqueue_message_references`] and the outbox's batch settle, which runs
/// it inside its one statement.
macro_rules! message_references_sql {
    ($source:literal) => {
        concat!(
            "INSERT INTO inbox_references
                 (id, team_id, recipient_key, recipient_id, recipient_session, kind,
                  conversation_id, message_id, seq, actor)
             SELECT gen_random_uuid(), r.team_id, ",
            $crate::store::conversations::inbox::recipient_key_sql!("w.agent_id", "w.session"),
            ", w.agent_id, w.session, 'message', m.conversation_id, m.id, m.seq,
                    CASE WHEN m.sender_session = '' THEN a.name ELSE a.name || '/' || m.sender_session END
               FROM ",
            $source,
            " AS s
               JOIN message_receipts r ON r.team_id = s.team_id AND r.message_id = s.message_id
               -- The window that holds the receipt's seat now (a transfer moves it).
               JOIN conversation_members w ON w.team_id = r.team_id AND w.id = r.member_id
               JOIN conversation_messages m ON m.team_id = r.team_id AND m.id = r.message_id
               JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
             ON CONFLICT DO NOTHING"
        )
    };
}
pub(crate) use message_references_sql;

/// Queue one message reference per frozen recipient of each message (given
/// as `(team_id, message_id)`). Called in the transaction that records the
/// messages as stored; a second call queues nothing new.
pub async fn enqueue_message_references(
    tx: &mut sqlx::PgConnection,
    messages: &[(Uuid, Uuid)],
) -> BusResult<u64> {
    let teams: Vec<Uuid> = messages.iter().map(|m| m.0).collect();
    let ids: Vec<Uuid> = messages.iter().map(|m| m.1).collect();
    let queued = sqlx::query(message_references_sql!(
        "(SELECT * FROM unnest($1::uuid[], $2::uuid[]) AS u(team_id, message_id))"
    ))
    .bind(&teams)
    .bind(&ids)
    .execute(tx)
    .await?;
    Ok(queued.rows_affected())
}

// What a window is handed is the contract both sides keep: the agent side
// spools these very references (`acs_agent::client::spool`).
pub use acs_wire::inbox::{InboxKind, InboxReference as Delivery};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fetched {
    pub deliveries: Vec<Delivery>,
    /// More references are owed than this call handed out.
    pub more: bool,
}

pub fn check_fetch_limit(limit: Option<i64>) -> BusResult<i64> {
    // Worded `1..50`, as this tool has always said it (the suite checks the
    // text), rather than in limits::page_limit's words.
    let limit = limit.unwrap_or(FETCH_DEFAULT);
    if !(1..=FETCH_MAX).contains(&limit) {
        return Err(BusError::invalid(format!(
            "limit must be 1..{FETCH_MAX}; got {limit}. Omit it for {FETCH_DEFAULT}."
        )));
    }
    Ok(limit)
}

/// `fetch_conversation_inbox`: hand out references owed to this window, in
/// seq order within each conversation, conversations by their oldest owed
/// reference. What is owed comes from PostgreSQL, which never expires it:
/// references queued at confirmation, topped up from this window's receipts
/// not yet delivered (messages stored on the synchronous path, or whatever a
/// broker lost). A reference is handed out once at a time: again only if not
/// confirmed within [`HANDOUT_SECS`].
///
/// The order is PostgreSQL's, never the broker's: references are queued
/// when their messages are confirmed, and a retried publish confirms seq 9
/// after seq 10, so neither queue time nor the inbox stream's order is the
/// conversation's.
///
/// One round trip: `fetch_inbox_page` (migration 0039) runs the write
/// fence, the borrowed-label refusal, the top-up walk, the page and the
/// hand-out mark; `owed.rs` says how each is bounded.
pub async fn fetch(bus: &Bus, me: &Identity, limit: i64) -> BusResult<Fetched> {
    let key = recipient_key(me.agent_id, &me.window);
    let (outcome, detail) = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM fetch_inbox_page($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        me,
    )
    .bind(&me.window)
    .bind(me.session_credential.is_none() && !me.window.is_empty())
    .bind(&key)
    .bind(limit)
    .bind(TOP_UP_STEP)
    .bind(HANDOUT_SECS)
    .fetch_one(&bus.pool)
    .await?
    .outcome(me)?;
    if outcome == "borrowed" {
        return Err(crate::store::conversations::borrowed_label(me));
    }
    fenced::detail(detail)
}

#[derive(Clone, Debug, Serialize)]
pub struct Confirmed {
    /// Confirmed by this call.
    pub confirmed: usize,
    /// Confirmed before (a repeat changes nothing).
    pub already_confirmed: usize,
    /// Not references of this window.
    pub unknown: Vec<Uuid>,
    /// Broker ack subjects of the references named, for the broker ack that
    /// follows the database write.
    #[serde(skip)]
    pub broker_acks: Vec<String>,
}

/// `confirm_inbox_delivery`'s PostgreSQL part: record `delivered` (on the
/// reference and, for a message, on this window's receipt) before anything
/// is acknowledged to a broker, so a crash between the two re-delivers
/// rather than loses. Idempotent. One round trip:
/// `confirm_inbox_references` (migration 0033) runs the write fence, the
/// borrowed-label refusal and the marks.
pub async fn confirm(bus: &Bus, me: &Identity, ids: &[Uuid]) -> BusResult<Confirmed> {
    if ids.is_empty() || ids.len() > CONFIRM_MAX {
        return Err(BusError::invalid(format!(
            "delivery_ids holds {} ids (duplicates count); give 1..{CONFIRM_MAX} delivery_id \
             values from fetch_conversation_inbox.",
            ids.len()
        )));
    }
    let key = recipient_key(me.agent_id, &me.window);
    #[derive(serde::Deserialize)]
    struct Row {
        id: Uuid,
        fresh: bool,
        broker_ack: Option<String>,
    }
    let (outcome, detail) = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM confirm_inbox_references($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        me,
    )
    .bind(&me.window)
    .bind(me.session_credential.is_none() && !me.window.is_empty())
    .bind(&key)
    .bind(ids)
    .fetch_one(&bus.pool)
    .await?
    .outcome(me)?;
    if outcome == "borrowed" {
        return Err(crate::store::conversations::borrowed_label(me));
    }
    let rows: Vec<Row> = fenced::detail(detail)?;
    let known: std::collections::HashSet<Uuid> = rows.iter().map(|r| r.id).collect();
    let mut unknown: Vec<Uuid> = ids
        .iter()
        .filter(|id| !known.contains(id))
        .copied()
        .collect();
    unknown.sort();
    unknown.dedup();
    Ok(Confirmed {
        confirmed: rows.iter().filter(|r| r.fresh).count(),
        already_confirmed: rows.iter().filter(|r| !r.fresh).count(),
        unknown,
        broker_acks: rows.into_iter().filter_map(|r| r.broker_ack).collect(),
    })
}

/// What PostgreSQL says is owed to a window.
#[derive(Clone, Debug, Serialize, Default)]
pub struct Owed {
    pub recipient_key: String,
    /// References not yet confirmed (including receipts not yet turned into
    /// references). Counted up to [`COUNTED_MAX`]: see `owed_at_least`.
    pub owed: i64,
    /// True when a count stopped at [`COUNTED_MAX`]: at least `owed` are
    /// owed, maybe more. Fetch and confirm to bring it down.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub owed_at_least: bool,
    /// Of those, handed out and awaiting confirmation.
    pub handed_out: i64,
}

/// Refuses a bare agent token wearing the label of a live registered window
/// (in the counts' one call).
pub async fn owed(bus: &Bus, me: &Identity) -> BusResult<Owed> {
    let key = recipient_key(me.agent_id, &me.window);
    let counts = owed::counts(&bus.pool, me, &key).await?;
    let counted = counts.queued + counts.unqueued;
    Ok(Owed {
        recipient_key: key,
        owed: counted.min(COUNTED_MAX),
        owed_at_least: counts.at_least || counted >= COUNTED_MAX,
        handed_out: counts.handed_out,
    })
}

/// A window's inbox is private like its conversations: the bare agent token
/// wearing the label of a live authenticated window reaches none of it (the
/// rule of `conversations::refuse_borrowed_label`).
async fn refuse_borrowed_label(bus: &Bus, me: &Identity) -> BusResult<()> {
    if me.session_credential.is_some() || me.window.is_empty() {
        return Ok(());
    }
    let mut conn = bus.pool.acquire().await?;
    crate::store::conversations::refuse_borrowed_label(&mut conn, me).await
}

/// Whether a team's inbox goes through the broker: routed to JetStream, on a
/// server that has one.
async fn broker_for(
    bus: &Bus,
    team_id: Uuid,
) -> BusResult<Option<&crate::backend::jetstream::Broker>> {
    let Some(broker) = bus.backends.broker() else {
        return Ok(None);
    };
    let routed: bool =
        sqlx::query_scalar("SELECT conversation_backend = 'jetstream' FROM teams WHERE id = $1")
            .bind(team_id)
            .fetch_one(&bus.pool)
            .await?;
    Ok(routed.then_some(broker))
}

/// How long a fetch waits on the broker's consumer for a first reference.
const BROKER_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// `fetch_conversation_inbox`: the broker's consumer first (on a team routed
/// to JetStream; a consumer someone deleted is created again, and anything
/// the broker lost is still owed in PostgreSQL), then topped up from
/// PostgreSQL, which also decides the order ([`fetch`]). A broker that does
/// not answer costs nothing but speed.
pub async fn fetch_inbox(bus: &Bus, me: &Identity, limit: i64) -> BusResult<Fetched> {
    let key = recipient_key(me.agent_id, &me.window);
    let mut from_broker: Vec<(Uuid, String)> = Vec::new();
    let broker = broker_for(bus, me.team_id).await?;
    if let Some(broker) = broker {
        // Before the broker is asked: a borrowed label must not consume
        // anything. (Without a broker, `fetch` refuses it in its one call.)
        refuse_borrowed_label(bus, me).await?;
        match broker
            .fetch_inbox(me.team_id, &key, limit as usize, BROKER_WAIT)
            .await
        {
            Ok(deliveries) => {
                for delivery in deliveries {
                    match delivery_id_of(&delivery.payload) {
                        Some(id) => from_broker.push((id, delivery.ack_subject)),
                        // Not ours to read: drop it from the queue.
                        None => ack_quietly(broker, me.team_id, &key, &delivery.ack_subject).await,
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "inbox consumer unavailable; serving from PostgreSQL")
            }
        }
    }
    let fetched = fetch(bus, me, limit).await?;
    if let Some(broker) = broker
        && !from_broker.is_empty()
    {
        // Keep each hand-out's ack subject for the confirmation; a reference
        // confirmed before (a redelivery) is acked at once.
        for stale in record_broker_acks(&bus.pool, me.team_id, &key, &from_broker).await? {
            ack_quietly(broker, me.team_id, &key, &stale).await;
        }
    }
    Ok(fetched)
}

fn delivery_id_of(payload: &[u8]) -> Option<Uuid> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    value.get("delivery_id")?.as_str()?.parse().ok()
}

async fn ack_quietly(
    broker: &crate::backend::jetstream::Broker,
    team_id: Uuid,
    key: &str,
    ack_subject: &str,
) {
    if let Err(e) = broker.ack_inbox(team_id, key, ack_subject).await {
        // Unacked, the broker offers it again later, and it is acked then.
        tracing::debug!(error = %e, "could not ack an inbox reference on the broker");
    }
}

/// Record the ack subject of each broker hand-out; returns the subjects of
/// references already delivered (or unknown), which can be acked now.
async fn record_broker_acks(
    pool: &sqlx::PgPool,
    team_id: Uuid,
    key: &str,
    handed: &[(Uuid, String)],
) -> BusResult<Vec<String>> {
    let ids: Vec<Uuid> = handed.iter().map(|h| h.0).collect();
    let subjects: Vec<String> = handed.iter().map(|h| h.1.clone()).collect();
    // The rows are locked in id order, as a confirmation locks them: in the
    // broker's order (a redelivery comes after newer references) each could
    // hold a row the other waits on.
    let owed: Vec<Uuid> = sqlx::query_scalar(
        "WITH handed AS (
             SELECT * FROM unnest($3::uuid[], $4::text[]) AS h(id, subject)),
         locked AS (
             SELECT i.id FROM inbox_references i JOIN handed h ON h.id = i.id
              WHERE i.team_id = $1 AND i.recipient_key = $2
              ORDER BY i.id
              FOR NO KEY UPDATE OF i)
         UPDATE inbox_references i SET broker_ack = h.subject
           FROM locked JOIN handed h ON h.id = locked.id
          WHERE i.id = locked.id AND i.delivered_at IS NULL
          RETURNING i.id",
    )
    .bind(team_id)
    .bind(key)
    .bind(&ids)
    .bind(&subjects)
    .fetch_all(pool)
    .await?;
    let owed: std::collections::HashSet<Uuid> = owed.into_iter().collect();
    Ok(handed
        .iter()
        .filter(|(id, _)| !owed.contains(id))
        .map(|(_, subject)| subject.clone())
        .collect())
}

/// `confirm_inbox_delivery`: `delivered` is committed in PostgreSQL first,
/// and only then are the broker's hand-outs acked (a crash in between
/// re-delivers a reference, which is acked then; it never loses one).
pub async fn confirm_delivery(bus: &Bus, me: &Identity, ids: &[Uuid]) -> BusResult<Confirmed> {
    // The borrowed-label refusal is inside `confirm`'s one round trip.
    let confirmed = confirm(bus, me, ids).await?;
    if !confirmed.broker_acks.is_empty()
        && let Some(broker) = bus.backends.broker()
    {
        let key = recipient_key(me.agent_id, &me.window);
        for subject in &confirmed.broker_acks {
            ack_quietly(broker, me.team_id, &key, subject).await;
        }
    }
    Ok(confirmed)
}

/// `conversation_inbox_status`.
#[derive(Clone, Debug, Serialize)]
pub struct InboxStatus {
    #[serde(flatten)]
    pub owed: Owed,
    /// `not_used` (no broker for this team's conversations), `present`,
    /// `missing` (created again on the next fetch; nothing owed is lost) or
    /// `unreachable`.
    pub consumer: String,
}

pub async fn status(bus: &Bus, me: &Identity) -> BusResult<InboxStatus> {
    // The borrowed-label refusal is inside the counts' one call.
    let owed = owed(bus, me).await?;
    let consumer = match broker_for(bus, me.team_id).await? {
        None => "not_used",
        Some(broker) => match broker
            .inbox_consumer_exists(me.team_id, &owed.recipient_key)
            .await
        {
            Ok(true) => "present",
            Ok(false) => "missing",
            Err(_) => "unreachable",
        },
    };
    Ok(InboxStatus {
        owed,
        consumer: consumer.into(),
    })
}

/// A reference waiting for the inbox publisher.
#[derive(Clone, Debug)]
pub struct Queued {
    pub team_id: Uuid,
    pub recipient_key: String,
    pub delivery: Delivery,
}

/// References of teams routed to JetStream not yet on the broker, oldest
/// first. Read without a lock: publishing twice is deduplicated by id.
pub async fn unpublished(pool: &sqlx::PgPool, limit: i64) -> BusResult<Vec<Queued>> {
    // The reference as JSON, the shape the wire crate defines (as
    // fetch_inbox_page answers it).
    #[derive(sqlx::FromRow)]
    struct Row {
        team_id: Uuid,
        recipient_key: String,
        delivery: sqlx::types::Json<Delivery>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT i.team_id, i.recipient_key,
                json_build_object('delivery_id', i.id, 'kind', i.kind,
                                  'conversation_id', i.conversation_id, 'message_id', i.message_id,
                                  'seq', i.seq, 'from', i.actor,
                                  'receipt', NULLIF(i.receipt, ''), 'queued_at', i.created_at)
                    AS delivery
           FROM inbox_references i JOIN teams t ON t.id = i.team_id
          WHERE i.published_at IS NULL AND i.delivered_at IS NULL
            AND t.conversation_backend = 'jetstream'
          -- References queued together (one confirmation) go out in seq order.
          ORDER BY i.created_at, i.conversation_id, i.seq, i.id
          LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Queued {
            team_id: r.team_id,
            recipient_key: r.recipient_key,
            delivery: r.delivery.0,
        })
        .collect())
}

/// Record the stream sequences of published references (first writer wins).
pub async fn mark_published(pool: &sqlx::PgPool, published: &[(Uuid, u64)]) -> BusResult<u64> {
    if published.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = published.iter().map(|p| p.0).collect();
    let seqs: Vec<i64> = published.iter().map(|p| p.1 as i64).collect();
    // Rows another transaction holds are skipped, not waited for: a window's
    // fetch or confirmation (each locking its rows in its own order) and this
    // update waiting on each other's rows was a deadlock (seen once in a chaos
    // run), and the side aborted may be the window's request. A row skipped
    // is published again next pass, which the broker deduplicates by its id.
    let done = sqlx::query(
        "WITH mine AS (
             SELECT id FROM inbox_references
              WHERE id = ANY($1) AND published_at IS NULL
              ORDER BY id
                FOR NO KEY UPDATE SKIP LOCKED)
         UPDATE inbox_references i SET published_at = now(), broker_seq = p.seq
           FROM unnest($1::uuid[], $2::bigint[]) AS p(id, seq), mine
          WHERE i.id = p.id AND i.id = mine.id",
    )
    .bind(&ids)
    .bind(&seqs)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Release (delete) at most `batch` references owed to windows dead for
/// longer than `retention`; returns how many went. A window is dead that
/// long when, for all of `retention`, it had no live heartbeat, no live
/// session credential and no fetch or confirmation, and the reference has
/// been owed at least that long. The receipts stay: a window that returns
/// gets its references again from them on its next fetch (and reads with
/// `read_conversation`); a copy left on the broker is acked away then as
/// unknown. Rows another transaction holds are skipped, never waited on.
pub async fn release_owed_to_dead_windows(
    pool: &sqlx::PgPool,
    retention: std::time::Duration,
    batch: i64,
) -> BusResult<u64> {
    let retention = sqlx::postgres::types::PgInterval::try_from(retention).map_err(|_| {
        BusError::invalid("the inbox retention is too long to express as an interval")
    })?;
    // The released windows' top-up marks go with their references: a
    // window that comes back is topped up again from what it is owed.
    let released: i64 = sqlx::query_scalar(
        "WITH released AS (
         DELETE FROM inbox_references i
         USING (SELECT r.id FROM inbox_references r
                 WHERE r.delivered_at IS NULL AND r.created_at < now() - $1
                   AND NOT EXISTS (
                       SELECT 1 FROM presence p
                        WHERE p.team_id = r.team_id AND p.agent_id = r.recipient_id
                          AND p.session = r.recipient_session AND p.expires_at >= now() - $1)
                   AND NOT EXISTS (
                       SELECT 1 FROM agent_sessions s
                        WHERE s.team_id = r.team_id AND s.agent_id = r.recipient_id
                          AND s.label = r.recipient_session
                          AND COALESCE(s.revoked_at, s.expires_at) >= now() - $1)
                   AND NOT EXISTS (
                       SELECT 1 FROM inbox_references o
                        WHERE o.team_id = r.team_id AND o.recipient_key = r.recipient_key
                          AND (o.handed_out_at >= now() - $1 OR o.delivered_at >= now() - $1))
                 LIMIT $2 FOR UPDATE SKIP LOCKED) dead
         WHERE i.id = dead.id AND i.delivered_at IS NULL
         RETURNING i.team_id, i.recipient_key),
         forgotten AS (
             DELETE FROM inbox_topup_marks k
              USING (SELECT DISTINCT team_id, recipient_key FROM released) r
              WHERE k.team_id = r.team_id AND k.recipient_key = r.recipient_key)
         SELECT count(*) FROM released",
    )
    .bind(retention)
    .bind(batch)
    .fetch_one(pool)
    .await?;
    Ok(released as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipient_key_is_32_hex_and_depends_on_both_parts() {
        let agent = Uuid::nil();
        let key = recipient_key(agent, "laptop");
        assert_eq!(key.len(), 32);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(key, recipient_key(agent, "laptop"));
        assert_ne!(key, recipient_key(agent, "desktop"));
        assert_ne!(key, recipient_key(Uuid::from_u128(1), "laptop"));
    }
}
