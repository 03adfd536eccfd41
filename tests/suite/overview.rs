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

/// team_digest finds the tasks that moved among the period's newest 1 000
/// task events, so its cost does not grow with a busy period: a task whose
/// last move is older than those is left out, one inside them is listed.
#[tokio::test]
async fn team_digest_finds_moved_tasks_among_the_newest_thousand_task_events() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    for key in ["quiet", "busy"] {
        alice
            .call("create_task", json!({"key": key, "title": key}))
            .await
            .unwrap();
    }
    // 998 further moves of `busy`, newer than both creations: with the two
    // `created` events, the period holds exactly 1 000 events.
    sqlx::query(
        "INSERT INTO task_events (team_id, task_id, at, kind, agent_id, session)
         SELECT t.team_id, t.id, now() + make_interval(secs => g), 'renewed', t.created_by, ''
         FROM tasks t, generate_series(1, 998) g WHERE t.key = 'busy'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let keys = |digest: &serde_json::Value| -> Vec<String> {
        digest["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["key"].as_str().unwrap().to_string())
            .collect()
    };
    let digest = alice.call("team_digest", json!({})).await.unwrap();
    assert_eq!(keys(&digest), ["busy", "quiet"], "{digest}");
    assert_eq!(digest["tasks"][0]["last_event"], "renewed");

    // One more move of `busy` pushes `quiet`'s only event past the newest 1 000.
    sqlx::query(
        "INSERT INTO task_events (team_id, task_id, at, kind, agent_id, session)
         SELECT team_id, id, now() + interval '1 hour', 'renewed', created_by, ''
         FROM tasks WHERE key = 'busy'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let digest = alice.call("team_digest", json!({})).await.unwrap();
    assert_eq!(keys(&digest), ["busy"], "{digest}");
}
