//! Channels and direct messages between agents and windows, per-window
//! cursors, search, and the limits of post_message.

use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, spawn_app};

pub(crate) fn bodies(read: &Value) -> Vec<String> {
    read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_string())
        .collect()
}

async fn read(client: &McpClient, args: Value) -> Value {
    client
        .call("read_messages", args)
        .await
        .expect("read_messages")
}

async fn two_agents(app: &TestApp) -> (String, String) {
    app.team("acme").await;
    (
        app.agent("acme", "alice").await,
        app.agent("acme", "bob").await,
    )
}

#[tokio::test]
async fn agents_exchange_dms_and_channel_messages_and_another_team_sees_nothing() {
    let app = spawn_app().await;
    let (alice_token, bob_token) = two_agents(&app).await;
    app.team("other").await;
    let eve_token = app.agent("other", "eve").await;
    let alice = app.mcp(&alice_token, None).await;
    let bob = app.mcp(&bob_token, None).await;
    let eve = app.mcp(&eve_token, None).await;

    let posted = alice
        .call(
            "post_message",
            json!({"channel": "#Backend", "body": "deploy at 5"}),
        )
        .await
        .unwrap();
    assert_eq!(posted["delivered_to"], json!(["#backend"]));
    assert_eq!(posted["channel_created"], true);
    let dm = alice
        .call(
            "post_message",
            json!({"to": "bob", "body": "can you review #42?"}),
        )
        .await
        .unwrap();
    assert_eq!(dm["delivered_to"], json!(["bob"]));

    let got = read(&bob, json!({})).await;
    assert_eq!(bodies(&got), ["deploy at 5", "can you review #42?"]);
    assert_eq!(got["messages"][0]["channel"], "backend");
    assert_eq!(got["messages"][1]["from"], "alice");
    assert_eq!(got["messages"][1]["to"], "bob");
    assert!(
        bodies(&read(&bob, json!({})).await).is_empty(),
        "the cursor moved"
    );

    bob.call(
        "post_message",
        json!({"to": "alice", "body": "on it", "reply_to": dm["message"]["id"]}),
    )
    .await
    .unwrap();
    let inbox = read(&alice, json!({"scope": "inbox"})).await;
    assert_eq!(bodies(&inbox), ["on it"]);
    assert_eq!(inbox["messages"][0]["reply_to"], dm["message"]["id"]);

    // Another team: nothing to read, nothing to find, nobody to message.
    assert!(bodies(&read(&eve, json!({})).await).is_empty());
    assert!(
        eve.call("search_messages", json!({"query": "deploy"}))
            .await
            .unwrap()["messages"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(
        eve.call("list_channels", json!({})).await.unwrap()["channels"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let refused = eve
        .call("post_message", json!({"to": "bob", "body": "hi"}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "not_found");
    let refused = eve
        .call(
            "post_message",
            json!({"channel": "x", "body": "hi", "reply_to": dm["message"]["id"]}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused["error"], "not_found",
        "a foreign message id is not found"
    );
}

#[tokio::test]
async fn a_dm_to_one_window_reaches_only_that_window_and_cursors_are_per_window() {
    let app = spawn_app().await;
    let (alice_token, bob_token) = two_agents(&app).await;
    let alice = app.mcp(&alice_token, None).await;
    // Sent before bob's window w2 ever connects: it waits there.
    alice
        .call(
            "post_message",
            json!({"to": "bob/w2", "body": "for w2 only"}),
        )
        .await
        .unwrap();
    alice
        .call(
            "post_message",
            json!({"to": "bob", "body": "for every bob window"}),
        )
        .await
        .unwrap();
    alice
        .call(
            "post_message",
            json!({"channel": "general", "body": "hello all"}),
        )
        .await
        .unwrap();

    let w1 = app.mcp(&bob_token, Some("w1")).await;
    let w2 = app.mcp(&bob_token, Some("w2")).await;
    assert_eq!(
        bodies(&read(&w1, json!({"scope": "inbox"})).await),
        ["for every bob window"]
    );
    // A DM to the agent is read once: w1 read it, so it is not new for w2.
    assert_eq!(
        bodies(&read(&w2, json!({"scope": "inbox"})).await),
        ["for w2 only"]
    );
    let all_sessions = read(
        &w1,
        json!({"scope": "inbox", "only_new": false, "all_sessions": true}),
    )
    .await;
    assert_eq!(
        bodies(&all_sessions),
        ["for w2 only", "for every bob window"]
    );

    // Each window has its own cursor per scope.
    assert_eq!(
        bodies(&read(&w1, json!({"scope": "general"})).await),
        ["hello all"]
    );
    assert!(bodies(&read(&w1, json!({"scope": "general"})).await).is_empty());
    assert_eq!(
        bodies(&read(&w2, json!({"scope": "general"})).await),
        ["hello all"]
    );
    assert_eq!(
        bodies(&read(&w2, json!({"scope": "general", "only_new": false})).await),
        ["hello all"]
    );

    // A sibling window's DMs are not found by search either.
    let found = w1
        .call("search_messages", json!({"query": "w2"}))
        .await
        .unwrap();
    assert!(found["messages"].as_array().unwrap().is_empty(), "{found}");
    let found = w2
        .call("search_messages", json!({"query": "\"w2 only\""}))
        .await
        .unwrap();
    assert_eq!(found["messages"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn metadata_default_channel_announcements_and_channels() {
    let app = spawn_app().await;
    let (alice_token, _) = two_agents(&app).await;
    let alice = app.mcp(&alice_token, Some("web-app")).await;

    let posted = alice
        .call(
            "post_message",
            json!({"body": "no channel given", "metadata": "{\"pr\": 7}"}),
        )
        .await
        .unwrap();
    assert_eq!(
        posted["delivered_to"],
        json!(["#web-app"]),
        "the window's default channel"
    );
    assert_eq!(
        posted["message"]["metadata"],
        json!({"pr": 7}),
        "a string holding an object is stored as the object"
    );

    let created = alice
        .call(
            "create_channel",
            json!({"name": "web-app", "topic": "the web app"}),
        )
        .await
        .unwrap();
    assert_eq!(created["created"], false, "create is idempotent");
    let list = alice.call("list_channels", json!({})).await.unwrap()["channels"].clone();
    assert_eq!(list[0]["name"], "web-app");
    assert_eq!(list[0]["topic"], "the web app");
    assert_eq!(list[0]["messages"], 1);

    let shared = app.mcp(&alice_token, None).await;
    // The project label wins over the window name.
    alice
        .call("heartbeat", json!({"project": "Platform"}))
        .await
        .unwrap();
    let posted = alice
        .call("post_message", json!({"body": "to the project"}))
        .await
        .unwrap();
    assert_eq!(posted["delivered_to"], json!(["#platform"]));
    let refused = shared
        .call("post_message", json!({"body": "where to?"}))
        .await
        .unwrap_err();
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("default channel"),
        "{refused}"
    );
}

#[tokio::test]
async fn every_messaging_limit_is_refused_with_its_number_and_leaves_nothing() {
    let app = spawn_app().await;
    let (alice_token, _) = two_agents(&app).await;
    let alice = app.mcp(&alice_token, None).await;
    let cases = [
        (
            json!({"channel": "c", "body": "x".repeat(1024 * 1024 + 1)}),
            "1048576",
        ),
        (json!({"channel": "c", "body": "   "}), "empty"),
        (json!({"channel": "c", "body": "a\u{0}b"}), "NUL"),
        (
            json!({"channel": "c", "body": "x", "metadata": {"k": "v".repeat(16 * 1024)}}),
            "16384",
        ),
        (
            json!({"channel": "c", "body": "x", "metadata": [1, 2]}),
            "JSON object",
        ),
        (
            json!({"channel": "c", "to": "bob", "body": "x"}),
            "not both",
        ),
        (
            json!({"to": "bob", "body": "x", "announce": true}),
            "channel messages only",
        ),
        (json!({"channel": "bad name!", "body": "x"}), "1-64"),
        (json!({"to": "bob/a/b", "body": "x"}), "label"),
        (json!({"to": "nobody", "body": "x"}), "list_agents"),
    ];
    for (args, needle) in cases {
        let refused = alice.call("post_message", args.clone()).await.unwrap_err();
        assert!(
            refused["message"].as_str().unwrap().contains(needle),
            "{args}: {refused}"
        );
    }
    let refused = alice
        .call(
            "create_channel",
            json!({"name": "c", "topic": "t".repeat(257)}),
        )
        .await
        .unwrap_err();
    assert!(
        refused["message"].as_str().unwrap().contains("256"),
        "{refused}"
    );
    let refused = alice
        .call("read_messages", json!({"limit": 201}))
        .await
        .unwrap_err();
    assert!(
        refused["message"].as_str().unwrap().contains("200"),
        "{refused}"
    );
    let refused = alice
        .call("search_messages", json!({"query": "q".repeat(257)}))
        .await
        .unwrap_err();
    assert!(
        refused["message"].as_str().unwrap().contains("256"),
        "{refused}"
    );

    let (messages, channels): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM messages), (SELECT count(*) FROM channels)")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        (messages, channels),
        (0, 0),
        "refused calls left nothing behind"
    );
}

// A window labelled `inbox` (or `all`) has no default channel: posting without
// a channel is the ordinary "no default channel" refusal, not a refusal of a
// channel name the caller never gave, and no channel is created.
#[tokio::test]
async fn a_window_named_like_a_reserved_scope_has_no_default_channel() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    for window in ["inbox", "all"] {
        let client = app.mcp(&token, Some(window)).await;
        let refused = client
            .call("post_message", json!({"body": "hello"}))
            .await
            .expect_err("posted without a channel");
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(message.contains("no default channel"), "{refused}");
        assert!(!message.contains("cannot be a channel name"), "{refused}");
    }
    let channels: i64 = sqlx::query_scalar("SELECT count(*) FROM channels")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(channels, 0);
}
