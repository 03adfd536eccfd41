//! `scripts/chaos [--quick|--long] [--seed N]`: the bus's promises checked
#![allow(dead_code)] // skeleton: the parts fill in (remove once built)
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
//! It is a test target without libtest (`harness = false`), so plain
//! `cargo test` runs the quick profile with a fixed seed, and a name filter
//! that does not match `chaos` skips it, as libtest would.

mod checker;
mod cluster;
mod faults;
mod history;
mod model;
mod workload;

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
    /// Task leases, shorter than the faults.
    pub lease_secs: u64,
}

const QUICK: Profile = Profile {
    name: "quick",
    load: Duration::from_secs(150),
    quiet: Duration::from_secs(30),
    clients: 12,
    lease_secs: 5,
};

const LONG: Profile = Profile {
    name: "long",
    load: Duration::from_secs(25 * 60),
    quiet: Duration::from_secs(60),
    clients: 16,
    lease_secs: 5,
};

struct Args {
    profile: Profile,
    seed: u64,
}

enum Parsed {
    Run(Args),
    /// A name filter (`cargo test proxy`) that does not select this target.
    FilteredOut,
}

fn parse(args: impl Iterator<Item = String>) -> anyhow::Result<Parsed> {
    let mut profile = QUICK;
    let mut seed = CI_SEED;
    let mut filters = Vec::new();
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => profile = QUICK,
            "--long" => profile = LONG,
            "--seed" => {
                let value = args.next().context("--seed needs a number: --seed 42")?;
                seed = value
                    .parse()
                    .with_context(|| format!("--seed {value:?} is not a whole number"))?;
            }
            // What cargo and libtest pass to every test binary.
            "--nocapture" | "--quiet" | "-q" | "--color" | "--test-threads" => {
                if matches!(arg.as_str(), "--color" | "--test-threads") {
                    args.next();
                }
            }
            flag if flag.starts_with("--") => {
                bail!("unknown flag {flag}: use --quick, --long or --seed N")
            }
            filter => filters.push(filter.to_string()),
        }
    }
    if !filters.is_empty() && !filters.iter().any(|f| "chaos".contains(f.as_str())) {
        return Ok(Parsed::FilteredOut);
    }
    Ok(Parsed::Run(Args { profile, seed }))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::FilteredOut) => {
            println!("chaos: filtered out");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("chaos: {e:#}");
            return ExitCode::from(2);
        }
    };
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

    let mut cluster = cluster::Cluster::start(&profile).await?;
    let outcome = async {
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
        let applied = faults::inject(&mut cluster, &schedule, clock).await;
        load.await.context("the workload panicked")??;
        workload::settle(&target, &fixture, &history, profile.quiet).await?;
        let report = checker::check(&target, &fixture, &history, &applied).await?;
        report.print(args.seed, &profile, &schedule, &applied);
        anyhow::Ok(report.violations.is_empty())
    }
    .await;
    cluster.stop().await;
    outcome
}
