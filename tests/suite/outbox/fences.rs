//! Invariants that bite: each test below fails when the line it guards is
//! removed or inverted; the mutation tried is named in its comment.

use super::*;
use crate::support::eventually;
use crate::write_fence::waiting_on;

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

// O3: enqueue itself marks the message `pending_publication`, whatever state
// its caller left it in, in the caller's transaction: a failed message with
// no slot (as `conversations retry` finds one whose body is in its row) is
// pending once enqueued, and unchanged if that transaction rolls back.
// (Mutation: drop the `marked` update from `enqueue`: the message stays
// `failed` with a pending slot, which no settle would ever store.)
#[tokio::test]
async fn o3_enqueue_marks_the_message_pending_whatever_state_it_was_in() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("failed, then enqueued again").await;
    let held = lease(t.pool()).await;
    assert_eq!(
        outbox::settle(t.pool(), &held, Published::Fatal("refused".into()))
            .await
            .unwrap(),
        Settled::Failed
    );
    sqlx::query("DELETE FROM conversation_outbox WHERE message_id = $1")
        .bind(message_id)
        .execute(t.pool())
        .await
        .unwrap();
    assert_eq!(t.message(message_id).await.publication_state, "failed");
    let enqueue = async |tx: &mut sqlx::PgConnection| {
        outbox::enqueue(
            tx,
            message_id,
            t.conversation_id,
            t.team_id,
            BackendKind::Postgres,
            "failed, then enqueued again",
        )
        .await
        .unwrap()
    };

    let mut rolled_back = t.pool().begin().await.unwrap();
    enqueue(&mut rolled_back).await;
    rolled_back.rollback().await.unwrap();
    assert_eq!(t.message(message_id).await.publication_state, "failed");
    assert!(t.slot(message_id).await.is_none(), "no slot either");

    let mut tx = t.pool().begin().await.unwrap();
    enqueue(&mut tx).await;
    tx.commit().await.unwrap();
    assert_eq!(
        t.message(message_id).await.publication_state,
        "pending_publication",
        "enqueue marks the message, not its caller"
    );
    let slot = t.slot(message_id).await.expect("a slot");
    assert_eq!((slot.state.as_str(), slot.attempts), ("pending", 0));
    let again = lease(t.pool()).await;
    assert_eq!(
        outbox::settle(
            t.pool(),
            &again,
            Published::Confirmed(Locator(message_id.to_string()))
        )
        .await
        .unwrap(),
        Settled::Stored
    );
    assert_eq!(t.message(message_id).await.publication_state, "stored");
}

// O4: `SKIP LOCKED`: while one worker's lease transaction is still open on
// the oldest due slot, a second worker gets the next slot at once instead of
// queueing behind the first. (Mutation: drop `SKIP LOCKED` from `lease_due`:
// the second lease waits on the held row, which `waiting_on` sees.)
#[tokio::test]
async fn o4_a_second_lease_skips_the_slot_an_open_lease_holds_without_waiting() {
    let t = Outboxed::new().await;
    let oldest = t.send_id("leased by a transaction still open").await;
    let next = t.send_id("free for the next worker").await;
    let mut first = t.pool().begin().await.unwrap();
    let held = outbox::lease_due(&mut *first, "first", None, 1)
        .await
        .unwrap();
    assert_eq!(
        held.iter().map(|l| l.message_id).collect::<Vec<_>>(),
        vec![oldest]
    );

    let second = tokio::spawn({
        let pool = t.pool().clone();
        async move { outbox::lease(&pool, "second").await.unwrap() }
    });
    eventually("the second lease answers", async || {
        assert_eq!(
            waiting_on(t.pool(), false).await,
            0,
            "the second lease waits for the slot the first one holds"
        );
        second.is_finished()
    })
    .await;
    let got = second.await.unwrap().expect("the next due slot");
    assert_eq!(got.message_id, next);
    first.commit().await.unwrap();
    let slot = t.slot(oldest).await.unwrap();
    assert_eq!(slot.leased_by.as_deref(), Some("first"));
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
