//! The storage layer of ai-crew-sync: everything that reads or writes the
//! database or a message backend, and nothing that speaks HTTP or MCP.
//!
//! - [`store`]: all domain logic and all SQL.
//! - [`db`]: the pool, migrations, the embedded local PostgreSQL.
//! - [`backend`]: where a conversation body is stored (PostgreSQL, JetStream).
//! - [`events`]: the LISTEN/NOTIFY hub that wakes waiting calls on every replica.
//! - [`auth`]: credentials and the caller's identity.
//! - [`error`]: the one error type, worded for a language model.

pub mod auth;
pub mod backend;
pub mod db;
pub mod error;
pub mod events;
pub mod store;
pub mod text_column;

pub use error::{BusError, BusResult};

/// Live session credentials an agent may hold by default (`serve
/// --max-sessions-per-agent`; 0 = no cap).
pub const DEFAULT_MAX_SESSIONS_PER_AGENT: u32 = 64;

/// What every tool and worker works with: the database, the event hub and
/// the message backends. Cheap to clone.
#[derive(Clone)]
pub struct Bus {
    pub pool: sqlx::PgPool,
    pub events: events::Events,
    pub backends: backend::Backends,
    /// Cancelled when the process begins to stop: a blocked long poll then
    /// answers at once (`server_restarting`) instead of holding the shutdown.
    pub stopping: tokio_util::sync::CancellationToken,
    /// Live session credentials an agent may hold (`serve
    /// --max-sessions-per-agent`; 0 = no cap).
    pub max_sessions_per_agent: u32,
}

impl Bus {
    /// Connect the event hub to `pool`; its tasks stop, and long polls
    /// answer, when `shutdown` is cancelled.
    pub fn start(
        pool: sqlx::PgPool,
        event_ping: std::time::Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Bus {
        Bus::start_until(pool, event_ping, shutdown.clone(), shutdown).0
    }

    /// As [`Bus::start`], for a server that stops in two steps: long polls
    /// answer when `stopping` is cancelled, while the event hub keeps
    /// publishing what the last requests write until `events_stop` (then it
    /// sends what is queued and stops). The hub's task handles, to wait for.
    pub fn start_until(
        pool: sqlx::PgPool,
        event_ping: std::time::Duration,
        stopping: tokio_util::sync::CancellationToken,
        events_stop: tokio_util::sync::CancellationToken,
    ) -> (Bus, Vec<tokio::task::JoinHandle<()>>) {
        let (events, tasks) = events::Events::start(pool.clone(), event_ping, events_stop);
        let backends = backend::Backends::postgres_only(pool.clone());
        let bus = Bus {
            pool,
            events,
            backends,
            stopping,
            max_sessions_per_agent: DEFAULT_MAX_SESSIONS_PER_AGENT,
        };
        (bus, tasks)
    }

    /// The same bus routing to `backends` (a broker, when `serve` has one).
    pub fn with_backends(mut self, backends: backend::Backends) -> Bus {
        self.backends = backends;
        self
    }
}
