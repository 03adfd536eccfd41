//! `pending_for_me`'s lists as a window reads them: its unread direct
//! messages (counted whole, the oldest five previewed, a long body cut at
//! 280 characters), the questions asked of it, its leases about to lapse,
//! and the announcements since a time it gives.

use serde_json::{Value, json};

use crate::support::spawn_app;

fn previews(list: &Value) -> Vec<&str> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|m| m["preview"].as_str().expect("a preview"))
        .collect()
}

#[tokio::test]
async fn pending_for_me_lists_unread_dms_questions_lapsing_leases_and_announcements() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("a1")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("b1")).await;
    let since = (chrono::Utc::now() - chrono::Duration::minutes(1)).to_rfc3339();

    // A long first DM (cut by characters, not bytes), then six short ones.
    let long = "é".repeat(300);
    let mut sent = vec![long.clone()];
    sent.extend((1..7).map(|i| format!("dm {i}")));
    for body in &sent {
        bob.call("post_message", json!({"to": "alice/a1", "body": body}))
            .await
            .unwrap();
    }
    // A question nobody answers (it is a direct message too).
    let asked = bob
        .call(
            "ask_agent",
            json!({"to": "alice", "question": "which branch?", "timeout_seconds": 1}),
        )
        .await
        .unwrap();
    assert_eq!(asked["answered"], false, "{asked}");
    // A claim of alice's window whose lease lapses within the default 300 s,
    // and one of bob's (not hers).
    for (who, key) in [(&alice, "ship"), (&bob, "other")] {
        who.call(
            "create_task",
            json!({"key": key, "title": format!("do {key}")}),
        )
        .await
        .unwrap();
        who.call("claim_task", json!({"key": key, "lease_seconds": 60}))
            .await
            .unwrap();
    }
    // An announcement and a plain channel message.
    bob.call("create_channel", json!({"name": "ops"}))
        .await
        .unwrap();
    bob.call(
        "post_message",
        json!({"channel": "ops", "body": "freeze at 5", "announce": true}),
    )
    .await
    .unwrap();
    bob.call("post_message", json!({"channel": "ops", "body": "chatter"}))
        .await
        .unwrap();

    let pending = alice
        .call("pending_for_me", json!({"since": since}))
        .await
        .unwrap();
    assert_eq!(
        pending["unread_direct_messages"],
        json!({"count": 8, "at_least": false}),
        "{pending}"
    );
    let direct = &pending["direct_messages"];
    let cut: String = long.chars().take(280).collect();
    assert_eq!(
        previews(direct),
        vec![cut.as_str(), "dm 1", "dm 2", "dm 3", "dm 4"],
        "the oldest five"
    );
    assert_eq!(direct[0]["truncated"], true);
    assert_eq!(direct[1]["truncated"], false);
    assert_eq!(direct[1]["from"], "bob/b1");
    assert!(direct[1]["channel"].is_null(), "{direct}");
    let questions = &pending["open_questions"];
    assert_eq!(previews(questions), vec!["which branch?"], "{pending}");
    assert_eq!(questions[0]["from"], "bob/b1");
    let expiring = pending["expiring_tasks"].as_array().unwrap();
    assert_eq!(expiring.len(), 1, "{pending}");
    assert_eq!(expiring[0]["key"], "ship");
    assert_eq!(expiring[0]["title"], "do ship");
    assert!(
        chrono::DateTime::parse_from_rfc3339(expiring[0]["lease_expires_at"].as_str().unwrap())
            .is_ok()
    );
    let announcements = &pending["announcements"];
    assert_eq!(previews(announcements), vec!["freeze at 5"], "{pending}");
    assert_eq!(announcements[0]["channel"], "ops");

    // Without `since`, no announcements; a short lease window leaves out
    // the claim (its lease lapses in about 60 s).
    let pending = alice
        .call("pending_for_me", json!({"lease_within_seconds": 10}))
        .await
        .unwrap();
    assert_eq!(pending["announcements"], json!([]));
    assert_eq!(pending["expiring_tasks"], json!([]));
    assert_eq!(pending["unread_direct_messages"]["count"], 8);
}
