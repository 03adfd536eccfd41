//! What every integration test stands on: the server `serve` builds
//! ([`App::build`]) on a free loopback port against a fresh database
//! ([`spawn_app`]), a real MCP client over HTTP ([`McpClient`]), and
//! throwaway PostgreSQL / NATS servers when the environment names none.

pub mod browser;
pub mod nats;
pub mod nats_cluster;
pub mod postgres;
pub mod proxy;

use std::net::SocketAddr;
use std::time::Duration;

use ai_crew_sync::app::{App, AppSettings, BrokerSettings};
use ai_crew_sync::backend::jetstream::{Broker, BrokerOptions};
use ai_crew_sync::client::Connection;
use ai_crew_sync::config::HttpSettings;
use ai_crew_sync::store::identity::admin::{Authority, GlobalScope, TeamScope};
use ai_crew_sync::store::{Actor, Source, identity::agents, identity::teams};
use ai_crew_sync::workers::publication::{self, DrainSettings};
use ai_crew_sync::workers::webhook_dispatcher::DispatchSettings;
use serde_json::Value;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// One server under test.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The separate metrics listener (`serve --metrics-bind`), when the test
    /// asked for one ([`spawn_app_with_metrics`]).
    pub metrics_addr: Option<SocketAddr>,
    pub pool: PgPool,
    pub bus: ai_crew_sync::Bus,
    pub database_url: String,
    shutdown: CancellationToken,
    /// `serve`'s task: it ends once shutdown has drained the connections.
    serving: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The real router with default settings on a fresh database.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(HttpSettings::default()).await
}

pub async fn spawn_app_with(settings: HttpSettings) -> TestApp {
    let (pool, database_url) = postgres::fresh_pool().await;
    spawn_on(pool, database_url, settings, None).await
}

/// The real router with default settings on `pool` as the caller left it
/// (no migration: for tests of a schema other than the latest).
pub async fn spawn_app_on(pool: PgPool, database_url: String) -> TestApp {
    spawn_on(pool, database_url, HttpSettings::default(), None).await
}

/// How long a request to a test broker may take before it counts as
/// unanswered: short, so a stopped or black-holed broker shows quickly.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(1);

/// How long after a first "not found" a test broker may confirm a body's
/// absence: long enough for a test to read twice before it, short enough to
/// wait out.
pub const BROKER_ABSENCE_CONFIRM_DELAY: Duration = Duration::from_secs(2);

/// A broker connection as `serve --nats-url` makes one, with
/// [`BROKER_TIMEOUT`] and [`BROKER_ABSENCE_CONFIRM_DELAY`].
pub async fn connect_broker(nats_url: &str) -> Broker {
    Broker::connect_with(
        nats_url,
        None,
        BrokerOptions {
            timeout: BROKER_TIMEOUT,
            absence_confirm_delay: BROKER_ABSENCE_CONFIRM_DELAY,
        },
    )
    .await
    .expect("connect to the test NATS server")
}

/// The real router on a fresh database with a JetStream broker at
/// `nats_url`, as `serve --nats-url` builds it ([`App::build`] with a ready
/// broker). No publication worker
/// runs until [`TestApp::start_publication_workers`].
pub async fn spawn_app_with_broker(nats_url: &str) -> TestApp {
    let (pool, database_url) = postgres::fresh_pool().await;
    let broker = connect_broker(nats_url).await;
    spawn_on(pool, database_url, HttpSettings::default(), Some(broker)).await
}

/// A server that routes to `broker` (as `serve --nats-url` does), without
/// rate limiting (for tests that send thousands of messages); no workers run
/// unless the test starts them.
pub async fn spawn_app_routing_to(broker: Broker) -> TestApp {
    let (pool, database_url) = postgres::fresh_pool().await;
    let settings = HttpSettings {
        rate_limit_per_minute: 0,
        ..HttpSettings::default()
    };
    spawn_on(pool, database_url, settings, Some(broker)).await
}

/// The test settings: `settings` for HTTP, a one-second event ping, the
/// given broker, no publication workers (tests drive them, see
/// [`TestApp::start_publication_workers`]), and the presence sweeper as
/// `serve` runs it: a pass at start (a replica's too) and then every ten
/// minutes (longer than any test), with seven-day retentions, older than any
/// row a test leaves to it (a test that backdates rows further sweeps them
/// itself: `presence_sweeper::sweep`, `release_inbox`).
fn test_settings(settings: HttpSettings, broker: Option<Broker>) -> AppSettings {
    AppSettings {
        http: settings,
        event_ping: Duration::from_secs(1),
        broker: broker.map_or(BrokerSettings::Off, BrokerSettings::Ready),
        publication_workers: false,
        webhooks: webhook_settings(),
        ..AppSettings::default()
    }
}

/// A server as [`spawn_app_with`] makes one, plus the separate metrics
/// listener `serve --metrics-bind` starts, on a free loopback port
/// ([`TestApp::metrics_addr`]); with a broker at `nats_url` if given.
pub async fn spawn_app_with_metrics(settings: HttpSettings, nats_url: Option<&str>) -> TestApp {
    let (pool, database_url) = postgres::fresh_pool().await;
    let broker = match nats_url {
        Some(url) => Some(connect_broker(url).await),
        None => None,
    };
    spawn_on_with(pool, database_url, settings, broker, true).await
}

