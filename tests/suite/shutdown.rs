//! Shutdown as agents see it: when the server begins to stop (SIGTERM for
//! `serve`; [`TestApp::begin_shutdown`] here), every blocked long poll gets
//! its normal answer at once with `server_restarting`, calls already in
//! flight still finish, no new connection is accepted, and the server
//! returns once it has answered everything.

use std::time::Duration;

use ai_crew_sync::config::HttpSettings;
use ai_crew_sync::store::identity::teams;
use ai_crew_sync::store::operations::webhooks::{self, NewWebhook, PrivateTargets, WebhookKind};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uuid::Uuid;

use crate::support::eventually;
use crate::support::{McpClient, TestApp, in_team, test_actor, test_authority};
use crate::write_fence::{hold_row, waiting_on};

/// The status and JSON body of the one answer on `stream`.
async fn read_answer(stream: &mut TcpStream) -> (u16, Value) {
    let mut buffer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut buffer)).await;
    assert!(
        read.is_ok(),
        "no answer: {}",
        String::from_utf8_lossy(&buffer)
    );
    let text = String::from_utf8_lossy(&buffer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A `whoami` call whose headers and first half of body have been sent; the
/// server has it in flight until the rest arrives.
async fn half_sent_call(app: &TestApp, token: &str) -> (TcpStream, String) {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                      "params": {"name": "whoami", "arguments": {}}})
    .to_string();
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n\r\n",
        app.addr,
        body.len()
    );
    let (first, rest) = body.split_at(body.len() / 2);
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(first.as_bytes()).await.unwrap();
    (stream, rest.to_string())
}

#[tokio::test]
async fn shutdown_answers_every_blocked_long_poll_and_lets_calls_in_flight_finish() {
    let mut app = TestApp::builder()
        .http(HttpSettings {
            shutdown_grace: Duration::from_secs(60),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.agent("acme", "alice").await;
    app.agent("acme", "bob").await;
    let waiter = app.mcp(&alice, Some("w1")).await;
    let asker = app.mcp(&alice, Some("w2")).await;
    let conversation_waiter = app.mcp(&alice, Some("w3")).await;

    let (mut in_flight, rest) = half_sent_call(&app, &alice).await;
    let waits = tokio::spawn(async move {
        tokio::join!(
            waiter.call("wait_for_updates", json!({"timeout_seconds": 120})),
            asker.call(
                "ask_agent",
                json!({"to": "bob", "question": "ready?", "timeout_seconds": 120})
            ),
            conversation_waiter.call(
                "wait_for_conversation_updates",
                json!({"timeout_seconds": 120})
            ),
        )
    });
    app.until_waiting(3).await;
    app.begin_shutdown();

    // Each waiter gets its tool's normal answer, at once (not after its
    // 120 s, nor after the grace, which the call in flight still holds open).
    let (wait, ask, conversation_wait) = tokio::time::timeout(Duration::from_secs(30), waits)
        .await
        .expect("the long polls are answered when shutdown begins")
        .unwrap();
    let wait = wait.expect("wait_for_updates answers, not refuses");
    assert_eq!(wait["woke"], false, "{wait}");
    assert_eq!(wait["timed_out"], false, "{wait}");
    assert_eq!(wait["events"], json!([]), "{wait}");
    assert_eq!(wait["server_restarting"], true, "{wait}");
    assert!(
        wait["suggestion"]
            .as_str()
            .unwrap()
            .contains("Call wait_for_updates again"),
        "{wait}"
    );

    let ask = ask.expect("ask_agent answers, not refuses");
    assert_eq!(ask["answered"], false, "{ask}");
    assert_eq!(ask["server_restarting"], true, "{ask}");
    let question = ask["question_message_id"].as_str().unwrap();
    assert!(
        ask["suggestion"]
            .as_str()
            .unwrap()
            .contains(&format!("resume_message_id \"{question}\"")),
        "{ask}"
    );

    let conversation_wait = conversation_wait.expect("the conversation wait answers");
    assert_eq!(conversation_wait["woke"], false, "{conversation_wait}");
    assert_eq!(conversation_wait["timed_out"], false, "{conversation_wait}");
    assert_eq!(
        conversation_wait["server_restarting"], true,
        "{conversation_wait}"
    );
    assert!(
        conversation_wait["suggestion"]
            .as_str()
            .unwrap()
            .contains("Call wait_for_conversation_updates again"),
        "{conversation_wait}"
    );

    // No new connection is taken.
    eventually("the server to stop accepting connections", async || {
        TcpStream::connect(app.addr).await.is_err()
    })
    .await;

    // The call in flight finishes: the rest of its body, then its answer.
    in_flight.write_all(rest.as_bytes()).await.unwrap();
    let (status, answer) = read_answer(&mut in_flight).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["agent"], "alice",
        "{answer}"
    );

    // With nothing left in flight the server stops, well within its grace.
    tokio::time::timeout(Duration::from_secs(20), app.served())
        .await
        .expect("serve returns once every connection has closed")
        .expect("serve ends cleanly");
}

#[tokio::test]
async fn a_wait_that_ends_while_the_server_runs_carries_no_restart_fields() {
    let app = TestApp::builder().spawn().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, Some("w1")).await;
    let quiet = client
        .call("wait_for_updates", json!({"timeout_seconds": 1}))
        .await
        .unwrap();
    assert_eq!(quiet["timed_out"], true);
    assert!(quiet.get("server_restarting").is_none(), "{quiet}");
    assert!(quiet.get("suggestion").is_none(), "{quiet}");
}

