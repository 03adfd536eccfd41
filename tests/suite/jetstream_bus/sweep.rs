//! The body sweep: it drops a local copy only when the broker returns the
//! body intact, keeps young bodies and bodies a migration holds, bounds a
//! pass, and skips a failing backend for its team only (O18).

use super::*;

// O18: the body sweep releases a local copy only when the broker answers now
// with a body whose digest matches: nothing while the broker is stopped;
// not one whose stream entry was deleted, nor one whose digest does not
// match, nor one a migration holds (until that migration is over); the one
// it releases is still read, fetched from the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_releases_only_bodies_the_broker_confirms_and_none_a_migration_holds() {
    let mut server = OwnedNats::start();
    let app = TestApp::builder().broker_at(&server.url()).spawn().await;
    let t = Routed::new(&app, "jsb5").await;
    let deleted = t.send("its stream entry will be deleted").await;
    let mismatch = t.send("its digest will not match").await;
    let migrating = t.send("a migration holds this one").await;
    let released = t.send("released, then read from the broker").await;
    let ids = [deleted, mismatch, migrating, released];
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&ids).await;
    workers.stop().await;

    // A stopped broker confirms nothing: nothing is released.
    tokio::task::block_in_place(|| server.stop());
    assert_eq!(t.release().await, 0);
    for id in ids {
        assert!(
            !t.row(id).await.body.is_empty(),
            "kept while the broker is down"
        );
    }
    tokio::task::block_in_place(|| server.restart());
    wait_reachable(app.broker()).await;

    assert!(
        body_stream(&server.url(), t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[0]))
            .await
            .unwrap()
    );
    sqlx::query("UPDATE conversation_messages SET body_sha256 = $2 WHERE id = $1")
        .bind(mismatch)
        .bind(&outbox::body_digest("another body")[..])
        .execute(&app.pool)
        .await
        .unwrap();
    let migration = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO conversation_migrations
             (id, team_id, conversation_id, direction, state, started_by)
         VALUES ($1, $2, $3, 'to_postgres', 'copying', 'test')",
    )
    .bind(migration)
    .bind(t.team_id)
    .bind(t.conversation_id)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO conversation_migration_items
             (migration_id, message_id, team_id, body_sha256, bytes, state)
         SELECT $1, id, team_id, body_sha256, body_bytes, 'copied'
           FROM conversation_messages WHERE id = $2",
    )
    .bind(migration)
    .bind(migrating)
    .execute(&app.pool)
    .await
    .unwrap();

    assert_eq!(t.release().await, 1, "only the confirmable body goes");
    assert_eq!(t.row(released).await.body, "", "released in PostgreSQL");
    for id in [deleted, mismatch, migrating] {
        assert!(!t.row(id).await.body.is_empty(), "{id} kept");
    }
    assert_eq!(t.release().await, 0, "a second pass finds nothing more");
    let page = t.read_as_bob().await;
    assert_eq!(
        in_page(&page, released)["body"],
        "released, then read from the broker",
        "fetched from the broker"
    );
    assert_eq!(
        in_page(&page, deleted)["body"],
        "its stream entry will be deleted"
    );
    assert_eq!(
        in_page(&page, migrating)["body"],
        "a migration holds this one"
    );

    // Once the migration is over (failed: nothing moved), its hold ends.
    sqlx::query("UPDATE conversation_migrations SET state = 'failed' WHERE id = $1")
        .bind(migration)
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(t.release().await, 1);
    assert_eq!(t.row(migrating).await.body, "");
    assert_eq!(
        in_page(&t.read_as_bob().await, migrating)["body"],
        "a migration holds this one"
    );
}

/// One sweep pass with a grace period of `grace_secs`.
async fn sweep(app: &TestApp, grace_secs: i64) -> u64 {
    outbox::release_published_bodies(&app.pool, &app.bus.backends, None, grace_secs)
        .await
        .expect("a sweep pass")
}

