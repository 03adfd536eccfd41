//! `ai-crew-sync serve`: open (or start) the database, migrate, build the
//! server ([`acs_server::app::App`]) and serve HTTP until SIGINT/SIGTERM, then
//! stop accepting, answer blocked long polls at once (`server_restarting`),
//! let other requests in flight finish within a bound, and stop the embedded
//! database if this process owns it.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use clap::builder::TypedValueParser;
use tokio_util::sync::CancellationToken;

use super::Context;
use super::args::NatsArgs;
use acs_server::app::{App, AppSettings, BrokerSettings};
use acs_server::config::{self, DashboardCookie, HttpSettings};
use acs_server::http;
use acs_server::workers::departures::DepartureSettings;
use acs_server::workers::presence_sweeper::SweeperSettings;
use acs_store::backend::routing::{BROKER_RETRY, BrokerStart};

/// Where `serve` listens unless told otherwise (`doctor` judges the same default).
pub(super) const DEFAULT_BIND: &str = "127.0.0.1:8787";

/// Where `serve` answers `GET /metrics` to anyone who can reach it, unless told otherwise.
pub(super) const DEFAULT_METRICS_BIND: &str = "127.0.0.1:9187";

/// Pool size of the server.
const SERVER_CONNECTIONS: u32 = 32;
/// Descriptors kept out of --max-connections: the pool, the event listener,
/// the broker, the listening socket, stdio, the runtime's own and the files
/// the process opens, with room to spare.
const RESERVED_DESCRIPTORS: u64 = SERVER_CONNECTIONS as u64 + 96;

