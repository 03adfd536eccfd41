//! whoami's pending work and team_digest.

use serde_json::json;

use crate::support::spawn_app;

#[tokio::test]
async fn whoami_reports_labels_default_channel_unread_dms_and_claimed_tasks() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("w1")).await;

    let me = bob.call("whoami", json!({})).await.unwrap();
    assert_eq!(me["unread_direct_messages"], 0);
    assert_eq!(me["open_claimed_tasks"], 0);
    assert_eq!(
        me["default_channel"], "w1",
        "the window name until a project label is set"
    );

    bob.call("heartbeat", json!({"project": "Web", "role": "reviewer"}))
        .await
        .unwrap();
    alice
        .call("post_message", json!({"to": "bob", "body": "one"}))
        .await
        .unwrap();
    alice
        .call("post_message", json!({"to": "bob/w1", "body": "two"}))
        .await
        .unwrap();
    alice
        .call(
            "post_message",
            json!({"to": "bob/w2", "body": "not for w1"}),
        )
        .await
        .unwrap();
    alice
        .call(
            "create_task",
            json!({"key": "fix-login", "title": "Fix login"}),
        )
        .await
        .unwrap();
    bob.call("claim_task", json!({"key": "fix-login"}))
        .await
        .unwrap();

    let me = bob.call("whoami", json!({})).await.unwrap();
    assert_eq!(me["project"], "Web");
    assert_eq!(me["role"], "reviewer");
    assert_eq!(me["default_channel"], "web");
    assert_eq!(me["unread_direct_messages"], 2);
    assert_eq!(me["open_claimed_tasks"], 1);

    bob.call("read_messages", json!({"scope": "inbox"}))
        .await
        .unwrap();
    let me = bob.call("whoami", json!({})).await.unwrap();
    assert_eq!(
        me["unread_direct_messages"], 0,
        "reading the inbox clears the count"
    );
}

#[tokio::test]
async fn the_digest_focuses_on_the_window_channel_keeps_announcements_and_never_shows_dms() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("web")).await;

    for i in 0..5 {
        alice
            .call(
                "post_message",
                json!({"channel": "web", "body": format!("web news {i}")}),
            )
            .await
            .unwrap();
    }
    alice
        .call(
            "post_message",
            json!({"channel": "ops", "body": "ops chatter"}),
        )
        .await
        .unwrap();
    alice
        .call(
            "post_message",
            json!({"channel": "ops", "body": "freeze at 5", "announce": true}),
        )
        .await
        .unwrap();
    alice
        .call("post_message", json!({"to": "bob", "body": "a secret"}))
        .await
        .unwrap();
    alice
        .call("create_task", json!({"key": "t1", "title": "Task one"}))
        .await
        .unwrap();
    alice
        .call(
            "set_note",
            json!({"key": "runbook", "value": "restart with care"}),
        )
        .await
        .unwrap();
    alice
        .call("heartbeat", json!({"status": "busy"}))
        .await
        .unwrap();

    let digest = bob.call("team_digest", json!({})).await.unwrap();
    let channels = digest["channels"].as_array().unwrap();
    let web = channels
        .iter()
        .find(|c| c["channel"] == "web")
        .expect("the focused channel");
    assert_eq!(web["messages"], 5);
    let latest: Vec<&str> = web["latest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["preview"].as_str().unwrap())
        .collect();
    assert_eq!(latest, ["web news 2", "web news 3", "web news 4"]);
    let ops = channels
        .iter()
        .find(|c| c["channel"] == "ops")
        .expect("announcements are always in");
    assert_eq!(ops["messages"], 1);
    assert_eq!(ops["latest"][0]["preview"], "freeze at 5");
    assert_eq!(digest["tasks"][0]["key"], "t1");
    assert_eq!(digest["tasks"][0]["last_event"], "created");
    assert_eq!(digest["notes"][0]["key"], "runbook");
    assert_eq!(digest["agents_seen"][0]["agent"], "alice");
    assert!(!digest.to_string().contains("a secret"), "never a DM");

    let all = bob
        .call("team_digest", json!({"all_channels": true, "hours": 1}))
        .await
        .unwrap();
    let ops = all["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel"] == "ops")
        .unwrap()
        .clone();
    assert_eq!(ops["messages"], 2);

    let refused = bob
        .call("team_digest", json!({"hours": 337}))
        .await
        .unwrap_err();
    assert!(
        refused["message"].as_str().unwrap().contains("336"),
        "{refused}"
    );
}

