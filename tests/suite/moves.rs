//! Moving conversations between backends against real PostgreSQL and a real
//! `nats-server -js`: the plan, the move there and back, resume after a kill,
//! a checksum mismatch, sends racing the pause, concurrent operators, and
//! cleanup. Each test cites the invariants (M*) it shows.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ai_crew_sync::backend::jetstream::{Broker, BrokerOptions, StreamSizes};
use ai_crew_sync::backend::{
    Backends, Envelope, Faults, JetStreamBackend, MessagingBackend, PostgresBackend, Published,
};
use ai_crew_sync::store::conversations::Publication;
use ai_crew_sync::store::moves::{self, Direction, MoveState, Progress};
use ai_crew_sync::store::{outbox, teams};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::nats::nats_url;
use crate::support::{
    BROKER_ABSENCE_CONFIRM_DELAY, McpClient, TestApp, in_team, spawn_app_routing_to, test_actor,
};

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
    let app = spawn_app_routing_to(broker.clone()).await;
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

// M10, M5, M14: 1 000 messages move to JetStream (their PostgreSQL copies
// then released by cleanup) and back, with every body identical and every
// seq, author, recipient and receipt unchanged.
#[tokio::test]
async fn a_thousand_messages_move_to_jetstream_and_back_unchanged() {
    let t = thread("mv-roundtrip", 1000).await;
    let before = t.snapshot().await;
    let bodies = t.read_all().await;
    assert_eq!(bodies.len(), 1000);

    let there = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!((there.copied, there.state), (1000, MoveState::CutOver));
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    let located: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages
          WHERE conversation_id = $1 AND backend = 'jetstream' AND canonical_locator LIKE 'jetstream:%'",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(located, 1000);
    assert_eq!(
        t.stream_messages().await,
        1000,
        "one stream entry per message"
    );
    assert_eq!(t.snapshot().await, before);

    // Drop the PostgreSQL copies: every read now comes from the broker.
    let cleaned = moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    assert_eq!(cleaned.messages, 1000);
    assert_eq!(t.read_all().await, bodies);

    let back = t.run(Direction::ToPostgres).await.unwrap();
    assert_eq!((back.copied, back.state), (1000, MoveState::CutOver));
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    let local: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages
          WHERE conversation_id = $1 AND backend = 'postgres' AND canonical_locator IS NULL
            AND publication_state = 'stored' AND body <> ''",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(local, 1000);
    assert_eq!(t.snapshot().await, before);
    assert_eq!(t.read_all().await, bodies);
    assert_eq!(
        t.runs().await,
        [
            ("to_jetstream".into(), "cut_over".into()),
            ("to_postgres".into(), "cut_over".into())
        ]
    );
    // The thread is open for business on PostgreSQL again.
    let sent = t
        .send(t.conversation_id, "after the round trip")
        .await
        .unwrap();
    assert_eq!(sent["seq"], 1001);
    assert_eq!(sent["stored"], true);
}

// Issue 14 item 2. A message accepted before the pause whose publication is
// waiting out a retry backoff longer than the move may pause writes: the move
// is refused before copying or pausing anything and the slot keeps its schedule and its attempts
// (cutting the backoff short would spend them faster than O8 allows). Once
// the slot is due and stored, the same command moves the thread.
#[tokio::test]
async fn a_move_is_refused_unpaused_while_a_message_waits_out_a_long_retry_backoff() {
    let t = thread("mv-backoff", 3).await;
    t.run(Direction::ToJetStream).await.unwrap();
    let sent = t.send(t.conversation_id, "in the outbox").await.unwrap();
    assert_eq!(sent["publication"], "pending_publication");
    // As a slot looks after a few transient failures.
    sqlx::query(
        "UPDATE conversation_outbox
            SET attempts = 5, last_error = 'broker busy',
                next_attempt_at = now() + interval '10 minutes'
          WHERE conversation_id = $1",
    )
    .bind(t.conversation_id)
    .execute(t.pool())
    .await
    .unwrap();
    let _workers = t.app.start_publication_workers();

    let refused = t.run(Direction::ToPostgres).await.unwrap_err().to_string();
    assert!(
        refused.contains("waiting to retry their publication"),
        "{refused}"
    );
    assert!(refused.contains("broker busy"), "{refused}");
    assert!(
        refused.contains("Nothing was copied, paused or moved"),
        "{refused}"
    );
    // Refused before any work: no body was copied back (no item recorded,
    // no run opened).
    let items: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_migration_items i
           JOIN conversation_migrations g ON g.id = i.migration_id
          WHERE g.direction = 'to_postgres'",
    )
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(items, 0, "no body copied before the refusal");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false),
        "not paused, not moved"
    );
    let (attempts, later): (i32, bool) = sqlx::query_as(
        "SELECT attempts, next_attempt_at > now() + interval '5 minutes'
           FROM conversation_outbox WHERE conversation_id = $1",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(
        (attempts, later),
        (5, true),
        "the schedule is the slot's own"
    );

    // Its time comes; the drain stores it; the same command moves the thread.
    sqlx::query(
        "UPDATE conversation_outbox SET next_attempt_at = now() WHERE conversation_id = $1",
    )
    .bind(t.conversation_id)
    .execute(t.pool())
    .await
    .unwrap();
    let back = t.run(Direction::ToPostgres).await.unwrap();
    assert_eq!((back.copied, back.state), (4, MoveState::CutOver));
    let (state, body): (String, String) = sqlx::query_as(
        "SELECT publication_state, body FROM conversation_messages WHERE id = $1::uuid",
    )
    .bind(sent["message_id"].as_str().unwrap())
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!((state.as_str(), body.as_str()), ("stored", "in the outbox"));
}

