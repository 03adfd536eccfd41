//! Moving conversations between backends against real PostgreSQL and a real
//! `nats-server -js`: the plan, the move there and back, resume after a kill,
//! a checksum mismatch, sends racing the pause, concurrent operators, and
//! cleanup. Each test cites the invariants (M*) it shows.
//!
//! This file holds what the tests share (a team with streams and a thread of
//! sent messages, and what to ask of it); the tests live by concept in
//! `moving` (the move and its resumption), `refusals` (the plan and what is
//! refused before anything is written), `pauses` (the write pause and who
//! may lift it) and `lost` (bodies the broker lost).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ai_crew_sync::backend::jetstream::{Broker, BrokerOptions, StreamSizes};
use ai_crew_sync::backend::{
    Backends, Envelope, Faults, JetStreamBackend, MessagingBackend, PostgresBackend, Published,
};
use ai_crew_sync::store::conversations::Publication;
use ai_crew_sync::store::delivery::moves::{self, Direction, MoveState, Progress};
use ai_crew_sync::store::{delivery::outbox, identity::teams};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::nats::nats_url;
use crate::support::{
    BROKER_ABSENCE_CONFIRM_DELAY, McpClient, TestApp, eventually, in_team, test_actor,
};

mod lost;
mod moving;
mod pauses;
mod refusals;

/// The streams of these tests: small, because the broker reserves a stream's
/// `max_bytes` from its storage up front, and every test's streams stay on
/// the shared test broker until it stops (2 GiB each would exhaust it).
fn sizes() -> StreamSizes {
    StreamSizes {
        max_bytes: 64 * 1024 * 1024,
        ..StreamSizes::default()
    }
}

/// A team with streams on the test broker and a conversation of alice and
/// bob/w1 holding `messages` messages sent through the bus.
struct Thread {
    app: TestApp,
    team: String,
    team_id: Uuid,
    conversation_id: Uuid,
    alice: McpClient,
    bob: McpClient,
    backends: Backends,
}

async fn thread(team: &str, messages: usize) -> Thread {
    let options = BrokerOptions {
        absence_confirm_delay: BROKER_ABSENCE_CONFIRM_DELAY,
        ..BrokerOptions::default()
    };
    let broker = Broker::connect_with(&nats_url(), None, options)
        .await
        .unwrap();
    let app = TestApp::builder()
        .broker(broker.clone())
        .unlimited()
        .spawn()
        .await;
    app.team(team).await;
    teams::capability(&app.pool, team, Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.mcp(&app.agent(team, "alice").await, None).await;
    let bob = app.mcp(&app.agent(team, "bob").await, Some("w1")).await;
    let team_id: Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = $1")
        .bind(team)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    broker
        .provision_team(team_id, &sizes(), false)
        .await
        .unwrap();
    let conversation_id = new_conversation(&alice, &bob, "moving").await;
    let t = Thread {
        backends: Backends::with_broker(app.pool.clone(), broker),
        app,
        team: team.to_string(),
        team_id,
        conversation_id,
        alice,
        bob,
    };
    t.send_many(conversation_id, messages).await;
    t
}

/// An operator's move, as a future of its own, that stops at its first
/// copied body (a slow terminal) until `resume` says go; `reached` says it
/// got there. It blocks in place, so the test runs multi-threaded.
fn stopping_at_first_copy(
    t: &Thread,
    direction: Direction,
) -> (
    impl Future<Output = Result<moves::Outcome, ai_crew_sync::BusError>> + Send + 'static,
    tokio::sync::mpsc::UnboundedReceiver<()>,
    std::sync::mpsc::Sender<()>,
) {
    let (pool, backends) = (t.pool().clone(), t.backends.clone());
    let (team_id, conversation_id) = (t.team_id, t.conversation_id);
    let (reached_tx, reached) = tokio::sync::mpsc::unbounded_channel();
    let (resume, resume_rx) = std::sync::mpsc::channel::<()>();
    let run = async move {
        let resume_rx = std::sync::Mutex::new(resume_rx);
        let first = std::sync::atomic::AtomicBool::new(false);
        moves::run(
            &pool,
            &backends,
            team_id,
            conversation_id,
            direction,
            "stopping operator",
            None,
            &|_: &Progress| {
                if !first.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let _ = reached_tx.send(());
                    tokio::task::block_in_place(|| {
                        let _ = resume_rx
                            .lock()
                            .unwrap()
                            .recv_timeout(Duration::from_secs(60));
                    });
                }
            },
        )
        .await
    };
    (run, reached, resume)
}

async fn new_conversation(alice: &McpClient, bob: &McpClient, title: &str) -> Uuid {
    let created = alice
        .call(
            "create_conversation",
            json!({"title": title, "private": true, "invite": ["bob/w1"]}),
        )
        .await
        .unwrap();
    let id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
    bob.call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    id
}

fn body_of(i: usize) -> String {
    format!("message {i}: {}", "x".repeat(i % 97))
}

impl Thread {
    fn pool(&self) -> &PgPool {
        &self.app.pool
    }

    async fn send(&self, conversation_id: Uuid, body: &str) -> Result<Value, Value> {
        self.alice
            .call(
                "send_conversation_message",
                json!({"conversation_id": conversation_id, "body": body,
                       "request_id": Uuid::new_v4()}),
            )
            .await
    }

