//! Webhook delivery: every event reaches its hook exactly once although
//! three replicas dispatch; a receiver that is down, answers 503 or does not
//! answer in time is retried with the same delivery id, a 400 fails at once
//! and is listed with its error; a lease keeps a claimed delivery from every
//! other replica until it lapses; a paused hook is sent nothing and gets
//! what was queued before its pause on resume; and the Slack kind and
//! channel filters decide which events are sent and in what shape.

use std::collections::BTreeSet;
use std::time::Duration;

use ai_crew_sync::store::identity::teams;
use ai_crew_sync::store::operations::webhooks::{self, NewWebhook, WebhookKind, delivery};
use ai_crew_sync::workers::webhook_dispatcher::Dispatcher;
use serde_json::json;
use uuid::Uuid;

use super::{Receiver, add, deliveries, eventually, hook, in_state, post};
use crate::support::{
    free_port, globally, in_team, postgres::fresh_pool, spawn_app, webhook_settings,
};

#[tokio::test]
async fn three_replicas_deliver_each_event_exactly_once() {
    let app = spawn_app().await;
    let second = app.replica().spawn().await;
    let third = app.replica().spawn().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    add(&app, "acme", hook(&receiver.url(), &["message"])).await;

    // Posts through every replica; all three dispatchers run.
    const N: usize = 30;
    let clients = [
        app.mcp(&token, None).await,
        second.mcp(&token, None).await,
        third.mcp(&token, None).await,
    ];
    for i in 0..N {
        post(&clients[i % 3], "general", &format!("event {i}")).await;
    }

    eventually("every delivery delivered", || async {
        in_state(&app, "delivered").await == N
    })
    .await;
    // Settled rows are never claimed again, so what was received is final.
    let received = receiver.requests();
    let ids: Vec<String> = received
        .iter()
        .map(|r| r.header("x-bus-delivery").to_owned())
        .collect();
    let distinct: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(received.len(), N, "exactly one request per event: {ids:?}");
    assert_eq!(distinct.len(), N, "each delivery id once");
    let rows: BTreeSet<String> = deliveries(&app)
        .await
        .iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(
        rows,
        distinct.into_iter().cloned().collect(),
        "the ids received are the delivery rows"
    );
    let bodies: BTreeSet<String> = received
        .iter()
        .map(|r| r.json()["data"]["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bodies.len(), N, "every event arrived");
}

#[tokio::test]
async fn a_receiver_that_is_down_is_retried_until_it_answers() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let port = free_port();
    add(
        &app,
        "acme",
        hook(&format!("http://127.0.0.1:{port}/hook"), &["message"]),
    )
    .await;
    let alice = app.mcp(&token, None).await;
    post(&alice, "general", "while nobody listens").await;

    eventually("two failed attempts, still pending", || async {
        let rows = deliveries(&app).await;
        rows.len() == 1 && rows[0].attempts >= 2 && rows[0].state == "pending"
    })
    .await;
    let row = &deliveries(&app).await[0];
    assert!(
        row.last_error
            .as_deref()
            .unwrap()
            .contains("could not reach the receiver"),
        "{row:?}"
    );

    let receiver = Receiver::start_on(port).await;
    eventually("delivered once the receiver is back", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    let received = receiver.requests();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].header("x-bus-delivery"), row.id.to_string());
    assert_eq!(received[0].json()["data"]["body"], "while nobody listens");
}

