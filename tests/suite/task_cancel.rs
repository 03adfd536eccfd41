//! Cancelling tasks and re-pointing what waits on them, over MCP: who may
//! cancel (the creator from any window, the window holding the live lease),
//! who may not, finished tasks refused, the event kept, waiters woken, and a
//! dependent of a cancelled task blocked with the reason shown until its
//! creator re-points or cancels it.

use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, eventually, spawn_app};

async fn create(client: &McpClient, key: &str, depends_on: &[&str]) -> Value {
    client
        .call(
            "create_task",
            json!({ "key": key, "title": format!("do {key}"), "depends_on": depends_on }),
        )
        .await
        .unwrap_or_else(|e| panic!("create {key}: {e}"))
}

async fn cancel(client: &McpClient, key: &str, reason: &str) -> Result<Value, Value> {
    client
        .call("cancel_task", json!({ "key": key, "reason": reason }))
        .await
}

async fn get(client: &McpClient, key: &str) -> Value {
    client
        .call("get_task", json!({ "key": key }))
        .await
        .unwrap()
}

fn message(refusal: &Value) -> &str {
    refusal["message"].as_str().unwrap_or_default()
}

/// The task's row and its event count, to show a refusal changed nothing.
async fn state(app: &TestApp, key: &str) -> (String, Option<String>, i64, i64) {
    sqlx::query_as(
        "SELECT t.status, t.holder_session,
                (SELECT count(*) FROM task_events e WHERE e.task_id = t.id),
                (SELECT count(*) FROM task_dependencies d WHERE d.task_id = t.id)
         FROM tasks t WHERE t.key = $1",
    )
    .bind(key)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn cancel_and_set_dependencies_are_listed() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let names = app.mcp(&token, None).await.list_tool_names().await;
    for tool in ["cancel_task", "set_task_dependencies"] {
        assert!(names.iter().any(|n| n == tool), "{tool} missing: {names:?}");
    }
}

