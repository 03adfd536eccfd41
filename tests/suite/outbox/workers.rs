//! The publication workers over the outbox: two drains, a publish that
//! times out, a reconcile error on a last attempt, and the running drain
//! woken by a send.

use super::*;

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
    let page = eventually("bob to read the message stored", async || {
        let page = t.read_as_bob().await;
        if page["messages"][0]["publication"] == "stored" {
            Ok(page)
        } else {
            Err(page)
        }
    })
    .await;
    assert_eq!(page["messages"][0]["body"], "drained in the background");
    assert_eq!(page["next_after_seq"], 1);
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
