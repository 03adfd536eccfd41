//! Bodies the broker lost: known once, said once, the same way every time.
//!
//! A JetStream stream deleted and created again under the same name (a
//! broker whose store was wiped, then `team stream` re-run) starts over at
//! sequence 1. An old locator then names nothing, or a new message at the
//! same sequence; neither answer alone says the body is lost, and which one a
//! reader gets depends on how many messages the new stream holds by then. What
//! does say it is the stream's identity: `team stream` records the broker's
//! creation time of each stream it provisions or adopts (`team_streams`), and
//! the database stamps every locator with the identity recorded when the
//! locator was written (`conversation_messages.stream_created_at`, migration
//! 0018). A released body (no local copy) whose stamp differs from its
//! stream's identity now was written to a stream that no longer exists: it is
//! tombstoned with [`LOST_BODY_REASON`] the first time it is read or swept.
//!
//! The one look at the broker before that tombstone is for a publish that
//! landed in the re-created stream before `team stream` recorded it (so it
//! was stamped with the old identity): found there with its own id and the
//! recorded digest, it is the body and its stamp is corrected. Whatever else
//! the broker answers (nothing there, another message there) the body is
//! lost; a broker that does not answer decides nothing.
//!
//! Why a stamp from the database rather than one the publisher writes: the
//! stamp is set by a trigger whenever a locator changes, whoever writes it
//! (the drain, the reconciler, a move's cutover), so no writer can forget it,
//! and it costs one primary-key lookup per confirmation.
//!
//! When the bus does not know (the stream is missing, or was re-created
//! outside `team stream`, or the locator predates any recorded identity), a
//! read says `unreachable` and promises nothing. After a restore that failed,
//! an operator says what is lost: [`declare_lost`] (`conversations
//! declare-lost`), audited.
//!
//! What this deliberately does not do: call a body lost while PostgreSQL
//! still holds a copy with the recorded digest (that copy is the body), or
//! erase anything (a tombstone explains a gap; the message, its seq and its
//! receipts stay).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::backend::jetstream::{Broker, JetStreamBackend, TeamStreams};
use crate::backend::{AnyBackend, BackendKind, Backends, Locator, MessagingBackend};
use crate::error::{BusError, BusResult};
use crate::store::{Actor, delivery::outbox, identity::audit, identity::teams};

/// What a reader is shown in place of a body the broker lost, whichever way
/// the loss became known (a read, the sweep, an operator's declaration).
pub const LOST_BODY_REASON: &str = "the broker lost this body";

/// Record the identity of both of a team's streams as `team stream` found or
/// made them, in the caller's transaction. Returns the names of streams whose
/// identity changed (re-created since the bus last saw them).
pub async fn record_stream_identities(
    conn: &mut sqlx::PgConnection,
    team_id: Uuid,
    streams: &TeamStreams,
) -> BusResult<Vec<String>> {
    let mut replaced = Vec::new();
    for stream in [&streams.body, &streams.inbox] {
        let before: Option<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT created_at_broker FROM team_streams WHERE team_id = $1 AND stream = $2",
        )
        .bind(team_id)
        .bind(&stream.name)
        .fetch_optional(&mut *conn)
        .await?;
        sqlx::query(
            "INSERT INTO team_streams (team_id, stream, created_at_broker)
             VALUES ($1, $2, $3)
             ON CONFLICT (team_id, stream) DO UPDATE
                SET created_at_broker = EXCLUDED.created_at_broker, recorded_at = now()
              WHERE team_streams.created_at_broker <> EXCLUDED.created_at_broker",
        )
        .bind(team_id)
        .bind(&stream.name)
        .bind(stream.created)
        .execute(&mut *conn)
        .await?;
        if before.is_some_and(|b| b != stream.created) {
            replaced.push(stream.name.clone());
        }
    }
    Ok(replaced)
}

/// What the broker's answer for a body of a replaced stream comes to.
pub enum Verdict {
    /// Published into the new stream after all: this is the body.
    Held(String),
    /// The broker answered, and not with this body.
    Lost,
    /// The broker did not answer: nothing is decided.
    Unknown(BusError),
}

