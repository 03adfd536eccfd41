//! `ai-crew-sync mcp proxy`: a stdio MCP server for one host conversation
//! (a Claude Code session, a Codex run, a Cursor chat) that forwards every bus
//! tool to the bus as one agent in a window of its own.
//!
//! Why a local process and not the host speaking HTTP to the bus: the host's
//! config then holds no credential (the proxy reads a local profile), and
//! each conversation gets its own authenticated window without anyone
//! setting headers by hand.
//!
//! The run: resolve the bus and credential the way every client command does
//! (`client::context`), start serving stdio at once (a host waits for the
//! handshake), and in the background register the window, fetch the bus's
//! tools, heartbeat, then keep presence and the credential alive
//! ([`Proxy::maintain`]), and keep the window's conversation inbox in a
//! durable spool, confirming each reference only once it is on disk
//! (`inbox.rs`). When the host conversation ends (stdin EOF, SIGTERM,
//! SIGINT) the window says it leaves (`heartbeat {offline: true}`: it is
//! offline at once, not at the end of its ttl), within a bound so a dead bus
//! never holds the host up, and the process exits.
//!
//! Stdout carries only MCP framing: logs go to stderr, `git` runs with its
//! output captured.
//!
//! Files: `window.rs` (label, credential, heartbeats), `thread.rs` (moving
//! to another window: a profile switch, the first call's thread), `inbox.rs`
//! (the fetch, spool, confirm loop), `calls.rs` (calls to the bus and
//! recovery when it refuses the credential), `forward.rs` (the
//! `ServerHandler`), `local_tools.rs` (`session_status`, `configure_session`),
//! `instructions.rs` (the start-of-session text), `host_config.rs` (what
//! `proxy-config` prints).

mod calls;
mod forward;
pub mod host_config;
mod inbox;
mod instructions;
mod local_tools;
mod thread;
pub mod window;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use chrono::Utc;
use rmcp::model::{CallToolResult, Tool};
use rmcp::{Peer, RoleServer, ServiceExt};
use serde_json::{Map, Value, json};
use tokio::sync::{Mutex, RwLock, watch};

use crate::client::Connection;
use crate::client::context::{self, Requested};
use calls::brief;
use window::{HostSession, WindowCredential};

/// Presence lasts this long after each heartbeat; the proxy beats well before.
pub const PRESENCE_TTL_SECS: i64 = 300;
/// How long `initialize` and `tools/list` wait for the bus before answering
/// without it (a host gives up on a server that does not answer).
const BUS_WAIT: Duration = Duration::from_secs(4);
/// The bound on one attempt to register the window and fetch the tools.
const ESTABLISH_BOUND: Duration = Duration::from_secs(15);
/// The bound on marking the window offline at exit: the host kills a server
/// that has not exited a few seconds after closing its stdin.
const EXIT_BOUND: Duration = Duration::from_millis(1500);

/// What `mcp proxy` was asked for.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    pub bus: Requested,
    pub host_session: Option<String>,
    /// The window's role label (`--role`; else `.acs.toml`'s).
    pub role: Option<String>,
    /// Lifetime of the session credential; renewed at half-life.
    pub session_ttl_seconds: i64,
    /// Where `.acs.toml` and git are looked up.
    pub dir: PathBuf,
    /// How often the conversation inbox is fetched into the spool.
    pub inbox_poll: Duration,
}

/// The identity the proxy speaks as now (a profile switch replaces it).
struct Bound {
    url: String,
    profile: Option<String>,
    /// From whoami once connected, else from the profile.
    team: Option<String>,
    agent: Option<String>,
    /// The agent token. Never shown, never logged.
    token: Option<String>,
    window: Option<WindowCredential>,
    connection: Option<Arc<Connection>>,
}

/// The labels this window tells the bus in its first heartbeat (again after
/// every registration): discovery labels, and the channel set for it
/// (`.acs.toml` or configure_session). The bus decides the default channel
/// from them; the proxy never picks one itself.
#[derive(Clone, Debug, Default)]
struct Labels {
    project: Option<String>,
    role: Option<String>,
    channel: Option<String>,
    /// Why the bus refused `channel` in the first heartbeat, which then went
    /// without it (shown by session_status).
    channel_refused: Option<String>,
}

