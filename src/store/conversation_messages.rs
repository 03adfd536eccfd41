//! Conversation messages: `send_conversation_message`, `read_conversation`
//! and `get_conversation_message`, on the synchronous path (every body lives
//! in PostgreSQL, so `stored` is true because the send committed) and into the
//! outbox (accepted now, stored when the backend confirms).
//!
//! A send is one transaction in the lock order every conversation writer
//! follows: the write fence (`agent_write_refusal`, the guard's shared lock
//! on the agent), then the conversation row (it is the sequence allocator, so
//! sequence numbers are gap-free and commit in order), then the seats it
//! reads, then the message and its receipts. The recipient list is frozen
//! there: the active seats other than the sender's (in a project
//! conversation, only agents still holding the grant), one receipt row each.
//!
//! That transaction is one round trip: the statements run server-side in
//! `store_conversation_message` (migrations 0014, 0016), which stores only a send
//! nothing stands in the way of and otherwise declines, writing nothing. Why
//! it declined (and every refusal's wording) is worked out here, in Rust, the
//! way every other writer starts: see [`explain_unstored`].
//!
//! `request_id` makes a send safe to retry: the unique key (conversation,
//! sender, request_id) is checked under the conversation lock, so two
//! concurrent retries queue on it and the second gets the first's message
//! instead of storing the body twice.
//!
//! Reading never writes a receipt; receipts are in `receipts.rs`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::conversations::{self, Conversation, Publication, PublicationState, ReadAccess};
use super::messages::{check_body, check_limit, normalize_metadata};
use super::{lost_bodies, outbox, projects, sessions};
use crate::Bus;
use crate::auth::Identity;
use crate::backend::{BackendKind, Locator, MessagingBackend};
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};

/// What `send_conversation_message` was asked to do.
#[derive(Clone, Debug)]
pub struct NewConversationMessage {
    pub conversation_id: Uuid,
    pub body: String,
    /// A UUID from the caller: the same id is the same send.
    pub request_id: String,
    pub reply_to: Option<Uuid>,
    pub metadata: Option<Value>,
}

/// The answer to a send (or to its retry).
#[derive(Clone, Debug, Serialize)]
pub struct Sent {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    /// True when the authoritative backend holds the body (on the Postgres
    /// path: the send committed).
    pub stored: bool,
    pub publication: PublicationState,
    /// The frozen recipient list, as addresses.
    pub recipients: Vec<String>,
    pub created_at: DateTime<Utc>,
    /// True when this answer is an earlier send with the same request_id:
    /// nothing new was stored.
    pub replayed: bool,
}

/// This seat's receipt for a message, when it is a recipient.
#[derive(Clone, Debug, Serialize)]
pub struct MyReceipt {
    pub stored_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub presented_at: Option<DateTime<Utc>>,
    pub acknowledged_at: Option<DateTime<Utc>>,
    pub resolved_at: Option<DateTime<Utc>>,
}

/// Why a body cannot be shown.
#[derive(Clone, Debug, Serialize)]
pub struct Unavailable {
    /// `pending_publication`, `failed`, `tombstoned` or `unreachable`.
    pub reason: String,
    /// The tombstone's reason, or what to do.
    pub detail: String,
}

/// One message slot as a reader sees it.
#[derive(Clone, Debug, Serialize)]
pub struct ConversationMessage {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    /// The sender's address.
    pub from: String,
    /// Null when `unavailable` says why.
    pub body: Option<String>,
    pub reply_to: Option<Uuid>,
    pub metadata: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub my_receipt: Option<MyReceipt>,
    pub publication: PublicationState,
    pub unavailable: Option<Unavailable>,
}

