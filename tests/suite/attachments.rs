//! Attachments on messages and tasks: limits, visibility and the team quota.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::support::{spawn_app, test_actor};

fn file(name: &str, bytes: &[u8]) -> Value {
    json!({"filename": name, "content_type": "application/octet-stream", "data_base64": STANDARD.encode(bytes)})
}

#[tokio::test]
async fn files_travel_with_messages_and_tasks_and_follow_their_visibility() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;

    let log: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let posted = alice
        .call(
            "post_message",
            json!({"to": "bob", "body": "the trace", "attachments": [file("trace.bin", &log)]}),
        )
        .await
        .unwrap();
    let id = posted["message"]["attachments"][0]["id"].clone();
    assert_eq!(posted["message"]["attachments"][0]["size_bytes"], 200_000);

    let inbox = bob
        .call("read_messages", json!({"scope": "inbox"}))
        .await
        .unwrap();
    assert_eq!(
        inbox["messages"][0]["attachments"][0]["filename"],
        "trace.bin"
    );
    let got = bob.call("get_attachment", json!({"id": id})).await.unwrap();
    assert_eq!(
        STANDARD
            .decode(got["data_base64"].as_str().unwrap())
            .unwrap(),
        log,
        "the same bytes come back"
    );
    assert_eq!(got["uploaded_by"], "alice");
    let hidden = carol
        .call("get_attachment", json!({"id": id}))
        .await
        .unwrap_err();
    assert_eq!(
        hidden["error"], "not_found",
        "a DM's file is only for its parties"
    );

    alice
        .call("create_task", json!({"key": "t1", "title": "Look at this"}))
        .await
        .unwrap();
    let attached = alice.call("attach_file", json!({"task": "t1", "filename": "notes.txt", "content_type": "text/plain", "data_base64": STANDARD.encode("hi")})).await.unwrap();
    let got = carol
        .call("get_attachment", json!({"id": attached["id"]}))
        .await
        .unwrap();
    assert_eq!(got["task"], "t1", "a task's files are team-wide");
}

#[tokio::test]
async fn attachment_limits_are_refused_with_their_numbers_and_leave_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    alice
        .call("create_task", json!({"key": "t1", "title": "T"}))
        .await
        .unwrap();

    let nine: Vec<Value> = (0..9).map(|i| file(&format!("f{i}"), b"x")).collect();
    let cases = [
        (
            json!({"channel": "c", "body": "b", "attachments": nine}),
            "limit is 8",
        ),
        (
            json!({"channel": "c", "body": "b", "attachments": [file("big", &vec![0u8; 256 * 1024 + 1])]}),
            "262144",
        ),
        (
            json!({"channel": "c", "body": "b", "attachments": [{"filename": "a", "content_type": "text/plain", "data_base64": "%%%"}]}),
            "base64",
        ),
        (
            json!({"channel": "c", "body": "b", "attachments": [file("../etc/passwd", b"x")]}),
            "slashes",
        ),
        (
            json!({"channel": "c", "body": "b", "attachments": [{"filename": "a", "content_type": "nonsense", "data_base64": ""}]}),
            "media type",
        ),
    ];
    for (args, needle) in cases {
        let refused = alice.call("post_message", args.clone()).await.unwrap_err();
        assert!(
            refused["message"].as_str().unwrap().contains(needle),
            "{needle}: {refused}"
        );
    }
    for i in 0..8 {
        alice.call("attach_file", json!({"task": "t1", "filename": format!("f{i}"), "content_type": "text/plain", "data_base64": ""})).await.unwrap();
    }
    let refused = alice.call("attach_file", json!({"task": "t1", "filename": "f9", "content_type": "text/plain", "data_base64": ""})).await.unwrap_err();
    assert!(
        refused["message"].as_str().unwrap().contains("limit is 8"),
        "{refused}"
    );
    let (messages, attachments): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM attachments)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        (messages, attachments),
        (0, 8),
        "refused posts stored nothing"
    );
}

#[tokio::test]
async fn concurrent_uploads_cannot_both_take_the_last_of_the_quota() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    ai_crew_sync::store::messaging::attachments::quota(
        &app.pool,
        "acme",
        Some(300 * 1024),
        &test_actor(),
    )
    .await
    .unwrap();
    let blob = vec![7u8; 200 * 1024];
    let mut uploads = Vec::new();
    for i in 0..2 {
        let client = app.mcp(&token, Some(&format!("w{i}"))).await;
        let args = json!({"channel": "c", "body": "b", "attachments": [file("blob", &blob)]});
        uploads.push(tokio::spawn(async move {
            client.call("post_message", args).await
        }));
    }
    let mut outcomes = Vec::new();
    for upload in uploads {
        outcomes.push(upload.await.unwrap());
    }
    let accepted = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(accepted, 1, "{outcomes:?}");
    let refused = outcomes.into_iter().find_map(Result::err).unwrap();
    assert!(
        refused["message"].as_str().unwrap().contains("team quota"),
        "{refused}"
    );
    let quota =
        ai_crew_sync::store::messaging::attachments::quota(&app.pool, "acme", None, &test_actor())
            .await
            .unwrap();
    assert_eq!(quota.attachment_bytes_used, 200 * 1024);
}
