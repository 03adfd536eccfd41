//! What an operator sees and does when a team's JetStream streams are in a
//! condition only they can fix (missing after the broker's store was wiped,
//! full, out of storage): the conditions named with the command that fixes
//! them (for `/health`, `conversations status`, and a reader of a body only
//! the broker held while its stream is missing), the refusal of a new
//! conversation on streams that are missing, the one-command recovery of
//! failed messages whose body is still held (`conversations retry`), and the
//! count `team stream` reports of messages naming sequences the stream does
//! not hold.
//!
//! The conditions themselves are learned and logged by the broker handle
//! (`backend::jetstream::conditions`); the outbox waits on them without
//! spending attempts (`outbox::settle_waiting`). This module reads them and
//! holds the SQL the commands need.
//!
//! What it deliberately does not do: retry a message while the cause is
//! still there (it would only fail again), retry one whose body is no longer
//! held anywhere (there is nothing to publish), or guess: a broker that does
//! not answer is "unknown", never "missing".

use std::collections::HashMap;

use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::backend::jetstream::{
    Broker, ConditionKind, StreamCondition, TeamStreams, body_stream_name,
};
use crate::backend::{BackendKind, Backends};
use crate::error::{BusError, BusResult};
use crate::store::{Actor, delivery::outbox, identity::audit, identity::teams};

/// One condition, as an operator surface shows it.
#[derive(Clone, Debug, Serialize)]
pub struct Reported {
    pub team: String,
    pub stream: String,
    pub condition: ConditionKind,
    /// Why messages wait, in fixed words.
    pub why: String,
    /// The command that fixes it.
    pub fix: String,
    pub since_seconds: u64,
}

impl Reported {
    fn new(condition: &StreamCondition, team: &str, nats_url: &str) -> Reported {
        Reported {
            team: team.to_owned(),
            stream: condition.stream.clone(),
            condition: condition.condition,
            why: condition.condition.why(&condition.stream),
            fix: condition.condition.fix(team, nats_url),
            since_seconds: condition.since_seconds,
        }
    }

    /// One line for an error message or a terminal.
    pub fn sentence(&self) -> String {
        format!(
            "team `{}`: {} ({}). Fix: `{}`",
            self.team,
            self.why,
            self.condition.as_str(),
            self.fix
        )
    }
}

/// Teams whose bodies go to jetstream: new conversations, or conversations.
async fn teams_on_jetstream(pool: &PgPool) -> BusResult<Vec<Uuid>> {
    Ok(sqlx::query_scalar(
        "SELECT t.id FROM teams t
          WHERE t.conversation_backend = 'jetstream'
             OR EXISTS (SELECT 1 FROM conversations c
                         WHERE c.team_id = t.id AND c.backend = 'jetstream')
          ORDER BY t.id",
    )
    .fetch_all(pool)
    .await?)
}

/// A team whose streams `doctor` looks at, and whether it uses them now.
#[derive(Clone, Debug)]
pub struct TeamWithStreams {
    pub id: Uuid,
    pub slug: String,
    /// New conversations, or some conversations, of the team are on jetstream.
    pub routed: bool,
}

/// The teams routed to jetstream, and those whose streams `team stream`
/// recorded without routing there yet, by slug.
pub async fn teams_with_streams(pool: &PgPool) -> BusResult<Vec<TeamWithStreams>> {
    let routed = teams_on_jetstream(pool).await?;
    let mut ids: Vec<Uuid> = sqlx::query_scalar("SELECT DISTINCT team_id FROM team_streams")
        .fetch_all(pool)
        .await?;
    ids.extend(&routed);
    ids.sort_unstable();
    ids.dedup();
    let names = slugs(pool, &ids).await?;
    let mut teams: Vec<TeamWithStreams> = names
        .into_iter()
        .map(|(id, slug)| TeamWithStreams {
            id,
            slug,
            routed: routed.contains(&id),
        })
        .collect();
    teams.sort_by(|a, b| a.slug.cmp(&b.slug));
    Ok(teams)
}

async fn slugs(pool: &PgPool, ids: &[Uuid]) -> BusResult<HashMap<Uuid, String>> {
    let rows: Vec<(Uuid, String)> = sqlx::query_as("SELECT id, slug FROM teams WHERE id = ANY($1)")
        .bind(ids)
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().collect())
}

