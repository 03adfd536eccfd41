//! A slot's life one step at a time: enqueue (O1), pending until confirmed
//! (O2, O3), leasing (O4), settling under the fence (O6, O7), retries and
//! failure (O8, O9), a lost confirmation reconciled (O10, O11), another
//! backend's slot (O12), the status counts (O14), and the way back to sync
//! refused while anything is pending (O15).

use super::*;

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
