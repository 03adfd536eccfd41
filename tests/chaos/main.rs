//! `scripts/chaos [--quick|--long] [--seed N]`: the bus's promises checked
//! under faults, in the style of queue chaos harnesses and Jepsen analyses.
//!
//! One run starts PostgreSQL, a 3-node NATS cluster with JetStream and 3
//! `serve` replicas on loopback ([`cluster`]); runs concurrent clients that
//! pick replicas at random and record every operation with its invocation
//! and completion times ([`workload`], [`history`]); injects faults on a
//! schedule drawn from the seed ([`faults`]); lets the system go quiet; then
//! reads the whole history beside the database and the streams
//! ([`checker`]) and prints a table and a JSON summary. Any violation exits
//! non-zero, naming the operation and the seed that reproduces the schedule.
//!
//! `--print-schedule` prints the seed's fault schedule without running;
//! `--self-test` runs only the checker's self-test (a made-up history with
//! every kind of breakage, no servers) and exits.
//!
//! It is a test target without libtest (`harness = false`), so plain
//! `cargo test` runs the quick profile with a fixed seed, and a name filter
//! that does not match `chaos` skips it, as libtest would.

mod checker;
mod cluster;
mod faults;
mod history;
mod model;
mod workload;

/// The suite's 3-node JetStream cluster on loopback.
#[path = "../suite/support/nats_cluster.rs"]
mod nats_cluster;
/// The suite's fault proxy, as each replica's relay to PostgreSQL and NATS.
#[allow(dead_code)] // shared with the suite; a run needs only some of it
#[path = "../suite/support/proxy.rs"]
mod relay;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The seed CI runs with (`cargo test`, `scripts/test`).
const CI_SEED: u64 = 20_261_203;

/// How long a run loads the bus and how long it lets it go quiet.
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    pub name: &'static str,
    /// Clients issue operations and faults are injected for this long.
    pub load: Duration,
    /// Then no faults, every fault healed, clients finish and drain.
    pub quiet: Duration,
    /// Concurrent clients.
    pub clients: usize,
    /// Up to this much longer than its floor each fault may last: the long
    /// profile's faults reach past the task lease
    /// ([`ai_crew_sync::store::tasks::LEASE_MIN_SECS`], what every client
    /// claims with), the quick profile's mostly do not.
    pub fault_spread_ms: u64,
}

const QUICK: Profile = Profile {
    name: "quick",
    load: Duration::from_secs(165),
    quiet: Duration::from_secs(30),
    clients: 12,
    fault_spread_ms: 3_000,
};

const LONG: Profile = Profile {
    name: "long",
    load: Duration::from_secs(25 * 60),
    quiet: Duration::from_secs(60),
    clients: 16,
    fault_spread_ms: 30_000,
};

struct Args {
    profile: Profile,
    seed: u64,
    /// `--print-schedule`: print the seed's fault schedule and exit.
    schedule_only: bool,
    /// `--self-test`: run the checker's self-test and exit.
    self_test_only: bool,
}

enum Parsed {
    Run(Args),
    /// A name filter (`cargo test proxy`), `--skip chaos`, `--ignored` or
    /// `--bench` (`cargo bench`): libtest would run nothing here either.
    FilteredOut,
    /// `cargo test -- --list`.
    List,
}

/// libtest's flags that take a value (`--flag V` or `--flag=V`).
const LIBTEST_VALUED: &[&str] = &[
    "--color",
    "--test-threads",
    "--format",
    "--logfile",
    "--skip",
    "--shuffle-seed",
    "-Z",
];

