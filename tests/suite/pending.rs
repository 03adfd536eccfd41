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

/// The lists a Stop hook reads: the conversations owing this window's
/// acknowledgement and the oldest such messages, what the window holds
/// (claimed tasks, locks, path reservations: counted, the first listed),
/// and the direct messages asking its agent for an acknowledgement. All
/// come from one statement; each is checked against what was written, and
/// another window of the same agent sees none of the window's own.
#[tokio::test]
async fn pending_for_me_lists_owed_conversations_holdings_and_owed_acks() {
    let app = spawn_app().await;
    app.conversations_team("acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let alice = app.mcp(&alice_token, Some("a1")).await;
    let alice_other = app.mcp(&alice_token, Some("a2")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("b1")).await;

    // Nothing yet: every list empty, every count 0.
    let empty = alice.call("pending_for_me", json!({})).await.unwrap();
    assert_eq!(empty["conversations"], json!([]), "{empty}");
    assert_eq!(empty["awaiting_ack"], json!([]), "{empty}");
    for kind in ["claimed_tasks", "locks", "reservations"] {
        assert_eq!(
            empty["holdings"][kind],
            json!({"count": 0, "at_least": false, "items": []}),
            "{empty}"
        );
    }
    assert_eq!(
        empty["owed_acks"],
        json!({"count": 0, "at_least": false, "overdue": 0, "items": []})
    );

    // Bob opens a conversation with alice's window and sends two messages.
    let conv = bob
        .call(
            "create_conversation",
            json!({"title": "Release", "private": true, "invite": ["alice/a1"]}),
        )
        .await
        .unwrap();
    let conv_id = conv["id"].as_str().unwrap().to_string();
    alice
        .call("join_conversation", json!({"conversation_id": conv_id}))
        .await
        .unwrap();
    for body in ["first: freeze", "second: tag it"] {
        bob.call(
            "send_conversation_message",
            json!({"conversation_id": conv_id, "body": body,
                   "request_id": uuid::Uuid::new_v4().to_string()}),
        )
        .await
        .unwrap();
    }
    // Alice's window holds a task, a lock and a reservation.
    alice
        .call("create_task", json!({"key": "tag", "title": "tag 1.2"}))
        .await
        .unwrap();
    alice
        .call("claim_task", json!({"key": "tag", "lease_seconds": 600}))
        .await
        .unwrap();
    alice
        .call(
            "acquire_lock",
            json!({"name": "deploy:prod", "purpose": "1.2"}),
        )
        .await
        .unwrap();
    alice
        .call(
            "reserve_paths",
            json!({"paths": ["src/**"], "exclusive": true}),
        )
        .await
        .unwrap();
    // And bob asks alice (the agent) to acknowledge a direct message.
    let asked = bob
        .call(
            "post_message",
            json!({"to": "alice", "body": "ack the freeze", "ack_required": true,
                   "ack_within_seconds": 600}),
        )
        .await
        .unwrap();

    let pending = alice.call("pending_for_me", json!({})).await.unwrap();
    let owed = &pending["conversations"];
    assert_eq!(owed.as_array().unwrap().len(), 1, "{pending}");
    assert_eq!(owed[0]["conversation_id"], json!(conv_id));
    assert_eq!(owed[0]["title"], "Release");
    assert_eq!(owed[0]["unacknowledged"], 2);
    assert_eq!(owed[0]["first_unacknowledged_seq"], 1);
    assert_eq!(owed[0]["latest_seq"], 2);
    let awaiting = pending["awaiting_ack"].as_array().unwrap();
    let shown: Vec<_> = awaiting
        .iter()
        .map(|m| (m["seq"].as_i64().unwrap(), m["preview"].as_str().unwrap()))
        .collect();
    assert_eq!(shown, vec![(1, "first: freeze"), (2, "second: tag it")]);
    assert_eq!(awaiting[0]["from"], "bob/b1");
    assert_eq!(awaiting[0]["title"], "Release");
    assert_eq!(awaiting[0]["presented"], false);

    let holdings = &pending["holdings"];
    assert_eq!(holdings["claimed_tasks"]["count"], 1, "{holdings}");
    assert_eq!(holdings["claimed_tasks"]["items"][0]["key"], "tag");
    assert_eq!(holdings["claimed_tasks"]["items"][0]["lapsed"], false);
    assert_eq!(holdings["locks"]["count"], 1, "{holdings}");
    assert_eq!(holdings["locks"]["items"][0]["name"], "deploy:prod");
    assert_eq!(holdings["reservations"]["count"], 1, "{holdings}");
    assert_eq!(holdings["reservations"]["items"][0]["pattern"], "src/**");
    assert_eq!(holdings["reservations"]["items"][0]["exclusive"], true);

    let acks = &pending["owed_acks"];
    assert_eq!(acks["count"], 1, "{acks}");
    assert_eq!(acks["overdue"], 0);
    assert_eq!(
        acks["items"][0]["message_id"], asked["message"]["id"],
        "{acks} {asked}"
    );
    assert_eq!(acks["items"][0]["kind"], "dm");
    assert_eq!(acks["items"][0]["from"], "bob/b1");

    // The agent's other window owes the same DM acknowledgement (a debt of
    // the agent) but holds nothing and has no seat.
    let other = alice_other.call("pending_for_me", json!({})).await.unwrap();
    assert_eq!(other["conversations"], json!([]), "{other}");
    assert_eq!(other["awaiting_ack"], json!([]));
    assert_eq!(other["holdings"]["claimed_tasks"]["count"], 0);
    assert_eq!(other["holdings"]["locks"]["count"], 0);
    assert_eq!(other["holdings"]["reservations"]["count"], 0);
    assert_eq!(other["owed_acks"]["count"], 1, "{other}");
}
