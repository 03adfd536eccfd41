//! The LISTEN/NOTIFY hub: wakes long polls on every replica.
//!
//! Writers call [`Events::emit`] *after* their transaction commits. Emitting
//! only queues the event: one publisher task per process drains the queue and
//! sends whatever has accumulated as one `pg_notify` per ~8 KB, outside every
//! hot transaction. (A `pg_notify` inside each write transaction serialises
//! commits on PostgreSQL's notify queue lock; measured here it cut durable
//! write throughput about 5x under concurrency.)
//!
//! One LISTEN connection per process receives every replica's events and fans
//! them out in-process through a broadcast channel. Payloads carry ids and
//! routing facts only, never content: a waiter re-reads what it may see from
//! the database. A lost notification (listener reconnecting, queue overflow)
//! only delays a wake, because waiters also re-check the database on a timer.
//!
//! The publisher sends an empty ping every `ping` interval, so the listener
//! can tell `live` (hearing pings) from `silent` (connected, hearing nothing)
//! and `detached` (no connection; it reconnects by itself).
//!
//! The same channel carries one more item, `{"k":"credentials","i":id}`,
//! which no waiter sees: the SQL function `lock_agent_credentials` (migration
//! 0024) queues it inside every transaction that takes a credential away, and
//! [`notify_access_changed`] inside one that switches a team's conversation
//! capability, so it is delivered at that commit, whichever process (a
//! replica, the CLI) made it. Hearing one bumps [`Events::credentials_generation`], which
//! empties every credential cache keyed on it ([`crate::auth::cache`]); so do
//! a lost and a regained connection, since notifications sent meanwhile are
//! gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::auth::cache::CredentialCache;

mod waiters;
pub use waiters::{Filter, Lagged, Waiter};

/// The PostgreSQL notification channel.
pub const CHANNEL: &str = "bus_events";
/// The `k` of the item that says an agent's credentials changed (see the
/// module docs); not a [`BusEvent`].
const CREDENTIALS_KIND: &str = "credentials";
/// PostgreSQL refuses payloads of 8000 bytes or more; stay well under.
const PAYLOAD_MAX_BYTES: usize = 7_000;
const FANOUT_CAPACITY: usize = 4_096;
/// How long the publisher lets events gather after the first one.
const COALESCE_FOR: Duration = Duration::from_millis(2);

acs_wire::text_enum! {
    pub enum EventKind {
        Message = "message",
        Task = "task",
        Lock = "lock",
        Note = "note",
        /// Path reservations taken, extended or released (id = a pattern,
        /// and how many more the call changed).
        Reservation = "reservation",
        /// A conversation message was sent (id = message id, `c` = conversation).
        /// Routing is by membership, which only the database knows: a conversation
        /// waiter re-checks its receipts on every one of these. One event may stand
        /// for several sends of its team published together; then `c` and the
        /// actor are absent where those differed (see `add_to_batch`).
        Conversation = "conversation",
        /// A message was accepted into an outbox (id = message id, `c` =
        /// conversation): work for the publication drain, which wakes on these
        /// only, not on every send. Merged per team like `Conversation`.
        Outbox = "outbox",
    }
}

/// One change, as ids and routing facts. Short field names: many fit in one
/// notification.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct BusEvent {
    #[serde(rename = "t")]
    pub team_id: Uuid,
    #[serde(rename = "k")]
    pub kind: EventKind,
    /// The changed object: a message id, task key, lock name, note key or
    /// reservation pattern.
    #[serde(rename = "i")]
    pub id: String,
    /// The agent that made the change, so a window is not woken by itself.
    #[serde(rename = "a", default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<Uuid>,
    #[serde(rename = "as", default, skip_serializing_if = "Option::is_none")]
    pub actor_session: Option<String>,
    /// Messages: the channel (absent for a direct message).
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub channel_id: Option<Uuid>,
    /// Conversation and outbox events: the conversation.
    #[serde(rename = "cv", default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<Uuid>,
    /// Direct messages: the recipient agent, and its window (absent = every window).
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<Uuid>,
    #[serde(rename = "rs", default, skip_serializing_if = "Option::is_none")]
    pub recipient_session: Option<String>,
    /// Channel announcements reach every window whatever it is focused on.
    #[serde(rename = "n", default, skip_serializing_if = "std::ops::Not::not")]
    pub announce: bool,
}

