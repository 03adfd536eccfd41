//! The outbox and the backend boundary against real PostgreSQL, with faults
//! injected only at the backend boundary (`Faults`), and nowhere else. Each
//! test cites the invariants (listed in ARCHITECTURE.md) it shows
//! (O* for the outbox, B* for the backend).
//!
//! Messages are sent by real MCP clients into a conversation switched to
//! outbox publication on the postgres backend; the workers are not running
//! (no broker), so each test drives the outbox functions itself.

use std::time::Duration;

use ai_crew_sync::backend::{
    BackendKind, Backends, Envelope, Faults, Locator, MessagingBackend, PostgresBackend, Published,
};
use ai_crew_sync::store::conversation_operator;
use ai_crew_sync::store::conversations::Publication;
use ai_crew_sync::store::outbox::{Lease, Settled};
use ai_crew_sync::store::{outbox, teams};
use ai_crew_sync::workers::publication::{self, DrainPass, DrainSettings};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{McpClient, TestApp, spawn_app, test_actor};

/// A conversation of alice (sender) and bob (recipient) on outbox publication.
struct Outboxed {
    app: TestApp,
    team_id: Uuid,
    conversation_id: Uuid,
    alice: McpClient,
    bob: McpClient,
}

impl Outboxed {
    async fn new() -> Outboxed {
        let app = spawn_app().await;
        app.team("ob").await;
        teams::capability(&app.pool, "ob", Some(true), &test_actor())
            .await
            .unwrap();
        let alice = app.mcp(&app.agent("ob", "alice").await, None).await;
        let bob = app.mcp(&app.agent("ob", "bob").await, None).await;
        let created = alice
            .call(
                "create_conversation",
                json!({"title": "Outbox", "private": true, "invite": ["bob"]}),
            )
            .await
            .unwrap();
        let conversation_id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
        bob.call(
            "join_conversation",
            json!({"conversation_id": conversation_id}),
        )
        .await
        .unwrap();
        let team_id: Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = 'ob'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        outbox::set_publication(&app.pool, team_id, conversation_id, Publication::Outbox)
            .await
            .unwrap();
        Outboxed {
            app,
            team_id,
            conversation_id,
            alice,
            bob,
        }
    }

    fn pool(&self) -> &PgPool {
        &self.app.pool
    }

    /// Alice sends `body`; the answer of the tool.
    async fn send(&self, body: &str) -> Value {
        self.alice
            .call(
                "send_conversation_message",
                json!({"conversation_id": self.conversation_id, "body": body,
                       "request_id": Uuid::new_v4()}),
            )
            .await
            .unwrap()
    }

    async fn send_id(&self, body: &str) -> Uuid {
        self.send(body).await["message_id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    async fn read_as_bob(&self) -> Value {
        self.bob
            .call(
                "read_conversation",
                json!({"conversation_id": self.conversation_id}),
            )
            .await
            .unwrap()
    }

    /// Make every slot due now (skip the backoff a test is not about).
    async fn make_due(&self) {
        sqlx::query("UPDATE conversation_outbox SET next_attempt_at = now()")
            .execute(self.pool())
            .await
            .unwrap();
    }

    async fn slot(&self, message_id: Uuid) -> Option<Slot> {
        sqlx::query_as(
            "SELECT state, generation, attempts, leased_by, last_error,
                    extract(epoch FROM lease_expires_at - now())::float8 AS lease_left,
                    extract(epoch FROM next_attempt_at - now())::float8 AS due_in
               FROM conversation_outbox WHERE message_id = $1",
        )
        .bind(message_id)
        .fetch_optional(self.pool())
        .await
        .unwrap()
    }

    async fn message(&self, message_id: Uuid) -> MessageState {
        sqlx::query_as(
            "SELECT publication_state, canonical_locator, uncertain_at IS NOT NULL AS uncertain,
                    tombstone_reason,
                    (SELECT count(*) FROM message_receipts r
                      WHERE r.message_id = m.id AND r.stored_at IS NOT NULL) AS receipts_stored,
                    (SELECT count(*) FROM inbox_references i WHERE i.message_id = m.id) AS references
               FROM conversation_messages m WHERE id = $1",
        )
        .bind(message_id)
        .fetch_one(self.pool())
        .await
        .unwrap()
    }
}

#[derive(sqlx::FromRow, Debug)]
struct Slot {
    state: String,
    generation: i64,
    attempts: i32,
    leased_by: Option<String>,
    last_error: Option<String>,
    lease_left: Option<f64>,
    due_in: f64,
}

#[derive(sqlx::FromRow, Debug)]
struct MessageState {
    publication_state: String,
    canonical_locator: Option<String>,
    uncertain: bool,
    tombstone_reason: Option<String>,
    receipts_stored: i64,
    references: i64,
}

fn backend(pool: &PgPool) -> PostgresBackend {
    PostgresBackend::new(pool.clone())
}

fn faulty(pool: &PgPool, faults: Faults) -> PostgresBackend {
    PostgresBackend::with_faults(pool.clone(), faults)
}

async fn lease(pool: &PgPool) -> Lease {
    outbox::lease(pool, "test-worker")
        .await
        .unwrap()
        .expect("a due slot")
}

// O1: a payload over 1 MiB is refused, naming the cap, before anything is written.
#[tokio::test]
async fn o1_enqueue_refuses_a_payload_over_the_cap_and_writes_nothing() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("small").await;
    let mut tx = t.pool().begin().await.unwrap();
    let err = outbox::enqueue(
        &mut tx,
        Uuid::new_v4(),
        t.conversation_id,
        t.team_id,
        BackendKind::Postgres,
        &"x".repeat(1024 * 1024 + 1),
    )
    .await
    .unwrap_err();
    tx.commit().await.unwrap();
    let text = err.to_string();
    assert!(text.contains("1048576"), "{text}");
    assert!(text.contains("1 MiB"), "{text}");
    let slots: i64 = sqlx::query_scalar("SELECT count(*) FROM conversation_outbox")
        .fetch_one(t.pool())
        .await
        .unwrap();
    assert_eq!(slots, 1, "only the accepted message has a slot");
    assert!(t.slot(message_id).await.is_some());
}

// O2, O3: the send's transaction holds the message, its slot and its pending
// state together; enqueueing the same message again writes no second slot.
#[tokio::test]
async fn o2_o3_a_send_enqueues_one_slot_and_is_pending_until_confirmed() {
    let t = Outboxed::new().await;
    let sent = t.send("hello through the outbox").await;
    assert_eq!(sent["stored"], false);
    assert_eq!(sent["publication"], "pending_publication");
    let message_id: Uuid = sent["message_id"].as_str().unwrap().parse().unwrap();

    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "pending_publication");
    assert_eq!(state.canonical_locator, None);
    assert_eq!(state.receipts_stored, 0, "nothing is stored yet");
    let slot = t.slot(message_id).await.expect("a slot");
    assert_eq!(slot.state, "pending");
    assert_eq!((slot.generation, slot.attempts), (0, 0));

    let key_before: Uuid =
        sqlx::query_scalar("SELECT publish_key FROM conversation_outbox WHERE message_id = $1")
            .bind(message_id)
            .fetch_one(t.pool())
            .await
            .unwrap();
    let mut tx = t.pool().begin().await.unwrap();
    let key_again = outbox::enqueue(
        &mut tx,
        message_id,
        t.conversation_id,
        t.team_id,
        BackendKind::Postgres,
        "hello through the outbox",
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(key_again, key_before, "the same slot, the same key");
    let slots: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_outbox WHERE message_id = $1")
            .bind(message_id)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(slots, 1);

    // A reader sees the gap, explained, and its cursor does not walk past it.
    let page = t.read_as_bob().await;
    let message = &page["messages"][0];
    assert_eq!(message["body"], Value::Null);
    assert_eq!(message["unavailable"]["reason"], "pending_publication");
    assert_eq!(page["next_after_seq"], 0);
}