#[derive(Args, Debug)]
#[command(mut_arg("nats_credentials", |a| a.requires("nats_url")))]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "BUS_BIND", default_value = DEFAULT_BIND)]
    bind: SocketAddr,
    /// Address of a second listener that serves only GET /metrics (Prometheus text) without a
    /// credential, to whoever can reach it; `off` for none. Default 127.0.0.1:9187; when that
    /// default is taken (a second server on this machine) serve logs it and goes on without
    /// the separate listener, while an address given here that is taken stops serve. On the
    /// main listener /metrics always needs a global admin credential (Authorization: Bearer acsa_…).
    #[arg(long, env = "BUS_METRICS_BIND", value_parser = parse_metrics_bind)]
    metrics_bind: Option<MetricsBind>,
    /// Host names clients may use in the Host header (comma-separated; `*` allows any).
    /// Default: localhost, 127.0.0.1, ::1.
    #[arg(long, env = "BUS_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Browser origins allowed to call /mcp (comma-separated, with scheme). Default: no Origin check.
    #[arg(long, env = "BUS_ALLOWED_ORIGINS", value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Largest request body accepted, in bytes.
    #[arg(long, env = "BUS_MAX_REQUEST_BYTES", default_value_t = config::DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Requests per token per minute in this process (0 = no limit).
    #[arg(long, env = "BUS_RATE_LIMIT_PER_MINUTE", default_value_t = config::DEFAULT_RATE_LIMIT_PER_MINUTE)]
    rate_limit_per_minute: u32,
    /// Requests on /mcp, /admin and /dashboard handled at once; more are refused with 503 + Retry-After.
    #[arg(long, env = "BUS_MAX_IN_FLIGHT", default_value_t = config::DEFAULT_MAX_IN_FLIGHT, value_parser = clap::value_parser!(u64).range(1..).map(|v| v as usize))]
    max_in_flight: usize,
    /// Request body bytes buffered at once across all requests (at least --max-request-bytes);
    /// a body that does not fit is refused with 503 + Retry-After. Default 256 MiB.
    #[arg(long, env = "BUS_MAX_BUFFERED_BYTES", default_value_t = config::DEFAULT_MAX_BUFFERED_BYTES)]
    max_buffered_bytes: usize,
    /// Ordinary calls in flight per credential (session credential, else agent token);
    /// more get 429 + Retry-After (0 = no cap). Long polls are counted apart.
    #[arg(long, env = "BUS_MAX_IN_FLIGHT_PER_CREDENTIAL", default_value_t = config::DEFAULT_MAX_IN_FLIGHT_PER_CREDENTIAL)]
    max_in_flight_per_credential: u32,
    /// Long polls (wait_for_updates, ask_agent, wait_for_conversation_updates) in flight
    /// per credential; more get 429 + Retry-After (0 = no cap).
    #[arg(long, env = "BUS_MAX_LONG_POLLS_PER_CREDENTIAL", default_value_t = config::DEFAULT_MAX_LONG_POLLS_PER_CREDENTIAL)]
    max_long_polls_per_credential: u32,
    /// Ordinary calls in flight per agent, summed over all its windows and tokens; more get
    /// 429 + Retry-After naming the limit (0 = no cap).
    #[arg(long, env = "BUS_MAX_IN_FLIGHT_PER_AGENT", default_value_t = config::DEFAULT_MAX_IN_FLIGHT_PER_AGENT)]
    max_in_flight_per_agent: u32,
    /// Long polls in flight per agent, summed over all its windows and tokens; more get 429 +
    /// Retry-After naming the limit (0 = no cap).
    #[arg(long, env = "BUS_MAX_LONG_POLLS_PER_AGENT", default_value_t = config::DEFAULT_MAX_LONG_POLLS_PER_AGENT)]
    max_long_polls_per_agent: u32,
    /// Ordinary calls in flight per team, summed over its agents, so one team cannot take the
    /// slots of the others; more get 429 + Retry-After (0 = no cap).
    #[arg(long, env = "BUS_MAX_IN_FLIGHT_PER_TEAM", default_value_t = config::DEFAULT_MAX_IN_FLIGHT_PER_TEAM)]
    max_in_flight_per_team: u32,
    /// Long polls in flight per team, summed over its agents; more get 429 + Retry-After
    /// (0 = no cap).
    #[arg(long, env = "BUS_MAX_LONG_POLLS_PER_TEAM", default_value_t = config::DEFAULT_MAX_LONG_POLLS_PER_TEAM)]
    max_long_polls_per_team: u32,
    /// Live session credentials (authenticated windows) per agent; register_session past it is
    /// refused, naming the limit (end old windows with revoke_session or let them expire)
    /// (0 = no cap).
    #[arg(long, env = "BUS_MAX_SESSIONS_PER_AGENT", default_value_t = config::DEFAULT_MAX_SESSIONS_PER_AGENT)]
    max_sessions_per_agent: u32,
    /// Failed authentications per client address per minute; past it the address's
    /// credentials are looked up only a few at a time and its failures get 429 (a credential
    /// that verifies is never refused) (0 = no limit).
    #[arg(long, env = "BUS_UNAUTHENTICATED_PER_MINUTE", default_value_t = config::DEFAULT_UNAUTHENTICATED_PER_MINUTE)]
    unauthenticated_per_minute: u32,
    /// Reverse proxies whose X-Forwarded-For names the client (comma-separated addresses or
    /// CIDR blocks, e.g. 10.0.0.0/8,::1). Default none: the peer's address is the client's
    /// and X-Forwarded-For is ignored, so a client cannot choose the address its failed
    /// authentications count against.
    #[arg(long, env = "BUS_TRUSTED_PROXIES", value_parser = config::TrustedProxies::parse)]
    trusted_proxies: Option<config::TrustedProxies>,
    /// Seconds a request body may take to arrive in full after its headers, on every route;
    /// a slower one gets 408, its connection is closed, and its reserved share of
    /// --max-buffered-bytes is given back.
    #[arg(long, env = "BUS_BODY_READ_TIMEOUT_SECS", default_value_t = config::DEFAULT_BODY_READ_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    body_read_timeout_secs: u64,
    /// Seconds a request's headers may take to arrive in full (from the connection's accept
    /// for its first request, from the first byte for a later one); past it the connection
    /// is closed.
    #[arg(long, env = "BUS_HEADER_READ_TIMEOUT_SECS", default_value_t = config::DEFAULT_HEADER_READ_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout_secs: u64,
    /// Seconds a kept-alive connection may wait for its next request before it is closed.
    /// A request in flight (a long poll waiting) is never idle.
    #[arg(long, env = "BUS_IDLE_TIMEOUT_SECS", default_value_t = config::DEFAULT_IDLE_TIMEOUT_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_secs: u64,
    /// Open connections at once. At the cap a new connection evicts the one that has waited
    /// longest with no request in flight; it is refused only when all are answering. Lowered
    /// at start to fit the process's open-file limit (its soft limit is raised to the hard one).
    #[arg(long, env = "BUS_MAX_CONNECTIONS", default_value_t = config::DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(u64).range(1..=1_000_000).map(|v| v as usize))]
    max_connections: usize,
    /// Open connections per client address (IPv6 per /64); more are refused at once. Behind a
    /// reverse proxy every client has the proxy's address: raise it to --max-connections there.
    #[arg(long, env = "BUS_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = config::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS, value_parser = clap::value_parser!(u64).range(1..=1_000_000).map(|v| v as usize))]
    max_connections_per_address: usize,
    /// Apply database migrations on start (under an advisory lock: replicas starting at once
    /// migrate once). With false, refuse to start unless the schema is exactly this binary's.
    /// Either way, refuse a database migrated by a newer ai-crew-sync.
    #[arg(long, env = "BUS_AUTO_MIGRATE", default_value_t = true, action = clap::ArgAction::Set)]
    auto_migrate: bool,
    /// Seconds between event-listener pings (how fast /health notices a silent listener).
    #[arg(long, env = "BUS_EVENT_PING_SECS", default_value_t = acs_server::app::DEFAULT_EVENT_PING.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    event_ping_secs: u64,
    #[command(flatten)]
    nats: NatsArgs,
    /// Run the publication workers (outbox drain, reconciler, body sweep) in this process.
    #[arg(long, env = "BUS_PUBLICATION_WORKER", default_value_t = true, action = clap::ArgAction::Set)]
    publication_worker: bool,
    /// Hours a window may stay dead (no heartbeat, live session credential, fetch or
    /// confirmation) before the inbox references owed to it are released; its receipts
    /// stay, and a window that returns gets them again from PostgreSQL. Default 7 days.
    #[arg(long, env = "BUS_INBOX_RETENTION_HOURS", default_value_t = acs_server::workers::presence_sweeper::INBOX_RETENTION.as_secs() / 3600, value_parser = clap::value_parser!(u64).range(1..=87_600))]
    inbox_retention_hours: u64,
    /// Seconds a window that ended its host conversation (the session_end hook, its proxy
    /// exiting) may take to come back (a heartbeat, or a write on the task) before its claimed
    /// tasks are released back to the queue, each with a note naming the window (its locks
    /// and path reservations are released when it leaves). Default 10 minutes.
    #[arg(long, env = "BUS_TASK_RELEASE_GRACE_SECS", default_value_t = acs_server::workers::departures::GRACE.as_secs(), value_parser = clap::value_parser!(u64).range(1..=604_800))]
    task_release_grace_secs: u64,
    /// Seconds to let in-flight requests finish after SIGINT/SIGTERM (blocked long polls answer
    /// at once, marked server_restarting).
    #[arg(long, env = "BUS_SHUTDOWN_GRACE_SECS", default_value_t = 10)]
    shutdown_grace_secs: u64,
    /// Key that signs /dashboard cookies (HMAC-SHA256; at least 32 characters). Unset: a random
    /// key per process, so dashboard sign-ins do not survive a restart and are not accepted by
    /// another replica; set the same value on every replica to share them. Give it as
    /// BUS_DASHBOARD_SECRET or --dashboard-secret-file PATH: as a flag it is refused.
    #[arg(long, env = "BUS_DASHBOARD_SECRET", hide_env_values = true)]
    dashboard_secret: Option<String>,
    /// The dashboard is reached over plain http:// on this non-loopback --bind (no TLS in front):
    /// its sign-in cookie is then not marked Secure, which browsers would drop over http.
    /// Without it the cookie is Secure unless --bind is a loopback address (the default
    /// 127.0.0.1:8787, where plain http is expected); behind a TLS proxy that sends
    /// X-Forwarded-Proto: https it is Secure either way.
    #[arg(long, env = "BUS_DASHBOARD_PLAIN_HTTP")]
    dashboard_plain_http: bool,
}

