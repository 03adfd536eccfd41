//! A backend that does not answer (issue 33 item 18, seed 000: the outbox
//! "gives up rather than retrying for ever"): unanswered publishes count as
//! attempts with the retry backoff, the next attempt asks the backend by key
//! before publishing again, and the last one ends the slot `failed` with a
//! reason an operator acts on, which `conversations retry` brings back.

use super::*;
use ai_crew_sync::Bus;
use ai_crew_sync::store::delivery::broker_conditions;

fn settings() -> DrainSettings {
    DrainSettings {
        batch: 8,
        in_flight: 8,
        publish_timeout: Duration::from_secs(10),
        idle_poll: Duration::from_millis(50),
        lanes: 1,
    }
}

/// The bus with its postgres backend misbehaving as `faults` says.
fn with_faults(t: &Outboxed, faults: Faults) -> Bus {
    t.app
        .bus
        .clone()
        .with_backends(Backends::postgres_only(t.pool().clone()).with_postgres_faults(faults))
}

// O8, O16, O11: a backend that never answers a publish, nor whether it holds
// the body. Each drain pass counts an attempt and backs off 2^min(n,6) s, as
// a refused attempt does; the eighth ends the slot and the message `failed`
// (the message still uncertain), saying what happened and what brings it
// back. It is then left alone: no attempt after the cap. `conversations
// retry` puts it back, and it is stored once the backend answers.
#[tokio::test]
async fn a_backend_that_never_answers_fails_the_slot_at_the_cap_and_retry_brings_it_back() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("into the silence").await;
    let silent = with_faults(
        &t,
        Faults {
            unanswered: usize::MAX,
            fail_reconcile: true,
            ..Faults::default()
        },
    );
    let backoffs = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 64.0];
    for attempt in 1..=outbox::ATTEMPTS_MAX {
        t.make_due().await;
        let pass = publication::drain_once(&silent, "drain", &settings())
            .await
            .unwrap();
        let slot = t.slot(message_id).await.unwrap();
        assert_eq!(
            slot.attempts, attempt,
            "an unanswered publish is an attempt"
        );
        if attempt < outbox::ATTEMPTS_MAX {
            assert_eq!(
                (pass.leased, pass.retrying, pass.failed),
                (1, 1, 0),
                "attempt {attempt}: {pass:?}"
            );
            assert_eq!(slot.state, "pending");
            let backoff = backoffs[attempt as usize - 1];
            assert!(
                slot.due_in > backoff - 1.5 && slot.due_in <= backoff,
                "attempt {attempt}: backoff {backoff} s, due in {}",
                slot.due_in
            );
            let state = t.message(message_id).await;
            assert!(state.uncertain);
            assert_eq!(state.publication_state, "pending_publication");
        } else {
            assert_eq!(
                (pass.leased, pass.retrying, pass.failed),
                (1, 0, 1),
                "the last attempt gives up: {pass:?}"
            );
        }
    }
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!(slot.state, "failed");
    let why = slot.last_error.unwrap();
    for said in [
        "attempt 8 of 8",
        "without an answer",
        "gave up",
        "not known",
        "conversations retry --team TEAM --apply",
    ] {
        assert!(why.contains(said), "{said:?} in {why}");
    }
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "failed");
    assert!(state.uncertain, "nobody knows whether it landed");
    let page = t.read_as_bob().await;
    assert_eq!(page["messages"][0]["unavailable"]["reason"], "failed");
    let detail = page["messages"][0]["unavailable"]["detail"]
        .as_str()
        .unwrap();
    assert!(
        detail.contains("never answered") && detail.contains("conversations retry"),
        "{detail}"
    );

    // Given up is given up: neither the drain nor the reconciler takes it.
    t.make_due().await;
    let pass = publication::drain_once(&silent, "drain", &settings())
        .await
        .unwrap();
    assert_eq!(pass.leased, 0, "{pass:?}");
    assert_eq!(publication::reconcile_once(&silent).await.unwrap(), 0);
    assert_eq!(t.slot(message_id).await.unwrap().attempts, 8);

    // The operator's way back, once the backend answers again.
    let report = broker_conditions::retry_failed(t.pool(), None, "ob", None, true, &test_actor())
        .await
        .unwrap();
    assert_eq!(report.retried.len(), 1, "{report:?}");
    assert_eq!(report.retried[0].message_id, message_id);
    let slot = t.slot(message_id).await.unwrap();
    assert_eq!((slot.state.as_str(), slot.attempts), ("pending", 0));
    let pass = publication::drain_once(&t.app.bus, "drain", &settings())
        .await
        .unwrap();
    assert_eq!(pass.stored, 1, "{pass:?}");
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "stored");
    assert!(!state.uncertain);
    assert_eq!(
        t.read_as_bob().await["messages"][0]["body"],
        "into the silence"
    );
}

// O16, O10, B1: the backend stored the body and its answer never came back,
// and no publish of it is ever answered. The next attempt asks by the
// publish key before publishing: the body that landed is settled stored
// from that answer, not published again (which would go unanswered again,
// and again, until the slot gave up on a body the backend holds).
#[tokio::test]
async fn an_unanswered_publish_that_landed_is_settled_by_its_key_not_published_again() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("landed, unanswered").await;
    let lossy = with_faults(
        &t,
        Faults {
            unanswered: usize::MAX,
            unanswered_landed: true,
            ..Faults::default()
        },
    );
    let pass = publication::drain_once(&lossy, "drain", &settings())
        .await
        .unwrap();
    assert_eq!((pass.leased, pass.retrying), (1, 1), "{pass:?}");
    let state = t.message(message_id).await;
    assert!(state.uncertain);
    assert_eq!(state.publication_state, "pending_publication");

    t.make_due().await;
    let pass = publication::drain_once(&lossy, "drain", &settings())
        .await
        .unwrap();
    assert_eq!(
        (pass.leased, pass.stored, pass.retrying),
        (1, 1, 0),
        "settled from the key's answer: {pass:?}"
    );
    let state = t.message(message_id).await;
    assert_eq!(state.publication_state, "stored");
    assert_eq!(
        state.canonical_locator.as_deref(),
        Some(message_id.to_string().as_str())
    );
    assert!(!state.uncertain);
    assert!(t.slot(message_id).await.is_none());
    assert_eq!(
        t.read_as_bob().await["messages"][0]["body"],
        "landed, unanswered"
    );
}