#[tokio::test]
async fn a_503_is_retried_and_a_400_fails_with_its_error_listed() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    let created = add(&app, "acme", hook(&receiver.url(), &["message"])).await;
    let alice = app.mcp(&token, None).await;

    receiver.answer_first(&[(503, "busy"), (503, "busy")]);
    post(&alice, "general", "first").await;
    eventually("delivered after two 503s", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    let received = receiver.requests();
    assert_eq!(received.len(), 3, "two refused attempts, then the delivery");
    let ids: BTreeSet<&str> = received
        .iter()
        .map(|r| r.header("x-bus-delivery"))
        .collect();
    assert_eq!(ids.len(), 1, "every retry carries the same delivery id");
    assert_eq!(deliveries(&app).await[0].attempts, 3);

    receiver.answer_always(400);
    receiver.answer_first(&[(400, "unknown payload shape")]);
    post(&alice, "general", "second").await;
    eventually("the 400 failed", || async {
        in_state(&app, "failed").await == 1
    })
    .await;
    let failed = deliveries(&app)
        .await
        .into_iter()
        .find(|r| r.state == "failed")
        .unwrap();
    assert_eq!(
        (failed.attempts, failed.last_status),
        (1, Some(400)),
        "a 400 is permanent: no retry"
    );
    assert_eq!(receiver.requests().len(), 4);

    let listed = webhooks::list(&app.pool, &in_team("acme")).await.unwrap();
    assert_eq!(listed.len(), 1);
    let listed = &listed[0];
    assert_eq!(listed.id, created.webhook.id);
    assert_eq!(
        (listed.deliveries.delivered, listed.deliveries.failed),
        (1, 1)
    );
    let error = listed.failures[0].last_error.as_deref().unwrap();
    assert_eq!(
        error, "the receiver answered 400 Bad Request",
        "the status and its phrase, never the receiver's body"
    );
    assert!(
        !serde_json::to_string(&listed)
            .unwrap()
            .contains(&created.secret),
        "a listing never shows the secret"
    );
}

#[tokio::test]
async fn a_receiver_that_does_not_answer_in_time_is_retried() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    add(&app, "acme", hook(&receiver.url(), &["message"])).await;
    receiver.stall_next(1);
    post(&app.mcp(&token, None).await, "general", "slow").await;

    eventually("delivered after a timeout", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    let row = &deliveries(&app).await[0];
    assert_eq!(row.attempts, 2, "the stalled attempt, then the delivery");
    let received = receiver.requests();
    assert_eq!(received.len(), 2);
    assert!(
        received
            .iter()
            .all(|r| r.header("x-bus-delivery") == row.id.to_string())
    );
}

