//! The presence sweeper: deletes presence rows dead for longer than a
//! retention, so the table holds recent windows rather than every label ever
//! used; and releases inbox references owed to windows dead for longer than
//! the inbox retention (`serve --inbox-retention-hours`), so references owed
//! to windows that never come back do not grow without bound; and deletes
//! the path reservations of windows whose presence expired (the idle
//! timeout: they stopped beating or left) and those whose own time ran out
//! ([`release_reservations`]).
//!
//! A dead row is kept for a while on purpose: `list_agents` and
//! `list_sessions` answer "when was this window last seen?" from it. Deleting
//! goes in bounded batches (short transactions, no long lock on the table),
//! and rows a heartbeat is reviving are skipped, never waited on.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use acs_store::Bus;
use acs_store::error::BusResult;
use acs_store::store::conversations::inbox;
use acs_store::store::messaging::{holdings, presence};

/// How long a dead window stays listed before it is deleted.
pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Rows deleted per statement.
pub const BATCH: i64 = 500;
/// Time between passes.
pub const INTERVAL: Duration = Duration::from_secs(10 * 60);
/// At most this many batches per pass; the rest waits for the next pass.
const BATCHES_PER_PASS_MAX: usize = 100;

/// One pass: delete rows dead for longer than `retention`, `batch` at a time,
/// until none is left (or the per-pass bound is reached). Returns how many
/// rows were deleted.
pub async fn sweep(pool: &PgPool, retention: Duration, batch: i64) -> BusResult<u64> {
    let mut total = 0;
    for _ in 0..BATCHES_PER_PASS_MAX {
        let deleted = presence::delete_dead_batch(pool, retention, batch).await?;
        total += deleted;
        if deleted < batch as u64 {
            break;
        }
    }
    Ok(total)
}

/// How long references stay owed to a dead window by default (`serve
/// --inbox-retention-hours`).
pub const INBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// One pass: release references owed to windows dead for longer than
/// `retention`, `batch` at a time, within the same per-pass bound. Returns
/// how many were released; their receipts stay.
pub async fn release_inbox(pool: &PgPool, retention: Duration, batch: i64) -> BusResult<u64> {
    let mut total = 0;
    for _ in 0..BATCHES_PER_PASS_MAX {
        let released = inbox::release_owed_to_dead_windows(pool, retention, batch).await?;
        total += released;
        if released < batch as u64 {
            break;
        }
    }
    Ok(total)
}

/// One pass: delete the reservations of windows whose presence expired and
/// those expired themselves, `batch` at a time, within the same per-pass
/// bound. Returns how many were deleted.
pub async fn release_reservations(pool: &PgPool, batch: i64) -> BusResult<u64> {
    let mut total = 0;
    for _ in 0..BATCHES_PER_PASS_MAX {
        let deleted = holdings::release_reservations_of_gone(pool, batch).await?;
        total += deleted;
        if deleted < batch as u64 {
            break;
        }
    }
    Ok(total)
}

/// How the sweeper runs. The defaults are what `serve` uses (its
/// `--inbox-retention-hours` sets `inbox_retention`).
#[derive(Clone, Debug)]
pub struct SweeperSettings {
    /// Time between passes (the first pass is at start).
    pub interval: Duration,
    /// How long a dead window stays listed ([`sweep`]).
    pub retention: Duration,
    /// How long references stay owed to a dead window ([`release_inbox`]).
    pub inbox_retention: Duration,
    /// Rows deleted or released per statement.
    pub batch: i64,
}

impl Default for SweeperSettings {
    fn default() -> Self {
        SweeperSettings {
            interval: INTERVAL,
            retention: RETENTION,
            inbox_retention: INBOX_RETENTION,
            batch: BATCH,
        }
    }
}

/// Run [`sweep`], [`release_inbox`] and [`release_reservations`] every `settings.interval` (first
/// pass at start) until `shutdown`.
pub fn spawn(
    bus: Bus,
    settings: SweeperSettings,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let interval = settings.interval;
    super::every_with(interval, bus, settings, shutdown, async |pool, settings| {
        let deleted = sweep(&pool, settings.retention, settings.batch).await;
        super::report("presence sweeper", "deleted long-dead windows", deleted);
        let freed = release_reservations(&pool, settings.batch).await;
        super::report(
            "presence sweeper",
            "deleted the path reservations of windows gone idle, and expired ones",
            freed,
        );
        let released = release_inbox(&pool, settings.inbox_retention, settings.batch).await;
        super::report(
            "presence sweeper",
            "released inbox references owed to long-dead windows (their receipts stay)",
            released,
        );
    })
}
