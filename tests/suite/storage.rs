//! Storage counted, capped and pruned: `team usage`, the team quota every
//! write path checks, `team prune` (dry run and `--apply`) and
//! `conversations retention`, through real MCP clients, the operator binary
//! and the `/admin` routes. History is made "old" by moving its timestamps
//! back in the test's own database (test data setup).

use ai_crew_sync::store::retention::{self, PruneRequest};
use ai_crew_sync::store::{admin, teams, usage};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::Method;

use crate::admin::api;
use crate::cli::{bus, ok_json};
use crate::jetstream_bus::{Routed, body_stream, sequence};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{McpClient, TestApp, in_team, spawn_app, test_actor};

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

async fn prune(app: &TestApp, team: &str, days: i64, audit: Option<i64>, apply: bool) -> Value {
    let request = PruneRequest {
        older_than_days: days,
        audit_older_than_days: audit,
        apply,
    };
    let pruned = retention::prune(
        &app.pool,
        &app.bus.backends,
        &in_team(team),
        &request,
        &|_| {},
    )
    .await
    .unwrap();
    serde_json::to_value(pruned).unwrap()
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

async fn read_conversation(client: &McpClient, conversation: Uuid) -> Value {
    client
        .call(
            "read_conversation",
            json!({"conversation_id": conversation}),
        )
        .await
        .unwrap()
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

#[tokio::test]
async fn usage_counts_exactly_what_was_written() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;

    for body in ["a".repeat(10), "b".repeat(20), "c".repeat(30)] {
        post(&alice, json!({"channel": "general", "body": body})).await;
    }
    post(
        &alice,
        json!({"channel": "general", "body": "with file", "attachments": [file("x.bin", &[7u8; 100])]}),
    )
    .await;
    post(&alice, json!({"to": "bob", "body": "d".repeat(15)})).await;
    for value in ["v1", "value-2"] {
        alice
            .call("set_note", json!({"key": "plan", "value": value}))
            .await
            .unwrap();
    }
    finished_task(&alice, "t1", "T", "done").await;
    let talk = conversation(&alice, &bob, "bob").await;
    send(&alice, talk, &"e".repeat(25)).await.unwrap();

    let used = usage_of(&app, "acme").await;
    assert_eq!(rows_bytes(&used, "channel_messages"), (4, 60 + 9));
    assert_eq!(rows_bytes(&used, "direct_messages"), (1, 15));
    assert_eq!(rows_bytes(&used, "attachments"), (1, 100));
    assert_eq!(rows_bytes(&used, "notes"), (1, 7));
    assert_eq!(rows_bytes(&used, "note_revisions"), (2, 2 + 7));
    // Title "T", metadata `{}`, result "done".
    assert_eq!(rows_bytes(&used, "tasks"), (1, 1 + 2 + 4));
    assert_eq!(kind(&used, "task_events")["rows"], 3);
    assert_eq!(rows_bytes(&used, "conversation_messages_postgres"), (1, 25));
    assert_eq!(rows_bytes(&used, "conversation_messages_jetstream"), (0, 0));
    assert_eq!(kind(&used, "audit")["in_quota"], false);
    let in_quota: i64 = used["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["in_quota"] == true)
        .map(|k| k["bytes"].as_i64().unwrap())
        .sum();
    assert_eq!(used["used_bytes"], in_quota);
    assert_eq!(used["quota_bytes"], 1024 * 1024 * 1024);
    assert_eq!(used["outbox"]["pending"], 0);
    assert_eq!(used["warnings"], json!([]));
    // What the write check reads is the count just made.
    let recorded: i64 = count(
        &app,
        "SELECT storage_bytes_used FROM team_quotas q JOIN teams t ON t.id = q.team_id
          WHERE t.slug = 'acme'",
    )
    .await;
    assert_eq!(Some(recorded), used["used_bytes"].as_i64());
}

/// The rows each write path would add, for "a refusal writes nothing".
async fn written(app: &TestApp) -> Vec<i64> {
    let mut counts = Vec::new();
    for table in [
        "messages",
        "notes",
        "note_revisions",
        "tasks",
        "task_events",
        "attachments",
        "conversation_messages",
    ] {
        counts.push(count(app, &format!("SELECT count(*) FROM {table}")).await);
    }
    counts
}

#[tokio::test]
async fn a_write_past_the_quota_is_refused_naming_quota_usage_and_prune_and_writes_nothing() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    post(
        &alice,
        json!({"channel": "general", "body": "x".repeat(500)}),
    )
    .await;
    let talk = conversation(&alice, &bob, "bob").await;
    alice
        .call("create_task", json!({"key": "open", "title": "T"}))
        .await
        .unwrap();
    alice
        .call("claim_task", json!({"key": "open"}))
        .await
        .unwrap();

    // Room for 50 more bytes.
    let used = usage_of(&app, "acme").await["used_bytes"].as_i64().unwrap();
    let limit = used + 50;
    let quota = usage::quota(&app.pool, "acme", Some(limit), &test_actor())
        .await
        .unwrap();
    assert_eq!(quota.storage_bytes_used, used);
    assert_eq!(quota.attachment_bytes_limit, limit);

    let before = written(&app).await;
    let big = "y".repeat(60);
    let refusals = [
        alice
            .call("post_message", json!({"channel": "general", "body": big}))
            .await,
        alice
            .call("post_message", json!({"to": "bob", "body": big}))
            .await,
        alice
            .call("set_note", json!({"key": "k", "value": "z".repeat(30)}))
            .await,
        alice
            .call("create_task", json!({"key": "t2", "title": big}))
            .await,
        alice
            .call("complete_task", json!({"key": "open", "result": big}))
            .await,
        alice
            .call(
                "attach_file",
                json!({"task": "open", "filename": "f", "content_type": "text/plain",
                       "data_base64": STANDARD.encode(big.as_bytes())}),
            )
            .await,
        send(&alice, talk, &big).await,
    ];
    for refused in refusals {
        let refused = refused.expect_err("over the quota");
        let text = refused["message"].as_str().unwrap();
        assert!(text.contains(&format!("quota is {limit} bytes")), "{text}");
        assert!(text.contains(&format!("{used} are used")), "{text}");
        assert!(text.contains("team prune"), "{text}");
    }
    assert_eq!(written(&app).await, before, "refused writes stored nothing");
    let task = alice
        .call("get_task", json!({"key": "open"}))
        .await
        .unwrap();
    assert_eq!(task["status"], "claimed", "{task}");

    // Under it: accepted.
    post(&alice, json!({"channel": "general", "body": "small"})).await;
    send(&alice, talk, "also small").await.unwrap();
    assert_eq!(
        count(&app, "SELECT count(*) FROM messages").await,
        before[0] + 1
    );
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

#[tokio::test]
async fn a_prune_dry_run_and_its_apply_agree_and_a_second_dry_run_finds_nothing() {
    let app = spawn_app().await;
    prunable_history(&app).await;
    let audit_rows = count(&app, "SELECT count(*) FROM audit_log").await;
    let usage_before = usage_of(&app, "acme").await;

    let dry = prune(&app, "acme", 30, Some(30), false).await;
    assert_eq!(dry["applied"], false);
    assert_eq!(rows_bytes(&dry, "channel_messages"), (3, 6), "m1..m3");
    assert_eq!(rows_bytes(&dry, "message_attachments"), (1, 100));
    assert_eq!(rows_bytes(&dry, "direct_messages"), (1, 9), "carol's");
    assert_eq!(rows_bytes(&dry, "note_revisions"), (2, 4), "v1 and v2");
    assert_eq!(kind(&dry, "task_events")["rows"], 3, "the finished task's");
    assert_eq!(
        rows_bytes(&dry, "conversation_messages_released"),
        (1, 15),
        "c1 only"
    );
    assert_eq!(kind(&dry, "audit")["rows"], audit_rows);
    assert_eq!(
        count(&app, "SELECT count(*) FROM messages").await,
        7,
        "a dry run removes nothing"
    );

    let applied = prune(&app, "acme", 30, Some(30), true).await;
    assert_eq!(applied["applied"], true);
    assert_eq!(applied["kinds"], dry["kinds"], "the same numbers");
    assert_eq!(applied["total_bytes"], dry["total_bytes"]);

    let again = prune(&app, "acme", 30, Some(30), false).await;
    for k in again["kinds"].as_array().unwrap() {
        assert_eq!(k["rows"], 0, "{again}");
    }

    // The prune is audited with its counts, and usage dropped by what went.
    let detail: Value = sqlx::query_scalar(
        "SELECT detail FROM audit_log WHERE action = 'team.prune' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(detail["total_rows"], applied["total_rows"]);
    let after = usage_of(&app, "acme").await;
    assert_eq!(applied["used_bytes_after"], after["used_bytes"]);
    assert_eq!(kind(&after, "channel_messages")["rows"], 2);
    assert_eq!(kind(&after, "attachments")["rows"], 0);
    assert_eq!(
        after["used_bytes"].as_i64().unwrap(),
        usage_before["used_bytes"].as_i64().unwrap()
            - (6 + 100 + 9 + 4 + 15)
            - kind(&dry, "task_events")["bytes"].as_i64().unwrap()
    );
    let attachment_used: i64 = count(
        &app,
        "SELECT attachment_bytes_used FROM team_quotas q JOIN teams t ON t.id = q.team_id
          WHERE t.slug = 'acme'",
    )
    .await;
    assert_eq!(attachment_used, 0, "the attachment's bytes left the quota");
}

fn bodies(page: &Value) -> Vec<String> {
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_prune_keeps_what_readers_receipts_notes_and_open_tasks_still_need() {
    let app = spawn_app().await;
    let history = prunable_history(&app).await;
    let channels_before = history.bob.call("list_channels", json!({})).await.unwrap();

    prune(&app, "acme", 30, None, true).await;

    // bob is behind the cut: his unread messages are all still there, his
    // unread count unchanged, only the channel's message count dropped.
    let channels = history.bob.call("list_channels", json!({})).await.unwrap();
    let general = |v: &Value| {
        v["channels"]
            .as_array()
            .or_else(|| v.as_array())
            .unwrap()
            .iter()
            .find(|c| c["name"] == "general")
            .unwrap()
            .clone()
    };
    assert_eq!(general(&channels)["unread"], 2);
    assert_eq!(
        general(&channels)["unread"],
        general(&channels_before)["unread"]
    );
    assert_eq!(general(&channels)["messages"], 2);
    let unread = history.bob.call("read_messages", json!({})).await.unwrap();
    assert_eq!(bodies(&unread), ["m4", "m5", "for bob"]);
    let latest = history
        .bob
        .call("read_messages", json!({"only_new": false, "limit": 10}))
        .await
        .unwrap();
    assert_eq!(latest["messages"].as_array().unwrap().len(), 3);

    // The unacknowledged conversation message is kept; the acknowledged one
    // reads as released, its seq still there.
    let page = read_conversation(&history.bob, history.conversation).await;
    let messages = page["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{page}");
    assert_eq!(messages[0]["seq"], 1);
    assert_eq!(messages[0]["unavailable"]["reason"], "tombstoned", "{page}");
    assert!(
        messages[0]["unavailable"]["detail"]
            .as_str()
            .unwrap()
            .contains("retention"),
        "{page}"
    );
    assert_eq!(messages[1]["body"], "c2 not acknowledged");

    // The note's current value and the open task with its history stay.
    let note = history
        .alice
        .call("get_note", json!({"key": "plan"}))
        .await
        .unwrap();
    assert_eq!(note["value"], "v3", "{note}");
    let open = history
        .alice
        .call("get_task", json!({"key": "open"}))
        .await
        .unwrap();
    assert_eq!(open["status"], "open");
    assert_eq!(
        count(
            &app,
            "SELECT count(*) FROM task_events e JOIN tasks t ON t.id = e.task_id
              WHERE t.key = 'open'"
        )
        .await,
        1
    );
    assert_eq!(
        count(&app, "SELECT count(*) FROM tasks").await,
        2,
        "tasks themselves are never pruned"
    );
}

#[tokio::test]
async fn the_operator_binary_shows_usage_sets_quota_and_retention_and_prunes() {
    let app = spawn_app().await;
    let history = prunable_history(&app).await;
    let db = app.database_url.clone();
    let talk = history.conversation.to_string();

    let used = ok_json(&db, &["team", "usage", "--team", "acme", "--json"]);
    assert_eq!(kind(&used, "channel_messages")["rows"], 5);
    assert_eq!(kind(&used, "direct_messages")["rows"], 2);
    let shown = bus(&db, &["team", "usage", "--team", "acme"]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("\nchannel_messages "), "{shown}");
    assert!(
        shown.contains(&format!("{} of 1073741824 bytes used", used["used_bytes"])),
        "{shown}"
    );

    let quota = ok_json(
        &db,
        &[
            "team", "quota", "--team", "acme", "--bytes", "100000", "--json",
        ],
    );
    assert_eq!(quota["attachment_bytes_limit"], 100000);
    assert_eq!(quota["storage_bytes_limit"], 100000);
    assert_eq!(quota["storage_bytes_used"], used["used_bytes"]);

    let set = ok_json(
        &db,
        &[
            "conversations",
            "retention",
            "--team",
            "acme",
            "--conversation",
            &talk,
            "--days",
            "2",
            "--json",
        ],
    );
    assert_eq!(set["retention_days"], 2);
    let refused = bus(
        &db,
        &[
            "conversations",
            "retention",
            "--team",
            "acme",
            "--conversation",
            &talk,
            "--days",
            "0",
        ],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("1 to 36500"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let shown = bus(
        &db,
        &[
            "team",
            "prune",
            "--team",
            "acme",
            "--older-than-days",
            "30",
            "--audit-older-than-days",
            "30",
        ],
    );
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("dry run, nothing removed"), "{shown}");
    assert!(shown.contains("\nchannel_messages   "), "{shown}");

    let dry = ok_json(
        &db,
        &[
            "team",
            "prune",
            "--team",
            "acme",
            "--older-than-days",
            "30",
            "--json",
        ],
    );
    assert_eq!(dry["applied"], false);
    assert_eq!(kind(&dry, "channel_messages")["rows"], 3);
    let applied = ok_json(
        &db,
        &[
            "team",
            "prune",
            "--team",
            "acme",
            "--older-than-days",
            "30",
            "--apply",
            "--json",
        ],
    );
    assert_eq!(applied["kinds"], dry["kinds"]);
    let text = bus(
        &db,
        &["team", "prune", "--team", "acme", "--older-than-days", "30"],
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("dry run, nothing removed"), "{text}");
    assert!(text.contains("total: 0 rows, 0 bytes"), "{text}");

    let out = bus(
        &db,
        &["team", "prune", "--team", "acme", "--older-than-days=-1"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("from 0 to 36500"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_admin_routes_show_usage_and_prune_within_the_credential_scope() {
    let app = spawn_app().await;
    prunable_history(&app).await;
    app.team("other").await;
    let root = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;
    let (_, granted) = api(
        &app,
        &root,
        Method::POST,
        "/admin/credentials",
        Some(json!({"team": "other"})),
    )
    .await;
    let other_only = granted["credential"].as_str().unwrap().to_owned();

    let (status, used) = api(&app, &root, Method::GET, "/admin/teams/acme/usage", None).await;
    assert_eq!(status, 200, "{used}");
    assert_eq!(kind(&used, "channel_messages")["rows"], 5);

    let (status, dry) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/prune",
        Some(json!({"older_than_days": 30})),
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["applied"], false);
    let (status, applied) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/prune",
        Some(json!({"older_than_days": 30, "apply": true})),
    )
    .await;
    assert_eq!(status, 200, "{applied}");
    assert_eq!(applied["kinds"], dry["kinds"]);

    let (status, refused) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/prune",
        Some(json!({"older_than_days": 30, "everything": true})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    let (status, _) = api(
        &app,
        &other_only,
        Method::GET,
        "/admin/teams/acme/usage",
        None,
    )
    .await;
    assert_eq!(status, 403, "a credential of another team");
    let actor: String = sqlx::query_scalar(
        "SELECT actor FROM audit_log WHERE action = 'team.prune' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(actor.starts_with("admin:"), "{actor}");
}

/// Every reference the inbox owes `client`, fetched and confirmed.
async fn take_inbox(client: &McpClient) {
    let fetched = crate::inbox::fetch(client).await;
    let ids = crate::inbox::delivery_ids(&fetched);
    client
        .call("confirm_inbox_delivery", json!({"delivery_ids": ids}))
        .await
        .unwrap();
}

// A release on JetStream goes through the backend's retention path: the
// acknowledged, delivered message's body leaves the team's body stream; the
// unacknowledged one stays readable there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_jetstream_message_has_its_body_dropped_from_the_broker() {
    let url = crate::support::nats::nats_url();
    let app = crate::support::spawn_app_with_broker(&url).await;
    let t = Routed::new(&app, "jsr").await;
    let released = t.send("acknowledged, then released").await;
    let kept = t.send("still unacknowledged").await;
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&[released, kept]).await;
    workers.stop().await;
    t.bob
        .call("ack_message", json!({"message_id": released}))
        .await
        .unwrap();
    take_inbox(&t.bob).await;
    take_inbox(&t.alice).await;
    retention::set_retention(&app.pool, &in_team("jsr"), t.conversation_id, Some(1))
        .await
        .unwrap();
    sqlx::query("UPDATE conversation_messages SET created_at = now() - interval '10 days'")
        .execute(&app.pool)
        .await
        .unwrap();

    let dry = prune(&app, "jsr", 30, None, false).await;
    assert_eq!(
        rows_bytes(&dry, "conversation_messages_released"),
        (1, "acknowledged, then released".len() as i64)
    );
    let applied = prune(&app, "jsr", 30, None, true).await;
    assert_eq!(applied["kinds"], dry["kinds"]);
    assert_eq!(applied["broker"]["dropped"], 1, "{applied}");
    assert_eq!(applied["broker"]["waiting"], 0, "{applied}");

    let stream = body_stream(&url, t.team_id).await;
    assert!(
        stream
            .get_raw_message(sequence(t.team_id, &locators[0]))
            .await
            .is_err(),
        "the released body left the stream"
    );
    assert!(
        stream
            .get_raw_message(sequence(t.team_id, &locators[1]))
            .await
            .is_ok()
    );
    let page = read_conversation(&t.bob, t.conversation_id).await;
    let messages = page["messages"].as_array().unwrap();
    assert_eq!(messages[0]["unavailable"]["reason"], "tombstoned", "{page}");
    assert_eq!(messages[1]["body"], "still unacknowledged", "{page}");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}
