//! Tasks over MCP: the queue, dependencies, leases that belong to a window,
//! lapsed leases taken over, and every limit refused without a trace.

use std::collections::{HashMap, HashSet};

use ai_crew_sync::auth::{self, AgentCredential};
use ai_crew_sync::store::{identity::sessions, messaging::locks, tasks};
use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, spawn_app};

async fn count(app: &TestApp, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// Rows of the three task tables, to show a refusal left nothing behind.
async fn task_rows(app: &TestApp) -> (i64, i64, i64) {
    (
        count(app, "tasks").await,
        count(app, "task_dependencies").await,
        count(app, "task_events").await,
    )
}

async fn create(client: &McpClient, key: &str, depends_on: &[&str]) -> Value {
    client
        .call(
            "create_task",
            json!({ "key": key, "title": format!("do {key}"), "depends_on": depends_on }),
        )
        .await
        .unwrap_or_else(|e| panic!("create {key}: {e}"))
}

fn message(refusal: &Value) -> &str {
    refusal["message"].as_str().unwrap_or_default()
}

/// Put a task's lease in the past, as if its holder had gone quiet.
async fn lapse(app: &TestApp, key: &str) {
    let updated = sqlx::query(
        "UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE key = $1",
    )
    .bind(key)
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(updated.rows_affected(), 1);
}

#[tokio::test]
async fn the_task_and_lock_tools_are_listed() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let names = app.mcp(&token, None).await.list_tool_names().await;
    for tool in [
        "create_task",
        "claim_task",
        "claim_next_task",
        "renew_task_lease",
        "release_task",
        "complete_task",
        "list_tasks",
        "get_task",
        "acquire_lock",
        "release_lock",
        "list_locks",
    ] {
        assert!(names.iter().any(|n| n == tool), "{tool} missing: {names:?}");
    }
}

