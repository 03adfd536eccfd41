//! What an operator sees and does when a team's streams need them: a full
//! stream, a wiped broker store, `/health`'s broker conditions (and whom it
//! names them to), and `conversations retry` once the cause is fixed.

use super::*;

// O8, O14, issue 15 item 2: a full stream is a condition the operator fixes,
// not the message's fault. The overflow waits pending without spending its
// attempts however many passes run (never `failed`); /health?broker=check
// and `conversations status` name the team, the stream, why, and the
// `team stream --update-quotas` that fixes it; once the operator raises the
// quota with that command the drain stores every message, each once, and
// the condition clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_keeps_the_overflow_pending_until_its_quota_is_raised() {
    let url = nats_url();
    let app = TestApp::builder().broker_at(&url).spawn().await;
    let t = Routed::new(&app, "jsbfull").await;
    let quota = StreamSizes {
        max_messages: 5,
        ..StreamSizes::default()
    };
    teams::provision_streams(
        &app.pool,
        "jsbfull",
        app.broker(),
        &quota,
        true,
        &test_actor(),
    )
    .await
    .expect("lower the body stream's quota to 5 messages");
    let mut sent = Vec::new();
    for i in 1..=8 {
        let body = format!("message {i}");
        sent.push((t.send(&body).await, body));
    }
    let ids: Vec<Uuid> = sent.iter().map(|(id, _)| *id).collect();

    // More passes than a message has attempts (8): none is spent.
    for pass_no in 1..=10 {
        let pass = publication::drain_once(&app.bus, "drain-test", &drain_settings())
            .await
            .unwrap();
        let expected_stored = if pass_no == 1 { 5 } else { 0 };
        assert_eq!(
            (pass.stored, pass.waiting, pass.retrying, pass.failed),
            (expected_stored, 3, 0, 0),
            "pass {pass_no}: {pass:?}"
        );
        let overflow: Vec<(String, i32, Option<String>, f64)> = sqlx::query_as(
            "SELECT state, attempts, last_error,
                    extract(epoch FROM next_attempt_at - now())::float8
               FROM conversation_outbox WHERE team_id = $1",
        )
        .bind(t.team_id)
        .fetch_all(&app.pool)
        .await
        .unwrap();
        assert_eq!(overflow.len(), 3, "three slots left: {overflow:?}");
        for (state, attempts, last_error, due_in) in &overflow {
            assert_eq!(state, "pending", "waiting, never failed: {overflow:?}");
            assert_eq!(*attempts, 0, "no attempt is spent on a full stream");
            let why = last_error.as_deref().unwrap_or_default();
            assert!(
                why.contains("full") && why.contains("--update-quotas"),
                "{why}"
            );
            assert!(
                (outbox::WAIT_RECHECK_SECS - 1.0..=outbox::WAIT_RECHECK_SECS + 0.5)
                    .contains(due_in),
                "re-checked in {} s, due in {due_in}",
                outbox::WAIT_RECHECK_SECS
            );
        }
        t.make_due().await;
    }
    let states: Vec<String> = sqlx::query_scalar(
        "SELECT publication_state FROM conversation_messages
          WHERE conversation_id = $1 ORDER BY publication_state",
    )
    .bind(t.conversation_id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        [vec!["pending_publication"; 3], vec!["stored"; 5]].concat()
    );
    let status = outbox::status(&app.pool, t.team_id).await.unwrap();
    assert_eq!((status.pending, status.failed), (3, 0));

    // What the operator sees: health and status name team, stream, why, fix.
    let stream = body_stream_name(t.team_id);
    let health = health_check(&app).await;
    assert_eq!(health["status"], "degraded", "{health}");
    let condition = only_condition(&health, &stream);
    assert_eq!(condition["team"], "jsbfull", "{health}");
    assert_eq!(condition["condition"], "stream_full", "{health}");
    assert!(
        condition["fix"]
            .as_str()
            .unwrap()
            .contains("team stream --team jsbfull")
            && condition["fix"]
                .as_str()
                .unwrap()
                .contains("--update-quotas"),
        "{health}"
    );
    let status = cli_json(
        &app,
        &[
            "conversations",
            "status",
            "--team",
            "jsbfull",
            "--nats-url",
            &url,
            "--json",
        ],
    );
    assert_eq!(status["outbox"]["pending"], 3, "{status}");
    assert_eq!(status["outbox"]["failed"], 0, "{status}");
    let said = status["broker_conditions"].as_array().unwrap();
    assert!(
        said.iter()
            .any(|c| c["stream"] == stream.as_str() && c["condition"] == "stream_full"),
        "{status}"
    );
    let text = cli_ok(
        &app,
        &[
            "conversations",
            "status",
            "--team",
            "jsbfull",
            "--nats-url",
            &url,
        ],
    );
    assert!(
        text.contains(&stream)
            && text.contains("stream_full")
            && text.contains("fix: ai-crew-sync team stream --team jsbfull"),
        "{text}"
    );

    // The fix, as the operator runs it.
    cli_ok(
        &app,
        &[
            "team",
            "stream",
            "--team",
            "jsbfull",
            "--nats-url",
            &url,
            "--update-quotas",
            "--max-messages",
            "1000",
        ],
    );
    t.make_due().await;
    let pass = publication::drain_once(&app.bus, "drain-test", &drain_settings())
        .await
        .unwrap();
    assert_eq!(
        (pass.stored, pass.failed, pass.waiting),
        (3, 0, 0),
        "{pass:?}"
    );
    let locators = t.wait_stored(&ids).await;
    let stored: Vec<(Uuid, String, String)> = sent
        .into_iter()
        .zip(locators)
        .map(|((id, body), locator)| (id, body, locator))
        .collect();
    assert_once_in_stream(&url, t.team_id, t.conversation_id, &stored).await;
    let page = t.read_as_bob().await;
    for (id, body, _) in &stored {
        assert_eq!(in_page(&page, *id)["body"], body.as_str(), "{page}");
    }
    let health = health_check(&app).await;
    assert_eq!(health["status"], "ok", "the condition cleared: {health}");
    assert_eq!(health["broker_conditions"], json!([]), "{health}");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

