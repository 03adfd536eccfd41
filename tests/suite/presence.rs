//! Presence: heartbeats per window, agents and their windows, discovery by
//! label, expiry, tenancy, limits and the sweeper.

use std::time::Duration;

use ai_crew_sync::auth::{self, AgentCredential};
use ai_crew_sync::store::{identity::agents, identity::tokens, messaging::presence};
use ai_crew_sync::workers::presence_sweeper;
use serde_json::{Value, json};

use crate::support::{TestApp, in_team, spawn_app};

async fn beat(app: &TestApp, token: &str, window: Option<&str>, args: Value) -> Value {
    app.mcp(token, window)
        .await
        .call("heartbeat", args)
        .await
        .unwrap_or_else(|e| panic!("heartbeat from {window:?}: {e}"))
}

fn agent<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent"] == name)
        .unwrap_or_else(|| panic!("no agent {name} in {list}"))
}

fn addresses(list: &Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["address"].as_str().unwrap().to_string())
        .collect()
}

async fn list_agents(app: &TestApp, token: &str) -> Value {
    app.mcp(token, None)
        .await
        .call("list_agents", json!({}))
        .await
        .unwrap()
}

/// Make a window's heartbeat run out, as if its ttl had passed.
async fn expire(app: &TestApp, agent: &str, window: &str) {
    let done = sqlx::query(
        "UPDATE presence p SET expires_at = now() - interval '1 second',
                                last_seen_at = now() - interval '601 seconds'
         FROM agents a WHERE a.team_id = p.team_id AND a.id = p.agent_id
           AND a.name = $1 AND p.session = $2",
    )
    .bind(agent)
    .bind(window)
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        done.rows_affected(),
        1,
        "{agent}/{window} has a presence row"
    );
}