// M1, M2: the plan writes nothing and says what a move would do.
#[tokio::test]
async fn the_plan_writes_nothing_and_explains_each_conversation() {
    let t = thread("mv-plan", 5).await;
    let other = new_conversation(&t.alice, &t.bob, "empty").await;
    let err = Direction::parse("s3").unwrap_err().to_string();
    assert!(
        err.contains("jetstream") && err.contains("postgres"),
        "{err}"
    );

    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "jetstream", "--json"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plans: Value = serde_json::from_slice(&out.stdout).unwrap();
    let plans = plans.as_array().unwrap();
    assert_eq!(plans.len(), 2);
    let first = &plans[0];
    assert_eq!(first["conversation_id"], t.conversation_id.to_string());
    assert_eq!(first["messages"], 5);
    let bytes: i64 = (0..5).map(|i| body_of(i).len() as i64).sum();
    assert_eq!(first["bytes"], bytes);
    assert_eq!(first["already_there"], 0);
    assert_eq!(first["blocked"], Value::Null);
    assert_eq!(first["resuming"], false);
    assert_eq!(plans[1]["conversation_id"], other.to_string());
    assert!(t.runs().await.is_empty(), "nothing written");
    assert_eq!(t.conversation_row().await.0, "postgres");

    // The move as an operator runs it without a terminal: progress as plain
    // lines on stderr, a summary per conversation on stdout.
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&[
            "migrate",
            "--to",
            "jetstream",
            "--apply",
            "--conversation",
            &t.conversation_id.to_string(),
        ]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains(&format!(
            "{}: cut over to jetstream (5 copied",
            t.conversation_id
        )),
        "{summary}"
    );
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(progress.contains("copying"), "{progress}");
    assert!(progress.contains("cut_over 5/5 messages"), "{progress}");

    // Moved already: the plan says so.
    let plans = moves::plan(
        t.pool(),
        &t.backends,
        t.team_id,
        Direction::ToJetStream,
        &[t.conversation_id],
    )
    .await
    .unwrap();
    assert_eq!(plans[0].blocked.as_deref(), Some("already on jetstream"));
    assert_eq!(plans[0].already_there, 5);
}

// M3, M11: a move killed mid-copy and just before its cutover resumes with
// the same command and finishes with one stream entry per message.
#[tokio::test]
async fn a_killed_move_resumes_with_the_same_command_without_duplicates() {
    let t = thread("mv-kill", 600).await;
    let before = t.snapshot().await;
    for kill_after_verified in [150_i64, 450, 600] {
        let mut child = t
            .command(&["migrate", "--to", "jetstream", "--apply"])
            .spawn()
            .unwrap();
        // Let it get this far, then kill it without warning.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let verified: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM conversation_migration_items WHERE state = 'verified'",
            )
            .fetch_one(t.pool())
            .await
            .unwrap();
            let finished = child.try_wait().unwrap().is_some();
            if verified >= kill_after_verified || finished {
                break;
            }
            assert!(Instant::now() < deadline, "the move made no progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        if t.conversation_row().await.0 == "jetstream" {
            break;
        }
        // Killed with the run open: the thread says it is paused (or not
        // yet), and nothing is cut over.
        assert_eq!(t.runs().await, [("to_jetstream".into(), "copying".into())]);
    }
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "jetstream", "--apply"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert_eq!(t.stream_messages().await, 600, "no duplicate stream entry");
    assert_eq!(t.snapshot().await, before);
    assert_eq!(t.read_all().await.len(), 600);
}

// M9, M11, M12, M6: a body altered on the target fails the move; nothing is
// cut over and the thread is open again, on its old backend; the item was
// recorded with its checksum and size before anything was written.
#[tokio::test]
async fn a_checksum_mismatch_fails_the_move_and_reopens_the_thread() {
    let t = thread("mv-mismatch", 20).await;
    let victim: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 AND seq = 7",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    // Someone wrote another body under the key the move will use.
    let broker = JetStreamBackend::new(t.backends.broker().unwrap().clone(), t.team_id);
    let tampered = broker
        .publish(&Envelope {
            message_id: victim,
            conversation_id: t.conversation_id,
            team_id: t.team_id,
            body: "not what was sent".into(),
            publish_key: victim,
        })
        .await;
    assert!(matches!(tampered, Published::Confirmed(_)));

    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(err.contains("Nothing was cut over"), "{err}");
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    assert_eq!(t.runs().await, [("to_jetstream".into(), "failed".into())]);
    let moved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages WHERE conversation_id = $1 AND backend <> 'postgres'",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(moved, 0, "the thread is untouched");
    let item: String =
        sqlx::query_scalar("SELECT state FROM conversation_migration_items WHERE message_id = $1")
            .bind(victim)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(item, "failed");
    let recorded: (Vec<u8>, i32) = sqlx::query_as(
        "SELECT body_sha256, bytes FROM conversation_migration_items WHERE message_id = $1",
    )
    .bind(victim)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let sent: (Vec<u8>, i32) =
        sqlx::query_as("SELECT body_sha256, body_bytes FROM conversation_messages WHERE id = $1")
            .bind(victim)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(recorded, sent, "M6: the source's checksum and size");
    // M13: the operator is told the thread is open again.
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    t.send(t.conversation_id, "still open").await.unwrap();
    assert_eq!(t.read_all().await.len(), 21);
}