// O4: the oldest due slot, skip-locked, generation and attempts bumped, a 60 s
// lease under the worker's name; concurrent workers never share a slot.
#[tokio::test]
async fn o4_lease_takes_the_oldest_due_slot_once_across_concurrent_workers() {
    let t = Outboxed::new().await;
    let first = t.send_id("one").await;
    let mut others = Vec::new();
    for i in 0..5 {
        others.push(t.send_id(&format!("more {i}")).await);
    }
    let leased = lease(t.pool()).await;
    assert_eq!(leased.message_id, first, "oldest first");
    assert_eq!((leased.generation, leased.attempts), (1, 1));
    let slot = t.slot(first).await.unwrap();
    assert_eq!(slot.state, "leased");
    assert_eq!(slot.leased_by.as_deref(), Some("test-worker"));
    let left = slot.lease_left.unwrap();
    assert!((55.0..=60.5).contains(&left), "lease of 60 s, {left} left");

    // Eight workers race for the five remaining slots.
    let mut tasks = Vec::new();
    for w in 0..8 {
        let pool = t.pool().clone();
        tasks.push(tokio::spawn(async move {
            outbox::lease(&pool, &format!("w{w}")).await.unwrap()
        }));
    }
    let mut got = Vec::new();
    for task in tasks {
        if let Some(lease) = task.await.unwrap() {
            got.push(lease.message_id);
        }
    }
    got.sort();
    others.sort();
    assert_eq!(got, others, "each slot leased exactly once");
    assert!(outbox::lease(t.pool(), "late").await.unwrap().is_none());
}

// O6, O7: confirmed → slot gone, message stored with its locator, receipts
// stored, references queued, in one transaction.
#[tokio::test]
async fn o6_o7_settling_a_confirmation_stores_the_message_and_queues_references() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("to be stored").await;
    let settled = outbox::run_once(t.pool(), &backend(t.pool()), "w")
        .await
        .unwrap();
    assert_eq!(settled, Some(Settled::Stored));
    assert!(t.slot(message_id).await.is_none(), "the slot is gone");
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "stored");
    assert_eq!(state.canonical_locator, Some(message_id.to_string()));
    assert_eq!(state.receipts_stored, 1, "bob's receipt says stored");
    assert_eq!(state.references, 1, "one reference queued for bob");

    let page = t.read_as_bob().await;
    assert_eq!(page["messages"][0]["body"], "to be stored");
    assert_eq!(page["messages"][0]["publication"], "stored");
    assert_eq!(page["next_after_seq"], 1);
}

// O6: a worker whose lease expired, or whose generation is stale, writes
// nothing: Fenced.
#[tokio::test]
async fn o6_a_settle_after_the_lease_expired_is_fenced_and_writes_nothing() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("contested").await;
    let stale = lease(t.pool()).await;
    // The lease runs out before this worker settles.
    sqlx::query("UPDATE conversation_outbox SET lease_expires_at = now() - interval '1 second'")
        .execute(t.pool())
        .await
        .unwrap();
    let outcome = Published::Confirmed(Locator(message_id.to_string()));
    assert_eq!(
        outbox::settle(t.pool(), &stale, outcome.clone())
            .await
            .unwrap(),
        Settled::Fenced
    );
    assert_eq!(
        t.message(message_id).await.publication_state,
        "pending_publication"
    );
    assert!(t.slot(message_id).await.is_some());

    // Someone else leases it now: the old generation stays fenced for every
    // outcome, and the new holder settles.
    let fresh = lease(t.pool()).await;
    assert_eq!(fresh.generation, stale.generation + 1);
    for late in [
        outcome.clone(),
        Published::Retryable("late".into()),
        Published::Fatal("late".into()),
        Published::Unanswered("late".into()),
    ] {
        assert_eq!(
            outbox::settle(t.pool(), &stale, late).await.unwrap(),
            Settled::Fenced
        );
    }
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(
        (slot.state.as_str(), slot.generation),
        ("leased", fresh.generation)
    );
    assert_eq!(
        outbox::settle(t.pool(), &fresh, outcome).await.unwrap(),
        Settled::Stored
    );
}

// O6 with a slow backend (Faults::delay): the lease expires during the
// publish, another worker takes the slot, and the slow one is fenced. B7:
// nothing is held during the publish (the slot and the conversation row can
// be locked by anyone meanwhile).
#[tokio::test]
async fn o6_a_delayed_worker_whose_lease_expired_is_fenced() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("slow").await;
    let slow = faulty(
        t.pool(),
        Faults {
            delay: Some(Duration::from_millis(600)),
            ..Faults::default()
        },
    );
    let held = lease(t.pool()).await;
    let pool = t.pool().clone();
    let slow_worker = tokio::spawn({
        let held = held.clone();
        async move { outbox::publish_leased(&pool, &slow, &held).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut probe = t.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM conversation_outbox WHERE message_id = $1 FOR UPDATE NOWAIT")
        .bind(message_id)
        .execute(&mut *probe)
        .await
        .expect("no lock is held on the slot during the publish");
    sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE NOWAIT")
        .bind(t.conversation_id)
        .execute(&mut *probe)
        .await
        .expect("no lock is held on the conversation during the publish");
    probe.rollback().await.unwrap();
    sqlx::query("UPDATE conversation_outbox SET lease_expires_at = now() - interval '1 second'")
        .execute(t.pool())
        .await
        .unwrap();
    let other = lease(t.pool()).await;
    assert_eq!(slow_worker.await.unwrap(), Settled::Fenced);
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(
        slot.generation, other.generation,
        "the new holder's slot, untouched"
    );
    assert_eq!(
        outbox::publish_leased(t.pool(), &backend(t.pool()), &other)
            .await
            .unwrap(),
        Settled::Stored
    );
}

// O8, B4: transient failures are retried with a backoff and the message is
// stored once; the retryable budget is one, shared by every clone.
#[tokio::test]
async fn o8_b4_transient_failures_are_retried_and_stored_once() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("eventually").await;
    let flaky = faulty(
        t.pool(),
        Faults {
            retryable: 2,
            ..Faults::default()
        },
    );
    let clone = flaky.clone();
    assert_eq!(
        outbox::run_once(t.pool(), &flaky, "w").await.unwrap(),
        Some(Settled::Retrying { attempts: 1 })
    );
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(slot.state, "pending");
    assert_eq!(slot.leased_by, None);
    assert_eq!(
        slot.last_error.as_deref(),
        Some("the backend was unreachable")
    );
    assert!(
        (1.0..=2.5).contains(&slot.due_in),
        "backoff 2^1 s, due in {}",
        slot.due_in
    );
    assert!(
        outbox::lease(t.pool(), "w").await.unwrap().is_none(),
        "not due during the backoff"
    );
    t.make_due().await;
    assert_eq!(
        outbox::run_once(t.pool(), &clone, "w").await.unwrap(),
        Some(Settled::Retrying { attempts: 2 })
    );
    let due_in = t.slot(message_id).await.unwrap().due_in;
    assert!(
        (3.0..=4.5).contains(&due_in),
        "backoff 2^2 s, due in {due_in}"
    );
    t.make_due().await;
    assert_eq!(
        outbox::run_once(t.pool(), &flaky, "w").await.unwrap(),
        Some(Settled::Stored),
        "the budget of two failures is spent across both clones"
    );
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "stored");
    assert_eq!(state.references, 1, "stored once, one reference");
}

// O8: after 8 attempts a retryable slot is failed, slot and message together,
// and the failure is visible to a reader.
#[tokio::test]
async fn o8_a_slot_that_keeps_failing_is_failed_after_eight_attempts() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("never").await;
    let down = faulty(
        t.pool(),
        Faults {
            retryable: 100,
            ..Faults::default()
        },
    );
    for attempt in 1..=7 {
        assert_eq!(
            outbox::run_once(t.pool(), &down, "w").await.unwrap(),
            Some(Settled::Retrying { attempts: attempt })
        );
        t.make_due().await;
    }
    assert_eq!(
        outbox::run_once(t.pool(), &down, "w").await.unwrap(),
        Some(Settled::Failed)
    );
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!((slot.state.as_str(), slot.attempts), ("failed", 8));
    assert_eq!(t.message(message_id).await.publication_state, "failed");
    let page = t.read_as_bob().await;
    assert_eq!(page["messages"][0]["unavailable"]["reason"], "failed");
    assert_eq!(
        page["next_after_seq"], 1,
        "a failure is settled: the cursor passes it"
    );
    let status = outbox::status(t.pool(), t.team_id).await.unwrap();
    assert_eq!(
        (status.pending, status.failed, status.pending_bytes),
        (0, 1, 0)
    );
}

