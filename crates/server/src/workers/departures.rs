//! Departures: the claimed tasks of windows that left (`session_end`, their
//! proxy exiting: `heartbeat {offline: true}`) go back to the queue once the
//! window has stayed away for a grace (`serve --task-release-grace-secs`,
//! default [`GRACE`]), each with a `released` event that names the window
//! and why (`holdings::release_tasks_of_departed`). A window back within the
//! grace (a heartbeat, which its proxy sends at start, or a write on the
//! task) keeps them. Its locks and path reservations were released when it
//! left.
//!
//! The same pass releases what a window revoked by `revoke_session` holds
//! (tasks, locks, reservations) once it has stayed revoked for
//! [`REVOKED_SETTLE`]: a proxy that restarts revokes its window and
//! registers the same label again at once, and keeps its work
//! (`holdings::release_revoked_windows`). A revoked token or a disabled
//! agent releases its windows' holdings in its own transaction.
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
/// How long a window revoked by `revoke_session` stays so before what it
/// holds is released (a take-over registers the label again within
/// milliseconds).
pub const REVOKED_SETTLE: Duration = Duration::from_secs(10);
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
    /// How long a revoked window stays so before its holdings are released.
    pub revoked_settle: Duration,
    /// Tasks released per statement.
    pub batch: i64,
}

impl Default for DepartureSettings {
    fn default() -> Self {
        DepartureSettings {
            interval: INTERVAL,
            grace: GRACE,
            revoked_settle: REVOKED_SETTLE,
            batch: BATCH,
        }
    }
}

/// One pass: release the claimed tasks of windows away for longer than
/// the grace, then what windows revoked for longer than the settle hold,
/// `batch` at a time, within the per-pass bound. Returns the keys of the
/// tasks released.
pub async fn run_once(pool: &PgPool, settings: &DepartureSettings) -> BusResult<Vec<String>> {
    let mut released = Vec::new();
    for _ in 0..BATCHES_PER_PASS_MAX {
        let keys =
            holdings::release_tasks_of_departed(pool, settings.grace, settings.batch).await?;
        let done = (keys.len() as i64) < settings.batch;
        released.extend(keys);
        if done {
            break;
        }
    }
    for _ in 0..BATCHES_PER_PASS_MAX {
        let (windows, freed) =
            holdings::release_revoked_windows(pool, settings.revoked_settle, settings.batch)
                .await?;
        released.extend(freed.tasks);
        if (windows as i64) < settings.batch {
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
    let interval = settings.interval;
    super::every_with(interval, bus, settings, shutdown, async |pool, settings| {
        // A failed pass leaves the tasks claimed until the next one.
        super::report(
            "departures",
            "released the claimed tasks of windows that left and did not come back, or \
             were revoked",
            run_once(&pool, &settings)
                .await
                .map(|keys| keys.len() as u64),
        );
    })
}