// M4: sends racing the pause either commit before it (and are moved) or are
// refused with the pause explained; none is lost or half-moved. Other
// threads keep working.
#[tokio::test]
async fn sends_racing_the_pause_commit_before_it_or_are_refused() {
    let t = thread("mv-race", 300).await;
    let elsewhere = new_conversation(&t.alice, &t.bob, "elsewhere").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut senders = Vec::new();
    for w in 0..4 {
        let client = McpClient::connect(
            &t.app.mcp_url(),
            &ai_crew_sync::store::tokens::issue(t.pool(), &in_team(&t.team), "alice", None)
                .await
                .unwrap()
                .token,
            None,
        )
        .await
        .unwrap();
        let stop = stop.clone();
        let conversation_id = t.conversation_id;
        senders.push(tokio::spawn(async move {
            let (mut accepted, mut refused) = (Vec::new(), 0);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                match client
                    .call(
                        "send_conversation_message",
                        json!({"conversation_id": conversation_id, "body": format!("racer {w}/{i}"),
                               "request_id": Uuid::new_v4()}),
                    )
                    .await
                {
                    Ok(sent) => accepted.push(sent["message_id"].as_str().unwrap().to_string()),
                    Err(e) => {
                        let text = e["message"].as_str().unwrap_or_default();
                        assert!(text.contains("paused for a backend move"), "{e}");
                        assert!(text.contains("s so far"), "{e}");
                        refused += 1;
                    }
                }
            }
            (accepted, refused)
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let outcome = t.run(Direction::ToJetStream).await;
    // The other thread was never paused.
    let elsewhere_sent = t.send(elsewhere, "unaffected").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let outcome = outcome.unwrap();
    elsewhere_sent.unwrap();
    let mut accepted = Vec::new();
    for sender in senders {
        let (ids, _) = sender.await.unwrap();
        accepted.extend(ids);
    }
    assert!(outcome.paused_ms >= 0);
    // Every accepted send is in the thread, exactly once, and on jetstream
    // (moved before the cutover) or sent after it (through the outbox).
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT id::text, backend, publication_state FROM conversation_messages WHERE conversation_id = $1",
    )
    .bind(t.conversation_id)
    .fetch_all(t.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), 300 + accepted.len());
    let present: std::collections::HashSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    for id in &accepted {
        assert!(
            present.contains(id.as_str()),
            "accepted send {id} is missing"
        );
    }
    for (id, backend, state) in &rows {
        assert_eq!(backend, "jetstream", "{id} half-moved: {state}");
    }
}

// M3: two operators starting the same move make one run; a move the other
// way while one is open is a conflict (and the open one is resumable).
#[tokio::test]
async fn concurrent_operators_share_one_run_and_opposite_directions_conflict() {
    let t = thread("mv-ops", 200).await;
    let (a, b) = tokio::join!(t.run(Direction::ToJetStream), t.run(Direction::ToJetStream));
    assert!(a.is_ok() || b.is_ok(), "{a:?} {b:?}");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert_eq!(t.stream_messages().await, 200);
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );

    // A process died holding an open move back to postgres...
    let other = new_conversation(&t.alice, &t.bob, "second").await;
    t.send(other, "one").await.unwrap();
    t.left_run(other, "to_jetstream", "copying", true).await;
    let t2 = Thread {
        conversation_id: other,
        ..t
    };
    let err = t2.run(Direction::ToPostgres).await.unwrap_err();
    assert_eq!(err.kind(), "conflict");
    assert!(err.to_string().contains("already open"), "{err}");
    // ...and its thread refuses sends, saying why, while reads keep working.
    let refused = t2.send(other, "during").await.unwrap_err();
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("paused for a backend move")
    );
    assert_eq!(t2.read_all().await.len(), 1);
    // The same direction resumes it and lifts the pause.
    t2.run(Direction::ToJetStream).await.unwrap();
    assert_eq!(
        t2.runs().await,
        [("to_jetstream".into(), "cut_over".into())]
    );
    assert!(!moves::is_paused(t2.pool(), other).await.unwrap());
}

// M14: cleanup refuses a negative window, never drops a body inside the
// window nor one of a move that did not cut over, and drops the rest only
// with --apply.
#[tokio::test]
async fn cleanup_respects_the_rollback_window_and_unfinished_moves() {
    let t = thread("mv-clean", 10).await;
    let failed_conversation = new_conversation(&t.alice, &t.bob, "failed move").await;
    t.send(failed_conversation, "keep me").await.unwrap();
    t.run(Direction::ToJetStream).await.unwrap();
    // A move of the other thread that failed: its bodies are not released.
    t.left_run(failed_conversation, "to_jetstream", "failed", false)
        .await;

    let err = moves::cleanup(t.pool(), t.team_id, -1, true)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "invalid");
    assert!(err.to_string().contains("negative"), "{err}");

    let inside = moves::cleanup(t.pool(), t.team_id, 168, true)
        .await
        .unwrap();
    assert_eq!(inside.messages, 0, "the move is younger than the window");
    sqlx::query("UPDATE conversation_migrations SET cut_over_at = now() - interval '200 hours' WHERE state = 'cut_over'")
        .execute(t.pool())
        .await
        .unwrap();
    // A move back that is open (interrupted) holds the rows it writes into.
    let back = t
        .left_run(t.conversation_id, "to_postgres", "copying", false)
        .await;
    let held = moves::cleanup(t.pool(), t.team_id, 168, true)
        .await
        .unwrap();
    assert_eq!(held.messages, 0, "nothing under an open move");
    sqlx::query("UPDATE conversation_migrations SET state = 'failed' WHERE id = $1")
        .bind(back)
        .execute(t.pool())
        .await
        .unwrap();
    // A jetstream thread cannot be switched to synchronous publication: its
    // sends would never reach the broker.
    let err = ai_crew_sync::store::outbox::set_publication(
        t.pool(),
        t.team_id,
        t.conversation_id,
        Publication::Sync,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("migrate --to postgres"), "{err}");
    let report = moves::cleanup(t.pool(), t.team_id, 168, false)
        .await
        .unwrap();
    assert_eq!((report.messages, report.applied), (10, false));
    let kept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_messages WHERE body <> ''")
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(kept, 11, "a report changes nothing");

    let out = tokio::task::spawn_blocking({
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .args([
                "conversations",
                "cleanup",
                "--team",
                &t.team,
                "--apply",
                "--json",
            ])
            .env("DATABASE_URL", &t.app.database_url);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (applied["messages"].as_i64(), applied["applied"].as_bool()),
        (Some(10), Some(true))
    );
    let left: Vec<String> =
        sqlx::query_scalar("SELECT body FROM conversation_messages WHERE body <> ''")
            .fetch_all(t.pool())
            .await
            .unwrap();
    assert_eq!(left, ["keep me"], "only the moved thread's copies went");
    assert_eq!(t.read_all().await.len(), 10, "read from the broker now");
}

