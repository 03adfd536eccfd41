//! Moving one conversation's bodies between backends, under supervision
//! (../shared/seeds/001; `conversations migrate` and `conversations cleanup`).
//!
//! Size: past the ~600 lines DESIGN.md asks for (about 1 400): plan,
//! mover, abort and cleanup in one file. Issue 18 makes it a `moves/`
//! module along those seams (and frees the name "migrate" for schema
//! migrations); until then the step order below reads in one place.
//!
//! The order of the steps is the safety argument:
//!
//! 1. **Plan.** Check the target answers and is provisioned, count messages
//!    and bytes, say what is already on the target, what blocks a move (a
//!    message that failed publication, a pause no move owns) and which runs
//!    would be resumed. Nothing is written; this is all the command does
//!    without `--apply`.
//! 2. **Copy.** Every body not tombstoned is read from where it actually is,
//!    checksummed, written to the target under a key derived from the message
//!    (so a resumed run presents the same key and the broker recognises it),
//!    read back from the target and compared, and each step is recorded. The
//!    thread keeps working meanwhile: readers still use each message's
//!    recorded backend, which has not changed.
//! 3. **Pause and copy the tail.** Writes to this one conversation are
//!    refused (saying why and for how long) while the messages sent during
//!    the copy are moved. Nothing else on the bus is affected.
//! 4. **Cut over** in one transaction, the conversation row first: each
//!    verified message's backend and locator, the thread's routing and
//!    publication mode, the pause lifted, the run `cut_over`.
//!
//! A failure anywhere cuts nothing over and aborts in one transaction (the
//! run failed, unverified copies written back cleared, the pause lifted only
//! if no open run owns it). An abort that cannot finish leaves the run open
//! and paused; the same command resumes it. The pause is only ever taken for
//! a run still open, so a thread is never left paused with no move owning
//! it; one left so by a crash or an older version is lifted by `unpause`.
//!
//! What a move never does: invent a receipt, change an author, renumber a
//! message, or delete a source body. Source bodies stay until `cleanup`,
//! after a rollback window an operator states, because a rollback with
//! nothing to roll back to is not a rollback.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::backend::jetstream::{REQUIRED_MAX_PAYLOAD, body_stream_name, inbox_stream_name};
use crate::backend::{
    AnyBackend, Backends, Envelope, JetStreamBackend, Locator, MessagingBackend, PostgresBackend,
    Published,
};
use crate::error::{BusError, BusResult};
use crate::store::lost_bodies::{self, KnownLost};
use crate::store::outbox::body_digest;
use crate::store::{Actor, audit};

/// Where a move is going.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    ToJetStream,
    ToPostgres,
}

impl Direction {
    /// `jetstream` or `postgres` (M1).
    pub fn parse(raw: &str) -> BusResult<Direction> {
        match raw.trim() {
            "jetstream" => Ok(Direction::ToJetStream),
            "postgres" => Ok(Direction::ToPostgres),
            other => Err(BusError::invalid(format!(
                "unknown backend {}: --to takes `jetstream` or `postgres`.",
                super::text::quote(other)
            ))),
        }
    }

    pub fn target(self) -> &'static str {
        match self {
            Direction::ToJetStream => JetStreamBackend::NAME,
            Direction::ToPostgres => PostgresBackend::NAME,
        }
    }

    /// The value of `conversation_migrations.direction`.
    pub fn column(self) -> &'static str {
        match self {
            Direction::ToJetStream => "to_jetstream",
            Direction::ToPostgres => "to_postgres",
        }
    }
}

/// What moving one conversation would take, and whether it can be moved.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Plan {
    pub conversation_id: Uuid,
    pub title: String,
    pub current_backend: String,
    /// Every message that is not tombstoned, whatever its publication state:
    /// each one moves or the move is refused (a tombstone has no body left).
    pub messages: i64,
    /// Their bytes (a body already released from PostgreSQL counts with the
    /// size recorded at send).
    pub bytes: i64,
    /// Of those, stored on the target already.
    pub already_there: i64,
    /// Messages still awaiting publication: the move waits for them, under
    /// the pause, before it copies the tail, and is refused if any is left.
    pub in_flight: i64,
    /// Messages whose publication failed for good: they block the move.
    pub failed: i64,
    /// Why this conversation cannot be moved now.
    pub blocked: Option<String>,
    /// A run of this direction is open: the command continues it.
    pub resuming: bool,
    /// Messages whose bodies cannot be read from where they are (the broker
    /// lost them: released from PostgreSQL, written to a stream since
    /// re-created; ../store/lost_bodies.rs). `--apply` refuses naming them
    /// unless told to tombstone them ([`run`]'s `tombstone_lost`).
    pub lost: Vec<KnownLost>,
}

/// How a plan and a move's summary count a conversation's bytes, one rule
/// for both: the size recorded at send (`body_bytes`, the body's UTF-8
/// octets) of every message not tombstoned. A body already released from
/// PostgreSQL counts the same as one still held, and a body already on the
/// target the same as one copied.
/// Over rows `m` of `conversation_messages`.
macro_rules! bytes_of_messages {
    () => {
        "COALESCE(sum(m.body_bytes) FILTER (WHERE m.tombstoned_at IS NULL), 0)::bigint"
    };
}

