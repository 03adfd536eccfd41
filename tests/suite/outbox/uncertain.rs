//! Publishes nobody answered: uncertain (O16) until the backend is asked
//! (O17); the sweep without a broker (O18); a tombstone explains its gap
//! (O19); the postgres backend's own promises (B2, B3, B5, B6).

use super::*;

// O16: an attempt without an answer is marked uncertain, not failed and not
// retried at once: pending again after the retry backoff (2^1 s after the
// first attempt), holder cleared, uncertain_at once.
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
    assert!((1.0..=2.5).contains(&slot.due_in), "{}", slot.due_in);
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
