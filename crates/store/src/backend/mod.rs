//! The messaging backend boundary: where a conversation body is stored once
//! the bus has accepted it.
//!
//! On the synchronous path (the default) the body, its recipients and their
//! receipts commit in one PostgreSQL transaction and nothing here runs. On the
//! outbox path acceptance and storage are two events, and the second can fail,
//! time out, or succeed without the caller learning that it did. This module
//! is the shape every store behind that second event has: four operations
//! (publish, fetch, retain, reconcile), each allowed to fail, none of them ever
//! run inside a database transaction.
//!
//! What the boundary promises its callers:
//!
//! * `publish` is idempotent on the envelope's `publish_key`: presented the
//!   same key twice, a backend answers with the same locator rather than
//!   storing the body twice;
//! * `fetch` checks that a locator names the message the caller believes it
//!   does: a locator is opaque and proves nothing about who may read it;
//! * `reconcile` re-presents the same envelope under the same key and reads
//!   what comes back; it never probes with a throwaway message.
//!
//! Backends are dispatched through [`AnyBackend`], an enum rather than a trait
//! object, so every call is a plain `async fn` with no boxing.

pub mod jetstream;
pub mod postgres;
pub mod routing;

use std::future::Future;

use uuid::Uuid;

use crate::error::BusResult;

pub use jetstream::JetStreamBackend;
pub use postgres::{Faults, PostgresBackend};
pub use routing::Backends;

/// Where a confirmed body lives. Opaque to everything but the backend that
/// issued it: PostgreSQL uses the message id, JetStream
/// `jetstream:<stream>:<sequence>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locator(pub String);

/// What a backend reports after trying to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    /// The backend confirmed it, and this is where it is.
    Confirmed(Locator),
    /// The attempt failed and may succeed later: a refused connection, a
    /// broker without a leader. The slot stays and is retried after a
    /// backoff.
    Retryable(String),
    /// Retryable, and not the message's fault but a condition an operator
    /// fixes (the team's stream missing or full, the broker out of storage):
    /// the slot waits without spending an attempt, so nothing fails behind
    /// the operator's back. Decided by this attempt's own answer, not by
    /// what other attempts reported since.
    Blocked(String),
    /// It will never succeed: a payload the backend can never take, a
    /// permission denied. The slot is marked failed and stays visible. (A
    /// full stream is `Blocked`, not this: an operator raising its quota
    /// cures it, and the slot waits for that without spending attempts.)
    Fatal(String),
    /// The attempt ended without an answer (a timeout, a connection lost
    /// after the request left): whether the backend stored the body is not
    /// known. Never retried blindly: the slot's next attempt asks the backend
    /// by the publish key first (`reconcile`), and so does the reconciler
    /// meanwhile. It counts as an attempt, with the retryable backoff and
    /// cap: a backend that never answers ends the slot `failed`, saying so,
    /// rather than uncertain for ever.
    Unanswered(String),
}

/// One publication attempt's input.
#[derive(Clone, Debug)]
pub struct Envelope {
    pub message_id: Uuid,
    pub conversation_id: Uuid,
    pub team_id: Uuid,
    pub body: String,
    /// Presented to the backend on every attempt, so an uncertain completion
    /// can be recognised instead of duplicated.
    pub publish_key: Uuid,
}

/// The boundary. Network work happens here, outside any database
/// transaction: the outbox leases in one short transaction, publishes with
/// nothing held, and settles in another.
pub trait MessagingBackend: Send + Sync {
    /// The kind recorded on the conversation, the message and the outbox slot.
    fn kind(&self) -> BackendKind;

    /// Persist a body, idempotently on `publish_key`.
    fn publish(&self, envelope: &Envelope) -> impl Future<Output = Published> + Send;

    /// Read a body back by locator. `message_id` is the message the caller
    /// believes the locator names, and the backend must check it: a locator
    /// copied or guessed from another conversation or team reads nothing.
    /// `Ok(None)`: the backend no longer holds that body, and is sure of it:
    /// the caller tombstones on it, so a backend whose "not found" may be
    /// stale (a lagging replica, a stream being restored) answers
    /// `Unavailable` until it has confirmed the absence.
    fn fetch(
        &self,
        locator: &Locator,
        message_id: Uuid,
    ) -> impl Future<Output = BusResult<Option<String>>> + Send;