#[derive(sqlx::FromRow)]
struct MessageRow {
    id: Uuid,
    team_id: Uuid,
    conversation_id: Uuid,
    seq: i64,
    from: String,
    body: String,
    reply_to: Option<Uuid>,
    metadata: Option<Value>,
    created_at: DateTime<Utc>,
    publication_state: PublicationState,
    tombstone_reason: Option<String>,
    backend: BackendKind,
    canonical_locator: Option<String>,
    body_sha256: Vec<u8>,
    uncertain: bool,
    /// A released body whose locator was written under another identity of
    /// its stream than the one recorded now: see `lost_bodies`.
    stream_replaced: bool,
    has_receipt: bool,
    stored_at: Option<DateTime<Utc>>,
    delivered_at: Option<DateTime<Utc>>,
    presented_at: Option<DateTime<Utc>>,
    acknowledged_at: Option<DateTime<Utc>>,
    resolved_at: Option<DateTime<Utc>>,
}

/// The columns of a [`MessageRow`] over `conversation_messages m`; `$3` is
/// the reading seat's id (NULL for a reader without a seat).
macro_rules! message_select {
    () => {
        "SELECT m.id, m.team_id, m.conversation_id, m.seq,
                CASE WHEN m.sender_session = '' THEN a.name ELSE a.name || '/' || m.sender_session END AS from,
                m.body, m.reply_to, m.metadata, m.created_at, m.publication_state, m.tombstone_reason,
                m.backend, m.canonical_locator, m.body_sha256, m.uncertain_at IS NOT NULL AS uncertain,
                m.body = '' AND COALESCE(m.stream_created_at <> (
                    SELECT s.created_at_broker FROM team_streams s
                     WHERE s.team_id = m.team_id
                       AND s.stream = split_part(m.canonical_locator, ':', 2)), false)
                    AS stream_replaced,
                r.message_id IS NOT NULL AS has_receipt, r.stored_at, r.delivered_at, r.presented_at,
                r.acknowledged_at, r.resolved_at
         FROM conversation_messages m
         JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
         LEFT JOIN message_receipts r
                ON r.team_id = m.team_id AND r.message_id = m.id AND r.member_id = $3"
    };
}

impl From<MessageRow> for ConversationMessage {
    fn from(row: MessageRow) -> ConversationMessage {
        let unavailable = if let Some(reason) = row.tombstone_reason {
            Some(Unavailable {
                reason: "tombstoned".into(),
                detail: reason,
            })
        } else {
            match row.publication_state {
                PublicationState::PendingPublication => Some(Unavailable {
                    reason: "pending_publication".into(),
                    detail: if row.uncertain {
                        "the last publish ended without an answer; the bus is asking the backend \
                         whether it holds the body. Read again shortly."
                    } else {
                        "the body is not confirmed by its backend yet; read again shortly."
                    }
                    .into(),
                }),
                PublicationState::Failed => Some(Unavailable {
                    reason: "failed".into(),
                    detail: "the backend refused this body for good; the sender may send it again."
                        .into(),
                }),
                PublicationState::Stored => None,
            }
        };
        let my_receipt = row.has_receipt.then_some(MyReceipt {
            stored_at: row.stored_at,
            delivered_at: row.delivered_at,
            presented_at: row.presented_at,
            acknowledged_at: row.acknowledged_at,
            resolved_at: row.resolved_at,
        });
        ConversationMessage {
            message_id: row.id,
            conversation_id: row.conversation_id,
            seq: row.seq,
            from: row.from,
            body: unavailable.is_none().then_some(row.body),
            reply_to: row.reply_to,
            metadata: row.metadata,
            created_at: row.created_at,
            my_receipt,
            publication: row.publication_state,
            unavailable,
        }
    }
}

fn parse_request_id(raw: &str) -> BusResult<Uuid> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        BusError::invalid(format!(
            "request_id {} is not a UUID. Generate one UUID per message (e.g. a v4) and send \
             the same one again only when retrying that same message.",
            super::text::quote(raw)
        ))
    })
}

#[derive(sqlx::FromRow)]
struct EarlierSend {
    id: Uuid,
    seq: i64,
    body_sha256: Vec<u8>,
    publication_state: PublicationState,
    created_at: DateTime<Utc>,
}

