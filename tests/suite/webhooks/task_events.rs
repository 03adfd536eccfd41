//! Task events reach a team's hooks from every writer of `task_events`: the
//! one-round-trip functions (`claim_next_task`, `claim_task`, `release_task`,
//! `complete_task`), the store's other writes (create, priority,
//! dependencies, cancel) and the bus's own releases. Migration 0050 moved the
//! queueing from a row trigger into those writers; a team without a hook
//! gets no delivery row, and a renewal is never news.

use ai_crew_sync::store::identity::agents;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{Receiver, add, call, hook};
use crate::support::{McpClient, TestApp, in_team, spawn_app};

/// The event and data of every delivery queued for `team`, oldest first.
async fn queued(app: &TestApp, team: &str) -> Vec<(String, Value)> {
    sqlx::query_as(
        "SELECT d.event, d.payload FROM webhook_deliveries d JOIN teams t ON t.id = d.team_id
         WHERE t.slug = $1 ORDER BY d.created_at, d.id",
    )
    .bind(team)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

/// Every kind of task write, by `alice` of `team`; she ends disabled, so the
/// bus releases `held`.
async fn every_task_write(app: &TestApp, team: &str, alice: &McpClient) {
    call(alice, "create_task", json!({"key": "a", "title": "first"})).await;
    call(alice, "create_task", json!({"key": "b", "title": "second"})).await;
    call(
        alice,
        "create_task",
        json!({"key": "held", "title": "third"}),
    )
    .await;
    let next = call(alice, "claim_next_task", json!({})).await;
    assert_eq!(next["task"]["key"], "a", "{next}");
    call(alice, "renew_task_lease", json!({"key": "a"})).await;
    call(alice, "complete_task", json!({"key": "a", "result": "ok"})).await;
    call(alice, "claim_task", json!({"key": "b"})).await;
    call(alice, "release_task", json!({"key": "b"})).await;
    let priority = json!({"key": "b", "priority": "high"});
    call(alice, "set_task_priority", priority).await;
    let dependencies = json!({"key": "b", "depends_on": ["held"]});
    call(alice, "set_task_dependencies", dependencies).await;
    call(
        alice,
        "cancel_task",
        json!({"key": "b", "reason": "not needed"}),
    )
    .await;
    call(alice, "claim_task", json!({"key": "held"})).await;
    agents::set_disabled(&app.pool, &in_team(team), "alice", true)
        .await
        .unwrap();
}

#[tokio::test]
async fn every_task_write_queues_its_event_for_a_team_with_a_hook_only() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.team("quiet").await;
    let receiver = Receiver::start().await;
    add(&app, "acme", hook(&receiver.url(), &["task"])).await;
    let acme = app.mcp(&app.agent("acme", "alice").await, None).await;
    let quiet = app.mcp(&app.agent("quiet", "alice").await, None).await;

    every_task_write(&app, "quiet", &quiet).await;
    every_task_write(&app, "acme", &acme).await;

    assert!(
        queued(&app, "quiet").await.is_empty(),
        "no hook, no delivery"
    );
    let rows = queued(&app, "acme").await;
    let summary: Vec<(String, String, String, String)> = rows
        .iter()
        .map(|(event, data)| {
            let field = |name: &str| data[name].as_str().unwrap_or_default().to_owned();
            (event.clone(), field("key"), field("status"), field("by"))
        })
        .collect();
    let row = |event: &str, key: &str, status: &str| {
        (
            event.to_owned(),
            key.to_owned(),
            status.to_owned(),
            "alice".to_owned(),
        )
    };
    assert_eq!(
        summary,
        [
            row("task.created", "a", "open"),
            row("task.created", "b", "open"),
            row("task.created", "held", "open"),
            row("task.claimed", "a", "claimed"),
            row("task.completed", "a", "done"),
            row("task.claimed", "b", "claimed"),
            row("task.released", "b", "open"),
            row("task.priority_changed", "b", "open"),
            row("task.dependencies_changed", "b", "open"),
            row("task.cancelled", "b", "cancelled"),
            row("task.claimed", "held", "claimed"),
            row("task.released", "held", "open"),
        ],
        "{rows:?}"
    );
    let data = |i: usize| &rows[i].1;
    assert_eq!(data(0)["title"], "first");
    assert_eq!(data(3)["detail"]["via"], "claim_next_task");
    assert_eq!(data(4)["detail"]["result_bytes"], 2);
    assert!(data(4).get("result").is_none(), "never the result");
    assert_eq!(data(5)["detail"]["lease_seconds"], 900);
    assert_eq!(data(11)["detail"]["released_by"], "bus");
    assert_eq!(data(11)["detail"]["why"], "agent_disabled");
    let task_id: Uuid = sqlx::query_scalar(
        "SELECT t.id FROM tasks t JOIN teams m ON m.id = t.team_id
         WHERE m.slug = 'acme' AND t.key = 'held'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(data(11)["task_id"], json!(task_id));
}