/// Every presence row, as text, to check that a refused call changed nothing.
async fn presence_rows(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT p::text FROM presence p ORDER BY agent_id, session")
        .fetch_all(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_windows_of_one_agent_are_one_online_agent() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;

    let first = beat(
        &app,
        &alice,
        Some("frontend"),
        json!({ "status": "busy", "activity": "styling the login page" }),
    )
    .await;
    assert_eq!(first["address"], "alice/frontend");
    assert_eq!(first["status"], "busy");
    assert_eq!(first["online"], true);
    assert_eq!(first["ttl_seconds"], 600, "the default ttl");
    beat(&app, &alice, Some("backend"), json!({})).await;

    let bob_client = app.mcp(&bob, None).await;
    let tools = bob_client.list_tool_names().await;
    for tool in ["heartbeat", "list_agents", "list_sessions"] {
        assert!(tools.iter().any(|t| t == tool), "{tool} in {tools:?}");
    }
    let list = bob_client.call("list_agents", json!({})).await.unwrap();
    assert_eq!(
        list["online_count"], 1,
        "one agent online, with two windows"
    );
    let a = agent(&list, "alice");
    assert_eq!(a["online"], true);
    let windows: Vec<&str> = a["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["address"].as_str().unwrap())
        .collect();
    assert_eq!(windows.len(), 2);
    assert!(windows.contains(&"alice/frontend") && windows.contains(&"alice/backend"));
    let backend = &a["windows"].as_array().unwrap()
        [windows.iter().position(|w| *w == "alice/backend").unwrap()];
    assert_eq!(
        backend["status"], "active",
        "a first heartbeat without status is active"
    );

    // Bob never sent a heartbeat: listed, offline, without windows.
    let b = agent(&list, "bob");
    assert_eq!(b["online"], false);
    assert_eq!(b["windows"], json!([]));
    assert!(b["status"].is_null() && b["last_seen_at"].is_null());

    let online = bob_client
        .call("list_agents", json!({ "online_only": true }))
        .await
        .unwrap();
    assert_eq!(online["online_count"], 1);
    assert_eq!(online["agents"].as_array().unwrap().len(), 1);
    assert_eq!(online["agents"][0]["agent"], "alice");

    // A disabled agent is refused everywhere, so it is not online either.
    agents::set_disabled(&app.pool, &in_team("acme"), "alice", true)
        .await
        .unwrap();
    let list = bob_client.call("list_agents", json!({})).await.unwrap();
    assert_eq!(list["online_count"], 0);
    let a = agent(&list, "alice");
    assert_eq!(
        (&a["online"], &a["disabled"]),
        (&json!(false), &json!(true))
    );
    assert!(
        a["windows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["online"] == false)
    );
}

#[tokio::test]
async fn the_summary_comes_from_a_live_window_then_a_named_one_then_the_latest() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;

    beat(
        &app,
        &alice,
        Some("w1"),
        json!({ "status": "busy", "activity": "in w1" }),
    )
    .await;
    // The shared window beats later, but a named window wins while both live.
    beat(
        &app,
        &alice,
        None,
        json!({ "status": "idle", "activity": "in shared" }),
    )
    .await;
    let a = list_agents(&app, &alice).await;
    let a = agent(&a, "alice");
    assert_eq!(a["summary_window"], "alice/w1");
    assert_eq!(
        (&a["status"], &a["activity"]),
        (&json!("busy"), &json!("in w1"))
    );
    assert_eq!(
        a["windows"][0]["address"], "alice/w1",
        "summary window first"
    );

    // Among named live windows, the most recent.
    beat(
        &app,
        &alice,
        Some("w2"),
        json!({ "status": "blocked", "activity": "in w2" }),
    )
    .await;
    let a = list_agents(&app, &alice).await;
    assert_eq!(agent(&a, "alice")["summary_window"], "alice/w2");
    assert_eq!(agent(&a, "alice")["status"], "blocked");

    // A live shared window beats dead named ones.
    expire(&app, "alice", "w1").await;
    expire(&app, "alice", "w2").await;
    let a = list_agents(&app, &alice).await;
    let a = agent(&a, "alice");
    assert_eq!(a["summary_window"], "alice");
    assert_eq!(a["activity"], "in shared");
    assert_eq!(a["online"], true);

    // All dead: a named window again, the most recent of them.
    expire(&app, "alice", "").await;
    let a = list_agents(&app, &alice).await;
    assert_eq!(a["online_count"], 0);
    let a = agent(&a, "alice");
    assert_eq!(a["online"], false);
    assert_eq!(a["summary_window"], "alice/w2", "w2 was seen last");
    assert_eq!(a["windows"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn an_omitted_field_keeps_its_value_and_an_empty_one_clears_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, Some("w1")).await;

    let first = client
        .call(
            "heartbeat",
            json!({ "status": "busy", "repo": "acme/web", "branch": "main",
                    "activity": "fixing CI", "project": "Web", "role": "builder",
                    "ttl_seconds": 3600 }),
        )
        .await
        .unwrap();
    assert_eq!(first["ttl_seconds"], 3600);

    let second = client
        .call(
            "heartbeat",
            json!({ "branch": "", "activity": "  reviewing  " }),
        )
        .await
        .unwrap();
    assert_eq!(second["status"], "busy", "omitted status is kept");
    assert_eq!(second["repo"], "acme/web", "omitted repo is kept");
    assert!(second["branch"].is_null(), "\"\" clears: {second}");
    assert_eq!(second["activity"], "reviewing", "trimmed");
    assert_eq!(second["project"], "Web");
    assert_eq!(second["role"], "builder");
    assert_eq!(second["ttl_seconds"], 3600, "omitted ttl is kept");
    let expires =
        chrono::DateTime::parse_from_rfc3339(second["expires_at"].as_str().unwrap()).unwrap();
    let seen =
        chrono::DateTime::parse_from_rfc3339(second["last_seen_at"].as_str().unwrap()).unwrap();
    assert_eq!((expires - seen).num_seconds(), 3600);

    let third = client
        .call("heartbeat", json!({ "status": "idle", "project": "" }))
        .await
        .unwrap();
    assert_eq!(third["status"], "idle");
    assert!(third["project"].is_null());
    assert_eq!(third["role"], "builder");

    // What the store hands the default channel and whoami.
    let me = tokens::authenticate(&app.pool, &auth::digest(&alice), "w1".into())
        .await
        .unwrap();
    assert_eq!(
        presence::window_labels(&app.pool, &me).await.unwrap(),
        (None, Some("builder".to_string()))
    );
    let shared = tokens::authenticate(&app.pool, &auth::digest(&alice), String::new())
        .await
        .unwrap();
    assert_eq!(
        presence::window_labels(&app.pool, &shared).await.unwrap(),
        (None, None),
        "a window that never beat has no labels"
    );
}

#[tokio::test]
async fn list_sessions_gives_addresses_and_says_when_they_are_exact() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    beat(&app, &alice, None, json!({ "project": "web" })).await;
    beat(
        &app,
        &alice,
        Some("review"),
        json!({ "project": "Web", "role": "Reviewer" }),
    )
    .await;
    beat(
        &app,
        &bob,
        None,
        json!({ "project": "api", "role": "reviewer" }),
    )
    .await;
    let client = app.mcp(&bob, None).await;

    let all = client.call("list_sessions", json!({})).await.unwrap();
    assert_eq!(all["truncated"], false);
    let sessions = all["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 3);
    let exact = |address: &str| {
        sessions
            .iter()
            .find(|s| s["address"] == address)
            .unwrap_or_else(|| panic!("no {address} in {all}"))["exact"]
            .clone()
    };
    assert_eq!(
        exact("alice"),
        false,
        "bare alice also reaches alice/review"
    );
    assert_eq!(exact("alice/review"), true);
    assert_eq!(exact("bob"), true, "bob has only the shared window");
    assert!(sessions.iter().all(|s| s["status"] == "active"));

    let web = client
        .call("list_sessions", json!({ "project": " WEB " }))
        .await
        .unwrap();
    let mut web = addresses(&web);
    web.sort();
    assert_eq!(
        web,
        ["alice", "alice/review"],
        "project matches case-insensitively"
    );
    let reviewers = client
        .call("list_sessions", json!({ "role": "reviewer" }))
        .await
        .unwrap();
    let mut reviewers = addresses(&reviewers);
    reviewers.sort();
    assert_eq!(reviewers, ["alice/review", "bob"]);
    let both = client
        .call(
            "list_sessions",
            json!({ "project": "web", "role": "reviewer" }),
        )
        .await
        .unwrap();
    assert_eq!(addresses(&both), ["alice/review"]);

    let one = client
        .call("list_sessions", json!({ "limit": 1 }))
        .await
        .unwrap();
    assert_eq!(one["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(one["truncated"], true);

    // A registered window makes the bare address inexact even before it beats.
    let bob_w = client
        .call("register_session", json!({ "session": "w9" }))
        .await
        .unwrap();
    assert_eq!(bob_w["address"], "bob/w9");
    let all = client.call("list_sessions", json!({})).await.unwrap();
    let bob_entry = all["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["address"] == "bob")
        .unwrap();
    assert_eq!(bob_entry["exact"], false);
}

#[tokio::test]
async fn an_expired_window_is_offline_until_it_beats_again() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, Some("w1")).await;
    client
        .call(
            "heartbeat",
            json!({ "ttl_seconds": 30, "activity": "short lived" }),
        )
        .await
        .unwrap();
    assert_eq!(
        client
            .call("list_agents", json!({ "online_only": true }))
            .await
            .unwrap()["online_count"],
        1
    );

    expire(&app, "alice", "w1").await;
    let agents = client.call("list_agents", json!({})).await.unwrap();
    assert_eq!(agents["online_count"], 0);
    let a = agent(&agents, "alice");
    assert_eq!(a["online"], false);
    assert_eq!(a["windows"][0]["online"], false);
    assert_eq!(
        a["activity"], "short lived",
        "a dead window still says what it last did"
    );
    let online = client
        .call("list_agents", json!({ "online_only": true }))
        .await
        .unwrap();
    assert_eq!(online["agents"], json!([]));
    let sessions = client
        .call("list_sessions", json!({ "online_only": true }))
        .await
        .unwrap();
    assert_eq!(sessions["sessions"], json!([]));
    let sessions = client.call("list_sessions", json!({})).await.unwrap();
    assert_eq!(sessions["sessions"][0]["online"], false);

    let revived = client.call("heartbeat", json!({})).await.unwrap();
    assert_eq!(revived["online"], true);
    assert_eq!(revived["ttl_seconds"], 30, "the ttl is kept");
    assert_eq!(revived["activity"], "short lived");
    assert_eq!(
        client
            .call("list_agents", json!({ "online_only": true }))
            .await
            .unwrap()["online_count"],
        1
    );
}

#[tokio::test]
async fn another_team_sees_no_presence() {
    let app = spawn_app().await;
    app.team("red").await;
    app.team("blue").await;
    let red = app.agent("red", "alice").await;
    let blue = app.agent("blue", "bob").await;
    beat(
        &app,
        &red,
        Some("w1"),
        json!({ "project": "shared-name", "activity": "secret plans" }),
    )
    .await;

    let client = app.mcp(&blue, None).await;
    let agents = client.call("list_agents", json!({})).await.unwrap();
    assert_eq!(agents["online_count"], 0);
    let names: Vec<&str> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["agent"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bob"]);
    let sessions = client
        .call("list_sessions", json!({ "project": "shared-name" }))
        .await
        .unwrap();
    assert_eq!(sessions["sessions"], json!([]));
    let sessions = client.call("list_sessions", json!({})).await.unwrap();
    assert_eq!(sessions["sessions"], json!([]));

    // The database itself refuses a presence row of blue pointing at red's agent.
    let err = sqlx::query(
        "INSERT INTO presence (team_id, agent_id, session, status, ttl_seconds, expires_at)
         SELECT (SELECT id FROM teams WHERE slug = 'blue'), a.id, 'x', 'active', 600, now()
         FROM agents a JOIN teams t ON t.id = a.team_id WHERE t.slug = 'red'",
    )
    .execute(&app.pool)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("foreign key"), "{err}");
}

#[tokio::test]
async fn every_presence_limit_is_refused_with_its_number_and_changes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, Some("w1")).await;
    client
        .call(
            "heartbeat",
            json!({ "status": "busy", "activity": "kept", "ttl_seconds": 900 }),
        )
        .await
        .unwrap();

    // 256 bytes exactly is fine (multi-byte characters count as bytes).
    let max = "é".repeat(128);
    let ok = client
        .call("heartbeat", json!({ "activity": max }))
        .await
        .unwrap();
    assert_eq!(ok["activity"].as_str().unwrap().len(), 256);
    let refused = client
        .call("heartbeat", json!({ "activity": format!("{max}x") }))
        .await
        .unwrap_err();
    assert!(refused["message"].as_str().unwrap().contains("257 bytes"));
    client
        .call("heartbeat", json!({ "activity": "kept" }))
        .await
        .unwrap();
    let before = presence_rows(&app).await;

    let long = "x".repeat(257);
    let refusals = [
        (
            "heartbeat",
            json!({ "status": "sleeping" }),
            "active, idle, busy, blocked",
        ),
        (
            "heartbeat",
            json!({ "ttl_seconds": 29 }),
            "between 30 and 86400",
        ),
        (
            "heartbeat",
            json!({ "ttl_seconds": 86_401 }),
            "between 30 and 86400",
        ),
        ("heartbeat", json!({ "repo": long }), "limit is 256 bytes"),
        ("heartbeat", json!({ "branch": long }), "limit is 256 bytes"),
        (
            "heartbeat",
            json!({ "activity": long, "status": "idle" }),
            "limit is 256 bytes",
        ),
        (
            "heartbeat",
            json!({ "project": long }),
            "limit is 256 bytes",
        ),
        (
            "heartbeat",
            json!({ "role": "a\u{7}b" }),
            "control character",
        ),
        (
            "list_sessions",
            json!({ "limit": 201 }),
            "between 1 and 200",
        ),
        ("list_sessions", json!({ "limit": 0 }), "between 1 and 200"),
        (
            "list_sessions",
            json!({ "project": long }),
            "limit is 256 bytes",
        ),
    ];
    for (tool, args, says) in refusals {
        let err = client.call(tool, args.clone()).await.unwrap_err();
        assert_eq!(err["error"], "invalid", "{tool} {args}: {err}");
        let message = err["message"].as_str().unwrap();
        assert!(message.contains(says), "{tool} {args}: {message}");
    }
    assert_eq!(
        presence_rows(&app).await,
        before,
        "a refused heartbeat changes nothing, not even last_seen_at"
    );
}

#[tokio::test]
async fn a_revoked_window_cannot_beat() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let agent_client = app.mcp(&alice, None).await;
    let w1 = agent_client
        .call("register_session", json!({ "session": "w1" }))
        .await
        .unwrap();
    let credential = w1["credential"].as_str().unwrap();
    let AgentCredential::Session(digest) = auth::parse_agent_credential(credential).unwrap() else {
        unreachable!()
    };
    let me = ai_crew_sync::store::identity::sessions::authenticate(&app.pool, &digest, None, None)
        .await
        .unwrap();
    agent_client
        .call("revoke_session", json!({ "session": "w1" }))
        .await
        .unwrap();
    let err = presence::heartbeat(&app.bus, &me, &presence::Beat::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("revoked"), "{err}");
    assert!(presence_rows(&app).await.is_empty(), "nothing was written");
}

#[tokio::test]
async fn the_sweeper_deletes_only_windows_dead_longer_than_the_retention() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    for window in ["old1", "old2", "old3", "old4", "old5", "recent", "live"] {
        beat(&app, &alice, Some(window), json!({})).await;
    }
    sqlx::query(
        "UPDATE presence SET expires_at = now() - interval '8 days' WHERE session LIKE 'old%'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE presence SET expires_at = now() - interval '6 days' WHERE session = 'recent'",
    )
    .execute(&app.pool)
    .await
    .unwrap();

    // Batches of 2: the pass goes on until nothing old is left.
    let deleted = presence_sweeper::sweep(&app.pool, presence_sweeper::RETENTION, 2)
        .await
        .unwrap();
    assert_eq!(deleted, 5);
    let left: Vec<String> = sqlx::query_scalar("SELECT session FROM presence ORDER BY session")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(left, ["live", "recent"]);
    assert_eq!(
        presence_sweeper::sweep(&app.pool, presence_sweeper::RETENTION, 2)
            .await
            .unwrap(),
        0
    );

    // What a user sees: the recently dead window is still listed (with
    // `all`: it is offline for more than a day), the old ones are gone.
    let agents = app
        .mcp(&alice, None)
        .await
        .call("list_agents", json!({"all": true}))
        .await
        .unwrap();
    assert_eq!(
        agent(&agents, "alice")["windows"].as_array().unwrap().len(),
        2
    );

    // A shorter retention takes the recently dead one too, never the live one.
    let deleted = presence_sweeper::sweep(&app.pool, Duration::from_secs(3600), 500)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let left: Vec<String> = sqlx::query_scalar("SELECT session FROM presence")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(left, ["live"]);
}