// O9: a fatal outcome fails the slot with its error and the message, at once.
#[tokio::test]
async fn o9_a_fatal_outcome_fails_slot_and_message_at_once() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("refused").await;
    let refusing = faulty(
        t.pool(),
        Faults {
            fatal: true,
            ..Faults::default()
        },
    );
    assert_eq!(
        outbox::run_once(t.pool(), &refusing, "w").await.unwrap(),
        Some(Settled::Failed)
    );
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(slot.state, "failed");
    assert_eq!(slot.attempts, 1);
    assert_eq!(
        slot.last_error.as_deref(),
        Some("the backend refused this payload")
    );
    assert_eq!(t.message(message_id).await.publication_state, "failed");
    let sent_again = t
        .alice
        .call(
            "get_conversation_message",
            json!({"message_id": message_id}),
        )
        .await
        .unwrap();
    assert_eq!(sent_again["unavailable"]["reason"], "failed");
}

// O10, O11: a lost confirmation on the last attempt is reconciled to stored,
// not failed, and not stored twice.
#[tokio::test]
async fn o10_o11_a_lost_confirmation_on_the_last_attempt_is_reconciled_to_stored() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("landed quietly").await;
    let lossy = faulty(
        t.pool(),
        Faults {
            lose_confirmation: true,
            ..Faults::default()
        },
    );
    // Earlier attempts just retry (cheaper than asking).
    assert_eq!(
        outbox::run_once(t.pool(), &lossy, "w").await.unwrap(),
        Some(Settled::Retrying { attempts: 1 })
    );
    // The last attempt asks before writing a failure.
    sqlx::query("UPDATE conversation_outbox SET attempts = 7, next_attempt_at = now()")
        .execute(t.pool())
        .await
        .unwrap();
    assert_eq!(
        outbox::run_once(t.pool(), &lossy, "w").await.unwrap(),
        Some(Settled::Stored)
    );
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "stored");
    assert_eq!(state.canonical_locator, Some(message_id.to_string()));
    assert_eq!(state.references, 1);

    // O10 directly: reconcile of a slot the backend holds nothing for is an
    // ordinary retry.
    let other = t.send_id("not landed").await;
    let held = lease(t.pool()).await;
    assert_eq!(held.message_id, other);
    assert_eq!(
        outbox::reconcile(t.pool(), &backend(t.pool()), &held)
            .await
            .unwrap(),
        Settled::Retrying { attempts: 1 }
    );
    assert_eq!(
        t.slot(other).await.unwrap().last_error.as_deref(),
        Some("the backend holds nothing for this key")
    );
}

// O12: a worker for another backend puts the slot back without spending an
// attempt and reports Fenced; the message is untouched.
#[tokio::test]
async fn o12_a_worker_for_another_backend_releases_the_slot_without_an_attempt() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("for the broker").await;
    sqlx::query("UPDATE conversation_outbox SET backend = 'jetstream'")
        .execute(t.pool())
        .await
        .unwrap();
    assert_eq!(
        outbox::run_once(t.pool(), &backend(t.pool()), "w")
            .await
            .unwrap(),
        Some(Settled::Fenced)
    );
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(slot.state, "pending");
    assert_eq!(slot.attempts, 0, "the attempt was given back");
    assert_eq!(slot.leased_by, None);
    assert_eq!(
        slot.last_error.as_deref(),
        Some("leased by a worker for another backend")
    );
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "pending_publication");
    assert_eq!(state.canonical_locator, None, "nothing was published");
}

// O14: status per team: pending, leased, failed, oldest pending age, pending
// bytes without the failed ones.
#[tokio::test]
async fn o14_status_counts_what_is_outstanding() {
    let t = Outboxed::new().await;
    assert_eq!(
        outbox::status(t.pool(), t.team_id).await.unwrap(),
        outbox::Status::default()
    );
    t.send_id("aaaa").await; // 4 bytes, will be leased
    t.send_id("bbbbbb").await; // 6 bytes, will fail
    t.send_id("cc").await; // 2 bytes, stays pending
    sqlx::query("UPDATE conversation_outbox SET created_at = now() - interval '90 seconds'")
        .execute(t.pool())
        .await
        .unwrap();
    let _held = lease(t.pool()).await;
    let failing = lease(t.pool()).await;
    outbox::settle(t.pool(), &failing, Published::Fatal("no".into()))
        .await
        .unwrap();
    let status = outbox::status(t.pool(), t.team_id).await.unwrap();
    assert_eq!((status.pending, status.leased, status.failed), (1, 1, 1));
    assert_eq!(
        status.pending_bytes, 6,
        "4 leased + 2 pending; the failed 6 excluded"
    );
    let oldest = status.oldest_pending_seconds.unwrap();
    assert!((89..=95).contains(&oldest), "{oldest}");
}

// O15: back to sync is refused while anything is in flight, and allowed once
// it settled; the lock is the conversation row a send takes.
#[tokio::test]
async fn o15_returning_to_sync_is_refused_while_anything_is_pending() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("in flight").await;
    let err = outbox::set_publication(t.pool(), t.team_id, t.conversation_id, Publication::Sync)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("1 message(s)"), "{text}");
    assert!(text.contains("awaiting publication"), "{text}");
    let publication: String =
        sqlx::query_scalar("SELECT publication FROM conversations WHERE id = $1")
            .bind(t.conversation_id)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(publication, "outbox");

    outbox::run_once(t.pool(), &backend(t.pool()), "w")
        .await
        .unwrap();
    assert_eq!(t.message(message_id).await.publication_state, "stored");
    outbox::set_publication(t.pool(), t.team_id, t.conversation_id, Publication::Sync)
        .await
        .unwrap();
    let sent = t.send("synchronous again").await;
    assert_eq!(sent["stored"], true);
    assert_eq!(sent["publication"], "stored");
}

