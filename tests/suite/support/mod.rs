//! What every integration test stands on: the server `serve` builds
//! ([`App::build`]) on a free loopback port against a fresh database
//! ([`TestApp::builder`], [`spawn_app`]), a real MCP client over HTTP ([`McpClient`]), and
//! throwaway PostgreSQL / NATS servers when the environment names none.

pub mod browser;
pub mod eventually;
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
use ai_crew_sync::events::ListenerState;
use ai_crew_sync::store::identity::admin::{Authority, GlobalScope, TeamScope};
use ai_crew_sync::store::{Actor, Source, identity::agents, identity::teams};
use ai_crew_sync::workers::departures::DepartureSettings;
use ai_crew_sync::workers::publication::{self, DrainSettings};
use ai_crew_sync::workers::webhook_dispatcher::DispatchSettings;
use serde_json::Value;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use eventually::{eventually, eventually_blocking};

/// One server under test.
pub struct TestApp {
    pub addr: SocketAddr,
    /// The separate metrics listener (`serve --metrics-bind`), when the test
    /// asked for one ([`AppBuilder::metrics_listener`]).
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

/// The real router with default settings on a fresh database: the common
/// case of [`TestApp::builder`].
pub async fn spawn_app() -> TestApp {
    TestApp::builder().spawn().await
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

/// How a test server is made: on which database, with which HTTP settings,
/// broker and listeners. Each `spawn` builds the server as `serve` does
/// ([`App::build`]) and serves it on a free loopback port.
#[must_use = "a builder does nothing until spawn"]
pub struct AppBuilder {
    http: HttpSettings,
    database: Database,
    broker: Option<BrokerChoice>,
    metrics_listener: bool,
    departures: Option<DepartureSettings>,
}

/// Which database a test server runs on.
enum Database {
    /// A new database at the latest schema.
    Fresh,
    /// A pool and URL as the caller left them (no migration).
    Given(PgPool, String),
    /// A new pool on this URL: another replica of the same database.
    Replica(String),
}

enum BrokerChoice {
    At(String),
    Ready(Broker),
}

impl TestApp {
    /// Default HTTP settings, a fresh migrated database, no broker, no
    /// metrics listener; see [`AppBuilder`]'s methods for the rest.
    pub fn builder() -> AppBuilder {
        AppBuilder {
            http: HttpSettings::default(),
            database: Database::Fresh,
            broker: None,
            metrics_listener: false,
            departures: None,
        }
    }

    /// A builder for another replica of this server: its own router, pool,
    /// event listener and (once started) workers, on the same database.
    pub fn replica(&self) -> AppBuilder {
        let mut builder = TestApp::builder();
        builder.database = Database::Replica(self.database_url.clone());
        builder
    }
}

impl AppBuilder {
    /// These HTTP settings instead of the defaults.
    pub fn http(mut self, settings: HttpSettings) -> Self {
        self.http = settings;
        self
    }

    /// No rate limiting (for tests that send thousands of messages).
    pub fn unlimited(mut self) -> Self {
        self.http.rate_limit_per_minute = 0;
        self
    }

    /// Serve on `pool` as the caller left it (no migration: for tests of a
    /// schema other than the latest, or of a second server on a database).
    pub fn database(mut self, pool: PgPool, database_url: String) -> Self {
        self.database = Database::Given(pool, database_url);
        self
    }

    /// Route JetStream bodies to a broker connected to `nats_url` as `serve
    /// --nats-url` connects it ([`connect_broker`]). No publication worker
    /// runs until [`TestApp::start_publication_workers`].
    pub fn broker_at(mut self, nats_url: &str) -> Self {
        self.broker = Some(BrokerChoice::At(nats_url.to_owned()));
        self
    }

    /// Route JetStream bodies to `broker`.
    pub fn broker(mut self, broker: Broker) -> Self {
        self.broker = Some(BrokerChoice::Ready(broker));
        self
    }

    /// Also start the separate metrics listener `serve --metrics-bind`
    /// starts, on a free loopback port ([`TestApp::metrics_addr`]).
    pub fn metrics_listener(mut self) -> Self {
        self.metrics_listener = true;
        self
    }

    /// Run the departures pass with these settings (a test-sized grace)
    /// instead of `serve`'s ten minutes.
    pub fn departures(mut self, settings: DepartureSettings) -> Self {
        self.departures = Some(settings);
        self
    }

    pub async fn spawn(self) -> TestApp {
        install_crypto_provider();
        let (pool, database_url) = match self.database {
            Database::Fresh => postgres::fresh_pool().await,
            Database::Given(pool, url) => (pool, url),
            Database::Replica(url) => {
                let pool = ai_crew_sync::db::connect(&url, 8)
                    .await
                    .expect("connect a replica");
                (pool, url)
            }
        };
        let broker = match self.broker {
            None => None,
            Some(BrokerChoice::At(url)) => Some(connect_broker(&url).await),
            Some(BrokerChoice::Ready(broker)) => Some(broker),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let mut app_settings = test_settings(self.http, broker);
        if let Some(departures) = self.departures {
            app_settings.departures = departures;
        }
        if self.metrics_listener {
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
        // A notification sent before this process LISTENs is gone (a hint,
        // by design: waiters re-check the database). A test that counts the
        // raw events its calls send would wait for one it can never hear, so
        // the app is handed over once its listener is attached.
        eventually("the app's event listener to attach", async || {
            bus.events.state() != ListenerState::Detached
        })
        .await;
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

    /// Until exactly `n` long polls (waits and asks) are registered with
    /// this server's event hub: blocked, so a change now is one they await.
    pub async fn until_waiting(&self, n: usize) {
        eventually(
            &format!("{n} long poll(s) registered on the server"),
            async || self.bus.events.waits_registered() == n,
        )
        .await
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

    /// Create a team with conversations on (stored in PostgreSQL).
    pub async fn conversations_team(&self, slug: &str) {
        self.team(slug).await;
        teams::capability(&self.pool, slug, Some(true), &test_actor())
            .await
            .expect("turn conversations on");
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
        self.conversations_team(slug).await;
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

    /// Call a `tool` that must be refused; the refusal's words, whether the
    /// tool refused (an `isError` result's message) or the HTTP layer did
    /// before it (the transport error, which carries the body's message).
    pub async fn refusal_text(&self, tool: &str, args: Value) -> String {
        let arguments = match args {
            Value::Object(map) => Some(map),
            _ => None,
        };
        match self.connection.call_result(tool, arguments).await {
            Ok(result) => {
                assert_eq!(result.is_error, Some(true), "{tool} was not refused");
                let value = result.structured_content.expect("structured JSON");
                value["message"].as_str().unwrap_or_default().to_string()
            }
            Err(err) => format!("{err:#}"),
        }
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
