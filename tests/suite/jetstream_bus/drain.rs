//! The outbox into the team's body stream: a send is pending, then stored
//! once under its publish key and read through the bus; a broker stopped
//! mid-traffic, a lost publish acknowledgement, two replicas draining at
//! once, a locator copied from elsewhere, and `serve` started during a
//! broker outage.

use super::*;

// O2, O3, O6, O7, B1: a send on a jetstream team is accepted pending (and the
// reader's cursor stops before it), then the drain stores it under a
// `jetstream:` locator; the recipient reads it through the bus, and the body
// stream holds it once, under the outbox's publish key.
#[tokio::test]
async fn a_send_is_pending_then_stored_once_in_the_stream_and_read_through_the_bus() {
    let url = nats_url();
    let app = TestApp::builder().broker_at(&url).spawn().await;
    let t = Routed::new(&app, "jsb1").await;
    let body = "hello through the broker";
    let id = t.send(body).await;

    let page = t.read_as_bob().await;
    let pending = in_page(&page, id);
    assert_eq!(pending["publication"], "pending_publication");
    assert_eq!(pending["unavailable"]["reason"], "pending_publication");
    assert!(pending["body"].is_null());
    assert_eq!(page["next_after_seq"], 0, "the cursor stops before it");
    let publish_key: Uuid =
        sqlx::query_scalar("SELECT publish_key FROM conversation_outbox WHERE message_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .expect("one outbox slot (O2)");

    let workers = app.start_publication_workers();
    let locator = t.wait_stored(&[id]).await.remove(0);
    assert!(
        locator.starts_with(&format!("jetstream:{}:", body_stream_name(t.team_id))),
        "{locator}"
    );
    let page = t.read_as_bob().await;
    let stored = in_page(&page, id);
    assert_eq!(stored["publication"], "stored");
    assert_eq!(stored["body"], body);
    assert!(stored["unavailable"].is_null());
    assert!(
        stored["my_receipt"]["stored_at"].is_string(),
        "O7: {stored}"
    );
    assert_eq!(page["next_after_seq"], 1);
    let one = t
        .bob
        .call("get_conversation_message", json!({"message_id": id}))
        .await
        .unwrap();
    assert_eq!(one["body"], body);

    assert_once_in_stream(
        &url,
        t.team_id,
        t.conversation_id,
        &[(id, body.to_owned(), locator.clone())],
    )
    .await;
    let entry = body_stream(&url, t.team_id)
        .await
        .get_raw_message(sequence(t.team_id, &locator))
        .await
        .unwrap();
    assert_eq!(
        entry.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some(publish_key.to_string().as_str()),
        "the broker deduplicates on the outbox's publish key"
    );
    assert_eq!(
        outbox::status(&app.pool, t.team_id).await.unwrap(),
        outbox::Status::default(),
        "nothing left in flight"
    );
    workers.stop().await;
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O3, O8, O16, B1: nats-server stopped mid-traffic. Every send is accepted
// and pending (never an error to the sender), reads still answer, and after
// the restart every message is stored exactly once: one stream entry per
// message, each locator a distinct sequence holding that message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_stopped_mid_traffic_leaves_sends_pending_and_stores_each_once_after_restart() {
    let mut server = OwnedNats::start();
    let app = TestApp::builder().broker_at(&server.url()).spawn().await;
    let t = Routed::new(&app, "jsb2").await;
    let workers = app.start_publication_workers();
    let mut sent: Vec<(Uuid, String)> = Vec::new();

    for i in 0..10 {
        let body = format!("before the stop {i}");
        sent.push((t.send(&body).await, body));
    }
    // Some of those are still in flight when the broker goes.
    tokio::task::block_in_place(|| server.stop());
    for i in 0..10 {
        let body = format!("while the broker is down {i}");
        sent.push((t.send(&body).await, body));
    }
    // The drain tried while the broker was down and was told nothing: the
    // slots wait (pending, with the reason), none failed.
    eventually("an attempt fails against the stopped broker", async || {
        let tried: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_outbox
              WHERE state = 'pending' AND last_error IS NOT NULL",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        (tried > 0).then_some(())
    })
    .await;
    let page = t.read_as_bob().await;
    assert_eq!(page["messages"].as_array().unwrap().len(), sent.len());
    let down = sent.last().unwrap().0;
    assert_eq!(in_page(&page, down)["publication"], "pending_publication");
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_outbox WHERE state = 'failed'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(failed, 0, "a stopped broker fails nothing");

    tokio::task::block_in_place(|| server.restart());
    wait_reachable(app.broker()).await;
    for i in 0..5 {
        let body = format!("after the restart {i}");
        sent.push((t.send(&body).await, body));
    }
    t.make_due().await;
    let ids: Vec<Uuid> = sent.iter().map(|(id, _)| *id).collect();
    let locators = t.wait_stored(&ids).await;
    workers.stop().await;

    let stored: Vec<(Uuid, String, String)> = sent
        .into_iter()
        .zip(locators)
        .map(|((id, body), locator)| (id, body, locator))
        .collect();
    assert_once_in_stream(&server.url(), t.team_id, t.conversation_id, &stored).await;
    let page = t.read_as_bob().await;
    for (id, body, _) in &stored {
        assert_eq!(&in_page(&page, *id)["body"], body);
    }
    assert_eq!(page["next_after_seq"], stored.len());
}

// O11, O16, O17, B1: the broker stores the body and its PubAck is lost (the
// replies black-holed, then the connection cut). The drain marks the
// attempt uncertain (not failed, not retried blindly); the reconciler
// re-presents the same envelope under the same Nats-Msg-Id and settles the
// message with the ORIGINAL sequence. One stream entry.
#[tokio::test]
async fn a_lost_puback_ends_stored_with_the_original_sequence_through_drain_and_reconciler() {
    let url = nats_url();
    let proxy = Proxy::start(socket(&url)).await;
    let app = TestApp::builder().broker_at(&proxy.url()).spawn().await;
    let t = Routed::new(&app, "jsb3").await;
    let body = "the answer to this one is lost";
    let id = t.send(body).await;

    proxy.black_hole_replies();
    let pass = publication::drain_once(&app.bus, "drain", &drain_settings())
        .await
        .unwrap();
    assert_eq!(
        (pass.leased, pass.stored, pass.retrying, pass.failed),
        (1, 0, 1, 0),
        "no answer is neither stored nor failed"
    );
    let row = t.row(id).await;
    assert_eq!(row.publication_state, "pending_publication");
    assert!(row.uncertain, "O16: marked uncertain");
    assert!(row.canonical_locator.is_none());
    let page = t.read_as_bob().await;
    let pending = in_page(&page, id);
    assert_eq!(pending["unavailable"]["reason"], "pending_publication");
    assert!(
        pending["unavailable"]["detail"]
            .as_str()
            .unwrap()
            .contains("without an answer"),
        "{pending}"
    );
    // The broker did store it.
    eventually("the broker holds the body", async || {
        (stream_messages(&url, t.team_id).await == 1).then_some(())
    })
    .await;
    let original = {
        let mut stream = body_stream(&url, t.team_id).await;
        stream.info().await.unwrap().state.last_sequence
    };

    // The connection is cut and comes back; the reconciler asks.
    proxy.pass();
    proxy.cut();
    wait_reachable(app.broker()).await;
    assert_eq!(publication::reconcile_once(&app.bus).await.unwrap(), 1);
    let row = t.row(id).await;
    assert_eq!(row.publication_state, "stored");
    assert!(!row.uncertain, "stored is no longer uncertain");
    let locator = row.canonical_locator.unwrap();
    assert_eq!(
        sequence(t.team_id, &locator),
        original,
        "the original sequence"
    );
    assert_once_in_stream(
        &url,
        t.team_id,
        t.conversation_id,
        &[(id, body.to_owned(), locator)],
    )
    .await;
    // Nothing left for the drain to publish again.
    let pass = publication::drain_once(&app.bus, "drain", &drain_settings())
        .await
        .unwrap();
    assert_eq!(pass.leased, 0);
    assert_eq!(in_page(&t.read_as_bob().await, id)["body"], body);
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// B1 (fetch verifies the locator names this message and this team's
// stream): a locator copied onto another message, from another conversation
// of the team or from another team, reads nothing of the body it points at.
#[tokio::test]
async fn a_locator_copied_from_another_conversation_or_team_reads_nothing() {
    let url = nats_url();
    let app = TestApp::builder().broker_at(&url).spawn().await;
    let ours = Routed::new(&app, "jsb4a").await;
    let theirs = Routed::new(&app, "jsb4b").await;
    let elsewhere = ours.conversation("Another thread").await;
    let secret = "the body of conversation one";
    let their_secret = "the body of another team";
    let a = ours.send(secret).await;
    let b = ours.send_in(elsewhere, "b's own body").await;
    let x = theirs.send(their_secret).await;
    let workers = app.start_publication_workers();
    let a_locator = ours.wait_stored(&[a, b]).await.remove(0);
    let x_locator = theirs.wait_stored(&[x]).await.remove(0);
    workers.stop().await;

    for (copied, whose) in [(&a_locator, secret), (&x_locator, their_secret)] {
        // B's locator replaced by the copy, its local body released as the
        // sweep would: the only way to B's body is now the copied locator.
        sqlx::query(
            "UPDATE conversation_messages SET canonical_locator = $2, body = '' WHERE id = $1",
        )
        .bind(b)
        .bind(copied)
        .execute(&app.pool)
        .await
        .unwrap();
        let page = ours.read_as_bob_in(elsewhere).await;
        let shown = in_page(&page, b);
        assert!(shown["body"].is_null(), "{copied} read as B: {shown}");
        assert!(shown["unavailable"]["reason"].is_string(), "{shown}");
        assert!(!page.to_string().contains(whose), "{page}");
        let one = ours
            .bob
            .call("get_conversation_message", json!({"message_id": b}))
            .await
            .unwrap();
        assert!(one["body"].is_null(), "{one}");
        assert!(!one.to_string().contains(whose), "{one}");
        let one = ours
            .alice
            .call("get_conversation_message", json!({"message_id": b}))
            .await
            .unwrap();
        assert!(!one.to_string().contains(whose), "nor to its sender: {one}");
    }
    // The messages the locators belong to still read as themselves.
    assert_eq!(in_page(&ours.read_as_bob().await, a)["body"], secret);
    assert_eq!(
        in_page(&theirs.read_as_bob().await, x)["body"],
        their_secret
    );
    for team in [ours.team_id, theirs.team_id] {
        app.broker().remove_team_streams(team).await.unwrap();
    }
}

// O4, O6, B1: two replicas of the bus on one database, each with its own
// broker connection and its own drain, drain the same outbox: every message
// is stored, each published once (stream entries = messages, distinct
// sequences), one set of inbox references each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_draining_one_outbox_publish_each_message_once() {
    let url = nats_url();
    let first = TestApp::builder().broker_at(&url).spawn().await;
    let second = first.replica().broker_at(&url).spawn().await;
    let t = Routed::new(&first, "jsb6").await;
    let mut sent = Vec::new();
    for i in 0..40 {
        let body = format!("message {i}");
        sent.push((t.send(&body).await, body));
    }
    let workers = [
        first.start_publication_workers(),
        second.start_publication_workers(),
    ];
    // More while both drain.
    for i in 40..60 {
        let body = format!("message {i}");
        sent.push((t.send(&body).await, body));
    }
    let ids: Vec<Uuid> = sent.iter().map(|(id, _)| *id).collect();
    let locators = t.wait_stored(&ids).await;
    for w in workers {
        w.stop().await;
    }
    let stored: Vec<(Uuid, String, String)> = sent
        .into_iter()
        .zip(locators)
        .map(|((id, body), locator)| (id, body, locator))
        .collect();
    assert_once_in_stream(&url, t.team_id, t.conversation_id, &stored).await;
    let references: Vec<i64> = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM inbox_references i WHERE i.message_id = m.id)
           FROM conversation_messages m WHERE m.conversation_id = $1",
    )
    .bind(t.conversation_id)
    .fetch_all(&first.pool)
    .await
    .unwrap();
    assert_eq!(references, vec![1; 60], "one reference per recipient, once");
    assert_eq!(
        outbox::status(&first.pool, t.team_id).await.unwrap(),
        outbox::Status::default()
    );
    first.broker().remove_team_streams(t.team_id).await.unwrap();
}

