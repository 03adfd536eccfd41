//! `send_conversation_message`: the checks, the one-round-trip store, and
//! when it declines, the explanation, the replay of a retried send, or the
//! refusal.

use super::*;
use crate::store::fenced::BindCaller;
use crate::store::operations::usage;

fn parse_request_id(raw: &str) -> BusResult<Uuid> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        BusError::invalid(format!(
            "request_id {} is not a UUID. Generate one UUID per message (e.g. a v4) and send \
             the same one again only when retrying that same message.",
            crate::store::text::quote(raw)
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

    // A send that nothing stands in the way of is stored in one round trip,
    // the quota checked inside it. Anything else is worked out by
    // `explain_unstored`: a refusal, or the original of a retried send.
    // Neither finding anything means what stood in the way changed in between
    // (say, an invitation accepted): try again.
    for _ in 0..STORE_ATTEMPTS {
        let over_quota = match store_if_clear(bus, me, &send).await? {
            Outcome::Sent(sent) => return Ok(sent),
            Outcome::OverQuota(refusal) => refusal,
            Outcome::Declined => {
                if let Some(original) = explain_unstored(bus, me, &send).await? {
                    return Ok(original);
                }
                continue;
            }
        };
        // A retry of a send accepted before still gets its original: what
        // was accepted is never refused afterwards. A refusal that applies
        // anyway (archived, not a member, ...) comes first, as it did when
        // the quota was read before the send.
        return match explain_unstored(bus, me, &send).await? {
            Some(original) => Ok(original),
            None => Err(over_quota),
        };
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
/// SQLSTATE of `store_conversation_message` refusing a send over the team's
/// storage quota (migration 0034), DETAIL `{"limit", "used", "incoming"}`.
const OVER_QUOTA: &str = "AC002";

/// What the send's one round trip came to.
enum Outcome {
    Sent(Sent),
    /// Nothing written: something stands in the way ([`explain_unstored`]).
    Declined,
    /// Nothing written: the quota's refusal, in words.
    OverQuota(BusError),
}

/// The quota figures `store_conversation_message` answers with AC002.
#[derive(serde::Deserialize)]
struct QuotaFigures {
    limit: i64,
    used: i64,
    incoming: i64,
}

/// A send's arguments, checked, with the id its message will have.
struct Validated<'a> {
    new: &'a NewConversationMessage,
    request_id: Uuid,
    digest: [u8; 32],
    metadata: Option<Value>,
    id: Uuid,
}

/// The send's writes, in one round trip: `store_conversation_message`
/// (migrations 0016, 0034, 0037) checks the team's quota, takes the locks in
/// the writers' order (the write fence, then the conversation row, claiming
/// the next seq), re-reads the seat, grant and `reply_to` after the lock,
/// freezes the recipients, inserts the message, its receipts, its webhook
/// event (project conversations with a hook) and (on an outbox conversation)
/// its slot, and commits. Declined: it wrote nothing (the
/// claimed seq went with its transaction), because something stands in the
/// way; [`explain_unstored`] says what. Over the quota: nothing written
/// either, and the refusal says by how much.
async fn store_if_clear(bus: &Bus, me: &Identity, send: &Validated<'_>) -> BusResult<Outcome> {
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
    .bind_credential(me)
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
        Err(err) => {
            let Some(db) = err.as_database_error() else {
                return Err(err.into());
            };
            return match db.code().as_deref() {
                Some(NOT_STORED) => Ok(Outcome::Declined),
                Some(OVER_QUOTA) => {
                    let detail = db
                        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                        .and_then(|e| e.detail());
                    let Some(QuotaFigures {
                        limit,
                        used,
                        incoming,
                    }) = detail.and_then(|d| serde_json::from_str(d).ok())
                    else {
                        return Err(err.into());
                    };
                    Ok(Outcome::OverQuota(usage::quota_refusal(
                        limit, used, incoming, &me.team,
                    )))
                }
                _ => Err(err.into()),
            };
        }
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

    Ok(Outcome::Sent(Sent {
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
    // The frozen recipients, as addresses.
    let recipients = conversations::receipts::receipts_of(conn, me, earlier.id)
        .await?
        .into_iter()
        .map(|r| r.recipient)
        .collect();
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
