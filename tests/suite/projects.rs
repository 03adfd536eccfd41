//! The conversations capability and projects with their access grants.

use ai_crew_sync::store::identity::teams;
use serde_json::json;

use crate::support::{eventually, spawn_app, test_actor};

#[tokio::test]
async fn conversation_tools_are_hidden_and_refused_until_the_team_turns_them_on() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;

    let tools = alice.list_tool_names().await;
    assert!(tools.contains(&"post_message".to_string()));
    assert!(!tools.contains(&"create_project".to_string()), "{tools:?}");
    assert!(!tools.contains(&"send_conversation_message".to_string()));
    let refused = alice
        .call("create_project", json!({"project": "web"}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("team capability --team acme --conversations on"),
        "{refused}"
    );

    // The switch reaches the server's cache through the event channel
    // (like a revocation): wait for that notification, not for time.
    let generation = || app.bus.events.credentials_generation();
    eventually(
        "the event listener to attach (a credentials generation)",
        async || generation().is_some(),
    )
    .await;
    let before = generation();
    let caps = teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    assert!(caps.conversations);
    eventually(
        "the notification to reach the credentials cache",
        async || generation() != before,
    )
    .await;
    assert!(
        alice
            .list_tool_names()
            .await
            .contains(&"create_project".to_string())
    );
    alice
        .call("create_project", json!({"project": "web"}))
        .await
        .expect("on: the tool works");

    let before = generation();
    teams::capability(&app.pool, "acme", Some(false), &test_actor())
        .await
        .unwrap();
    eventually(
        "the notification to reach the credentials cache",
        async || generation() != before,
    )
    .await;
    assert!(
        alice.call("list_projects", json!({})).await.is_err(),
        "off again: refused per call"
    );
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'team.capability'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(audited, 2);
}

#[tokio::test]
async fn only_a_holder_extends_a_grant_revoking_is_immediate_and_never_your_own() {
    let app = spawn_app().await;
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    app.agent("acme", "carol").await;

    let created = alice
        .call("create_project", json!({"project": "Checkout"}))
        .await
        .unwrap();
    assert_eq!(created["name"], "checkout");
    assert_eq!(created["granted"], true);
    let again = alice
        .call("create_project", json!({"project": "checkout"}))
        .await
        .unwrap_err();
    assert_eq!(again["error"], "conflict");

    let listed = bob.call("list_projects", json!({})).await.unwrap();
    assert_eq!(listed["projects"][0]["granted"], false);
    let refused = bob
        .call(
            "grant_project_access",
            json!({"project": "checkout", "agent": "bob"}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden", "no grant, no granting");

    alice
        .call(
            "grant_project_access",
            json!({"project": "checkout", "agent": "bob"}),
        )
        .await
        .unwrap();
    let extended = bob
        .call(
            "grant_project_access",
            json!({"project": "checkout", "agent": "carol"}),
        )
        .await
        .unwrap();
    assert_eq!(extended["changed"], true, "a holder extends the grant");
    let own = alice
        .call(
            "grant_project_access",
            json!({"project": "checkout", "agent": "alice", "grant": false}),
        )
        .await
        .unwrap_err();
    assert!(
        own["message"].as_str().unwrap().contains("own grant"),
        "{own}"
    );
    bob.call(
        "grant_project_access",
        json!({"project": "checkout", "agent": "alice", "grant": false}),
    )
    .await
    .unwrap();
    let listed = alice.call("list_projects", json!({})).await.unwrap();
    assert_eq!(listed["projects"][0]["granted"], false, "revoked at once");
    assert_eq!(listed["projects"][0]["grants"], 2);

    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action FROM conversation_audit ORDER BY id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        actions,
        [
            "project_create",
            "project_grant",
            "project_grant",
            "project_revoke"
        ]
    );
}

/// Issue 13, item 6: two holders revoking each other at once leave one holder.
/// The test holds both grant rows, so each revocation stops at its delete,
/// after its holder check: without a lock taken before that check, both pass
/// it and both deletes go through. With the project row locked first, the
/// second waits there and then sees it no longer holds a grant.
#[tokio::test]
async fn two_holders_revoking_each_other_at_once_leave_one_holder() {
    let app = spawn_app().await;
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    alice
        .call("create_project", json!({"project": "web"}))
        .await
        .unwrap();
    alice
        .call(
            "grant_project_access",
            json!({"project": "web", "agent": "bob"}),
        )
        .await
        .unwrap();

    let mut held = app.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM project_grants FOR UPDATE")
        .execute(&mut *held)
        .await
        .unwrap();
    let revoke = |by: crate::support::McpClient, whom: &'static str| {
        tokio::spawn(async move {
            by.call(
                "grant_project_access",
                json!({"project": "web", "agent": whom, "grant": false}),
            )
            .await
        })
    };
    let by_alice = revoke(alice, "bob");
    let by_bob = revoke(bob, "alice");
    eventually("the revocations to meet", async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        waiting == 2 || (by_alice.is_finished() && by_bob.is_finished())
    })
    .await;
    held.commit().await.unwrap();
    let outcomes = [by_alice.await.unwrap(), by_bob.await.unwrap()];

    let holders: i64 = sqlx::query_scalar("SELECT count(*) FROM project_grants")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(holders, 1, "one holder is left: {outcomes:?}");
    let refused: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert_eq!(refused.len(), 1, "{outcomes:?}");
    assert!(
        refused[0]["message"]
            .as_str()
            .unwrap()
            .contains("you hold none"),
        "{outcomes:?}"
    );
}
