//! The publication workers inside `serve`: the outbox drain, the reconciler
//! and the body sweep; `spawn_all`
//! also starts the inbox publisher (`inbox_publisher.rs`).
//!
//! Each is a bounded pass callable from tests and operator commands, and a
//! `spawn` that repeats it until shutdown. Every replica runs every worker:
//! slots are leased with `SKIP LOCKED` and every settlement is fenced by a
//! generation, so N replicas draining one outbox publish each message once
//! and never wait on each other.
//!
//! The drain never holds a database transaction across a publish: it leases
//! a batch in one statement, publishes with nothing held (bounded by a
//! timeout; no answer in time is *uncertain*, not failed, and the slot's next
//! attempt asks the backend by key before publishing again), and settles in
//! short transactions afterwards.

use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use acs_store::Bus;
use acs_store::backend::{AnyBackend, BackendKind, Locator, Published};
use acs_store::error::BusResult;
use acs_store::events::{BusEvent, EventKind};
use acs_store::store::delivery::lost_bodies;
use acs_store::store::delivery::outbox::{self, Lease, Settled};

/// How the drain runs. The defaults are what `serve` uses.
#[derive(Clone, Debug)]
pub struct DrainSettings {
    /// Slots leased per pass (one statement).
    pub batch: i64,
    /// Publishes in flight at once within a pass.
    pub in_flight: usize,
    /// A publish without an answer within this long is marked uncertain.
    pub publish_timeout: Duration,
    /// How long an idle drain sleeps when no event wakes it.
    pub idle_poll: Duration,
    /// Passes one drain runs at once, each leasing its own batch (`SKIP
    /// LOCKED`, so never the same slots): while one settles in PostgreSQL,
    /// another leases or publishes. The work per message is PostgreSQL's
    /// (lease and settle writes); a single pass at a time leaves the broker
    /// idle for most of it.
    pub lanes: usize,
}

impl Default for DrainSettings {
    fn default() -> Self {
        DrainSettings {
            batch: 256,
            in_flight: 256,
            publish_timeout: Duration::from_secs(10),
            idle_poll: Duration::from_millis(500),
            lanes: 4,
        }
    }
}

/// What one drain pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainPass {
    pub leased: usize,
    pub stored: usize,
    pub retrying: usize,
    pub failed: usize,
    /// Put back without spending an attempt: the team's stream is missing or
    /// full (see `Settled::Waiting`).
    pub waiting: usize,
    pub fenced: usize,
}

/// The backends this replica can publish to.
fn publishable(bus: &Bus) -> Vec<BackendKind> {
    BackendKind::ALL
        .into_iter()
        .filter(|kind| bus.backends.require(*kind).is_ok())
        .collect()
}

