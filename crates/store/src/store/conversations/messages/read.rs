//! `read_conversation` and `get_conversation_message`: pages and single
//! messages under the reader's access, with released bodies read back from
//! their backends and what cannot be shown explained.

use super::*;
use crate::store::delivery::broker_conditions;

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
    /// The conversation's newest seq when it was read.
    pub last_seq: i64,
    /// More past `next_after_seq` (read again with it).
    pub more: bool,
    /// On an empty page: read past which seq, as of when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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
    if after_seq > conversation.last_seq {
        return Err(BusError::invalid(format!(
            "after_seq {after_seq} is ahead of the newest seq {} of this conversation: nothing \
             is there yet. Start from the newest: pass after_seq: {} to read only what comes \
             next, or omit it to read your history from the start. Nothing was read.",
            conversation.last_seq, conversation.last_seq
        )));
    }
    // Saturating: `after_seq` is the caller's (at most the newest seq here).
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
            .is_some_and(|u| u.reason == UnavailableReason::Unreachable);
        if message.publication == PublicationState::PendingPublication || unreachable {
            break;
        }
        next_after_seq = message.seq;
    }
    let next_after_seq = next_after_seq.max(after_seq);
    let note = messages.is_empty().then(|| {
        format!(
            "nothing after seq {next_after_seq} (the newest is {}; as of {})",
            conversation.last_seq,
            chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        )
    });
    Ok(ReadPage {
        conversation_id: conversation.id,
        next_after_seq,
        history_from_seq,
        more: next_after_seq < conversation.last_seq,
        last_seq: conversation.last_seq,
        note,
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
                reason: UnavailableReason::Unreachable,
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
            if let Some(missing) = stream_missing(bus, row).await {
                return Remote::Unreachable(missing);
            }
            Remote::Unreachable(format!(
                "the {} backend cannot show this body now ({e}); it is not declared lost. Read \
                 again shortly.",
                row.backend
            ))
        }
    }
}

/// Why a read that failed will keep failing, when the bus knows: the team's
/// stream is missing on a broker that answers (the condition `/health` and
/// `conversations status` report, with the same fix). Reading again does
/// not help; an operator does.
async fn stream_missing(bus: &Bus, row: &MessageRow) -> Option<String> {
    if row.backend != BackendKind::Jetstream {
        return None;
    }
    let broker = bus.backends.broker()?;
    let missing = broker_conditions::body_stream_missing(&bus.pool, broker, row.team_id)
        .await
        .ok()??;
    Some(format!(
        "this body is held only by the broker, and the team's stream {} is missing there, so \
         reading again will not show it until an operator acts. {} Restoring the broker's \
         store brings the body back; re-creating the stream with that command instead makes \
         the bodies written to the old stream read as lost.",
        missing.stream,
        missing.sentence()
    ))
}
