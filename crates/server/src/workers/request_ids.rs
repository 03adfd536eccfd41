//! The request ids' pruner: every [`INTERVAL`], the ids write tools recorded
//! more than 24 h ago are deleted in batches (`store::requests::prune`). A
//! retry after that runs anew. Every replica runs it; batches skip rows
//! another replica is deleting.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use acs_store::Bus;
use acs_store::store::requests;

/// How often the pruner runs (the first pass at start).
pub const INTERVAL: Duration = Duration::from_secs(600);

/// Prune every [`INTERVAL`] until `shutdown`.
pub fn spawn(bus: Bus, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    super::every(INTERVAL, shutdown, move || {
        let pool = bus.pool.clone();
        async move {
            super::report(
                "request_ids",
                "pruned request ids older than 24 h",
                requests::prune(&pool).await,
            );
        }
    })
}
