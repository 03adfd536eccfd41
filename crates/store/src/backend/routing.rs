//! Routing: which backend holds a message's body.
//!
//! Every message records its authoritative backend, so routing is a lookup by
//! name, per message, never a guess from the team's current setting (a team
//! that moved to JetStream still has its older bodies in PostgreSQL). A name
//! this process cannot serve is an explicit error, never a silent fallback to
//! PostgreSQL: a body published to the wrong store is a body nobody reads.
//!
//! Connecting the broker at start lives here too ([`Backends::connect_broker`]):
//! a broker that does not answer yet is retried in the background while the
//! server serves, which is what the empty [`BrokerSlot`] is for.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::jetstream::Broker;
use super::{AnyBackend, BackendKind, Faults, JetStreamBackend, PostgresBackend};
use crate::error::{BusError, BusResult};

/// The backends this process can reach. Cheap to clone.
#[derive(Clone)]
pub struct Backends {
    postgres: PostgresBackend,
    /// `None`: no broker configured. `Some(slot)`: configured; the slot is
    /// empty until the broker first answers (a server started during a broker
    /// outage still serves, and its sends wait in the outbox).
    broker: Option<Arc<OnceLock<Broker>>>,
}

/// Where a broker that answers late is put, once it does.
#[derive(Clone)]
pub struct BrokerSlot(Arc<OnceLock<Broker>>);

impl BrokerSlot {
    /// The broker answered: route to it from now on.
    pub fn fill(&self, broker: Broker) {
        let _ = self.0.set(broker);
    }
}

/// How often a broker that did not answer at start is retried.
pub const BROKER_RETRY: Duration = Duration::from_secs(5);

/// How [`Backends::connect_broker`] found the broker, for the operator.
#[derive(Clone, Debug)]
pub enum BrokerStart {
    /// It answered at `url`: bodies routed to jetstream go there.
    Connected { url: String },
    /// It did not answer (`why`); it is retried every [`BROKER_RETRY`] in
    /// the background, and sends wait in the outbox meanwhile.
    Retrying { why: String },
}

impl Backends {
    /// PostgreSQL only: no broker configured (`serve` without `--nats-url`).
    pub fn postgres_only(pool: PgPool) -> Self {
        Self {
            postgres: PostgresBackend::new(pool),
            broker: None,
        }
    }

    /// PostgreSQL and a NATS JetStream broker.
    pub fn with_broker(pool: PgPool, broker: Broker) -> Self {
        let slot = Arc::new(OnceLock::new());
        let _ = slot.set(broker);
        Self {
            postgres: PostgresBackend::new(pool),
            broker: Some(slot),
        }
    }

    /// PostgreSQL and a broker that has not answered yet; fill the returned
    /// slot when it does. Until then jetstream is unavailable (not absent):
    /// bodies wait in the outbox and reads say the broker did not answer.
    pub fn with_broker_pending(pool: PgPool) -> (Self, BrokerSlot) {
        let slot = Arc::new(OnceLock::new());
        let backends = Self {
            postgres: PostgresBackend::new(pool),
            broker: Some(slot.clone()),
        };
        (backends, BrokerSlot(slot))
    }

    /// PostgreSQL and the broker at `url`. A broker that does not answer
    /// (down, restarting) is retried in the background every
    /// [`BROKER_RETRY`] while the server serves: sends are accepted and wait
    /// in the outbox, as during any broker outage. A broker that answers and
    /// is unusable (its `max_payload` too small, bad credentials) stops the
    /// start: that needs an operator, and retrying would hide it.
    pub async fn connect_broker(
        pool: PgPool,
        url: &str,
        credentials: Option<PathBuf>,
        shutdown: CancellationToken,
    ) -> BusResult<(Self, BrokerStart)> {
        let (backends, slot) = Self::with_broker_pending(pool);
        match Broker::connect(url, credentials.as_deref()).await {
            Ok(broker) => {
                let url = broker.url().to_owned();
                slot.fill(broker);
                Ok((backends, BrokerStart::Connected { url }))
            }
            Err(BusError::Unavailable(why)) => {
                let url = url.to_owned();
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(BROKER_RETRY) => {}
                        }
                        match Broker::connect(&url, credentials.as_deref()).await {
                            Ok(broker) => {
                                tracing::info!(broker = %broker.url(), "the broker answered; routing to it");
                                slot.fill(broker);
                                return;
                            }
                            Err(BusError::Unavailable(_)) => {}
                            Err(e) => {
                                tracing::error!(error = %e,
                                    "the broker answered but cannot be used; fix it and restart the server");
                                return;
                            }
                        }
                    }
                });
                Ok((backends, BrokerStart::Retrying { why }))
            }
            Err(e) => Err(e),
        }
    }

    /// The same routing with a misbehaving postgres backend. Only the tests
    /// build one (see [`Faults`]); every handle shares one fault budget.
    pub fn with_postgres_faults(mut self, faults: Faults) -> Self {
        self.postgres = PostgresBackend::with_faults(self.postgres.pool().clone(), faults);
        self
    }

    /// The connected broker, if any.
    pub fn broker(&self) -> Option<&Broker> {
        self.broker.as_ref().and_then(|slot| slot.get())
    }

    /// Whether a broker is configured (connected or not yet).
    pub fn broker_configured(&self) -> bool {
        self.broker.is_some()
    }

    /// `None`: no broker configured. `Some(reachable)` otherwise.
    pub async fn broker_reachable(&self) -> Option<bool> {
        self.broker.as_ref()?;
        match self.broker() {
            None => Some(false),
            Some(broker) => Some(broker.reachable().await),
        }
    }

    /// The backend of `kind`, as a handle that reads only `team_id`'s
    /// bodies.
    pub fn for_message(&self, kind: BackendKind, team_id: Uuid) -> BusResult<AnyBackend> {
        match kind {
            BackendKind::Postgres => Ok(AnyBackend::Postgres(
                self.postgres.clone().for_team(team_id),
            )),
            BackendKind::Jetstream => match (self.broker(), self.broker_configured()) {
                (Some(broker), _) => Ok(AnyBackend::JetStream(JetStreamBackend::new(
                    broker.clone(),
                    team_id,
                ))),
                (None, true) => Err(BusError::unavailable(
                    "the NATS broker has not answered since this server started (it keeps \
                     trying); bodies wait in the outbox meanwhile. Retry shortly.",
                )),
                (None, false) => Err(no_broker()),
            },
        }
    }

    /// Refuse to route new work to `kind` when this process cannot serve it.
    pub fn require(&self, kind: BackendKind) -> BusResult<()> {
        self.for_message(kind, Uuid::nil()).map(|_| ())
    }
}

/// The refusal for naming JetStream on a server started without a broker.
pub fn no_broker() -> BusError {
    BusError::unavailable(
        "this server has no NATS broker configured, so nothing can be routed to jetstream. \
         Start it with `serve --nats-url nats://HOST:4222`, or keep the team on postgres.",
    )
}