/// `GET /health?broker=check`, as an operator asks it: with a global admin
/// credential, so conditions name their team, stream and fix.
async fn health_check(app: &TestApp) -> Value {
    let admin = ai_crew_sync::store::identity::admin::grant(&app.pool, &globally(), None, None)
        .await
        .expect("a global admin credential")
        .credential;
    crate::support::http_client()
        .get(app.url("/health?broker=check"))
        .bearer_auth(admin)
        .send()
        .await
        .expect("/health answers")
        .json()
        .await
        .expect("/health is JSON")
}

/// `/health` with `bearer` (none: anonymous), checking the broker.
async fn health_as(app: &TestApp, bearer: Option<&str>) -> Value {
    let mut request = crate::support::http_client().get(app.url("/health?broker=check"));
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    let response = request.send().await.expect("/health answers");
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.expect("/health is JSON")
}

// A condition makes `/health` look up the admin credential a probe carries
// (to name the team). A made-up credential costs a database query, so it
// spends the address's allowance of failed authentications as on `/admin`:
// once spent, that address's lookups wait their turn, a few at a time. A
// valid credential is never refused for it (issue 33 item 5): the admin
// still sees the team named.
#[tokio::test]
async fn health_still_names_the_team_to_a_valid_admin_after_made_up_credentials_spend_the_allowance()
 {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let team_id = app.jetstream_team("jsbprobe").await;
    app.broker()
        .js()
        .delete_stream(body_stream_name(team_id))
        .await
        .unwrap();
    let admin = ai_crew_sync::store::identity::admin::grant(&app.pool, &globally(), None, None)
        .await
        .expect("a global admin credential")
        .credential;
    let named = eventually("the missing stream named to the admin", async || {
        let health = health_as(&app, Some(&admin)).await;
        (health["broker_conditions"][0]["team"] == "jsbprobe").then_some(health)
    })
    .await;
    assert_eq!(named["status"], "degraded", "{named}");

    let made_up = format!("acsa_{}", "0".repeat(64));
    // A few more than the allowance holds spend it.
    let allowance = ai_crew_sync::config::HttpSettings::default().unauthenticated_per_minute;
    for _ in 0..allowance + 10 {
        let anonymous = health_as(&app, Some(&made_up)).await;
        assert_eq!(
            anonymous["broker_conditions"][0]["condition"],
            "stream_missing"
        );
        assert!(!anonymous.to_string().contains("jsbprobe"), "{anonymous}");
    }
    let seen = health_as(&app, Some(&admin)).await;
    assert_eq!(seen["status"], "degraded", "{seen}");
    assert_eq!(
        seen["broker_conditions"][0]["team"], "jsbprobe",
        "the valid admin credential is still looked up and served: {seen}"
    );
}

