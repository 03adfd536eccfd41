//! The measured workloads. A scenario is a name and an async function that
//! drives `clients` concurrent workers against the running server and returns
//! what they measured; add one by writing the function and listing it in
//! [`SCENARIOS`]. The baseline is not a scenario: it always runs, because
//! every scenario's figure is a ratio to it.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use futures::future::BoxFuture;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use sqlx::PgPool;

use crate::harness::{Run, Timing, closed_loop};

/// What a scenario may use.
pub struct Ctx {
    pub mcp_url: String,
    /// A bearer token of agent `bench` in team `bench`.
    pub token: String,
    /// The server's database, for setup and checks (not for the measured calls).
    #[allow(dead_code, reason = "for scenarios that seed data; whoami needs none")]
    pub pool: PgPool,
    pub timing: Timing,
}

pub type RunFn = fn(Arc<Ctx>, usize) -> BoxFuture<'static, Result<Run>>;

pub struct Scenario {
    pub name: &'static str,
    pub run: RunFn,
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "whoami",
        run: |ctx, clients| Box::pin(whoami(ctx, clients)),
    },
    Scenario {
        name: "post_read",
        run: |ctx, clients| Box::pin(post_read(ctx, clients)),
    },
    Scenario {
        name: "wake_latency",
        run: |ctx, clients| Box::pin(wake_latency(ctx, clients)),
    },
];

/// The name the baseline's lines carry.
pub const BASELINE: &str = "pg_insert_commit";

/// What the machine's PostgreSQL can commit at all: one single-row INSERT per
/// transaction (autocommit), each worker on its own connection. Every write
/// the bus makes costs at least this, so it is the yardstick.
pub async fn pg_insert_commit(pool: PgPool, timing: Timing, clients: usize) -> Result<Run> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_baseline (id bigserial PRIMARY KEY, payload text)",
    )
    .execute(&pool)
    .await
    .context("creating bench_baseline")?;
    closed_loop(clients, timing, move |_, window| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.context("a baseline connection")?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                sqlx::query("INSERT INTO bench_baseline (payload) VALUES ($1)")
                    .bind("a short payload, about the size of a small message body")
                    .execute(&mut *conn)
                    .await
                    .context("baseline INSERT")?;
                rec.record(started);
            }
            Ok(rec.finish())
        }
    })
    .await
}

/// The cheapest authenticated MCP round trip: HTTP, token check, one tool.
async fn whoami(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |_, window| {
        let ctx = ctx.clone();
        async move {
            let client = connect_mcp(&ctx.mcp_url, &ctx.token).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                call_tool(&client, "whoami", Value::Null).await?;
                rec.record(started);
            }
            let _ = client.cancel().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// A connected MCP client (initialize done), as agents use: rmcp's Streamable
/// HTTP client with a bearer token.
pub async fn connect_mcp(url: &str, token: &str) -> Result<RunningService<RoleClient, ()>> {
    connect_mcp_as(url, token, None).await
}

/// [`connect_mcp`] as window `session` (the `X-Crew-Session` header).
pub async fn connect_mcp_as(
    url: &str,
    token: &str,
    session: Option<&str>,
) -> Result<RunningService<RoleClient, ()>> {
    // The same settings as rmcp's default client (it keeps no idle
    // connections, to dodge delayed-ACK stalls, so each call opens one), so
    // the figures are what an rmcp agent sees; plus no proxy, so traffic
    // cannot leave 127.0.0.1.
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("building the MCP client's HTTP client")?;
    let mut headers = std::collections::HashMap::new();
    if let Some(session) = session {
        headers.insert(
            http::HeaderName::from_static("x-crew-session"),
            session.parse().context("a window label")?,
        );
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url)
        .auth_header(token)
        .custom_headers(headers);
    let transport = StreamableHttpClientTransport::with_client(http, config);
    ().serve(transport).await.context("MCP initialize")
}

/// Call `tool`, failing on a transport error or a refusal: a benchmark that
/// counts refusals as work measures nothing.
pub async fn call_tool(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    args: Value,
) -> Result<Value> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    let result = client
        .call_tool(params)
        .await
        .with_context(|| format!("tools/call {tool}"))?;
    let value = result.structured_content.unwrap_or(Value::Null);
    if result.is_error == Some(true) {
        bail!("tools/call {tool} was refused: {value}");
    }
    Ok(value)
}

/// One op = `post_message` (a DM to the next worker's window) + that worker's
/// own `read_messages` of its inbox: the write path with a commit, the event
/// emit and the cursor-advancing read.
async fn post_read(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        async move {
            let me = format!("w{i}");
            let next = format!("bench/w{}", (i + 1) % clients);
            let client = connect_mcp_as(&ctx.mcp_url, &ctx.token, Some(&me)).await?;
            let post =
                serde_json::json!({"to": next, "body": "a short message about the work at hand"});
            let read = serde_json::json!({"scope": "inbox", "limit": 50});
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                call_tool(&client, "post_message", post.clone()).await?;
                call_tool(&client, "read_messages", read.clone()).await?;
                rec.record(started);
            }
            let _ = client.cancel().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// Latency from the start of a `post_message` to the moment a
/// `wait_for_updates` blocked in the recipient's window returns with it. It
/// includes the posting call's own round trip (the commit happens inside it).
/// Each worker is one waiter/poster pair; ops/s is pairs completed.
async fn wake_latency(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        async move {
            let waiter_window = format!("wait{i}");
            let waiter =
                Arc::new(connect_mcp_as(&ctx.mcp_url, &ctx.token, Some(&waiter_window)).await?);
            let poster =
                connect_mcp_as(&ctx.mcp_url, &ctx.token, Some(&format!("post{i}"))).await?;
            let post =
                serde_json::json!({"to": format!("bench/{waiter_window}"), "body": "wake up"});
            let mut rec = window.open().await;
            while rec.is_open() {
                let waiting = {
                    let waiter = waiter.clone();
                    tokio::spawn(async move {
                        call_tool(
                            &waiter,
                            "wait_for_updates",
                            serde_json::json!({"timeout_seconds": 10, "kinds": ["message"]}),
                        )
                        .await
                    })
                };
                // Let the wait subscribe first; not part of the measured latency.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let started = Instant::now();
                call_tool(&poster, "post_message", post.clone()).await?;
                let woke = waiting.await.context("the waiting task")??;
                if woke["woke"] != true {
                    bail!("wait_for_updates did not wake for a DM: {woke}");
                }
                rec.record(started);
                // Consume the DM so the next wait blocks again.
                call_tool(
                    &waiter,
                    "read_messages",
                    serde_json::json!({"scope": "inbox"}),
                )
                .await?;
            }
            let _ = poster.cancel().await;
            Ok(rec.finish())
        }
    })
    .await
}