/// Everything one proxy process shares between the host's requests and its
/// background loop.
pub(crate) struct Proxy {
    /// Which host conversation this is; a random one may be replaced once,
    /// by the first tool call's thread (`thread.rs`).
    host: std::sync::RwLock<HostSession>,
    /// Held while the window is registered or replaced, and by each inbox
    /// pass (whose spool follows the host conversation).
    rebinding: Mutex<()>,
    /// What the tool calls said about the host conversation (`thread.rs`).
    thread: Mutex<thread::Seen>,
    options: ProxyOptions,
    bound: RwLock<Bound>,
    labels: Mutex<Labels>,
    /// The bus's tools, once fetched.
    tools: RwLock<Option<Vec<Tool>>>,
    /// Why the bus cannot be used now (None: it can).
    trouble: Mutex<Option<String>>,
    /// Flips to true when the first attempt to reach the bus is over.
    settled: watch::Sender<bool>,
    /// One recovery at a time when the bus refuses the window's credential.
    recovering: Mutex<()>,
    peer: std::sync::OnceLock<Peer<RoleServer>>,
    /// tools/list was answered without the bus's tools: tell the host when
    /// they arrive.
    listed_without_bus: AtomicBool,
}

/// Run the proxy until the host closes stdin or sends SIGTERM or SIGINT.
pub async fn run(options: ProxyOptions) -> anyhow::Result<()> {
    let host = window::host_session(options.host_session.clone());
    let (bound, labels, trouble) = match context::resolve(options.bus.clone(), &options.dir) {
        Ok(resolved) => {
            let token = resolved.token().ok().map(str::to_string);
            let trouble = resolved.token().err().map(|e| e.to_string());
            (
                Bound {
                    url: resolved.url.value.clone(),
                    profile: resolved.profile.as_ref().map(|p| p.value.clone()),
                    team: resolved.team.as_ref().map(|t| t.value.clone()),
                    agent: resolved.agent.as_ref().map(|a| a.value.clone()),
                    token,
                    window: None,
                    connection: None,
                },
                Labels {
                    project: resolved.project.as_ref().map(|p| p.value.clone()),
                    role: options
                        .role
                        .clone()
                        .or_else(|| resolved.role.as_ref().map(|r| r.value.clone())),
                    channel: resolved.channel.as_ref().map(|c| c.value.clone()),
                    channel_refused: None,
                },
                trouble,
            )
        }
        // Still serve: the model reads the reason in the instructions and in
        // every tool's answer, which a host shows better than a dead server.
        Err(err) => (
            Bound {
                url: options
                    .bus
                    .url
                    .clone()
                    .unwrap_or_else(|| context::DEFAULT_URL.to_string()),
                profile: None,
                team: None,
                agent: None,
                token: None,
                window: None,
                connection: None,
            },
            Labels {
                role: options.role.clone(),
                ..Labels::default()
            },
            Some(format!("{err:#}")),
        ),
    };
    tracing::info!(label = %host.label, from = %host.source, "mcp proxy starting");
    let proxy = Arc::new(Proxy {
        host: std::sync::RwLock::new(host),
        rebinding: Mutex::new(()),
        thread: Mutex::new(thread::Seen::default()),
        options,
        bound: RwLock::new(bound),
        labels: Mutex::new(labels),
        tools: RwLock::new(None),
        trouble: Mutex::new(trouble),
        settled: watch::channel(false).0,
        recovering: Mutex::new(()),
        peer: std::sync::OnceLock::new(),
        listed_without_bus: AtomicBool::new(false),
    });
    let maintainer = tokio::spawn(proxy.clone().maintain());

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    let server = forward::ProxyServer(proxy.clone());
    let served = tokio::select! {
        served = server.serve(rmcp::transport::io::stdio_pipes()) => served,
        _ = sigterm.recv() => return proxy.stop(maintainer, "SIGTERM before the handshake").await,
        _ = tokio::signal::ctrl_c() => return proxy.stop(maintainer, "SIGINT before the handshake").await,
    };
    let service = match served {
        Ok(service) => service,
        Err(err) => {
            proxy.stop(maintainer, "no handshake").await?;
            return Err(err).context("the MCP handshake on stdin/stdout failed");
        }
    };
    let token = service.cancellation_token();
    let reason = tokio::select! {
        quit = service.waiting() => format!("the host closed stdin ({quit:?})"),
        _ = sigterm.recv() => { token.cancel(); "SIGTERM".to_string() }
        _ = tokio::signal::ctrl_c() => { token.cancel(); "SIGINT".to_string() }
    };
    proxy.stop(maintainer, &reason).await
}