// `serve --nats-url` while the broker is down starts anyway (the bus is up
// while PostgreSQL is), reports the broker unreachable, and routes to it once
// it answers.
#[tokio::test]
async fn serve_starts_during_a_broker_outage_and_picks_the_broker_up_when_it_answers() {
    let mut nats = crate::support::nats::OwnedNats::start();
    nats.stop();
    let database_url = crate::support::postgres::fresh_database_url().await;
    let port = crate::support::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args([
            "serve",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--nats-url",
            &nats.url(),
            "--metrics-bind",
            "off",
        ])
        .env("DATABASE_URL", &database_url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let health = async |check: bool| -> Option<Value> {
        let url = format!(
            "http://127.0.0.1:{port}/health{}",
            if check { "?broker=check" } else { "" }
        );
        let response = crate::support::http_client().get(url).send().await.ok()?;
        response.json::<Value>().await.ok()
    };
    let down = eventually("serve answers /health", async || health(false).await).await;
    assert_eq!(down["database"], "ok");
    assert_eq!(down["broker"], "unreachable");
    assert_eq!(down["status"], "degraded");

    nats.restart();
    let up = eventually("the broker is picked up", async || {
        health(true).await.filter(|h| h["broker"] == "ok")
    })
    .await;
    assert_eq!(up["status"], "ok");
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "serve stops cleanly: {status}");
}
