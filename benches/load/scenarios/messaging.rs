//! MCP round trips over HTTP: `whoami` (the cheapest authenticated call;
//! `whoami_rmcp` the same through the library's rmcp client), `post_read` (a DM and the recipient's read) and `wake_latency` (a post
//! waking a blocked `wait_for_updates`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{Ctx, call_tool};
use crate::harness::{Recorder, Run, closed_loop};
use crate::mcp_client::McpClient;

/// The cheapest authenticated MCP round trip: HTTP, token check, one tool.
pub(super) async fn whoami(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |_, window| {
        let ctx = ctx.clone();
        async move {
            let client = ctx.connect(None).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                call_tool(&client, "whoami", json!({})).await?;
                rec.record(started);
            }
            client.close().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// `whoami` through the library's rmcp client, which opens a connection per
/// call: kept for reference beside `whoami` (a kept-alive connection).
pub(super) async fn whoami_rmcp(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |_, window| {
        let ctx = ctx.clone();
        async move {
            let client = ctx.connect_rmcp(None).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                client.call("whoami", serde_json::Map::new()).await?;
                rec.record(started);
            }
            client.close().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// One op = `post_message` (a DM to the next worker's window) + that worker's
/// own `read_messages` of its inbox: the write path with a commit, the event
/// emit and the cursor-advancing read.
pub(super) async fn post_read(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        async move {
            let me = format!("w{i}");
            let next = format!("bench/w{}", (i + 1) % clients);
            let client = ctx.connect(Some(&me)).await?;
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
            client.close().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// Latency from the start of a `post_message` to the moment a
/// `wait_for_updates` blocked in the recipient's window returns with it. It
/// includes the posting call's own round trip (the commit happens inside it).
/// Each worker is one waiter/poster pair; ops/s is pairs completed.
pub(super) async fn wake_latency(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    wake_latency_at_least(ctx, clients, 0).await
}

/// [`wake_latency`], each pair measuring at least `at_least` wakes even when
/// they outlast the window (thousands of blocked waits on a loaded machine).
pub(super) async fn wake_latency_at_least(
    ctx: Arc<Ctx>,
    clients: usize,
    at_least: usize,
) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        async move {
            let waiter_window = format!("wait{i}");
            let waiter = Arc::new(ctx.connect(Some(&waiter_window)).await?);
            let poster = ctx.connect(Some(&format!("post{i}"))).await?;
            let post =
                serde_json::json!({"to": format!("bench/{waiter_window}"), "body": "wake up"});
            let mut rec = window.open().await;
            while rec.wants_more(at_least) {
                wake_once(&mut rec, &waiter, &poster, &post).await?;
            }
            poster.close().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// One measured wake: a `wait_for_updates` (kinds `message`) blocked in
/// `waiter`'s window, then `post` from `poster`; recorded from the start of
/// the post until the wait returns woken. Then the waiter reads its inbox
/// (not timed), so the next wait blocks again.
pub(super) async fn wake_once(
    rec: &mut Recorder,
    waiter: &Arc<McpClient>,
    poster: &McpClient,
    post: &Value,
) -> Result<()> {
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .call(
                    "wait_for_updates",
                    json!({"timeout_seconds": 10, "kinds": ["message"]}),
                )
                .await
        })
    };
    // Let the wait subscribe first; not part of the measured latency.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let started = Instant::now();
    poster.call("post_message", post.clone()).await?;
    let woke = waiting.await.context("the waiting task")??;
    if woke["woke"] != true {
        bail!("wait_for_updates did not wake for a DM: {woke}");
    }
    rec.record(started);
    // Consume the DM so the next wait blocks again.
    waiter
        .call("read_messages", json!({"scope": "inbox"}))
        .await?;
    Ok(())
}
