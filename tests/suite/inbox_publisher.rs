//! The inbox between PostgreSQL and the broker when either side stalls:
//! marking references published never waits on a row another transaction
//! holds (so it cannot close a deadlock with a window's fetch or
//! confirmation), a window's fetch and confirmation lock the references
//! they share in one order, and a window's fetch never waits on a broker
//! that does not answer.

use std::time::Duration;

use ai_crew_sync::store::conversations::inbox;
use uuid::Uuid;

use crate::inbox::{delivery_ids, fetch, pair};
use crate::write_fence::{queued_on_one_row, waiting_on};

async fn published_seqs(pool: &sqlx::PgPool, ids: &[Uuid]) -> Vec<Option<i64>> {
    let mut seqs = Vec::new();
    for id in ids {
        let seq: Option<i64> =
            sqlx::query_scalar("SELECT broker_seq FROM inbox_references WHERE id = $1")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap();
        seqs.push(seq);
    }
    seqs
}

/// A chaos run once saw "deadlock detected" in the publisher: it marked its
/// batch row by row in its own order while a window's request held some of
/// those rows and waited on others. Marking skips a held row (the next pass
/// publishes it again, deduplicated by the broker) instead of waiting.
#[tokio::test]
async fn marking_references_published_skips_a_row_held_elsewhere_instead_of_waiting() {
    let p = pair().await;
    for body in ["one", "two", "three"] {
        p.send(body).await;
    }
    let ids: Vec<Uuid> = delivery_ids(&fetch(&p.bob).await)
        .iter()
        .map(|id| id.parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "bob is owed three references");
    let published: Vec<(Uuid, u64)> = ids.iter().copied().zip(1..).collect();

    let mut held = p.app.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM inbox_references WHERE id = $1 FOR UPDATE")
        .bind(ids[1])
        .execute(&mut *held)
        .await
        .unwrap();
    let marking = {
        let pool = p.app.pool.clone();
        let published = published.clone();
        tokio::spawn(async move { inbox::mark_published(&pool, &published).await })
    };
    while !marking.is_finished() {
        assert_eq!(
            waiting_on(&p.app.pool, false).await,
            0,
            "marking waits on the row another transaction holds"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(marking.await.unwrap().unwrap(), 2, "the two rows not held");
    assert_eq!(
        published_seqs(&p.app.pool, &ids).await,
        [Some(1), None, Some(3)]
    );

    held.rollback().await.unwrap();
    // The next pass marks the row it skipped; the others keep their seqs.
    let again: Vec<(Uuid, u64)> = ids.iter().copied().zip(11..).collect();
    assert_eq!(inbox::mark_published(&p.app.pool, &again).await.unwrap(), 1);
    assert_eq!(
        published_seqs(&p.app.pool, &ids).await,
        [Some(1), Some(12), Some(3)]
    );
}

/// A window confirming references while its own fetch records the broker's
/// hand-outs of the same ones: both lock those rows. Each used to lock them
/// in the order its plan read them: the confirmation by message id (older
/// message first), the fetch by conversation then seq. With an older message
/// in the conversation whose id sorts last, the orders cross. With the older
/// message's reference held elsewhere, the confirmation queues on it, then
/// the fetch queues on it too, holding the newer one: when the row is let go
/// the confirmation takes it and waits on the fetch, which waits on the
/// confirmation, and PostgreSQL ended one of the two calls with "deadlock
/// detected". Both lock in id order now.
#[tokio::test]
async fn a_confirmation_and_a_fetch_of_the_same_references_lock_them_in_one_order() {
    use std::sync::Arc;

    use ai_crew_sync::workers::publication::{self, DrainSettings};
    use serde_json::json;

    let app = crate::support::TestApp::builder()
        .broker_at(&crate::support::nats::nats_url())
        .spawn()
        .await;
    let p = crate::inbox::jetstream_pair_on(app, "ibd", &Default::default()).await;
    let created = crate::inbox::open_conversation(&p.alice, &p.bob, "Another").await;
    let other: Uuid = created["id"].as_str().unwrap().parse().unwrap();
    p.send_in(p.conversation_id.max(other), "older").await;
    p.send_in(p.conversation_id.min(other), "newer").await;
    let pass = publication::drain_once(&p.app.bus, "order-test", &DrainSettings::default())
        .await
        .unwrap();
    assert_eq!(pass.stored, 2);
    let owed: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
        "SELECT id, team_id, recipient_key FROM inbox_references ORDER BY message_id",
    )
    .fetch_all(&p.app.pool)
    .await
    .unwrap();
    assert_eq!(owed.len(), 2, "bob is owed two references");
    let (team_id, key) = (owed[0].1, owed[0].2.as_str());
    for (id, _, _) in &owed {
        let payload = json!({ "delivery_id": id }).to_string();
        p.app
            .broker()
            .publish_inbox_reference(team_id, key, *id, payload.as_bytes())
            .await
            .unwrap();
    }
    let ids: Vec<Uuid> = owed.iter().map(|o| o.0).collect();

    let bob = Arc::new(p.bob);
    let confirming = {
        let bob = bob.clone();
        async move {
            bob.call("confirm_inbox_delivery", json!({ "delivery_ids": ids }))
                .await
        }
    };
    let fetching = {
        let bob = bob.clone();
        async move { bob.call("fetch_conversation_inbox", json!({})).await }
    };
    let (confirmed, fetched) = queued_on_one_row(
        &p.app.pool,
        "SELECT 1 FROM inbox_references ORDER BY message_id LIMIT 1 FOR UPDATE",
        confirming,
        fetching,
    )
    .await;
    let confirmed = confirmed.expect("the confirmation answers");
    assert_eq!(confirmed["confirmed"], 2, "{confirmed}");
    fetched.expect("the fetch answers");
    let delivered: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_references WHERE delivered_at IS NOT NULL")
            .fetch_one(&p.app.pool)
            .await
            .unwrap();
    assert_eq!(delivered, 2);
}

/// A broker that never answers the window's pull: here the bus's NATS user
/// may not ask a consumer for messages, so the server drops the request
/// (the chaos run saw the same from a consumer without a leader after the
/// cluster restarted). The fetch is served from PostgreSQL after a bounded
/// wait; it used to wait for an answer that never came.
#[tokio::test]
async fn an_inbox_fetch_the_broker_never_answers_is_served_from_postgres() {
    use ai_crew_sync::workers::publication::{self, DrainSettings};

    use crate::support::nats::OwnedNats;

    let server = OwnedNats::start_with_config(
        "authorization {\n  users = [\n    { user: bus, password: bus, permissions: { \
         publish: { allow: [\">\"], deny: [\"$JS.API.CONSUMER.MSG.NEXT.>\"] }, \
         subscribe: { allow: [\">\"] } } }\n  ]\n}",
    );
    let app = crate::support::TestApp::builder()
        .broker_at(&server.url_as("bus", "bus"))
        .spawn()
        .await;
    let p = crate::inbox::jetstream_pair_on(app, "ibn", &Default::default()).await;
    let sent = p.send("through a silent broker").await;
    let pass = publication::drain_once(&p.app.bus, "silent-test", &DrainSettings::default())
        .await
        .unwrap();
    assert_eq!(pass.stored, 1);

    let fetched = tokio::time::timeout(Duration::from_secs(60), fetch(&p.bob))
        .await
        .expect("the fetch answers although the broker never does");
    let deliveries = fetched["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 1, "{fetched}");
    assert_eq!(deliveries[0]["message_id"], sent.to_string());
    let _ = &p.alice;
}
