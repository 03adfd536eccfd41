//! The load benchmark: `scripts/bench [SCENARIO…]` (that is,
//! `cargo bench --bench load -- [SCENARIO…]`).
//!
//! It answers "how much can the bus carry on this machine?" in a form that
//! survives a noisy machine: every figure sits beside a baseline measured in
//! the same run on the same PostgreSQL (the raw single-row INSERT+COMMIT rate,
//! `pg_insert_commit`), and `ratio` is the scenario's rate over the baseline's
//! at the same client count. A scenario may bring a baseline of its own, the
//! same work done with nothing in between (`claim_complete` against
//! `pg_claim_complete` in raw SQL; the outbox drain against raw JetStream
//! publishes, `jetstream_publish_256`; the conversation move too); its lines then carry that baseline. Figures, never pass/fail:
//! targets live in the issues.
//!
//! Everything it needs it starts itself and stops at the end, also on error or
//! Ctrl-C: a throwaway PostgreSQL in a temporary directory, the real
//! `ai-crew-sync serve` binary (built by cargo in the bench profile) on a free
//! loopback port, and, when a selected scenario publishes to JetStream, a
//! throwaway `nats-server -js` (`max_payload` raised). All traffic stays on
//! 127.0.0.1.
//!
//! Output: one JSON line per (scenario, client count) on stdout, baseline
//! lines included; progress on stderr. `BENCH_SECS` sets the measured window
//! of each line (default 5). A run that names no scenario runs all but the
//! long ones marked by-name-only (`history`, `history_small`), whose lines
//! compare latency against a small and a large seeded history instead of a
//! rate against a baseline. Under `cargo test --benches` (no `--bench` flag)
//! it does nothing, so a test run never turns into a load run.

mod harness;
mod mcp_client;
mod scenarios;
mod servers;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use ai_crew_sync::db;
use ai_crew_sync::store::{Actor, Source, identity::agents};
use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use harness::{Run, Timing};
use scenarios::{BASELINE, Ctx, SCENARIOS, Scenario};
use servers::{Nats, Postgres, Server};

/// Concurrency levels: one client shows latency, sixteen show contention.
const CLIENT_COUNTS: &[usize] = &[1, 16];
const DEFAULT_SECS: f64 = 5.0;
const DATABASE: &str = "bench";

fn main() -> ExitCode {
    match main_inner() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn main_inner() -> Result<()> {
    let Some(selected) = parse_args(std::env::args().skip(1))? else {
        eprintln!("bench: not run without --bench (as under `cargo test`); use scripts/bench");
        return Ok(());
    };
    // The rmcp client (the library's) follows the system's proxy settings;
    // the run's traffic must stay on 127.0.0.1, whatever they say. (`*`
    // covers names only: addresses are matched by address.)
    // SAFETY: nothing else runs yet (no runtime, no thread), so nothing
    // reads the environment while it changes.
    unsafe { std::env::set_var("NO_PROXY", "*,127.0.0.0/8,::1") };
    let timing = Timing::new(window_from_env()?);
    let _ = rustls::crypto::ring::default_provider().install_default();

    eprintln!("bench: starting a throwaway PostgreSQL");
    let postgres = Postgres::start()?;
    let nats = if selected.iter().any(|s| s.needs_nats) {
        eprintln!("bench: starting a throwaway nats-server");
        Some(Nats::start()?)
    } else {
        None
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let result = runtime.block_on(async {
        tokio::select! {
            result = run(&postgres, nats.as_ref(), &selected, timing) => result,
            signal = interrupted() => bail!("interrupted by {signal}"),
        }
    });
    // Workers still running (after an error) must not outlive the database.
    drop(runtime);
    drop(nats);
    drop(postgres);
    result
}

/// `Some(scenarios)` to run, or `None` when not invoked as a benchmark.
fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Vec<&'static Scenario>>> {
    // The registry, one scenario a line: its name and what one operation is.
    let known = || {
        SCENARIOS
            .iter()
            .map(|s| format!("\n  {:<32}{}", s.name, s.about))
            .collect::<String>()
    };
    let mut as_bench = false;
    let mut selected: Vec<&'static Scenario> = Vec::new();
    for arg in args {
        match arg.as_str() {
            // cargo bench passes this to a harness-less bench; cargo test does not.
            "--bench" => as_bench = true,
            flag if flag.starts_with('-') => bail!(
                "unknown option `{flag}`. Usage: scripts/bench [SCENARIO…]; scenarios:{}",
                known()
            ),
            name => {
                let Some(scenario) = SCENARIOS.iter().find(|s| s.name == name) else {
                    bail!("unknown scenario `{name}`; known scenarios:{}", known());
                };
                if !selected.iter().any(|s| s.name == name) {
                    selected.push(scenario);
                }
            }
        }
    }
    if !as_bench {
        return Ok(None);
    }
    if selected.is_empty() {
        selected = SCENARIOS.iter().filter(|s| !s.by_name_only).collect();
    }
    Ok(Some(selected))
}

fn window_from_env() -> Result<Duration> {
    let Ok(raw) = std::env::var("BENCH_SECS") else {
        return Ok(Duration::from_secs_f64(DEFAULT_SECS));
    };
    match raw.trim().parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= 3600.0 => {
            Ok(Duration::from_secs_f64(secs))
        }
        _ => bail!("BENCH_SECS must be a number of seconds in (0, 3600], not `{raw}`"),
    }
}