// M7: a resumed run finds the copy it recorded before and verifies it
// without publishing again, even where the broker would not deduplicate
// (the copy went in under another key, as after a long interruption).
#[tokio::test]
async fn a_resumed_run_verifies_a_recorded_copy_instead_of_publishing_again() {
    let t = thread("mv-resume", 5).await;
    let first: (Uuid, String) = sqlx::query_as(
        "SELECT id, body FROM conversation_messages WHERE conversation_id = $1 AND seq = 1",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let broker = JetStreamBackend::new(t.backends.broker().unwrap().clone(), t.team_id);
    let Published::Confirmed(locator) = broker
        .publish(&Envelope {
            message_id: first.0,
            conversation_id: t.conversation_id,
            team_id: t.team_id,
            body: first.1.clone(),
            publish_key: Uuid::new_v4(),
        })
        .await
    else {
        panic!("the earlier copy was not published");
    };
    // What an interrupted run left: open, its item copied with a locator.
    let run = t
        .left_run(t.conversation_id, "to_jetstream", "copying", false)
        .await;
    sqlx::query(
        "INSERT INTO conversation_migration_items
             (migration_id, message_id, team_id, body_sha256, bytes, target_locator, state)
         SELECT $1, id, team_id, body_sha256, body_bytes, $3, 'copied'
           FROM conversation_messages WHERE id = $2",
    )
    .bind(run)
    .bind(first.0)
    .bind(&locator.0)
    .execute(t.pool())
    .await
    .unwrap();

    let outcome = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!(outcome.migration_id, run, "the open run was resumed");
    assert_eq!((outcome.resumed, outcome.copied), (1, 4));
    assert_eq!(
        t.stream_messages().await,
        5,
        "the recorded copy was not published again"
    );
    let canonical: String =
        sqlx::query_scalar("SELECT canonical_locator FROM conversation_messages WHERE id = $1")
            .bind(first.0)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(canonical, locator.0);
}

// M8, M11, M13: a publish the target refuses stops the move with that error;
// nothing is cut over and the thread is open again.
#[tokio::test]
async fn a_refused_publish_stops_the_move_and_reopens_the_thread() {
    let t = thread("mv-refused", 3).await;
    // The body stream takes two bodies, and refuses the third.
    let sizes = StreamSizes {
        max_messages: 2,
        ..sizes()
    };
    t.backends
        .broker()
        .unwrap()
        .provision_team(t.team_id, &sizes, true)
        .await
        .unwrap();
    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("copying message"), "{err}");
    assert!(err.contains("Nothing was cut over"), "{err}");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "failed".into())]);
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    t.send(t.conversation_id, "still open").await.unwrap();
}

// M5, M11: a body the broker no longer holds stops a move back to postgres
// with the "no longer holds" message; nothing is cut over and the thread reopens. One
// "not found" is not yet "no longer holds": the first run stops on an absence
// not confirmed, the run after the confirm delay on the body being gone.
#[tokio::test]
async fn a_body_the_broker_lost_stops_the_move_back() {
    let t = thread("mv-lost", 4).await;
    t.run(Direction::ToJetStream).await.unwrap();
    moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    let locator: String = sqlx::query_scalar(
        "SELECT canonical_locator FROM conversation_messages WHERE conversation_id = $1 AND seq = 2",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let sequence: u64 = locator.rsplit(':').next().unwrap().parse().unwrap();
    let stream = t
        .backends
        .broker()
        .unwrap()
        .js()
        .get_stream(ai_crew_sync::backend::jetstream::body_stream_name(
            t.team_id,
        ))
        .await
        .unwrap();
    assert!(stream.delete_message(sequence).await.unwrap());

    let first_miss = Instant::now();
    let err = t.run(Direction::ToPostgres).await.unwrap_err().to_string();
    assert!(err.contains("stream leader"), "{err}");
    assert!(!err.contains("no longer holds the body"), "{err}");
    tokio::time::sleep(
        (BROKER_ABSENCE_CONFIRM_DELAY + Duration::from_millis(250))
            .saturating_sub(first_miss.elapsed()),
    )
    .await;
    let err = t.run(Direction::ToPostgres).await.unwrap_err().to_string();
    assert!(err.contains("no longer holds the body"), "{err}");
    // Issue 15 item 5: the error names the message it met.
    assert!(err.contains("(seq 2)"), "{err}");
    assert!(
        err.contains("tombstone it deliberately or restore the stream"),
        "{err}"
    );
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    assert_eq!(
        t.runs().await,
        [
            ("to_jetstream".into(), "cut_over".into()),
            ("to_postgres".into(), "failed".into()),
            ("to_postgres".into(), "failed".into())
        ]
    );
    // M12: the copies written back that never verified are cleared again.
    let written_back: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages WHERE conversation_id = $1 AND body <> ''",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let verified: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT i.message_id) FROM conversation_migration_items i
           JOIN conversation_migrations g ON g.id = i.migration_id
          WHERE g.direction = 'to_postgres' AND i.state = 'verified'",
    )
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(written_back, verified, "only verified copies stay");
}

