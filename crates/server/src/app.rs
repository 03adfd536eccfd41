//! The whole server, built once from settings: the bus (event hub and
//! backends, with the broker connected or retried in the background), the
//! background workers and the router; then served on a listener until
//! shutdown. `serve` and the integration tests both build it here, so the
//! tests run what production runs.
//!
//! What this module deliberately does not do: open or migrate the database,
//! parse flags, or talk to the operator. `serve` does those, and prints what
//! [`App::broker`] says about the broker.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::Router;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::config::HttpSettings;
use crate::workers::departures::{self, DepartureSettings};
use crate::workers::presence_sweeper::{self, SweeperSettings};
use crate::workers::publication;
use crate::workers::webhook_dispatcher::{self, DispatchSettings};
use acs_store::Bus;
use acs_store::backend::Backends;
use acs_store::backend::jetstream::Broker;
use acs_store::backend::routing::BrokerStart;
use acs_store::error::BusResult;

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
    /// The departures pass (claimed tasks of windows that left and did not
    /// come back within the grace), which always runs.
    pub departures: DepartureSettings,
    /// A listener of its own for `GET /metrics` (`serve --metrics-bind`),
    /// bound by the caller so a taken address fails before anything starts.
    /// `None`: no such listener (`/metrics` is then on the main listener
    /// only, to a global admin credential).
    pub metrics_listener: Option<TcpListener>,
    /// The webhook dispatcher, which always runs: deliveries are written by
    /// triggers whatever the workers, and every replica helps send them.
    pub webhooks: DispatchSettings,
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
            departures: DepartureSettings::default(),
            metrics_listener: None,
            webhooks: DispatchSettings::default(),
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
    /// Cancelled once the listener has answered its last request (or the
    /// grace ran out): the event publisher then sends what those requests
    /// queued and stops. Also cancelled if the app is dropped unserved.
    events_stop: DropGuard,
    /// Every task this app started (event hub, workers, metrics listener):
    /// `serve` waits for them before it returns.
    tasks: Vec<JoinHandle<()>>,
    metrics_addr: Option<SocketAddr>,
}

impl App {
    /// Start the event hub on `pool`, connect the broker, start the workers
    /// and build the router. Everything stops when `shutdown` is cancelled:
    /// the workers after the pass they are in, the event hub once
    /// [`App::serve`] has answered its last request. Fails only when the
    /// broker answers and cannot be used.
    pub async fn build(
        pool: PgPool,
        settings: AppSettings,
        shutdown: CancellationToken,
    ) -> BusResult<App> {
        let events_stop = CancellationToken::new();
        let (mut bus, mut tasks) = Bus::start_until(
            pool.clone(),
            settings.event_ping,
            shutdown.clone(),
            events_stop.clone(),
        );
        bus.max_sessions_per_agent = settings.http.max_sessions_per_agent;
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
        tasks.push(presence_sweeper::spawn(
            bus.clone(),
            settings.sweeper,
            shutdown.clone(),
        ));
        tasks.push(departures::spawn(
            bus.clone(),
            settings.departures,
            shutdown.clone(),
        ));
        tasks.push(webhook_dispatcher::spawn(
            bus.pool.clone(),
            settings.webhooks,
            shutdown.clone(),
        )?);
        tasks.push(crate::workers::ack_overdue::spawn(
            bus.pool.clone(),
            shutdown.clone(),
        ));
        tasks.push(crate::workers::storage_recount::spawn(
            bus.clone(),
            shutdown.clone(),
        ));
        tasks.push(crate::workers::request_ids::spawn(
            bus.clone(),
            shutdown.clone(),
        ));
        if settings.publication_workers {
            tasks.extend(publication::spawn_all(bus.clone(), shutdown.clone()));
        }
        let router = crate::http::router(bus.clone(), settings.http.clone());
        acs_metrics::install();
        let metrics_addr = match settings.metrics_listener {
            None => None,
            Some(listener) => {
                let (addr, task) = serve_metrics(listener, &bus, &settings.http, shutdown.clone())?;
                tasks.push(task);
                Some(addr)
            }
        };
        Ok(App {
            bus,
            broker,
            router,
            http: settings.http,
            shutdown,
            events_stop: events_stop.drop_guard(),
            tasks,
            metrics_addr,
        })
    }

    /// Where the separate metrics listener answers, if there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Serve on `listener` until shutdown: then stop accepting, answer
    /// blocked long polls at once, and let other requests finish within the
    /// grace. Then the event publisher sends what those requests wrote (a
    /// wait on another replica wakes for it), and this returns once every
    /// task of the app has stopped: a worker's pass in flight finishes (its
    /// outcome recorded) before the process exits. The workers were told to
    /// stop when shutdown began; they are waited for until the grace ends,
    /// and at least [`TASKS_AFTER_SERVING`] after the last request, so the
    /// whole stop takes at most the grace plus that.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        let began = tokio::spawn({
            let shutdown = self.shutdown.clone();
            async move {
                shutdown.cancelled().await;
                tokio::time::Instant::now()
            }
        });
        let served =
            crate::http::serve(listener, self.router, &self.http, self.shutdown.clone()).await;
        // Serving may also have ended with an error: stop the workers then too.
        self.shutdown.cancel();
        drop(self.events_stop);
        let began = began.await.unwrap_or_else(|_| tokio::time::Instant::now());
        let deadline = (began + self.http.shutdown_grace)
            .max(tokio::time::Instant::now() + TASKS_AFTER_SERVING);
        let tasks = futures::future::join_all(self.tasks);
        if tokio::time::timeout_at(deadline, tasks).await.is_err() {
            tracing::warn!(
                "some background tasks had not stopped by the end of the shutdown grace; \
                 exiting without them"
            );
        }
        served
    }
}

/// How long, at least, `serve` waits for its tasks after its last request:
/// time for the event publisher to send what that request wrote, even when
/// the requests took the whole grace.
pub const TASKS_AFTER_SERVING: Duration = Duration::from_secs(5);

/// Connections the metrics listener keeps open at once: a scraper or two.
const METRICS_CONNECTIONS: usize = 16;

/// Serve `GET /metrics` on `listener` until shutdown, in the background,
/// with the main listener's timeouts and a small connection cap.
fn serve_metrics(
    listener: TcpListener,
    bus: &Bus,
    http: &HttpSettings,
    shutdown: CancellationToken,
) -> BusResult<(SocketAddr, JoinHandle<()>)> {
    let addr = listener.local_addr().map_err(|e| {
        acs_store::error::BusError::unavailable(format!("the metrics listener has no address: {e}"))
    })?;
    let router = crate::http::metrics::listener_router(bus, http.allowed_hosts.clone());
    let settings = HttpSettings {
        max_connections: METRICS_CONNECTIONS,
        max_connections_per_address: METRICS_CONNECTIONS,
        ..http.clone()
    };
    let task = tokio::spawn(async move {
        if let Err(err) = crate::http::serve(listener, router, &settings, shutdown).await {
            tracing::warn!(error = %err, "the metrics listener stopped");
        }
    });
    Ok((addr, task))
}