/// Plan a move for every conversation of a team, or the chosen ones (M2).
/// Writes nothing. Refused when the target cannot take the bodies (not
/// reachable, or the team's streams missing or too small for a full body):
/// better said here than after half a thread is copied.
pub async fn plan(
    pool: &PgPool,
    backends: &Backends,
    team_id: Uuid,
    direction: Direction,
    only: &[Uuid],
) -> BusResult<Vec<Plan>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        conversation_id: Uuid,
        title: String,
        current_backend: String,
        paused: bool,
        messages: i64,
        bytes: i64,
        already_there: i64,
        in_flight: i64,
        failed: i64,
        open_same: i64,
        open_other: i64,
    }
    let rows: Vec<Row> = sqlx::query_as(concat!(
        "SELECT c.id AS conversation_id, c.title, c.backend AS current_backend,
                c.write_paused_at IS NOT NULL AS paused,
                m.messages, m.bytes, m.already_there, m.in_flight, m.failed,
                (SELECT count(*) FROM conversation_migrations g
                  WHERE g.conversation_id = c.id AND g.direction = $4
                    AND g.state IN ('planned', 'copying', 'verified')) AS open_same,
                (SELECT count(*) FROM conversation_migrations g
                  WHERE g.conversation_id = c.id AND g.direction <> $4
                    AND g.state IN ('planned', 'copying', 'verified')) AS open_other
           FROM conversations c
           CROSS JOIN LATERAL (
                SELECT count(*) AS messages, ",
        bytes_of_messages!(),
        " AS bytes,
                       count(*) FILTER (WHERE m.publication_state = 'stored'
                                          AND m.backend = $3) AS already_there,
                       count(*) FILTER (WHERE m.publication_state = 'pending_publication')
                           AS in_flight,
                       count(*) FILTER (WHERE m.publication_state = 'failed') AS failed
                  FROM conversation_messages m
                 WHERE m.team_id = c.team_id AND m.conversation_id = c.id
                   AND m.tombstoned_at IS NULL) m
          WHERE c.team_id = $1 AND (cardinality($2::uuid[]) = 0 OR c.id = ANY($2))
          ORDER BY c.created_at, c.id"
    ))
    .bind(team_id)
    .bind(only)
    .bind(direction.target())
    .bind(direction.column())
    .fetch_all(pool)
    .await?;
    if let Some(missing) = only
        .iter()
        .find(|id| !rows.iter().any(|r| r.conversation_id == **id))
    {
        return Err(BusError::not_found(format!(
            "no conversation {missing} in this team. `conversations status --team T` lists the \
             team's conversations off the plain synchronous path; omit --conversation to plan \
             every conversation."
        )));
    }
    check_target(backends, team_id, direction).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.conversation_id).collect();
    let mut lost = lost_bodies::known_lost(pool, team_id, &ids).await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let resuming = r.open_same > 0;
            let blocked = if r.open_other > 0 {
                Some(format!(
                    "a move of this conversation the other way is open; let it finish (run it \
                     again) before moving it to {}",
                    direction.target()
                ))
            } else if r.failed > 0 {
                // A failed message has no copy on its backend; a move would
                // either stop on it half-way or cut over leaving it behind.
                Some(format!(
                    "{} message(s) of this conversation failed publication for good and are \
                     stored on no backend (their bodies are still in PostgreSQL); a move would \
                     leave them behind. `conversations status` shows them; tombstone each \
                     deliberately (`conversations tombstone --team T --conversation C --seq N \
                     --reason …`), then run the same command again",
                    r.failed
                ))
            } else if r.current_backend == direction.target()
                && r.already_there == r.messages
                && !resuming
            {
                Some(format!("already on {}", direction.target()))
            } else if r.paused && !resuming {
                Some(
                    "writes are paused and no move owns the pause; `conversations unpause` lifts \
                     it (refused while a move is open), then run the same command again"
                        .to_owned(),
                )
            } else {
                None
            };
            let (here, rest) = std::mem::take(&mut lost)
                .into_iter()
                .partition(|(c, _)| *c == r.conversation_id);
            lost = rest;
            Plan {
                lost: here.into_iter().map(|(_, l)| l).collect(),
                conversation_id: r.conversation_id,
                title: r.title,
                current_backend: r.current_backend,
                messages: r.messages,
                bytes: r.bytes,
                already_there: r.already_there,
                in_flight: r.in_flight,
                failed: r.failed,
                blocked,
                resuming,
            }
        })
        .collect())
}

/// The target answers and can take every body of the team: for jetstream,
/// the broker replies and both of the team's streams exist, the body stream
/// taking a full 1 MiB body plus headers. PostgreSQL is where this runs.
async fn check_target(backends: &Backends, team_id: Uuid, direction: Direction) -> BusResult<()> {
    if direction != Direction::ToJetStream {
        return Ok(());
    }
    // Configured, connected: the same refusal a send would get otherwise.
    backends.for_message(JetStreamBackend::NAME, team_id)?;
    let Some(broker) = backends.broker() else {
        return Err(crate::backend::routing::no_broker());
    };
    if !broker.reachable().await {
        return Err(BusError::unavailable(format!(
            "the NATS broker at {} does not answer, so nothing can be copied to it. Nothing \
             was written; run the same command again once it answers.",
            broker.url()
        )));
    }
    let (body, inbox) = broker.team_streams(team_id).await?;
    let missing: Vec<String> = [
        (body.is_none(), body_stream_name(team_id)),
        (inbox.is_none(), inbox_stream_name(team_id)),
    ]
    .into_iter()
    .filter_map(|(missing, name)| missing.then_some(name))
    .collect();
    if !missing.is_empty() {
        return Err(BusError::conflict(format!(
            "the team's stream(s) {} do not exist on the broker at {}, so no body can be \
             stored there. Nothing was written. Provision them with `ai-crew-sync team stream \
             --team TEAM --nats-url URL`, then run the same command again.",
            missing.join(" and "),
            broker.url()
        )));
    }
    if let Some(body) = body
        && body.max_message_size >= 0
        && (body.max_message_size as usize) < REQUIRED_MAX_PAYLOAD
    {
        return Err(BusError::conflict(format!(
            "stream {} takes at most {} bytes per message, and a conversation body can be 1 MiB \
             plus headers ({REQUIRED_MAX_PAYLOAD} bytes). Nothing was written. Raise it with \
             `ai-crew-sync team stream --team TEAM --nats-url URL --update-quotas`, then run the \
             same command again.",
            body.name, body.max_message_size
        )));
    }
    Ok(())
}

/// How a move is going, for a progress bar or a line of output.
#[derive(Clone, Debug, Serialize)]
pub struct Progress {
    pub conversation_id: Uuid,
    /// `copying`, `paused` (copying the tail), `cut_over`.
    pub phase: &'static str,
    pub messages_done: i64,
    pub messages_total: i64,
    pub bytes_done: i64,
    pub bytes_total: i64,
}