/// Every condition this server knows of (`/health`). With `check`, every
/// team routed to jetstream has its streams looked at first (a stream
/// missing while nothing is pending is found too); a broker that does not
/// answer adds nothing (health reports it unreachable on its own).
pub async fn installation(
    pool: &PgPool,
    backends: &Backends,
    check: bool,
) -> BusResult<Vec<Reported>> {
    let Some(broker) = backends.broker() else {
        return Ok(Vec::new());
    };
    if check {
        for team_id in teams_on_jetstream(pool).await? {
            if let Err(e) = broker.check_team_streams(team_id).await {
                tracing::debug!(error = %e, %team_id, "could not check a team's streams");
                break;
            }
        }
    }
    let conditions = broker.stream_conditions();
    let ids: Vec<Uuid> = conditions.iter().map(|c| c.team_id).collect();
    let names = slugs(pool, &ids).await?;
    Ok(conditions
        .iter()
        .map(|c| {
            let team = names
                .get(&c.team_id)
                .cloned()
                .unwrap_or_else(|| c.team_id.to_string());
            Reported::new(c, &team, broker.url())
        })
        .collect())
}

/// The conditions of one team's streams, asked of `broker` now.
pub async fn of_team(broker: &Broker, team_id: Uuid, team: &str) -> BusResult<Vec<Reported>> {
    Ok(broker
        .check_team_streams(team_id)
        .await?
        .iter()
        .map(|c| Reported::new(c, team, broker.url()))
        .collect())
}

/// The team's body stream is missing on a broker that answers: the one
/// condition under which a read of a body held only by the broker cannot
/// succeed however often it is repeated, until an operator restores the
/// broker's store or re-creates the stream. Asked as `/health` and
/// `conversations status` ask it ([`of_team`], cached briefly), so a reader
/// is told what an operator is. `None`: not known to be missing (the stream
/// exists, or the broker did not answer, which is unknown, not missing).
pub async fn body_stream_missing(
    pool: &PgPool,
    broker: &Broker,
    team_id: Uuid,
) -> BusResult<Option<Reported>> {
    let team: Option<String> = sqlx::query_scalar("SELECT slug FROM teams WHERE id = $1")
        .bind(team_id)
        .fetch_optional(pool)
        .await?;
    let Some(team) = team else {
        return Ok(None);
    };
    let Ok(conditions) = of_team(broker, team_id, &team).await else {
        return Ok(None);
    };
    let body = body_stream_name(team_id);
    Ok(conditions
        .into_iter()
        .find(|c| c.condition == ConditionKind::StreamMissing && c.stream == body))
}

/// Refuse a new conversation of a team routed to jetstream whose streams
/// the broker says are missing: every body sent into it would wait for an
/// operator. Checked before the creating transaction (no network I/O inside
/// one), from stream info cached briefly. A broker that does not answer does
/// not refuse: sends are accepted and wait, as during any outage.
pub async fn refuse_if_streams_missing(
    bus: &crate::Bus,
    team_id: Uuid,
    team: &str,
) -> BusResult<()> {
    let Some(broker) = bus.backends.broker() else {
        return Ok(());
    };
    let backend: Option<BackendKind> =
        sqlx::query_scalar("SELECT conversation_backend FROM teams WHERE id = $1")
            .bind(team_id)
            .fetch_optional(&bus.pool)
            .await?;
    if backend != Some(BackendKind::Jetstream) {
        return Ok(());
    }
    let Ok(conditions) = of_team(broker, team_id, team).await else {
        return Ok(());
    };
    let missing: Vec<&Reported> = conditions
        .iter()
        .filter(|c| c.condition == ConditionKind::StreamMissing)
        .collect();
    let Some(first) = missing.first() else {
        return Ok(());
    };
    let streams: Vec<&str> = missing.iter().map(|c| c.stream.as_str()).collect();
    Err(BusError::unavailable(format!(
        "team `{team}` keeps conversation bodies on JetStream, and the broker has no stream {} \
         (its store was wiped, or the streams were never provisioned there), so a new \
         conversation is refused; nothing was created. An operator fixes it with `{}`; then \
         create the conversation again.",
        streams.join(" or "),
        first.fix
    )))
}

/// A failed message `conversations retry` can put back, or could not.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct FailedMessage {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    pub backend: BackendKind,
    /// Why its last attempt failed (the slot's last error).
    pub last_error: Option<String>,
    /// The body is held by its outbox slot or its message row.
    #[serde(skip)]
    pub body_held: bool,
    #[serde(skip)]
    pub has_slot: bool,
}

/// What `conversations retry` found, and did with `--apply`.
#[derive(Clone, Debug, Serialize)]
pub struct RetryReport {
    pub team: String,
    pub applied: bool,
    /// Put back to pending (or, without --apply, that would be).
    pub retried: Vec<FailedMessage>,
    /// Failed, and no body is held anywhere: nothing to publish again.
    pub not_recoverable: Vec<FailedMessage>,
}