// Issue 14 item 1 (M12, M4): two operators share one run of a move back to
// postgres. B's read-back fails at the backend boundary and B aborts (run
// failed, nothing paused); A, still in its bulk copy, then reaches the pause.
// A must not pause for a run that is no longer open: the thread is never left
// paused with no move owning the pause, and the same command moves it after.
#[tokio::test]
async fn two_operators_sharing_a_run_never_leave_a_pause_no_move_owns() {
    use std::sync::mpsc;
    let t = thread("mv-strand", 12).await;
    t.run(Direction::ToJetStream).await.unwrap();

    // Operator A is another process: its own thread, runtime and pool. It
    // reports its first copied body, then waits (a slow terminal) until B
    // is done; nothing of the test's runtime waits with it.
    let (reached_tx, mut reached) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (resume, resume_rx) = mpsc::channel::<()>();
    let (a_done_tx, a_done) = tokio::sync::oneshot::channel();
    let operator_a = std::thread::spawn({
        let (url, broker) = (
            t.app.database_url.clone(),
            t.backends.broker().unwrap().clone(),
        );
        let (team_id, conversation_id) = (t.team_id, t.conversation_id);
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let moved = runtime.block_on(async move {
                let pool = ai_crew_sync::db::connect(&url, 4).await.unwrap();
                let backends = Backends::with_broker(pool.clone(), broker);
                let resume_rx = std::sync::Mutex::new(resume_rx);
                let first = std::sync::atomic::AtomicBool::new(false);
                moves::run(
                    &pool,
                    &backends,
                    team_id,
                    conversation_id,
                    Direction::ToPostgres,
                    "operator a",
                    None,
                    &|_: &Progress| {
                        if !first.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            let _ = reached_tx.send(());
                            let _ = resume_rx
                                .lock()
                                .unwrap()
                                .recv_timeout(Duration::from_secs(60));
                        }
                    },
                )
                .await
                .map_err(|e| e.to_string())
            });
            let _ = a_done_tx.send(moved);
        }
    });
    tokio::time::timeout(Duration::from_secs(60), reached.recv())
        .await
        .expect("operator A copied its first body")
        .expect("operator A reports before it finishes");
    let b = t
        .run_on(
            &t.faulty(Faults {
                fetch_fails_after: Some(0),
                ..Faults::default()
            }),
            Direction::ToPostgres,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(b.contains("could not be read"), "{b}");
    assert_eq!(
        t.runs().await,
        [
            ("to_jetstream".into(), "cut_over".into()),
            ("to_postgres".into(), "failed".into())
        ]
    );
    resume.send(()).unwrap();
    let a = a_done.await.unwrap().unwrap_err();
    operator_a.join().unwrap();
    assert!(a.contains("given up by another process"), "{a}");
    assert!(a.contains("did not pause writes"), "{a}");

    let never_paused: bool = sqlx::query_scalar(
        "SELECT paused_at IS NULL FROM conversation_migrations WHERE direction = 'to_postgres'",
    )
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert!(never_paused, "the failed run never paused the thread");
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    t.send(t.conversation_id, "open after both failed")
        .await
        .unwrap();
    assert_eq!(t.plan_of(Direction::ToPostgres).await.blocked, None);
    let _workers = t.app.start_publication_workers();
    let back = t.run(Direction::ToPostgres).await.unwrap();
    assert_eq!(back.state, MoveState::CutOver);
    assert_eq!(t.read_all().await.len(), 13);
}

// Issue 14 item 1, M2, M12: a thread paused with no move owning the pause
// (as the race above left it before the fix) is blocked in the plan, which
// says what lifts it; an abort of the run that is no longer open still lifts
// that pause. An open run, by contrast, is resumed (`resuming`).
#[tokio::test]
async fn m2_a_stale_abort_still_lifts_a_pause_no_move_owns() {
    let t = thread("mv-orphan", 2).await;
    let failed = t
        .left_run(t.conversation_id, "to_jetstream", "failed", true)
        .await;
    let plan = t.plan_of(Direction::ToJetStream).await;
    let blocked = plan.blocked.unwrap_or_default();
    assert!(blocked.contains("no move owns the pause"), "{blocked}");
    assert!(blocked.contains("conversations unpause"), "{blocked}");
    assert!(!plan.resuming);
    let refused = t.send(t.conversation_id, "refused").await.unwrap_err();
    assert!(refused["message"].as_str().unwrap().contains("paused"));

    moves::abort(t.pool(), failed, "late abort").await.unwrap();
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    assert_eq!(
        t.runs().await,
        [("to_jetstream".into(), "failed".into())],
        "the run is not touched again"
    );
    t.send(t.conversation_id, "open again").await.unwrap();

    // An open run owns its pause: the plan resumes it, an abort of an old
    // run leaves its pause alone.
    let open = t
        .left_run(t.conversation_id, "to_jetstream", "copying", true)
        .await;
    let plan = t.plan_of(Direction::ToJetStream).await;
    assert!(plan.resuming);
    assert_eq!(plan.blocked, None);
    moves::abort(t.pool(), failed, "late again").await.unwrap();
    assert!(moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    let outcome = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!(outcome.migration_id, open);
}

// Issue 14 item 1: `conversations unpause` lifts a pause no move owns,
// audited; refused (changing nothing) while a move is open.
#[tokio::test]
async fn unpause_lifts_only_a_pause_no_move_owns_and_is_audited() {
    let t = thread("mv-unpause", 1).await;
    let open = t
        .left_run(t.conversation_id, "to_jetstream", "copying", true)
        .await;
    let unpause = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .args(["conversations", "unpause", "--team", &t.team])
            .args(["--conversation", &t.conversation_id.to_string()])
            .env("DATABASE_URL", &t.app.database_url);
        if json {
            command.arg("--json");
        }
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    let audited = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log WHERE action = 'conversation.unpause' AND subject = $1",
        )
        .bind(t.conversation_id.to_string())
        .fetch_one(t.pool())
        .await
        .unwrap()
    };

    let out = unpause(false).await.unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("owns the pause"), "{said}");
    assert!(said.contains("migrate --to jetstream"), "{said}");
    assert!(moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    assert_eq!(audited().await, 0);

    sqlx::query("UPDATE conversation_migrations SET state = 'failed' WHERE id = $1")
        .bind(open)
        .execute(t.pool())
        .await
        .unwrap();
    let out = unpause(true).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(done["paused_seconds"].is_i64(), "{done}");
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    assert_eq!(audited().await, 1);
    t.send(t.conversation_id, "open").await.unwrap();

    let out = unpause(false).await.unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("not paused; nothing changed"));
    assert_eq!(audited().await, 1, "nothing to lift, nothing audited");
}

