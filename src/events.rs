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

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The PostgreSQL notification channel.
pub const CHANNEL: &str = "bus_events";
/// PostgreSQL refuses payloads of 8000 bytes or more; stay well under.
const MAX_PAYLOAD_BYTES: usize = 7_000;
const FANOUT_CAPACITY: usize = 4_096;
/// How long the publisher lets events gather after the first one.
const COALESCE_FOR: Duration = Duration::from_millis(2);

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Message,
    Task,
    Lock,
    Note,
    /// A conversation message was sent (id = message id, `c` = conversation).
    /// Routing is by membership, which only the database knows: a conversation
    /// waiter re-checks its receipts on every one of these.
    Conversation,
    /// A message was accepted into an outbox (id = message id, `c` =
    /// conversation): work for the publication drain, which wakes on these
    /// only, not on every send.
    Outbox,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Message => "message",
            EventKind::Task => "task",
            EventKind::Lock => "lock",
            EventKind::Note => "note",
            EventKind::Conversation => "conversation",
            EventKind::Outbox => "outbox",
        }
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
    /// The changed object: a message id, task key, lock name or note key.
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
            recipient: None,
            recipient_session: None,
            announce: false,
        }
    }

    pub fn by(mut self, me: &crate::auth::Identity) -> BusEvent {
        self.actor = Some(me.agent_id);
        self.actor_session = Some(me.session.clone());
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
}

/// The hub of one process. Cheap to clone.
#[derive(Clone)]
pub struct Events {
    inner: Arc<Inner>,
}

impl Events {
    /// Start the publisher and the listener on `pool`; both stop with `shutdown`.
    pub fn start(pool: PgPool, ping: Duration, shutdown: CancellationToken) -> Events {
        let (outgoing, queue) = mpsc::unbounded_channel();
        let (fanout, _) = broadcast::channel(FANOUT_CAPACITY);
        let events = Events {
            inner: Arc::new(Inner {
                outgoing,
                fanout,
                attached: AtomicU8::new(DETACHED),
                last_heard_ms: AtomicI64::new(0),
                ping,
            }),
        };
        tokio::spawn(publish_loop(pool.clone(), queue, ping, shutdown.clone()));
        tokio::spawn(listen_loop(pool, events.clone(), shutdown));
        events
    }

    /// Queue `event` for every replica. Call after the change committed.
    pub fn emit(&self, event: BusEvent) {
        // The receiver only goes away at shutdown, when nobody waits any more.
        let _ = self.inner.outgoing.send(event);
    }

    /// Every event any replica emits from now on. Subscribe *before* checking
    /// the database, so nothing committed in between is missed.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<BusEvent>> {
        self.inner.fanout.subscribe()
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

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

async fn publish_loop(
    pool: PgPool,
    mut queue: mpsc::UnboundedReceiver<BusEvent>,
    ping: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(ping);
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
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
                Ok(event) if !batch.contains(&event) => batch.push(event),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        for payload in payloads(&batch) {
            if let Err(err) = sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(&payload)
                .execute(&pool)
                .await
            {
                // Waiters re-check the database on a timer, so a lost
                // notification delays a wake; it never loses data.
                tracing::warn!(error = %err, "could not send a bus_events notification");
            }
        }
    }
}

/// JSON arrays of events, each under the notification payload limit. An empty
/// batch is one empty array: the ping.
fn payloads(batch: &[BusEvent]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut size = 2;
    for event in batch {
        let json = serde_json::to_string(event).expect("an event serialises");
        if !current.is_empty() && size + json.len() + 1 > MAX_PAYLOAD_BYTES {
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

async fn listen_loop(pool: PgPool, events: Events, shutdown: CancellationToken) {
    let inner = &events.inner;
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, "event listener cannot connect; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Err(err) = listener.listen(CHANNEL).await {
            tracing::warn!(error = %err, "event listener cannot LISTEN; retrying");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        inner.attached.store(ATTACHED, Ordering::Relaxed);
        inner.last_heard_ms.store(now_ms(), Ordering::Relaxed);
        backoff = Duration::from_millis(100);
        loop {
            let notification = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = listener.try_recv() => n,
            };
            match notification {
                Ok(Some(notification)) => {
                    inner.last_heard_ms.store(now_ms(), Ordering::Relaxed);
                    for event in read_batch(notification.payload()) {
                        // No receivers is normal: nobody is waiting.
                        let _ = inner.fanout.send(Arc::new(event));
                    }
                }
                // The connection dropped: notifications sent meanwhile are lost,
                // which the waiters' timed re-check covers.
                Ok(None) | Err(_) => {
                    inner.attached.store(DETACHED, Ordering::Relaxed);
                    tracing::warn!("event listener lost its connection; reconnecting");
                    break;
                }
            }
        }
    }
}

/// The events of one notification, one by one: an event this binary cannot
/// read (a kind a newer replica emits during a rolling upgrade) is skipped,
/// never the rest of the batch with it.
fn read_batch(payload: &str) -> Vec<BusEvent> {
    let items: Vec<serde_json::Value> = match serde_json::from_str(payload) {
        Ok(items) => items,
        Err(err) => {
            tracing::warn!(error = %err, "unreadable bus_events payload");
            return Vec::new();
        }
    };
    items
        .into_iter()
        .filter_map(|item| match serde_json::from_value(item) {
            Ok(event) => Some(event),
            Err(err) => {
                tracing::debug!(error = %err, "skipped a bus event this version does not know");
                None
            }
        })
        .collect()
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
        assert_eq!(read_batch(&payload), vec![known]);
        assert_eq!(read_batch("not json"), Vec::<BusEvent>::new());
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