impl BusEvent {
    /// An event of `kind` about `id` in `team_id`, made by `actor`; routing
    /// fields are filled in by the caller where they apply.
    pub fn new(team_id: Uuid, kind: EventKind, id: impl Into<String>) -> BusEvent {
        BusEvent {
            team_id,
            kind,
            id: id.into(),
            actor: None,
            actor_session: None,
            channel_id: None,
            conversation_id: None,
            recipient: None,
            recipient_session: None,
            announce: false,
        }
    }

    pub fn by(mut self, me: &crate::auth::Identity) -> BusEvent {
        self.actor = Some(me.agent_id);
        self.actor_session = Some(me.window.clone());
        self
    }
}

/// What the listener knows about its connection, for `/health`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerState {
    Live,
    Silent,
    Detached,
}

const DETACHED: u8 = 0;
const ATTACHED: u8 = 1;

struct Inner {
    outgoing: mpsc::UnboundedSender<BusEvent>,
    fanout: broadcast::Sender<Arc<BusEvent>>,
    attached: AtomicU8,
    /// Unix millis of the last notification (or ping) heard.
    last_heard_ms: AtomicI64,
    ping: Duration,
    /// Bumped whenever a credential may have changed unseen: a credentials
    /// notification, the listener attaching or detaching.
    credentials_generation: AtomicU64,
    /// What is cached under that generation.
    credentials: CredentialCache,
    /// The long polls' subscriptions ([`Events::wait_for`]).
    waiters: Arc<waiters::Waiters>,
}

/// The hub of one process. Cheap to clone.
#[derive(Clone)]
pub struct Events {
    inner: Arc<Inner>,
}

impl Events {
    /// Start the publisher and the listener on `pool`; both stop with
    /// `stop`, the publisher after sending what was queued before it (so a
    /// write committed while the server finishes its last requests still
    /// wakes the waits on other replicas). Their handles, to wait for them.
    pub fn start(
        pool: PgPool,
        ping: Duration,
        stop: CancellationToken,
    ) -> (Events, Vec<tokio::task::JoinHandle<()>>) {
        let (outgoing, queue) = mpsc::unbounded_channel();
        let (fanout, _) = broadcast::channel(FANOUT_CAPACITY);
        let events = Events {
            inner: Arc::new(Inner {
                outgoing,
                fanout,
                attached: AtomicU8::new(DETACHED),
                last_heard_ms: AtomicI64::new(0),
                ping,
                credentials_generation: AtomicU64::new(0),
                credentials: CredentialCache::default(),
                waiters: Arc::default(),
            }),
        };
        let tasks = vec![
            tokio::spawn(publish_loop(pool.clone(), queue, ping, stop.clone())),
            tokio::spawn(listen_loop(pool, events.clone(), stop)),
        ];
        (events, tasks)
    }

    /// Queue `event` for every replica. Call after the change committed.
    pub fn emit(&self, event: BusEvent) {
        // The receiver only goes away once the server has answered its last
        // request, when nothing writes any more.
        let _ = self.inner.outgoing.send(event);
    }

    /// Every event any replica emits from now on. Subscribe *before* checking
    /// the database, so nothing committed in between is missed.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<BusEvent>> {
        self.inner.fanout.subscribe()
    }

    /// The events of `team` that `filter` passes, from now on, for one
    /// long poll: an event wakes only the waits it passes (see
    /// `events/waiters.rs`). Register *before* checking the database, as
    /// with [`Events::subscribe`].
    pub fn wait_for(&self, team: Uuid, filter: Filter) -> Waiter {
        self.inner.waiters.register(team, filter)
    }

    /// How many long polls are registered with [`Events::wait_for`] now.
    pub fn waits_registered(&self) -> usize {
        self.inner.waiters.count()
    }

    /// What a credential cache may trust: a number that changes whenever a
    /// credential may have been taken away on any replica, or `None` while
    /// the listener is detached (revocations would go unheard: look every
    /// credential up). An entry cached under one number is good only while
    /// it stays the same; read it *before* the lookup whose answer is cached.
    pub fn credentials_generation(&self) -> Option<u64> {
        // Read the generation first: a detach bumps it, so an answer cached
        // under a number read while attached dies with the detach.
        let generation = self.inner.credentials_generation.load(Ordering::Acquire);
        (self.inner.attached.load(Ordering::Acquire) == ATTACHED).then_some(generation)
    }

    /// This process's credential cache, good under
    /// [`Events::credentials_generation`].
    pub fn credential_cache(&self) -> &CredentialCache {
        &self.inner.credentials
    }

    /// Drop every cached credential of this process now, without waiting for
    /// the notification (a revocation this process just committed).
    pub fn credentials_changed(&self) {
        self.inner
            .credentials_generation
            .fetch_add(1, Ordering::AcqRel);
    }

    pub fn state(&self) -> ListenerState {
        if self.inner.attached.load(Ordering::Relaxed) == DETACHED {
            return ListenerState::Detached;
        }
        let heard = self.inner.last_heard_ms.load(Ordering::Relaxed);
        let quiet_ms = now_ms() - heard;
        if quiet_ms > 2 * self.inner.ping.as_millis() as i64 + 1_000 {
            ListenerState::Silent
        } else {
            ListenerState::Live
        }
    }
}

