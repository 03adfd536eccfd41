//! The inbox between PostgreSQL and the broker when either side stalls:
//! marking references published never waits on a row another transaction
//! holds (so it cannot close a deadlock with a window's fetch or
//! confirmation), and a window's fetch never waits on a broker that does not
//! answer.

use std::time::Duration;

use ai_crew_sync::store::inbox;
use uuid::Uuid;

use crate::inbox::{delivery_ids, fetch, pair};
use crate::write_fence::waiting_on;

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
    let app = crate::support::spawn_app_with_broker(&server.url_as("bus", "bus")).await;
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