/// One pass: lease up to a batch of due slots this replica can publish,
/// publish them concurrently with nothing held, settle every outcome.
pub async fn drain_once(bus: &Bus, worker: &str, settings: &DrainSettings) -> BusResult<DrainPass> {
    let names = publishable(bus);
    let leases = outbox::lease_due(&bus.pool, worker, Some(&names), settings.batch).await?;
    let mut pass = DrainPass {
        leased: leases.len(),
        ..DrainPass::default()
    };
    if leases.is_empty() {
        return Ok(pass);
    }
    let attempts: Vec<(Lease, AnyBackend, Published)> = futures::stream::iter(leases)
        .map(|lease| async move {
            let backend = bus.backends.for_message(lease.backend, lease.team_id);
            let outcome = match &backend {
                Ok(backend) => publish_bounded(backend, &lease, settings.publish_timeout).await,
                Err(e) => Published::Retryable(e.to_string()),
            };
            (lease, backend, outcome)
        })
        .buffer_unordered(settings.in_flight.max(1))
        .filter_map(|(lease, backend, outcome)| async move {
            match backend {
                Ok(backend) => Some((lease, backend, outcome)),
                // Only names this replica serves were leased; should the
                // broker have gone away meanwhile, the slot is given back.
                Err(_) => {
                    let why = "this replica can no longer reach the slot's backend";
                    if let Err(e) = outbox::release(&bus.pool, &lease, why).await {
                        tracing::warn!(error = %e, "could not release a slot");
                    }
                    None
                }
            }
        })
        .collect()
        .await;

    // Confirmations settle first, together (one transaction), while their
    // leases are fresh; the rest one by one after, each fenced on its own
    // generation (a last attempt may ask the backend, which takes time).
    let (confirmed, others): (Vec<_>, Vec<_>) = attempts
        .into_iter()
        .partition(|(_, _, outcome)| matches!(outcome, Published::Confirmed(_)));
    let confirmed: Vec<(Lease, Locator)> = confirmed
        .into_iter()
        .filter_map(|(lease, _, outcome)| match outcome {
            Published::Confirmed(locator) => Some((lease, locator)),
            _ => None,
        })
        .collect();
    let stored = outbox::settle_confirmed_batch(&bus.pool, &confirmed).await?;
    pass.fenced += confirmed.len() - stored.len();
    pass.stored += stored.len();
    for (lease, _) in confirmed
        .iter()
        .filter(|(l, _)| stored.contains(&l.message_id))
    {
        announce(bus, lease);
    }
    for (lease, backend, outcome) in others {
        match outbox::settle_attempt(&bus.pool, &backend, &lease, outcome).await {
            Ok(Settled::Stored) => {
                pass.stored += 1;
                announce(bus, &lease);
            }
            Ok(Settled::Retrying { .. }) => pass.retrying += 1,
            Ok(Settled::Failed) => pass.failed += 1,
            Ok(Settled::Waiting) => pass.waiting += 1,
            Ok(Settled::Fenced) => pass.fenced += 1,
            // One slot that cannot be settled now (on a last attempt the
            // backend could not be asked whether it holds the body, O11)
            // costs that slot its lease, never the rest of the pass. It is
            // taken again once its lease runs out; nothing is marked failed.
            Err(e) => tracing::warn!(error = %e, slot = %lease.message_id,
                "could not settle a publication attempt; the slot returns when its lease expires"),
        }
    }
    acs_metrics::record_drain_pass([
        ("stored", pass.stored),
        ("retrying", pass.retrying),
        ("failed", pass.failed),
        ("waiting", pass.waiting),
        ("fenced", pass.fenced),
    ]);
    Ok(pass)
}

/// One attempt (`outbox::attempt`: asking by key first after an unanswered
/// one), bounded: no answer within `limit` is another unanswered attempt.
async fn publish_bounded(backend: &AnyBackend, lease: &Lease, limit: Duration) -> Published {
    match tokio::time::timeout(limit, outbox::attempt(backend, lease)).await {
        Ok(outcome) => outcome,
        Err(_) => Published::Unanswered(format!(
            "the {} backend did not answer within {} s",
            lease.backend,
            limit.as_secs_f64()
        )),
    }
}

/// A stored message is news to readers waiting on the conversation.
fn announce(bus: &Bus, lease: &Lease) {
    let mut event = BusEvent::new(
        lease.team_id,
        EventKind::Conversation,
        lease.message_id.to_string(),
    );
    event.conversation_id = Some(lease.conversation_id);
    bus.events.emit(event);
}

/// Run the drain until `shutdown`: `settings.lanes` lanes, each pass after
/// pass while there is work. An idle lane waits for a wake-up or the idle
/// poll, whichever comes first. One listener per drain turns each outbox
/// event (a send into an outbox on any replica) into a wake-up of *one* idle
/// lane, and a lane that leased a full batch wakes one more, since more is
/// waiting: woken all at once, every lane of every replica ran a lease per
/// send, nearly all of them finding nothing, and the database spent on
/// those leases what the drain needed. Sends on the synchronous path wake no
/// drain. Lanes are independent workers (each its own worker name), exactly
/// as replicas are.
pub fn spawn_drain(
    bus: Bus,
    settings: DrainSettings,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let listener = spawn_wake_listener(&bus, wake.clone(), shutdown.clone());
    let lanes: Vec<_> = (0..settings.lanes.max(1))
        .map(|_| {
            spawn_lane(
                bus.clone(),
                settings.clone(),
                wake.clone(),
                shutdown.clone(),
            )
        })
        .collect();
    tokio::spawn(async move {
        for lane in lanes {
            let _ = lane.await;
        }
        let _ = listener.await;
    })
}