/// Judge one `fetch_once` of a body whose stream was replaced.
pub fn judge(fetched: BusResult<Option<String>>, digest: &[u8]) -> Verdict {
    match fetched {
        Ok(Some(body)) if outbox::body_digest(&body)[..] == digest[..] => Verdict::Held(body),
        // Nothing at that sequence, another body, or another message's
        // entry (the new stream's own message at the old sequence): the
        // stream the body was written to is gone, so these all mean lost.
        Ok(_) | Err(BusError::Forbidden(_) | BusError::Invalid(_)) => Verdict::Lost,
        Err(e) => Verdict::Unknown(e),
    }
}

/// A body of a replaced stream found in the new one: its stamp becomes the
/// stream's identity now, so nobody asks again.
pub async fn restamp(pool: &PgPool, message_id: Uuid, locator: &str) -> BusResult<()> {
    sqlx::query(
        "UPDATE conversation_messages m
            SET stream_created_at = s.created_at_broker
           FROM team_streams s
          WHERE m.id = $1 AND m.canonical_locator = $2
            AND s.team_id = m.team_id AND s.stream = split_part(m.canonical_locator, ':', 2)",
    )
    .bind(message_id)
    .bind(locator)
    .execute(pool)
    .await?;
    Ok(())
}

/// Bodies of replaced streams one sweep pass examines at most.
/// The rule, once, for the sweep and for moves: a released body (no local
/// copy), stored on jetstream, not tombstoned yet, stamped with a stream
/// identity other than the one recorded for its stream now.
macro_rules! known_lost_from {
    () => {
        " FROM conversation_messages m
           JOIN team_streams s
             ON s.team_id = m.team_id AND s.stream = split_part(m.canonical_locator, ':', 2)
          WHERE m.backend = 'jetstream' AND m.publication_state = 'stored'
            AND m.tombstoned_at IS NULL AND m.body = ''
            AND m.stream_created_at <> s.created_at_broker"
    };
}

const SWEEP_LIMIT: i64 = 500;

/// The sweep's share: tombstone released bodies written under a stream
/// identity that is no longer the stream's, so they are recorded lost even if
/// nobody reads them. Returns how many were tombstoned.
pub async fn tombstone_bodies_of_replaced_streams(
    pool: &PgPool,
    backends: &Backends,
) -> BusResult<u64> {
    if backends.broker_reachable().await != Some(true) {
        return Ok(0);
    }
    let candidates: Vec<(Uuid, Uuid, String, Vec<u8>)> = sqlx::query_as(concat!(
        "SELECT m.id, m.team_id, m.canonical_locator, m.body_sha256",
        known_lost_from!(),
        " LIMIT $1"
    ))
    .bind(SWEEP_LIMIT)
    .fetch_all(pool)
    .await?;
    let mut tombstoned = 0;
    let mut silent: std::collections::HashSet<Uuid> = Default::default();
    for (message_id, team_id, locator, digest) in candidates {
        if silent.contains(&team_id) {
            continue;
        }
        let backend = backends.for_message(BackendKind::Jetstream, team_id)?;
        let fetched = backend
            .fetch_once(&Locator(locator.clone()), message_id)
            .await;
        match judge(fetched, &digest) {
            Verdict::Held(_) => restamp(pool, message_id, &locator).await?,
            Verdict::Lost => {
                if outbox::tombstone_released(
                    pool,
                    message_id,
                    BackendKind::Jetstream,
                    &locator,
                    LOST_BODY_REASON,
                )
                .await?
                {
                    tombstoned += 1;
                }
            }
            Verdict::Unknown(e) => {
                tracing::debug!(error = %e, %team_id, "the broker did not answer; lost bodies wait");
                silent.insert(team_id);
            }
        }
    }
    Ok(tombstoned)
}

/// One conversation's share of `conversations declare-lost`.
#[derive(Clone, Debug, Serialize)]
pub struct LostInConversation {
    pub conversation_id: Uuid,
    /// The seqs whose bodies cannot be fetched (ascending).
    pub seqs: Vec<i64>,
    pub message_ids: Vec<Uuid>,
}