/// What a finished move did.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub migration_id: Uuid,
    pub conversation_id: Uuid,
    pub direction: Direction,
    /// Bodies written to the target and verified by this run.
    pub copied: i64,
    /// Messages verified in an earlier, interrupted pass of the same run.
    pub resumed: i64,
    /// Messages already on the target.
    pub skipped: i64,
    /// The conversation's bytes now on the target, counted as the plan
    /// counts them (`bytes_of_messages!`): a summary and its plan agree for
    /// the same bodies, whether this run copied them, an earlier pass did,
    /// or they were there already.
    pub bytes: i64,
    /// Of those, the bytes this run copied or found copied (progress).
    pub bytes_copied: i64,
    /// How long writes to the thread were refused.
    pub paused_ms: i64,
    pub state: String,
}

/// How long, at most, a move waits under its pause for the messages still
/// in flight through the outbox.
pub const SETTLE_WAIT: Duration = Duration::from_secs(30);

/// One move in progress.
struct Mover<'a> {
    pool: &'a PgPool,
    team_id: Uuid,
    conversation_id: Uuid,
    direction: Direction,
    migration_id: Uuid,
    /// Where the copies go.
    target: AnyBackend,
    /// The broker, for reading bodies back from JetStream (to_postgres).
    jetstream: Option<AnyBackend>,
    progress: &'a (dyn Fn(&Progress) + Sync),
    totals: (i64, i64),
    done: Outcome,
}

/// Open or resume the run, copy, pause, copy the tail, cut over. Refusals
/// come before work: a long publication backoff before the run is opened,
/// the plan's refusals (the target, failed messages) before a body is
/// copied. Once the run is open, any failure aborts it (M11) and the move's
/// own error is returned.
///
/// Bodies the broker lost (the plan's `lost`) cannot be copied: without
/// `tombstone_lost` the move is refused naming them, before anything is
/// written; with it (the operator's explicit `--tombstone-lost`) they are
/// tombstoned with "the broker lost this body", audited as that actor, and
/// the rest is moved.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    pool: &PgPool,
    backends: &Backends,
    team_id: Uuid,
    conversation_id: Uuid,
    direction: Direction,
    started_by: &str,
    tombstone_lost: Option<&Actor>,
    progress: &(dyn Fn(&Progress) + Sync),
) -> BusResult<Outcome> {
    // Both directions talk to the broker: one writes to it, the other reads
    // from it. Without one, refuse before anything is written.
    let jetstream = backends.for_message(JetStreamBackend::NAME, team_id)?;
    let target = backends.for_message(direction.target(), team_id)?;
    refuse_a_longer_backoff(
        pool,
        team_id,
        conversation_id,
        "Nothing was copied, paused or moved.",
    )
    .await?;
    if tombstone_lost.is_none() {
        refuse_lost_bodies(pool, team_id, conversation_id).await?;
    }
    let migration_id = open_run(pool, team_id, conversation_id, direction, started_by).await?;
    let mut mover = Mover {
        pool,
        team_id,
        conversation_id,
        direction,
        migration_id,
        target,
        jetstream: Some(jetstream),
        progress,
        totals: (0, 0),
        done: Outcome {
            migration_id,
            conversation_id,
            direction,
            copied: 0,
            resumed: 0,
            skipped: 0,
            bytes: 0,
            bytes_copied: 0,
            paused_ms: 0,
            state: "copying".into(),
        },
    };
    let moved = async {
        // After the run is open, so a plan that fails (or refuses) aborts
        // it: a resumed run holding the pause is not left holding it.
        let plan = plan(pool, backends, team_id, direction, &[conversation_id]).await?;
        let plan = plan.first().ok_or_else(|| {
            BusError::not_found(format!("no conversation {conversation_id} in this team."))
        })?;
        if let Some(why) = &plan.blocked {
            return Err(BusError::conflict(format!(
                "conversation {conversation_id} cannot be moved to {}: {why}. Nothing was \
                 copied or cut over.",
                direction.target()
            )));
        }
        if let (Some(actor), false) = (tombstone_lost, plan.lost.is_empty()) {
            let broker = mover.jetstream.as_ref().expect("a broker for lost bodies");
            lost_bodies::tombstone_known_lost(pool, broker, team_id, conversation_id, actor)
                .await?;
        }
        mover.totals = (plan.messages, plan.bytes);
        mover.copy_pause_cut_over().await
    }
    .await;
    match moved {
        Ok(()) => Ok(mover.done),
        Err(e) => {
            if let Err(abort_error) = abort(pool, migration_id, &e.to_string()).await {
                tracing::error!(error = %abort_error, migration = %migration_id,
                    "could not abort a failed move; it stays open and paused until resumed");
            }
            Err(e)
        }
    }
}

/// Refuse a move over bodies the broker lost, naming them and the two ways
/// out, with nothing written (no run opened): a move cannot copy them, and
/// dropping them silently is not the operator's decision made.
async fn refuse_lost_bodies(pool: &PgPool, team_id: Uuid, conversation_id: Uuid) -> BusResult<()> {
    let lost = lost_bodies::known_lost(pool, team_id, &[conversation_id]).await?;
    if lost.is_empty() {
        return Ok(());
    }
    Err(BusError::conflict(format!(
        "conversation {conversation_id} has {} message(s) whose bodies the broker lost ({}): \
         each was released from PostgreSQL and written to a stream that has since been \
         re-created, so there is nothing to copy. Nothing was copied, paused, tombstoned or \
         moved. Either restore the stream from a backup (then `ai-crew-sync team stream`) and \
         run the same command again, or run it again with --tombstone-lost to tombstone them \
         (readers see \"{}\"; audited) and move the rest.",
        lost.len(),
        name_lost(lost.iter().map(|(_, l)| l)),
        lost_bodies::LOST_BODY_REASON
    )))
}

/// `seq 3 (message …), …`, the first 20 and how many more.
fn name_lost<'a>(lost: impl Iterator<Item = &'a KnownLost>) -> String {
    let lost: Vec<&KnownLost> = lost.collect();
    let mut named: Vec<String> = lost
        .iter()
        .take(20)
        .map(|l| format!("seq {} (message {})", l.seq, l.message_id))
        .collect();
    if lost.len() > 20 {
        named.push(format!("and {} more", lost.len() - 20));
    }
    named.join(", ")
}

