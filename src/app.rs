//! The whole server, built once from settings: the bus (event hub and
//! backends, with the broker connected or retried in the background), the
//! background workers and the router; then served on a listener until
//! shutdown. `serve` and the integration tests both build it here, so the
//! tests run what production runs.
//!
//! What this module deliberately does not do: open or migrate the database,
//! parse flags, or talk to the operator. `serve` does those, and prints what
//! [`App::broker`] says about the broker.

use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Bus;
use crate::backend::Backends;
use crate::backend::jetstream::Broker;
use crate::backend::routing::BrokerStart;
use crate::config::HttpSettings;
use crate::error::BusResult;
use crate::workers::presence_sweeper::{self, SweeperSettings};
use crate::workers::publication;

/// Time between event-listener pings unless told otherwise (`serve
/// --event-ping-secs`).
pub const DEFAULT_EVENT_PING: Duration = Duration::from_secs(30);

/// Where jetstream bodies go.
pub enum BrokerSettings {
    /// No broker: nothing can be routed to jetstream (`serve` without
    /// `--nats-url`).
    Off,
    /// Connect at build; a broker that does not answer yet is retried in the
    /// background (see [`Backends::connect_broker`]).
    Connect {
        url: String,
        credentials: Option<PathBuf>,
    },
    /// A broker the caller has connected (with options of its own).
    Ready(Broker),
}

/// Everything [`App::build`] needs besides the database.
pub struct AppSettings {
    pub http: HttpSettings,
    /// Time between event-listener pings (how fast /health notices a silent
    /// listener).
    pub event_ping: Duration,
    pub broker: BrokerSettings,
    /// Run the publication workers (outbox drain, reconciler, inbox
    /// publisher, body sweep). Off: whoever builds the app drives them.
    pub publication_workers: bool,
    /// The presence sweeper, which always runs.
    pub sweeper: SweeperSettings,
}

impl Default for AppSettings {
    /// What `serve` runs with when given no flags.
    fn default() -> Self {
        AppSettings {
            http: HttpSettings::default(),
            event_ping: DEFAULT_EVENT_PING,
            broker: BrokerSettings::Off,
            publication_workers: true,
            sweeper: SweeperSettings::default(),
        }
    }
}

/// A built server: its workers run; it answers once [`App::serve`]d.
pub struct App {
    /// What the tools and workers of this server work with.
    pub bus: Bus,
    /// How connecting the broker went (`None`: no broker to connect).
    pub broker: Option<BrokerStart>,
    router: Router,
    http: HttpSettings,
    shutdown: CancellationToken,
}

impl App {
    /// Start the event hub on `pool`, connect the broker, start the workers
    /// and build the router. Everything stops when `shutdown` is cancelled.
    /// Fails only when the broker answers and cannot be used.
    pub async fn build(
        pool: PgPool,
        settings: AppSettings,
        shutdown: CancellationToken,
    ) -> BusResult<App> {
        let bus = Bus::start(pool.clone(), settings.event_ping, shutdown.clone());
        let (bus, broker) = match settings.broker {
            BrokerSettings::Off => (bus, None),
            BrokerSettings::Connect { url, credentials } => {
                let (backends, start) =
                    Backends::connect_broker(pool, &url, credentials, shutdown.clone()).await?;
                (bus.with_backends(backends), Some(start))
            }
            BrokerSettings::Ready(broker) => {
                (bus.with_backends(Backends::with_broker(pool, broker)), None)
            }
        };
        presence_sweeper::spawn(bus.clone(), settings.sweeper, shutdown.clone());
        crate::workers::storage_recount::spawn(bus.clone(), shutdown.clone());
        if settings.publication_workers {
            publication::spawn_all(bus.clone(), shutdown.clone());
        }
        let router = crate::http::router(bus.clone(), settings.http.clone());
        Ok(App {
            bus,
            broker,
            router,
            http: settings.http,
            shutdown,
        })
    }

    /// Serve on `listener` until shutdown: then stop accepting, answer
    /// blocked long polls at once, and let other requests finish within the
    /// grace.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        crate::http::serve(listener, self.router, &self.http, self.shutdown).await
    }
}