async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without handlers a signal kills us outright; the guards then cannot
        // run, but there is nothing better to do than carry on.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

async fn run(
    postgres: &Postgres,
    nats: Option<&Nats>,
    selected: &[&Scenario],
    timing: Timing,
) -> Result<()> {
    db::create_database_if_missing(&postgres.database_url("postgres"), DATABASE).await?;
    let url = postgres.database_url(DATABASE);
    let max_clients = CLIENT_COUNTS.iter().copied().max().unwrap_or(1);
    let pool = db::connect(&url, max_clients as u32 + 4).await?;
    db::migrator()
        .run(&pool)
        .await
        .context("migrating the benchmark database")?;
    let actor = Actor {
        name: "bench".into(),
        source: Source::Cli,
        admin_credential: None,
    };
    let token = agents::quickstart(&pool, "bench", "bench", &actor)
        .await
        .context("creating the bench team and agent")?
        .issued
        .token;

    eprintln!("bench: starting the server");
    let mut server = Server::start(&url, postgres.scratch()).await?;
    let ctx = Arc::new(Ctx {
        mcp_url: server.mcp_url(),
        token,
        pool: pool.clone(),
        timing,
        nats_url: nats.map(Nats::url),
        server_pid: server.pid(),
        own_baseline_ops: std::sync::Mutex::new(None),
    });

    // Each client count's baseline is measured right before its scenarios, so
    // both see the same state of a noisy machine. The scenarios measured once
    // run last, at the first client count, against its baseline: the heaviest
    // (`capacity`'s thousands of agents, `long_polls_10k`) leave the server
    // and database busier than they found them, and a 16-client line measured
    // after them was not a fair figure (a run of 2026-12-05: `whoami` 1 065/s
    // at 16 clients after `capacity`, 4 298/s without it).
    let mut first_baseline_ops = None;
    for &clients in CLIENT_COUNTS {
        eprintln!("bench: {BASELINE} with {clients} client(s)");
        let baseline = scenarios::pg_insert_commit(pool.clone(), timing, clients).await?;
        let baseline_ops = baseline.ops_per_s();
        emit(BASELINE, clients, &baseline, None, BASELINE, baseline_ops);
        first_baseline_ops.get_or_insert(baseline_ops);
        for scenario in selected.iter().filter(|s| !s.once) {
            measure(&ctx, &server, scenario, clients, baseline_ops).await?;
        }
    }
    if let Some(baseline_ops) = first_baseline_ops {
        for scenario in selected.iter().filter(|s| s.once) {
            measure(&ctx, &server, scenario, CLIENT_COUNTS[0], baseline_ops).await?;
        }
    }

    server.stop();
    pool.close().await;
    Ok(())
}