#[tokio::test]
async fn the_creator_cancels_an_open_task_from_another_window_and_a_waiter_wakes() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let w1 = app.mcp(&alice, Some("w1")).await;
    let w2 = app.mcp(&alice, Some("w2")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    create(&w1, "typo-fix", &[]).await;

    // The creating window waits on task changes: its own create never wakes
    // it (a late notification of it cannot either), so only the cancel can.
    // 3 s is under the wait's database re-check (30 s while events flow): only the cancel's
    // wake-up event can end the wait in time.
    let waiter = tokio::spawn(async move {
        let woke = w1
            .call(
                "wait_for_updates",
                json!({"timeout_seconds": 3, "kinds": ["task"]}),
            )
            .await
            .unwrap();
        (w1, woke)
    });
    app.until_waiting(1).await;

    let cancelled = cancel(
        &w2,
        "typo-fix",
        "created by mistake: duplicate of fix-login",
    )
    .await
    .unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["cancelled_by"], "alice/w2");
    assert_eq!(
        cancelled["cancel_reason"],
        "created by mistake: duplicate of fix-login"
    );
    assert!(cancelled["cancelled_at"].is_string(), "{cancelled}");
    assert_eq!(cancelled["dependents"], json!([]));
    assert!(
        message(&cancelled).contains("nobody can claim or complete it"),
        "{cancelled}"
    );

    let (_w1, woke) = waiter.await.unwrap();
    assert_eq!(woke["woke"], true, "{woke}");
    assert_eq!(woke["events"][0]["kind"], "task");
    assert_eq!(woke["events"][0]["id"], "typo-fix");
    assert_eq!(woke["events"][0]["by"], "alice/w2");

    // Everyone sees it cancelled, with its history.
    let seen = get(&bob, "typo-fix").await;
    assert_eq!(seen["status"], "cancelled");
    assert_eq!(seen["cancelled_by"], "alice/w2");
    let last = seen["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["kind"], "cancelled");
    assert_eq!(last["by"], "alice/w2");
    assert_eq!(
        last["detail"]["reason"],
        "created by mistake: duplicate of fix-login"
    );
    assert_eq!(seen["events_total"], 2);
    let listed = bob
        .call("list_tasks", json!({"status": "cancelled"}))
        .await
        .unwrap();
    assert_eq!(listed["tasks"][0]["key"], "typo-fix");
    assert_eq!(listed["tasks"][0]["cancelled_by"], "alice/w2");
    let open = bob
        .call("list_tasks", json!({"status": "open"}))
        .await
        .unwrap();
    assert_eq!(open["count"], 0, "{open}");

    // It is out of the queue.
    let refused = bob
        .call("claim_task", json!({"key": "typo-fix"}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(
        message(&refused).contains("already cancelled (cancelled by alice/w2"),
        "{refused}"
    );
    let none = bob.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(none["claimed"], false, "{none}");
}

#[tokio::test]
async fn the_lease_holder_may_cancel_and_a_third_agent_or_a_sibling_window_may_not() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob_token = app.agent("acme", "bob").await;
    let bob_w1 = app.mcp(&bob_token, Some("w1")).await;
    let bob_w2 = app.mcp(&bob_token, Some("w2")).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;
    create(&alice, "flaky", &[]).await;
    create(&alice, "spike", &[]).await;
    bob_w1
        .call("claim_task", json!({"key": "flaky"}))
        .await
        .unwrap();

    // A third agent is refused, and so is the holder's sibling window.
    let before = state(&app, "flaky").await;
    let refused = cancel(&carol, "flaky", "not needed").await.unwrap_err();
    assert_eq!(refused["error"], "forbidden", "{refused}");
    assert!(message(&refused).contains("created by alice"), "{refused}");
    assert!(message(&refused).contains("window `w1`"), "{refused}");
    assert!(
        message(&refused).contains("Nothing was changed"),
        "{refused}"
    );
    let refused = cancel(&bob_w2, "flaky", "not needed").await.unwrap_err();
    assert_eq!(refused["error"], "forbidden", "{refused}");
    assert!(
        message(&refused).contains("a claim belongs to the window that took it"),
        "{refused}"
    );
    // Nobody holds `spike`: only its creator may cancel it.
    let refused = cancel(&carol, "spike", "not needed").await.unwrap_err();
    assert_eq!(refused["error"], "forbidden", "{refused}");
    assert!(
        message(&refused).contains("nobody holds a live lease"),
        "{refused}"
    );
    assert_eq!(
        state(&app, "flaky").await,
        before,
        "refusals change nothing"
    );
    assert_eq!(get(&carol, "spike").await["status"], "open");

    // The holding window gives the work up; its lease ends with it.
    let cancelled = cancel(&bob_w1, "flaky", "cannot reproduce").await.unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["holder"].is_null(), "{cancelled}");
    assert_eq!(cancelled["cancelled_by"], "bob/w1");
    let history = get(&alice, "flaky").await;
    let last = history["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["kind"], "cancelled");
    assert_eq!(last["detail"]["holder"], "bob/w1");
    let whoami = bob_w1.call("whoami", json!({})).await.unwrap();
    assert_eq!(whoami["open_claimed_tasks"], 0, "{whoami}");

    // The creator may cancel a task another window holds: the holder is
    // told when it tries to finish it.
    bob_w1
        .call("claim_task", json!({"key": "spike"}))
        .await
        .unwrap();
    let cancelled = cancel(&alice, "spike", "the design changed").await.unwrap();
    assert!(
        message(&cancelled).contains("The live lease of agent `bob` in window `w1`"),
        "{cancelled}"
    );
    let refused = bob_w1
        .call("complete_task", json!({"key": "spike", "result": "done"}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(
        message(&refused).contains("cancelled (cancelled by alice at"),
        "{refused}"
    );
    assert!(
        message(&refused).contains("the design changed"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_finished_task_cannot_be_cancelled_and_bad_reasons_are_refused() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    create(&alice, "done-task", &[]).await;
    alice
        .call("claim_task", json!({"key": "done-task"}))
        .await
        .unwrap();
    alice
        .call(
            "complete_task",
            json!({"key": "done-task", "result": "shipped"}),
        )
        .await
        .unwrap();
    let before = state(&app, "done-task").await;
    let refused = cancel(&alice, "done-task", "oops").await.unwrap_err();
    assert_eq!(refused["error"], "conflict", "{refused}");
    assert!(
        message(&refused).contains("already done (completed by alice/w1"),
        "{refused}"
    );
    assert_eq!(state(&app, "done-task").await, before);
    assert_eq!(get(&alice, "done-task").await["status"], "done");

    create(&alice, "twice", &[]).await;
    cancel(&alice, "twice", "first time").await.unwrap();
    let before = state(&app, "twice").await;
    let refused = cancel(&alice, "twice", "second time").await.unwrap_err();
    assert_eq!(refused["error"], "conflict", "{refused}");
    assert!(message(&refused).contains("already cancelled"), "{refused}");
    assert!(message(&refused).contains("first time"), "{refused}");
    assert_eq!(state(&app, "twice").await, before);
    assert_eq!(get(&alice, "twice").await["cancel_reason"], "first time");

    create(&alice, "kept", &[]).await;
    let before = state(&app, "kept").await;
    let blank = cancel(&alice, "kept", "  \n").await.unwrap_err();
    assert_eq!(blank["error"], "invalid", "{blank}");
    assert!(message(&blank).contains("reason is required"), "{blank}");
    let long = cancel(&alice, "kept", &"x".repeat(4097)).await.unwrap_err();
    assert_eq!(long["error"], "invalid", "{long}");
    assert!(message(&long).contains("4096"), "{long}");
    assert_eq!(state(&app, "kept").await, before);
    let unknown = cancel(&alice, "nope", "x").await.unwrap_err();
    assert_eq!(unknown["error"], "not_found", "{unknown}");
}

#[tokio::test]
async fn a_dependent_of_a_cancelled_task_shows_it_stays_blocked_and_its_creator_repoints_or_cancels_it()
 {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    create(&bob, "schema", &[]).await;
    create(&alice, "deploy", &["schema"]).await;
    create(&alice, "docs", &["schema"]).await;

    // Bob cancels what he created; the answer names who is left waiting.
    let cancelled = cancel(&bob, "schema", "replaced by schema-v2")
        .await
        .unwrap();
    assert_eq!(cancelled["dependents"], json!(["deploy", "docs"]));
    assert_eq!(cancelled["dependents_total"], 2);
    assert!(
        message(&cancelled).contains("set_task_dependencies"),
        "{cancelled}"
    );

    // The dependent says why it waits, and is not claimable.
    let deploy = get(&bob, "deploy").await;
    assert_eq!(deploy["status"], "open");
    assert_eq!(deploy["blocked_by"], json!(["schema"]));
    assert_eq!(deploy["blocked_by_cancelled"], json!(["schema"]));
    let listed = bob
        .call("list_tasks", json!({"status": "open"}))
        .await
        .unwrap();
    assert_eq!(
        listed["tasks"][0]["blocked_by_cancelled"],
        json!(["schema"])
    );
    let refused = bob
        .call("claim_task", json!({"key": "deploy"}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(
        message(&refused).contains("`schema` (cancelled)"),
        "{refused}"
    );
    assert!(
        message(&refused).contains("its creator (alice) re-points"),
        "{refused}"
    );
    let none = bob.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(none["claimed"], false, "{none}");
    assert!(
        message(&none).contains("2 of them wait on a cancelled task"),
        "{none}"
    );

    // A new task cannot wait on a cancelled one.
    let refused = bob
        .call(
            "create_task",
            json!({"key": "late", "title": "late", "depends_on": ["schema"]}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "invalid", "{refused}");
    assert!(
        message(&refused).contains("cancelled tasks: `schema`"),
        "{refused}"
    );
    assert!(
        message(&refused).contains("Nothing was created"),
        "{refused}"
    );

    // Only the dependent's creator re-points it.
    create(&bob, "schema-v2", &[]).await;
    let before = state(&app, "deploy").await;
    let refused = bob
        .call(
            "set_task_dependencies",
            json!({"key": "deploy", "depends_on": ["schema-v2"]}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden", "{refused}");
    assert!(message(&refused).contains("created by alice"), "{refused}");
    let refused = bob
        .call("cancel_task", json!({"key": "deploy", "reason": "moot"}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden", "{refused}");
    // Nor onto a cancelled task, or a missing one.
    for bad in [json!(["schema-v2", "schema"]), json!(["schema-v3"])] {
        let refused = alice
            .call(
                "set_task_dependencies",
                json!({"key": "deploy", "depends_on": bad}),
            )
            .await
            .unwrap_err();
        assert_eq!(refused["error"], "invalid", "{refused}");
        assert!(
            message(&refused).contains("Nothing was changed"),
            "{refused}"
        );
    }
    assert_eq!(state(&app, "deploy").await, before);

    let repointed = alice
        .call(
            "set_task_dependencies",
            json!({"key": "deploy", "depends_on": ["schema-v2"]}),
        )
        .await
        .unwrap();
    assert_eq!(repointed["depends_on"], json!(["schema-v2"]));
    assert_eq!(repointed["blocked_by"], json!(["schema-v2"]));
    assert_eq!(repointed["blocked_by_cancelled"], json!([]));
    let history = get(&bob, "deploy").await;
    let last = history["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["kind"], "dependencies_changed");
    assert_eq!(last["by"], "alice");
    assert_eq!(
        last["detail"],
        json!({"from": ["schema"], "to": ["schema-v2"]})
    );

    // The same list again is not a change.
    alice
        .call(
            "set_task_dependencies",
            json!({"key": "deploy", "depends_on": ["schema-v2"]}),
        )
        .await
        .unwrap();
    assert_eq!(
        get(&bob, "deploy").await["events_total"],
        history["events_total"]
    );

    // A re-point that would close a cycle is refused.
    let refused = bob
        .call(
            "set_task_dependencies",
            json!({"key": "schema-v2", "depends_on": ["deploy"]}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "invalid", "{refused}");
    assert!(
        message(&refused).contains("`deploy` already depends on `schema-v2`"),
        "{refused}"
    );
    assert_eq!(get(&bob, "schema-v2").await["depends_on"], json!([]));

    // The other dependent is cancelled by its creator instead.
    let docs = cancel(&alice, "docs", "schema is gone").await.unwrap();
    assert_eq!(docs["status"], "cancelled");

    // The replacement done, the re-pointed task is the next ready one.
    bob.call("claim_task", json!({"key": "schema-v2"}))
        .await
        .unwrap();
    bob.call(
        "complete_task",
        json!({"key": "schema-v2", "result": "migrated"}),
    )
    .await
    .unwrap();
    let next = bob.call("claim_next_task", json!({})).await.unwrap();
    assert_eq!(next["claimed"], true, "{next}");
    assert_eq!(next["task"]["key"], "deploy");

    // A claimed task's dependencies do not move under its holder.
    let refused = alice
        .call(
            "set_task_dependencies",
            json!({"key": "deploy", "depends_on": []}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict", "{refused}");
    assert!(
        message(&refused).contains("claimed by agent `bob`"),
        "{refused}"
    );
}

#[tokio::test]
async fn two_re_points_at_once_never_close_a_cycle() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let w1 = app.mcp(&token, Some("w1")).await;
    let w2 = app.mcp(&token, Some("w2")).await;
    // Each pair: x waits on y and y on x, asked at the same moment. Each
    // check alone passes (the other's edge is not committed yet); only the
    // team-wide lock makes the second see the first.
    for i in 0..20 {
        let (x, y) = (format!("x{i}"), format!("y{i}"));
        create(&w1, &x, &[]).await;
        create(&w1, &y, &[]).await;
        let (first, second) = tokio::join!(
            w1.call(
                "set_task_dependencies",
                json!({"key": x, "depends_on": [y]})
            ),
            w2.call(
                "set_task_dependencies",
                json!({"key": y, "depends_on": [x]})
            ),
        );
        assert!(
            first.is_ok() != second.is_ok(),
            "pair {i}: exactly one of the two may pass: {first:?} / {second:?}"
        );
        let refused = first.err().or(second.err()).unwrap();
        assert!(message(&refused).contains("cycle"), "{refused}");
    }
    let cycles: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM task_dependencies a JOIN task_dependencies b
           ON a.task_id = b.depends_on_id AND a.depends_on_id = b.task_id",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(cycles, 0);
}

// A claim that waited behind a re-point reads the dependencies it committed.
// The re-point is held open by hand, exactly as `set_task_dependencies` holds
// it (the team's dependency lock exclusively, then the task's row), so the
// claim is known to be waiting inside it when it commits. A claim that only
// queued on the row lock would decide on its statement's older snapshot and
// take a task whose new dependency is still open.
#[tokio::test]
async fn a_claim_waiting_behind_a_re_point_sees_the_new_dependency() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    create(&alice, "dep", &[]).await;
    create(&alice, "work", &[]).await;

    let mut repoint = app.pool.begin().await.unwrap();
    sqlx::query(
        "SELECT pg_advisory_xact_lock(x'41435364'::int, hashtext(id::text)) FROM teams
         WHERE slug = 'acme'",
    )
    .execute(&mut *repoint)
    .await
    .unwrap();
    sqlx::query("SELECT 1 FROM tasks WHERE key = 'work' FOR NO KEY UPDATE")
        .execute(&mut *repoint)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO task_dependencies (team_id, task_id, depends_on_id)
         SELECT w.team_id, w.id, d.id FROM tasks w JOIN tasks d ON d.team_id = w.team_id
         WHERE w.key = 'work' AND d.key = 'dep'",
    )
    .execute(&mut *repoint)
    .await
    .unwrap();

    let mut claim =
        tokio::spawn(async move { bob.call("claim_task", json!({"key": "work"})).await });
    eventually(
        "the claim to wait on a lock the re-point holds",
        async || {
            let waiting: i64 =
                sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE NOT granted")
                    .fetch_one(&app.pool)
                    .await
                    .unwrap();
            if waiting > 0 {
                return true;
            }
            assert!(
                !claim.is_finished(),
                "the claim did not wait: {:?}",
                (&mut claim).await
            );
            false
        },
    )
    .await;
    repoint.commit().await.unwrap();

    let refused = claim
        .await
        .unwrap()
        .expect_err("a task whose dependency is open was claimed");
    assert!(message(&refused).contains("`dep`"), "{refused}");
    assert_eq!(state(&app, "work").await.0, "open");
}