/// `send_conversation_message`.
pub async fn send(bus: &Bus, me: &Identity, mut new: NewConversationMessage) -> BusResult<Sent> {
    check_body(&new.body)?;
    outbox::check_payload(&new.body)?;
    let metadata = normalize_metadata(new.metadata.take())?;
    let request_id = parse_request_id(&new.request_id)?;
    let digest: [u8; 32] = Sha256::digest(new.body.as_bytes()).into();
    let send = Validated {
        new: &new,
        request_id,
        digest,
        metadata,
        // Time-ordered (UUIDv7): new messages land at the end of the id
        // indexes (the message's and its receipts'), not on a random page
        // each, which would write a full page image to the WAL for nearly
        // every send after a checkpoint.
        id: Uuid::now_v7(),
    };

    // A send that nothing stands in the way of is stored in one round trip.
    // Anything else is worked out by `explain_unstored`: a refusal, or the
    // original of a retried send. Neither finding anything means what stood in
    // the way changed in between (say, an invitation accepted): try again.
    for _ in 0..STORE_ATTEMPTS {
        if let Some(sent) = store_if_clear(bus, me, &send).await? {
            return Ok(sent);
        }
        if let Some(original) = explain_unstored(bus, me, &send).await? {
            return Ok(original);
        }
    }
    Err(BusError::conflict(
        "this send could not be stored; nothing was changed. Retry with the same request_id.",
    ))
}

/// How often a send that is neither stored nor refused is tried again before
/// the caller is asked to retry: each try means the conversation changed
/// under it, which takes a concurrent membership change every time.
const STORE_ATTEMPTS: usize = 3;

/// SQLSTATE of `store_conversation_message` declining a send (migration 0014).
const NOT_STORED: &str = "AC001";

/// A send's arguments, checked, with the id its message will have.
struct Validated<'a> {
    new: &'a NewConversationMessage,
    request_id: Uuid,
    digest: [u8; 32],
    metadata: Option<Value>,
    id: Uuid,
}

/// The send's writes, in one round trip: `store_conversation_message`
/// (migration 0016) takes the locks in the writers' order (the write fence,
/// then the conversation row, claiming the next seq), re-reads the seat,
/// grant and `reply_to` after the lock, freezes the recipients, inserts the message, its receipts and (on an
/// outbox conversation) its slot, and commits. None: it declined and wrote
/// nothing (the claimed seq went with its transaction), because something
/// stands in the way; [`explain_unstored`] says what.
async fn store_if_clear(bus: &Bus, me: &Identity, send: &Validated<'_>) -> BusResult<Option<Sent>> {
    #[derive(sqlx::FromRow)]
    struct Stored {
        seq: i64,
        publication: Publication,
        created_at: DateTime<Utc>,
        recipients: Vec<String>,
    }
    let stored: Result<Stored, sqlx::Error> = sqlx::query_as(
        "SELECT seq, publication, created_at, recipients
         FROM store_conversation_message($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
    )
    .bind(me.team_id)
    .bind(send.new.conversation_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(me.token_id)
    .bind(me.session_credential.map(|w| w.session_id))
    .bind(me.session_credential.map(|w| w.epoch))
    .bind(send.id)
    .bind(send.request_id)
    .bind(&send.new.body)
    .bind(&send.digest[..])
    .bind(send.new.reply_to)
    .bind(&send.metadata)
    // The outbox slot's key, time-ordered like message ids: the unique index
    // on it is appended to. Unused on a synchronous conversation.
    .bind(Uuid::now_v7())
    .fetch_one(&bus.pool)
    .await;
    let stored = match stored {
        Ok(stored) => stored,
        Err(err)
            if err.as_database_error().and_then(|e| e.code()).as_deref() == Some(NOT_STORED) =>
        {
            return Ok(None);
        }
        Err(err) => return Err(err.into()),
    };
    let sync = stored.publication == Publication::Sync;

    let conversation_id = send.new.conversation_id;
    let mut event = BusEvent::new(me.team_id, EventKind::Conversation, send.id.to_string()).by(me);
    event.conversation_id = Some(conversation_id);
    if !sync {
        // The drain (on any replica) has a slot to publish.
        let mut work = event.clone();
        work.kind = EventKind::Outbox;
        bus.events.emit(work);
    }
    bus.events.emit(event);

    Ok(Some(Sent {
        message_id: send.id,
        conversation_id,
        seq: stored.seq,
        stored: sync,
        publication: if sync {
            PublicationState::Stored
        } else {
            PublicationState::PendingPublication
        },
        recipients: stored.recipients,
        created_at: stored.created_at,
        replayed: false,
    }))
}

/// Why [`store_if_clear`] declined a send, found the way every conversation
/// writer starts (the guard, the conversation row locked, this window's
/// access) and rolled back: the refusal, or the original message if this
/// sender used the request_id here before (same body; another body is a
/// conflict). A retry of a send accepted before (say) an archive still gets
/// its original: what was accepted is never refused afterwards. None: nothing
/// stands in the way now.
async fn explain_unstored(
    bus: &Bus,
    me: &Identity,
    send: &Validated<'_>,
) -> BusResult<Option<Sent>> {
    let mut tx = bus.pool.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let conversation = conversations::load(&mut tx, me, send.new.conversation_id, true).await?;
    let access = conversations::read_access(&mut tx, me, &conversation).await?;
    let refusal = refuse_sender(&mut tx, me, &conversation, access)
        .await
        .err();
    let original = replay(&mut tx, me, &conversation, send.request_id, &send.digest).await?;
    if let Some(original) = original {
        tx.rollback().await?;
        return Ok(Some(original));
    }
    if let Some(refusal) = refusal {
        return Err(refusal);
    }
    if let Some(reply_to) = send.new.reply_to {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM conversation_messages
                            WHERE team_id = $1 AND conversation_id = $2 AND id = $3)",
        )
        .bind(me.team_id)
        .bind(conversation.id)
        .bind(reply_to)
        .fetch_one(&mut *tx)
        .await?;
        if !exists {
            return Err(BusError::not_found(format!(
                "reply_to {reply_to} is not a message of conversation {}. Use a message_id \
                 read_conversation returned for this conversation.",
                conversation.id
            )));
        }
    }
    tx.rollback().await?;
    Ok(None)
}