/// One scenario at one client count, beside its own baseline (run right
/// before it) or the client count's `baseline_ops`; emits its lines.
async fn measure(
    ctx: &Arc<Ctx>,
    server: &Server,
    scenario: &Scenario,
    clients: usize,
    baseline_ops: f64,
) -> Result<()> {
    // A scenario with a baseline of its own (the same work done in raw
    // SQL) is measured against it, right before it.
    let (baseline_name, baseline_ops) = match &scenario.baseline {
        Some(own) => {
            eprintln!("bench: {} with {clients} client(s)", own.name);
            let measured = (own.run)(ctx.clone(), clients)
                .await
                .with_context(|| format!("baseline {} with {clients} client(s)", own.name))?;
            let ops = measured.ops_per_s();
            emit(own.name, clients, &measured, None, own.name, ops);
            *ctx.own_baseline_ops.lock().expect("not poisoned") = Some(ops);
            (own.name, ops)
        }
        None => (BASELINE, baseline_ops),
    };
    eprintln!("bench: {} with {clients} client(s)", scenario.name);
    server.reset_peak_rss();
    let mut measured = Some(
        (scenario.run)(ctx.clone(), clients)
            .await
            .with_context(|| format!("scenario {} with {clients} client(s)", scenario.name))?,
    );
    // A scenario may measure several lines (a move and the move back).
    while let Some(mut run) = measured {
        emit(
            scenario.name,
            run.history.as_ref().map_or(clients, |h| h.clients),
            &run,
            server.peak_rss_mib(),
            baseline_name,
            baseline_ops,
        );
        measured = run.then.take().map(|next| *next);
    }
    Ok(())
}

/// One output line. Field order is the documented one, so a reader scanning
/// the lines by eye finds the figures in the same place on every line.
#[derive(Serialize)]
struct Line<'a> {
    scenario: &'a str,
    clients: usize,
    ops_per_s: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    server_peak_rss_mib: Option<f64>,
    baseline: &'static str,
    baseline_ops_per_s: f64,
    ratio: Option<f64>,
    ops: usize,
    secs: f64,
    /// Open-loop scenarios: the offered load, and what was still queued when
    /// the window closed (a drain that keeps up leaves about one pass).
    #[serde(skip_serializing_if = "Option::is_none")]
    offered_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backlog: Option<i64>,
    /// A conversation move: its direction, what it moved (messages and body
    /// bytes, MB = 10^6 bytes) and how long writes to the thread paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    direction: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mb_per_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    paused_ms: Option<i64>,
    /// A history line: the call, the history it ran against (`small` or
    /// `large`), that history's seed time, and the p99 against each; its
    /// `ratio` is then p99 large ÷ p99 small, not a rate over the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    op: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p99_small_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p99_large_ms: Option<f64>,
    /// A scenario's own fields (capacity, the peer workloads), last.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

fn emit(
    scenario: &str,
    clients: usize,
    run: &Run,
    rss_mib: Option<f64>,
    baseline: &'static str,
    baseline_ops: f64,
) {
    let ops_per_s = run.ops_per_s();
    let line = Line {
        scenario,
        clients,
        ops_per_s: round(ops_per_s, 1),
        p50_ms: run.percentile_ms(50.0).map(|v| round(v, 3)),
        p99_ms: run.percentile_ms(99.0).map(|v| round(v, 3)),
        server_peak_rss_mib: rss_mib.map(|v| round(v, 1)),
        baseline,
        baseline_ops_per_s: round(baseline_ops, 1),
        ratio: match &run.history {
            Some(h) => match (h.p99_small_ms, h.p99_large_ms) {
                (Some(small), Some(large)) if small > 0.0 => Some(round(large / small, 3)),
                _ => None,
            },
            // No ratio to a baseline that did nothing.
            None => (baseline_ops > 0.0).then(|| round(ops_per_s / baseline_ops, 4)),
        },
        ops: run.ops(),
        secs: round(run.secs(), 3),
        offered_per_s: run.offered_per_s.map(|v| round(v, 1)),
        backlog: run.backlog,
        direction: run.migration.as_ref().map(|m| m.direction),
        messages: run.migration.as_ref().map(|m| m.messages),
        bytes: run.migration.as_ref().map(|m| m.bytes),
        mb_per_s: run.migration.as_ref().map(|m| {
            let secs = run.secs();
            round(
                if secs > 0.0 {
                    m.bytes as f64 / 1e6 / secs
                } else {
                    0.0
                },
                3,
            )
        }),
        paused_ms: run.migration.as_ref().map(|m| m.paused_ms),
        op: run.history.as_ref().map(|h| h.op),
        history: run.history.as_ref().map(|h| h.history),
        seed_secs: run.history.as_ref().map(|h| round(h.seed_secs, 1)),
        p99_small_ms: run
            .history
            .as_ref()
            .and_then(|h| h.p99_small_ms)
            .map(|v| round(v, 3)),
        p99_large_ms: run
            .history
            .as_ref()
            .and_then(|h| h.p99_large_ms)
            .map(|v| round(v, 3)),
        extra: run.extra.as_ref(),
    };
    match serde_json::to_string(&line) {
        Ok(text) => println!("{text}"),
        Err(err) => eprintln!("bench: could not encode a line: {err}"),
    }
}

fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}
