//! Step 2 for one message: read it from where it is, check its SHA-256,
//! record the item, find a copy already on the target or write one under
//! the message's key, read it back and compare (M5-M9).

use uuid::Uuid;

use super::mover::Mover;
use super::{Direction, ItemState};
use crate::backend::{BackendKind, Envelope, Locator, MessagingBackend, Published};
use crate::error::{BusError, BusResult};
use crate::store::conversations::PublicationState;
use crate::store::delivery::outbox::body_digest;

/// A message to move, in seq order.
#[derive(sqlx::FromRow)]
struct Source {
    seq: i64,
    id: Uuid,
    publication_state: PublicationState,
    body: String,
    body_sha256: Vec<u8>,
    canonical_locator: Option<String>,
    backend: BackendKind,
}

impl Source {
    /// The row still holds this message's body: not released (the sweep
    /// empties a published body's row only once the broker confirmed it),
    /// and hashing to the SHA-256 recorded when it was sent.
    fn holds_its_body(&self) -> bool {
        !self.body.is_empty() && body_digest(&self.body)[..] == self.body_sha256[..]
    }
}

impl Mover<'_> {
    /// Copy every message not tombstoned up to `up_to_seq` not yet stored
    /// on the target nor verified by this run, in seq order (M5). Whatever
    /// its publication state: one still pending is left to the tail (the
    /// move waits for the outbox under the pause), and one that failed for
    /// good, or is still pending at the tail, refuses the move.
    pub(super) async fn copy_pending_items(
        &mut self,
        phase: &'static str,
        up_to_seq: i64,
    ) -> BusResult<()> {
        let mut after_seq = 0_i64;
        loop {
            // Planned with its values each time: this run's items grow from
            // none to the whole thread while it copies, and a generic plan
            // made while there were none probed them by walking every item
            // for each message (the tail's empty page of a 10 000-message
            // move: 13 ms, or 5 s once in three runs).
            let mut tx = crate::store::custom_plans(self.pool).await?;
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
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            let Some(last) = page.last() else {
                break;
            };
            after_seq = last.seq;
            for source in page {
                match source.publication_state {
                    PublicationState::Stored => {}
                    PublicationState::PendingPublication if phase == "copying" => continue,
                    state @ (PublicationState::PendingPublication | PublicationState::Failed) => {
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
        if self.direction == Direction::ToPostgres && source.holds_its_body() {
            return self.keep_local_copy(source).await;
        }
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
            self.mark_item(source.id, ItemState::Verified, Some(&found), None)
                .await?;
            self.done.resumed += 1;
            self.done.bytes_copied += body.len() as i64;
            return Ok(());
        }
        let locator = self.write_target(source, &body).await?;
        self.mark_item(source.id, ItemState::Copied, Some(&locator), None)
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
                self.mark_item(source.id, ItemState::Failed, None, Some(why))
                    .await?;
                return Err(BusError::conflict(format!(
                    "message {} was copied to {} and read back wrong ({why}). Nothing was cut \
                     over; the thread is reopened on {}.",
                    source.id,
                    self.direction.target(),
                    source.backend
                )));
            }
        }
        self.mark_item(source.id, ItemState::Verified, None, None)
            .await?;
        self.done.copied += 1;
        self.done.bytes_copied += body.len() as i64;
        Ok(())
    }

    /// A move to postgres over a body the row still holds with its recorded
    /// SHA-256 (published, not yet released by the sweep): that row is the
    /// target, and the body is already in it, so nothing is read from the
    /// broker (after a wipe of its store it holds nothing there) and nothing
    /// is written. It is read back from the target and compared like every
    /// copy (M9), then recorded verified in one statement, never `planned`
    /// first: an abort clears the bodies of unverified items (M12), and this
    /// one is not a copy the move wrote but possibly the last copy anywhere.
    async fn keep_local_copy(&mut self, source: &Source) -> BusResult<()> {
        let back = self
            .target
            .fetch(&Locator(source.id.to_string()), source.id)
            .await?;
        if back.is_none_or(|back| body_digest(&back)[..] != source.body_sha256[..]) {
            return Err(BusError::conflict(format!(
                "message {} changed in PostgreSQL while it was being moved back (its row no \
                 longer holds the body with the SHA-256 recorded at send). Nothing was cut \
                 over; run the same command again.",
                source.id
            )));
        }
        sqlx::query(
            "INSERT INTO conversation_migration_items
                 (migration_id, message_id, team_id, body_sha256, bytes, state, target_locator)
             VALUES ($1, $2, $3, $4, $5, 'verified', $6)
             ON CONFLICT (migration_id, message_id) DO UPDATE
                 SET body_sha256 = EXCLUDED.body_sha256, bytes = EXCLUDED.bytes,
                     state = 'verified', target_locator = EXCLUDED.target_locator,
                     last_error = NULL, updated_at = now()",
        )
        .bind(self.migration_id)
        .bind(source.id)
        .bind(self.team_id)
        .bind(&source.body_sha256)
        .bind(source.body.len() as i32)
        .bind(source.id.to_string())
        .execute(self.pool)
        .await?;
        self.done.copied += 1;
        self.done.bytes_copied += source.body.len() as i64;
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
        .bind(self.direction)
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
    /// message, or for one whose row still holds it with its recorded
    /// SHA-256 (that copy is the body, whatever the broker answers now: after
    /// a wipe of its store, nothing), the broker (by its locator) otherwise.
    async fn read_source(&self, source: &Source) -> BusResult<String> {
        if source.backend == BackendKind::Postgres || source.holds_its_body() {
            return Ok(source.body.clone());
        }
        let Some(locator) = &source.canonical_locator else {
            return Err(BusError::conflict(format!(
                "message {} has no locator on {}, so its body cannot be read there.",
                source.id, source.backend
            )));
        };
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
        match self
            .jetstream
            .fetch(&Locator(locator.clone()), source.id)
            .await
        {
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
        state: ItemState,
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
}
