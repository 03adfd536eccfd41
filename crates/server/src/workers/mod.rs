//! Background loops. Each one is a plain function that does one bounded pass
//! (callable from tests and operator commands) and a `spawn` that runs it
//! periodically until shutdown. Every replica runs every worker: passes are
//! written so that concurrent replicas skip each other's rows instead of
//! waiting on them.

pub mod ack_overdue;
pub mod departures;
pub mod inbox_publisher;
pub mod presence_sweeper;
pub mod publication;
pub mod request_ids;
pub mod storage_recount;
pub mod webhook_dispatcher;

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use acs_store::Bus;
use acs_store::error::BusResult;
use sqlx::PgPool;

/// Run `pass` every `interval` (the first at start) until `shutdown`: the
/// one loop of every periodic worker. A late tick is delayed, never
/// bunched; a pass in progress finishes before shutdown is seen.
pub(crate) fn every<F, Fut>(
    interval: Duration,
    shutdown: CancellationToken,
    mut pass: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            pass().await;
        }
    })
}

/// [`every`] for a worker with settings: each pass gets the pool and its
/// own copy of `settings`.
pub(crate) fn every_with<S, F, Fut>(
    interval: Duration,
    bus: Bus,
    settings: S,
    shutdown: CancellationToken,
    pass: F,
) -> JoinHandle<()>
where
    S: Clone + Send + 'static,
    F: Fn(PgPool, S) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    every(interval, shutdown, move || {
        pass(bus.pool.clone(), settings.clone())
    })
}

/// Log one pass of `worker`: nothing when it changed nothing, `done` with
/// its count, or the failure (the next pass retries; nothing is lost by
/// waiting).
pub(crate) fn report(worker: &'static str, done: &'static str, outcome: BusResult<u64>) {
    match outcome {
        Ok(0) => {}
        Ok(n) => tracing::info!(worker, n, "{done}"),
        Err(error) => {
            tracing::warn!(worker, %error, "pass failed; retrying next pass")
        }
    }
}