/// A message whose publication is waiting out a retry backoff longer than a
/// move may pause writes would only make the move hold writes and then give
/// up. Refused before the work it would waste (`done` says what was not
/// done); the backoff is the backend's to recover from, and is not cut short
/// (that would spend the slot's attempts faster than O8 allows).
async fn refuse_a_longer_backoff(
    pool: &PgPool,
    team_id: Uuid,
    conversation_id: Uuid,
    done: &str,
) -> BusResult<()> {
    let (waiting, next_in, last_error): (i64, Option<f64>, Option<String>) = sqlx::query_as(
        "SELECT count(*),
                max(extract(epoch FROM next_attempt_at - now()))::float8,
                (array_agg(last_error ORDER BY next_attempt_at DESC))[1]
           FROM conversation_outbox
          WHERE team_id = $3 AND conversation_id = $1 AND state = 'pending'
            AND next_attempt_at > now() + make_interval(secs => $2)",
    )
    .bind(conversation_id)
    .bind(SETTLE_WAIT.as_secs_f64())
    .bind(team_id)
    .fetch_one(pool)
    .await?;
    if waiting == 0 {
        return Ok(());
    }
    Err(BusError::conflict(format!(
        "{waiting} message(s) of conversation {conversation_id} are waiting to retry their \
         publication (the last in {:.0} s; last error: {}), longer than a move may pause writes \
         ({} s). {done} Run the same command again once `conversations status` shows nothing \
         pending for this team.",
        next_in.unwrap_or_default(),
        last_error.as_deref().unwrap_or("none recorded"),
        SETTLE_WAIT.as_secs()
    )))
}

/// One open run per conversation, decided under the conversation's lock
/// (M3): the same direction resumes, the other is a conflict.
async fn open_run(
    pool: &PgPool,
    team_id: Uuid,
    conversation_id: Uuid,
    direction: Direction,
    started_by: &str,
) -> BusResult<Uuid> {
    let mut tx = pool.begin().await?;
    lock_conversation(&mut tx, team_id, conversation_id).await?;
    let open: Option<(Uuid, String)> = sqlx::query_as(
        "SELECT id, direction FROM conversation_migrations
          WHERE conversation_id = $1 AND state IN ('planned', 'copying', 'verified')",
    )
    .bind(conversation_id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((id, open_direction)) = open {
        if open_direction != direction.column() {
            return Err(BusError::conflict(format!(
                "a move of conversation {conversation_id} {} is already open. Let it finish (run \
                 the same command again to resume it) before moving it the other way.",
                open_direction.replace('_', " ")
            )));
        }
        tx.commit().await?;
        return Ok(id);
    }
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO conversation_migrations (id, team_id, conversation_id, direction, state, started_by)
         VALUES ($1, $2, $3, $4, 'copying', $5)",
    )
    .bind(id)
    .bind(team_id)
    .bind(conversation_id)
    .bind(direction.column())
    .bind(started_by)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(id)
}

async fn lock_conversation(
    conn: &mut sqlx::PgConnection,
    team_id: Uuid,
    conversation_id: Uuid,
) -> BusResult<()> {
    let found: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM conversations WHERE team_id = $1 AND id = $2 FOR UPDATE",
    )
    .bind(team_id)
    .bind(conversation_id)
    .fetch_optional(conn)
    .await?;
    found.map(|_| ()).ok_or_else(|| {
        BusError::not_found(format!("no conversation {conversation_id} in this team."))
    })
}

/// A message to move, in seq order.
#[derive(sqlx::FromRow)]
struct Source {
    seq: i64,
    id: Uuid,
    publication_state: String,
    body: String,
    body_sha256: Vec<u8>,
    canonical_locator: Option<String>,
    backend: String,
}

