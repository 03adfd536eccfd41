//! Closed-loop load: N workers, each doing one operation after another for a
//! fixed window, every operation timed.
//!
//! Workers set up first (connect, log in) and only then start together, so
//! connection setup is never counted as load. A short warm-up at the start of
//! the window is run but not recorded: the first calls pay for cold caches and
//! for pools opening their connections, which is not the steady state we compare.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// How long workers may take to get ready, and to finish their last
/// operation after the window closes, before the run is abandoned.
const SETUP_LIMIT: Duration = Duration::from_secs(60);
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

/// The length of every measured window.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub warmup: Duration,
    pub measure: Duration,
}

impl Timing {
    /// A warm-up of a fifth of the window, at most a second: enough to open
    /// pools and warm caches without eating much of a short run.
    pub fn new(measure: Duration) -> Timing {
        Timing {
            warmup: (measure / 5).min(Duration::from_secs(1)),
            measure,
        }
    }
}

/// Handed to each worker; [`Window::open`] waits for every worker to be ready.
#[derive(Clone)]
pub struct Window {
    start: Arc<Barrier>,
    timing: Timing,
}

impl Window {
    pub async fn open(&self) -> Recorder {
        self.start.wait().await;
        let now = Instant::now();
        let measure_from = now + self.timing.warmup;
        Recorder {
            measure_from,
            deadline: measure_from + self.timing.measure,
            latencies: Vec::new(),
        }
    }
}

/// One worker's stopwatch. Loop `while rec.is_open()`, and after each
/// operation call `rec.record(started)`.
pub struct Recorder {
    measure_from: Instant,
    deadline: Instant,
    latencies: Vec<Duration>,
}

impl Recorder {
    pub fn is_open(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// [`Recorder::is_open`], or fewer than `at_least` operations recorded
    /// yet: for an operation that may outlast the window, which would
    /// otherwise end with nothing measured.
    pub fn wants_more(&self, at_least: usize) -> bool {
        self.is_open() || self.latencies.len() < at_least
    }

    /// Count an operation that began at `started` and has just finished.
    /// Operations begun during the warm-up are not counted.
    pub fn record(&mut self, started: Instant) {
        if started >= self.measure_from {
            self.latencies.push(started.elapsed());
        }
    }

    pub fn finish(self) -> Samples {
        Samples {
            elapsed: Instant::now().saturating_duration_since(self.measure_from),
            latencies: self.latencies,
        }
    }
}

/// What one worker measured.
pub struct Samples {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

/// What all workers of one run measured together.
pub struct Run {
    /// Sorted, for percentiles.
    latencies: Vec<Duration>,
    /// The longest worker's measured time: the last operation may overrun the
    /// window, and the throughput must be over the time really spent.
    elapsed: Duration,
    /// Operations completed in the window, when not one per latency (an
    /// open-loop run times every message it offered, but counts only what
    /// was done inside the window).
    counted: Option<usize>,
    /// For an open-loop run: the offered load, and the work still queued
    /// when the window closed.
    pub offered_per_s: Option<f64>,
    pub backlog: Option<i64>,
    /// A conversation move: what was moved and how long writes paused.
    pub migration: Option<Migration>,
    /// A line of the history benchmark: which call, against which history.
    pub history: Option<History>,
    /// A further line the same scenario measured (the move back).
    pub then: Option<Box<Run>>,
    /// Fields of the scenario's own, added to its line as they are (the
    /// capacity steps' per-tool p99s, the peer workloads' counts).
    pub extra: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What a history line adds: the call measured, its client count (the
/// scenario runs both counts itself), the history it ran against, how long
/// that history took to seed, and the p99 against either history.
#[derive(Clone, Debug)]
pub struct History {
    pub op: &'static str,
    pub clients: usize,
    /// `small` or `large`.
    pub history: &'static str,
    pub seed_secs: f64,
    pub p99_small_ms: Option<f64>,
    pub p99_large_ms: Option<f64>,
}

/// The figures of one conversation move (`migrate_conversation`).
#[derive(Clone, Debug)]
pub struct Migration {
    /// `to_jetstream` or `to_postgres`.
    pub direction: &'static str,
    pub messages: i64,
    pub bytes: i64,
    /// How long writes to the conversation were refused.
    pub paused_ms: i64,
}

impl Run {
    /// An open-loop run: `ops` done within `elapsed`, and the latencies of
    /// the operations offered in that window (sorted here).
    pub fn open_loop(ops: usize, elapsed: Duration, mut latencies: Vec<Duration>) -> Run {
        latencies.sort_unstable();
        Run {
            latencies,
            elapsed,
            counted: Some(ops),
            offered_per_s: None,
            backlog: None,
            migration: None,
            history: None,
            then: None,
            extra: None,
        }
    }

    pub fn ops(&self) -> usize {
        self.counted.unwrap_or(self.latencies.len())
    }

    pub fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64()
    }

    pub fn ops_per_s(&self) -> f64 {
        if self.elapsed.is_zero() {
            return 0.0;
        }
        self.ops() as f64 / self.secs()
    }

    /// Nearest-rank percentile in milliseconds; `None` when nothing completed.
    pub fn percentile_ms(&self, p: f64) -> Option<f64> {
        if self.latencies.is_empty() {
            return None;
        }
        let rank = ((p / 100.0) * self.latencies.len() as f64).ceil() as usize;
        let index = rank.clamp(1, self.latencies.len()) - 1;
        Some(self.latencies[index].as_secs_f64() * 1000.0)
    }
}

/// Run `clients` workers made by `worker(index, window)` and merge what they
/// measured. The first worker error ends the run (the others are aborted), and
/// the whole run is bounded in time even if an operation hangs.
pub async fn closed_loop<F, Fut>(clients: usize, timing: Timing, worker: F) -> Result<Run>
where
    F: Fn(usize, Window) -> Fut,
    Fut: Future<Output = Result<Samples>> + Send + 'static,
{
    let window = Window {
        start: Arc::new(Barrier::new(clients)),
        timing,
    };
    let mut workers = JoinSet::new();
    for index in 0..clients {
        workers.spawn(worker(index, window.clone()));
    }
    let limit = SETUP_LIMIT + timing.warmup + timing.measure + DRAIN_LIMIT;
    let collected = tokio::time::timeout(limit, async {
        let mut latencies = Vec::new();
        let mut elapsed = Duration::ZERO;
        while let Some(joined) = workers.join_next().await {
            let samples = joined.context("a worker panicked")??;
            latencies.extend(samples.latencies);
            elapsed = elapsed.max(samples.elapsed);
        }
        Ok::<_, anyhow::Error>(Run {
            latencies,
            elapsed,
            counted: None,
            offered_per_s: None,
            backlog: None,
            migration: None,
            history: None,
            then: None,
            extra: None,
        })
    })
    .await;
    // Dropping the set aborts any worker still running after an error or a timeout.
    drop(workers);
    let mut run =
        collected.map_err(|_| anyhow!("the run did not finish within {}s", limit.as_secs()))??;
    run.latencies.sort_unstable();
    Ok(run)
}
