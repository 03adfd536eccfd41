//! The overdue-acknowledgement worker: every [`INTERVAL`], one pass of
//! `acks::overdue::fire_overdue`, which queues the `ack.overdue` webhook
//! event once per (message, debtor) whose due time passed without an ack
//! (the claim and the deliveries are one statement; concurrent replicas skip
//! each other's rows, see that module). The dispatcher sends them.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use acs_store::store::messaging::acks::overdue;

/// Time between passes: an overdue ack is reported within about this long
/// of its due time (plus the dispatcher's poll).
pub const INTERVAL: Duration = Duration::from_secs(2);

/// One pass (tests and operators may call it directly).
pub async fn pass(pool: &PgPool) -> acs_store::error::BusResult<u64> {
    overdue::fire_overdue(pool, overdue::FIRE_BATCH).await
}

/// Run a pass every [`INTERVAL`] until `shutdown`.
pub fn spawn(pool: PgPool, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    super::every(INTERVAL, shutdown, move || {
        let pool = pool.clone();
        async move {
            super::report(
                "ack_overdue",
                "ack.overdue events queued",
                pass(&pool).await,
            );
        }
    })
}