impl Mover<'_> {
    async fn copy_pause_cut_over(&mut self) -> BusResult<()> {
        // The bulk, with the thread open.
        // What exists now; messages sent meanwhile are the tail (chasing
        // them with the thread open might never end).
        let last_seq: i64 =
            sqlx::query_scalar("SELECT last_seq FROM conversations WHERE team_id = $1 AND id = $2")
                .bind(self.team_id)
                .bind(self.conversation_id)
                .fetch_one(self.pool)
                .await?;
        self.copy_pending_items("copying", last_seq).await?;
        // A send during the copy may have met a long backoff since.
        refuse_a_longer_backoff(
            self.pool,
            self.team_id,
            self.conversation_id,
            "Nothing was paused or cut over; the copies made are kept for the next run.",
        )
        .await?;
        self.pause().await?;
        self.wait_for_outbox().await?;
        self.refuse_unsettled().await?;
        // The tail: whatever was sent during the copy.
        self.copy_pending_items("paused", i64::MAX).await?;
        self.cut_over().await
    }

    fn report(&self, phase: &'static str) {
        (self.progress)(&Progress {
            conversation_id: self.conversation_id,
            phase,
            messages_done: self.done.copied + self.done.resumed + self.done.skipped,
            messages_total: self
                .totals
                .0
                .max(self.done.copied + self.done.resumed + self.done.skipped),
            bytes_done: self.done.bytes_copied,
            bytes_total: self.totals.1.max(self.done.bytes_copied),
        });
    }

    /// Copy every message not tombstoned up to `up_to_seq` not yet stored
    /// on the target nor verified by this run, in seq order (M5). Whatever
    /// its publication state: one still pending is left to the tail (the
    /// move waits for the outbox under the pause), and one that failed for
    /// good, or is still pending at the tail, refuses the move.
    async fn copy_pending_items(&mut self, phase: &'static str, up_to_seq: i64) -> BusResult<()> {
        let mut after_seq = 0_i64;
        loop {
            let page: Vec<Source> = sqlx::query_as(
                "SELECT m.seq, m.id, m.body, m.body_sha256, m.canonical_locator, m.backend,
                        m.publication_state
                   FROM conversation_messages m
                  WHERE m.team_id = $1 AND m.conversation_id = $2 AND m.seq > $3 AND m.seq <= $6
                    AND m.tombstoned_at IS NULL
                    AND NOT (m.backend = $4 AND m.publication_state = 'stored')
                    AND NOT EXISTS (SELECT 1 FROM conversation_migration_items i
                                     WHERE i.migration_id = $5 AND i.message_id = m.id
                                       AND i.state = 'verified')
                  ORDER BY m.seq
                  LIMIT 200",
            )
            .bind(self.team_id)
            .bind(self.conversation_id)
            .bind(after_seq)
            .bind(self.direction.target())
            .bind(self.migration_id)
            .bind(up_to_seq)
            .fetch_all(self.pool)
            .await?;
            let Some(last) = page.last() else {
                break;
            };
            after_seq = last.seq;
            for source in page {
                match source.publication_state.as_str() {
                    "stored" => {}
                    "pending_publication" if phase == "copying" => continue,
                    state => {
                        return Err(BusError::conflict(format!(
                            "message {} (seq {}) is {state}: it is stored on no backend, so \
                             it cannot be moved, and the move will not cut over without it. \
                             Nothing was cut over. `conversations status` shows the team's \
                             outbox; a failed message must be tombstoned deliberately \
                             (`conversations tombstone … --seq {} --reason …`) before the \
                             thread can move.",
                            source.id, source.seq, source.seq
                        )));
                    }
                }
                self.copy_one(&source).await?;
                self.report(phase);
            }
        }
        Ok(())
    }

    /// Read, record, write, read back, compare (M5-M9).
    async fn copy_one(&mut self, source: &Source) -> BusResult<()> {
        let body = self.read_source(source).await?;
        let sum = body_digest(&body);
        if sum[..] != source.body_sha256[..] {
            return Err(BusError::conflict(format!(
                "the body of message {} read from {} does not match the SHA-256 recorded when it \
                 was sent. Nothing was cut over; find out which copy is right before moving this \
                 conversation.",
                source.id, source.backend
            )));
        }
        // Recorded before anything is written (M6), so a crash after the
        // write still finds the item on resume.
        sqlx::query(
            "INSERT INTO conversation_migration_items
                 (migration_id, message_id, team_id, body_sha256, bytes, state)
             VALUES ($1, $2, $3, $4, $5, 'planned')
             ON CONFLICT (migration_id, message_id) DO UPDATE
                 SET body_sha256 = EXCLUDED.body_sha256, bytes = EXCLUDED.bytes, updated_at = now()",
        )
        .bind(self.migration_id)
        .bind(source.id)
        .bind(self.team_id)
        .bind(&sum[..])
        .bind(body.len() as i32)
        .execute(self.pool)
        .await?;
        // A copy already on the target is found before publishing again
        // (M7): one this run recorded, or one an earlier run of the same
        // direction wrote (a failed move started again, a thread moved
        // there before and back). The broker's deduplication is windowed, so
        // a republish after a long interruption would store a second entry.
        if let Some(found) = self.copy_already_there(source.id, &sum).await? {
            self.mark_item(source.id, "verified", Some(&found), None)
                .await?;
            self.done.resumed += 1;
            self.done.bytes_copied += body.len() as i64;
            return Ok(());
        }
        let locator = self.write_target(source, &body).await?;
        self.mark_item(source.id, "copied", Some(&locator), None)
            .await?;
        // Read back from the target and compare (M9).
        let back = self
            .target
            .fetch(&Locator(locator.clone()), source.id)
            .await?;
        match back {
            Some(back) if body_digest(&back) == sum => {}
            other => {
                let why = match other {
                    Some(_) => "checksum mismatch: the target holds a different body",
                    None => "the target could not read the copy back",
                };
                self.mark_item(source.id, "failed", None, Some(why)).await?;
                return Err(BusError::conflict(format!(
                    "message {} was copied to {} and read back wrong ({why}). Nothing was cut \
                     over; the thread is reopened on {}.",
                    source.id,
                    self.direction.target(),
                    source.backend
                )));
            }
        }
        self.mark_item(source.id, "verified", None, None).await?;
        self.done.copied += 1;
        self.done.bytes_copied += body.len() as i64;
        Ok(())
    }

    /// A copy of this message on the target with the right SHA-256, at a
    /// locator a run of this direction recorded (this run's first). Only the
    /// broker can hold a second copy: a move to postgres writes into the row.
    async fn copy_already_there(
        &self,
        message_id: Uuid,
        sum: &[u8; 32],
    ) -> BusResult<Option<String>> {
        if self.direction != Direction::ToJetStream {
            return Ok(None);
        }
        let recorded: Vec<String> = sqlx::query_scalar(
            "SELECT i.target_locator FROM conversation_migration_items i
               JOIN conversation_migrations g ON g.id = i.migration_id
              WHERE i.team_id = $1 AND i.message_id = $2 AND g.direction = $3
                AND i.target_locator IS NOT NULL
              GROUP BY i.target_locator
              ORDER BY bool_or(i.migration_id = $4) DESC, max(i.updated_at) DESC
              LIMIT 8",
        )
        .bind(self.team_id)
        .bind(message_id)
        .bind(self.direction.column())
        .bind(self.migration_id)
        .fetch_all(self.pool)
        .await?;
        for locator in recorded {
            // One look: a copy not found (or not readable now) is published
            // again under the message's key, which the broker deduplicates
            // inside its window; nothing is tombstoned on this answer.
            if let Ok(Some(there)) = self
                .target
                .fetch_once(&Locator(locator.clone()), message_id)
                .await
                && body_digest(&there) == *sum
            {
                return Ok(Some(locator));
            }
        }
        Ok(None)
    }

    /// The body from where it actually is: the row for a postgres-backed
    /// message, the broker (by its locator) otherwise.
    async fn read_source(&self, source: &Source) -> BusResult<String> {
        if source.backend == PostgresBackend::NAME {
            return Ok(source.body.clone());
        }
        let Some(locator) = &source.canonical_locator else {
            return Err(BusError::conflict(format!(
                "message {} has no locator on {}, so its body cannot be read there.",
                source.id, source.backend
            )));
        };
        let broker = self
            .jetstream
            .as_ref()
            .expect("a broker for a jetstream source");
        let named = |why: String| {
            format!(
                "message {} (seq {}) cannot be read from the broker at {locator}: {why}. \
                 Nothing was cut over. A body that is gone cannot be copied back; tombstone it \
                 deliberately or restore the stream first: `ai-crew-sync conversations \
                 declare-lost --team T --conversation {} --apply` records the bodies the broker \
                 cannot return as lost (audited; readers see the reason), and a move skips a \
                 tombstoned message.",
                source.id, source.seq, self.conversation_id
            )
        };
        match broker.fetch(&Locator(locator.clone()), source.id).await {
            Ok(Some(body)) => Ok(body),
            Ok(None) => Err(BusError::not_found(named(
                "the broker no longer holds the body".to_owned(),
            ))),
            Err(BusError::Db(e)) => Err(BusError::Db(e)),
            Err(BusError::Unavailable(why)) => Err(BusError::unavailable(named(why))),
            Err(
                BusError::NotFound(why)
                | BusError::Invalid(why)
                | BusError::Conflict(why)
                | BusError::Unauthenticated(why)
                | BusError::Forbidden(why),
            ) => Err(BusError::conflict(named(why))),
        }
    }

    /// Write under a key derived from the message (M8): the message id.
    async fn write_target(&self, source: &Source, body: &str) -> BusResult<String> {
        match self.direction {
            Direction::ToJetStream => {
                let envelope = Envelope {
                    message_id: source.id,
                    conversation_id: self.conversation_id,
                    team_id: self.team_id,
                    body: body.to_owned(),
                    publish_key: source.id,
                };
                match self.target.publish(&envelope).await {
                    Published::Confirmed(Locator(locator)) => Ok(locator),
                    Published::Retryable(why)
                    | Published::Blocked(why)
                    | Published::Fatal(why)
                    | Published::Unanswered(why) => Err(BusError::unavailable(format!(
                        "copying message {} to jetstream failed: {why}. Nothing was cut over; \
                         run the same command again to resume.",
                        source.id
                    ))),
                }
            }
            Direction::ToPostgres => {
                // Back into the row; the row stays broker-authoritative until
                // the cutover, and the sweep leaves a migrating row alone.
                sqlx::query(
                    "UPDATE conversation_messages SET body = $3 WHERE team_id = $1 AND id = $2",
                )
                .bind(self.team_id)
                .bind(source.id)
                .bind(body)
                .execute(self.pool)
                .await?;
                Ok(source.id.to_string())
            }
        }
    }

    async fn mark_item(
        &self,
        message_id: Uuid,
        state: &str,
        locator: Option<&str>,
        error: Option<&str>,
    ) -> BusResult<()> {
        sqlx::query(
            "UPDATE conversation_migration_items
                SET state = $3, target_locator = COALESCE($4, target_locator),
                    last_error = $5, updated_at = now()
              WHERE migration_id = $1 AND message_id = $2",
        )
        .bind(self.migration_id)
        .bind(message_id)
        .bind(state)
        .bind(locator)
        .bind(error)
        .execute(self.pool)
        .await?;
        Ok(())
    }

    /// Refuse writes to this thread (M4), under the lock a send takes, so a
    /// send in flight either commits before the pause or sees it. A resumed
    /// run keeps the pause it already holds.
    async fn pause(&mut self) -> BusResult<()> {
        let mut tx = self.pool.begin().await?;
        lock_conversation(&mut tx, self.team_id, self.conversation_id).await?;
        // Only for a run still open, checked under the same lock an abort
        // takes: another operator sharing this run may have failed and
        // aborted it meanwhile (lifting the pause), and a pause taken now
        // would be owned by no move. Its cutover would refuse, its abort
        // would find nothing open, and the thread would refuse every send.
        let open: Option<Uuid> = sqlx::query_scalar(
            "SELECT id FROM conversation_migrations
              WHERE id = $1 AND state IN ('planned', 'copying', 'verified')",
        )
        .bind(self.migration_id)
        .fetch_optional(&mut *tx)
        .await?;
        if open.is_none() {
            return Err(BusError::conflict(format!(
                "this move of conversation {} was given up by another process (or finished) \
                 while this one copied, so it did not pause writes and cut nothing over. \
                 `conversations migrate` without --apply shows where the thread stands; run the \
                 same command again to start a new move.",
                self.conversation_id
            )));
        }
        sqlx::query(
            "UPDATE conversations SET write_paused_at = COALESCE(write_paused_at, now())
              WHERE team_id = $1 AND id = $2",
        )
        .bind(self.team_id)
        .bind(self.conversation_id)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE conversation_migrations SET paused_at = COALESCE(paused_at, now()), updated_at = now()
              WHERE id = $1",
        )
        .bind(self.migration_id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Messages accepted before the pause may still be in the outbox; their
    /// bodies are not on their backend yet. Wait (bounded) for the drain.
    async fn wait_for_outbox(&self) -> BusResult<()> {
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            let in_flight: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM conversation_outbox WHERE conversation_id = $1 AND state <> 'failed'",
            )
            .bind(self.conversation_id)
            .fetch_one(self.pool)
            .await?;
            if in_flight == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(BusError::conflict(format!(
                    "{in_flight} message(s) of conversation {} are still awaiting publication \
                     after {} s. A running server publishes them (`serve --nats-url …`); once \
                     `conversations status` shows none pending, run the same command again.",
                    self.conversation_id,
                    SETTLE_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Under the pause and after the outbox wait, every message must be
    /// stored somewhere: one still pending or failed has no copy to move, and
    /// cutting over without it would leave it behind on the old backend.
    async fn refuse_unsettled(&self) -> BusResult<()> {
        let (pending, failed): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE publication_state = 'pending_publication'),
                    count(*) FILTER (WHERE publication_state = 'failed')
               FROM conversation_messages
              WHERE team_id = $1 AND conversation_id = $2 AND tombstoned_at IS NULL",
        )
        .bind(self.team_id)
        .bind(self.conversation_id)
        .fetch_one(self.pool)
        .await?;
        if pending + failed == 0 {
            return Ok(());
        }
        Err(BusError::conflict(format!(
            "conversation {} has {pending} message(s) still awaiting publication and {failed} \
             whose publication failed for good; a move would leave them behind, so nothing was \
             cut over and the thread is reopened. Pending ones are published by a running \
             server (`serve --nats-url …`); failed ones are listed by `conversations status` \
             and must be tombstoned deliberately (`conversations tombstone … --seq N --reason …`). \
             Then run the same command again.",
            self.conversation_id
        )))
    }

    /// One transaction, the conversation row first (M10).
    async fn cut_over(&mut self) -> BusResult<()> {
        let mut tx = self.pool.begin().await?;
        lock_conversation(&mut tx, self.team_id, self.conversation_id).await?;
        let open: Option<Uuid> = sqlx::query_scalar(
            "SELECT id FROM conversation_migrations
              WHERE id = $1 AND state IN ('planned', 'copying', 'verified')",
        )
        .bind(self.migration_id)
        .fetch_optional(&mut *tx)
        .await?;
        if open.is_none() {
            return Err(BusError::conflict(
                "this move was finished or given up by another process meanwhile; nothing was cut over by this one.",
            ));
        }
        // Every message not tombstoned must be stored on the target or
        // verified there: the pause guarantees nothing new arrived since the
        // tail was copied, and a message not stored anywhere is not moved.
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_messages m
              WHERE m.team_id = $1 AND m.conversation_id = $2
                AND m.tombstoned_at IS NULL
                AND NOT (m.backend = $3 AND m.publication_state = 'stored')
                AND NOT EXISTS (SELECT 1 FROM conversation_migration_items i
                                 WHERE i.migration_id = $4 AND i.message_id = m.id
                                   AND i.state = 'verified')",
        )
        .bind(self.team_id)
        .bind(self.conversation_id)
        .bind(self.direction.target())
        .bind(self.migration_id)
        .fetch_one(&mut *tx)
        .await?;
        if left > 0 {
            return Err(BusError::conflict(format!(
                "{left} message(s) are not verified on {}; nothing was cut over.",
                self.direction.target()
            )));
        }
        // To postgres the rows become the record, so each must still hold
        // the body verified into it (nothing may have cleared it since).
        if self.direction == Direction::ToPostgres {
            let emptied: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM conversation_migration_items i
                   JOIN conversation_messages m ON m.team_id = i.team_id AND m.id = i.message_id
                  WHERE i.migration_id = $1 AND i.state = 'verified'
                    AND sha256(convert_to(m.body, 'UTF8')) <> m.body_sha256",
            )
            .bind(self.migration_id)
            .fetch_one(&mut *tx)
            .await?;
            if emptied > 0 {
                return Err(BusError::conflict(format!(
                    "{emptied} body(ies) written back for this move no longer match their \
                     SHA-256 in PostgreSQL (cleared since they were verified); nothing was cut \
                     over. Run the same command again to copy them anew."
                )));
            }
        }
        // To postgres the row is the storage again (locator null, stored);
        // to jetstream the verified copy's locator becomes canonical and the
        // local body stays until `cleanup`.
        sqlx::query(
            "UPDATE conversation_messages m
                SET backend = $4,
                    canonical_locator = CASE WHEN $4 = 'postgres' THEN NULL ELSE i.target_locator END,
                    publication_state = 'stored'
               FROM conversation_migration_items i
              WHERE i.migration_id = $3 AND i.state = 'verified'
                AND m.team_id = $1 AND m.conversation_id = $2 AND m.id = i.message_id",
        )
        .bind(self.team_id)
        .bind(self.conversation_id)
        .bind(self.migration_id)
        .bind(self.direction.target())
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE conversations
                SET backend = $3,
                    publication = CASE WHEN $3 = 'postgres' THEN 'sync' ELSE 'outbox' END,
                    write_paused_at = NULL
              WHERE team_id = $1 AND id = $2",
        )
        .bind(self.team_id)
        .bind(self.conversation_id)
        .bind(self.direction.target())
        .execute(&mut *tx)
        .await?;
        let paused_ms: Option<i64> = sqlx::query_scalar(
            "UPDATE conversation_migrations
                SET state = 'cut_over', cut_over_at = now(), updated_at = now(),
                    messages_moved = messages_moved + $2, bytes_moved = bytes_moved + $3
              WHERE id = $1
              RETURNING (extract(epoch FROM now() - paused_at) * 1000)::bigint",
        )
        .bind(self.migration_id)
        .bind(self.done.copied + self.done.resumed)
        .bind(self.done.bytes_copied)
        .fetch_one(&mut *tx)
        .await?;
        let bytes: i64 = sqlx::query_scalar(concat!(
            "SELECT ",
            bytes_of_messages!(),
            " FROM conversation_messages m WHERE m.team_id = $1 AND m.conversation_id = $2"
        ))
        .bind(self.team_id)
        .bind(self.conversation_id)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        self.done.bytes = bytes;
        self.done.paused_ms = paused_ms.unwrap_or(0);
        self.done.skipped = self.totals.0 - self.done.copied - self.done.resumed;
        self.done.state = "cut_over".into();
        self.report("cut_over");
        Ok(())
    }
}