fn spawn_lane(
    bus: Bus,
    settings: DrainSettings,
    wake: std::sync::Arc<tokio::sync::Notify>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // The process id tells which replica holds a slot (`leased_by`), for an
    // operator reading the outbox and for the chaos harness pausing the
    // replica that holds slots; the UUID keeps lanes and hosts apart.
    let worker = format!("drain-{}-{}", std::process::id(), Uuid::new_v4().simple());
    tokio::spawn(async move {
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let leased = match drain_once(&bus, &worker, &settings).await {
                Ok(pass) => pass.leased,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox drain pass failed; retrying");
                    0
                }
            };
            if leased > 0 {
                if leased as i64 >= settings.batch {
                    wake.notify_one();
                }
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(settings.idle_poll) => {}
                _ = wake.notified() => {}
            }
        }
    })
}

/// Wake one idle lane per outbox event (or, when events were dropped, once:
/// something happened).
fn spawn_wake_listener(
    bus: &Bus,
    wake: std::sync::Arc<tokio::sync::Notify>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let mut events = bus.events.subscribe();
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = events.recv() => event,
            };
            match event {
                Ok(event) if event.kind == EventKind::Outbox => wake.notify_one(),
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => wake.notify_one(),
                // Closed: the lanes fall back to the idle poll.
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    shutdown.cancelled().await;
                    return;
                }
            }
        }
    })
}

/// How often the reconciler asks about uncertain publications.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(30);

/// One reconciler pass: for every team and backend with an uncertain
/// publication that this replica can reach, ask the backend and settle.
/// Returns how many became stored.
pub async fn reconcile_once(bus: &Bus) -> BusResult<usize> {
    let mut resolved = 0;
    for (team_id, name) in outbox::teams_with_uncertain(&bus.pool).await? {
        let Ok(backend) = bus.backends.for_message(name, team_id) else {
            continue;
        };
        match outbox::resolve_uncertain(&bus.pool, &backend, team_id).await {
            Ok(n) => resolved += n,
            // One team's backend not answering does not stop the others.
            Err(e) => tracing::warn!(error = %e, %team_id, backend = %name,
                "could not resolve uncertain publications; retrying next pass"),
        }
    }
    acs_metrics::record_reconciled(resolved);
    Ok(resolved)
}

/// How often the body sweep runs, and the grace before a body may go.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
pub const SWEEP_GRACE_SECS: i64 = 300;

/// Run `pass` every `interval` until `shutdown`, logging what it did.
fn spawn_periodic<F, Fut>(
    name: &'static str,
    interval: Duration,
    shutdown: CancellationToken,
    mut pass: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = BusResult<u64>> + Send,
{
    super::every(interval, shutdown, move || {
        let pass = pass();
        async move { super::report(name, "pass done", pass.await) }
    })
}

/// Start every publication worker of this replica.
pub fn spawn_all(bus: Bus, shutdown: CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles = vec![spawn_drain(
        bus.clone(),
        DrainSettings::default(),
        shutdown.clone(),
    )];
    let reconciler = bus.clone();
    handles.push(spawn_periodic(
        "reconciler",
        RECONCILE_INTERVAL,
        shutdown.clone(),
        move || {
            let bus = reconciler.clone();
            async move { reconcile_once(&bus).await.map(|n| n as u64) }
        },
    ));
    handles.push(super::inbox_publisher::spawn(bus.clone(), shutdown.clone()));
    let sweeper = bus;
    handles.push(spawn_periodic(
        "body sweep",
        SWEEP_INTERVAL,
        shutdown,
        move || {
            let bus = sweeper.clone();
            async move {
                let released = outbox::release_published_bodies(
                    &bus.pool,
                    &bus.backends,
                    None,
                    SWEEP_GRACE_SECS,
                )
                .await?;
                // Bodies of re-created streams are recorded lost even if
                // nobody reads them (issue 15, item 4).
                let lost =
                    lost_bodies::tombstone_bodies_of_replaced_streams(&bus.pool, &bus.backends)
                        .await?;
                acs_metrics::record_bodies_swept(released + lost);
                Ok(released + lost)
            }
        },
    ));
    handles
}
