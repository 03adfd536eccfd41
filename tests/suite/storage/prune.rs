//! What a prune removes and keeps: a dry run and its `--apply` report the
//! same, a second dry run finds nothing, history a reader, a receipt, a note
//! or an open task still needs stays, and on JetStream a released
//! conversation message's body is dropped from the broker while an
//! unacknowledged one stays readable.

use ai_crew_sync::store::operations::retention::{self, PruneRequest};
use serde_json::{Value, json};
use uuid::Uuid;

use super::{count, kind, prunable_history, rows_bytes, usage_of};
use crate::jetstream_bus::{Routed, body_stream, sequence};
use crate::support::{McpClient, TestApp, in_team, spawn_app};

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

async fn read_conversation(client: &McpClient, conversation: Uuid) -> Value {
    client
        .call(
            "read_conversation",
            json!({"conversation_id": conversation}),
        )
        .await
        .unwrap()
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
    let app = crate::support::TestApp::builder()
        .broker_at(&url)
        .spawn()
        .await;
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
