//! Routing: which backend holds a message's body.
//!
//! Every message records its authoritative backend, so routing is a lookup by
//! name, per message, never a guess from the team's current setting (a team
//! that moved to JetStream still has its older bodies in PostgreSQL). A name
//! this process cannot serve is an explicit error, never a silent fallback to
//! PostgreSQL: a body published to the wrong store is a body nobody reads.

use sqlx::PgPool;
use uuid::Uuid;

use super::jetstream::Broker;
use super::{AnyBackend, Faults, JetStreamBackend, PostgresBackend};
use crate::error::{BusError, BusResult};

/// The backends this process can reach. Cheap to clone.
#[derive(Clone)]
pub struct Backends {
    postgres: PostgresBackend,
    broker: Option<Broker>,
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
        Self {
            postgres: PostgresBackend::new(pool),
            broker: Some(broker),
        }
    }

    /// The same routing with a misbehaving postgres backend. Only the tests
    /// build one (see [`Faults`]); every handle shares one fault budget.
    pub fn with_postgres_faults(mut self, faults: Faults) -> Self {
        self.postgres = PostgresBackend::with_faults(self.postgres.pool().clone(), faults);
        self
    }

    pub fn broker(&self) -> Option<&Broker> {
        self.broker.as_ref()
    }

    /// `None`: no broker configured. `Some(reachable)` otherwise.
    pub async fn broker_reachable(&self) -> Option<bool> {
        match &self.broker {
            None => None,
            Some(broker) => Some(broker.reachable().await),
        }
    }

    /// The backend named `name`, as a handle that reads only `team_id`'s
    /// bodies.
    pub fn for_message(&self, name: &str, team_id: Uuid) -> BusResult<AnyBackend> {
        match name {
            PostgresBackend::NAME => Ok(AnyBackend::Postgres(
                self.postgres.clone().for_team(team_id),
            )),
            JetStreamBackend::NAME => match &self.broker {
                Some(broker) => Ok(AnyBackend::JetStream(JetStreamBackend::new(
                    broker.clone(),
                    team_id,
                ))),
                None => Err(no_broker()),
            },
            other => Err(BusError::invalid(format!(
                "unknown backend {other:?}: use `jetstream` or `postgres`."
            ))),
        }
    }

    /// Refuse to route new work to `name` when this process cannot serve it.
    pub fn require(&self, name: &str) -> BusResult<()> {
        self.for_message(name, Uuid::nil()).map(|_| ())
    }
}

/// The refusal for naming JetStream on a server started without a broker.
pub fn no_broker() -> BusError {
    BusError::unavailable(
        "this server has no NATS broker configured, so nothing can be routed to jetstream. \
         Start it with `serve --nats-url nats://HOST:4222`, or keep the team on postgres.",
    )
}