/// team_digest lists the 50 tasks that moved last, each with its latest
/// event, however many events the period holds: its cost is its page (the
/// tasks' update-time index), not the period's events.
#[tokio::test]
async fn team_digest_lists_the_tasks_that_moved_last() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let create = async |key: &str| {
        alice
            .call("create_task", json!({"key": key, "title": key}))
            .await
            .unwrap();
    };
    create("quiet").await;
    for n in 0..50 {
        create(&format!("t{n:02}")).await;
    }
    let keys = |digest: &serde_json::Value| -> Vec<String> {
        digest["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap().to_string())
            .collect()
    };
    // 51 moved; the page holds the 50 newest, newest first.
    let digest = alice.call("team_digest", json!({})).await.unwrap();
    let expected: Vec<String> = (0..50).rev().map(|n| format!("t{n:02}")).collect();
    assert_eq!(keys(&digest), expected, "{digest}");

    // A move of `quiet` (claimed, then renewed twice) brings it to the top,
    // with its latest event; the oldest of the others leaves the page.
    alice
        .call("claim_task", json!({"key": "quiet"}))
        .await
        .unwrap();
    for _ in 0..2 {
        alice
            .call("renew_task_lease", json!({"key": "quiet"}))
            .await
            .unwrap();
    }
    let digest = alice.call("team_digest", json!({})).await.unwrap();
    let listed = keys(&digest);
    assert_eq!(listed.len(), 50, "{digest}");
    assert_eq!(listed[0], "quiet", "{digest}");
    assert_eq!(digest["tasks"][0]["last_event"], "renewed", "{digest}");
    assert_eq!(digest["tasks"][0]["status"], "claimed", "{digest}");
    assert!(!listed.contains(&"t00".to_string()), "{digest}");
}

/// team_digest shows the latest 3 messages of a channel and 20 in all, the
/// newest: a channel past them is listed with its count and no message, so
/// the answer does not grow with the team's active channels (issue 34).
#[tokio::test]
async fn team_digest_shows_twenty_latest_messages_in_all() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    // 8 channels of 3 messages, posted channel by channel: 24 latest.
    for c in 0..8 {
        for i in 0..3 {
            alice
                .call(
                    "post_message",
                    json!({"channel": format!("c{c}"), "body": format!("c{c} m{i}")}),
                )
                .await
                .unwrap();
        }
    }
    let digest = alice
        .call("team_digest", json!({"all_channels": true}))
        .await
        .unwrap();
    let channels = digest["channels"].as_array().unwrap();
    let latest = |name: &str| -> Vec<String> {
        let channel = channels
            .iter()
            .find(|c| c["channel"] == name)
            .unwrap_or_else(|| panic!("{name} is listed: {digest}"));
        assert_eq!(channel["messages"], 3, "{digest}");
        channel["latest"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["preview"].as_str().unwrap().to_string())
            .collect()
    };
    let shown: usize = channels
        .iter()
        .map(|c| c["latest"].as_array().unwrap().len())
        .sum();
    assert_eq!(shown, 20, "{digest}");
    assert!(
        latest("c0").is_empty(),
        "the oldest is past the 20: {digest}"
    );
    assert_eq!(latest("c1"), ["c1 m1", "c1 m2"], "{digest}");
    for c in 2..8 {
        let expected: Vec<String> = (0..3).map(|i| format!("c{c} m{i}")).collect();
        assert_eq!(latest(&format!("c{c}")), expected, "{digest}");
    }
}
