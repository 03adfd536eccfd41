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

pub const SCENARIOS: &[Scenario] = &[Scenario {
    name: "whoami",
    run: |ctx, clients| Box::pin(whoami(ctx, clients)),
}];

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
    let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token);
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