/// Give up on a move in one transaction, the conversation row first (M12):
/// only an open run is failed; a move to postgres clears the copies it wrote
/// back that never verified (a verified one is kept: it read back identical,
/// and may be the last copy if the broker is going bad); the pause is lifted
/// only if no open run owns it. A run found no longer open (another process
/// failed or finished it) has nothing left to undo, but a pause no open run
/// owns is still lifted: left, it would refuse every send for good.
pub async fn abort(pool: &PgPool, migration_id: Uuid, why: &str) -> BusResult<()> {
    let mut tx = pool.begin().await?;
    let run: Option<(Uuid, Uuid, String)> = sqlx::query_as(
        "SELECT team_id, conversation_id, direction FROM conversation_migrations WHERE id = $1",
    )
    .bind(migration_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((team_id, conversation_id, direction)) = run else {
        return Ok(());
    };
    lock_conversation(&mut tx, team_id, conversation_id).await?;
    let failed: Option<Uuid> = sqlx::query_scalar(
        "UPDATE conversation_migrations
            SET state = 'failed', failed_at = now(), updated_at = now(), error = $2
          WHERE id = $1 AND state IN ('planned', 'copying', 'verified')
          RETURNING id",
    )
    .bind(migration_id)
    .bind(why)
    .fetch_optional(&mut *tx)
    .await?;
    if failed.is_some() && direction == Direction::ToPostgres.column() {
        sqlx::query(
            "UPDATE conversation_messages m
                SET body = ''
               FROM conversation_migration_items i
              WHERE i.migration_id = $1 AND m.id = i.message_id
                AND m.backend <> 'postgres' AND i.state <> 'verified'",
        )
        .bind(migration_id)
        .execute(&mut *tx)
        .await?;
    }
    lift_orphaned_pause(&mut tx, team_id, conversation_id).await?;
    tx.commit().await?;
    Ok(())
}

/// Lift the conversation's pause unless an open run owns it; whether it was
/// lifted. The caller holds the conversation's lock.
async fn lift_orphaned_pause(
    conn: &mut sqlx::PgConnection,
    team_id: Uuid,
    conversation_id: Uuid,
) -> BusResult<bool> {
    let lifted = sqlx::query(
        "UPDATE conversations c SET write_paused_at = NULL
          WHERE c.team_id = $1 AND c.id = $2 AND c.write_paused_at IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM conversation_migrations g
                             WHERE g.conversation_id = c.id
                               AND g.state IN ('planned', 'copying', 'verified'))",
    )
    .bind(team_id)
    .bind(conversation_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(lifted > 0)
}

/// What `conversations unpause` did.
#[derive(Clone, Debug, Serialize)]
pub struct Unpaused {
    pub conversation_id: Uuid,
    /// How long writes had been paused, when they were; `None`: they were
    /// not, and nothing was changed.
    pub paused_seconds: Option<i64>,
}

/// Lift a pause no move owns (an operator's way out of a thread left paused
/// by a crash or an older version), audited. Refused while any move of the
/// conversation is open: that move owns the pause, and the same migrate
/// command resumes it (or fails it and lifts the pause).
pub async fn unpause(
    pool: &PgPool,
    team_id: Uuid,
    conversation_id: Uuid,
    actor: &Actor,
) -> BusResult<Unpaused> {
    let mut tx = pool.begin().await?;
    lock_conversation(&mut tx, team_id, conversation_id).await?;
    let open: Option<(Uuid, String)> = sqlx::query_as(
        "SELECT id, direction FROM conversation_migrations
          WHERE conversation_id = $1 AND state IN ('planned', 'copying', 'verified')",
    )
    .bind(conversation_id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((run, direction)) = open {
        return Err(BusError::conflict(format!(
            "move {run} of conversation {conversation_id} ({}) is open and owns the pause; \
             nothing was changed. Run `conversations migrate --to {} --conversation \
             {conversation_id} --apply` again to resume it: it either finishes or fails and \
             lifts the pause.",
            direction.replace('_', " "),
            direction.trim_start_matches("to_")
        )));
    }
    let paused_seconds: Option<i64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - write_paused_at)::bigint FROM conversations
          WHERE team_id = $1 AND id = $2",
    )
    .bind(team_id)
    .bind(conversation_id)
    .fetch_one(&mut *tx)
    .await?;
    if paused_seconds.is_none() {
        return Ok(Unpaused {
            conversation_id,
            paused_seconds: None,
        });
    }
    lift_orphaned_pause(&mut tx, team_id, conversation_id).await?;
    audit::record(
        &mut tx,
        Some(team_id),
        actor,
        "conversation.unpause",
        &conversation_id.to_string(),
        serde_json::json!({ "paused_seconds": paused_seconds }),
    )
    .await?;
    tx.commit().await?;
    Ok(Unpaused {
        conversation_id,
        paused_seconds,
    })
}