// Issue 14 items 2 and 6: the plan refuses a target whose streams are missing
// or too small for a full body, before anything is written; an open run whose
// plan fails is aborted (its pause lifted), not left holding the thread.
#[tokio::test]
async fn a_target_not_provisioned_is_refused_before_anything_is_written() {
    let t = thread("mv-target", 3).await;
    let broker = t.backends.broker().unwrap().clone();
    broker.remove_team_streams(t.team_id).await.unwrap();
    let err = moves::plan(
        t.pool(),
        &t.backends,
        t.team_id,
        Direction::ToJetStream,
        &[],
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("do not exist"), "{err}");
    assert!(err.contains("team stream"), "{err}");
    assert!(t.runs().await.is_empty(), "the plan wrote nothing");

    // A move left open and paused by a process that died: its plan now
    // fails, and the run is given up with the pause lifted.
    t.left_run(t.conversation_id, "to_jetstream", "copying", true)
        .await;
    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("do not exist"), "{err}");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "failed".into())]);
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    let copied: i64 = sqlx::query_scalar("SELECT count(*) FROM conversation_migration_items")
        .fetch_one(t.pool())
        .await
        .unwrap();
    assert_eq!(copied, 0, "no body copied");
    t.send(t.conversation_id, "open").await.unwrap();

    // Streams that cannot take a full body are refused too.
    broker
        .provision_team(t.team_id, &sizes(), false)
        .await
        .unwrap();
    let name = ai_crew_sync::backend::jetstream::body_stream_name(t.team_id);
    let mut config = broker
        .js()
        .get_stream(&name)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    config.max_message_size = 64 * 1024;
    broker.js().update_stream(config).await.unwrap();
    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("takes at most 65536 bytes"), "{err}");
    assert!(err.contains("--update-quotas"), "{err}");
    assert_eq!(t.stream_messages().await, 0);

    broker
        .provision_team(t.team_id, &sizes(), true)
        .await
        .unwrap();
    let moved = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!((moved.copied, moved.state), (4, MoveState::CutOver));
}

// Issue 14 item 3 (M7): a move that failed and is started again after the
// broker's duplicate window finds the copies the failed run wrote and
// publishes none of them a second time.
#[tokio::test]
async fn a_failed_move_started_again_past_the_duplicate_window_publishes_nothing_twice() {
    let t = thread("mv-rerun", 10).await;
    let broker = t.backends.broker().unwrap().clone();
    let name = ai_crew_sync::backend::jetstream::body_stream_name(t.team_id);
    let mut config = broker
        .js()
        .get_stream(&name)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    let window = Duration::from_secs(2);
    config.duplicate_window = window;
    broker.js().update_stream(config).await.unwrap();
    // The seventh message's key already holds another body: the first run
    // copies six, then fails on the seventh.
    let victim: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 AND seq = 7",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let tampered = JetStreamBackend::new(broker.clone(), t.team_id)
        .publish(&Envelope {
            message_id: victim,
            conversation_id: t.conversation_id,
            team_id: t.team_id,
            body: "not what was sent".into(),
            publish_key: victim,
        })
        .await;
    assert!(matches!(tampered, Published::Confirmed(_)));
    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
    assert_eq!(
        t.stream_messages().await,
        7,
        "six copies and the tampered one"
    );
    let first: BTreeMap<Uuid, String> = sqlx::query_as(
        "SELECT message_id, target_locator FROM conversation_migration_items
          WHERE state = 'verified'",
    )
    .fetch_all(t.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(first.len(), 6);

    tokio::time::sleep(window + Duration::from_millis(500)).await;
    let again = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!((again.resumed, again.copied), (6, 4));
    assert_eq!(
        t.stream_messages().await,
        11,
        "one entry per message (and the tampered one), none published twice"
    );
    for (message_id, locator) in first {
        let canonical: String =
            sqlx::query_scalar("SELECT canonical_locator FROM conversation_messages WHERE id = $1")
                .bind(message_id)
                .fetch_one(t.pool())
                .await
                .unwrap();
        assert_eq!(canonical, locator, "the failed run's copy is the one kept");
    }
    assert_eq!(t.read_all().await.len(), 10);
}

// Issue 14 item 4: a message whose publication failed for good is stored on
// no backend. The plan blocks the move with the count and what to do; a run
// is refused before copying and never cuts over with it left behind.
#[tokio::test]
async fn a_message_whose_publication_failed_blocks_the_move() {
    let t = thread("mv-failedmsg", 3).await;
    outbox::set_publication(t.pool(), t.team_id, t.conversation_id, Publication::Outbox)
        .await
        .unwrap();
    let sent = t.send(t.conversation_id, "never stored").await.unwrap();
    assert_eq!(sent["publication"], "pending_publication");
    let refusing = PostgresBackend::with_faults(
        t.pool().clone(),
        Faults {
            fatal: true,
            ..Faults::default()
        },
    );
    outbox::run_once(t.pool(), &refusing, "test").await.unwrap();
    let state: String = sqlx::query_scalar(
        "SELECT publication_state FROM conversation_messages WHERE id = $1::uuid",
    )
    .bind(sent["message_id"].as_str().unwrap())
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(state, "failed");

    let plan = t.plan_of(Direction::ToJetStream).await;
    assert_eq!((plan.messages, plan.failed), (4, 1));
    let blocked = plan.blocked.unwrap_or_default();
    assert!(blocked.contains("1 message(s)"), "{blocked}");
    assert!(blocked.contains("tombstone"), "{blocked}");

    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("1 message(s)"), "{err}");
    assert!(err.contains("Nothing was copied or cut over"), "{err}");
    assert_eq!(t.stream_messages().await, 0, "no body copied");
    assert_eq!(t.conversation_row().await.0, "postgres");
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
}