/// Queue, inside the caller's transaction, the notification that makes every
/// replica drop its cached credentials and access settings at commit (the
/// SQL side of this is `lock_agent_credentials`, migration 0024; this is for
/// a change that takes no agent's lock, such as a team's capability).
pub async fn notify_access_changed(
    conn: &mut sqlx::PgConnection,
    about: Uuid,
) -> Result<(), sqlx::Error> {
    let payload = serde_json::json!([{ "k": CREDENTIALS_KIND, "i": about }]).to_string();
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(payload)
        .execute(conn)
        .await?;
    Ok(())
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn publish_loop(
    pool: PgPool,
    mut queue: mpsc::UnboundedReceiver<BusEvent>,
    ping: Duration,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(ping);
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => {
                // Whatever was emitted before the stop goes out: a wake the
                // waits on other replicas would otherwise only find on their
                // timed re-check, up to 30 s later.
                queue.close();
                while let Some(event) = queue.recv().await {
                    let mut batch = vec![event];
                    while batch.len() < 1_000 {
                        match queue.try_recv() {
                            Ok(event) => add_to_batch(&mut batch, event),
                            Err(_) => break,
                        }
                    }
                    publish(&pool, &batch).await;
                }
                return;
            }
            _ = ticker.tick() => None,
            event = queue.recv() => match event {
                Some(event) => Some(event),
                None => return,
            },
        };
        // Whatever queues up while the last notify is in flight, or within a
        // couple of milliseconds of the first event, goes out together: at most
        // a few hundred notifications a second however fast writes commit
        // (each notify commits through PostgreSQL's one notify queue lock), at
        // the price of that much wake latency. Idle costs nothing.
        if first.is_some() {
            tokio::time::sleep(COALESCE_FOR).await;
        }
        let mut batch: Vec<BusEvent> = first.into_iter().collect();
        while batch.len() < 1_000 {
            match queue.try_recv() {
                Ok(event) => add_to_batch(&mut batch, event),
                Err(_) => break,
            }
        }
        publish(&pool, &batch).await;
    }
}

/// Send `batch` (an empty one is a ping) as one notification per ~8 KB.
async fn publish(pool: &PgPool, batch: &[BusEvent]) {
    for payload in payloads(batch) {
        // A notification is a hint, gone with the server anyway, so its
        // transaction does not wait for a WAL flush: under load that
        // flush queued behind (and delayed) the commits of real writes.
        if let Err(err) =
            sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(&payload)
                .execute(pool)
                .await
        {
            // Waiters re-check the database on a timer, so a lost
            // notification delays a wake; it never loses data.
            tracing::warn!(error = %err, "could not send a bus_events notification");
        }
    }
}

/// Add `event` to a batch about to be published, unless the batch already
/// says what it says. Conversation and outbox events only say "look again":
/// their waiters re-read the database and never use the id (see
/// [`EventKind::Conversation`]). So one such event per team and kind stands
/// for all of them in a batch; where they differ in actor or conversation, the
/// one kept names neither, which wakes every waiter of the team (a window
/// woken by its own send re-checks and finds nothing new). Under load that
/// keeps these notifications at the batch rate, not the send rate, for every
/// replica's listener to parse.
fn add_to_batch(batch: &mut Vec<BusEvent>, event: BusEvent) {
    if matches!(event.kind, EventKind::Conversation | EventKind::Outbox) {
        if let Some(kept) = batch
            .iter_mut()
            .find(|kept| kept.kind == event.kind && kept.team_id == event.team_id)
        {
            if (&kept.actor, &kept.actor_session) != (&event.actor, &event.actor_session) {
                kept.actor = None;
                kept.actor_session = None;
            }
            if kept.conversation_id != event.conversation_id {
                kept.conversation_id = None;
            }
            return;
        }
    } else if batch.contains(&event) {
        return;
    }
    batch.push(event);
}

