//! The peer's own workloads, from mcp_agent_mail_rust's stress suite
//! (README.md, "Rust vs. Python: Stress Test Results"; the tests in
//! crates/mcp-agent-mail-storage/tests/stress_pipeline.rs), run against
//! this bus over MCP so the figures can stand beside theirs:
//!
//! - `peer_burst` (their test 1, "30-agent message pipeline": 150/150
//!   success, p99 = 6.8 s): 30 agents of one team each send 5 direct
//!   messages to other agents at once, then each fetches its inbox. Line:
//!   `ops` = sends published, `sends_total`, `p99_ms` of a send, `secs` =
//!   the whole burst (sends and fetches), `fetched` = messages the fetches
//!   returned.
//! - `peer_mixed` (their test 8, "Sustained 30s mixed workload": 1494 ops,
//!   ~49 RPS, p99 = 2.6 s; theirs is paced at a 50 RPS target, ours runs
//!   closed loop, as fast as the server answers): 30 s of sends, inbox
//!   reads, searches, lock and task calls from 30 agents. One op = one call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};
use tokio::sync::{Barrier, OnceCell};
use tokio::task::JoinSet;

use super::teams::quickstart_agents;
use super::{Ctx, SHORT_BODY, call_tool};
use crate::harness::{Run, Timing, closed_loop};
use crate::mcp_client::McpClient;

/// Agents of the peer's workloads (theirs: 30).
const AGENTS: usize = 30;
/// Direct messages each agent sends in the burst (theirs: 5).
const SENDS_EACH: usize = 5;
/// The mixed workload's window (theirs: 30 s).
const MIXED: Duration = Duration::from_secs(30);
const TEAM: &str = "peer";

/// Tokens of agents `a0..a29` of team `peer` (made once a run).
static PEERS: OnceCell<Vec<String>> = OnceCell::const_new();

async fn peers(ctx: &Ctx) -> Result<Arc<Vec<String>>> {
    let tokens = PEERS
        .get_or_try_init(|| {
            quickstart_agents(&ctx.pool, AGENTS, |i| (TEAM.into(), format!("a{i}")))
        })
        .await?;
    Ok(Arc::new(tokens.clone()))
}

/// Another agent than `i`, picked by a small deterministic walk.
fn other(i: usize, k: usize) -> usize {
    (i + 1 + (k * 7 + i * 3) % (AGENTS - 1)) % AGENTS
}

pub(super) async fn peer_burst(ctx: Arc<Ctx>) -> Result<Run> {
    let tokens = peers(&ctx).await?;
    // Every agent connected first (as theirs are set up first), then all at once.
    let start = Arc::new(Barrier::new(AGENTS + 1));
    let mut agents: JoinSet<Result<(Vec<Duration>, usize, i64)>> = JoinSet::new();
    for i in 0..AGENTS {
        let (ctx, tokens, start) = (ctx.clone(), tokens.clone(), start.clone());
        agents.spawn(async move {
            let client = McpClient::open(&ctx.mcp_url, &tokens[i], Some("main")).await?;
            // Nothing from an earlier run left in the inbox.
            client
                .call("read_messages", json!({"scope": "inbox", "limit": 100}))
                .await?;
            start.wait().await;
            let mut latencies = Vec::with_capacity(SENDS_EACH);
            let mut published = 0;
            for k in 0..SENDS_EACH {
                let post = json!({"to": format!("a{}", other(i, k)), "body": SHORT_BODY});
                let started = Instant::now();
                if client.call("post_message", post).await.is_ok() {
                    published += 1;
                    latencies.push(started.elapsed());
                }
            }
            // Each fetches its inbox once its own sends are done (theirs too).
            let inbox = client
                .call("read_messages", json!({"scope": "inbox", "limit": 100}))
                .await?;
            let fetched = inbox["messages"].as_array().map_or(0, Vec::len) as i64;
            Ok((latencies, published, fetched))
        });
    }
    start.wait().await;
    let began = Instant::now();
    let (mut latencies, mut published, mut fetched) = (Vec::new(), 0, 0);
    while let Some(joined) = agents.join_next().await {
        let (l, p, f) = joined.context("a peer agent panicked")??;
        latencies.extend(l);
        published += p;
        fetched += f;
    }
    let elapsed = began.elapsed();
    let mut run = Run::open_loop(published, elapsed, latencies);
    let mut extra = serde_json::Map::new();
    extra.insert("sends_total".into(), json!(AGENTS * SENDS_EACH));
    extra.insert("fetched".into(), json!(fetched));
    extra.insert(
        "peer".into(),
        json!("mcp_agent_mail_rust: 150/150 sends, p99 6.8 s"),
    );
    run.extra = Some(extra);
    Ok(run)
}