/// What `conversations declare-lost` found (and, with `applied`, did).
#[derive(Clone, Debug, Serialize)]
pub struct DeclaredLost {
    pub team: String,
    /// Whether the team's body stream exists on the broker asked.
    pub stream_present: bool,
    /// Released bodies the broker returned intact: not lost, left alone.
    pub readable: u64,
    /// Bodies that cannot be fetched and have no local copy.
    pub lost: u64,
    pub conversations: Vec<LostInConversation>,
    /// False for the dry run: nothing was written.
    pub applied: bool,
    /// The reason readers see for each of them.
    pub reason: &'static str,
}

type LostCandidate = (Uuid, Uuid, i64, String, Vec<u8>);

/// `conversations declare-lost --team T [--conversation C] [--apply]`: after
/// a restore failed, the operator says that the bodies the broker cannot
/// return (and of which PostgreSQL holds no copy) are lost. Every such body
/// of the team (or of one conversation) is fetched from the broker: one it
/// returns with the recorded digest is left alone; one it answers it does not
/// hold, or holds another message at its locator, or whose stream is
/// missing, is counted, and with `apply` tombstoned with
/// [`LOST_BODY_REASON`], one audited transaction per conversation (its row
/// locked first, as every conversation writer does). A broker that does not
/// answer for one of them stops the command with nothing written: silence
/// is not loss.
pub async fn declare_lost(
    pool: &PgPool,
    broker: &Broker,
    team_slug: &str,
    conversation: Option<Uuid>,
    apply: bool,
    actor: &Actor,
) -> BusResult<DeclaredLost> {
    let team = teams::find(pool, team_slug).await?;
    if let Some(id) = conversation {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM conversations WHERE team_id = $1 AND id = $2)",
        )
        .bind(team.id)
        .bind(id)
        .fetch_one(pool)
        .await?;
        if !exists {
            return Err(BusError::not_found(format!(
                "team `{}` has no conversation {id}; nothing was declared lost. `ai-crew-sync \
                 conversations status --team {}` lists its conversations off the plain path.",
                team.slug, team.slug
            )));
        }
    }
    // Released bodies only: a body PostgreSQL still holds (a local copy, an
    // outbox slot, a postgres conversation) is not lost whatever the broker
    // says.
    let candidates: Vec<LostCandidate> = sqlx::query_as(
        "SELECT m.id, m.conversation_id, m.seq, m.canonical_locator, m.body_sha256
           FROM conversation_messages m
          WHERE m.team_id = $1 AND ($2::uuid IS NULL OR m.conversation_id = $2)
            AND m.backend = 'jetstream' AND m.publication_state = 'stored'
            AND m.tombstoned_at IS NULL AND m.body = '' AND m.canonical_locator IS NOT NULL
          ORDER BY m.conversation_id, m.seq",
    )
    .bind(team.id)
    .bind(conversation)
    .fetch_all(pool)
    .await?;
    let (body_stream, _) = broker.team_streams(team.id).await?;
    let stream_present = body_stream.is_some();
    let (readable, lost) = if stream_present {
        probe(broker, team.id, candidates).await?
    } else {
        let lost = candidates
            .into_iter()
            .map(|(id, c, seq, locator, _)| (id, c, seq, locator));
        (0, lost.collect())
    };
    let mut conversations: Vec<LostInConversation> = Vec::new();
    let mut locators: Vec<Vec<String>> = Vec::new();
    for (message_id, conversation_id, seq, locator) in &lost {
        match conversations.last_mut() {
            Some(c) if c.conversation_id == *conversation_id => {
                c.seqs.push(*seq);
                c.message_ids.push(*message_id);
                locators
                    .last_mut()
                    .expect("one per conversation")
                    .push(locator.clone());
            }
            _ => {
                conversations.push(LostInConversation {
                    conversation_id: *conversation_id,
                    seqs: vec![*seq],
                    message_ids: vec![*message_id],
                });
                locators.push(vec![locator.clone()]);
            }
        }
    }
    let mut declared = DeclaredLost {
        team: team.slug.clone(),
        stream_present,
        readable,
        lost: lost.len() as u64,
        conversations,
        applied: apply,
        reason: LOST_BODY_REASON,
    };
    if !apply {
        return Ok(declared);
    }
    let mut total = 0;
    for (found, locators) in declared.conversations.iter_mut().zip(locators) {
        total += tombstone_lost(pool, team.id, found, &locators, actor, stream_present).await?;
    }
    declared.conversations.retain(|c| !c.seqs.is_empty());
    declared.lost = total;
    Ok(declared)
}

