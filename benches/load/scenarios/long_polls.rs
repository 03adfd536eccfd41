//! Long polls at scale: 1 000 ([`BLOCKED`]) or 10 000 ([`BLOCKED_10K`],
//! the memory figure of a large fleet) windows blocked in `wait_for_updates` on
//! the one server while a further pair measures wake latency exactly as
//! `wake_latency` does (a post until the recipient's blocked wait returns).
//! The runner reports the server's peak RSS beside it. The blocked windows
//! wait for messages of their own (DMs to them, their focus channel), which
//! nothing sends: every post of the pair is an event the hub runs each of
//! their filters on, and refuses for all of them (none is woken).
//!
//! They are windows of the one bench agent, so the runner's server allows
//! one credential that many long polls and connections (servers.rs). They
//! share one HTTP client (its pool holds a connection per blocked wait), so
//! the runner itself stays small at 10 000.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{Ctx, call_tool};
use crate::harness::Run;
use crate::mcp_client::{McpClient, http_client};

/// How many windows sit blocked while the pair is measured.
pub(super) const BLOCKED: usize = 1_000;
pub(super) const BLOCKED_10K: usize = 10_000;
/// Wakes measured at least, even past the window.
const WAKES_AT_LEAST: usize = 20;
/// Windows connecting at once while they are set up.
const CONNECTING: usize = 64;
/// Each blocked wait's timeout; a wait that returns is made again at once.
const WAIT_SECONDS: u64 = 300;

pub(super) async fn long_polls(ctx: Arc<Ctx>, clients: usize, count: usize) -> Result<Run> {
    let connected = Arc::new(AtomicUsize::new(0));
    let mut blocked: JoinSet<Result<()>> = JoinSet::new();
    let http = http_client(count + 64)?;
    let gate = Arc::new(Semaphore::new(CONNECTING));
    for i in 0..count {
        let (ctx, http, gate) = (ctx.clone(), http.clone(), gate.clone());
        let connected = connected.clone();
        blocked.spawn(async move {
            let window = {
                let _turn = gate.acquire().await?;
                McpClient::open_on(http, &ctx.mcp_url, &ctx.token, Some(&format!("idle{i}")))
                    .await?
            };
            connected.fetch_add(1, Ordering::Relaxed);
            loop {
                let answer = call_tool(
                    &window,
                    "wait_for_updates",
                    json!({"timeout_seconds": WAIT_SECONDS, "kinds": ["message"]}),
                )
                .await?;
                if answer["woke"] == true {
                    bail!("an idle window woke for something not meant for it: {answer}");
                }
            }
        });
    }
    // Every window connected (initialize done), then a moment for the last
    // waits to reach the server and block.
    while connected.load(Ordering::Relaxed) < count {
        if let Some(Ok(Err(err))) = blocked.try_join_next() {
            return Err(err.context("a blocked window failed"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("bench: {count} windows blocked in wait_for_updates");
    tokio::time::sleep(Duration::from_secs(2 + count as u64 / 2_000)).await;
    // At least WAKES_AT_LEAST wakes, however long they take.
    let run = super::messaging::wake_latency_at_least(ctx, clients, WAKES_AT_LEAST).await;
    // A blocked window that failed (refused, woken wrongly) fails the run.
    if let Some(Ok(Err(err))) = blocked.try_join_next() {
        return Err(err.context("a blocked window failed"));
    }
    blocked.abort_all();
    run
}