// M11: an abort that cannot finish (its connection is lost while it waits
// for the run's row) leaves the run open and paused; the move's own error is
// reported, not the abort's; the same command resumes the run and finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m11_an_abort_that_cannot_finish_leaves_the_run_open_and_paused_until_resumed() {
    let t = thread("mv-abortfail", 6).await;
    t.run(Direction::ToJetStream).await.unwrap();
    let open = t
        .left_run(t.conversation_id, "to_postgres", "copying", true)
        .await;
    // Another session holds the run's row, so the abort has to wait for it.
    let mut holder = t.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM conversation_migrations WHERE id = $1 FOR NO KEY UPDATE")
        .bind(open)
        .execute(&mut *holder)
        .await
        .unwrap();
    let mover = tokio::spawn({
        let (pool, backends) = (
            t.pool().clone(),
            t.faulty(Faults {
                fetch_fails_after: Some(0),
                ..Faults::default()
            }),
        );
        let (team_id, conversation_id) = (t.team_id, t.conversation_id);
        async move {
            moves::run(
                &pool,
                &backends,
                team_id,
                conversation_id,
                Direction::ToPostgres,
                "test",
                None,
                &|_: &Progress| {},
            )
            .await
        }
    });
    // The abort is waiting on the run's row: its connection is lost.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let killed: Option<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE '%SET state = ''failed''%'",
        )
        .fetch_optional(t.pool())
        .await
        .unwrap();
        if killed == Some(true) {
            break;
        }
        assert!(Instant::now() < deadline, "the abort never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = mover.await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains("could not be read"),
        "the move's own error: {err}"
    );
    holder.rollback().await.unwrap();

    assert_eq!(
        t.runs().await,
        [
            ("to_jetstream".into(), "cut_over".into()),
            ("to_postgres".into(), "copying".into())
        ]
    );
    assert!(moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    let refused = t.send(t.conversation_id, "during").await.unwrap_err();
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("paused for a backend move")
    );
    let resumed = t.run(Direction::ToPostgres).await.unwrap();
    assert_eq!(resumed.migration_id, open, "the same run, resumed");
    assert_eq!(resumed.state, MoveState::CutOver);
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
}

