//! Shutdown as agents see it: when the server begins to stop (SIGTERM for
//! `serve`; [`TestApp::begin_shutdown`] here), every blocked long poll gets
//! its normal answer at once with `server_restarting`, calls already in
//! flight still finish, no new connection is accepted, and the server
//! returns once it has answered everything.

use std::time::Duration;

use ai_crew_sync::config::HttpSettings;
use ai_crew_sync::store::teams;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{TestApp, spawn_app_with, test_actor};

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
    let mut app = spawn_app_with(HttpSettings {
        shutdown_grace: Duration::from_secs(60),
        ..HttpSettings::default()
    })
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
    // Let the three calls reach the server and block.
    tokio::time::sleep(Duration::from_millis(1500)).await;
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(app.addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server still accepts connections after shutdown began"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

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
    let app = spawn_app_with(HttpSettings::default()).await;
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
