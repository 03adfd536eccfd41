//! How many agents one server holds: agents simulated the way hosts use the
//! bus, in 100 teams, their count raised in [`STEPS`] until a step fails.
//!
//! Every agent holds one blocked `wait_for_updates` (kinds `message`, the
//! default 50 s timeout, made again at once) on a kept-alive connection of
//! its own, answers each wake-up with a `read_messages` of its inbox, and
//! makes a call every 10 s on average (exponential gaps: a Poisson stream)
//! drawn from [`MIX`]. Calls go through one shared pool of kept-alive
//! connections (as many as are in flight at once: a few dozen), the way a
//! fleet's calls arrive spread over time; so the client holds the agent count
//! plus that pool in connections, all from 127.0.0.1 (the runner's server
//! allows that many per address, servers.rs).
//!
//! Each step is measured for `BENCH_SECS` (at least 10 s) after its new
//! agents are connected and blocked, and makes a line: `ops_per_s` = calls/s
//! (wake reads included, waits not), p50/p99 over all calls, and in extra
//! fields the agent count, each tool's p99 and count, refusals (any call
//! answered with an error, waits included), the server's resident memory and
//! peak in the step, and the server's PostgreSQL connections
//! (`pg_stat_activity` client backends less the runner's own pool). A step
//! passes when every tool's p99 is under 100 ms and nothing was refused
//! (an agent that cannot connect while the step grows is a refusal too:
//! `connect` in its line);
//! `capacity_agents` on the last line is the largest passing count.

mod setup;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use rand::Rng as _;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::{Ctx, SHORT_BODY};
use crate::harness::Run;
use crate::mcp_client::{McpClient, http_client};
use crate::servers::memory_mib;
use setup::{Agent, Population, TEAMS};

/// Agent counts, in order; the run stops after the first step that fails.
const STEPS: &[usize] = &[500, 1_000, 2_000, 3_000, 5_000, 7_500, 10_000];
const MIN_WINDOW: Duration = Duration::from_secs(10);
/// An agent's mean time between calls.
const MEAN_GAP: Duration = Duration::from_secs(10);
/// A step passes when every tool's p99 is under this and nothing is refused.
const P99_LIMIT_MS: f64 = 100.0;
/// Agents connecting at once while a step is set up.
const CONNECTING: usize = 64;

/// What an agent calls, with weights out of 100: status first, then reading
/// and writing, then the queue and the overview.
const MIX: &[(Call, u32)] = &[
    (Call::Heartbeat, 25),
    (Call::Read, 20),
    (Call::Post, 15),
    (Call::Converse, 10),
    (Call::Claim, 10),
    (Call::ListTasks, 10),
    (Call::Pending, 10),
];

#[derive(Clone, Copy)]
enum Call {
    Heartbeat,
    Read,
    Post,
    Converse,
    Claim,
    ListTasks,
    Pending,
}

/// The latencies and refusals of the step being measured.
#[derive(Default)]
struct Stats {
    /// The measured window; calls begun in it count.
    window: Mutex<Option<(Instant, Instant)>>,
    by_tool: Mutex<BTreeMap<&'static str, (Vec<Duration>, u64)>>,
    /// The first refusals of a step, shown on stderr.
    shown: AtomicUsize,
}

impl Stats {
    fn counts(&self, started: Instant) -> bool {
        matches!(*self.window.lock().expect("not poisoned"), Some((from, to)) if started >= from && started < to)
    }

    /// Time `call`, counting it (and a refusal) under `tool` when it began
    /// inside the window. A refusal never stops the agent.
    async fn timed<F: Future<Output = Result<Value>>>(
        &self,
        tool: &'static str,
        call: F,
    ) -> Option<Value> {
        let started = Instant::now();
        let answer = call.await;
        let elapsed = started.elapsed();
        if self.counts(started) {
            let mut by_tool = self.by_tool.lock().expect("not poisoned");
            let entry = by_tool.entry(tool).or_default();
            match &answer {
                Ok(_) => entry.0.push(elapsed),
                Err(_) => entry.1 += 1,
            }
        }
        match answer {
            Ok(value) => Some(value),
            Err(err) => {
                if self.shown.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("bench: capacity: {tool} refused: {err:#}");
                }
                None
            }
        }
    }
}

