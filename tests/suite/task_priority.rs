//! Task priority (issue 38, migration 0049) over MCP: `create_task
//! {priority}`, `claim_next_task` taking the highest priority first and the
//! oldest first within one, `set_task_priority` for the creator from any
//! window (refusals change nothing), the `priority_changed` event, list
//! order; and the store functions the dashboard calls for a person
//! overseeing the team (`set_priority` and `cancel_with` with
//! `Rights::Overseer`).

use std::collections::HashMap;

use ai_crew_sync::auth::{self, AgentCredential, Identity};
use ai_crew_sync::store::identity::tokens;
use ai_crew_sync::store::tasks::{self, Rights, TaskPriority};
use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, globally, spawn_app};

async fn create(client: &McpClient, key: &str, priority: Option<&str>) -> Value {
    let mut args = json!({ "key": key, "title": format!("do {key}") });
    if let Some(priority) = priority {
        args["priority"] = json!(priority);
    }
    client
        .call("create_task", args)
        .await
        .unwrap_or_else(|e| panic!("create {key}: {e}"))
}

async fn claim_next(client: &McpClient) -> Value {
    client
        .call("claim_next_task", json!({}))
        .await
        .unwrap_or_else(|e| panic!("claim_next_task refused: {e}"))
}

async fn set_priority(client: &McpClient, key: &str, priority: &str) -> Result<Value, Value> {
    client
        .call(
            "set_task_priority",
            json!({ "key": key, "priority": priority }),
        )
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

fn kinds(task: &Value) -> Vec<&str> {
    task["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect()
}

/// The task's stored priority, status, holder and event count: a refusal
/// leaves all four as they were.
async fn state(app: &TestApp, key: &str) -> (i16, String, Option<String>, i64) {
    sqlx::query_as(
        "SELECT t.priority, t.status, t.holder_session,
                (SELECT count(*) FROM task_events e WHERE e.task_id = t.id)
         FROM tasks t WHERE t.key = $1",
    )
    .bind(key)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

/// The store's identity for an agent token, as a request resolves it.
async fn identity(app: &TestApp, token: &str, window: &str) -> Identity {
    let AgentCredential::Token(digest) = auth::parse_agent_credential(token).unwrap() else {
        panic!("not an agent token")
    };
    tokens::authenticate(&app.pool, &digest, window.into())
        .await
        .unwrap()
}

#[tokio::test]
async fn set_task_priority_is_listed_and_tasks_show_their_priority() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let names = alice.list_tool_names().await;
    assert!(names.iter().any(|n| n == "set_task_priority"), "{names:?}");

    let plain = create(&alice, "plain", None).await;
    assert_eq!(plain["priority"], "normal", "the default is normal");
    let hot = create(&alice, "hot", Some("urgent")).await;
    assert_eq!(hot["priority"], "urgent");
    assert_eq!(get(&alice, "hot").await["priority"], "urgent");
    let created = &get(&alice, "hot").await["events"][0];
    assert_eq!(created["kind"], "created");
    assert_eq!(created["detail"]["priority"], "urgent");

    let list = alice
        .call("list_tasks", json!({ "status": "open" }))
        .await
        .unwrap();
    let listed: Vec<(&str, &str)> = list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["key"].as_str().unwrap(), t["priority"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [("hot", "urgent"), ("plain", "normal")],
        "open tasks list highest priority first, though `hot` is younger"
    );

    // A priority that is not one of the four words creates nothing.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    for bad in ["5", "asap", ""] {
        let refusal = alice
            .call(
                "create_task",
                json!({ "key": "nope", "title": "nope", "priority": bad }),
            )
            .await
            .unwrap_err();
        assert!(
            message(&refusal).contains("low, normal, high, urgent")
                && message(&refusal).contains("Nothing was created"),
            "{refusal}"
        );
    }
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(after, before);
}

#[tokio::test]
async fn claim_next_takes_the_highest_priority_first_then_the_oldest() {
    let app = spawn_app().await;
    app.team("acme").await;
    let planner = app.mcp(&app.agent("acme", "planner").await, None).await;
    let worker = app.mcp(&app.agent("acme", "worker").await, None).await;
    // Created oldest first, in this order.
    for (key, priority) in [
        ("old-normal", None),
        ("old-low", Some("low")),
        ("high-1", Some("high")),
        ("young-normal", Some("normal")),
        ("high-2", Some("high")),
        ("urgent", Some("urgent")),
    ] {
        create(&planner, key, priority).await;
    }

    let mut order = Vec::new();
    loop {
        let next = claim_next(&worker).await;
        if next["claimed"] == false {
            break;
        }
        order.push(next["task"]["key"].as_str().unwrap().to_string());
    }
    assert_eq!(
        order,
        [
            "urgent",
            "high-1",
            "high-2",
            "old-normal",
            "young-normal",
            "old-low"
        ],
        "urgent before the older normal task; within one priority the oldest first"
    );

    // A lapsed claim goes back in line at its priority.
    sqlx::query(
        "UPDATE tasks SET lease_expires_at = now() - interval '1 second'
         WHERE key IN ('old-low', 'high-2')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(claim_next(&planner).await["task"]["key"], "high-2");
    assert_eq!(claim_next(&planner).await["task"]["key"], "old-low");
}

#[tokio::test]
async fn re_prioritising_moves_a_task_in_the_queue_and_is_recorded() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let w1 = app.mcp(&token, Some("w1")).await;
    let w2 = app.mcp(&token, Some("w2")).await;
    let worker = app.mcp(&app.agent("acme", "worker").await, None).await;
    create(&w1, "first", None).await;
    create(&w1, "second", None).await;

    // The creator, from another window than the one that created it.
    let raised = set_priority(&w2, "second", "urgent").await.unwrap();
    assert_eq!(raised["priority"], "urgent");
    let history = get(&worker, "second").await;
    assert_eq!(kinds(&history), ["created", "priority_changed"]);
    let event = &history["events"][1];
    assert_eq!(event["by"], "alice/w2");
    assert_eq!(event["detail"]["from"], "normal");
    assert_eq!(event["detail"]["to"], "urgent");
    assert_eq!(claim_next(&worker).await["task"]["key"], "second");

    // A claimed task may be re-prioritised too; its holder keeps it.
    let lowered = set_priority(&w1, "second", "low").await.unwrap();
    assert_eq!(lowered["priority"], "low");
    assert_eq!(lowered["status"], "claimed");
    assert_eq!(lowered["holder"]["address"], "worker");

    // The same priority again changes nothing and records nothing.
    let events = state(&app, "second").await.3;
    let same = set_priority(&w1, "second", "LOW").await.unwrap();
    assert_eq!(same["priority"], "low");
    assert_eq!(state(&app, "second").await.3, events);
}

#[tokio::test]
async fn set_task_priority_refusals_change_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    create(&alice, "mine", Some("high")).await;
    create(&alice, "finished", None).await;
    alice
        .call("claim_task", json!({ "key": "finished" }))
        .await
        .unwrap();
    alice
        .call(
            "complete_task",
            json!({ "key": "finished", "result": "done" }),
        )
        .await
        .unwrap();
    create(&alice, "dropped", None).await;
    alice
        .call(
            "cancel_task",
            json!({ "key": "dropped", "reason": "not needed" }),
        )
        .await
        .unwrap();
    let before = [
        state(&app, "mine").await,
        state(&app, "finished").await,
        state(&app, "dropped").await,
    ];

    let not_creator = set_priority(&bob, "mine", "urgent").await.unwrap_err();
    assert!(
        message(&not_creator).contains("only its creator (agent `alice`")
            && message(&not_creator).contains("Nothing was changed"),
        "{not_creator}"
    );
    let done = set_priority(&alice, "finished", "urgent")
        .await
        .unwrap_err();
    assert!(
        message(&done).contains("already done") && message(&done).contains("Nothing was changed"),
        "{done}"
    );
    let cancelled = set_priority(&alice, "dropped", "low").await.unwrap_err();
    assert!(
        message(&cancelled).contains("already cancelled"),
        "{cancelled}"
    );
    for bad in ["7", "critical", ""] {
        let refusal = set_priority(&alice, "mine", bad).await.unwrap_err();
        assert!(
            message(&refusal).contains("low, normal, high, urgent"),
            "{refusal}"
        );
    }
    let missing = set_priority(&alice, "ghost", "low").await.unwrap_err();
    assert!(
        message(&missing).contains("no task with key `ghost`"),
        "{missing}"
    );

    let after = [
        state(&app, "mine").await,
        state(&app, "finished").await,
        state(&app, "dropped").await,
    ];
    assert_eq!(after, before, "no refusal changed a task or its history");
    assert_eq!(get(&bob, "mine").await["priority"], "high");
}

