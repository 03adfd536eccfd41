//! One move, from opening (or resuming) its run to the cutover: the
//! refusals that come before any work, the bulk copy with the thread open,
//! the pause, the tail, the cutover in one transaction, and [`abort`] when
//! anything fails on the way. Copying one message is `copy.rs`.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::pause::lift_orphaned_pause;
use super::{
    Direction, MoveState, Outcome, Progress, SETTLE_WAIT, lock_conversation, open_run_of, plan,
    run_is_open,
};
use crate::backend::{AnyBackend, BackendKind, Backends};
use crate::error::{BusError, BusResult};
use crate::store::Actor;
use crate::store::conversations::Publication;
use crate::store::delivery::lost_bodies::{self, KnownLost};

/// One move in progress.
pub(super) struct Mover<'a> {
    pub(super) pool: &'a PgPool,
    pub(super) team_id: Uuid,
    pub(super) conversation_id: Uuid,
    pub(super) direction: Direction,
    pub(super) migration_id: Uuid,
    /// Where the copies go.
    pub(super) target: AnyBackend,
    /// The broker, for reading bodies back from JetStream (to_postgres) and
    /// tombstoning the bodies it lost. Both directions need it: a move is
    /// refused before anything is written when there is none.
    pub(super) jetstream: AnyBackend,
    progress: &'a (dyn Fn(&Progress) + Sync),
    totals: (i64, i64),
    pub(super) done: Outcome,
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
    let jetstream = backends.for_message(BackendKind::Jetstream, team_id)?;
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
        jetstream,
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
            state: MoveState::Copying,
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
            let broker = &mover.jetstream;
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
    if let Some((id, open_direction)) = open_run_of(&mut tx, conversation_id).await? {
        if open_direction != direction {
            return Err(BusError::conflict(format!(
                "a move of conversation {conversation_id} {} is already open. Let it finish (run \
                 the same command again to resume it) before moving it the other way.",
                open_direction.in_words()
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
    .bind(direction)
    .bind(started_by)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(id)
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

    pub(super) fn report(&self, phase: &'static str) {
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
        if !run_is_open(&mut tx, self.migration_id).await? {
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
        // Its statements join the run's items, which grew while it copied:
        // planned with their values, as the copy's pages are.
        let mut tx = crate::store::custom_plans(self.pool).await?;
        lock_conversation(&mut tx, self.team_id, self.conversation_id).await?;
        if !run_is_open(&mut tx, self.migration_id).await? {
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
                    publication = $4,
                    write_paused_at = NULL
              WHERE team_id = $1 AND id = $2",
        )
        .bind(self.team_id)
        .bind(self.conversation_id)
        .bind(self.direction.target())
        .bind(Publication::for_backend(self.direction.target()))
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
        // Counted under the pause, as the plan counts them: what the plan
        // counted plus what was sent while the move copied.
        let (messages, bytes): (i64, i64) = sqlx::query_as(concat!(
            "SELECT count(*), ",
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
        self.done.skipped = messages - self.done.copied - self.done.resumed;
        self.done.state = MoveState::CutOver;
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
    let run: Option<(Uuid, Uuid, Direction)> = sqlx::query_as(
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
    if failed.is_some() && direction == Direction::ToPostgres {
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
