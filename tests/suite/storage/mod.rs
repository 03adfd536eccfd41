//! Storage counted, capped and pruned: `team usage`, the team quota every
//! write path checks, `team prune` (dry run and `--apply`) and
//! `conversations retention`, through real MCP clients, the operator binary
//! and the `/admin` routes. History is made "old" by moving its timestamps
//! back in the test's own database (test data setup). This file holds what
//! the tests share (reading a usage report, writing through MCP, the old
//! history a prune works on); the tests live in `quota` (usage counted and
//! the quota), `prune` (what a prune removes and keeps, on PostgreSQL and on
//! JetStream) and `surfaces` (the operator binary and the admin routes).

use ai_crew_sync::store::{identity::teams, operations::retention, operations::usage};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{McpClient, TestApp, in_team, test_actor};

mod prune;
mod quota;
mod surfaces;

fn kind<'a>(report: &'a Value, kind: &str) -> &'a Value {
    report["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == kind)
        .unwrap_or_else(|| panic!("no kind {kind} in {report}"))
}

fn rows_bytes(report: &Value, name: &str) -> (i64, i64) {
    let k = kind(report, name);
    (k["rows"].as_i64().unwrap(), k["bytes"].as_i64().unwrap())
}

async fn usage_of(app: &TestApp, team: &str) -> Value {
    serde_json::to_value(usage::usage(&app.pool, &in_team(team)).await.unwrap()).unwrap()
}

async fn count(app: &TestApp, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

fn file(name: &str, bytes: &[u8]) -> Value {
    json!({"filename": name, "content_type": "application/octet-stream",
           "data_base64": STANDARD.encode(bytes)})
}

async fn post(client: &McpClient, args: Value) -> Value {
    client.call("post_message", args).await.unwrap()
}

/// A conversation `owner` creates with `member` invited and joined.
async fn conversation(owner: &McpClient, member: &McpClient, invite: &str) -> Uuid {
    let created = owner
        .call(
            "create_conversation",
            json!({"title": "release", "private": true, "invite": [invite]}),
        )
        .await
        .unwrap();
    let id: Uuid = created["conversation_id"]
        .as_str()
        .or_else(|| created["id"].as_str())
        .unwrap_or_else(|| panic!("no id in {created}"))
        .parse()
        .unwrap();
    member
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    id
}

async fn send(client: &McpClient, conversation: Uuid, body: &str) -> Result<Value, Value> {
    client
        .call(
            "send_conversation_message",
            json!({"conversation_id": conversation, "body": body,
                   "request_id": Uuid::new_v4().to_string()}),
        )
        .await
}

/// A task created, claimed and completed: three events.
async fn finished_task(client: &McpClient, key: &str, title: &str, result: &str) {
    for (tool, args) in [
        ("create_task", json!({"key": key, "title": title})),
        ("claim_task", json!({"key": key})),
        ("complete_task", json!({"key": key, "result": result})),
    ] {
        client.call(tool, args).await.unwrap();
    }
}

async fn team_with_conversations(app: &TestApp, team: &str) {
    app.team(team).await;
    teams::capability(&app.pool, team, Some(true), &test_actor())
        .await
        .unwrap();
}

/// What `prunable_history` lays down, for the checks after a prune.
struct History {
    alice: McpClient,
    bob: McpClient,
    conversation: Uuid,
}

/// Old history of every kind, some of which a reader, a receipt or an open
/// task still needs:
/// - #general m1 (with an attachment) .. m5; bob has read m1..m3, carol all;
/// - a DM to carol she has read, a DM to bob he has not;
/// - a note set three times; a finished task (3 events) and an open one;
/// - a conversation (retention 1 day) with c1 acknowledged and c2 not.
async fn prunable_history(app: &TestApp) -> History {
    team_with_conversations(app, "acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;
    post(
        &alice,
        json!({"channel": "general", "body": "m1", "attachments": [file("a.bin", &[1u8; 100])]}),
    )
    .await;
    for body in ["m2", "m3", "m4", "m5"] {
        post(&alice, json!({"channel": "general", "body": body})).await;
    }
    post(&alice, json!({"to": "carol", "body": "for carol"})).await;
    let read = bob
        .call("read_messages", json!({"limit": 3}))
        .await
        .unwrap();
    assert_eq!(read["messages"].as_array().unwrap().len(), 3);
    post(&alice, json!({"to": "bob", "body": "for bob"})).await;
    carol
        .call("read_messages", json!({"limit": 50}))
        .await
        .unwrap();
    for value in ["v1", "v2", "v3"] {
        alice
            .call("set_note", json!({"key": "plan", "value": value}))
            .await
            .unwrap();
    }
    finished_task(&alice, "done", "done", "ok").await;
    alice
        .call("create_task", json!({"key": "open", "title": "open"}))
        .await
        .unwrap();
    let talk = conversation(&alice, &bob, "bob").await;
    let c1 = send(&alice, talk, "c1 acknowledged").await.unwrap();
    send(&alice, talk, "c2 not acknowledged").await.unwrap();
    bob.call("ack_message", json!({"message_id": c1["message_id"]}))
        .await
        .unwrap();
    retention::set_retention(&app.pool, &in_team("acme"), talk, Some(1))
        .await
        .unwrap();

    for sql in [
        "UPDATE messages SET created_at = now() - interval '40 days'",
        "UPDATE note_revisions SET at = now() - interval '40 days'",
        "UPDATE task_events SET at = now() - interval '40 days'",
        "UPDATE audit_log SET at = now() - interval '40 days'",
        "UPDATE conversation_audit SET at = now() - interval '40 days'",
        "UPDATE conversation_messages SET created_at = now() - interval '10 days'",
    ] {
        sqlx::query(sql).execute(&app.pool).await.unwrap();
    }
    History {
        alice,
        bob,
        conversation: talk,
    }
}