fn window<'a>(list: &'a Value, address: &str) -> Option<&'a Value> {
    list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["address"] == address)
}

/// A window that says it leaves is offline at once, whatever its ttl; its
/// next heartbeat brings it back. Each window has its state in one word.
#[tokio::test]
async fn a_leaving_heartbeat_takes_the_window_offline_at_once_and_the_next_beat_brings_it_back() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let here = beat(&app, &alice, Some("w1"), json!({"ttl_seconds": 3600})).await;
    assert_eq!(
        (here["online"].clone(), here["state"].clone()),
        (json!(true), json!("online"))
    );
    let idle = beat(&app, &alice, Some("w1"), json!({"status": "idle"})).await;
    assert_eq!(idle["state"], "idle", "{idle}");

    let left = beat(
        &app,
        &alice,
        Some("w1"),
        json!({"status": "idle", "offline": true, "activity": "done for today"}),
    )
    .await;
    assert_eq!(left["online"], false, "{left}");
    assert_eq!(left["state"], "offline", "{left}");
    assert_eq!(
        left["activity"], "done for today",
        "the beat itself was stored: {left}"
    );
    let listed = bob.call("list_sessions", json!({})).await.unwrap();
    let w1 = window(&listed, "alice/w1").unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(
        (w1["online"].clone(), w1["state"].clone()),
        (json!(false), json!("offline"))
    );
    let agents = bob.call("list_agents", json!({})).await.unwrap();
    assert_eq!(agent(&agents, "alice")["online"], false, "{agents}");
    assert_eq!(agents["online_count"], 0, "{agents}");

    let back = beat(&app, &alice, Some("w1"), json!({"status": "active"})).await;
    assert_eq!(back["state"], "online", "{back}");
    assert_eq!(back["ttl_seconds"], 3600, "the ttl was kept: {back}");
}

