//! What a request may cost, across the tools: every list argument is
//! refused on its raw length before any per-entry work (duplicates count),
//! a cursor at the end of the number line is an empty page rather than an
//! overflow, and the NUL refusal looks at decoded text, so code that spells
//! the escape out is stored as written.

use ai_crew_sync::store::identity::teams;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{McpClient, TestApp, spawn_app, test_actor};

/// Team `acme` with conversations on; alice (shared window) and bob.
async fn team(app: &TestApp) -> (McpClient, McpClient) {
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    (alice, bob)
}

async fn count(app: &TestApp, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

fn copies(value: &str, n: usize) -> Vec<String> {
    vec![value.to_string(); n]
}

#[tokio::test]
async fn a_list_over_its_limit_is_refused_even_when_it_repeats_one_value() {
    let app = spawn_app().await;
    let (alice, _bob) = team(&app).await;
    alice
        .call("create_task", json!({"key": "s", "title": "schema"}))
        .await
        .unwrap();
    let before = (
        count(&app, "tasks").await,
        count(&app, "notes").await,
        count(&app, "conversations").await,
        count(&app, "messages").await,
    );

    // A million copies of one valid value: a single distinct entry, but
    // not a list anyone means, and every copy would be parsed.
    let million = 1_000_000;
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "create_task",
            json!({"key": "deploy", "title": "deploy", "depends_on": copies("s", million)}),
            "depends_on holds 1000000 entries; the limit is 32",
        ),
        (
            "create_task",
            json!({"key": "deploy", "title": "deploy", "depends_on": copies("s", 33)}),
            "depends_on holds 33 entries; the limit is 32",
        ),
        (
            "set_note",
            json!({"key": "k", "value": "v", "tags": copies("ci", million)}),
            "tags holds 1000000 entries; a note has at most 16 tags",
        ),
        (
            "set_note",
            json!({"key": "k", "value": "v", "tags": copies("ci", 17)}),
            "tags holds 17 entries; a note has at most 16 tags",
        ),
        (
            "create_conversation",
            json!({"title": "t", "private": true, "invite": copies("bob", million)}),
            "invite holds 1000000 addresses",
        ),
        (
            "create_conversation",
            json!({"title": "t", "private": true, "invite": copies("bob", 200)}),
            "member limit of 200",
        ),
        (
            "wait_for_updates",
            json!({"timeout_seconds": 1, "kinds": copies("message", 6)}),
            "kinds holds 6 entries; there are 5 kinds",
        ),
        (
            "confirm_inbox_delivery",
            json!({"delivery_ids": vec![Uuid::nil(); 101]}),
            "delivery_ids holds 101 ids",
        ),
        (
            // Nine copies of content that does not even decode: the count is
            // refused first, before any base64 is read.
            "post_message",
            json!({"channel": "c", "body": "x", "attachments":
                   vec![json!({"filename": "a.txt", "content_type": "text/plain",
                               "data_base64": "not base64!"}); 9]}),
            "9 attachments given; the limit is 8",
        ),
    ];
    for (tool, args, expected) in cases {
        let refused = alice
            .call(tool, args)
            .await
            .expect_err("an over-long list is refused");
        assert_eq!(refused["error"], "invalid", "{tool}: {refused}");
        let message = refused["message"].as_str().unwrap();
        assert!(message.contains(expected), "{tool}: {message}");
    }
    assert_eq!(
        (
            count(&app, "tasks").await,
            count(&app, "notes").await,
            count(&app, "conversations").await,
            count(&app, "messages").await,
        ),
        before,
        "a refusal writes nothing"
    );

    // Within the limit, duplicates still merge.
    let task = alice
        .call(
            "create_task",
            json!({"key": "deploy", "title": "deploy", "depends_on": copies("s", 32)}),
        )
        .await
        .unwrap();
    assert_eq!(task["depends_on"], json!(["s"]));
    let note = alice
        .call(
            "set_note",
            json!({"key": "k", "value": "v", "tags": copies("CI", 16)}),
        )
        .await
        .unwrap();
    assert_eq!(note["tags"], json!(["ci"]));
    let created = alice
        .call(
            "create_conversation",
            json!({"title": "t", "private": true, "invite": copies("bob", 199)}),
        )
        .await
        .unwrap();
    let members: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_members WHERE conversation_id = $1")
            .bind(created["id"].as_str().unwrap().parse::<Uuid>().unwrap())
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(members, 2, "the owner and one invitation for bob");
}