pub async fn run(ctx: &Context, args: ServeArgs) -> anyhow::Result<()> {
    if args.max_buffered_bytes < args.max_request_bytes {
        anyhow::bail!(
            "--max-buffered-bytes ({}) is smaller than --max-request-bytes ({}): a body at the \
             limit could never be accepted. Raise --max-buffered-bytes (default {}) or lower \
             --max-request-bytes.",
            args.max_buffered_bytes,
            args.max_request_bytes,
            config::DEFAULT_MAX_BUFFERED_BYTES
        );
    }
    // Checked here rather than by clap, whose refusal would print the value.
    let secret_chars = args.dashboard_secret.as_deref().map(|s| s.chars().count());
    if let Some(chars) = secret_chars.filter(|c| *c < http::dashboard::SECRET_MIN_CHARS) {
        anyhow::bail!(
            "--dashboard-secret (BUS_DASHBOARD_SECRET) is {chars} characters; it signs dashboard \
             cookies and must be at least {}. Generate one with `openssl rand -hex 32`, or leave \
             it unset for a random key per process.",
            http::dashboard::SECRET_MIN_CHARS
        );
    }
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {}: {e}. Pick another address with --bind.",
                args.bind
            )
        })?;
    let local = listener.local_addr()?;
    let metrics = bind_metrics(args.metrics_bind.as_ref()).await?;

    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());

    let db = ctx.open_database_to_serve(SERVER_CONNECTIONS).await?;
    eprintln!("database: {}", db.location);
    let here = Here {
        location: db.location.clone(),
        same_database: ctx.same_database_flags(),
        note: ctx.same_database_note(),
    };
    let result = serve_on(&db, (listener, local), metrics, &args, shutdown, here).await;
    db.close().await;
    eprintln!("stopped");
    result
}