/// With one window per conversation, windows pile up: those offline for more
/// than a day are left out of `list_sessions` and only counted by
/// `list_agents`, unless `all` asks for them.
#[tokio::test]
async fn windows_offline_for_more_than_a_day_are_listed_only_with_all() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    for window in ["today", "yesterday", "last-week", "live"] {
        beat(&app, &alice, Some(window), json!({})).await;
    }
    for (window, dead_for) in [
        ("today", "2 hours"),
        ("yesterday", "25 hours"),
        ("last-week", "6 days"),
    ] {
        sqlx::query(
            "UPDATE presence SET expires_at = now() - $2::interval, last_seen_at = now() - $2::interval - interval '10 minutes'
              WHERE session = $1",
        )
        .bind(window)
        .bind(dead_for)
        .execute(&app.pool)
        .await
        .unwrap();
    }

    let recent = bob.call("list_sessions", json!({})).await.unwrap();
    assert_eq!(
        addresses(&recent),
        ["alice/live", "alice/today"],
        "{recent}"
    );
    let all = bob
        .call("list_sessions", json!({"all": true}))
        .await
        .unwrap();
    assert_eq!(
        addresses(&all),
        [
            "alice/live",
            "alice/today",
            "alice/yesterday",
            "alice/last-week"
        ],
        "{all}"
    );

    let agents = bob.call("list_agents", json!({})).await.unwrap();
    let a = agent(&agents, "alice");
    let shown: Vec<&str> = a["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["session"].as_str().unwrap())
        .collect();
    assert_eq!(shown, ["live", "today"], "{a}");
    assert_eq!(a["older_windows"], 2, "{a}");
    let agents = bob.call("list_agents", json!({"all": true})).await.unwrap();
    let a = agent(&agents, "alice");
    assert_eq!(a["windows"].as_array().unwrap().len(), 4, "{a}");
    assert_eq!(a["older_windows"], 0, "{a}");
}