/// What the broker answers for each candidate: how many it returns with
/// the recorded digest, and the others (id, conversation, seq, locator). A
/// candidate it does not answer for stops everything: silence is not loss.
async fn probe(
    broker: &Broker,
    team_id: Uuid,
    candidates: Vec<LostCandidate>,
) -> BusResult<(u64, Vec<(Uuid, Uuid, i64, String)>)> {
    let backend = JetStreamBackend::new(broker.clone(), team_id);
    let mut readable = 0;
    let mut lost = Vec::new();
    for (message_id, conversation_id, seq, locator, digest) in candidates {
        let fetched = backend
            .fetch_once(&Locator(locator.clone()), message_id)
            .await;
        match judge(fetched, &digest) {
            Verdict::Held(_) => readable += 1,
            Verdict::Lost => lost.push((message_id, conversation_id, seq, locator)),
            Verdict::Unknown(e) => {
                return Err(BusError::unavailable(format!(
                    "the broker did not answer for message seq {seq} of conversation \
                     {conversation_id} ({e}); nothing was declared lost. Run the command \
                     again when the broker answers."
                )));
            }
        }
    }
    Ok((readable, lost))
}

/// Tombstone one conversation's lost bodies in one audited transaction,
/// its row locked first; only what is still as it was found (a body a move
/// copied back or a tombstone recorded meanwhile is not declared again).
/// `found` keeps what was tombstoned; answers how many.
async fn tombstone_lost(
    pool: &PgPool,
    team_id: Uuid,
    found: &mut LostInConversation,
    locators: &[String],
    actor: &Actor,
    stream_present: bool,
) -> BusResult<u64> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT 1 FROM conversations WHERE team_id = $1 AND id = $2 FOR UPDATE")
        .bind(team_id)
        .bind(found.conversation_id)
        .execute(&mut *tx)
        .await?;
    let mut done: Vec<(Uuid, i64)> = sqlx::query_as(
        "UPDATE conversation_messages m
            SET tombstoned_at = now(), tombstone_reason = $3
           FROM unnest($1::uuid[], $2::text[]) AS f(id, locator)
          WHERE m.id = f.id AND m.canonical_locator = f.locator
            AND m.body = '' AND m.tombstoned_at IS NULL AND m.backend = 'jetstream'
          RETURNING m.id, m.seq",
    )
    .bind(&found.message_ids)
    .bind(locators)
    .bind(LOST_BODY_REASON)
    .fetch_all(&mut *tx)
    .await?;
    done.sort_by_key(|(_, seq)| *seq);
    found.message_ids = done.iter().map(|(id, _)| *id).collect();
    found.seqs = done.iter().map(|(_, seq)| *seq).collect();
    if done.is_empty() {
        return Ok(0);
    }
    audit::record(
        &mut tx,
        Some(team_id),
        actor,
        "conversation.declare_lost",
        &found.conversation_id.to_string(),
        json!({ "conversation_id": found.conversation_id, "seqs": found.seqs,
                "message_ids": found.message_ids, "reason": LOST_BODY_REASON,
                "stream_present": stream_present }),
    )
    .await?;
    tx.commit().await?;
    Ok(done.len() as u64)
}

/// A body a move cannot read from where it is: released from PostgreSQL and
/// written under a stream identity that is no longer the stream's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct KnownLost {
    pub message_id: Uuid,
    pub seq: i64,
}

/// `known_lost_from!` for the bodies a move would copy: `$1` team, `$2` conversation ids (empty: all of the team's).
const KNOWN_LOST: &str = concat!(
    "SELECT m.conversation_id, m.id, m.seq, m.canonical_locator, m.body_sha256",
    known_lost_from!(),
    " AND m.team_id = $1 AND (cardinality($2::uuid[]) = 0 OR m.conversation_id = ANY($2))
      ORDER BY m.conversation_id, m.seq"
);