async fn serve_on(
    db: &acs_store::db::Database,
    (listener, local): (tokio::net::TcpListener, SocketAddr),
    metrics: Option<tokio::net::TcpListener>,
    args: &ServeArgs,
    shutdown: CancellationToken,
    here: Here,
) -> anyhow::Result<()> {
    if args.auto_migrate {
        for m in db.migrate().await? {
            eprintln!("migrated: applied {m}");
        }
    } else {
        db.check_schema().await?;
    }
    let teams = acs_store::store::identity::teams::count(&db.pool).await?;
    if teams == 0 {
        let flags = &here.same_database;
        eprintln!(
            "no teams yet in this server's database ({}). Create a team, an agent and this \
             machine's profile for it{}:\n  \
             ai-crew-sync{flags} quickstart --team my-team --agent my-agent --profile my-agent",
            here.location,
            match here.note {
                Some(note) => format!(" ({note})"),
                None => String::new(),
            }
        );
    }
    let url = local_url(local);
    let host = host_name();
    if let Err(err) =
        acs_store::store::operations::listeners::record(&db.pool, &url, &host, std::process::id())
            .await
    {
        tracing::warn!(error = %err, "could not record where this server listens; `quickstart` and `doctor` will not find it");
    }
    let mut allowed_hosts = args.allowed_hosts.clone();
    allowed_hosts.retain(|h| !h.trim().is_empty());
    if allowed_hosts.is_empty() {
        allowed_hosts = config::default_allowed_hosts();
        if local.ip().is_unspecified() {
            tracing::warn!(
                "listening on all interfaces with only loopback Host names allowed; set --allowed-hosts to the names clients use"
            );
        }
    }
    let settings = HttpSettings {
        allowed_hosts,
        allowed_origins: args.allowed_origins.clone(),
        max_request_bytes: args.max_request_bytes,
        rate_limit_per_minute: args.rate_limit_per_minute,
        max_in_flight: args.max_in_flight,
        max_buffered_bytes: args.max_buffered_bytes,
        max_in_flight_per_credential: args.max_in_flight_per_credential,
        max_long_polls_per_credential: args.max_long_polls_per_credential,
        max_in_flight_per_agent: args.max_in_flight_per_agent,
        max_long_polls_per_agent: args.max_long_polls_per_agent,
        max_in_flight_per_team: args.max_in_flight_per_team,
        max_long_polls_per_team: args.max_long_polls_per_team,
        max_sessions_per_agent: args.max_sessions_per_agent,
        trusted_proxies: args.trusted_proxies.clone().unwrap_or_default(),
        unauthenticated_per_minute: args.unauthenticated_per_minute,
        body_read_timeout: Duration::from_secs(args.body_read_timeout_secs),
        header_read_timeout: Duration::from_secs(args.header_read_timeout_secs),
        idle_timeout: Duration::from_secs(args.idle_timeout_secs),
        max_connections: fit_connections(args.max_connections),
        max_connections_per_address: args.max_connections_per_address,
        shutdown_grace: Duration::from_secs(args.shutdown_grace_secs),
        dashboard_secret: args.dashboard_secret.clone(),
        dashboard_cookie: DashboardCookie::for_listener(local.ip(), args.dashboard_plain_http),
    };
    let broker = match &args.nats.nats_url {
        None => BrokerSettings::Off,
        Some(url) => BrokerSettings::Connect {
            url: url.clone(),
            credentials: args.nats.nats_credentials.clone(),
        },
    };
    let settings = AppSettings {
        http: settings,
        event_ping: Duration::from_secs(args.event_ping_secs),
        broker,
        publication_workers: args.publication_worker,
        sweeper: SweeperSettings {
            inbox_retention: Duration::from_secs(args.inbox_retention_hours * 3600),
            ..Default::default()
        },
        departures: DepartureSettings {
            grace: Duration::from_secs(args.task_release_grace_secs),
            ..Default::default()
        },
        metrics_listener: metrics,
        webhooks: Default::default(),
    };
    let app = App::build(db.pool.clone(), settings, shutdown).await?;
    match &app.broker {
        None => {}
        Some(BrokerStart::Connected { url }) => eprintln!("broker: {url} (JetStream)"),
        Some(BrokerStart::Retrying { why }) => eprintln!(
            "broker: not answering yet ({why}); retrying every {} s",
            BROKER_RETRY.as_secs()
        ),
    }
    eprintln!(
        "listening on http://{local} (MCP: POST http://{local}/mcp, health: GET http://{local}/health)"
    );
    if let Some(metrics) = app.metrics_addr() {
        eprintln!("metrics: GET http://{metrics}/metrics (no credential; --metrics-bind)");
    }
    app.serve(listener).await?;
    Ok(())
}

