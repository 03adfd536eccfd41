//! The storage recount: every team's usage counted again every
//! [`usage::RECOUNT_INTERVAL`], so the quota check every write makes
//! (`store::operations::usage::check_quota`, which reads the last count without a lock)
//! trails what the team stores by at most one interval. Each team's count is
//! one read-only statement and one short upsert; a failed pass is retried on
//! the next tick. Every replica runs it; a count never overwrites a newer one.

use tokio_util::sync::CancellationToken;

use acs_store::Bus;
use acs_store::store::operations::usage;

/// Recount every team each interval (first pass at start) until `shutdown`.
pub fn spawn(bus: Bus, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    super::every(usage::RECOUNT_INTERVAL, shutdown, move || {
        let pool = bus.pool.clone();
        async move {
            if let Err(err) = usage::recount_all(&pool).await {
                tracing::warn!(error = %err, "storage recount failed; retrying next pass");
            }
        }
    })
}