/// JSON arrays of events, each under the notification payload limit. An empty
/// batch is one empty array: the ping.
fn payloads(batch: &[BusEvent]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut size = 2;
    for event in batch {
        let json = serde_json::to_string(event).expect("an event serialises");
        if !current.is_empty() && size + json.len() + 1 > PAYLOAD_MAX_BYTES {
            out.push(format!("[{}]", current.join(",")));
            current.clear();
            size = 2;
        }
        size += json.len() + 1;
        current.push(json);
    }
    if !current.is_empty() || out.is_empty() {
        out.push(format!("[{}]", current.join(",")));
    }
    out
}

async fn listen_loop(pool: PgPool, events: Events, stop: CancellationToken) {
    let inner = &events.inner;
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, "event listener cannot connect; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Err(err) = listener.listen(CHANNEL).await {
            tracing::warn!(error = %err, "event listener cannot LISTEN; retrying");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        // Whatever was revoked while no one listened went unheard.
        events.credentials_changed();
        inner.attached.store(ATTACHED, Ordering::Release);
        inner.last_heard_ms.store(now_ms(), Ordering::Relaxed);
        backoff = Duration::from_millis(100);
        loop {
            let notification = tokio::select! {
                _ = stop.cancelled() => return,
                n = listener.try_recv() => n,
            };
            match notification {
                Ok(Some(notification)) => {
                    acs_metrics::record_notification();
                    inner.last_heard_ms.store(now_ms(), Ordering::Relaxed);
                    let (batch, credentials) = read_batch(notification.payload());
                    if credentials {
                        events.credentials_changed();
                    }
                    for event in batch {
                        let event = Arc::new(event);
                        inner.waiters.deliver(&event);
                        // No receivers is normal: nobody is waiting.
                        let _ = inner.fanout.send(event);
                    }
                }
                // The connection dropped: notifications sent meanwhile are lost,
                // which the waiters' timed re-check covers.
                Ok(None) | Err(_) => {
                    acs_metrics::record_listener_lost();
                    inner.attached.store(DETACHED, Ordering::Release);
                    events.credentials_changed();
                    tracing::warn!("event listener lost its connection; reconnecting");
                    break;
                }
            }
        }
    }
}