/// Where this server's data is, for its hints.
struct Here {
    /// [`acs_store::db::Database::location`].
    location: String,
    /// The flags a local command needs to use the same database (empty: none).
    same_database: String,
    /// And what else it needs (the same DATABASE_URL).
    note: Option<&'static str>,
}

/// The base URL a client on this machine uses for `local`: a wildcard bind
/// is reached over loopback.
fn local_url(local: SocketAddr) -> String {
    let ip = match local.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, local.port()))
}

/// This machine's host name (empty when it cannot be read).
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `wanted` connections, or fewer when the open-file limit (raised to its
/// hard limit first) leaves less room beside [`RESERVED_DESCRIPTORS`]: past
/// the limit every accept would fail, for everyone.
fn fit_connections(wanted: usize) -> usize {
    match http::connection_budget(RESERVED_DESCRIPTORS) {
        Ok(budget) if (wanted as u64) > budget => {
            let fitted = usize::try_from(budget).unwrap_or(usize::MAX).max(1);
            eprintln!(
                "--max-connections {wanted} does not fit the open-file limit (ulimit -n) beside \
                 the {RESERVED_DESCRIPTORS} descriptors kept for the database and the rest; \
                 serving at most {fitted} connections. Raise the hard limit (systemd: \
                 LimitNOFILE) to allow more."
            );
            fitted
        }
        Ok(_) => wanted,
        Err(err) => {
            tracing::warn!(error = %err, "could not read the open-file limit; --max-connections is taken as given");
            wanted
        }
    }
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("could not install signal handlers; stop the server with SIGKILL");
            return;
        };
        tokio::select! {
            _ = term.recv() => eprintln!("SIGTERM: stopping (answering waiting calls, finishing in-flight requests)"),
            _ = int.recv() => eprintln!("SIGINT: stopping (answering waiting calls, finishing in-flight requests)"),
        }
        shutdown.cancel();
    });
}