// Issue 33 item 14: a write that a replica finishes during its grace period
// still wakes a long poll on another replica. Bob waits on replica B (25 s,
// shorter than the 30 s database re-check while events flow, so only the
// write's notification wakes him before his deadline); alice's post is in
// flight on replica A when A begins to stop (held on a row lock until A
// refuses new connections), and commits during A's grace.
// A's event publisher sends it before it stops. (Breakage: the publisher
// stopping when shutdown begins, as it did, i.e. `Bus::start_until` given
// `shutdown` for its events token in `App::build`: the notification is
// never sent and bob is not woken before his deadline.)
#[tokio::test]
async fn a_write_committed_during_the_grace_wakes_a_long_poll_on_another_replica() {
    let mut a = TestApp::builder()
        .http(HttpSettings {
            shutdown_grace: Duration::from_secs(60),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    let b = a.replica().spawn().await;
    a.team("acme").await;
    let alice = a.mcp(&a.agent("acme", "alice").await, None).await;
    let bob = McpClient::connect(&b.mcp_url(), &a.agent("acme", "bob").await, Some("web"))
        .await
        .unwrap();
    alice
        .call("create_channel", json!({"name": "web"}))
        .await
        .unwrap();
    let waiting = tokio::spawn(async move {
        bob.call("wait_for_updates", json!({"timeout_seconds": 25}))
            .await
            .unwrap()
    });
    // Bob's wait has subscribed to replica B's events: from here on the
    // post's notification wakes it, whether or not its first look at the
    // database has run yet.
    b.until_waiting(1).await;

    // Alice's post is in flight on A, held in the database (her agent row,
    // which the message's sender key needs) until A has begun to stop.
    let alice_id: Uuid = sqlx::query_scalar("SELECT id FROM agents WHERE name = 'alice'")
        .fetch_one(&a.pool)
        .await
        .unwrap();
    let held = hold_row(
        &a.pool,
        "SELECT 1 FROM agents WHERE id = $1 FOR UPDATE",
        alice_id,
    )
    .await;
    let posting = tokio::spawn(async move {
        alice
            .call(
                "post_message",
                json!({"channel": "web", "body": "posted during the grace"}),
            )
            .await
    });
    eventually("alice's post waits on her row", async || {
        waiting_on(&a.pool, false).await >= 1
    })
    .await;
    a.begin_shutdown();
    eventually("replica A stops accepting", async || {
        TcpStream::connect(a.addr).await.is_err()
    })
    .await;
    held.rollback().await.unwrap();
    let posted = posting.await.unwrap().expect("the post in flight finishes");
    assert_eq!(
        posted["message"]["body"], "posted during the grace",
        "{posted}"
    );

    let woke = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("bob is woken by the post, not by his deadline")
        .unwrap();
    assert_eq!(woke["woke"], true, "{woke}");
    assert_eq!(
        woke["events"][0]["preview"], "posted during the grace",
        "{woke}"
    );
    assert_eq!(woke["events"][0]["by"], "alice", "{woke}");
    tokio::time::timeout(Duration::from_secs(20), a.served())
        .await
        .expect("A stops once its last call is answered")
        .expect("serve ends cleanly");
}

// Issue 33 item 14: `serve` returns only after its workers have stopped. The
// webhook dispatcher is in the middle of a delivery (to a receiver that
// takes the request and never answers) when shutdown begins; when `serve`
// returns, the dispatcher has finished that pass and recorded the attempt
// (its 3 s request timeout), instead of leaving the row `delivering` for a
// process about to exit. (Breakage: `App::serve` not waiting for its
// tasks: it returns at once, the row still `delivering`.)
#[tokio::test]
async fn serve_returns_after_its_workers_have_recorded_what_they_were_doing() {
    let mut app = TestApp::builder()
        .http(HttpSettings {
            shutdown_grace: Duration::from_secs(60),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    alice
        .call("create_channel", json!({"name": "general"}))
        .await
        .unwrap();
    // A receiver that reads the request and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let (received_tx, mut received) = tokio::sync::mpsc::unbounded_channel::<()>();
    let receiver = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = silent.accept().await {
            let mut first = [0u8; 1];
            if socket.read(&mut first).await.unwrap_or(0) > 0 {
                let _ = received_tx.send(());
            }
            held.push(socket);
        }
    });
    webhooks::add(
        &app.pool,
        &in_team("acme"),
        NewWebhook {
            url: format!("http://127.0.0.1:{port}/hook"),
            kind: WebhookKind::Generic,
            events: vec!["message".into()],
            channels: vec![],
            allow_private: Some(
                PrivateTargets::grant(&test_authority())
                    .expect("the local operator allows private"),
            ),
        },
    )
    .await
    .unwrap();
    alice
        .call(
            "post_message",
            json!({"channel": "general", "body": "to a receiver that never answers"}),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), received.recv())
        .await
        .expect("the dispatcher sends the delivery")
        .unwrap();

    app.begin_shutdown();
    tokio::time::timeout(Duration::from_secs(30), app.served())
        .await
        .expect("serve returns within its grace")
        .expect("serve ends cleanly");
    let (state, attempts, error): (String, i32, Option<String>) =
        sqlx::query_as("SELECT state, attempts, last_error FROM webhook_deliveries")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_ne!(state, "delivering", "the attempt in flight was recorded");
    assert_eq!(attempts, 1);
    assert!(error.is_some(), "its outcome is recorded");
    receiver.abort();
}
