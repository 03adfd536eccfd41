//! Departures: the claimed tasks of windows that left (`session_end`, their
//! proxy exiting: `heartbeat {offline: true}`) go back to the queue once the
//! window has stayed away for a grace (`serve --task-release-grace-secs`,
//! default [`GRACE`]), each with a `released` event that names the window
//! and why (`holdings::release_tasks_of_departed`). A window back within the
//! grace (a heartbeat, which its proxy sends at start, or a write on the
//! task) keeps them. Its locks and path reservations were released when it
//! left; a revoked window's tasks were released when it was revoked.
//!
//! Bounded batches, rows being changed skipped rather than waited on, so
//! every replica can run it at once.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use acs_store::Bus;
use acs_store::error::BusResult;
use acs_store::store::messaging::holdings;

/// How long a window that left may take to come back before its claimed
/// tasks are released.
pub const GRACE: Duration = Duration::from_secs(600);
/// Time between passes.
pub const INTERVAL: Duration = Duration::from_secs(30);
/// Tasks released per statement.
pub const BATCH: i64 = 100;
/// At most this many batches per pass; the rest waits for the next pass.
const BATCHES_PER_PASS_MAX: usize = 50;

/// How the departures pass runs. The defaults are what `serve` uses (its
/// `--task-release-grace-secs` sets `grace`).
#[derive(Clone, Debug)]
pub struct DepartureSettings {
    /// Time between passes (the first pass is at start).
    pub interval: Duration,
    /// How long a window that left may take to come back.
    pub grace: Duration,
    /// Tasks released per statement.
    pub batch: i64,
}

impl Default for DepartureSettings {
    fn default() -> Self {
        DepartureSettings {
            interval: INTERVAL,
            grace: GRACE,
            batch: BATCH,
        }
    }
}

/// One pass: release the claimed tasks of windows away for longer than
/// `grace`, `batch` at a time, within the per-pass bound. Returns the keys
/// released.
pub async fn run_once(pool: &PgPool, grace: Duration, batch: i64) -> BusResult<Vec<String>> {
    let mut released = Vec::new();
    for _ in 0..BATCHES_PER_PASS_MAX {
        let keys = holdings::release_tasks_of_departed(pool, grace, batch).await?;
        let done = (keys.len() as i64) < batch;
        released.extend(keys);
        if done {
            break;
        }
    }
    Ok(released)
}

/// Run [`run_once`] every `settings.interval` (first pass at start) until
/// `shutdown`.
pub fn spawn(
    bus: Bus,
    settings: DepartureSettings,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            match run_once(&bus.pool, settings.grace, settings.batch).await {
                Ok(keys) if keys.is_empty() => {}
                Ok(keys) => tracing::info!(
                    released = keys.len(),
                    "released the claimed tasks of windows that left and did not come back"
                ),
                // The next pass retries; the tasks stay claimed meanwhile.
                Err(err) => {
                    tracing::warn!(error = %err, "departures pass failed; retrying next pass")
                }
            }
        }
    })
}