/// The refusal that applies to this sender, if any: archived, writes paused,
/// not an active member, observer, project grant gone.
async fn refuse_sender(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    conversation: &Conversation,
    access: ReadAccess,
) -> BusResult<()> {
    if conversation.archived_at.is_some() {
        return Err(BusError::conflict(format!(
            "conversation {} is archived: it is closed to new messages (its history stays \
             readable). Start a new conversation to continue.",
            conversation.id
        )));
    }
    if let Some(paused_at) = conversation.write_paused_at {
        let secs = (Utc::now() - paused_at).num_seconds().max(0);
        return Err(BusError::conflict(format!(
            "writes to this conversation are paused for a backend move, {secs} s so far; retry \
             shortly"
        )));
    }
    let seat = match access {
        ReadAccess::Member(seat) => seat,
        ReadAccess::ProjectGrant => {
            return Err(BusError::forbidden(format!(
                "you can read conversation {} through your project grant, but only active members \
                 send. Ask an owner or moderator to invite this window.",
                conversation.id
            )));
        }
    };
    if !seat.role.sends() {
        return Err(BusError::forbidden(format!(
            "this window is an observer in conversation {}: observers read but do not send. Ask an \
             owner or moderator for the participant role.",
            conversation.id
        )));
    }
    if let Some(project_id) = conversation.project_id
        && !projects::holds_grant(conn, me.team_id, project_id, me.agent_id).await?
    {
        return Err(BusError::forbidden(format!(
            "your access grant on project `{}` is gone, so you can no longer send in its \
             conversation {}. Ask a holder of the project's grant to grant it again.",
            conversation.project.as_deref().unwrap_or_default(),
            conversation.id
        )));
    }
    Ok(())
}

