//! A window's own posts are never handed back to it as new, and a read past
//! a position moves past them: its cursor (and `read_up_to`) passes what the
//! window wrote itself, so a window that mostly posts, or writes to itself,
//! does not walk its own posts again on every read. A direct message a
//! window sends its own agent as a whole stays new for the agent's other
//! windows.

use serde_json::{Value, json};

use crate::support::{McpClient, spawn_app};

/// Post, and the position it took: the newest of the scope's latest page
/// right after (each test posts from one task at a time).
async fn post(client: &McpClient, args: Value) -> i64 {
    let scope = match args["channel"].as_str() {
        Some(channel) => channel.to_string(),
        None => "inbox".to_string(),
    };
    client.call("post_message", args).await.unwrap();
    let latest = read(
        client,
        json!({"scope": scope, "only_new": false, "limit": 1}),
    )
    .await;
    latest["read_up_to"]
        .as_i64()
        .unwrap_or_else(|| panic!("read_up_to in {latest}"))
}

async fn read(client: &McpClient, args: Value) -> Value {
    client.call("read_messages", args).await.unwrap()
}

fn bodies(page: &Value) -> Vec<&str> {
    page["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("messages in {page}"))
        .iter()
        .map(|m| m["body"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn a_read_moves_past_the_windows_own_posts_without_returning_them() {
    let app = spawn_app().await;
    app.team("own1").await;
    let alice = app.mcp(&app.agent("own1", "alice").await, Some("w1")).await;
    let bob = app.mcp(&app.agent("own1", "bob").await, Some("w1")).await;

    let mut mine = 0;
    for body in ["a1", "a2", "a3"] {
        mine = post(&alice, json!({"channel": "dev", "body": body})).await;
    }
    let page = read(&alice, json!({"scope": "dev"})).await;
    assert_eq!(bodies(&page), Vec::<&str>::new(), "{page}");
    assert_eq!(page["read_up_to"], mine, "past its own posts: {page}");
    assert!(
        page["note"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("after position {mine}")),
        "{page}"
    );

    // The same from an explicit position, which moves no cursor.
    let from_zero = read(&alice, json!({"scope": "dev", "after": 0})).await;
    assert_eq!(bodies(&from_zero), Vec::<&str>::new(), "{from_zero}");
    assert_eq!(from_zero["read_up_to"], mine, "{from_zero}");

    // Another window gets them all; alice gets only what others wrote.
    let theirs = read(&bob, json!({"scope": "dev"})).await;
    assert_eq!(bodies(&theirs), ["a1", "a2", "a3"], "{theirs}");
    let b1 = post(&bob, json!({"channel": "dev", "body": "b1"})).await;
    post(&alice, json!({"channel": "dev", "body": "a4"})).await;
    let page = read(&alice, json!({"scope": "dev"})).await;
    assert_eq!(bodies(&page), ["b1"], "{page}");
    assert!(page["read_up_to"].as_i64().unwrap() > b1, "past a4: {page}");
    let again = read(&alice, json!({"scope": "dev"})).await;
    assert_eq!(bodies(&again), Vec::<&str>::new(), "{again}");
    assert_eq!(again["read_up_to"], page["read_up_to"], "{again}");
}

#[tokio::test]
async fn own_posts_count_toward_a_full_page() {
    let app = spawn_app().await;
    app.team("own2").await;
    let alice = app.mcp(&app.agent("own2", "alice").await, Some("w1")).await;
    let bob = app.mcp(&app.agent("own2", "bob").await, Some("w1")).await;
    let a1 = post(&alice, json!({"channel": "dev", "body": "a1"})).await;
    let a2 = post(&alice, json!({"channel": "dev", "body": "a2"})).await;
    assert!(a2 > a1);
    post(&alice, json!({"channel": "dev", "body": "a3"})).await;
    let b1 = post(&bob, json!({"channel": "dev", "body": "b1"})).await;

    let first = read(&alice, json!({"scope": "dev", "limit": 2})).await;
    assert_eq!(bodies(&first), Vec::<&str>::new(), "{first}");
    assert_eq!(first["more"], true, "a full page of its own posts: {first}");
    assert_eq!(first["read_up_to"], a2, "{first}");
    let second = read(&alice, json!({"scope": "dev", "limit": 2})).await;
    assert_eq!(bodies(&second), ["b1"], "{second}");
    assert_eq!(second["more"], true, "{second}");
    assert_eq!(second["read_up_to"], b1, "{second}");
    let third = read(&alice, json!({"scope": "dev", "limit": 2})).await;
    assert_eq!(bodies(&third), Vec::<&str>::new(), "{third}");
    assert_eq!(third["more"], false, "{third}");
}

#[tokio::test]
async fn a_direct_message_to_itself_is_passed_by_its_window_and_new_for_the_others() {
    let app = spawn_app().await;
    app.team("own3").await;
    let token = app.agent("own3", "alice").await;
    let w1 = app.mcp(&token, Some("w1")).await;
    let w2 = app.mcp(&token, Some("w2")).await;

    let to_window = post(&w1, json!({"to": "alice/w1", "body": "note to self"})).await;
    let to_agent = post(&w1, json!({"to": "alice", "body": "to every window"})).await;
    assert!(to_agent > to_window);
    let own = read(&w1, json!({"scope": "inbox"})).await;
    assert_eq!(bodies(&own), Vec::<&str>::new(), "{own}");
    assert_eq!(own["read_up_to"], to_agent, "{own}");

    // The agent's read-once cursor did not move for w1's own DM.
    let other = read(&w2, json!({"scope": "inbox"})).await;
    assert_eq!(bodies(&other), ["to every window"], "{other}");
}