#[tokio::test]
async fn a_task_is_created_claimed_extended_and_completed_and_others_see_its_history() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let worker = app.mcp(&alice, Some("w1")).await;
    let reader = app.mcp(&bob, None).await;

    let created = worker
        .call(
            "create_task",
            json!({
                "key": "api-auth",
                "title": "  Refactor the auth middleware ",
                "description": "Move token checks into one layer.",
                "metadata": "{\"priority\": \"high\", \"points\": 3}",
            }),
        )
        .await
        .unwrap();
    assert_eq!(created["status"], "open");
    assert_eq!(created["title"], "Refactor the auth middleware");
    assert_eq!(
        created["metadata"],
        json!({"priority": "high", "points": 3}),
        "a metadata string holding an object is stored as the object"
    );
    assert_eq!(created["created_by"], "alice/w1");
    assert!(created["holder"].is_null());

    let claimed = worker
        .call(
            "claim_task",
            json!({ "key": "api-auth", "lease_seconds": 60 }),
        )
        .await
        .unwrap();
    assert_eq!(claimed["status"], "claimed");
    assert_eq!(claimed["holder"]["address"], "alice/w1");
    assert_eq!(claimed["holder"]["session"], "w1");
    let first_expiry = claimed["holder"]["lease_expires_at"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(claimed["holder"]["lease_seconds_left"].as_i64().unwrap() <= 60);

    // Claiming again from the holding window is not a conflict: it extends.
    let again = worker
        .call(
            "claim_task",
            json!({ "key": "api-auth", "lease_seconds": 3600 }),
        )
        .await
        .unwrap();
    assert_eq!(again["holder"]["address"], "alice/w1");
    assert!(again["holder"]["lease_expires_at"].as_str().unwrap() > first_expiry.as_str());
    assert!(again["holder"]["lease_seconds_left"].as_i64().unwrap() > 3500);

    let renewed = worker
        .call(
            "renew_task_lease",
            json!({ "key": "api-auth", "lease_seconds": 120 }),
        )
        .await
        .unwrap();
    assert!(renewed["holder"]["lease_seconds_left"].as_i64().unwrap() <= 120);

    // Another agent sees who holds it, and whoami-style counts agree.
    let seen = reader
        .call("list_tasks", json!({ "status": "claimed" }))
        .await
        .unwrap();
    assert_eq!(seen["count"], 1);
    assert_eq!(seen["tasks"][0]["holder"]["address"], "alice/w1");

    let done = worker
        .call(
            "complete_task",
            json!({ "key": "api-auth", "result": "merged as #42" }),
        )
        .await
        .unwrap();
    assert_eq!(done["status"], "done");
    assert_eq!(done["completed_by"], "alice/w1");
    assert!(done["holder"].is_null());

    let detail = reader
        .call("get_task", json!({ "key": "api-auth" }))
        .await
        .unwrap();
    assert_eq!(detail["status"], "done");
    assert_eq!(detail["result"], "merged as #42");
    assert_eq!(detail["description"], "Move token checks into one layer.");
    let kinds: Vec<&str> = detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["created", "claimed", "renewed", "renewed", "completed"]
    );
    assert_eq!(detail["events_total"], 5);
    assert!(
        detail["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["by"] == "alice/w1")
    );

    let listed = reader
        .call("list_tasks", json!({ "status": "done" }))
        .await
        .unwrap();
    assert_eq!(listed["tasks"][0]["key"], "api-auth");
    assert!(
        listed["tasks"][0].get("result").is_none(),
        "listings stay short"
    );

    // A done task cannot be claimed again; the refusal says who finished it.
    let refused = reader
        .call("claim_task", json!({ "key": "api-auth" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(message(&refused).contains("already done"), "{refused}");
    assert!(message(&refused).contains("alice/w1"), "{refused}");

    let missing = reader
        .call("get_task", json!({ "key": "nope" }))
        .await
        .unwrap_err();
    assert_eq!(missing["error"], "not_found");
}

#[tokio::test]
async fn sixteen_windows_claiming_next_in_parallel_get_every_task_exactly_once() {
    const TASKS: usize = 200;
    let app = spawn_app().await;
    app.team("acme").await;
    let planner = app.mcp(&app.agent("acme", "planner").await, None).await;
    for i in 0..TASKS {
        create(&planner, &format!("t{i:03}"), &[]).await;
    }

    // 4 agents x 4 windows: 16 distinct holders, all racing.
    let mut workers = tokio::task::JoinSet::new();
    for a in 0..4 {
        let token = app.agent("acme", &format!("agent{a}")).await;
        for w in 0..4 {
            let window = format!("w{w}");
            let client = app.mcp(&token, Some(&window)).await;
            let me = format!("agent{a}/{window}");
            workers.spawn(async move {
                let mut got = Vec::new();
                loop {
                    let next = client
                        .call("claim_next_task", json!({ "lease_seconds": 600 }))
                        .await
                        .unwrap_or_else(|e| panic!("claim_next_task refused: {e}"));
                    if next["claimed"] == false {
                        assert!(next["task"].is_null());
                        break;
                    }
                    let key = next["task"]["key"].as_str().unwrap().to_string();
                    assert_eq!(next["task"]["holder"]["address"], me.as_str());
                    let done = client
                        .call(
                            "complete_task",
                            json!({ "key": key, "result": format!("done by {me}") }),
                        )
                        .await
                        .unwrap_or_else(|e| panic!("{me} could not complete {key}: {e}"));
                    assert_eq!(done["status"], "done");
                    got.push(key);
                }
                (me, got)
            });
        }
    }
    let mut handed_out: HashMap<String, String> = HashMap::new();
    let mut total = 0;
    let mut busy_windows = 0;
    while let Some(joined) = workers.join_next().await {
        let (me, got) = joined.unwrap();
        busy_windows += usize::from(!got.is_empty());
        for key in got {
            total += 1;
            if let Some(first) = handed_out.insert(key.clone(), me.clone()) {
                panic!("{key} was handed to both {first} and {me}");
            }
        }
    }
    assert_eq!(total, TASKS, "every task handed out exactly once");
    assert_eq!(handed_out.len(), TASKS);
    assert!(busy_windows > 1, "the work was shared");

    // The database agrees: all done, each by the window that claimed it.
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT t.key, t.status, a.name, t.completed_session FROM tasks t
         JOIN agents a ON a.id = t.completed_by",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), TASKS);
    for (key, status, agent, session) in rows {
        assert_eq!(status, "done");
        assert_eq!(handed_out[&key], format!("{agent}/{session}"));
    }
    let claims: i64 = sqlx::query_scalar("SELECT count(*) FROM task_events WHERE kind = 'claimed'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(claims, TASKS as i64);
    let done = planner
        .call("list_tasks", json!({ "status": "done", "limit": 200 }))
        .await
        .unwrap();
    assert_eq!(done["count"], 200);
    assert_eq!(done["more"], false);
}

#[tokio::test]
async fn a_blocked_task_waits_until_its_dependencies_are_done() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let alice = app.mcp(&token, Some("w1")).await;

    let empty = alice.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(empty["claimed"], false);
    assert!(
        message(&empty).contains("no open tasks"),
        "nothing to claim is a plain answer: {empty}"
    );

    create(&alice, "schema", &[]).await;
    create(&alice, "backend", &[]).await;
    let deploy = create(&alice, "deploy", &["schema", "backend"]).await;
    assert_eq!(deploy["depends_on"], json!(["schema", "backend"]));
    assert_eq!(deploy["blocked_by"], json!(["schema", "backend"]));

    let refused = alice
        .call("claim_task", json!({ "key": "deploy" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(message(&refused).contains("`schema`"), "{refused}");
    assert!(message(&refused).contains("`backend`"), "{refused}");

    // The queue hands out ready work oldest first and never the blocked task.
    let first = alice.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(first["task"]["key"], "schema");
    let second = alice.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(second["task"]["key"], "backend");
    let none = alice.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(none["claimed"], false);
    assert!(
        message(&none).contains("1 open task(s) wait on unfinished dependencies"),
        "{none}"
    );
    assert!(message(&none).contains("2 task(s) are claimed"), "{none}");

    alice
        .call("complete_task", json!({ "key": "schema", "result": "ok" }))
        .await
        .unwrap();
    let still = alice
        .call("get_task", json!({ "key": "deploy" }))
        .await
        .unwrap();
    assert_eq!(still["blocked_by"], json!(["backend"]));
    let refused = alice
        .call("claim_task", json!({ "key": "deploy" }))
        .await
        .unwrap_err();
    assert!(message(&refused).contains("`backend`"), "{refused}");
    assert!(!message(&refused).contains("`schema`"), "{refused}");

    alice
        .call("complete_task", json!({ "key": "backend", "result": "ok" }))
        .await
        .unwrap();
    let ready = alice.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(ready["claimed"], true);
    assert_eq!(ready["task"]["key"], "deploy");
    assert_eq!(ready["task"]["blocked_by"], json!([]));
}

#[tokio::test]
async fn a_lapsed_lease_reads_open_and_another_window_of_the_same_agent_takes_it_over() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let w1 = app.mcp(&alice, Some("w1")).await;
    let w2 = app.mcp(&alice, Some("w2")).await;
    let observer = app.mcp(&bob, None).await;

    create(&w1, "flaky-test", &[]).await;
    w1.call(
        "claim_task",
        json!({ "key": "flaky-test", "lease_seconds": 30 }),
    )
    .await
    .unwrap();
    lapse(&app, "flaky-test").await;

    // Everywhere it reads open, with the lapsed holder named.
    let seen = observer
        .call("get_task", json!({ "key": "flaky-test" }))
        .await
        .unwrap();
    assert_eq!(seen["status"], "open");
    assert!(seen["holder"].is_null());
    assert_eq!(seen["lapsed_holder"]["address"], "alice/w1");
    assert_eq!(seen["lapsed_holder"]["lease_seconds_left"], 0);
    let open = observer
        .call("list_tasks", json!({ "status": "open" }))
        .await
        .unwrap();
    assert_eq!(open["tasks"][0]["key"], "flaky-test");
    assert_eq!(open["tasks"][0]["lapsed_holder"]["address"], "alice/w1");
    let claimed = observer
        .call("list_tasks", json!({ "status": "claimed" }))
        .await
        .unwrap();
    assert_eq!(claimed["count"], 0);

    // The lapsed holder cannot renew or complete what it no longer holds.
    let refused = w1
        .call("renew_task_lease", json!({ "key": "flaky-test" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(message(&refused).contains("lapsed"), "{refused}");
    let refused = w1
        .call(
            "complete_task",
            json!({ "key": "flaky-test", "result": "x" }),
        )
        .await
        .unwrap_err();
    assert!(message(&refused).contains("lapsed"), "{refused}");

    // Another window of the same agent takes it over.
    let taken = w2
        .call("claim_task", json!({ "key": "flaky-test" }))
        .await
        .unwrap();
    assert_eq!(taken["status"], "claimed");
    assert_eq!(taken["holder"]["address"], "alice/w2");
    assert!(taken["lapsed_holder"].is_null());
    let history = observer
        .call("get_task", json!({ "key": "flaky-test" }))
        .await
        .unwrap();
    let takeover = history["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(takeover["kind"], "claimed");
    assert_eq!(takeover["by"], "alice/w2");
    assert_eq!(takeover["detail"]["lapsed_holder"], "alice/w1");

    // Now the old window is refused by name of the new holder.
    let refused = w1
        .call(
            "complete_task",
            json!({ "key": "flaky-test", "result": "x" }),
        )
        .await
        .unwrap_err();
    assert!(message(&refused).contains("window `w2`"), "{refused}");

    // claim_next_task also takes over lapsed leases, from anyone.
    lapse(&app, "flaky-test").await;
    let next = observer.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(next["task"]["key"], "flaky-test");
    assert_eq!(next["task"]["holder"]["address"], "bob");
}

#[tokio::test]
async fn a_sibling_window_cannot_renew_release_or_complete_another_windows_claim() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let w1 = app.mcp(&alice, Some("w1")).await;
    let w2 = app.mcp(&alice, Some("w2")).await;
    let shared = app.mcp(&alice, None).await;
    let other = app.mcp(&bob, Some("w1")).await;

    create(&w1, "migrate-db", &[]).await;
    let held = w1
        .call(
            "claim_task",
            json!({ "key": "migrate-db", "lease_seconds": 600 }),
        )
        .await
        .unwrap();
    let expiry = held["holder"]["lease_expires_at"]
        .as_str()
        .unwrap()
        .to_string();
    let expiry_secs = &expiry[..19]; // messages give the time to the second

    for (client, who) in [(&w2, "alice/w2"), (&shared, "alice (shared)")] {
        for (tool, args) in [
            ("renew_task_lease", json!({ "key": "migrate-db" })),
            ("release_task", json!({ "key": "migrate-db" })),
            (
                "complete_task",
                json!({ "key": "migrate-db", "result": "stolen" }),
            ),
            ("claim_task", json!({ "key": "migrate-db" })),
        ] {
            let refused = client.call(tool, args).await.unwrap_err();
            assert_eq!(refused["error"], "conflict", "{who} {tool}: {refused}");
            let text = message(&refused);
            assert!(text.contains("window `w1`"), "{who} {tool}: {text}");
            assert!(
                text.contains(expiry_secs),
                "{who} {tool} names the expiry: {text}"
            );
        }
    }
    let refused = w2
        .call(
            "complete_task",
            json!({ "key": "migrate-db", "result": "x" }),
        )
        .await
        .unwrap_err();
    assert!(
        message(&refused).contains("another window of the same agent"),
        "{refused}"
    );
    // Another agent's window with the same label is someone else entirely.
    let refused = other
        .call("claim_task", json!({ "key": "migrate-db" }))
        .await
        .unwrap_err();
    assert!(message(&refused).contains("agent `alice`"), "{refused}");

    // Nothing moved: still w1's, with the same lease.
    let state = other
        .call("get_task", json!({ "key": "migrate-db" }))
        .await
        .unwrap();
    assert_eq!(state["status"], "claimed");
    assert_eq!(state["holder"]["address"], "alice/w1");
    assert_eq!(state["holder"]["lease_expires_at"], expiry.as_str());
    let kinds: Vec<&str> = state["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["created", "claimed"]);

    // The holder releases; then the sibling may claim it.
    let released = w1
        .call("release_task", json!({ "key": "migrate-db" }))
        .await
        .unwrap();
    assert_eq!(released["status"], "open");
    assert!(released["holder"].is_null() && released["lapsed_holder"].is_null());
    let mine = w1
        .call("list_tasks", json!({ "mine_only": true }))
        .await
        .unwrap();
    assert_eq!(mine["count"], 0);
    let taken = w2
        .call("claim_task", json!({ "key": "migrate-db" }))
        .await
        .unwrap();
    assert_eq!(taken["holder"]["address"], "alice/w2");
    let mine = w2
        .call("list_tasks", json!({ "mine_only": true }))
        .await
        .unwrap();
    assert_eq!(mine["tasks"][0]["key"], "migrate-db");
}

#[tokio::test]
async fn every_task_limit_is_refused_with_its_number_and_writes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let alice = app.mcp(&token, Some("w1")).await;
    let deps: Vec<String> = (0..33).map(|i| format!("dep-{i}")).collect();
    for dep in &deps {
        create(&alice, dep, &[]).await;
    }
    alice
        .call("claim_task", json!({ "key": "dep-0" }))
        .await
        .unwrap();
    let before = task_rows(&app).await;
    let held_before = alice
        .call("get_task", json!({ "key": "dep-0" }))
        .await
        .unwrap();

    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "create_task",
            json!({ "key": "k".repeat(129), "title": "t" }),
            "128",
        ),
        (
            "create_task",
            json!({ "key": "ok", "title": "t".repeat(513) }),
            "512",
        ),
        (
            "create_task",
            json!({ "key": "ok", "title": "t", "description": "d".repeat(65_537) }),
            "65536",
        ),
        (
            "create_task",
            json!({ "key": "ok", "title": "t", "metadata": { "blob": "m".repeat(16_384) } }),
            "16384",
        ),
        (
            "create_task",
            json!({ "key": "ok", "title": "t", "metadata": "[1, 2]" }),
            "JSON object",
        ),
        (
            "create_task",
            json!({ "key": "ok", "title": "t", "depends_on": deps }),
            "32",
        ),
        (
            "create_task",
            json!({ "key": "ok", "title": "t", "depends_on": ["dep-1", "ghost"] }),
            "`ghost`",
        ),
        (
            "create_task",
            json!({ "key": "ok", "title": "   " }),
            "title is required",
        ),
        (
            "claim_task",
            json!({ "key": "dep-1", "lease_seconds": 29 }),
            "30",
        ),
        (
            "claim_task",
            json!({ "key": "dep-1", "lease_seconds": 86_401 }),
            "86400",
        ),
        ("claim_next_task", json!({ "lease_seconds": 0 }), "30"),
        (
            "renew_task_lease",
            json!({ "key": "dep-0", "lease_seconds": 86_401 }),
            "86400",
        ),
        (
            "complete_task",
            json!({ "key": "dep-0", "result": "r".repeat(65_537) }),
            "65536",
        ),
        ("list_tasks", json!({ "limit": 201 }), "200"),
        ("list_tasks", json!({ "limit": 0 }), "200"),
        ("list_tasks", json!({ "status": "lapsed" }), "open, claimed"),
    ];
    for (tool, args, limit) in cases {
        let refused = alice
            .call(tool, args.clone())
            .await
            .expect_err(&format!("{tool} must refuse"));
        assert_eq!(refused["error"], "invalid", "{tool}: {refused}");
        assert!(
            message(&refused).contains(limit),
            "{tool} must name {limit:?}: {refused}"
        );
    }
    // A duplicate key is a conflict, and also changes nothing.
    let duplicate = alice
        .call("create_task", json!({ "key": "dep-1", "title": "again" }))
        .await
        .unwrap_err();
    assert_eq!(duplicate["error"], "conflict");
    assert!(message(&duplicate).contains("already exists"));

    assert_eq!(task_rows(&app).await, before, "no row was written");
    let held_after = alice
        .call("get_task", json!({ "key": "dep-0" }))
        .await
        .unwrap();
    assert_eq!(held_after["status"], "claimed");
    assert_eq!(
        held_after["holder"]["lease_expires_at"],
        held_before["holder"]["lease_expires_at"]
    );
    assert!(held_after["result"].is_null());
    let ok_exists: bool = sqlx::query_scalar("SELECT exists(SELECT 1 FROM tasks WHERE key = 'ok')")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(!ok_exists);

    // At the limits exactly, everything is accepted.
    let at_limits = alice
        .call(
            "create_task",
            json!({
                "key": "k".repeat(128),
                "title": "t".repeat(512),
                "description": "d".repeat(65_536),
                "depends_on": deps[1..].to_vec(),
            }),
        )
        .await
        .unwrap();
    assert_eq!(at_limits["depends_on"].as_array().unwrap().len(), 32);
    let listed = alice
        .call("list_tasks", json!({ "limit": 200 }))
        .await
        .unwrap();
    assert_eq!(listed["count"], 34);
}

#[tokio::test]
async fn another_teams_tasks_are_invisible_and_keys_are_per_team() {
    let app = spawn_app().await;
    app.team("red").await;
    app.team("blue").await;
    let red = app.mcp(&app.agent("red", "alice").await, None).await;
    let blue = app.mcp(&app.agent("blue", "bob").await, None).await;

    create(&red, "shared-key", &[]).await;
    let missing = blue
        .call("get_task", json!({ "key": "shared-key" }))
        .await
        .unwrap_err();
    assert_eq!(missing["error"], "not_found");
    let refused = blue
        .call("claim_task", json!({ "key": "shared-key" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "not_found");
    let none = blue.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(none["claimed"], false);
    let refused = blue
        .call(
            "create_task",
            json!({ "key": "x", "title": "x", "depends_on": ["shared-key"] }),
        )
        .await
        .unwrap_err();
    assert!(message(&refused).contains("`shared-key`"), "{refused}");

    // The same key in another team is another task.
    create(&blue, "shared-key", &[]).await;
    let listed = blue.call("list_tasks", json!({})).await.unwrap();
    assert_eq!(listed["count"], 1);
    let keys: HashSet<String> = sqlx::query_scalar("SELECT key FROM tasks")
        .fetch_all(&app.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(keys.len(), 1);
    assert_eq!(count(&app, "tasks").await, 2);
}

#[tokio::test]
async fn a_revoked_window_can_no_longer_change_tasks_or_locks() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let agent = app.mcp(&token, None).await;
    let registered = agent
        .call("register_session", json!({ "session": "w1" }))
        .await
        .unwrap();
    let credential = registered["credential"].as_str().unwrap();
    let w1 = app.mcp(credential, None).await;
    create(&w1, "t1", &[]).await;
    create(&w1, "t2", &[]).await;
    w1.call("claim_task", json!({ "key": "t1" })).await.unwrap();

    // The identity a request in flight resolved before the revocation.
    let AgentCredential::Session(digest) = auth::parse_agent_credential(credential).unwrap() else {
        unreachable!()
    };
    let in_flight = sessions::authenticate(&app.pool, &digest, None, None)
        .await
        .unwrap();
    agent
        .call("revoke_session", json!({ "session": "w1" }))
        .await
        .unwrap();
    let before = (task_rows(&app).await, count(&app, "locks").await);

    let refusals = [
        tasks::complete(&app.bus, &in_flight, "t1", "late")
            .await
            .unwrap_err(),
        tasks::claim_next(&app.bus, &in_flight, None)
            .await
            .unwrap_err(),
        tasks::create(
            &app.bus,
            &in_flight,
            tasks::NewTask {
                key: "t3".into(),
                title: "t3".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err(),
        locks::acquire(&app.bus, &in_flight, "deploy", None, None)
            .await
            .unwrap_err(),
    ];
    for err in refusals {
        assert_eq!(err.kind(), "unauthenticated", "{err}");
        assert!(err.to_string().contains("revoked"), "{err}");
    }
    assert_eq!(
        (task_rows(&app).await, count(&app, "locks").await),
        before,
        "nothing was written"
    );
    let t1 = agent
        .call("get_task", json!({ "key": "t1" }))
        .await
        .unwrap();
    assert_eq!(
        t1["status"], "claimed",
        "still the (now dead) window's until the departures pass releases it"
    );
    assert_eq!(t1["holder"]["address"], "alice/w1");
}

/// Two windows claim one open task at once; the row is held so both are
/// seen queued on it, then let go. The loser waited out the winner's claim
/// and is handed the row as it left it: its refusal names the winner (it
/// once said `agent `?``: the holder's name came from a join, which a locked
/// read does not evaluate again against the newer row).
#[tokio::test]
async fn the_window_that_loses_a_claim_race_is_told_who_won() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("w2")).await;
    create(&alice, "deploy", &[]).await;

    let (won, lost) = crate::write_fence::queued_on_one_row(
        &app.pool,
        "SELECT 1 FROM tasks WHERE key = 'deploy' FOR NO KEY UPDATE",
        async move { alice.call("claim_task", json!({ "key": "deploy" })).await },
        async move { bob.call("claim_task", json!({ "key": "deploy" })).await },
    )
    .await;
    let won = won.expect("alice, first in the queue, claims the task");
    assert_eq!(won["holder"]["address"], "alice/w1", "{won}");
    let refused = lost.unwrap_err();
    assert_eq!(refused["error"], "conflict", "{refused}");
    assert!(
        message(&refused).contains("agent `alice` in window `w1`"),
        "the refusal names the window that won: {refused}"
    );
}