/// `ai-crew-sync ARGS` against the test's database, as an operator runs it.
async fn operator_cli(t: &Outboxed, args: &[&str]) -> std::process::Output {
    let database_url = t.app.database_url.clone();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .args(&args)
            .env("DATABASE_URL", database_url)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The `audit_log` rows of one action: (actor, detail).
async fn audited(t: &Outboxed, action: &str) -> Vec<(String, Value)> {
    sqlx::query_as("SELECT actor, detail FROM audit_log WHERE action = $1 ORDER BY id")
        .bind(action)
        .fetch_all(t.pool())
        .await
        .unwrap()
}

async fn publication_of(t: &Outboxed) -> String {
    sqlx::query_scalar("SELECT publication FROM conversations WHERE id = $1")
        .bind(t.conversation_id)
        .fetch_one(t.pool())
        .await
        .unwrap()
}

// O15 through the operator's command: `conversations publication` back to
// sync is refused while a slot remains (the message explains the gap, nothing
// changes, nothing is audited), allowed once it settled, audited once per
// change, and a switch to the mode it already has writes nothing.
#[tokio::test]
async fn o15_the_publication_command_refuses_sync_while_slots_remain_and_audits_the_switch() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("in flight").await;
    let conversation = t.conversation_id.to_string();
    let to = |mode: &'static str| {
        [
            "conversations",
            "publication",
            "--team",
            "ob",
            "--conversation",
            conversation.as_str(),
            "--mode",
            mode,
            "--json",
        ]
    };

    let refused = operator_cli(&t, &to("sync")).await;
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("1 message(s)"), "{said}");
    assert!(said.contains("awaiting publication"), "{said}");
    assert!(said.contains("a gap nobody will close"), "{said}");
    assert_eq!(publication_of(&t).await, "outbox", "nothing changed");
    assert!(audited(&t, "conversation.publication").await.is_empty());

    outbox::run_once(t.pool(), &backend(t.pool()), "w")
        .await
        .unwrap();
    assert_eq!(t.message(message_id).await.publication_state, "stored");
    let switched = operator_cli(&t, &to("sync")).await;
    assert!(
        switched.status.success(),
        "{}",
        String::from_utf8_lossy(&switched.stderr)
    );
    let answer: Value = serde_json::from_slice(&switched.stdout).unwrap();
    assert_eq!(
        (&answer["before"], &answer["after"], &answer["changed"]),
        (&json!("outbox"), &json!("sync"), &json!(true))
    );
    assert_eq!(publication_of(&t).await, "sync");
    let rows = audited(&t, "conversation.publication").await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].0.starts_with("cli:"), "{rows:?}");
    assert_eq!(rows[0].1["before"], "outbox");
    assert_eq!(rows[0].1["after"], "sync");
    let sent = t.send("synchronous again").await;
    assert_eq!(sent["stored"], true);

    let again = operator_cli(&t, &to("sync")).await;
    let answer: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(answer["changed"], false);
    assert_eq!(audited(&t, "conversation.publication").await.len(), 1);

    let bad = operator_cli(&t, &to("later")).await;
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("`sync`") && said.contains("`outbox`"),
        "{said}"
    );

    // A move open on it sets the publication when it cuts over: refused.
    sqlx::query(
        "INSERT INTO conversation_migrations (id, team_id, conversation_id, direction, state, started_by)
         VALUES ($1, $2, $3, 'to_jetstream', 'copying', 'test')",
    )
    .bind(Uuid::new_v4())
    .bind(t.team_id)
    .bind(t.conversation_id)
    .execute(t.pool())
    .await
    .unwrap();
    let during_move = operator_cli(&t, &to("outbox")).await;
    assert!(!during_move.status.success());
    let said = String::from_utf8_lossy(&during_move.stderr);
    assert!(said.contains("open move (to_jetstream, copying)"), "{said}");
    assert_eq!(publication_of(&t).await, "sync", "nothing changed");
    sqlx::query("UPDATE conversation_migrations SET state = 'failed' WHERE conversation_id = $1")
        .bind(t.conversation_id)
        .execute(t.pool())
        .await
        .unwrap();

    let back = operator_cli(&t, &to("outbox")).await;
    assert!(back.status.success());
    assert_eq!(publication_of(&t).await, "outbox");
    assert_eq!(audited(&t, "conversation.publication").await.len(), 2);
    assert_eq!(t.send("queued again").await["stored"], false);
}

// O15: the switch takes the conversation row a send takes. A send holding it
// whose slot is not committed yet is waited for, and its slot is counted, so
// the switch to sync is refused instead of stranding that slot.
#[tokio::test]
async fn o15_the_switch_waits_for_a_send_holding_the_conversation_row() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("first").await;
    outbox::run_once(t.pool(), &backend(t.pool()), "w")
        .await
        .unwrap();
    assert_eq!(t.message(message_id).await.publication_state, "stored");

    // What a send into the outbox does: the conversation row, then a slot.
    let mut sending = t.pool().begin().await.unwrap();
    sqlx::query("UPDATE conversations SET last_seq = last_seq WHERE id = $1")
        .bind(t.conversation_id)
        .execute(&mut *sending)
        .await
        .unwrap();
    outbox::enqueue(
        &mut sending,
        message_id,
        t.conversation_id,
        t.team_id,
        BackendKind::Postgres,
        "first",
    )
    .await
    .unwrap();

    let pool = t.pool().clone();
    let conversation_id = t.conversation_id;
    let switch = tokio::spawn(async move {
        conversation_operator::set_publication(
            &pool,
            "ob",
            conversation_id,
            Publication::Sync,
            &test_actor(),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !switch.is_finished(),
        "the switch must wait for the send holding the conversation row"
    );
    sending.commit().await.unwrap();
    let err = switch.await.unwrap().unwrap_err().to_string();
    assert!(err.contains("1 message(s)"), "{err}");
    assert_eq!(publication_of(&t).await, "outbox");
    assert!(audited(&t, "conversation.publication").await.is_empty());
}

// O19 through the operator's command: `conversations tombstone` records the
// time and the reason once (a second one is refused and changes neither),
// readers are told the reason instead of the body, and the message, its seq,
// its recipients and receipts stay. Audited; bad input changes nothing.
#[tokio::test]
async fn o19_the_tombstone_command_records_once_and_readers_see_the_reason() {
    let t = Outboxed::new().await;
    let first = t.send_id("a secret pasted by mistake").await;
    t.send_id("the follow-up").await;
    for _ in 0..2 {
        outbox::run_once(t.pool(), &backend(t.pool()), "w")
            .await
            .unwrap();
    }
    let conversation = t.conversation_id.to_string();
    let tombstone = |seq: &'static str, reason: &'static str| {
        [
            "conversations",
            "tombstone",
            "--team",
            "ob",
            "--conversation",
            conversation.as_str(),
            "--seq",
            seq,
            "--reason",
            reason,
            "--json",
        ]
    };

    let done = operator_cli(&t, &tombstone("1", "it held a credential")).await;
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let answer: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(answer["message_id"], first.to_string());
    assert_eq!(answer["seq"], 1);
    let shown = "tombstoned by an operator: it held a credential";
    assert_eq!(answer["reason"], shown);
    let at: (chrono::DateTime<chrono::Utc>, String) = sqlx::query_as(
        "SELECT tombstoned_at, tombstone_reason FROM conversation_messages WHERE id = $1",
    )
    .bind(first)
    .fetch_one(t.pool())
    .await
    .unwrap();

    let page = t.read_as_bob().await;
    let messages = page["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "the message stays in the thread");
    assert_eq!(messages[0]["seq"], 1);
    assert_eq!(messages[0]["body"], Value::Null);
    assert_eq!(messages[0]["unavailable"]["reason"], "tombstoned");
    assert_eq!(messages[0]["unavailable"]["detail"], shown);
    assert!(messages[0]["my_receipt"]["stored_at"].is_string());
    assert_eq!(messages[1]["body"], "the follow-up");
    let receipts = t.message(first).await;
    assert_eq!(receipts.receipts_stored, 1, "receipts stay");
    assert_eq!(receipts.publication_state, "stored");

    let rows = audited(&t, "conversation.tombstone").await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].0.starts_with("cli:"), "{rows:?}");
    assert_eq!(rows[0].1["seq"], 1);
    assert_eq!(rows[0].1["reason"], "it held a credential");

    let twice = operator_cli(&t, &tombstone("1", "another reason")).await;
    assert!(!twice.status.success());
    let said = String::from_utf8_lossy(&twice.stderr);
    assert!(said.contains("already tombstoned"), "{said}");
    assert!(said.contains("it held a credential"), "{said}");
    let after: (chrono::DateTime<chrono::Utc>, String) = sqlx::query_as(
        "SELECT tombstoned_at, tombstone_reason FROM conversation_messages WHERE id = $1",
    )
    .bind(first)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(after, at, "the first time and reason stay");
    assert_eq!(audited(&t, "conversation.tombstone").await.len(), 1);

    for (seq, reason, expect) in [
        ("2", "  ", "needs a reason"),
        ("2", "two\nlines", "control character"),
        ("9", "gone", "no message with seq 9"),
    ] {
        let out = operator_cli(&t, &tombstone(seq, reason)).await;
        assert!(!out.status.success());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(expect), "{said}");
    }
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages WHERE tombstoned_at IS NOT NULL",
    )
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(untouched, 1, "refused input tombstoned nothing");
    assert_eq!(audited(&t, "conversation.tombstone").await.len(), 1);
}