/// The dashboard's calls for a person overseeing the team: the store
/// functions with `Rights::Overseer`, through the same write fence.
#[tokio::test]
async fn an_overseer_re_prioritises_and_cancels_any_unfinished_task_of_the_team() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let carol_token = app.agent("acme", "carol").await;
    let carol = app.mcp(&carol_token, Some("w1")).await;
    let overseer_token = app.agent("acme", "olga").await;
    let olga = identity(&app, &overseer_token, "").await;
    // Every event of this team as the listener hears it, in order.
    let mut heard = app.bus.events.subscribe();
    create(&alice, "held", None).await;
    create(&alice, "waiting", Some("low")).await;
    carol
        .call("claim_task", json!({ "key": "held" }))
        .await
        .unwrap();

    // With an agent's own rights olga may do neither: she neither created
    // the tasks nor holds them.
    let before = state(&app, "waiting").await;
    let refused = tasks::set_priority(&app.bus, &olga, "waiting", "urgent", Rights::Creator)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("only its creator"), "{refused}");
    let refused = tasks::cancel_with(&app.bus, &olga, "held", "stop", Rights::Creator)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("may cancel it"), "{refused}");
    assert_eq!(state(&app, "waiting").await, before);

    // As an overseer she may.
    let raised = tasks::set_priority(&app.bus, &olga, "waiting", "urgent", Rights::Overseer)
        .await
        .unwrap();
    assert_eq!(raised.summary.priority, TaskPriority::Urgent);
    let history = get(&alice, "waiting").await;
    let event = history["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(event["kind"], "priority_changed");
    assert_eq!(event["by"], "olga");
    assert_eq!(event["detail"]["as"], "overseer");
    assert_eq!(event["detail"]["from"], "low");

    // Notifications arrive in order: once olga's priority change is heard,
    // no earlier event (alice's creations, carol's claim) can still reach
    // the wait below and wake it before the cancel.
    loop {
        let event = tokio::time::timeout(std::time::Duration::from_secs(30), heard.recv())
            .await
            .expect("the priority change is heard")
            .unwrap();
        if event.id == "waiting" && event.actor == Some(olga.agent_id) {
            break;
        }
    }
    // The holder, waiting, is woken by the cancel as by cancel_task's.
    let waiting = app.mcp(&carol_token, Some("w1")).await;
    let waiter = tokio::spawn(async move {
        waiting
            .call(
                "wait_for_updates",
                json!({"timeout_seconds": 60, "kinds": ["task"]}),
            )
            .await
            .unwrap()
    });
    app.until_waiting(1).await;
    let cancelled = tasks::cancel_with(
        &app.bus,
        &olga,
        "held",
        "superseded by the new plan",
        Rights::Overseer,
    )
    .await
    .unwrap();
    let woke = waiter.await.unwrap();
    assert_eq!(woke["woke"], true, "{woke}");
    assert_eq!(woke["events"][0]["kind"], "task");
    assert_eq!(woke["events"][0]["id"], "held");
    assert_eq!(woke["events"][0]["by"], "olga");
    assert_eq!(cancelled.task.summary.status.as_str(), "cancelled");
    assert!(cancelled.task.summary.holder.is_none(), "the lease ended");
    assert!(
        cancelled.message.contains("carol/w1"),
        "the answer names the lease that ended: {}",
        cancelled.message
    );
    let seen = get(&carol, "held").await;
    assert_eq!(seen["status"], "cancelled");
    assert_eq!(seen["cancelled_by"], "olga");
    assert_eq!(seen["cancel_reason"], "superseded by the new plan");
    let event = seen["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(event["kind"], "cancelled");
    assert_eq!(event["detail"]["as"], "overseer");
    assert_eq!(event["detail"]["holder"], "carol/w1");
    // The holder learns: completing is refused as for any cancelled task.
    let late = carol
        .call("complete_task", json!({ "key": "held", "result": "x" }))
        .await
        .unwrap_err();
    assert!(message(&late).contains("already cancelled"), "{late}");

    // Finished tasks stay final even for an overseer, and nothing changes.
    let before = state(&app, "held").await;
    let again = tasks::cancel_with(&app.bus, &olga, "held", "again", Rights::Overseer)
        .await
        .unwrap_err()
        .to_string();
    assert!(again.contains("already cancelled"), "{again}");
    let prio = tasks::set_priority(&app.bus, &olga, "held", "high", Rights::Overseer)
        .await
        .unwrap_err()
        .to_string();
    assert!(prio.contains("already cancelled"), "{prio}");
    assert_eq!(state(&app, "held").await, before);
}

#[tokio::test]
async fn an_overseer_whose_token_is_revoked_writes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let olga_token = app.agent("acme", "olga").await;
    let olga = identity(&app, &olga_token, "").await;
    create(&alice, "t1", None).await;
    // Revoked after the request resolved its identity: the write fence in
    // the write's own transaction refuses it.
    tokens::revoke(&app.pool, olga.token_id, &globally())
        .await
        .unwrap();
    let before = state(&app, "t1").await;
    let refused = tasks::set_priority(&app.bus, &olga, "t1", "urgent", Rights::Overseer)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("revoked"), "{refused}");
    let refused = tasks::cancel_with(&app.bus, &olga, "t1", "stop", Rights::Overseer)
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("revoked"), "{refused}");
    assert_eq!(state(&app, "t1").await, before, "the fence ran first");
}

