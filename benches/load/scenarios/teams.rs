//! A team's posts in parallel: `post_one_team` (every client an agent of
//! one team, all posting to its `#general`) against `post_teams` (every
//! client the one agent of a team of its own, posting to that team's
//! `#general`), the same call at the same client count in the same run. What
//! one team's posts share (the team's positions, its channel) shows as the
//! ratio of the two.

use std::sync::Arc;
use std::time::Instant;

use ai_crew_sync::store::{Actor, Source, identity::agents};
use anyhow::{Context as _, Result};
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::OnceCell;

use super::{Ctx, SHORT_BODY, call_tool};
use crate::harness::{Run, closed_loop};
use crate::mcp_client::McpClient;

/// The most clients a run uses (the runner's largest count).
const MAX_CLIENTS: usize = 16;

/// Tokens of the agents `p0..p15` of team `post-one` (made once a run).
static ONE_TEAM: OnceCell<Vec<String>> = OnceCell::const_new();
/// Tokens of agent `poster` of teams `post-t0..t15` (made once a run).
static TEAMS: OnceCell<Vec<String>> = OnceCell::const_new();

/// The benchmark's actor for what it creates outside MCP.
pub(super) fn bench_actor() -> Actor {
    Actor {
        name: "bench".into(),
        source: Source::Cli,
        admin_credential: None,
    }
}

/// `count` agents made with the library's quickstart: `(team, agent)` for
/// each index. Returns their tokens in index order.
pub(super) async fn quickstart_agents(
    pool: &PgPool,
    count: usize,
    name: impl Fn(usize) -> (String, String),
) -> Result<Vec<String>> {
    let actor = bench_actor();
    let mut tokens = Vec::with_capacity(count);
    for i in 0..count {
        let (team, agent) = name(i);
        let made = agents::quickstart(pool, &team, &agent, &actor)
            .await
            .with_context(|| format!("creating agent {agent} of team {team}"))?;
        tokens.push(made.issued.token);
    }
    Ok(tokens)
}

/// `post_message` to `#general` of one team from every client, each client
/// an agent of that team in a window of its own.
pub(super) async fn post_one_team(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let tokens = ONE_TEAM
        .get_or_try_init(|| {
            quickstart_agents(&ctx.pool, MAX_CLIENTS, |i| {
                ("post-one".into(), format!("p{i}"))
            })
        })
        .await?
        .clone();
    post_general(ctx, clients, tokens).await
}

/// The same from clients each in a team of its own (16 teams).
pub(super) async fn post_teams(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let tokens = TEAMS
        .get_or_try_init(|| {
            quickstart_agents(&ctx.pool, MAX_CLIENTS, |i| {
                (format!("post-t{i}"), "poster".into())
            })
        })
        .await?
        .clone();
    post_general(ctx, clients, tokens).await
}

/// Client `i` posts to `#general` as `tokens[i]`, window `poster-i`, closed
/// loop; one op = one post committed.
async fn post_general(ctx: Arc<Ctx>, clients: usize, tokens: Vec<String>) -> Result<Run> {
    anyhow::ensure!(
        clients <= tokens.len(),
        "{clients} clients, but {} agents were made",
        tokens.len()
    );
    let tokens = Arc::new(tokens);
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        let tokens = tokens.clone();
        async move {
            let session = format!("poster-{i}");
            let client = McpClient::open(&ctx.mcp_url, &tokens[i], Some(&session)).await?;
            let post = json!({"channel": "general", "body": SHORT_BODY});
            // The first post of a team makes its channel: not measured.
            call_tool(&client, "post_message", post.clone()).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                call_tool(&client, "post_message", post.clone()).await?;
                rec.record(started);
            }
            client.close().await;
            Ok(rec.finish())
        }
    })
    .await
}