    /// `n` sends, eight at a time.
    async fn send_many(&self, conversation_id: Uuid, n: usize) {
        use futures::StreamExt;
        futures::stream::iter(0..n)
            .map(|i| async move { self.send(conversation_id, &body_of(i)).await.unwrap() })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
    }

    async fn run(&self, direction: Direction) -> Result<moves::Outcome, ai_crew_sync::BusError> {
        moves::run(
            self.pool(),
            &self.backends,
            self.team_id,
            self.conversation_id,
            direction,
            "test",
            None,
            &|_: &Progress| {},
        )
        .await
    }

    /// Routing whose postgres backend misbehaves as `faults` says (the
    /// broker is the same).
    fn faulty(&self, faults: Faults) -> Backends {
        self.backends.clone().with_postgres_faults(faults)
    }

    async fn run_on(
        &self,
        backends: &Backends,
        direction: Direction,
    ) -> Result<moves::Outcome, ai_crew_sync::BusError> {
        moves::run(
            self.pool(),
            backends,
            self.team_id,
            self.conversation_id,
            direction,
            "test",
            None,
            &|_: &Progress| {},
        )
        .await
    }

    async fn plan_of(&self, direction: Direction) -> moves::Plan {
        moves::plan(
            self.pool(),
            &self.backends,
            self.team_id,
            direction,
            &[self.conversation_id],
        )
        .await
        .unwrap()
        .remove(0)
    }

    async fn body_at(&self, seq: i64) -> String {
        sqlx::query_scalar(
            "SELECT body FROM conversation_messages WHERE conversation_id = $1 AND seq = $2",
        )
        .bind(self.conversation_id)
        .bind(seq)
        .fetch_one(self.pool())
        .await
        .unwrap()
    }

    /// Everything a move must leave unchanged, per seq: id, author, digest,
    /// recipients with their receipts.
    async fn snapshot(&self) -> BTreeMap<i64, String> {
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT m.seq, concat_ws('|', m.id, m.sender_id, m.sender_session, encode(m.body_sha256, 'hex'),
                    m.request_id, m.created_at,
                    (SELECT string_agg(concat_ws(',', r.member_id, r.recipient_id, r.stored_at,
                                                 r.delivered_at, r.acknowledged_at, r.resolved_at), ';'
                                       ORDER BY r.member_id)
                       FROM message_receipts r WHERE r.message_id = m.id))
               FROM conversation_messages m WHERE m.conversation_id = $1",
        )
        .bind(self.conversation_id)
        .fetch_all(self.pool())
        .await
        .unwrap();
        rows.into_iter().collect()
    }

    /// What bob reads, every page, seq → body.
    async fn read_all(&self) -> BTreeMap<i64, String> {
        let mut bodies = BTreeMap::new();
        let mut after = 0;
        loop {
            let page = self
                .bob
                .call(
                    "read_conversation",
                    json!({"conversation_id": self.conversation_id, "after_seq": after, "limit": 200}),
                )
                .await
                .unwrap();
            let messages = page["messages"].as_array().unwrap();
            if messages.is_empty() {
                return bodies;
            }
            for m in messages {
                let body = m["body"].as_str().unwrap_or_else(|| panic!("no body: {m}"));
                bodies.insert(m["seq"].as_i64().unwrap(), body.to_string());
            }
            after = page["next_after_seq"].as_i64().unwrap();
        }
    }

    async fn stream_messages(&self) -> u64 {
        let (body, _) = self
            .backends
            .broker()
            .unwrap()
            .team_streams(self.team_id)
            .await
            .unwrap();
        body.expect("the body stream").messages
    }

    async fn conversation_row(&self) -> (String, String, bool) {
        sqlx::query_as(
            "SELECT backend, publication, write_paused_at IS NOT NULL FROM conversations WHERE id = $1",
        )
        .bind(self.conversation_id)
        .fetch_one(self.pool())
        .await
        .unwrap()
    }

    async fn runs(&self) -> Vec<(String, String)> {
        sqlx::query_as(
            "SELECT direction, state FROM conversation_migrations WHERE conversation_id = $1 ORDER BY created_at",
        )
        .bind(self.conversation_id)
        .fetch_all(self.pool())
        .await
        .unwrap()
    }

    /// A run row as a process left it (crashed, interrupted, failed); its id.
    /// `paused` also gives the run the conversation's write pause.
    async fn left_run(
        &self,
        conversation_id: Uuid,
        direction: &str,
        state: &str,
        paused: bool,
    ) -> Uuid {
        let id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO conversation_migrations
                 (id, team_id, conversation_id, direction, state, started_by, paused_at)
             VALUES ($1, $2, $3, $4, $5, 'left behind', CASE WHEN $6 THEN now() END)",
        )
        .bind(id)
        .bind(self.team_id)
        .bind(conversation_id)
        .bind(direction)
        .bind(state)
        .bind(paused)
        .execute(self.pool())
        .await
        .unwrap();
        if paused {
            sqlx::query("UPDATE conversations SET write_paused_at = now() WHERE id = $1")
                .bind(conversation_id)
                .execute(self.pool())
                .await
                .unwrap();
        }
        id
    }

    /// The real binary, as an operator runs it.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .args(["conversations"])
            .args(args)
            .args(["--team", &self.team, "--nats-url", &nats_url()])
            .env("DATABASE_URL", &self.app.database_url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }
}