    /// [`Self::fetch`] with one look and no confirmation: `Ok(None)` means
    /// the backend answered "not held" this time, which may be stale. For
    /// callers that never tombstone on it (the body sweep keeps its local
    /// copy and moves on to the next body).
    fn fetch_once(
        &self,
        locator: &Locator,
        message_id: Uuid,
    ) -> impl Future<Output = BusResult<Option<String>>> + Send {
        self.fetch(locator, message_id)
    }

    /// Drop the bodies of messages PostgreSQL has already released under a
    /// retention (`team prune`: tombstoned, body cleared): the history
    /// decides, by locator, never the backend by age. How many went; a body
    /// already gone counts nothing. Called with nothing held (B7).
    fn retain(&self, released: &[Locator]) -> impl Future<Output = BusResult<u64>> + Send;

    /// Settle an attempt that ended without an answer by presenting the same
    /// envelope again under the same key and reading what comes back. `None`:
    /// the backend holds nothing for this key and nothing was written, so the
    /// ordinary retry path is safe. Never a probe with a throwaway message: a
    /// probe that can answer at all was stored, under the key the body needed.
    fn reconcile(
        &self,
        envelope: &Envelope,
    ) -> impl Future<Output = BusResult<Option<Locator>>> + Send;
}

/// One of the backends this build knows, dispatched without boxing.
#[derive(Clone)]
pub enum AnyBackend {
    Postgres(PostgresBackend),
    JetStream(JetStreamBackend),
}

impl MessagingBackend for AnyBackend {
    fn kind(&self) -> BackendKind {
        match self {
            AnyBackend::Postgres(b) => b.kind(),
            AnyBackend::JetStream(b) => b.kind(),
        }
    }

    async fn publish(&self, envelope: &Envelope) -> Published {
        match self {
            AnyBackend::Postgres(b) => b.publish(envelope).await,
            AnyBackend::JetStream(b) => b.publish(envelope).await,
        }
    }

    async fn fetch(&self, locator: &Locator, message_id: Uuid) -> BusResult<Option<String>> {
        match self {
            AnyBackend::Postgres(b) => b.fetch(locator, message_id).await,
            AnyBackend::JetStream(b) => b.fetch(locator, message_id).await,
        }
    }

    async fn fetch_once(&self, locator: &Locator, message_id: Uuid) -> BusResult<Option<String>> {
        match self {
            AnyBackend::Postgres(b) => b.fetch_once(locator, message_id).await,
            AnyBackend::JetStream(b) => b.fetch_once(locator, message_id).await,
        }
    }

    async fn retain(&self, released: &[Locator]) -> BusResult<u64> {
        match self {
            AnyBackend::Postgres(b) => b.retain(released).await,
            AnyBackend::JetStream(b) => b.retain(released).await,
        }
    }

    async fn reconcile(&self, envelope: &Envelope) -> BusResult<Option<Locator>> {
        match self {
            AnyBackend::Postgres(b) => b.reconcile(envelope).await,
            AnyBackend::JetStream(b) => b.reconcile(envelope).await,
        }
    }
}

acs_wire::text_enum! {
    /// Which backend holds a body: stored as text on a team
    /// (`teams.conversation_backend`, where new conversations go), a conversation,
    /// a message and an outbox slot (the `backend_name` domain), in its
    /// `snake_case` spelling.
    pub enum BackendKind {
        /// The body stays in `conversation_messages`.
        Postgres = "postgres",
        /// The body lives in the team's JetStream stream.
        Jetstream = "jetstream",
    }
}
crate::text_column!(BackendKind);

/// The one parse of a backend's name (trimmed, any case), from an operator
/// or a tool, with an error naming both; a move's direction is made from it.
impl std::str::FromStr for BackendKind {
    type Err = crate::error::BusError;

    fn from_str(raw: &str) -> BusResult<BackendKind> {
        let name = raw.trim().to_ascii_lowercase();
        match BackendKind::from_text(&name) {
            Some(backend) => Ok(backend),
            None => Err(crate::error::BusError::invalid(format!(
                "unknown backend {}: use `jetstream` or `postgres`.",
                acs_wire::text::quote(raw.trim())
            ))),
        }
    }
}