#[tokio::test]
async fn a_lease_keeps_a_delivery_from_everyone_else_until_it_lapses() {
    let receiver = Receiver::start().await;
    let (pool, _) = one_queued_delivery(&receiver.url()).await;

    // A replica claims it and dies before settling.
    let dead = delivery::claim(&pool, 10, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert!(
        delivery::claim(&pool, 10, Duration::from_secs(2))
            .await
            .unwrap()
            .is_empty(),
        "nobody else takes a leased delivery"
    );
    let dispatcher = Dispatcher::new(pool.clone(), webhook_settings()).unwrap();
    assert_eq!(dispatcher.run_once().await.unwrap(), 0);
    assert!(receiver.requests().is_empty());

    // Once the lease lapses, another replica sends it.
    eventually("claimed again after the lease", || async {
        dispatcher.run_once().await.unwrap() == 1
    })
    .await;
    assert_eq!(receiver.requests().len(), 1);
    assert_eq!(
        receiver.requests()[0].header("x-bus-delivery"),
        dead[0].id.to_string()
    );
    // The dead replica's late settle changes nothing.
    assert!(
        !delivery::settle_delivered(&pool, &dead[0], 200)
            .await
            .unwrap()
    );
    let (state, attempts): (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM webhook_deliveries")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("delivered", 2));
}

#[tokio::test]
async fn slack_and_channel_filters_shape_what_is_sent() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    add(
        &app,
        "acme",
        NewWebhook {
            kind: WebhookKind::Slack,
            channels: vec!["#ops".into()],
            ..hook(&receiver.url(), &["message"])
        },
    )
    .await;
    let alice = app.mcp(&token, None).await;
    app.team("other").await;
    let other = app.agent("other", "carol").await;
    post(&app.mcp(&other, None).await, "ops", "another team's #ops").await;
    post(&alice, "general", "not for this hook").await;
    post(&alice, "ops", "disk <full> & rising").await;
    alice
        .call(
            "create_task",
            json!({"key": "t1", "title": "not subscribed"}),
        )
        .await
        .unwrap();

    eventually("one delivery sent", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    assert_eq!(
        deliveries(&app).await.len(),
        1,
        "only #ops messages of this team match; a team without hooks enqueues nothing"
    );
    let body = receiver.requests()[0].json();
    assert_eq!(
        body,
        json!({"text": "[acme] #ops alice wrote: disk &lt;full&gt; &amp; rising"})
    );
}

/// A database without a server (the test is the only dispatcher, so it
/// decides who claims) holding team `acme`, a task hook to `url` and one
/// delivery queued for it; the hook's id.
async fn one_queued_delivery(url: &str) -> (sqlx::PgPool, Uuid) {
    let (pool, _) = fresh_pool().await;
    teams::create(&pool, &globally(), "acme", "Acme")
        .await
        .unwrap();
    let hook_id = webhooks::add(&pool, &in_team("acme"), hook(url, &["task"]))
        .await
        .unwrap()
        .webhook
        .id;
    sqlx::query(
        "INSERT INTO webhook_deliveries (team_id, webhook_id, event, payload)
         SELECT team_id, id, 'task.created', '{\"key\": \"k\"}' FROM webhooks WHERE id = $1",
    )
    .bind(hook_id)
    .execute(&pool)
    .await
    .unwrap();
    (pool, hook_id)
}

/// The delivery rows of one hook: (state, attempts, due now).
async fn rows_of(app: &crate::support::TestApp, hook: Uuid) -> Vec<(String, i32, bool)> {
    sqlx::query_as(
        "SELECT state, attempts, next_attempt_at <= now() FROM webhook_deliveries
          WHERE webhook_id = $1 ORDER BY created_at",
    )
    .bind(hook)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

// A hook paused while its receiver is down: events posted during the pause
// are not queued for it, and the delivery queued before waits. Once that
// delivery is due again, a newer delivery of another hook is sent (the
// dispatcher takes the oldest due first, so it would have taken the paused
// one before it) and the paused hook's receiver, back up meanwhile, gets
// nothing. On resume it gets the delivery queued before the pause, once,
// then new events again; never what was posted during the pause.
#[tokio::test]
async fn a_paused_hook_is_sent_nothing_and_resuming_sends_what_was_queued_before() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let paused = add(&app, "acme", hook(&url, &["message"])).await.webhook.id;
    let watcher = Receiver::start().await;
    add(&app, "acme", hook(&watcher.url(), &["message"])).await;

    post(&alice, "general", "before the pause").await;
    eventually("a first attempt at the receiver that is down", || async {
        rows_of(&app, paused)
            .await
            .first()
            .is_some_and(|r| r.1 >= 1)
    })
    .await;
    let change = webhooks::set_paused(&app.pool, paused, &in_team("acme"), true)
        .await
        .unwrap();
    assert!(change.changed && change.webhook.paused_at.is_some());
    // An attempt already under way when the pause committed settles.
    eventually("the queued delivery back to pending", || async {
        rows_of(&app, paused).await[0].0 == "pending"
    })
    .await;
    let attempts = rows_of(&app, paused).await[0].1;
    let receiver = Receiver::start_on(port).await;

    post(&alice, "general", "during the pause").await;
    eventually("the queued delivery due again", || async {
        rows_of(&app, paused).await[0].2
    })
    .await;
    post(&alice, "general", "probe").await;
    eventually("the other hook sent the probe", || async {
        watcher
            .requests()
            .iter()
            .any(|r| r.json()["data"]["body"] == "probe")
    })
    .await;
    assert!(
        receiver.requests().is_empty(),
        "nothing reaches a paused hook"
    );
    assert_eq!(
        rows_of(&app, paused).await,
        [("pending".to_owned(), attempts, true)],
        "one delivery waits, not tried again; none queued during the pause"
    );

    let change = webhooks::set_paused(&app.pool, paused, &in_team("acme"), false)
        .await
        .unwrap();
    assert!(change.changed && change.webhook.paused_at.is_none());
    eventually("the queued delivery sent on resume", || async {
        !receiver.requests().is_empty()
    })
    .await;
    post(&alice, "general", "after the resume").await;
    eventually("the new event sent", || async {
        receiver.requests().len() >= 2
    })
    .await;
    let bodies: Vec<String> = receiver
        .requests()
        .iter()
        .map(|r| r.json()["data"]["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bodies, ["before the pause", "after the resume"]);
    // The receiver has answered; the dispatcher records it just after.
    eventually("both deliveries recorded delivered", async || {
        let states: Vec<String> = rows_of(&app, paused)
            .await
            .into_iter()
            .map(|r| r.0)
            .collect();
        (states == ["delivered", "delivered"])
            .then_some(())
            .ok_or(states)
    })
    .await;
}

// A claim made while a pause is being committed takes nothing of the
// paused hook, neither then nor after: once `pause` has answered no send
// starts. (Reading the hook without a lock, the claim saw it active in its
// snapshot and leased its delivery while the pause committed.)
#[tokio::test]
async fn a_claim_made_while_a_pause_commits_takes_nothing_of_the_hook() {
    let (pool, hook_id) = one_queued_delivery("http://127.0.0.1:9/hook").await;

    // The pause's transaction, between its write and its commit.
    let mut pausing = pool.begin().await.unwrap();
    sqlx::query("UPDATE webhooks SET paused_at = now(), paused_by = 'test' WHERE id = $1")
        .bind(hook_id)
        .execute(&mut *pausing)
        .await
        .unwrap();
    let during = delivery::claim(&pool, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(during.is_empty(), "claimed during the pause: {during:?}");
    pausing.commit().await.unwrap();
    let after = delivery::claim(&pool, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(after.is_empty(), "claimed after the pause: {after:?}");
    let (state, attempts): (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM webhook_deliveries")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("pending", 0));

    webhooks::set_paused(&pool, hook_id, &in_team("acme"), false)
        .await
        .unwrap();
    let resumed = delivery::claim(&pool, 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(resumed.len(), 1, "resumed, the delivery is claimed");
}

/// A delivery's payload carries what its event said (here a post's body):
/// `team usage` counts delivery rows against the team, and `team prune`
/// removes the settled ones (delivered, failed) with the messages of their
/// age, while one still waiting to be sent stays.
#[tokio::test]
async fn settled_deliveries_are_counted_in_usage_and_pruned_with_the_messages() {
    use ai_crew_sync::store::operations::retention::{self, PruneRequest};
    use ai_crew_sync::store::operations::usage;

    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    let created = add(&app, "acme", hook(&receiver.url(), &["message"])).await;
    let alice = app.mcp(&token, None).await;
    receiver.answer_first(&[(400, "no")]);
    post(&alice, "general", "refused by the receiver").await;
    eventually("the first failed", || async {
        in_state(&app, "failed").await == 1
    })
    .await;
    post(&alice, "general", "taken by the receiver").await;
    eventually("the second delivered", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    receiver.answer_always(503);
    post(&alice, "general", "still to be sent").await;
    eventually("the third retried", || async {
        deliveries(&app)
            .await
            .iter()
            .any(|r| r.state == "pending" && r.attempts >= 1)
    })
    .await;
    // Its next retry is a day away: it is still owed to the receiver. (An
    // attempt in flight right now loses its lease and settles nothing.)
    sqlx::query(
        "UPDATE webhook_deliveries
            SET state = 'pending', lease_id = NULL, next_attempt_at = now() + interval '1 day'
          WHERE state IN ('pending', 'delivering')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    for aged in [
        "UPDATE messages SET created_at = now() - interval '40 days'",
        "UPDATE webhook_deliveries SET created_at = now() - interval '40 days'",
    ] {
        sqlx::query(aged).execute(&app.pool).await.unwrap();
    }

    let used = usage::usage(&app.pool, &in_team("acme")).await.unwrap();
    let counted = used.kind("webhook_deliveries").unwrap().clone();
    assert_eq!(counted.rows, 3, "{used:?}");
    assert!(counted.in_quota, "counted against the quota");
    let (bytes,): (i64,) = sqlx::query_as(
        "SELECT sum(octet_length(payload::text) + coalesce(octet_length(last_error), 0))::bigint
           FROM webhook_deliveries",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(counted.bytes, bytes);

    let request = |apply| PruneRequest {
        older_than_days: 30,
        audit_older_than_days: None,
        apply,
    };
    let prune = |apply| {
        let app = &app;
        async move {
            retention::prune(
                &app.pool,
                &app.bus.backends,
                &in_team("acme"),
                &request(apply),
                &|_| {},
            )
            .await
            .unwrap()
        }
    };
    let dry = prune(false).await;
    assert_eq!(dry.kind("webhook_deliveries").unwrap().rows, 2, "{dry:?}");
    let applied = prune(true).await;
    assert_eq!(applied.kind("webhook_deliveries").unwrap().rows, 2);
    let left = deliveries(&app).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].state, "pending", "the one still owed stays");
    let listed = webhooks::list(&app.pool, &in_team("acme")).await.unwrap();
    assert_eq!(listed[0].id, created.webhook.id);
    assert!(listed[0].failures.is_empty(), "the failed one went");
    let after = usage::usage(&app.pool, &in_team("acme")).await.unwrap();
    assert_eq!(after.kind("webhook_deliveries").unwrap().rows, 1);
}
