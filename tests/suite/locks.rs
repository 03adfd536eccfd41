//! Locks over MCP: exclusive, expiring, owned by one window.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{TestApp, spawn_app};

fn message(refusal: &Value) -> &str {
    refusal["message"].as_str().unwrap_or_default()
}

async fn lock_rows(app: &TestApp) -> Vec<(String, String, i64)> {
    sqlx::query_as(
        "SELECT name, holder_session, extract(epoch FROM expires_at)::bigint FROM locks ORDER BY name",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn sixteen_windows_racing_for_one_lock_leave_exactly_one_holder() {
    let app = spawn_app().await;
    app.team("acme").await;
    let mut racers = tokio::task::JoinSet::new();
    for a in 0..4 {
        let token = app.agent("acme", &format!("agent{a}")).await;
        for w in 0..4 {
            let client = app.mcp(&token, Some(&format!("w{w}"))).await;
            racers.spawn(async move {
                client
                    .call(
                        "acquire_lock",
                        json!({ "name": "Deploy:Prod", "purpose": "release 1.2" }),
                    )
                    .await
            });
        }
    }
    let mut winners = Vec::new();
    let mut refusals = Vec::new();
    while let Some(joined) = racers.join_next().await {
        match joined.unwrap() {
            Ok(lock) => winners.push(lock),
            Err(refusal) => refusals.push(refusal),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one window holds it: {winners:?}");
    assert_eq!(refusals.len(), 15);
    let winner = &winners[0];
    assert_eq!(winner["name"], "deploy:prod", "names are lower-cased");
    assert_eq!(winner["extended"], false);
    assert_eq!(winner["purpose"], "release 1.2");
    let holder = winner["holder"].as_str().unwrap();
    let (agent, window) = holder.split_once('/').unwrap();
    for refusal in &refusals {
        assert_eq!(refusal["error"], "conflict");
        let text = message(refusal);
        assert!(text.contains(&format!("agent `{agent}`")), "{text}");
        assert!(text.contains(&format!("window `{window}`")), "{text}");
        assert!(text.contains(" s left"), "names the expiry: {text}");
    }

    let token = app.agent("acme", "observer").await;
    let listed = app
        .mcp(&token, None)
        .await
        .call("list_locks", json!({}))
        .await
        .unwrap();
    assert_eq!(listed["count"], 1);
    assert_eq!(listed["locks"][0]["holder"], holder);
    assert_eq!(listed["locks"][0]["name"], "deploy:prod");
    assert_eq!(lock_rows(&app).await.len(), 1);
}

#[tokio::test]
async fn the_holding_window_extends_its_lock_and_a_sibling_window_cannot_release_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let w1 = app.mcp(&alice, Some("w1")).await;
    let w2 = app.mcp(&alice, Some("w2")).await;

    let first = w1
        .call(
            "acquire_lock",
            json!({ "name": "src/schema.sql", "ttl_seconds": 60, "purpose": "migration" }),
        )
        .await
        .unwrap();
    assert_eq!(first["extended"], false);
    assert!(first["seconds_left"].as_i64().unwrap() <= 60);

    // Acquiring again from the same window extends it and keeps its start.
    let again = w1
        .call(
            "acquire_lock",
            json!({ "name": "SRC/schema.sql", "ttl_seconds": 600 }),
        )
        .await
        .unwrap();
    assert_eq!(again["extended"], true);
    assert_eq!(again["acquired_at"], first["acquired_at"]);
    assert!(again["seconds_left"].as_i64().unwrap() > 500);
    assert_eq!(again["purpose"], "migration", "an omitted purpose is kept");

    let before = lock_rows(&app).await;
    let refused = w2
        .call("acquire_lock", json!({ "name": "src/schema.sql" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(message(&refused).contains("window `w1`"), "{refused}");
    let refused = w2
        .call("release_lock", json!({ "name": "src/schema.sql" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(message(&refused).contains("window `w1`"), "{refused}");
    assert!(
        message(&refused).contains("another window of the same agent"),
        "{refused}"
    );
    let shared = app.mcp(&alice, None).await;
    assert!(
        shared
            .call("release_lock", json!({ "name": "src/schema.sql" }))
            .await
            .is_err(),
        "the shared session is another window too"
    );
    assert_eq!(lock_rows(&app).await, before, "the lock is untouched");

    let released = w1
        .call("release_lock", json!({ "name": "src/schema.sql" }))
        .await
        .unwrap();
    assert_eq!(released["released"], true);
    assert_eq!(released["had_expired"], false);
    let empty = w2.call("list_locks", json!({})).await.unwrap();
    assert_eq!(empty["count"], 0);
    let gone = w1
        .call("release_lock", json!({ "name": "src/schema.sql" }))
        .await
        .unwrap_err();
    assert_eq!(gone["error"], "not_found");

    let taken = w2
        .call("acquire_lock", json!({ "name": "src/schema.sql" }))
        .await
        .unwrap();
    assert_eq!(taken["holder"], "alice/w2");
    assert!(
        taken["purpose"].is_null(),
        "a new holder brings its own purpose"
    );
}

#[tokio::test]
async fn an_expired_lock_is_no_longer_listed_and_anyone_may_take_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;

    alice
        .call("acquire_lock", json!({ "name": "ci", "ttl_seconds": 5 }))
        .await
        .unwrap();
    let refused = bob
        .call("acquire_lock", json!({ "name": "ci" }))
        .await
        .unwrap_err();
    assert!(message(&refused).contains("alice/w1"), "{refused}");

    // Real expiry on the database's clock: the shortest ttl, then a little more.
    tokio::time::sleep(Duration::from_millis(5_300)).await;
    let listed = bob.call("list_locks", json!({})).await.unwrap();
    assert_eq!(listed["count"], 0, "expired locks are not listed: {listed}");

    let taken = bob
        .call("acquire_lock", json!({ "name": "ci", "ttl_seconds": 120 }))
        .await
        .unwrap();
    assert_eq!(taken["holder"], "bob");
    assert_eq!(taken["extended"], false);
    let refused = alice
        .call("release_lock", json!({ "name": "ci" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(message(&refused).contains("agent `bob`"), "{refused}");
    let listed = alice.call("list_locks", json!({})).await.unwrap();
    assert_eq!(listed["locks"][0]["holder"], "bob");
}

#[tokio::test]
async fn every_lock_limit_is_refused_with_its_number_and_writes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    alice
        .call(
            "acquire_lock",
            json!({ "name": "held", "ttl_seconds": 300 }),
        )
        .await
        .unwrap();
    let before = lock_rows(&app).await;

    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "acquire_lock",
            json!({ "name": "x", "ttl_seconds": 4 }),
            "between 5 and 86400",
        ),
        (
            "acquire_lock",
            json!({ "name": "x", "ttl_seconds": 86_401 }),
            "86400",
        ),
        (
            "acquire_lock",
            json!({ "name": "held", "ttl_seconds": 86_401 }),
            "86400",
        ),
        ("acquire_lock", json!({ "name": "x".repeat(257) }), "256"),
        ("acquire_lock", json!({ "name": "  " }), "name is required"),
        (
            "acquire_lock",
            json!({ "name": "x", "purpose": "p".repeat(257) }),
            "256",
        ),
        ("release_lock", json!({ "name": "x".repeat(257) }), "256"),
    ];
    for (tool, args, limit) in cases {
        let refused = alice.call(tool, args).await.expect_err("must refuse");
        assert_eq!(refused["error"], "invalid", "{tool}: {refused}");
        assert!(
            message(&refused).contains(limit),
            "{tool} must name {limit:?}: {refused}"
        );
    }
    assert_eq!(lock_rows(&app).await, before, "nothing was written");

    // At the limits exactly, it is accepted.
    let at_limits = alice
        .call(
            "acquire_lock",
            json!({ "name": "y".repeat(256), "ttl_seconds": 86_400, "purpose": "p".repeat(256) }),
        )
        .await
        .unwrap();
    assert!(at_limits["seconds_left"].as_i64().unwrap() > 86_000);
    alice
        .call("acquire_lock", json!({ "name": "z", "ttl_seconds": 5 }))
        .await
        .unwrap();
}

#[tokio::test]
async fn lock_names_are_per_team() {
    let app = spawn_app().await;
    app.team("red").await;
    app.team("blue").await;
    let red = app.mcp(&app.agent("red", "alice").await, None).await;
    let blue = app.mcp(&app.agent("blue", "bob").await, None).await;

    red.call("acquire_lock", json!({ "name": "deploy" }))
        .await
        .unwrap();
    assert_eq!(
        blue.call("list_locks", json!({})).await.unwrap()["count"],
        0
    );
    let refused = blue
        .call("release_lock", json!({ "name": "deploy" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "not_found");
    let own = blue
        .call("acquire_lock", json!({ "name": "deploy" }))
        .await
        .unwrap();
    assert_eq!(own["holder"], "bob");
    assert_eq!(lock_rows(&app).await.len(), 2);
}

/// A window releases its expired lock just as another takes it over; the
/// row is held so both are seen queued on it (the takeover first), then let
/// go. The release waited out the takeover and must say who holds the lock
/// now (it once said the lock was free: the holder's name came from a join,
/// which a locked read does not evaluate again against the newer row, so the
/// row dropped out).
#[tokio::test]
async fn a_release_that_waits_out_a_takeover_names_the_new_holder() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("w2")).await;
    alice
        .call("acquire_lock", json!({ "name": "ci", "ttl_seconds": 600 }))
        .await
        .unwrap();
    let expired = sqlx::query(
        "UPDATE locks SET acquired_at = now() - interval '1 hour',
                          expires_at = now() - interval '1 second'
          WHERE name = 'ci'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(expired.rows_affected(), 1);

    let (taken, refused) = crate::write_fence::queued_on_one_row(
        &app.pool,
        "SELECT 1 FROM locks WHERE name = 'ci' FOR UPDATE",
        async move {
            bob.call("acquire_lock", json!({ "name": "ci", "ttl_seconds": 600 }))
                .await
        },
        async move { alice.call("release_lock", json!({ "name": "ci" })).await },
    )
    .await;
    let taken = taken.expect("bob takes the expired lock");
    assert_eq!(taken["holder"], "bob/w2");
    let refused = refused.unwrap_err();
    assert_eq!(refused["error"], "conflict", "{refused}");
    assert!(
        message(&refused).contains("agent `bob`"),
        "the refusal names the new holder: {refused}"
    );
    assert_eq!(lock_rows(&app).await[0].1, "w2", "bob's window holds it");
}