// O16: an attempt without an answer is marked uncertain, not failed and not
// retried at once: pending again in 5 s, holder cleared, uncertain_at once.
#[tokio::test]
async fn o16_an_unanswered_publish_is_marked_uncertain() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("unknown fate").await;
    let held = lease(t.pool()).await;
    assert_eq!(
        outbox::settle(t.pool(), &held, Published::Unanswered("timed out".into()))
            .await
            .unwrap(),
        Settled::Retrying { attempts: 1 }
    );
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(slot.state, "pending");
    assert_eq!(slot.leased_by, None);
    assert_eq!(slot.last_error.as_deref(), Some("timed out"));
    assert!((4.0..=5.5).contains(&slot.due_in), "{}", slot.due_in);
    let first: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT uncertain_at FROM conversation_messages WHERE id = $1")
            .bind(message_id)
            .fetch_one(t.pool())
            .await
            .unwrap();
    let state = t.message(message_id).await;
    assert!(state.uncertain);
    assert_eq!(state.publication_state, "pending_publication");
    let page = t.read_as_bob().await;
    assert_eq!(
        page["messages"][0]["unavailable"]["reason"],
        "pending_publication"
    );
    assert!(
        page["messages"][0]["unavailable"]["detail"]
            .as_str()
            .unwrap()
            .contains("without an answer")
    );
    assert_eq!(
        outbox::status(t.pool(), t.team_id).await.unwrap().uncertain,
        1
    );

    // Fenced on the generation; a second mark keeps the first timestamp.
    assert_eq!(
        outbox::mark_uncertain(t.pool(), &held, "again")
            .await
            .unwrap(),
        Settled::Retrying { attempts: 1 },
        "same generation: still the holder's to mark"
    );
    t.make_due().await;
    let next = lease(t.pool()).await;
    assert_eq!(
        outbox::mark_uncertain(t.pool(), &held, "stale")
            .await
            .unwrap(),
        Settled::Fenced
    );
    outbox::mark_uncertain(t.pool(), &next, "again")
        .await
        .unwrap();
    let still: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT uncertain_at FROM conversation_messages WHERE id = $1")
            .bind(message_id)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(still, first, "uncertain_at is set once");
}

/// An uncertain message whose body did land (the backend wrote it and the
/// answer was lost), with its slot pending again.
async fn landed_but_uncertain(t: &Outboxed, body: &str) -> Uuid {
    let message_id = t.send_id(body).await;
    let held = lease(t.pool()).await;
    let lossy = faulty(
        t.pool(),
        Faults {
            lose_confirmation: true,
            ..Faults::default()
        },
    );
    assert!(matches!(
        lossy.publish(&held.envelope()).await,
        Published::Retryable(_)
    ));
    outbox::mark_uncertain(t.pool(), &held, "no answer")
        .await
        .unwrap();
    message_id
}

// O17, O5, O13: resolve_uncertain leases each uncertain slot itself (never a
// failed one), settles what the backend holds, puts back what it does not,
// and clears uncertain_at on what became stored.
#[tokio::test]
async fn o17_resolving_uncertain_slots_settles_from_what_the_backend_holds() {
    let t = Outboxed::new().await;
    let landed = landed_but_uncertain(&t, "landed").await;
    // One that did not land: uncertain, with nothing at the backend.
    let missing = t.send_id("missing").await;
    let held = lease(t.pool()).await;
    assert_eq!(held.message_id, missing);
    outbox::mark_uncertain(t.pool(), &held, "no answer")
        .await
        .unwrap();
    // One that failed for good while uncertain: never taken again (O5).
    let failed = t.send_id("failed").await;
    let held = lease(t.pool()).await;
    outbox::mark_uncertain(t.pool(), &held, "no answer")
        .await
        .unwrap();
    sqlx::query("UPDATE conversation_outbox SET state = 'failed' WHERE message_id = $1")
        .bind(failed)
        .execute(t.pool())
        .await
        .unwrap();
    let failed_generation = t.slot(failed).await.unwrap().generation;

    let resolved = outbox::resolve_uncertain(t.pool(), &backend(t.pool()), t.team_id)
        .await
        .unwrap();
    assert_eq!(resolved, 1);
    let state = t.message(landed).await;
    assert_eq!(state.publication_state, "stored");
    assert!(!state.uncertain, "uncertain_at cleared once stored");
    assert!(t.slot(landed).await.is_none());

    // O13: the missing one is back to pending, no holder, attempts untouched.
    let slot = t.slot(missing).await.unwrap();
    assert_eq!(slot.state, "pending");
    assert_eq!(slot.leased_by, None);
    assert_eq!(slot.attempts, 1);
    assert!(
        t.message(missing).await.uncertain,
        "still uncertain until it lands"
    );

    // O5: the failed slot was not leased (its generation did not move).
    let slot = t.slot(failed).await.unwrap();
    assert_eq!(
        (slot.state.as_str(), slot.generation),
        ("failed", failed_generation)
    );
}

// O17: a reconcile that fails puts the slot back and reports the error.
#[tokio::test]
async fn o17_a_failing_reconcile_reports_its_error_and_puts_the_slot_back() {
    let t = Outboxed::new().await;
    let message_id = landed_but_uncertain(&t, "cannot ask").await;
    let mute = faulty(
        t.pool(),
        Faults {
            fail_reconcile: true,
            ..Faults::default()
        },
    );
    let err = outbox::resolve_uncertain(t.pool(), &mute, t.team_id)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("could not be asked"), "{err}");
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(slot.state, "pending", "put back, not left leased");
    assert_eq!(slot.leased_by, None);
    assert_eq!(
        t.message(message_id).await.publication_state,
        "pending_publication"
    );
}

// O18: without a broker nothing is ever released (the body is the last copy
// anyone can vouch for).
#[tokio::test]
async fn o18_the_sweep_releases_nothing_without_a_broker() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("keep me").await;
    outbox::run_once(t.pool(), &backend(t.pool()), "w")
        .await
        .unwrap();
    // Pretend the thread is on a broker-backed conversation.
    for pretend in [
        "UPDATE conversations SET backend = 'jetstream'",
        "UPDATE conversation_messages SET backend = 'jetstream', created_at = now() - interval '1 hour'",
    ] {
        sqlx::query(pretend).execute(t.pool()).await.unwrap();
    }
    let released = outbox::release_published_bodies(t.pool(), &t.app.bus.backends, None, 0)
        .await
        .unwrap();
    assert_eq!(released, 0);
    let body: String = sqlx::query_scalar("SELECT body FROM conversation_messages WHERE id = $1")
        .bind(message_id)
        .fetch_one(t.pool())
        .await
        .unwrap();
    assert_eq!(body, "keep me");
}

// O19: a tombstone's time is recorded once and its reason is the latest one
// given (`tombstone_reason = $2`); the message, its seq,
// recipients and receipts stay, and a reader is told why.
#[tokio::test]
async fn o19_a_tombstone_explains_the_gap_and_keeps_the_message() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("soon gone").await;
    outbox::run_once(t.pool(), &backend(t.pool()), "w")
        .await
        .unwrap();
    outbox::tombstone(t.pool(), message_id, "the stream was deleted")
        .await
        .unwrap();
    let first: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT tombstoned_at FROM conversation_messages WHERE id = $1")
            .bind(message_id)
            .fetch_one(t.pool())
            .await
            .unwrap();
    outbox::tombstone(t.pool(), message_id, "tombstoned by the operator")
        .await
        .unwrap();
    let state = t.message(message_id).await;
    assert_eq!(
        state.tombstone_reason.as_deref(),
        Some("tombstoned by the operator"),
        "the latest reason is kept (O19)"
    );
    let again: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT tombstoned_at FROM conversation_messages WHERE id = $1")
            .bind(message_id)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(again, first, "the time is set once");
    let page = t.read_as_bob().await;
    let message = &page["messages"][0];
    assert_eq!(message["seq"], 1);
    assert_eq!(message["body"], Value::Null);
    assert_eq!(message["unavailable"]["reason"], "tombstoned");
    assert_eq!(
        message["unavailable"]["detail"],
        "tombstoned by the operator"
    );
    assert!(
        message["my_receipt"]["stored_at"].is_string(),
        "the receipt stays"
    );
    let receipts = t
        .alice
        .call("get_message_receipts", json!({"message_id": message_id}))
        .await
        .unwrap();
    assert_eq!(receipts["total"], 1);
}