#[tokio::test]
async fn windows_claiming_next_in_parallel_at_mixed_priorities_never_share_a_task() {
    const TASKS: usize = 120;
    const WORDS: [&str; 4] = ["low", "normal", "high", "urgent"];
    let app = spawn_app().await;
    app.team("acme").await;
    let planner = app.mcp(&app.agent("acme", "planner").await, None).await;
    for i in 0..TASKS {
        create(&planner, &format!("t{i:03}"), Some(WORDS[i * 7 % 4])).await;
    }
    // Re-prioritise some while the claimers run, so the index order moves
    // under them.
    let mut workers = tokio::task::JoinSet::new();
    for a in 0..3 {
        let token = app.agent("acme", &format!("agent{a}")).await;
        for w in 0..3 {
            let window = format!("w{w}");
            let client = app.mcp(&token, Some(&window)).await;
            let me = format!("agent{a}/{window}");
            workers.spawn(async move {
                let mut got = Vec::new();
                loop {
                    let next = claim_next(&client).await;
                    if next["claimed"] == false {
                        break;
                    }
                    got.push(next["task"]["key"].as_str().unwrap().to_string());
                }
                (me, got)
            });
        }
    }
    for i in (0..TASKS).step_by(5) {
        // A claimed one is re-prioritised too; a refusal is not expected.
        set_priority(&planner, &format!("t{i:03}"), WORDS[(i + 1) % 4])
            .await
            .unwrap();
    }
    let mut handed_out: HashMap<String, String> = HashMap::new();
    while let Some(joined) = workers.join_next().await {
        let (me, got) = joined.unwrap();
        for key in got {
            if let Some(first) = handed_out.insert(key.clone(), me.clone()) {
                panic!("{key} was handed to both {first} and {me}");
            }
        }
    }
    assert_eq!(
        handed_out.len(),
        TASKS,
        "every task handed out exactly once"
    );
    let claims: i64 = sqlx::query_scalar("SELECT count(*) FROM task_events WHERE kind = 'claimed'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(claims, TASKS as i64);
    let holders: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT t.key, a.name, t.holder_session FROM tasks t
         JOIN agents a ON a.id = t.holder_agent_id WHERE t.status = 'claimed'",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(holders.len(), TASKS);
    for (key, agent, session) in holders {
        assert_eq!(handed_out[&key], format!("{agent}/{session}"));
    }
}