/// The answer to a retried send: the original message with its current
/// state, if this sender used `request_id` here before (the same body), a
/// conflict if it was used for another body, None if it was never used.
async fn replay(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    conversation: &Conversation,
    request_id: Uuid,
    digest: &[u8; 32],
) -> BusResult<Option<Sent>> {
    let earlier: Option<EarlierSend> = sqlx::query_as(
        "SELECT id, seq, body_sha256, publication_state, created_at FROM conversation_messages
         WHERE team_id = $1 AND conversation_id = $2 AND sender_id = $3 AND request_id = $4",
    )
    .bind(me.team_id)
    .bind(conversation.id)
    .bind(me.agent_id)
    .bind(request_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(earlier) = earlier else {
        return Ok(None);
    };
    if earlier.body_sha256 != digest[..] {
        return Err(BusError::conflict(format!(
            "request_id {request_id} was already used in this conversation for a different body \
             (message {}, seq {}). A retry must resend the same body; a new message needs a new \
             request_id.",
            earlier.id, earlier.seq
        )));
    }
    let recipients = recipients_of(conn, me, earlier.id).await?;
    Ok(Some(Sent {
        message_id: earlier.id,
        conversation_id: conversation.id,
        seq: earlier.seq,
        stored: earlier.publication_state == PublicationState::Stored,
        publication: earlier.publication_state,
        recipients,
        created_at: earlier.created_at,
        replayed: true,
    }))
}

/// The frozen recipients of a message, as addresses.
async fn recipients_of(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    message_id: Uuid,
) -> BusResult<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT CASE WHEN r.recipient_session = '' THEN a.name
                     ELSE a.name || '/' || r.recipient_session END
         FROM message_receipts r JOIN agents a ON a.team_id = r.team_id AND a.id = r.recipient_id
         WHERE r.team_id = $1 AND r.message_id = $2
         ORDER BY 1",
    )
    .bind(me.team_id)
    .bind(message_id)
    .fetch_all(&mut *conn)
    .await?)
}