// B2, B3, B5, B6: the postgres backend's locator is the message id; fetch
// refuses another message's locator and a malformed one, and reads only its
// team; publish is idempotent; retain deletes nothing; reconcile only looks.
#[tokio::test]
async fn b2_b3_b5_b6_the_postgres_backend_keeps_its_promises() {
    let t = Outboxed::new().await;
    let first = t.send_id("first body").await;
    let second = t.send_id("second body").await;
    let pg = backend(t.pool());

    // B6: before any publish, reconcile finds nothing and writes nothing.
    let key: Uuid =
        sqlx::query_scalar("SELECT publish_key FROM conversation_outbox WHERE message_id = $1")
            .bind(first)
            .fetch_one(t.pool())
            .await
            .unwrap();
    let keyed = Envelope {
        message_id: first,
        conversation_id: t.conversation_id,
        team_id: t.team_id,
        body: "first body".into(),
        publish_key: key,
    };
    assert_eq!(pg.reconcile(&keyed).await.unwrap(), None);
    assert_eq!(t.message(first).await.canonical_locator, None, "no write");

    // B3: publishing twice answers the same locator.
    let locator = Locator(first.to_string());
    assert_eq!(
        pg.publish(&keyed).await,
        Published::Confirmed(locator.clone())
    );
    assert_eq!(
        pg.publish(&keyed).await,
        Published::Confirmed(locator.clone())
    );
    assert_eq!(pg.reconcile(&keyed).await.unwrap(), Some(locator.clone()));

    // B2: the locator reads its own message only.
    assert_eq!(
        pg.fetch(&locator, first).await.unwrap().as_deref(),
        Some("first body")
    );
    let err = pg.fetch(&locator, second).await.unwrap_err();
    assert_eq!(err.kind(), "forbidden", "{err}");
    let err = pg
        .fetch(&Locator("jetstream:ACS_T_x:1".into()), first)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "invalid", "{err}");
    let foreign = backend(t.pool()).for_team(Uuid::new_v4());
    assert_eq!(foreign.fetch(&locator, first).await.unwrap(), None);
    let own = backend(t.pool()).for_team(t.team_id);
    assert!(own.fetch(&locator, first).await.unwrap().is_some());

    // B5: retain deletes nothing.
    assert_eq!(pg.retain(std::slice::from_ref(&locator)).await.unwrap(), 0);
    let bodies: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_messages WHERE body <> ''")
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(bodies, 2);
}

// ------------------------------------------------- invariants that bite --
//
// Each test below fails when the line it guards is removed or inverted; the
// mutation tried is named in its comment.

// O4: the lease takes the oldest due slot, not whatever the table scan meets
// first. The oldest slot is rewritten last, so in heap order it comes after
// the others. (Mutation: drop `ORDER BY next_attempt_at, created_at` from
// `lease_due`: the scan hands out the second message first.)
#[tokio::test]
async fn o4_the_lease_takes_the_oldest_due_slot_not_the_first_in_the_heap() {
    let t = Outboxed::new().await;
    let oldest = t.send_id("oldest").await;
    let second = t.send_id("second").await;
    let third = t.send_id("third").await;
    // One due time for all, then the oldest row updated again: its live
    // version is now the last one in the table's heap.
    sqlx::query("UPDATE conversation_outbox SET next_attempt_at = now() - interval '1 minute'")
        .execute(t.pool())
        .await
        .unwrap();
    sqlx::query("UPDATE conversation_outbox SET last_error = 'touched' WHERE message_id = $1")
        .bind(oldest)
        .execute(t.pool())
        .await
        .unwrap();
    let heap: Vec<Uuid> = sqlx::query_scalar("SELECT message_id FROM conversation_outbox")
        .fetch_all(t.pool())
        .await
        .unwrap();
    assert_ne!(heap.first(), Some(&oldest), "heap order differs: {heap:?}");
    // On a table this small the planner walks the due index, whose order
    // would hide a lease that forgot its ORDER BY; a larger table is read in
    // heap order. Leases here go through connections that scan the heap.
    let database: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(t.pool())
        .await
        .unwrap();
    for setting in ["enable_indexscan", "enable_bitmapscan"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE \"{database}\" SET {setting} = off"
        )))
        .execute(t.pool())
        .await
        .unwrap();
    }
    let scanning = PgPool::connect(&t.app.database_url).await.unwrap();

    let first = outbox::lease(&scanning, "test-worker")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.message_id, oldest, "oldest first");
    let rest: Vec<Uuid> = outbox::lease_due(&scanning, "w2", None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.message_id)
        .collect();
    assert_eq!(rest, vec![second, third], "then in created order");
}

// O5: `lease_one` never takes a failed slot, and counts no attempt on the
// slot it takes. (Mutation: drop `AND o.state IN ('pending', 'leased')` from
// `lease_one`: the failed slot is leased and its generation moves.)
#[tokio::test]
async fn o5_lease_one_never_takes_a_failed_slot() {
    let t = Outboxed::new().await;
    let failed = t.send_id("failed for good").await;
    let held = lease(t.pool()).await;
    assert_eq!(
        outbox::settle(t.pool(), &held, Published::Fatal("refused".into()))
            .await
            .unwrap(),
        Settled::Failed
    );
    let before = t.slot(failed).await.unwrap();
    assert_eq!(before.state, "failed");
    assert!(
        outbox::lease_one(t.pool(), "reconciler", failed)
            .await
            .unwrap()
            .is_none(),
        "a failed slot is terminal"
    );
    let after = t.slot(failed).await.unwrap();
    assert_eq!(
        (after.state.as_str(), after.generation, after.leased_by),
        ("failed", before.generation, None)
    );

    let pending = t.send_id("still in flight").await;
    let taken = outbox::lease_one(t.pool(), "reconciler", pending)
        .await
        .unwrap()
        .expect("a pending slot is taken");
    assert_eq!(
        (taken.generation, taken.attempts),
        (1, 0),
        "no attempt counted"
    );
}

// O6: the batch settle the drain uses is fenced like the single one: a slot
// whose lease ran out, or that someone else leased since (a newer
// generation), writes nothing; a held one in the same batch is stored.
// (Mutations: drop `AND o.generation = s.generation`, then drop
// `AND o.lease_expires_at > now()`, in `settle_confirmed_batch`: the stale
// slot, then the expired one, is stored.)
#[tokio::test]
async fn o6_the_batch_settle_is_fenced_on_generation_and_an_unexpired_lease() {
    let t = Outboxed::new().await;
    let expired = t.send_id("lease ran out").await;
    let stale = t.send_id("leased again by another worker").await;
    let held = t.send_id("still held").await;
    let leases = outbox::lease_due(t.pool(), "slow", None, 3).await.unwrap();
    assert_eq!(
        leases.iter().map(|l| l.message_id).collect::<Vec<_>>(),
        vec![expired, stale, held]
    );
    // Another worker takes `stale` once the slow worker's lease on it ran
    // out; the lease on `expired` runs out with nobody taking it.
    let expire = async |id: Uuid| {
        sqlx::query(
            "UPDATE conversation_outbox SET lease_expires_at = now() - interval '1 second'
              WHERE message_id = $1",
        )
        .bind(id)
        .execute(t.pool())
        .await
        .unwrap();
    };
    expire(stale).await;
    let newer = outbox::lease_due(t.pool(), "fast", None, 3).await.unwrap();
    assert_eq!(
        newer.iter().map(|l| l.message_id).collect::<Vec<_>>(),
        vec![stale]
    );
    expire(expired).await;

    let confirmed: Vec<(Lease, Locator)> = leases
        .iter()
        .map(|l| (l.clone(), Locator(l.message_id.to_string())))
        .collect();
    let stored = outbox::settle_confirmed_batch(t.pool(), &confirmed)
        .await
        .unwrap();
    assert_eq!(stored, vec![held], "only the held slot is stored");
    for fenced in [expired, stale] {
        let state = t.message(fenced).await;
        assert_eq!(state.publication_state, "pending_publication", "{fenced}");
        assert_eq!(state.canonical_locator, None);
        assert_eq!(state.references, 0);
        assert!(t.slot(fenced).await.is_some(), "{fenced}: slot kept");
    }
    let slot = t.slot(stale).await.unwrap();
    assert_eq!(
        (slot.leased_by.as_deref(), slot.generation),
        (Some("fast"), leases[1].generation + 1),
        "the new holder's slot, untouched"
    );
    assert_eq!(t.message(held).await.publication_state, "stored");
}