// O18: the grace period: a body younger than it stays, whatever the broker
// holds; once older, it goes. (Mutation: drop `AND m.created_at <= now() -
// make_interval(secs => $2)` from the candidates: the young body goes at
// once.)
#[tokio::test]
async fn o18_the_sweep_keeps_a_body_younger_than_its_grace_period() {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let t = Routed::new(&app, "jsgrace").await;
    let id = t.send("young").await;
    assert_eq!(drain_all(&app).await.stored, 1);
    assert_eq!(sweep(&app, 300).await, 0, "younger than 300 s: kept");
    assert_eq!(t.row(id).await.body, "young");
    sqlx::query(
        "UPDATE conversation_messages SET created_at = now() - interval '301 seconds'
          WHERE id = $1",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(sweep(&app, 300).await, 1, "past the grace: released");
    assert_eq!(t.row(id).await.body, "");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O18: one pass releases at most 200 bodies and examines at most 1 000
// candidates: 201 confirmable bodies take two passes; a confirmable body
// behind 1 000 unconfirmable ones is not reached, and behind 999 it is.
// (Mutations: `RELEASE_BATCH = 200` → 300: the first pass releases 201;
// `SCAN_LIMIT = 1_000` → 2_000: the body behind 1 000 is released.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o18_a_sweep_pass_releases_at_most_200_and_examines_at_most_1000() {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let t = Routed::new(&app, "jsbounds").await;
    for i in 0..201 {
        t.send(&format!("body {i}")).await;
    }
    assert_eq!(drain_all(&app).await.stored, 201);
    assert_eq!(sweep(&app, 0).await, 200, "at most 200 per pass");
    assert_eq!(sweep(&app, 0).await, 1, "the rest on the next pass");
    assert_eq!(sweep(&app, 0).await, 0);

    // 1 000 older candidates the broker cannot confirm (their locators name
    // sequences the stream never had), then one it can.
    let template: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 LIMIT 1",
    )
    .bind(t.conversation_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO conversation_messages
             (id, team_id, conversation_id, seq, sender_member_id, sender_id, sender_session,
              request_id, body, body_sha256, body_bytes, backend, publication_state,
              canonical_locator, created_at)
         SELECT gen_random_uuid(), team_id, conversation_id, 10000 + g, sender_member_id,
                sender_id, sender_session, gen_random_uuid(), 'unconfirmable', body_sha256,
                13, backend, 'stored', $2 || (1000000 + g),
                now() - interval '1 day' + g * interval '1 millisecond'
           FROM conversation_messages, generate_series(1, 1000) AS g
          WHERE id = $1",
    )
    .bind(template)
    .bind(format!("jetstream:{}:", body_stream_name(t.team_id)))
    .execute(&app.pool)
    .await
    .unwrap();
    let behind = t.send("behind a thousand").await;
    assert_eq!(drain_all(&app).await.stored, 1);
    assert_eq!(
        sweep(&app, 0).await,
        0,
        "not reached within 1 000 candidates"
    );
    assert_eq!(t.row(behind).await.body, "behind a thousand");
    sqlx::query(
        "DELETE FROM conversation_messages
          WHERE id = (SELECT id FROM conversation_messages
                       WHERE body = 'unconfirmable' ORDER BY created_at LIMIT 1)",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(sweep(&app, 0).await, 1, "the 1 000th candidate is examined");
    assert_eq!(t.row(behind).await.body, "");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O18: a backend that fails is skipped for the rest of the pass, for that
// (backend, team) only: after team A's first body fails to be fetched, A's
// next (confirmable) body is not asked for in that pass, while team B's is
// released. (Mutations: drop the `if unusable.contains(..) { continue; }`
// skip: A's second body is released in the same pass; `break 'scan` instead
// of marking the (backend, team) unusable: B's body is not released.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o18_a_failing_backend_is_skipped_for_the_rest_of_the_pass_for_its_team_only() {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let a = Routed::new(&app, "jsskipa").await;
    let b = Routed::new(&app, "jsskipb").await;
    let failing = a.send("A: its fetch fails").await;
    let skipped = a.send("A: confirmable, but after a failure").await;
    let other = b.send("B: confirmable").await;
    assert_eq!(drain_all(&app).await.stored, 3);
    // A's first body now names B's stream: fetching it is refused (an error,
    // not "not held"), which makes A's backend unusable for this pass.
    let own: String =
        sqlx::query_scalar("SELECT canonical_locator FROM conversation_messages WHERE id = $1")
            .bind(failing)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let foreign = format!(
        "jetstream:{}:{}",
        body_stream_name(b.team_id),
        sequence(a.team_id, &own)
    );
    let relocate = async |locator: &str| {
        sqlx::query("UPDATE conversation_messages SET canonical_locator = $2 WHERE id = $1")
            .bind(failing)
            .bind(locator)
            .execute(&app.pool)
            .await
            .unwrap();
    };
    relocate(&foreign).await;

    assert_eq!(sweep(&app, 0).await, 1, "only team B's body");
    assert_eq!(b.row(other).await.body, "", "B released");
    assert!(
        !a.row(skipped).await.body.is_empty(),
        "A skipped for the pass"
    );
    assert!(!a.row(failing).await.body.is_empty());

    // Next pass, A's backend is asked again.
    relocate(&own).await;
    assert_eq!(sweep(&app, 0).await, 2);
    assert_eq!(a.row(skipped).await.body, "");
    for team in [a.team_id, b.team_id] {
        app.broker().remove_team_streams(team).await.unwrap();
    }
}

// O18: the clear re-checks the whole predicate at clear time: a move to
// postgres that commits while the pass is between its fetch and its clear
// makes the row the record again, and the body stays. (Mutation: reduce the
// clear's WHERE to `m.id = ANY($1)` and the join: the moved row's body is
// emptied.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o18_the_clear_rechecks_the_predicate_and_keeps_a_body_moved_meanwhile() {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let t = Routed::new(&app, "jsrecheck").await;
    let id = t.send("moved back to postgres meanwhile").await;
    assert_eq!(drain_all(&app).await.stored, 1);

    // The "cutover" holds the row while the pass fetches and confirms, and
    // commits once the pass's clear waits for it.
    let mut cutover = app.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM conversation_messages WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *cutover)
        .await
        .unwrap();
    let pass = tokio::spawn({
        let pool = app.pool.clone();
        let backends = app.bus.backends.clone();
        async move { outbox::release_published_bodies(&pool, &backends, None, 0).await }
    });
    eventually("the pass's clear waits for the row", async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%SET body = ''''%'",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
    for moved in [
        "UPDATE conversation_messages SET backend = 'postgres', canonical_locator = NULL
          WHERE id = $1",
        "UPDATE conversations SET backend = 'postgres', publication = 'sync'
          WHERE id = (SELECT conversation_id FROM conversation_messages WHERE id = $1)",
    ] {
        sqlx::query(moved)
            .bind(id)
            .execute(&mut *cutover)
            .await
            .unwrap();
    }
    cutover.commit().await.unwrap();
    assert_eq!(pass.await.unwrap().unwrap(), 0, "nothing cleared");
    assert_eq!(t.row(id).await.body, "moved back to postgres meanwhile");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O18, at clear time, with a live broker: what commits while a pass talks to
// the broker (after it chose its candidates, before its clear) is seen by
// the clear. A move that starts holding a message, a message made
// PostgreSQL-backed, and a conversation made PostgreSQL-backed all keep
// their bodies; a control body in the same pass is released. The clear is
// held back by an operator's transaction that lets the pass read but not
// write `conversation_messages` (SHARE), and that commits the changes once
// the clear waits, so the clear starts after them. (Mutations, one at a
// time, in the clear of `release_published_bodies`: drop
// `no_migration_holds!()`: the migrating body is emptied; drop `AND
// m.backend <> 'postgres'`: the PostgreSQL-backed message's body is emptied;
// drop `c.backend <> 'postgres' AND`: the body in the PostgreSQL-backed
// conversation is emptied.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o18_the_clear_sees_a_migration_and_a_postgres_backing_committed_during_the_pass() {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let t = Routed::new(&app, "jsclearing").await;
    let migrating = t.send("a move starts holding it").await;
    let message_to_postgres = t.send("its row becomes the record").await;
    let control = t.send("released by this pass").await;
    let moved = t.conversation("Moved back to postgres meanwhile").await;
    let in_moved = t.send_in(moved, "its conversation becomes postgres").await;
    assert_eq!(drain_all(&app).await.stored, 4);

    let mut operator = app.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE conversation_messages IN SHARE MODE")
        .execute(&mut *operator)
        .await
        .unwrap();
    let pass = tokio::spawn({
        let pool = app.pool.clone();
        let backends = app.bus.backends.clone();
        async move { outbox::release_published_bodies(&pool, &backends, None, 0).await }
    });
    eventually("the pass's clear waits for the operator", async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%SET body = ''''%'",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
    let migration = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO conversation_migrations
             (id, team_id, conversation_id, direction, state, started_by)
         VALUES ($1, $2, $3, 'to_postgres', 'copying', 'test')",
    )
    .bind(migration)
    .bind(t.team_id)
    .bind(t.conversation_id)
    .execute(&mut *operator)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO conversation_migration_items
             (migration_id, message_id, team_id, body_sha256, bytes, state)
         SELECT $1, id, team_id, body_sha256, body_bytes, 'copied'
           FROM conversation_messages WHERE id = $2",
    )
    .bind(migration)
    .bind(migrating)
    .execute(&mut *operator)
    .await
    .unwrap();
    sqlx::query("UPDATE conversation_messages SET backend = 'postgres' WHERE id = $1")
        .bind(message_to_postgres)
        .execute(&mut *operator)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE conversations SET backend = 'postgres', publication = 'sync' WHERE id = $1",
    )
    .bind(moved)
    .execute(&mut *operator)
    .await
    .unwrap();
    operator.commit().await.unwrap();

    let released = pass.await.unwrap().unwrap();
    for (id, body) in [
        (migrating, "a move starts holding it"),
        (message_to_postgres, "its row becomes the record"),
        (in_moved, "its conversation becomes postgres"),
    ] {
        assert_eq!(t.row(id).await.body, body, "kept");
    }
    assert_eq!(released, 1, "only the control body");
    assert_eq!(t.row(control).await.body, "");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}
