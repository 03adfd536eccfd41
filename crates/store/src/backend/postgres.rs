//! The PostgreSQL backend: the body is already in `conversation_messages`, so
//! publishing is confirming what a row holds, and the locator is the message
//! id. Trivial on purpose: it lets the outbox's failure handling be built and
//! tested against a store that cannot be blamed for anything.
//!
//! [`Faults`] make it misbehave for the tests. Production code only ever calls
//! [`PostgresBackend::new`], which leaves every fault off; nothing reads a
//! fault from configuration, a flag or the environment.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::{BackendKind, Envelope, Locator, MessagingBackend, Published};
use crate::error::{BusError, BusResult};

#[derive(Clone)]
pub struct PostgresBackend {
    pool: PgPool,
    /// The team this handle may read for, when it was built for one.
    team_id: Option<Uuid>,
    faults: Faults,
    /// Retryable failures still owed. Shared by every clone: the count is one
    /// budget, not one per clone.
    retryable_left: Arc<AtomicUsize>,
    /// Fetches answered so far, for `Faults::fetch_fails_after`. Shared by
    /// every clone, like `retryable_left`.
    fetches: Arc<AtomicUsize>,
    /// Unanswered publishes still owed (`Faults::unanswered`), shared too.
    unanswered_left: Arc<AtomicUsize>,
}

/// What to make go wrong. Off unless a test builds a backend with
/// [`PostgresBackend::with_faults`].
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Fail the next N publishes with a retryable error, then stop. (A backend
    /// that is down for good is a different test and a different knob.)
    pub retryable: usize,
    /// Fail every publish fatally.
    pub fatal: bool,
    /// Write the body, then report that the attempt failed: the uncertain
    /// completion a reconcile must resolve.
    pub lose_confirmation: bool,
    /// Pause inside publish, to widen the window a lease can expire in.
    pub delay: Option<Duration>,
    /// Fail every reconcile, as a backend that cannot be asked at all.
    pub fail_reconcile: bool,
    /// Answer this many fetches, then fail every later one as unavailable:
    /// a backend that stops being readable in the middle of a move.
    pub fetch_fails_after: Option<usize>,
    /// End the next N publishes without an answer (`Published::Unanswered`),
    /// as a broker whose acknowledgements never come back; `usize::MAX` is
    /// one that never answers a publish. Nothing is written unless
    /// `unanswered_landed`.
    pub unanswered: usize,
    /// With `unanswered`: the body is written before the answer is lost, so
    /// the publish key did land and only asking by key can tell.
    pub unanswered_landed: bool,
}

impl PostgresBackend {
    pub fn new(pool: PgPool) -> Self {
        Self::with_faults(pool, Faults::default())
    }

    /// A backend that misbehaves as `faults` says. Only the tests build one.
    pub fn with_faults(pool: PgPool, faults: Faults) -> Self {
        let retryable_left = Arc::new(AtomicUsize::new(faults.retryable));
        let unanswered_left = Arc::new(AtomicUsize::new(faults.unanswered));
        Self {
            pool,
            team_id: None,
            faults,
            retryable_left,
            fetches: Arc::default(),
            unanswered_left,
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A handle that may only read one team's bodies.
    pub fn for_team(mut self, team_id: Uuid) -> Self {
        self.team_id = Some(team_id);
        self
    }
}

impl MessagingBackend for PostgresBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    async fn publish(&self, envelope: &Envelope) -> Published {
        if let Some(delay) = self.faults.delay {
            tokio::time::sleep(delay).await;
        }
        if self.faults.fatal {
            return Published::Fatal("the backend refused this payload".into());
        }
        let owed_failure = self
            .retryable_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if owed_failure {
            return Published::Retryable("the backend was unreachable".into());
        }
        let unanswered = self
            .unanswered_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if unanswered && !self.faults.unanswered_landed {
            return Published::Unanswered("the backend did not answer".into());
        }
        // Idempotent: the row already holds the body, and confirming it twice
        // is the same write. A locator already set to something else is left
        // alone (and the answer is still this message's id).
        let written = sqlx::query(
            "UPDATE conversation_messages
                SET canonical_locator = $2
              WHERE id = $1 AND (canonical_locator IS NULL OR canonical_locator = $2)",
        )
        .bind(envelope.message_id)
        .bind(envelope.message_id.to_string())
        .execute(&self.pool)
        .await;
        match written {
            Err(e) => {
                tracing::warn!(error = %e, message = %envelope.message_id, "postgres publish failed");
                Published::Retryable("the backend write failed".into())
            }
            Ok(_) if unanswered => {
                Published::Unanswered("the backend stored it and its answer was lost".into())
            }
            Ok(_) if self.faults.lose_confirmation => {
                Published::Retryable("the confirmation was lost".into())
            }
            Ok(_) => Published::Confirmed(Locator(envelope.message_id.to_string())),
        }
    }

    async fn fetch(&self, locator: &Locator, message_id: Uuid) -> BusResult<Option<String>> {
        if let Some(allowed) = self.faults.fetch_fails_after
            && self.fetches.fetch_add(1, Ordering::SeqCst) >= allowed
        {
            return Err(BusError::unavailable(
                "the postgres backend could not be read",
            ));
        }
        let named: Uuid = locator.0.parse().map_err(|_| {
            BusError::invalid(format!(
                "{} is not a locator the postgres backend issued (it issues message ids).",
                acs_wire::text::quote(&locator.0)
            ))
        })?;
        if named != message_id {
            return Err(BusError::forbidden(
                "that locator names another message; a locator reads only the message it was issued for.",
            ));
        }
        let body: Option<String> = sqlx::query_scalar(
            "SELECT body FROM conversation_messages
              WHERE id = $1 AND ($2::uuid IS NULL OR team_id = $2)",
        )
        .bind(named)
        .bind(self.team_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(body)
    }

    async fn retain(&self, _released: &[Locator]) -> BusResult<u64> {
        // The rows are the history: `team prune` released these bodies in
        // the rows themselves. Nothing separate to drop here (B5).
        Ok(0)
    }

    async fn reconcile(&self, envelope: &Envelope) -> BusResult<Option<Locator>> {
        if self.faults.fail_reconcile {
            return Err(BusError::unavailable(
                "the postgres backend could not be asked",
            ));
        }
        // "Did it land" is a lookup here: the body is already in the row.
        let found: Option<Uuid> = sqlx::query_scalar(
            "SELECT m.id FROM conversation_messages m
               JOIN conversation_outbox o ON o.message_id = m.id
              WHERE o.publish_key = $1 AND m.canonical_locator IS NOT NULL",
        )
        .bind(envelope.publish_key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.map(|id| Locator(id.to_string())))
    }
}