/// `conversations retry`: put `failed` messages whose body is still held
/// back to pending with fresh attempts (audited), after the cause is fixed.
/// Refused, changing nothing, while one of the team's streams is missing or
/// full (checked on `broker`, which is required when any of them goes to
/// jetstream): they would only wait or fail again.
pub async fn retry_failed(
    pool: &PgPool,
    broker: Option<&Broker>,
    team_slug: &str,
    conversation: Option<Uuid>,
    apply: bool,
    actor: &Actor,
) -> BusResult<RetryReport> {
    let team = teams::find(pool, team_slug).await?;
    let failed: Vec<FailedMessage> = sqlx::query_as(
        "SELECT m.id AS message_id, m.conversation_id, m.seq, m.backend, o.last_error,
                (o.payload IS NOT NULL OR m.body <> '') AS body_held,
                o.message_id IS NOT NULL AS has_slot
           FROM conversation_messages m
           LEFT JOIN conversation_outbox o ON o.message_id = m.id
          WHERE m.team_id = $1 AND m.publication_state = 'failed'
            AND m.tombstoned_at IS NULL
            AND ($2::uuid IS NULL OR m.conversation_id = $2)
          ORDER BY m.conversation_id, m.seq",
    )
    .bind(team.id)
    .bind(conversation)
    .fetch_all(pool)
    .await?;
    let (retried, not_recoverable): (Vec<_>, Vec<_>) =
        failed.into_iter().partition(|m| m.body_held);
    refuse_while_the_cause_remains(broker, &team, &retried).await?;
    if !apply || retried.is_empty() {
        return Ok(RetryReport {
            team: team.slug,
            applied: false,
            retried,
            not_recoverable,
        });
    }
    let mut tx = pool.begin().await?;
    let put_back = put_back(&mut tx, team.id, &retried).await?;
    let retried: Vec<FailedMessage> = retried
        .into_iter()
        .filter(|m| put_back.contains(&m.message_id))
        .collect();
    audit::record(
        &mut tx,
        Some(team.id),
        actor,
        "conversation.retry",
        &team.slug,
        json!({ "conversation_id": conversation, "messages": put_back.len(),
                "message_ids": put_back }),
    )
    .await?;
    tx.commit().await?;
    Ok(RetryReport {
        team: team.slug,
        applied: true,
        retried,
        not_recoverable,
    })
}

/// A retry of messages bound for JetStream is refused, changing nothing,
/// while one of the team's streams is missing or full (checked on `broker`,
/// required then): they would only wait or fail again.
async fn refuse_while_the_cause_remains(
    broker: Option<&Broker>,
    team: &teams::Team,
    retried: &[FailedMessage],
) -> BusResult<()> {
    if !retried.iter().any(|m| m.backend == BackendKind::Jetstream) {
        return Ok(());
    }
    let Some(broker) = broker else {
        return Err(BusError::invalid(format!(
            "{} failed message(s) of team `{}` go to JetStream; name the broker with \
             --nats-url (or BUS_NATS_URL) so the retry can check the cause is fixed first. \
             Nothing was changed.",
            retried.len(),
            team.slug
        )));
    };
    let conditions = of_team(broker, team.id, &team.slug).await?;
    if !conditions.is_empty() {
        let said: Vec<String> = conditions.iter().map(Reported::sentence).collect();
        return Err(BusError::conflict(format!(
            "the cause is still there, so retrying would only make the messages wait or \
             fail again; nothing was changed. {} Then run this command again.",
            said.join(" ")
        )));
    }
    Ok(())
}