/// The webhook dispatcher of the tests: a short poll and a short backoff
/// (200 ms doubling, capped at 1 s), so retries finish in seconds.
pub fn webhook_settings() -> DispatchSettings {
    DispatchSettings {
        poll: Duration::from_millis(100),
        request_timeout: Duration::from_secs(3),
        lease: Duration::from_secs(10),
        backoff_base: Duration::from_millis(200),
        backoff_cap: Duration::from_secs(1),
        ..DispatchSettings::default()
    }
}

/// Build the server as `serve` does ([`App::build`]) and serve it on a free
/// loopback port.
async fn spawn_on(
    pool: PgPool,
    database_url: String,
    settings: HttpSettings,
    broker: Option<Broker>,
) -> TestApp {
    spawn_on_with(pool, database_url, settings, broker, false).await
}

async fn spawn_on_with(
    pool: PgPool,
    database_url: String,
    settings: HttpSettings,
    broker: Option<Broker>,
    metrics_listener: bool,
) -> TestApp {
    install_crypto_provider();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let mut app_settings = test_settings(settings, broker);
    if metrics_listener {
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for metrics");
        app_settings.metrics_listener = Some(metrics);
    }
    let app = App::build(pool.clone(), app_settings, shutdown.clone())
        .await
        .expect("build the app");
    let metrics_addr = app.metrics_addr();
    let bus = app.bus.clone();
    let serving = tokio::spawn(app.serve(listener));
    TestApp {
        addr,
        metrics_addr,
        pool,
        bus,
        database_url,
        shutdown,
        serving: Some(serving),
    }
}

impl TestApp {
    /// Begin shutting down, as SIGTERM does for `serve`: stop accepting,
    /// answer blocked long polls, let calls in flight finish within the grace.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Wait until `serve` has returned (after [`TestApp::begin_shutdown`]):
    /// every connection closed, or the grace ran out.
    pub async fn served(&mut self) -> std::io::Result<()> {
        self.serving
            .take()
            .expect("served is awaited once")
            .await
            .expect("serve does not panic")
    }

    /// Another replica: its own router, pool and event listener on the same database.
    pub async fn replica(&self) -> TestApp {
        self.replica_with(HttpSettings::default()).await
    }

    /// [`TestApp::replica`] with `settings` (a dashboard secret shared with
    /// this one, say).
    pub async fn replica_with(&self, settings: HttpSettings) -> TestApp {
        let pool = ai_crew_sync::db::connect(&self.database_url, 8)
            .await
            .expect("connect a replica");
        spawn_on(pool, self.database_url.clone(), settings, None).await
    }

    /// Another replica with its own broker connection to `nats_url`: its own
    /// router, pool, event listener and (once started) workers, on the same
    /// database.
    pub async fn replica_with_broker(&self, nats_url: &str) -> TestApp {
        let pool = ai_crew_sync::db::connect(&self.database_url, 8)
            .await
            .expect("connect a replica");
        let broker = connect_broker(nats_url).await;
        spawn_on(
            pool,
            self.database_url.clone(),
            HttpSettings::default(),
            Some(broker),
        )
        .await
    }

    /// The broker this app routes jetstream bodies to.
    pub fn broker(&self) -> &Broker {
        self.bus
            .backends
            .broker()
            .expect("this app was spawned with a broker")
    }