/// `--metrics-bind`: an address, or `off`.
#[derive(Clone, Debug)]
enum MetricsBind {
    Off,
    At(SocketAddr),
}

fn parse_metrics_bind(raw: &str) -> Result<MetricsBind, String> {
    if raw.trim().eq_ignore_ascii_case("off") {
        return Ok(MetricsBind::Off);
    }
    raw.trim().parse().map(MetricsBind::At).map_err(|_| {
        format!(
            "`{raw}` is not an address (host:port, e.g. {DEFAULT_METRICS_BIND} or 0.0.0.0:9187) \
             nor `off`"
        )
    })
}

/// The metrics listener, bound before anything starts: a taken address is
/// the most likely failure (a second server on this machine) and is named.
///
/// `None` is the default address, which nobody chose: a second server on the
/// same machine (another project's bus, a second replica) finds it taken, and
/// refusing to start for a listener nobody asked for would stop that server
/// for nothing. So a taken default is logged and the server goes on without
/// the separate listener (`/metrics` stays on the main listener for a global
/// admin). An address the operator gave is a promise to a scraper: taken, it
/// stops `serve` with the way out.
async fn bind_metrics(
    bind: Option<&MetricsBind>,
) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let addr = match bind {
        Some(MetricsBind::Off) => return Ok(None),
        Some(MetricsBind::At(addr)) => *addr,
        None => {
            let addr: SocketAddr = DEFAULT_METRICS_BIND.parse()?;
            return match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => Ok(Some(listener)),
                Err(e) => {
                    eprintln!(
                        "metrics: the default address {addr} is taken ({e}), likely by another \
                         ai-crew-sync server on this machine; serving without the separate \
                         metrics listener. /metrics stays on the main listener for a global \
                         admin credential. To scrape this server without one, give it its own \
                         address with --metrics-bind ADDR (env BUS_METRICS_BIND); \
                         --metrics-bind off silences this message."
                    );
                    Ok(None)
                }
            };
        }
    };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot listen for metrics on {addr}: {e}. Another process (often a second \
             ai-crew-sync server on this machine) holds it. Give this server its own address \
             with --metrics-bind ADDR (env BUS_METRICS_BIND; 127.0.0.1:0 picks a free port), or \
             --metrics-bind off to serve /metrics only on the main listener to a global admin \
             credential."
        )
    })?;
    Ok(Some(listener))
}