/// A tool that panics (an overflow in a debug build) never answers: fail
/// the test instead of hanging it.
async fn answered<T>(call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(30), call)
        .await
        .expect("the server answered within 30 s")
}

#[tokio::test]
async fn a_cursor_at_i64_max_is_refused_not_an_overflow_nor_an_empty_page() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    let created = alice
        .call(
            "create_conversation",
            json!({"title": "t", "private": true, "invite": ["bob"]}),
        )
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    bob.call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": id, "body": "one", "request_id": Uuid::new_v4()}),
        )
        .await
        .unwrap();

    // Not an overflow, and not an empty page either: a cursor ahead of the
    // newest seq is refused, saying where to start (issue 38 item 4).
    let refused = bob
        .call(
            "read_conversation",
            json!({"conversation_id": id, "after_seq": i64::MAX}),
        )
        .await
        .expect_err("a cursor ahead of the newest seq");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("is ahead of the newest seq 1"),
        "{refused}"
    );
    // The start of the history is still there for a sane cursor.
    let page = bob
        .call("read_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    assert_eq!(page["messages"][0]["body"], "one");

    // Recovery (bob's agent has no session at all) answers the same way:
    // no overflow, and a refusal rather than an empty page.
    let refused = answered(bob.call(
        "recover_conversation_history",
        json!({"conversation_id": id, "after_seq": i64::MAX}),
    ))
    .await
    .expect_err("a cursor ahead of the newest seq");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("is ahead of the newest seq 1"),
        "{refused}"
    );
}

#[tokio::test]
async fn the_escape_spelled_out_is_text_and_only_a_real_nul_is_refused() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    // What a model writes about C or JSON: a backslash, then `u0000`.
    let spelled = r#"let s = "a\u0000b"; // and \0 and \\u0000"#;
    let posted = alice
        .call("post_message", json!({"to": "bob", "body": spelled}))
        .await
        .expect("the six characters are text");
    let read = bob
        // Not only_new: on a shared PostgreSQL another session's open
        // transaction may hold the unread horizon back.
        .call(
            "read_messages",
            json!({"scope": "inbox", "only_new": false}),
        )
        .await
        .unwrap();
    assert_eq!(read["messages"][0]["id"], posted["message"]["id"], "{read}");
    assert_eq!(read["messages"][0]["body"], spelled, "read back as written");
    alice
        .call(
            "set_note",
            json!({"key": "escape", "value": spelled, "tags": [r"\u0000"]}),
        )
        .await
        .unwrap();
    let note = bob
        .call("get_note", json!({"key": "escape"}))
        .await
        .unwrap();
    assert_eq!(note["value"], spelled);
    assert_eq!(note["tags"], json!([r"\u0000"]));

    let messages = count(&app, "messages").await;
    let notes = count(&app, "notes").await;
    for (tool, args) in [
        ("post_message", json!({"to": "bob", "body": "a\u{0}b"})),
        // Nested deep in a value, or in a key of it.
        (
            "post_message",
            json!({"to": "bob", "body": "x", "metadata": {"k": ["fine", "nu\u{0}l"]}}),
        ),
        (
            "post_message",
            json!({"to": "bob", "body": "x", "metadata": {"k\u{0}": 1}}),
        ),
        (
            "set_note",
            json!({"key": "k", "value": "v", "tags": ["a\u{0}"]}),
        ),
    ] {
        let refused = alice.call(tool, args).await.expect_err("a real NUL");
        assert_eq!(refused["error"], "invalid", "{refused}");
        let message = refused["message"].as_str().unwrap();
        assert!(
            message.contains("NUL character") && message.contains("cannot store"),
            "{message}"
        );
    }
    assert_eq!(count(&app, "messages").await, messages);
    assert_eq!(count(&app, "notes").await, notes);
}