/// Put `retried` back to pending with fresh attempts, under their
/// conversations' locks; the ids actually put back.
async fn put_back(
    conn: &mut PgConnection,
    team_id: Uuid,
    retried: &[FailedMessage],
) -> BusResult<Vec<Uuid>> {
    let ids: Vec<Uuid> = retried.iter().map(|m| m.message_id).collect();
    let mut conversations: Vec<Uuid> = retried.iter().map(|m| m.conversation_id).collect();
    conversations.sort();
    conversations.dedup();
    // Conversation rows first, the lock order of every conversation writer
    // (a settle takes the same key-share locks before touching messages).
    sqlx::query(
        "SELECT 1 FROM conversations WHERE team_id = $1 AND id = ANY($2)
          ORDER BY id FOR KEY SHARE",
    )
    .bind(team_id)
    .bind(&conversations)
    .execute(&mut *conn)
    .await?;
    // Fresh attempts, due now; a new generation so no settle of an earlier
    // lease can land on the slot again. A message given up on as uncertain
    // stays so: its first new attempt asks the backend by key before
    // publishing (a body that did land is settled, not stored twice).
    let put_back: Vec<Uuid> = sqlx::query_scalar(
        "WITH slots AS (
             UPDATE conversation_outbox
                SET state = 'pending', attempts = 0, generation = generation + 1,
                    leased_by = NULL, lease_expires_at = NULL, next_attempt_at = now(),
                    last_error = NULL, updated_at = now()
              WHERE team_id = $1 AND message_id = ANY($2) AND state = 'failed'
              RETURNING message_id)
         UPDATE conversation_messages m
            SET publication_state = 'pending_publication'
          WHERE m.team_id = $1 AND m.id = ANY($2) AND m.publication_state = 'failed'
            AND m.tombstoned_at IS NULL
            AND (m.id IN (SELECT message_id FROM slots)
                 OR NOT EXISTS (SELECT 1 FROM conversation_outbox o WHERE o.message_id = m.id))
          RETURNING m.id",
    )
    .bind(team_id)
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    // A failed message without a slot (its body in its row) gets one, as a
    // send would have written it.
    for m in retried.iter().filter(|m| !m.has_slot) {
        if !put_back.contains(&m.message_id) {
            continue;
        }
        let body: String = sqlx::query_scalar(
            "SELECT body FROM conversation_messages WHERE team_id = $1 AND id = $2",
        )
        .bind(team_id)
        .bind(m.message_id)
        .fetch_one(&mut *conn)
        .await?;
        outbox::enqueue(
            &mut *conn,
            m.message_id,
            m.conversation_id,
            team_id,
            m.backend,
            &body,
        )
        .await?;
    }
    Ok(put_back)
}

/// Messages naming the team's body stream, counted before `team stream`
/// runs: if the stream is missing then, every one of them names a stream
/// that no longer holds it (nothing can be stored on a missing stream, so
/// none is added between this count and the stream's creation).
pub async fn locators_on_body_stream(pool: &PgPool, team_slug: &str) -> BusResult<i64> {
    let team = teams::find(pool, team_slug).await?;
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages
          WHERE team_id = $1 AND canonical_locator LIKE 'jetstream:' || $2 || ':%'
            AND tombstoned_at IS NULL",
    )
    .bind(team.id)
    .bind(body_stream_name(team.id))
    .fetch_one(pool)
    .await?)
}

/// What `team stream` says about messages whose locator names its body
/// stream at a sequence the stream does not hold.
#[derive(Clone, Debug, Serialize)]
pub struct StaleLocators {
    pub stream: String,
    /// Messages naming a sequence the stream does not hold.
    pub messages: i64,
    /// Why they do not: the stream was created just now, or the sequences
    /// are past its last one.
    pub reason: String,
}

/// After `team stream`: how many messages name the body stream at a
/// sequence it does not hold. `before` is [`locators_on_body_stream`] taken
/// before provisioning. A stream created now holds none of them; an existing
/// one holds none past its last sequence (a cheap, certain lower bound: a
/// re-created stream's new sequences may collide with old locators).
pub async fn stale_locators(
    pool: &PgPool,
    broker: &Broker,
    streams: &TeamStreams,
    before: i64,
) -> BusResult<StaleLocators> {
    let stream = streams.body.name.clone();
    if streams.body.state == "created" {
        return Ok(StaleLocators {
            stream,
            messages: before,
            reason: "the stream did not exist and was created empty just now".into(),
        });
    }
    let last = match broker.js().get_stream(&stream).await {
        Ok(mut handle) => match handle.info().await {
            Ok(info) => info.state.last_sequence,
            Err(e) => {
                return Err(BusError::unavailable(format!(
                    "could not read stream {stream} ({e})"
                )));
            }
        },
        Err(e) => {
            return Err(BusError::unavailable(format!(
                "could not read stream {stream} ({e})"
            )));
        }
    };
    let messages: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages
          WHERE team_id = $1 AND canonical_locator LIKE 'jetstream:' || $2 || ':%'
            AND tombstoned_at IS NULL
            AND split_part(canonical_locator, ':', 3)::bigint > $3",
    )
    .bind(streams.team_id)
    .bind(&stream)
    .bind(last as i64)
    .fetch_one(pool)
    .await?;
    Ok(StaleLocators {
        stream,
        messages,
        reason: format!("their sequences are past the stream's last one ({last})"),
    })
}