fn parse(args: impl Iterator<Item = String>) -> anyhow::Result<Parsed> {
    let mut profile = QUICK;
    let mut seed = CI_SEED;
    let mut filters = Vec::new();
    let mut skips = Vec::new();
    let mut exact = false;
    let mut skip_all = false;
    let mut list = false;
    let mut schedule_only = false;
    let mut self_test_only = false;
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with('-') => (flag, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        match flag {
            "--quick" => profile = QUICK,
            "--long" => profile = LONG,
            "--seed" => {
                let value = inline
                    .or_else(|| args.next())
                    .context("--seed needs a number: --seed 42")?;
                seed = value
                    .parse()
                    .with_context(|| format!("--seed {value:?} is not a whole number"))?;
            }
            flag if LIBTEST_VALUED.contains(&flag) => {
                let value = inline.or_else(|| args.next()).unwrap_or_default();
                if flag == "--skip" {
                    skips.push(value);
                }
            }
            "--print-schedule" => schedule_only = true,
            "--self-test" => self_test_only = true,
            "--list" => list = true,
            "--exact" => exact = true,
            // Only ignored tests, or only benchmarks: this is neither.
            "--ignored" | "--bench" => skip_all = true,
            // What else cargo and libtest pass to every test binary.
            "--nocapture"
            | "--no-capture"
            | "--show-output"
            | "--quiet"
            | "-q"
            | "--include-ignored"
            | "--test"
            | "--report-time"
            | "--shuffle"
            | "--force-run-in-process" => {}
            flag if flag.starts_with('-') => {
                bail!(
                    "unknown flag {flag}: use --quick, --long, --seed N, --print-schedule or \
                     --self-test"
                )
            }
            filter => filters.push(filter.to_string()),
        }
    }
    let matches = |f: &String| {
        if exact {
            f == "chaos"
        } else {
            "chaos".contains(f.as_str())
        }
    };
    if list {
        return Ok(Parsed::List);
    }
    if skip_all
        || skips.iter().any(matches)
        || (!filters.is_empty() && !filters.iter().any(matches))
    {
        return Ok(Parsed::FilteredOut);
    }
    Ok(Parsed::Run(Args {
        profile,
        seed,
        schedule_only,
        self_test_only,
    }))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::FilteredOut) => {
            println!("chaos: filtered out");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::List) => {
            println!("chaos: test");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("chaos: {e:#}");
            return ExitCode::from(2);
        }
    };
    if args.self_test_only {
        return match checker::self_test() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("chaos: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if args.schedule_only {
        let schedule = faults::Schedule::draw(args.seed, &args.profile);
        println!(
            "{} profile, seed {}:\n{schedule}",
            args.profile.name, args.seed
        );
        return ExitCode::SUCCESS;
    }
    // reqwest is built without a default TLS provider (the clients speak
    // plain HTTP on loopback, but a client cannot be built without one).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "chaos: violations found; reproduce with scripts/chaos --{} --seed {}",
                args.profile.name, args.seed
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!(
                "chaos: the run could not complete (seed {}): {e:#}",
                args.seed
            );
            ExitCode::FAILURE
        }
    }
}

/// One run; Ok(false) when the checker found a violation.
async fn run(args: &Args) -> anyhow::Result<bool> {
    let clock = model::Clock::start();
    let profile = args.profile;
    eprintln!(
        "chaos: {} profile, seed {}, {} s of load then {} s quiet",
        profile.name,
        args.seed,
        profile.load.as_secs(),
        profile.quiet.as_secs()
    );
    let schedule = faults::Schedule::draw(args.seed, &profile);
    eprintln!("chaos: fault schedule\n{schedule}");

    let mut cluster = tokio::select! {
        started = cluster::Cluster::start(&profile) => started?,
        signal = interrupted() => bail!("interrupted by {signal} while starting"),
    };
    let work = async {
        let target = cluster.target();
        let fixture = workload::prepare(&target, &profile).await?;
        let history = history::History::new(clock);
        let load = tokio::spawn(workload::run(
            target.clone(),
            fixture.clone(),
            history.clone(),
            args.seed,
            profile,
        ));
        let applied = match faults::inject(&mut cluster, &schedule, clock).await {
            Ok(applied) => applied,
            Err(e) => {
                load.abort();
                return Err(e);
            }
        };
        load.await.context("the workload panicked")??;
        workload::settle(&target, &fixture, &history, profile.quiet).await?;
        let report = checker::check(&target, &fixture, &history, &applied).await?;
        report.print(args.seed, &profile, &schedule, &applied);
        anyhow::Ok(report.violations.is_empty())
    };
    let outcome = tokio::select! {
        outcome = work => outcome,
        signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    let failed = !matches!(outcome, Ok(true));
    if failed {
        cluster.print_logs();
        eprintln!(
            "chaos: the fault schedule of seed {}:\n{schedule}",
            args.seed
        );
    }
    cluster.stop(failed).await;
    outcome
}

/// SIGINT or SIGTERM: the run ends early and still stops everything it
/// started (the replicas and NATS nodes are its children; PostgreSQL is not).
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