// O8: the backoff exponent is capped at 6: a seventh failure waits 2^6 s,
// not 2^7. (Mutation: `attempts.clamp(0, 6)` → `attempts.clamp(0, 7)` in
// `settle_retryable`: due in 128 s.)
#[tokio::test]
async fn o8_the_backoff_is_capped_at_two_to_the_sixth() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("keeps failing").await;
    sqlx::query("UPDATE conversation_outbox SET attempts = 6")
        .execute(t.pool())
        .await
        .unwrap();
    let down = faulty(
        t.pool(),
        Faults {
            retryable: 1,
            ..Faults::default()
        },
    );
    assert_eq!(
        outbox::run_once(t.pool(), &down, "w").await.unwrap(),
        Some(Settled::Retrying { attempts: 7 })
    );
    let due_in = t.slot(message_id).await.unwrap().due_in;
    assert!(
        (63.0..=64.5).contains(&due_in),
        "backoff 2^min(7,6) = 64 s, due in {due_in}"
    );
}

// O10: `reconcile` answering Some(locator) settles the message as stored with
// that locator; None is an ordinary retry. (Mutation: the `Some(locator)` arm
// settles `Retryable` instead: the message stays pending.)
#[tokio::test]
async fn o10_reconcile_with_a_locator_stores_the_message_under_it() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("landed, answer lost").await;
    let held = lease(t.pool()).await;
    let lossy = faulty(
        t.pool(),
        Faults {
            lose_confirmation: true,
            ..Faults::default()
        },
    );
    assert!(matches!(
        lossy.publish(&held.envelope()).await,
        Published::Retryable(_)
    ));
    assert_eq!(
        outbox::reconcile(t.pool(), &backend(t.pool()), &held)
            .await
            .unwrap(),
        Settled::Stored
    );
    assert!(t.slot(message_id).await.is_none(), "the slot is gone");
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "stored");
    assert_eq!(state.canonical_locator, Some(message_id.to_string()));
    assert_eq!(state.receipts_stored, 1);
    assert_eq!(state.references, 1);
    assert_eq!(
        t.read_as_bob().await["messages"][0]["body"],
        "landed, answer lost"
    );
}

// O13: `unlease` is fenced on the generation: a reconciler whose lease ran
// out and was taken by another worker leaves that worker's slot alone.
// (Mutation: drop `AND generation = $2` from `unlease`: the new holder's
// slot goes back to pending under it.)
#[tokio::test]
async fn o13_unlease_leaves_a_slot_someone_else_took_alone() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("contested").await;
    let reconciler = outbox::lease_one(t.pool(), "reconciler", message_id)
        .await
        .unwrap()
        .unwrap();
    sqlx::query("UPDATE conversation_outbox SET lease_expires_at = now() - interval '1 second'")
        .execute(t.pool())
        .await
        .unwrap();
    let worker = lease(t.pool()).await;
    assert_eq!(worker.generation, reconciler.generation + 1);
    outbox::unlease(t.pool(), &reconciler).await.unwrap();
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(
        (
            slot.state.as_str(),
            slot.leased_by.as_deref(),
            slot.generation
        ),
        ("leased", Some("test-worker"), worker.generation)
    );
    assert!(slot.lease_left.unwrap() > 50.0, "the holder's lease stands");

    // Its own holder puts it back: pending, no holder, attempts untouched.
    outbox::unlease(t.pool(), &worker).await.unwrap();
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(
        (slot.state.as_str(), slot.leased_by, slot.attempts),
        ("pending", None, 1)
    );
}

// O17: `resolve_uncertain` touches only the slots of its own backend: a
// landed, uncertain slot enqueued for jetstream is left to a jetstream
// reconciler even though the postgres backend would answer for it.
// (Mutation: drop `AND o.backend = $2` from `resolve_uncertain`: the
// postgres reconciler stores it under its own locator.)
#[tokio::test]
async fn o17_resolve_uncertain_leaves_another_backends_slots_alone() {
    let t = Outboxed::new().await;
    let own = landed_but_uncertain(&t, "postgres slot").await;
    let foreign = landed_but_uncertain(&t, "jetstream slot").await;
    sqlx::query("UPDATE conversation_outbox SET backend = 'jetstream' WHERE message_id = $1")
        .bind(foreign)
        .execute(t.pool())
        .await
        .unwrap();
    let before = t.slot(foreign).await.unwrap();

    let resolved = outbox::resolve_uncertain(t.pool(), &backend(t.pool()), t.team_id)
        .await
        .unwrap();
    assert_eq!(resolved, 1, "only its own slot");
    assert_eq!(t.message(own).await.publication_state, "stored");
    let after = t.slot(foreign).await.expect("the jetstream slot stays");
    assert_eq!(
        (after.state.as_str(), after.generation, after.attempts),
        ("pending", before.generation, before.attempts),
        "not leased by the postgres reconciler"
    );
    let state = t.message(foreign).await;
    assert_eq!(state.publication_state, "pending_publication");
    assert!(
        state.uncertain,
        "still uncertain, for its own backend to resolve"
    );
}

// B3: the postgres publish sets the locator only when it is null or already
// this one, and a write error is retryable. (Mutations: drop `AND
// (canonical_locator IS NULL OR canonical_locator = $2)`: the recorded
// locator is overwritten; answer `Fatal` on a write error: the closed pool's
// publish is fatal.)
#[tokio::test]
async fn b3_the_postgres_publish_never_overwrites_a_locator_and_a_write_error_is_retryable() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("already located").await;
    let held = lease(t.pool()).await;
    sqlx::query("UPDATE conversation_messages SET canonical_locator = 'recorded' WHERE id = $1")
        .bind(message_id)
        .execute(t.pool())
        .await
        .unwrap();
    backend(t.pool()).publish(&held.envelope()).await;
    assert_eq!(
        t.message(message_id).await.canonical_locator.as_deref(),
        Some("recorded"),
        "a locator already recorded is left alone"
    );

    // A write that fails: the backend's own connections are gone.
    let closed = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(t.pool().connect_options().as_ref().clone());
    closed.close().await;
    match PostgresBackend::new(closed).publish(&held.envelope()).await {
        Published::Retryable(why) => assert_eq!(why, "the backend write failed"),
        other => panic!("a write error is retryable: {other:?}"),
    }
}

// ---------------------------------------------------------------- workers --

fn drain_settings(publish_timeout: Duration) -> DrainSettings {
    DrainSettings {
        batch: 8,
        in_flight: 8,
        publish_timeout,
        idle_poll: Duration::from_millis(50),
        lanes: 2,
    }
}