/// The one condition `health` names for `stream`.
fn only_condition<'v>(health: &'v Value, stream: &str) -> &'v Value {
    let found: Vec<&Value> = health["broker_conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("broker_conditions in {health}"))
        .iter()
        .filter(|c| c["stream"] == stream)
        .collect();
    assert_eq!(found.len(), 1, "one condition for {stream}: {health}");
    found[0]
}

// O8, O14, issue 15 items 2 and 3: the broker's store is wiped and it
// restarts empty. Messages sent meanwhile wait pending, attempts unspent,
// however many passes run; /health and `conversations status` name both
// missing streams with the `team stream` command; `create_conversation` is
// refused naming it; `team stream` re-creates the streams and says how many
// messages name a stream that no longer holds them; then the waiting
// messages are stored and nothing PostgreSQL held is lost to a reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_broker_store_keeps_messages_pending_until_team_stream_recreates_the_streams() {
    let mut server = OwnedNats::start();
    let url = server.url();
    let app = TestApp::builder().broker_at(&url).spawn().await;
    let t = Routed::new(&app, "jsbwipe").await;
    let mut sent = Vec::new();
    for i in 1..=2 {
        let body = format!("before the wipe {i}");
        sent.push((t.send(&body).await, body));
    }
    drain_all(&app).await;
    t.wait_stored(&[sent[0].0, sent[1].0]).await;

    server.wipe_store();
    wait_reachable(app.broker()).await;
    let mut waiting = Vec::new();
    for i in 1..=3 {
        let body = format!("during the outage {i}");
        waiting.push((t.send(&body).await, body));
    }
    for pass_no in 1..=10 {
        let pass = publication::drain_once(&app.bus, "drain-test", &drain_settings())
            .await
            .unwrap();
        assert_eq!(
            (pass.stored, pass.waiting, pass.failed),
            (0, 3, 0),
            "pass {pass_no}: {pass:?}"
        );
        t.make_due().await;
    }
    let attempts: Vec<(String, i32)> =
        sqlx::query_as("SELECT state, attempts FROM conversation_outbox WHERE team_id = $1")
            .bind(t.team_id)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        vec![("pending".to_owned(), 0); 3],
        "no attempt spent"
    );
    for (id, _) in &waiting {
        assert_eq!(t.row(*id).await.publication_state, "pending_publication");
    }

    let body_stream = body_stream_name(t.team_id);
    let inbox_stream = ai_crew_sync::backend::jetstream::inbox_stream_name(t.team_id);
    // A stream check is reused for a moment (CHECK_CACHE); both streams
    // are named once it runs again.
    let health = eventually("health names both missing streams", async || {
        let health = health_check(&app).await;
        (health["broker_conditions"].as_array()?.len() == 2).then_some(health)
    })
    .await;
    assert_eq!(health["status"], "degraded", "{health}");
    // Without a credential the probe says what and where to look, never which team.
    let anonymous: Value = crate::support::http_client()
        .get(app.url("/health?broker=check"))
        .send()
        .await
        .expect("/health answers")
        .json()
        .await
        .expect("/health is JSON");
    assert_eq!(anonymous["status"], "degraded", "{anonymous}");
    assert_eq!(
        anonymous["broker_conditions"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(
        anonymous["broker_conditions"][0]["condition"],
        "stream_missing"
    );
    assert!(!anonymous.to_string().contains("jsbwipe"), "{anonymous}");
    assert!(!anonymous.to_string().contains(&body_stream), "{anonymous}");
    for stream in [&body_stream, &inbox_stream] {
        let condition = only_condition(&health, stream);
        assert_eq!(condition["team"], "jsbwipe", "{health}");
        assert_eq!(condition["condition"], "stream_missing", "{health}");
        assert_eq!(
            condition["fix"],
            format!("ai-crew-sync team stream --team jsbwipe --nats-url {url}"),
            "{health}"
        );
    }
    let status = cli_json(
        &app,
        &[
            "conversations",
            "status",
            "--team",
            "jsbwipe",
            "--nats-url",
            &url,
            "--json",
        ],
    );
    assert_eq!(
        (
            status["outbox"]["pending"].as_i64(),
            status["outbox"]["failed"].as_i64()
        ),
        (Some(3), Some(0)),
        "{status}"
    );
    let said = status["broker_conditions"].as_array().unwrap();
    assert_eq!(said.len(), 2, "{status}");
    assert!(
        said.iter().all(|c| c["condition"] == "stream_missing"),
        "{status}"
    );

    let refused = t
        .alice
        .call(
            "create_conversation",
            json!({"title": "not now", "private": true, "invite": ["bob"]}),
        )
        .await
        .expect_err("no new conversation on missing streams");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains(&body_stream)
            && message.contains(&format!(
                "ai-crew-sync team stream --team jsbwipe --nats-url {url}"
            )),
        "{refused}"
    );
    let conversations: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversations WHERE team_id = $1")
            .bind(t.team_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(conversations, 1, "nothing was created");

    // The fix, as the health answer names it.
    let streams = cli_json(
        &app,
        &[
            "team",
            "stream",
            "--team",
            "jsbwipe",
            "--nats-url",
            &url,
            "--json",
        ],
    );
    assert_eq!(streams["body"]["state"], "created", "{streams}");
    assert_eq!(
        streams["stale_locators"]["messages"], 2,
        "the two stored before the wipe: {streams}"
    );
    t.make_due().await;
    drain_all(&app).await;
    let ids: Vec<Uuid> = waiting.iter().map(|(id, _)| *id).collect();
    t.wait_stored(&ids).await;
    let page = t.read_as_bob().await;
    for (id, body) in sent.iter().chain(&waiting) {
        assert_eq!(
            in_page(&page, *id)["body"],
            body.as_str(),
            "nothing lost: {page}"
        );
    }
    eventually("health is ok again", async || {
        let health = health_check(&app).await;
        (health["status"] == "ok" && health["broker_conditions"] == json!([])).then_some(())
    })
    .await;
    t.conversation("after the fix").await;
}

// O9, issue 15 item 3: a message failed for good (a body its stream refused
// as too large: fatal) is recovered with one command once the cause is
// fixed. `conversations retry` is a dry run by default, refuses while the
// team's stream is missing (naming it and `team stream`) and changes
// nothing; after `team stream`, `--apply` puts it back to pending with fresh
// attempts (audited), and the drain stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_retry_recovers_failed_messages_once_the_cause_is_fixed() {
    let mut server = OwnedNats::start();
    let url = server.url();
    let app = TestApp::builder().broker_at(&url).spawn().await;
    let t = Routed::new(&app, "jsbretry").await;
    // An operator's stream that takes only small bodies.
    let body_stream = body_stream_name(t.team_id);
    let mut config = app
        .broker()
        .js()
        .get_stream(&body_stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    config.max_message_size = 64;
    app.broker().js().update_stream(config).await.unwrap();
    let body = "a body longer than sixty-four bytes, which this stream refuses for good";
    let id = t.send(body).await;
    drain_all(&app).await;
    eventually("the message fails", async || {
        (t.row(id).await.publication_state == "failed").then_some(())
    })
    .await;

    // The cause goes on: the broker's store is wiped.
    server.wipe_store();
    wait_reachable(app.broker()).await;
    let refused = cli_refused(
        &app,
        &[
            "conversations",
            "retry",
            "--team",
            "jsbretry",
            "--nats-url",
            &url,
            "--apply",
        ],
    );
    assert!(
        refused.contains(&body_stream)
            && refused.contains("stream_missing")
            && refused.contains("team stream --team jsbretry"),
        "{refused}"
    );
    assert_eq!(
        t.row(id).await.publication_state,
        "failed",
        "nothing changed"
    );

    cli_ok(
        &app,
        &["team", "stream", "--team", "jsbretry", "--nats-url", &url],
    );
    let dry = cli_json(
        &app,
        &[
            "conversations",
            "retry",
            "--team",
            "jsbretry",
            "--nats-url",
            &url,
            "--json",
        ],
    );
    assert_eq!(dry["applied"], false, "{dry}");
    assert_eq!(dry["retried"][0]["message_id"], id.to_string(), "{dry}");
    assert_eq!(
        t.row(id).await.publication_state,
        "failed",
        "a dry run writes nothing"
    );

    let applied = cli_json(
        &app,
        &[
            "conversations",
            "retry",
            "--team",
            "jsbretry",
            "--nats-url",
            &url,
            "--apply",
            "--json",
        ],
    );
    assert_eq!(applied["applied"], true, "{applied}");
    let slot: (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM conversation_outbox WHERE message_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(slot, ("pending".to_owned(), 0), "fresh attempts");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'conversation.retry' AND team_id = $1",
    )
    .bind(t.team_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(audited, 1);
    drain_all(&app).await;
    t.wait_stored(&[id]).await;
    let page = t.read_as_bob().await;
    assert_eq!(in_page(&page, id)["body"], body, "{page}");
}