/// Whether a conversation's writes are paused right now (M13): what an
/// operator is told after a failed move, rather than assuming it reopened.
/// An unknown conversation is an error, not "not paused".
pub async fn is_paused(pool: &PgPool, conversation_id: Uuid) -> BusResult<bool> {
    let paused: Option<bool> =
        sqlx::query_scalar("SELECT write_paused_at IS NOT NULL FROM conversations WHERE id = $1")
            .bind(conversation_id)
            .fetch_optional(pool)
            .await?;
    paused.ok_or_else(|| {
        BusError::not_found(format!(
            "no conversation {conversation_id}; `conversations status --team T` lists a team's \
             conversations."
        ))
    })
}

/// The messages `cleanup` may release; `$1` team, `$2` window in seconds.
macro_rules! cleanable {
    () => {
        "m.team_id = $1 AND m.backend = 'jetstream' AND m.body <> ''
         AND m.canonical_locator IS NOT NULL AND m.publication_state = 'stored'
         AND (SELECT g.direction = 'to_jetstream'
                     AND g.cut_over_at < now() - make_interval(secs => $2)
                FROM conversation_migrations g
               WHERE g.conversation_id = m.conversation_id AND g.state = 'cut_over'
               ORDER BY g.cut_over_at DESC LIMIT 1)
         -- Never under an open move: a move back writes bodies into these
         -- rows before its cutover makes them the record.
         AND NOT EXISTS (SELECT 1 FROM conversation_migrations o
                          WHERE o.conversation_id = m.conversation_id
                            AND o.state IN ('planned', 'copying', 'verified'))"
    };
}