impl Proxy {
    /// The end of a run, whatever ended it: no more background work, and the
    /// window marked offline within [`EXIT_BOUND`].
    async fn stop(
        &self,
        maintainer: tokio::task::JoinHandle<()>,
        reason: &str,
    ) -> anyhow::Result<()> {
        tracing::info!("mcp proxy stopping: {reason}; marking the window offline");
        maintainer.abort();
        if tokio::time::timeout(EXIT_BOUND, self.mark_offline())
            .await
            .is_err()
        {
            tracing::warn!("the bus did not take the leaving heartbeat in time; exiting anyway");
        }
        Ok(())
    }

    /// The background loop: reach the bus (retrying with backoff), then keep
    /// presence alive and renew the credential at half-life.
    async fn maintain(self: Arc<Self>) {
        let mut backoff = Duration::from_secs(1);
        loop {
            // A bus that accepts and never answers must not stall the retries.
            let attempt = tokio::time::timeout(ESTABLISH_BOUND, self.establish()).await;
            let attempt =
                attempt.unwrap_or_else(|_| Err(calls::BusSilent(ESTABLISH_BOUND.as_secs()).into()));
            match attempt {
                Ok(()) => break,
                Err(err) => {
                    let permanent = self.bound.read().await.token.is_none();
                    tracing::warn!("could not reach the bus: {err:#}");
                    if !permanent {
                        let url = self.bound.read().await.url.clone();
                        let why = if calls::unreachable(&err) {
                            calls::bus_down(&url, &err)
                        } else {
                            brief(&err)
                        };
                        *self.trouble.lock().await = Some(format!(
                            "{why} (Retrying every {} s or less.)",
                            backoff.as_secs().max(1)
                        ));
                    }
                    self.settled.send_replace(true);
                    if permanent {
                        return;
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        *self.trouble.lock().await = None;
        self.settled.send_replace(true);
        if self.listed_without_bus.load(Ordering::SeqCst)
            && let Some(peer) = self.peer.get()
        {
            let _ = peer.notify_tool_list_changed().await;
        }
        let ttl = self.options.session_ttl_seconds;
        let tick = Duration::from_secs((PRESENCE_TTL_SECS as u64 / 3).min(ttl as u64 / 4).max(5));
        let presence = async {
            loop {
                tokio::time::sleep(tick).await;
                let beat = json!({"ttl_seconds": PRESENCE_TTL_SECS});
                if let Err(err) = self.call_json("heartbeat", window::object(beat)).await {
                    tracing::warn!("heartbeat failed: {err:#}");
                }
                if let Err(err) = self.renew_if_due().await {
                    tracing::warn!("renewing the session credential failed: {err:#}");
                }
            }
        };
        // Neither ends: both stop when the run aborts this task.
        tokio::join!(presence, self.clone().keep_inbox());
    }

    /// The host conversation as it stands.
    fn host(&self) -> HostSession {
        self.host
            .read()
            .expect("the host lock is never poisoned")
            .clone()
    }

    /// Register the window, open its connection, fetch the tools, say hello.
    async fn establish(&self) -> anyhow::Result<()> {
        let _one = self.rebinding.lock().await;
        let (url, token, profile) = {
            let bound = self.bound.read().await;
            (
                bound.url.clone(),
                bound.token.clone(),
                bound.profile.clone(),
            )
        };
        let Some(token) = token else {
            anyhow::bail!("no credential to reach the bus with");
        };
        let window = window::register(
            &url,
            &token,
            &self.host().label,
            self.options.session_ttl_seconds,
            true,
        )
        .await?;
        let connection = Arc::new(window::open(&url, &window).await?);
        let tools = connection.tools().await?;
        let me = connection.call("whoami", Map::new()).await?;
        self.adopt(&url, &token, profile, &me, window, connection)
            .await;
        *self.tools.write().await = Some(tools);
        self.hello().await
    }

    /// Speak as `me` through `window` from now on (after a registration, at
    /// start or on a profile switch), and keep the window's record for the
    /// hooks of this conversation.
    async fn adopt(
        &self,
        url: &str,
        token: &str,
        profile: Option<String>,
        me: &Value,
        window: WindowCredential,
        connection: Arc<Connection>,
    ) {
        let team = me["team"].as_str().unwrap_or_default().to_string();
        let agent = me["agent"].as_str().unwrap_or_default().to_string();
        if let Err(err) = window::keep_record(&self.host(), url, &team, &agent, &window) {
            tracing::warn!("could not keep the window record: {err:#}");
        }
        let mut bound = self.bound.write().await;
        *bound = Bound {
            url: url.to_string(),
            profile,
            team: Some(team),
            agent: Some(agent),
            token: Some(token.to_string()),
            window: Some(window),
            connection: Some(connection),
        };
    }

    /// The first heartbeat of a window: active, where it works, its labels
    /// and the channel set for it. A channel the bus refuses (a name
    /// `.acs.toml` got wrong) does not keep the window off the bus: the beat
    /// goes again without it, and session_status says why.
    async fn hello(&self) -> anyhow::Result<()> {
        let (repo, branch) = window::git_place(&self.options.dir).await;
        let labels = self.labels.lock().await.clone();
        let mut beat = json!({"status": "active", "ttl_seconds": PRESENCE_TTL_SECS});
        for (key, value) in [
            ("repo", repo),
            ("branch", branch),
            ("project", labels.project),
            ("role", labels.role),
        ] {
            if let Some(value) = value {
                beat[key] = Value::String(value);
            }
        }
        if let Some(channel) = &labels.channel {
            let mut with_channel = beat.clone();
            with_channel["channel"] = Value::String(channel.clone());
            match self
                .call_json("heartbeat", window::object(with_channel))
                .await
            {
                Ok(_) => return Ok(()),
                Err(err)
                    if err
                        .downcast_ref::<crate::client::Refused>()
                        .is_some_and(|r| r.kind == "invalid") =>
                {
                    tracing::warn!("the bus refused the channel {channel:?}: {err:#}");
                    let mut labels = self.labels.lock().await;
                    labels.channel_refused = Some(format!("{channel:?}: {err:#}"));
                    labels.channel = None;
                }
                Err(err) => return Err(err),
            }
        }
        self.call_json("heartbeat", window::object(beat)).await?;
        Ok(())
    }

    async fn renew_if_due(&self) -> anyhow::Result<()> {
        let (window, connection) = {
            let bound = self.bound.read().await;
            (bound.window.clone(), bound.connection.clone())
        };
        let (Some(window), Some(connection)) = (window, connection) else {
            return Ok(());
        };
        if Utc::now() < window.renew_at() {
            return Ok(());
        }
        let renewed = window::renew(&connection, &window, self.options.session_ttl_seconds).await?;
        let mut bound = self.bound.write().await;
        // A switch or a recovery may have replaced the window meanwhile.
        if bound
            .window
            .as_ref()
            .is_some_and(|w| w.credential == renewed.credential)
        {
            let (team, agent) = (
                bound.team.clone().unwrap_or_default(),
                bound.agent.clone().unwrap_or_default(),
            );
            if let Err(err) = window::keep_record(&self.host(), &bound.url, &team, &agent, &renewed)
            {
                tracing::warn!("could not keep the window record: {err:#}");
            }
            bound.window = Some(renewed);
        }
        Ok(())
    }

    /// Best effort, at exit or when a profile switch leaves the window: it
    /// says it leaves (idle, and offline now rather than when its presence
    /// ttl runs out).
    async fn mark_offline(&self) {
        let connection = self.bound.read().await.connection.clone();
        if let Some(connection) = connection
            && let Err(err) = connection.call("heartbeat", window::leaving()).await
        {
            tracing::warn!("could not mark the window offline: {err:#}");
        }
    }

    /// Wait (bounded) until the first attempt to reach the bus is over.
    async fn wait_settled(&self) {
        let mut settled = self.settled.subscribe();
        let _ = tokio::time::timeout(BUS_WAIT, settled.wait_for(|s| *s)).await;
    }
}

/// A tool result the model reads as a refusal, shaped like the bus's own.
pub(crate) fn refusal(kind: &str, message: &str) -> CallToolResult {
    CallToolResult::structured_error(json!({"error": kind, "message": message}))
}