/// A revoked window (the provisional one a proxy retires, one its agent
/// ended) is in no listing, not even with `all`; registered again and
/// beating, it is back.
#[tokio::test]
async fn a_revoked_window_is_not_listed_until_it_is_registered_and_beats_again() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let alice = app.mcp(&alice_token, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let issued = alice
        .call("register_session", json!({"session": "temp"}))
        .await
        .unwrap();
    let temp = app.mcp(issued["credential"].as_str().unwrap(), None).await;
    temp.call("heartbeat", json!({"ttl_seconds": 3600}))
        .await
        .unwrap();
    beat(&app, &alice_token, Some("kept"), json!({})).await;
    let before = bob.call("list_sessions", json!({})).await.unwrap();
    assert!(window(&before, "alice/temp").is_some(), "{before}");

    alice
        .call("revoke_session", json!({"session": "temp"}))
        .await
        .unwrap();
    for all in [false, true] {
        let sessions = bob
            .call("list_sessions", json!({"all": all}))
            .await
            .unwrap();
        assert_eq!(
            addresses(&sessions),
            ["alice/kept"],
            "all: {all}: {sessions}"
        );
        let agents = bob.call("list_agents", json!({"all": all})).await.unwrap();
        let windows = agent(&agents, "alice")["windows"].clone();
        assert_eq!(
            windows.as_array().unwrap().len(),
            1,
            "all: {all}: {windows}"
        );
        assert_eq!(windows[0]["session"], "kept", "{windows}");
    }
    // The digest counts the windows seen, not the revoked one.
    let digest = bob.call("team_digest", json!({})).await.unwrap();
    let seen = digest["agents_seen"].as_array().unwrap();
    let alice_seen = seen.iter().find(|a| a["agent"] == "alice").unwrap();
    assert_eq!(alice_seen["windows"], 1, "{digest}");
    // Offline too, for whatever reads presence directly.
    let online: bool =
        sqlx::query_scalar("SELECT expires_at > now() FROM presence WHERE session = 'temp'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(!online);

    let again = alice
        .call("register_session", json!({"session": "temp"}))
        .await
        .unwrap();
    let temp = app.mcp(again["credential"].as_str().unwrap(), None).await;
    temp.call("heartbeat", json!({})).await.unwrap();
    let after = bob.call("list_sessions", json!({})).await.unwrap();
    let back = window(&after, "alice/temp").unwrap_or_else(|| panic!("{after}"));
    assert_eq!(back["state"], "online", "{back}");
}