// M12: an abort of a move back to postgres clears the copy written back for
// the message that failed (it has an item row, never verified) and keeps the
// verified ones; every body still reads right from the broker.
#[tokio::test]
async fn m12_an_abort_clears_the_unverified_copies_written_back() {
    let t = thread("mv-clear", 6).await;
    let bodies = t.read_all().await;
    t.run(Direction::ToJetStream).await.unwrap();
    moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    let err = t
        .run_on(
            &t.faulty(Faults {
                fetch_fails_after: Some(3),
                ..Faults::default()
            }),
            Direction::ToPostgres,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("could not be read"), "{err}");
    let item: String = sqlx::query_scalar(
        "SELECT i.state FROM conversation_migration_items i
           JOIN conversation_messages m ON m.id = i.message_id
           JOIN conversation_migrations g ON g.id = i.migration_id
          WHERE m.conversation_id = $1 AND m.seq = 4 AND g.direction = 'to_postgres'",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(item, "copied", "the failing message has an item row");
    assert_eq!(t.body_at(4).await, "", "its unverified copy is cleared");
    for seq in 1..=3 {
        assert_eq!(t.body_at(seq).await, bodies[&seq], "verified {seq} kept");
    }
    assert_eq!(t.conversation_row().await.0, "jetstream");
    assert_eq!(t.read_all().await, bodies);
}

// M13 and issue 14 item 5: `is_paused` answers true for a paused thread and
// false for an open one; an unknown conversation is an error, not "open".
#[tokio::test]
async fn m13_is_paused_answers_for_a_paused_thread_and_refuses_an_unknown_one() {
    let t = thread("mv-paused", 1).await;
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    t.left_run(t.conversation_id, "to_jetstream", "copying", true)
        .await;
    assert!(moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    let err = moves::is_paused(t.pool(), Uuid::new_v4())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "not_found");
    assert!(err.to_string().contains("no conversation"), "{err}");
}

/// `team stream`: provision or adopt the team's streams and record their
/// identities, as the operator's command does.
async fn team_stream(t: &Thread) {
    teams::provision_streams(
        t.pool(),
        &t.team,
        t.backends.broker().unwrap(),
        &sizes(),
        false,
        &test_actor(),
    )
    .await
    .expect("`team stream`");
}

/// The tombstone reason of each seq of the conversation (`None`: none).
async fn tombstones(t: &Thread) -> Vec<(i64, Option<String>)> {
    sqlx::query_as(
        "SELECT seq, tombstone_reason FROM conversation_messages
          WHERE conversation_id = $1 ORDER BY seq",
    )
    .bind(t.conversation_id)
    .fetch_all(t.pool())
    .await
    .unwrap()
}

// Issue 15 item 5 (M2, M5, M11; lost bodies as src/store/lost_bodies.rs
// knows them). A thread moved to JetStream, its PostgreSQL copies cleaned
// up, then the broker's store wiped and the stream re-created by `team
// stream`; two messages sent after land in the new stream (so old locators 1
// and 2 name them, 3 and 4 lie past its end). The plan names the four lost
// bodies; `--apply` refuses naming them and the two ways out, and changes
// nothing; `--apply --tombstone-lost` tombstones them ("the broker lost this
// body", audited) and moves the rest, whose bodies read fine.
#[tokio::test]
async fn a_move_over_bodies_the_broker_lost_names_them_and_tombstones_them_only_when_told() {
    let t = thread("mv-lost15", 4).await;
    team_stream(&t).await;
    t.run(Direction::ToJetStream).await.unwrap();
    moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    let lost_ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 ORDER BY seq",
    )
    .bind(t.conversation_id)
    .fetch_all(t.pool())
    .await
    .unwrap();

    // The store wiped; `team stream` re-creates the stream.
    let broker = t.backends.broker().unwrap();
    broker
        .js()
        .delete_stream(ai_crew_sync::backend::jetstream::body_stream_name(
            t.team_id,
        ))
        .await
        .unwrap();
    team_stream(&t).await;
    t.send(t.conversation_id, "after the wipe, one")
        .await
        .unwrap();
    t.send(t.conversation_id, "after the wipe, two")
        .await
        .unwrap();
    let workers = t.app.start_publication_workers();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stored: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_messages
              WHERE conversation_id = $1 AND seq > 4 AND publication_state = 'stored'",
        )
        .bind(t.conversation_id)
        .fetch_one(t.pool())
        .await
        .unwrap();
        if stored == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new messages were not published"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    workers.stop().await;
    let before = t.snapshot().await;

    // The plan names them.
    let plan = t.plan_of(Direction::ToPostgres).await;
    let seqs: Vec<i64> = plan.lost.iter().map(|l| l.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "{plan:?}");
    let ids: Vec<Uuid> = plan.lost.iter().map(|l| l.message_id).collect();
    assert_eq!(ids, lost_ids);
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "postgres"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("4 bod(ies) lost by the broker (seqs 1, 2, 3, 4)")
            && shown.contains("--tombstone-lost")
            && !shown.contains("  ready  ("),
        "{shown}"
    );

    // `--apply` alone refuses, naming them, and changes nothing.
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "postgres", "--apply"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success(), "refused");
    let said = String::from_utf8_lossy(&out.stdout);
    for (seq, id) in (1..=4).zip(&lost_ids) {
        assert!(
            said.contains(&format!("seq {seq} (message {id})")),
            "{said}"
        );
    }
    assert!(
        said.contains("4 message(s) whose bodies the broker lost")
            && said.contains("restore the stream")
            && said.contains("--tombstone-lost"),
        "{said}"
    );
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert!(tombstones(&t).await.iter().all(|(_, r)| r.is_none()));
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    assert_eq!(t.snapshot().await, before);

    // With the flag: tombstoned (audited), and the rest moved.
    let out = tokio::task::spawn_blocking({
        let mut command =
            t.command(&["migrate", "--to", "postgres", "--apply", "--tombstone-lost"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("4 lost bod(ies) tombstoned"), "{said}");
    let lost = Some("the broker lost this body".to_owned());
    assert_eq!(
        tombstones(&t).await,
        [
            (1, lost.clone()),
            (2, lost.clone()),
            (3, lost.clone()),
            (4, lost.clone()),
            (5, None),
            (6, None)
        ]
    );
    let audited: Vec<Value> = sqlx::query_scalar(
        "SELECT detail FROM audit_log
          WHERE action = 'conversation.migrate_tombstone_lost' AND subject = $1",
    )
    .bind(t.conversation_id.to_string())
    .fetch_all(t.pool())
    .await
    .unwrap();
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(audited[0]["seqs"], json!([1, 2, 3, 4]));
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    // Every other body reads fine; the lost ones say why.
    let page = t
        .bob
        .call(
            "read_conversation",
            json!({"conversation_id": t.conversation_id, "after_seq": 0, "limit": 50}),
        )
        .await
        .unwrap();
    let messages = page["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 6, "{page}");
    for m in &messages[..4] {
        assert!(m["body"].is_null(), "{m}");
        assert_eq!(m["unavailable"]["reason"], "tombstoned", "{m}");
        assert_eq!(
            m["unavailable"]["detail"], "the broker lost this body",
            "{m}"
        );
    }
    assert_eq!(messages[4]["body"], "after the wipe, one");
    assert_eq!(messages[5]["body"], "after the wipe, two");
}

// Issue 15 item 7 (M2): a move's summary counts bytes as its plan does. A
// resumed run whose first message was verified by the interrupted pass used
// to count only what it copied itself (the issue's 6.6 MB against 8.0 MB).
#[tokio::test]
async fn a_moves_summary_counts_the_bytes_its_plan_counts() {
    let t = thread("mv-bytes15", 5).await;
    let first: (Uuid, String) = sqlx::query_as(
        "SELECT id, body FROM conversation_messages WHERE conversation_id = $1 AND seq = 1",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let broker = JetStreamBackend::new(t.backends.broker().unwrap().clone(), t.team_id);
    let Published::Confirmed(locator) = broker
        .publish(&Envelope {
            message_id: first.0,
            conversation_id: t.conversation_id,
            team_id: t.team_id,
            body: first.1.clone(),
            publish_key: first.0,
        })
        .await
    else {
        panic!("the earlier copy was not published");
    };
    // What an interrupted run left: open, its first item verified.
    let run = t
        .left_run(t.conversation_id, "to_jetstream", "copying", false)
        .await;
    sqlx::query(
        "INSERT INTO conversation_migration_items
             (migration_id, message_id, team_id, body_sha256, bytes, target_locator, state)
         SELECT $1, id, team_id, body_sha256, body_bytes, $3, 'verified'
           FROM conversation_messages WHERE id = $2",
    )
    .bind(run)
    .bind(first.0)
    .bind(&locator.0)
    .execute(t.pool())
    .await
    .unwrap();

    let plan = t.plan_of(Direction::ToJetStream).await;
    assert!(plan.resuming);
    let bytes: i64 = (0..5).map(|i| body_of(i).len() as i64).sum();
    assert_eq!(plan.bytes, bytes);
    let outcome = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!(outcome.migration_id, run);
    assert_eq!(outcome.copied, 4);
    assert_eq!(outcome.bytes, plan.bytes, "the summary counts as the plan");
    assert_eq!(outcome.bytes_copied, bytes - first.1.len() as i64);
}