// O4, O6: two drains over one outbox store every message once; none is
// fenced, none is published twice (one set of references per message).
#[tokio::test]
async fn two_drains_over_one_outbox_store_each_message_once() {
    let t = Outboxed::new().await;
    let mut sent = Vec::new();
    for i in 0..40 {
        sent.push(t.send_id(&format!("message {i}")).await);
    }
    let settings = drain_settings(Duration::from_secs(10));
    let mut drains = Vec::new();
    for name in ["replica-a", "replica-b"] {
        let bus = t.app.bus.clone();
        let settings = settings.clone();
        drains.push(tokio::spawn(async move {
            let mut total = DrainPass::default();
            loop {
                let pass = publication::drain_once(&bus, name, &settings)
                    .await
                    .unwrap();
                if pass.leased == 0 {
                    return total;
                }
                total.leased += pass.leased;
                total.stored += pass.stored;
                total.fenced += pass.fenced;
            }
        }));
    }
    let mut stored = 0;
    for drain in drains {
        let pass = drain.await.unwrap();
        assert_eq!(pass.fenced, 0);
        assert_eq!(pass.leased, pass.stored);
        stored += pass.stored;
    }
    assert_eq!(stored, 40);
    for id in sent {
        let state = t.message(id).await;
        assert_eq!(state.publication_state, "stored");
        assert_eq!(state.references, 1, "one reference per recipient, once");
    }
    assert_eq!(
        outbox::status(t.pool(), t.team_id).await.unwrap(),
        outbox::Status::default()
    );
}

// O16, O17 through the workers: a publish without an answer within the
// drain's timeout is uncertain (not failed, not retried at once); the
// reconciler asks, finds nothing landed, and the next attempt stores it.
#[tokio::test]
async fn a_publish_that_times_out_is_uncertain_until_the_backend_is_asked() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("slow broker").await;
    let slow = t.app.bus.clone().with_backends(
        Backends::postgres_only(t.pool().clone()).with_postgres_faults(Faults {
            delay: Some(Duration::from_secs(5)),
            ..Faults::default()
        }),
    );
    let pass = publication::drain_once(&slow, "w", &drain_settings(Duration::from_millis(100)))
        .await
        .unwrap();
    assert_eq!((pass.leased, pass.retrying, pass.failed), (1, 1, 0));
    let state = t.message(message_id).await;
    assert!(state.uncertain);
    assert_eq!(state.publication_state, "pending_publication");
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(slot.state, "pending");
    assert!(slot.last_error.unwrap().contains("did not answer within"));

    // The reconciler asks: nothing landed (the attempt was abandoned), so the
    // slot is put back as it was.
    assert_eq!(publication::reconcile_once(&t.app.bus).await.unwrap(), 0);
    assert_eq!(t.slot(message_id).await.unwrap().attempts, 1);
    t.make_due().await;
    let pass = publication::drain_once(&t.app.bus, "w", &drain_settings(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(pass.stored, 1);
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "stored");
    assert!(!state.uncertain, "stored is no longer uncertain");
}

// O11 through the drain: on a last attempt a retryable outcome asks the
// backend before writing a failure, and a backend that cannot be asked
// leaves that slot in flight (not failed). That one slot must not cost the
// rest of the pass: the other slot's confirmation is still recorded.
#[tokio::test]
async fn a_reconcile_error_on_a_last_attempt_does_not_lose_the_rest_of_the_pass() {
    let t = Outboxed::new().await;
    let sent = [t.send_id("one").await, t.send_id("two").await];
    sqlx::query("UPDATE conversation_outbox SET attempts = $1")
        .bind(outbox::ATTEMPTS_MAX - 1)
        .execute(t.pool())
        .await
        .unwrap();
    // One publish fails (retryable), the other lands; reconcile never answers.
    let flaky = t.app.bus.clone().with_backends(
        Backends::postgres_only(t.pool().clone()).with_postgres_faults(Faults {
            retryable: 1,
            fail_reconcile: true,
            ..Faults::default()
        }),
    );
    let pass = publication::drain_once(&flaky, "w", &drain_settings(Duration::from_secs(10)))
        .await
        .expect("one slot that cannot be settled does not fail the pass");
    assert_eq!((pass.leased, pass.stored, pass.failed), (2, 1, 0));
    let mut states = Vec::new();
    for id in sent {
        states.push(t.message(id).await.publication_state);
    }
    states.sort();
    assert_eq!(states, ["pending_publication", "stored"]);
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_outbox WHERE state = 'failed'")
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(failed, 0, "\"could not ask\" is not \"does not have it\"");
}

// The spawned drain wakes on a send (an event) and stores it; the reader
// then sees the body and its cursor moves past it.
#[tokio::test]
async fn the_running_drain_stores_a_send_and_the_reader_sees_it() {
    let t = Outboxed::new().await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let drain = publication::spawn_drain(
        t.app.bus.clone(),
        drain_settings(Duration::from_secs(10)),
        shutdown.clone(),
    );
    let message_id = t.send_id("drained in the background").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = t.read_as_bob().await;
        if page["messages"][0]["publication"] == "stored" {
            assert_eq!(page["messages"][0]["body"], "drained in the background");
            assert_eq!(page["next_after_seq"], 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not stored: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(t.message(message_id).await.references, 1);
    shutdown.cancel();
    drain.await.expect("the drain stops cleanly on shutdown");
}

// The drain wakes on outbox events only: a send into an outbox emits one
// (beside the conversation event readers wait on), a send on the synchronous
// path does not, so a busy synchronous team does not keep every replica's
// drain polling the outbox.
#[tokio::test]
async fn only_a_send_into_an_outbox_wakes_the_drain() {
    use ai_crew_sync::events::EventKind;
    let t = Outboxed::new().await;
    let mut events = t.app.bus.events.subscribe();
    let outboxed = t.send_id("for the drain").await;
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("the send's events")
            .unwrap();
        assert_eq!(event.id, outboxed.to_string());
        kinds.push(event.kind);
    }
    kinds.sort_by_key(|k| k.as_str());
    assert_eq!(kinds, [EventKind::Conversation, EventKind::Outbox]);

    sqlx::query(
        "UPDATE conversations SET publication = 'sync', backend = 'postgres' WHERE id = $1",
    )
    .bind(t.conversation_id)
    .execute(t.pool())
    .await
    .unwrap();
    let synchronous = t.send("stored at commit").await;
    assert_eq!(synchronous["stored"], true);
    let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("the send's event")
        .unwrap();
    assert_eq!(event.id, synchronous["message_id"].as_str().unwrap());
    assert_eq!(event.kind, EventKind::Conversation);
    // Nothing else follows it: no outbox event for a synchronous send.
    let next = tokio::time::timeout(Duration::from_millis(300), events.recv()).await;
    assert!(
        next.is_err(),
        "unexpected event after a synchronous send: {next:?}"
    );
}

// ------------------------------------------------------- operator's view --

// O14 as an operator sees it: /health's publication section and
// `conversations status --team T`.
#[tokio::test]
async fn health_and_conversations_status_show_what_is_in_flight() {
    let t = Outboxed::new().await;
    t.send_id("refused").await;
    t.send_id("waiting").await;
    let first = lease(t.pool()).await;
    outbox::settle(t.pool(), &first, Published::Fatal("too large".into()))
        .await
        .unwrap();

    for path in ["/health", "/health?broker=check"] {
        let health: Value = crate::support::http_client()
            .get(t.app.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(health["status"], "ok");
        assert_eq!(health["broker"], "not_configured", "{path}");
        assert_eq!(health["publication"]["pending"], 1);
        assert_eq!(health["publication"]["failed"], 1);
        assert!(health["publication"]["oldest_pending_seconds"].is_i64());
    }

    let database_url = t.app.database_url.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .args(["conversations", "status", "--team", "ob", "--json"])
            .env("DATABASE_URL", database_url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["team"], "ob");
    assert_eq!(report["conversation_backend"], "postgres");
    assert_eq!(report["outbox"]["pending"], 1);
    assert_eq!(report["outbox"]["failed"], 1);
    let conversations = report["conversations"].as_array().unwrap();
    assert_eq!(conversations.len(), 1);
    assert_eq!(
        conversations[0]["conversation_id"],
        t.conversation_id.to_string()
    );
    assert_eq!(conversations[0]["publication"], "outbox");
    assert_eq!(
        (
            conversations[0]["pending"].as_i64(),
            conversations[0]["failed"].as_i64()
        ),
        (Some(1), Some(1))
    );
}