/// What `conversations cleanup` found (and, with `--apply`, released).
#[derive(Clone, Debug, Serialize)]
pub struct Cleanup {
    pub rollback_window_hours: i64,
    pub messages: i64,
    pub bytes: i64,
    pub applied: bool,
}

/// Drop source bodies a finished move no longer needs (M14): only messages
/// on jetstream with a locator, of conversations whose latest cut-over move
/// went to jetstream and finished longer ago than the rollback window.
/// Deliberately explicit and late.
pub async fn cleanup(
    pool: &PgPool,
    team_id: Uuid,
    rollback_window_hours: i64,
    apply: bool,
) -> BusResult<Cleanup> {
    if rollback_window_hours < 0 {
        return Err(BusError::invalid(format!(
            "--rollback-window-hours {rollback_window_hours} is negative: the window is how long \
             a finished move must have been cut over before its source bodies may be dropped. \
             Use 0 or more (default 168)."
        )));
    }
    let window_secs = (rollback_window_hours.saturating_mul(3600)) as f64;
    let (messages, bytes): (i64, i64) = sqlx::query_as(concat!(
        "SELECT count(*), COALESCE(sum(octet_length(m.body)), 0)::bigint
           FROM conversation_messages m
          WHERE ",
        cleanable!()
    ))
    .bind(team_id)
    .bind(window_secs)
    .fetch_one(pool)
    .await?;
    if apply && messages > 0 {
        sqlx::query(concat!(
            "UPDATE conversation_messages m SET body = '' WHERE ",
            cleanable!()
        ))
        .bind(team_id)
        .bind(window_secs)
        .execute(pool)
        .await?;
    }
    Ok(Cleanup {
        rollback_window_hours,
        messages,
        bytes,
        applied: apply,
    })
}
