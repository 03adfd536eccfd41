//! The presence sweeper: deletes presence rows dead for longer than a
//! retention, so the table holds recent windows rather than every label ever
//! used.
//!
//! A dead row is kept for a while on purpose: `list_agents` and
//! `list_sessions` answer "when was this window last seen?" from it. Deleting
//! goes in bounded batches (short transactions, no long lock on the table),
//! and rows a heartbeat is reviving are skipped, never waited on.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::Bus;
use crate::error::BusResult;
use crate::store::presence;

/// How long a dead window stays listed before it is deleted.
pub const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Rows deleted per statement.
pub const BATCH: i64 = 500;
/// Time between passes.
pub const INTERVAL: Duration = Duration::from_secs(10 * 60);
/// At most this many batches per pass; the rest waits for the next pass.
const MAX_BATCHES_PER_PASS: usize = 100;

/// One pass: delete rows dead for longer than `retention`, `batch` at a time,
/// until none is left (or the per-pass bound is reached). Returns how many
/// rows were deleted.
pub async fn sweep(pool: &PgPool, retention: Duration, batch: i64) -> BusResult<u64> {
    let mut total = 0;
    for _ in 0..MAX_BATCHES_PER_PASS {
        let deleted = presence::delete_dead_batch(pool, retention, batch).await?;
        total += deleted;
        if deleted < batch as u64 {
            break;
        }
    }
    Ok(total)
}

/// Run [`sweep`] every [`INTERVAL`] (first pass at start) until `shutdown`.
pub fn spawn(bus: Bus, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            match sweep(&bus.pool, RETENTION, BATCH).await {
                Ok(0) => {}
                Ok(deleted) => {
                    tracing::info!(deleted, "presence sweeper deleted long-dead windows")
                }
                // The next pass retries; nothing is lost by waiting.
                Err(err) => {
                    tracing::warn!(error = %err, "presence sweep failed; retrying next pass")
                }
            }
        }
    })
}