type KnownLostRow = (Uuid, Uuid, i64, String, Vec<u8>);

/// Known-lost bodies of these conversations of a team, per conversation, in
/// seq order, from the database alone (a plan asks the broker nothing per
/// message; [`tombstone_known_lost`] does, before it writes).
pub async fn known_lost(
    pool: &PgPool,
    team_id: Uuid,
    conversations: &[Uuid],
) -> BusResult<Vec<(Uuid, KnownLost)>> {
    let rows: Vec<KnownLostRow> = sqlx::query_as(KNOWN_LOST)
        .bind(team_id)
        .bind(conversations)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(conversation_id, message_id, seq, _, _)| {
            (conversation_id, KnownLost { message_id, seq })
        })
        .collect())
}

/// A move's `--tombstone-lost`: tombstone the conversation's known-lost
/// bodies with [`LOST_BODY_REASON`], in one audited transaction, the
/// conversation row locked first (as every conversation writer does). Each is
/// judged by one look at the broker first, as a read would judge it: one
/// found in the new stream with the recorded digest is the body (restamped,
/// not tombstoned); a broker that does not answer stops this with nothing
/// written, because silence is not loss. Returns what was tombstoned.
pub async fn tombstone_known_lost(
    pool: &PgPool,
    broker: &AnyBackend,
    team_id: Uuid,
    conversation_id: Uuid,
    actor: &crate::store::Actor,
) -> BusResult<Vec<KnownLost>> {
    let rows: Vec<KnownLostRow> = sqlx::query_as(KNOWN_LOST)
        .bind(team_id)
        .bind(&[conversation_id][..])
        .fetch_all(pool)
        .await?;
    let mut lost: Vec<(KnownLost, String)> = Vec::new();
    for (_, message_id, seq, locator, digest) in rows {
        let fetched = broker
            .fetch_once(&Locator(locator.clone()), message_id)
            .await;
        match judge(fetched, &digest) {
            Verdict::Held(_) => restamp(pool, message_id, &locator).await?,
            Verdict::Lost => lost.push((KnownLost { message_id, seq }, locator)),
            Verdict::Unknown(e) => {
                return Err(BusError::unavailable(format!(
                    "the broker did not answer for message {message_id} (seq {seq}) of \
                     conversation {conversation_id} ({e}); nothing was tombstoned, copied or \
                     cut over. Run the same command again when the broker answers."
                )));
            }
        }
    }
    if lost.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = lost.iter().map(|(l, _)| l.message_id).collect();
    let locators: Vec<String> = lost.iter().map(|(_, l)| l.clone()).collect();
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT 1 FROM conversations WHERE team_id = $1 AND id = $2 FOR UPDATE")
        .bind(team_id)
        .bind(conversation_id)
        .execute(&mut *tx)
        .await?;
    // Only what is still as it was judged: a tombstone recorded meanwhile
    // (a read, the sweep) is not written, nor audited, twice.
    let mut done: Vec<KnownLost> = sqlx::query_as(
        "UPDATE conversation_messages m
            SET tombstoned_at = now(), tombstone_reason = $3
           FROM unnest($1::uuid[], $2::text[]) AS f(id, locator)
          WHERE m.id = f.id AND m.canonical_locator = f.locator
            AND m.body = '' AND m.tombstoned_at IS NULL AND m.backend = 'jetstream'
          RETURNING m.id AS message_id, m.seq",
    )
    .bind(&ids)
    .bind(&locators)
    .bind(LOST_BODY_REASON)
    .fetch_all(&mut *tx)
    .await?;
    done.sort_by_key(|l| l.seq);
    if !done.is_empty() {
        audit::record(
            &mut tx,
            Some(team_id),
            actor,
            "conversation.migrate_tombstone_lost",
            &conversation_id.to_string(),
            json!({ "conversation_id": conversation_id,
                    "seqs": done.iter().map(|l| l.seq).collect::<Vec<_>>(),
                    "message_ids": done.iter().map(|l| l.message_id).collect::<Vec<_>>(),
                    "reason": LOST_BODY_REASON }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(done)
}