    /// Start this replica's outbox drain (as `serve` does, with test-sized
    /// settings) and a reconciler that runs every [`RECONCILE_EVERY`]
    /// instead of every 30 s. They stop when the app drops or at
    /// [`Workers::stop`].
    pub fn start_publication_workers(&self) -> Workers {
        let shutdown = self.shutdown.child_token();
        let drain = publication::spawn_drain(self.bus.clone(), drain_settings(), shutdown.clone());
        let bus = self.bus.clone();
        let stop = shutdown.clone();
        let reconciler = tokio::spawn(async move {
            loop {
                if let Err(e) = publication::reconcile_once(&bus).await {
                    tracing::warn!(error = %e, "test reconciler pass failed");
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(RECONCILE_EVERY) => {}
                }
            }
        });
        Workers {
            shutdown,
            handles: vec![drain, reconciler],
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn mcp_url(&self) -> String {
        self.url("/mcp")
    }

    /// Create a team; panics on failure (setup, not the subject of a test).
    pub async fn team(&self, slug: &str) {
        teams::create(&self.pool, &globally(), slug, &format!("Team {slug}"))
            .await
            .expect("create team");
    }

    /// Create a team routed to JetStream (conversations on, streams
    /// provisioned on this app's broker, new conversations on jetstream,
    /// publication through the outbox); its id.
    pub async fn jetstream_team(&self, slug: &str) -> uuid::Uuid {
        self.jetstream_team_with(slug, &Default::default()).await
    }

    /// [`TestApp::jetstream_team`] with its streams provisioned at `sizes`
    /// (e.g. three replicas on a cluster).
    pub async fn jetstream_team_with(
        &self,
        slug: &str,
        sizes: &ai_crew_sync::backend::jetstream::StreamSizes,
    ) -> uuid::Uuid {
        use ai_crew_sync::backend::BackendKind;
        self.team(slug).await;
        teams::capability(&self.pool, slug, Some(true), &test_actor())
            .await
            .expect("turn conversations on");
        teams::provision_streams(&self.pool, slug, self.broker(), sizes, false, &test_actor())
            .await
            .expect("provision the team's streams");
        teams::set_conversation_backend(
            &self.pool,
            slug,
            BackendKind::Jetstream,
            Some(self.broker()),
            &test_actor(),
        )
        .await
        .expect("route the team to jetstream");
        sqlx::query_scalar("SELECT id FROM teams WHERE slug = $1")
            .bind(slug)
            .fetch_one(&self.pool)
            .await
            .expect("the team's id")
    }

    /// Add an agent to a team and return its first token.
    pub async fn agent(&self, team: &str, name: &str) -> String {
        agents::add(&self.pool, &in_team(team), name)
            .await
            .expect("add agent")
            .token
    }

    /// A connected MCP client for `token`, as window `session` (None = shared session).
    pub async fn mcp(&self, token: &str, session: Option<&str>) -> McpClient {
        McpClient::connect(&self.mcp_url(), token, session)
            .await
            .expect("MCP client connects")
    }

    /// A POST to /mcp carrying a `tools/call` body, for checks below the MCP client.
    pub fn raw_tool_call(&self, tool: &str) -> reqwest::RequestBuilder {
        http_client()
            .post(self.mcp_url())
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .body(
                serde_json::json!({
                    "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": { "name": tool, "arguments": {} }
                })
                .to_string(),
            )
    }
}

/// How often the test reconciler asks about uncertain publications.
pub const RECONCILE_EVERY: Duration = Duration::from_millis(200);

/// The drain settings of the tests: small batches, a publish timeout a
/// little over the broker's own, a short idle poll.
pub fn drain_settings() -> DrainSettings {
    DrainSettings {
        batch: 16,
        in_flight: 16,
        publish_timeout: BROKER_TIMEOUT * 2,
        idle_poll: Duration::from_millis(50),
        lanes: 2,
    }
}

/// Publication workers of one replica.
pub struct Workers {
    shutdown: CancellationToken,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

impl Workers {
    /// Stop them and wait until every one has returned.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        for handle in std::mem::take(&mut self.handles) {
            handle.await.expect("a publication worker stops cleanly");
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub fn test_actor() -> Actor {
    Actor {
        name: "test".into(),
        source: Source::Cli,
        admin_credential: None,
    }
}

/// The local operator's authority, as [`test_actor`].
pub fn test_authority() -> Authority {
    Authority::Local(test_actor())
}

/// The local operator's permission to act on team `slug`.
pub fn in_team(slug: &str) -> TeamScope {
    test_authority()
        .team(slug)
        .expect("the local operator reaches every team")
}

/// The local operator's permission for a global operation.
pub fn globally() -> GlobalScope {
    test_authority()
        .global("act globally")
        .expect("the local operator is global")
}

pub fn http_client() -> reqwest::Client {
    install_crypto_provider();
    reqwest::Client::new()
}

/// rustls's crypto provider (reqwest is built without one) and the test log.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Server-side errors (a failing query behind "try again") show in the test's output.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::new("error"))
        .try_init();
}

/// A free loopback TCP port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A real MCP client speaking to the server under test: the console
/// client's [`Connection`] (rmcp, Streamable HTTP), answering in the shapes
/// the tests assert on.
pub struct McpClient {
    connection: Connection,
}

impl McpClient {
    pub async fn connect(
        url: &str,
        token: &str,
        session: Option<&str>,
    ) -> anyhow::Result<McpClient> {
        install_crypto_provider();
        let connection = Connection::open(url, token, session).await?;
        Ok(McpClient { connection })
    }

    /// Connect with a bearer credential and extra headers (`x-crew-session`, `x-crew-epoch`).
    pub async fn connect_with(
        url: &str,
        token: &str,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<McpClient> {
        install_crypto_provider();
        let connection = Connection::open_with_headers(url, token, extra).await?;
        Ok(McpClient { connection })
    }

    pub fn server_info(&self) -> Option<rmcp::model::Implementation> {
        self.connection.server_info()
    }

    pub async fn list_tool_names(&self) -> Vec<String> {
        self.connection.tool_names().await.expect("tools/list")
    }

    /// Call `tool`; `Ok` with its structured result, `Err` with its refusal
    /// (the `{error, message}` body of an `isError` result).
    pub async fn call(&self, tool: &str, args: Value) -> Result<Value, Value> {
        let arguments = match args {
            Value::Object(map) => Some(map),
            _ => None,
        };
        let result = self
            .connection
            .call_result(tool, arguments)
            .await
            .expect("tools/call transport");
        let value = result
            .structured_content
            .expect("every tool answers structured JSON");
        if result.is_error == Some(true) {
            Err(value)
        } else {
            Ok(value)
        }
    }
}