pub(super) async fn peer_mixed(ctx: Arc<Ctx>) -> Result<Run> {
    let tokens = peers(&ctx).await?;
    queue_peer_tasks(&ctx).await?;
    let timing = Timing::new(MIXED);
    let mut run = closed_loop(AGENTS, timing, move |i, window| {
        let (ctx, tokens) = (ctx.clone(), tokens.clone());
        async move {
            let client = McpClient::open(&ctx.mcp_url, &tokens[i], Some("main")).await?;
            let mut rec = window.open().await;
            let mut n = i;
            while rec.is_open() {
                n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345) % (1 << 31);
                mixed_op(&client, &mut rec, i, n).await?;
            }
            client.close().await;
            Ok(rec.finish())
        }
    })
    .await?;
    let mut extra = serde_json::Map::new();
    extra.insert(
        "peer".into(),
        json!("mcp_agent_mail_rust: 1494 ops in 30 s, ~49 RPS (paced at 50), p99 2.6 s"),
    );
    run.extra = Some(extra);
    Ok(run)
}

/// One draw of the mix (theirs: 40 % sends, 30 % inbox fetches, 15 %
/// searches, 10 % file reservations, 5 % profile writes; the last is a
/// task claim and completion here, this bus's nearest write of that size).
/// Every call is timed as an op of its own.
async fn mixed_op(
    client: &McpClient,
    rec: &mut crate::harness::Recorder,
    i: usize,
    draw: usize,
) -> Result<()> {
    let mut timed = async |tool: &str, args: Value| -> Result<Value> {
        let started = Instant::now();
        let answer = call_tool(client, tool, args).await?;
        rec.record(started);
        Ok(answer)
    };
    match (draw >> 8) % 100 {
        0..40 => {
            let to = format!("a{}", other(i, draw));
            timed("post_message", json!({"to": to, "body": SHORT_BODY})).await?;
        }
        40..70 => {
            timed("read_messages", json!({"scope": "inbox", "limit": 50})).await?;
        }
        70..85 => {
            timed("search_messages", json!({"query": "work", "limit": 20})).await?;
        }
        85..95 => {
            // A file of its own (a lock held elsewhere is a refusal here).
            let name = format!("src/file{i}.rs");
            timed("acquire_lock", json!({"name": name, "ttl_seconds": 60})).await?;
            timed("release_lock", json!({"name": name})).await?;
        }
        _ => {
            let next = timed("claim_next_task", json!({})).await?;
            if let Some(key) = next["task"]["key"].as_str() {
                timed("complete_task", json!({"key": key, "result": "done"})).await?;
            }
        }
    }
    Ok(())
}

/// Open tasks in team `peer` for the mix's claims.
async fn queue_peer_tasks(ctx: &Ctx) -> Result<()> {
    let made = sqlx::query(
        "INSERT INTO tasks (id, team_id, key, title, created_by, created_session)
         SELECT gen_random_uuid(), t.id, 'peer-' || gen_random_uuid(), 'peer task ' || g, a.id, ''
         FROM teams t JOIN agents a ON a.team_id = t.id AND a.name = 'a0',
              generate_series(1, 5000) AS g
         WHERE t.slug = $1",
    )
    .bind(TEAM)
    .execute(&ctx.pool)
    .await
    .context("queueing the peer team's tasks")?;
    if made.rows_affected() == 0 {
        bail!("team {TEAM} has no agent a0 to queue tasks for");
    }
    Ok(())
}