/// Why [`round_trip`] found no working LISTEN/NOTIFY.
#[derive(Debug, thiserror::Error)]
pub enum RoundTripError {
    #[error("LISTEN on `{CHANNEL}` failed: {0}")]
    Listen(#[source] sqlx::Error),
    #[error("NOTIFY on `{CHANNEL}` failed: {0}")]
    Notify(#[source] sqlx::Error),
    #[error("a NOTIFY on `{CHANNEL}` did not reach the LISTEN within {} s", .0.as_secs())]
    NotHeard(Duration),
}

/// Whether the database delivers the bus's notifications (`doctor`): LISTEN
/// on [`CHANNEL`] on one connection, NOTIFY from another, and wait for that
/// notification. The payload is an empty batch, the publisher's ping, so
/// every server listening counts it as a ping and nothing more. Returns how
/// long it took.
pub async fn round_trip(pool: &PgPool, within: Duration) -> Result<Duration, RoundTripError> {
    let mut listener = PgListener::connect_with(pool)
        .await
        .map_err(RoundTripError::Listen)?;
    listener
        .listen(CHANNEL)
        .await
        .map_err(RoundTripError::Listen)?;
    let started = std::time::Instant::now();
    let mut conn = pool.acquire().await.map_err(RoundTripError::Notify)?;
    let sender: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .map_err(RoundTripError::Notify)?;
    sqlx::query("SELECT pg_notify($1, '[]')")
        .bind(CHANNEL)
        .execute(&mut *conn)
        .await
        .map_err(RoundTripError::Notify)?;
    drop(conn);
    let heard = async {
        loop {
            match listener.try_recv().await {
                // Another server's notification: not the one sent here.
                Ok(Some(n)) if n.process_id() != sender as u32 => continue,
                Ok(Some(_)) => return true,
                Ok(None) | Err(_) => return false,
            }
        }
    };
    let heard = matches!(tokio::time::timeout(within, heard).await, Ok(true));
    let _ = listener.unlisten_all().await;
    if heard {
        Ok(started.elapsed())
    } else {
        Err(RoundTripError::NotHeard(within))
    }
}

/// The events of one notification, one by one, and whether it said that
/// credentials changed: an event this binary cannot read (a kind a newer
/// replica emits during a rolling upgrade) is skipped, never the rest of the
/// batch with it.
fn read_batch(payload: &str) -> (Vec<BusEvent>, bool) {
    let items: Vec<serde_json::Value> = match serde_json::from_str(payload) {
        Ok(items) => items,
        Err(err) => {
            tracing::warn!(error = %err, "unreadable bus_events payload");
            return (Vec::new(), false);
        }
    };
    let mut credentials = false;
    let events = items
        .into_iter()
        .filter(|item| {
            let about_credentials = item["k"] == CREDENTIALS_KIND;
            credentials |= about_credentials;
            !about_credentials
        })
        .filter_map(|item| match serde_json::from_value(item) {
            Ok(event) => Some(event),
            Err(err) => {
                tracing::debug!(error = %err, "skipped a bus event this version does not know");
                None
            }
        })
        .collect();
    (events, credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_of_an_unknown_kind_is_skipped_not_the_batch() {
        let team = Uuid::new_v4();
        let known = BusEvent::new(team, EventKind::Task, "T-1");
        let payload = format!(
            r#"[{{"t":"{team}","k":"from_a_newer_replica","i":"x"}},{}]"#,
            serde_json::to_string(&known).unwrap()
        );
        assert_eq!(read_batch(&payload), (vec![known.clone()], false));
        assert_eq!(read_batch("not json"), (Vec::<BusEvent>::new(), false));
        let revoked = format!(
            r#"[{{"k":"credentials","i":"{}"}},{}]"#,
            Uuid::new_v4(),
            serde_json::to_string(&known).unwrap()
        );
        assert_eq!(read_batch(&revoked), (vec![known], true));
    }

    #[test]
    fn a_batch_keeps_one_conversation_event_per_team_and_every_other_event() {
        let (team, other_team) = (Uuid::new_v4(), Uuid::new_v4());
        let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
        let conversation = |actor: Uuid, session: &str, id: &str| BusEvent {
            actor: Some(actor),
            actor_session: Some(session.into()),
            conversation_id: Some(Uuid::nil()),
            ..BusEvent::new(team, EventKind::Conversation, id)
        };
        let mut batch = Vec::new();
        for event in [
            conversation(alice, "w1", "m1"),
            conversation(alice, "w1", "m2"),
            BusEvent::new(team, EventKind::Task, "T-1"),
            BusEvent::new(team, EventKind::Task, "T-1"),
            BusEvent::new(team, EventKind::Task, "T-2"),
            BusEvent::new(other_team, EventKind::Conversation, "m3"),
        ] {
            add_to_batch(&mut batch, event);
        }
        // Two sends by one window: one event, still naming that window, so
        // it does not wake itself.
        assert_eq!(batch.len(), 4, "{batch:?}");
        assert_eq!(batch[0].actor, Some(alice));
        assert_eq!(batch[0].actor_session.as_deref(), Some("w1"));
        assert_eq!(batch[1].id, "T-1");
        assert_eq!(batch[2].id, "T-2");
        assert_eq!(batch[3].team_id, other_team);

        // Another window's send in the same team: the event names nobody,
        // so both windows' waiters look again.
        add_to_batch(&mut batch, conversation(bob, "", "m4"));
        assert_eq!(batch.len(), 4);
        assert_eq!(
            (batch[0].actor, batch[0].actor_session.as_deref()),
            (None, None)
        );
        assert_eq!(batch[0].kind, EventKind::Conversation);
    }

    #[test]
    fn payloads_stay_under_the_notify_limit_and_keep_every_event() {
        let team = Uuid::new_v4();
        let batch: Vec<BusEvent> = (0..500)
            .map(|i| BusEvent::new(team, EventKind::Task, format!("task-{i}")))
            .collect();
        let chunks = payloads(&batch);
        assert!(chunks.len() > 1);
        let mut seen = 0;
        for chunk in &chunks {
            assert!(chunk.len() < 8_000);
            seen += serde_json::from_str::<Vec<BusEvent>>(chunk).unwrap().len();
        }
        assert_eq!(seen, 500);
        assert_eq!(
            payloads(&[]),
            vec!["[]".to_string()],
            "an empty batch is the ping"
        );
    }
}