pub(super) async fn capacity(ctx: Arc<Ctx>) -> Result<Run> {
    let window = ctx.timing.measure.max(MIN_WINDOW);
    let mut population = Population::teams(&ctx.pool).await?;
    let stats = Arc::new(Stats::default());
    // Calls: one pool shared by every agent. Waits: a connection each.
    let calls_http = http_client(256)?;
    let waits_http = http_client(STEPS[STEPS.len() - 1] + 64)?;
    let live = Arc::new(AtomicUsize::new(0));
    let blocked = Arc::new(AtomicUsize::new(0));
    let mut agents: JoinSet<Result<()>> = JoinSet::new();
    let mut lines: Vec<Run> = Vec::new();
    let mut capacity = 0;
    for &count in STEPS {
        eprintln!("bench: capacity: growing to {count} agents");
        let made = population.grow(&ctx.pool, count).await?;
        // Enough open tasks in every team for the step's claims.
        let claims = count as f64 * 0.10 / MEAN_GAP.as_secs_f64() * (window.as_secs_f64() + 30.0);
        population
            .queue_tasks(&ctx.pool, (claims / TEAMS as f64).ceil() as i64 + 10)
            .await?;
        let gate = Arc::new(Semaphore::new(CONNECTING));
        for agent in made {
            let simulated = Simulated {
                ctx: ctx.clone(),
                stats: stats.clone(),
                calls_http: calls_http.clone(),
                waits_http: waits_http.clone(),
                live: live.clone(),
                blocked: blocked.clone(),
                per_team: count / TEAMS,
            };
            let gate = gate.clone();
            agents.spawn(async move { simulated.run(agent, gate).await });
        }
        // An agent the server refuses to connect fails the step (its line
        // says so), not the steps measured before it.
        let mut refused_connects = 0;
        while live.load(Ordering::Relaxed) + refused_connects < count {
            match agents.try_join_next() {
                Some(Ok(Ok(()))) => {}
                Some(ended) => {
                    refused_connects += 1;
                    if refused_connects <= 5 {
                        let why = match ended {
                            Ok(Err(err)) => format!("{err:#}"),
                            Err(join) => join.to_string(),
                            Ok(Ok(())) => String::new(),
                        };
                        eprintln!("bench: capacity: an agent failed to connect: {why}");
                    }
                }
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        if refused_connects > 0 {
            let step = Step {
                agents: count,
                by_tool: BTreeMap::from([("connect", (Vec::new(), refused_connects as u64))]),
                window,
                rss: memory_mib(ctx.server_pid, "VmRSS"),
                peak: memory_mib(ctx.server_pid, "VmHWM"),
                pg: server_pg_connections(&ctx).await?,
                blocked: blocked.load(Ordering::Relaxed),
            };
            eprintln!(
                "bench: capacity: {refused_connects} of {count} agents failed to connect; stopping"
            );
            lines.push(step.line(false));
            break;
        }
        // A moment for the last waits to block and the ramp's reads to settle.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = std::fs::write(format!("/proc/{}/clear_refs", ctx.server_pid), "5");
        stats.by_tool.lock().expect("not poisoned").clear();
        stats.shown.store(0, Ordering::Relaxed);
        let from = Instant::now();
        *stats.window.lock().expect("not poisoned") = Some((from, from + window));
        eprintln!(
            "bench: capacity: {count} agents, measuring {} s",
            window.as_secs()
        );
        tokio::time::sleep(window).await;
        let (rss, peak, pg) = (
            memory_mib(ctx.server_pid, "VmRSS"),
            memory_mib(ctx.server_pid, "VmHWM"),
            server_pg_connections(&ctx).await?,
        );
        // Calls begun in the window may still be answering.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let by_tool = std::mem::take(&mut *stats.by_tool.lock().expect("not poisoned"));
        let step = Step {
            agents: count,
            by_tool,
            window,
            rss,
            peak,
            pg,
            blocked: blocked.load(Ordering::Relaxed),
        };
        let passed = step.passed();
        if passed {
            capacity = count;
        }
        lines.push(step.line(passed));
        if !passed {
            eprintln!("bench: capacity: {count} agents failed the step; stopping");
            break;
        }
    }
    // Every agent (and with it its wait) ends before the next scenario.
    agents.shutdown().await;
    // The lines in order, the capacity on the last.
    let mut next: Option<Box<Run>> = None;
    let last = lines.len();
    for (n, mut line) in lines.into_iter().enumerate().rev() {
        if n + 1 == last {
            let extra = line.extra.get_or_insert_with(Default::default);
            extra.insert("capacity_agents".into(), json!(capacity));
        }
        line.then = next;
        next = Some(Box::new(line));
    }
    match next {
        Some(first) => Ok(*first),
        None => bail!("capacity measured no step"),
    }
}

/// Client backends of PostgreSQL less the runner's own pool: the server's.
async fn server_pg_connections(ctx: &Ctx) -> Result<i64> {
    let all: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
    )
    .fetch_one(&ctx.pool)
    .await
    .context("counting PostgreSQL connections")?;
    Ok(all - i64::from(ctx.pool.size()))
}

/// A spawned task that ends when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What one agent task needs.
struct Simulated {
    ctx: Arc<Ctx>,
    stats: Arc<Stats>,
    calls_http: reqwest::Client,
    waits_http: reqwest::Client,
    live: Arc<AtomicUsize>,
    blocked: Arc<AtomicUsize>,
    /// Agents per team at this step (the DM targets of a team).
    per_team: usize,
}

impl Simulated {
    async fn run(self, agent: Agent, gate: Arc<Semaphore>) -> Result<()> {
        let calls = {
            let _turn = gate.acquire().await?;
            McpClient::open_on(
                self.calls_http.clone(),
                &self.ctx.mcp_url,
                &agent.token,
                Some("main"),
            )
            .await
            .with_context(|| format!("agent a{} connecting", agent.index))?
        };
        let calls = Arc::new(calls);
        let waits = calls.on(self.waits_http.clone());
        self.live.fetch_add(1, Ordering::Relaxed);
        let this = Arc::new(self);
        // Aborted with this task (when the scenario ends), not left waiting.
        let _waiting = AbortOnDrop({
            let (this, calls) = (this.clone(), calls.clone());
            tokio::spawn(async move { this.wait_loop(&waits, &calls).await })
        });
        this.call_loop(&agent, &calls).await
    }

    /// The agent's one blocked wait, made again when it returns; a wake is
    /// answered by reading the inbox.
    async fn wait_loop(&self, waits: &McpClient, calls: &McpClient) {
        let wait = json!({"kinds": ["message"]});
        loop {
            self.blocked.fetch_add(1, Ordering::Relaxed);
            let answer = self
                .stats
                .counted_wait(waits.call("wait_for_updates", wait.clone()))
                .await;
            self.blocked.fetch_sub(1, Ordering::Relaxed);
            match answer {
                Some(woke) if woke["woke"] == true => {
                    let read = json!({"scope": "inbox", "only_new": true, "limit": 50});
                    self.stats
                        .timed("read_messages (woken)", calls.call("read_messages", read))
                        .await;
                }
                Some(_) => {}
                // Refused: a host would back off before waiting again.
                None => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }

    async fn call_loop(&self, agent: &Agent, calls: &McpClient) -> Result<()> {
        // Spread the first calls over one mean gap.
        let first = rand::rng().random_range(0.0..MEAN_GAP.as_secs_f64());
        tokio::time::sleep(Duration::from_secs_f64(first)).await;
        loop {
            let (call, peer) = {
                let mut rng = rand::rng();
                let mut draw = rng.random_range(0..100u32);
                let call = MIX
                    .iter()
                    .find(|(_, weight)| {
                        let hit = draw < *weight;
                        draw = draw.saturating_sub(*weight);
                        hit
                    })
                    .map_or(Call::Heartbeat, |(call, _)| *call);
                (call, rng.random_range(0..self.per_team.max(1)))
            };
            self.call(agent, calls, call, peer).await;
            // Exponential gaps with mean MEAN_GAP: a Poisson stream.
            let u: f64 = rand::rng().random_range(f64::EPSILON..1.0);
            tokio::time::sleep(MEAN_GAP.mul_f64(-u.ln()).min(MEAN_GAP * 10)).await;
        }
    }

    async fn call(&self, agent: &Agent, calls: &McpClient, call: Call, peer: usize) {
        let stats = &self.stats;
        match call {
            Call::Heartbeat => {
                let args = json!({"status": "busy", "activity": "editing"});
                stats
                    .timed("heartbeat", calls.call("heartbeat", args))
                    .await;
            }
            Call::Read => {
                let args = json!({"scope": "all", "only_new": true, "limit": 50});
                stats
                    .timed("read_messages", calls.call("read_messages", args))
                    .await;
            }
            Call::Post => {
                // A DM to an agent of its team (the k-th agent of team t is
                // agent t + 100 k): it wakes that agent's wait.
                let mut to = agent.index % TEAMS + TEAMS * peer;
                if to == agent.index {
                    to = agent.index % TEAMS + TEAMS * ((peer + 1) % self.per_team.max(1));
                }
                let args = json!({"to": format!("a{to}"), "body": SHORT_BODY});
                stats
                    .timed("post_message", calls.call("post_message", args))
                    .await;
            }
            Call::Converse => {
                let args = json!({
                    "conversation_id": agent.conversation,
                    "body": SHORT_BODY,
                    "request_id": uuid::Uuid::new_v4().to_string(),
                });
                stats
                    .timed(
                        "send_conversation_message",
                        calls.call("send_conversation_message", args),
                    )
                    .await;
            }
            Call::Claim => {
                let next = stats
                    .timed("claim_next_task", calls.call("claim_next_task", json!({})))
                    .await;
                if let Some(key) = next.as_ref().and_then(|n| n["task"]["key"].as_str()) {
                    let args = json!({"key": key, "result": "done"});
                    stats
                        .timed("complete_task", calls.call("complete_task", args))
                        .await;
                }
            }
            Call::ListTasks => {
                let args = json!({"status": "open", "limit": 20});
                stats
                    .timed("list_tasks", calls.call("list_tasks", args))
                    .await;
            }
            Call::Pending => {
                stats
                    .timed("pending_for_me", calls.call("pending_for_me", json!({})))
                    .await;
            }
        }
    }
}

impl Stats {
    /// A wait: only its refusals count (its length is the timeout's or the
    /// next message's, not a latency).
    async fn counted_wait<F: Future<Output = Result<Value>>>(&self, wait: F) -> Option<Value> {
        let started = Instant::now();
        match wait.await {
            Ok(value) => Some(value),
            Err(err) => {
                if self.counts(started) {
                    let mut by_tool = self.by_tool.lock().expect("not poisoned");
                    by_tool.entry("wait_for_updates").or_default().1 += 1;
                }
                if self.shown.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("bench: capacity: wait_for_updates refused: {err:#}");
                }
                None
            }
        }
    }
}

/// One measured step.
struct Step {
    agents: usize,
    by_tool: BTreeMap<&'static str, (Vec<Duration>, u64)>,
    window: Duration,
    rss: Option<f64>,
    peak: Option<f64>,
    pg: i64,
    blocked: usize,
}

impl Step {
    fn p99_ms(latencies: &[Duration]) -> Option<f64> {
        let mut sorted = latencies.to_vec();
        sorted.sort_unstable();
        let rank = ((0.99 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
        sorted.get(rank - 1).map(|d| d.as_secs_f64() * 1000.0)
    }

    fn refusals(&self) -> u64 {
        self.by_tool.values().map(|(_, refused)| refused).sum()
    }

    fn passed(&self) -> bool {
        self.refusals() == 0
            && self
                .by_tool
                .values()
                .all(|(l, _)| Self::p99_ms(l).is_none_or(|p99| p99 < P99_LIMIT_MS))
    }

    fn line(self, passed: bool) -> Run {
        let round = |v: f64| (v * 10.0).round() / 10.0;
        let mut p99 = serde_json::Map::new();
        let mut calls = serde_json::Map::new();
        let mut refused = serde_json::Map::new();
        for (tool, (latencies, refusals)) in &self.by_tool {
            if let Some(ms) = Self::p99_ms(latencies) {
                p99.insert((*tool).into(), json!(round(ms)));
            }
            calls.insert((*tool).into(), json!(latencies.len()));
            if *refusals > 0 {
                refused.insert((*tool).into(), json!(refusals));
            }
        }
        let mut extra = serde_json::Map::new();
        extra.insert("agents".into(), json!(self.agents));
        extra.insert("passed".into(), json!(passed));
        extra.insert("refusals".into(), json!(self.refusals()));
        extra.insert("refusals_by_tool".into(), Value::Object(refused));
        extra.insert("p99_ms_by_tool".into(), Value::Object(p99));
        extra.insert("calls_by_tool".into(), Value::Object(calls));
        extra.insert("server_rss_mib".into(), json!(self.rss.map(round)));
        extra.insert(
            "server_step_peak_rss_mib".into(),
            json!(self.peak.map(round)),
        );
        extra.insert("pg_connections".into(), json!(self.pg));
        extra.insert("blocked_waits".into(), json!(self.blocked));
        let latencies: Vec<Duration> = self.by_tool.into_values().flat_map(|(l, _)| l).collect();
        let mut run = Run::open_loop(latencies.len(), self.window, latencies);
        run.extra = Some(extra);
        run
    }
}