/// What `read_conversation` was asked for.
#[derive(Clone, Debug, Default)]
pub struct ReadRequest {
    pub conversation_id: Uuid,
    pub after_seq: Option<i64>,
    pub limit: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReadPage {
    pub conversation_id: Uuid,
    /// Pass as `after_seq` to read on. Never past a message still pending
    /// publication, so nothing in flight is walked past.
    pub next_after_seq: i64,
    /// The first seq this reader may read.
    pub history_from_seq: i64,
    pub messages: Vec<ConversationMessage>,
}

/// How far back a reader may read, and its seat (for its receipts).
fn reader_bounds(access: &ReadAccess) -> (i64, Option<Uuid>) {
    match access {
        ReadAccess::Member(seat) => (seat.history_from_seq, Some(seat.id)),
        ReadAccess::ProjectGrant => (1, None),
    }
}

/// `read_conversation`: every slot from `after_seq` in order, bodies that
/// cannot be shown explained. Writes nothing.
pub async fn read(bus: &Bus, me: &Identity, request: ReadRequest) -> BusResult<ReadPage> {
    let limit = check_limit(request.limit)?;
    let after_seq = request.after_seq.unwrap_or(0);
    if after_seq < 0 {
        return Err(BusError::invalid(format!(
            "after_seq must be 0 or more; got {after_seq}. Omit it to read from the start of \
             your history, or pass the next_after_seq of your last read."
        )));
    }
    let mut conn = bus.pool.acquire().await?;
    let conversation = conversations::load(&mut conn, me, request.conversation_id, false).await?;
    let access = conversations::read_access(&mut conn, me, &conversation).await?;
    let (history_from_seq, seat) = reader_bounds(&access);
    // Saturating: `after_seq` is the caller's, and i64::MAX is an empty page.
    let from_seq = after_seq.saturating_add(1).max(history_from_seq);
    let rows: Vec<MessageRow> = sqlx::query_as(concat!(
        message_select!(),
        " WHERE m.team_id = $1 AND m.conversation_id = $2 AND m.seq >= $4
          ORDER BY m.seq LIMIT $5"
    ))
    .bind(me.team_id)
    .bind(conversation.id)
    .bind(seat)
    .bind(from_seq)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    // Released bodies are read from their backend with no connection held.
    drop(conn);
    let messages = resolve_bodies(bus, rows).await?;
    let mut next_after_seq = from_seq - 1;
    for message in &messages {
        // Never past a message in flight, nor past a body the backend did
        // not answer for now: reading on from here shows it once it does.
        let unreachable = message
            .unavailable
            .as_ref()
            .is_some_and(|u| u.reason == "unreachable");
        if message.publication == PublicationState::PendingPublication || unreachable {
            break;
        }
        next_after_seq = message.seq;
    }
    Ok(ReadPage {
        conversation_id: conversation.id,
        next_after_seq: next_after_seq.max(after_seq),
        history_from_seq,
        messages,
    })
}

/// The one "not found" every invisible conversation message gets.
pub fn message_not_found(id: Uuid) -> BusError {
    BusError::not_found(format!(
        "no conversation message {id} visible to this window. read_conversation lists the \
         messages of conversations you are in."
    ))
}

/// The conversation a message belongs to, in the caller's team: its id, the
/// message's seq, and whether this window sent it.
pub(crate) async fn conversation_of(
    conn: &mut sqlx::PgConnection,
    me: &Identity,
    message_id: Uuid,
) -> BusResult<(Uuid, i64, bool)> {
    sqlx::query_as(
        "SELECT conversation_id, seq, sender_id = $3 AND sender_session = $4 FROM conversation_messages
         WHERE team_id = $1 AND id = $2",
    )
    .bind(me.team_id)
    .bind(message_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| message_not_found(message_id))
}

/// `get_conversation_message`: one message, under the same rules as reading.
pub async fn get(bus: &Bus, me: &Identity, message_id: Uuid) -> BusResult<ConversationMessage> {
    let mut conn = bus.pool.acquire().await?;
    let (conversation_id, seq, _) = conversation_of(&mut conn, me, message_id).await?;
    let conversation = conversations::load(&mut conn, me, conversation_id, false)
        .await
        .map_err(|_| message_not_found(message_id))?;
    let access = match conversations::read_access(&mut conn, me, &conversation).await {
        Err(BusError::NotFound(_)) => return Err(message_not_found(message_id)),
        other => other?,
    };
    let (history_from_seq, seat) = reader_bounds(&access);
    if seq < history_from_seq {
        return Err(message_not_found(message_id));
    }
    let row: MessageRow = sqlx::query_as(concat!(
        message_select!(),
        " WHERE m.team_id = $1 AND m.conversation_id = $2 AND m.id = $4"
    ))
    .bind(me.team_id)
    .bind(conversation.id)
    .bind(seat)
    .bind(message_id)
    .fetch_one(&mut *conn)
    .await?;
    drop(conn);
    let mut resolved = resolve_bodies(bus, vec![row]).await?;
    Ok(resolved.remove(0))
}

/// Reads this many released bodies from their backends at once per page.
const FETCH_CONCURRENCY: usize = 16;

/// Turn rows into what a reader sees, reading each released body (stored,
/// local copy dropped by the sweep) back from its backend. A page never fails
/// because one body is missing: a backend that does not answer makes that
/// message `unreachable` for now, and a body the backend answered it no
/// longer holds is tombstoned here, since an explained gap is not a gap. The
/// backend says "no longer holds" only once the absence is confirmed (for
/// JetStream: by the stream leader, a delay after the first "not found"), so
/// one stale answer never tombstones a body for good.
async fn resolve_bodies(bus: &Bus, rows: Vec<MessageRow>) -> BusResult<Vec<ConversationMessage>> {
    use futures::StreamExt;

    let fetched: Vec<(MessageRow, Option<Remote>)> = futures::stream::iter(rows)
        .map(|row| async move {
            let remote = if needs_fetch(&row) {
                Some(fetch_remote(bus, &row).await)
            } else {
                None
            };
            (row, remote)
        })
        .buffered(FETCH_CONCURRENCY)
        .collect()
        .await;
    let mut messages = Vec::with_capacity(fetched.len());
    for (mut row, remote) in fetched {
        let mut unreachable = None;
        match remote {
            None => {}
            Some(Remote::Body(body)) => row.body = body,
            Some(Remote::HeldAfterAll(body)) => {
                let locator = row.canonical_locator.clone().unwrap_or_default();
                lost_bodies::restamp(&bus.pool, row.id, &locator).await?;
                row.body = body;
            }
            Some(Remote::Gone(reason)) => {
                let locator = row.canonical_locator.clone().unwrap_or_default();
                if outbox::tombstone_released(&bus.pool, row.id, row.backend, &locator, &reason)
                    .await?
                {
                    row.tombstone_reason = Some(reason);
                } else {
                    // The row changed meanwhile (a move made it the record):
                    // say so rather than guess.
                    unreachable =
                        Some("this message changed while it was being read; read it again.".into());
                }
            }
            Some(Remote::Unreachable(detail)) => unreachable = Some(detail),
        }
        let mut message = ConversationMessage::from(row);
        if let Some(detail) = unreachable {
            message.body = None;
            message.unavailable = Some(Unavailable {
                reason: "unreachable".into(),
                detail,
            });
        }
        messages.push(message);
    }
    Ok(messages)
}

fn needs_fetch(row: &MessageRow) -> bool {
    row.publication_state == PublicationState::Stored
        && row.tombstone_reason.is_none()
        && row.body.is_empty()
        && row.canonical_locator.is_some()
}

/// What a message's backend said about its body.
enum Remote {
    Body(String),
    /// Of a replaced stream, yet in the new one (published just before the
    /// new identity was recorded).
    HeldAfterAll(String),
    /// The backend answered and does not hold it (or holds another body).
    Gone(String),
    Unreachable(String),
}

async fn fetch_remote(bus: &Bus, row: &MessageRow) -> Remote {
    let locator = Locator(row.canonical_locator.clone().unwrap_or_default());
    let team_id = row.team_id;
    let backend = match bus.backends.for_message(row.backend, team_id) {
        Ok(backend) => backend,
        Err(e) => return Remote::Unreachable(e.to_string()),
    };
    if row.stream_replaced {
        // The stream this body was written to no longer exists: the one look
        // below only catches a body published into its successor before
        // `team stream` recorded it. Anything else the broker answers is
        // the loss, decided the same way whatever the new stream holds at
        // that sequence.
        return match lost_bodies::judge(
            backend.fetch_once(&locator, row.id).await,
            &row.body_sha256,
        ) {
            lost_bodies::Verdict::Held(body) => Remote::HeldAfterAll(body),
            lost_bodies::Verdict::Lost => Remote::Gone(lost_bodies::LOST_BODY_REASON.into()),
            lost_bodies::Verdict::Unknown(e) => Remote::Unreachable(format!(
                "the stream this body was written to has been re-created on the broker since, and \
                 the broker did not answer whether the body reached the new one ({e}); whether \
                 it is lost is not known yet. Read again shortly."
            )),
        };
    }
    match backend.fetch(&locator, row.id).await {
        Ok(Some(body)) if outbox::body_digest(&body)[..] == row.body_sha256[..] => {
            Remote::Body(body)
        }
        Ok(Some(_)) => Remote::Gone(format!(
            "the {} backend holds a different body under this message's locator",
            row.backend
        )),
        Ok(None) => Remote::Gone(format!(
            "the {} backend no longer holds this body",
            row.backend
        )),
        // A locator that names another message or team (copied, forged or
        // damaged): refused, and retrying will not change that.
        Err(e @ (BusError::Forbidden(_) | BusError::Invalid(_))) => {
            tracing::warn!(error = %e, message = %row.id, "a recorded locator was refused by its backend");
            Remote::Unreachable(format!(
                "the {} backend refuses this message's recorded locator ({e}); whether the body \
                 is lost is not known. If the broker's store was lost and its stream re-created, \
                 run `ai-crew-sync team stream` for this team so the bus records it (bodies \
                 written to the old stream then read as lost), or `ai-crew-sync conversations \
                 declare-lost` after a restore failed.",
                row.backend
            ))
        }
        Err(e) => {
            tracing::debug!(error = %e, message = %row.id, "a backend did not answer a read");
            Remote::Unreachable(format!(
                "the {} backend cannot show this body now ({e}); it is not declared lost. Read \
                 again shortly.",
                row.backend
            ))
        }
    }
}
