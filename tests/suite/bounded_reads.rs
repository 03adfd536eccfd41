//! Read tools bounded by their page (issue 19): the same answers as before
//! on the same data, and the shapes that changed to stay bounded: the inbox
//! handed out across several top-up steps, its status counts that stop at
//! 50 (one fetch page) and say "at least", a note search ranked among the most recent
//! matches, task listings read from their indexes.

use serde_json::{Value, json};

use ai_crew_sync::store::conversations::inbox::COUNTED_MAX;

use crate::inbox::{delivery_ids, pair};
use crate::support::spawn_app;

/// One page of at most 50 references for `client`: the answer and its seqs.
async fn fetch_page(client: &crate::support::McpClient) -> (Value, Vec<i64>) {
    let page = client
        .call("fetch_conversation_inbox", json!({"limit": 50}))
        .await
        .unwrap();
    let seqs = page["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["seq"].as_i64().unwrap())
        .collect();
    (page, seqs)
}

/// Hand out everything owed to `client` a page at a time, confirming each
/// page; returns the seqs in the order they were handed out.
async fn drain_inbox(client: &crate::support::McpClient) -> Vec<i64> {
    let mut seqs = Vec::new();
    for _ in 0..100 {
        let (page, page_seqs) = fetch_page(client).await;
        seqs.extend(page_seqs);
        let ids = delivery_ids(&page);
        if !ids.is_empty() {
            client
                .call("confirm_inbox_delivery", json!({"delivery_ids": ids}))
                .await
                .unwrap();
        }
        if page["more"] == false && ids.is_empty() {
            return seqs;
        }
    }
    panic!("the inbox never ran dry: {} handed out", seqs.len());
}

async fn inbox_status(client: &crate::support::McpClient) -> Value {
    client
        .call("conversation_inbox_status", json!({}))
        .await
        .unwrap()
}

#[tokio::test]
async fn an_inbox_backlog_past_one_top_up_step_is_handed_out_whole_in_seq_order() {
    let p = pair().await;
    // Past one top-up step (100) and past the status's cap (50).
    let sent = 130;
    for i in 0..sent {
        p.send(&format!("message {i}")).await;
    }
    // Before any fetch: every receipt is owed, counted up to the cap.
    let status = inbox_status(&p.bob).await;
    assert_eq!(status["owed"], COUNTED_MAX, "{status}");
    assert_eq!(status["owed_at_least"], true, "{status}");

    // One fetch queues at most one step (100 messages) and says there is more.
    let (first, mut seqs) = fetch_page(&p.bob).await;
    assert_eq!(seqs, (1..=50).collect::<Vec<_>>());
    assert_eq!(first["more"], true);
    let status = inbox_status(&p.bob).await;
    assert_eq!(
        (
            &status["owed"],
            &status["owed_at_least"],
            &status["handed_out"]
        ),
        (&json!(COUNTED_MAX), &json!(true), &json!(50)),
        "{status}"
    );
    confirm(&p.bob, &first).await;
    let (second, page_seqs) = fetch_page(&p.bob).await;
    assert_eq!(page_seqs, (51..=100).collect::<Vec<_>>());
    seqs.extend(page_seqs);
    confirm(&p.bob, &second).await;

    // Under the cap the count is exact: the 30 receipts past the walk's
    // mark are owed though no reference names them yet ...
    let status = inbox_status(&p.bob).await;
    assert_eq!(status["owed"], sent - 100, "{status}");
    assert!(status.get("owed_at_least").is_none(), "{status}");
    // ... and the same once the next fetch has queued their references.
    let (third, page_seqs) = fetch_page(&p.bob).await;
    seqs.extend(page_seqs);
    let status = inbox_status(&p.bob).await;
    assert_eq!(
        (status["owed"].as_i64(), status["handed_out"].as_i64()),
        (Some(sent - 100), Some(sent - 100)),
        "{status}"
    );
    confirm(&p.bob, &third).await;

    seqs.extend(drain_inbox(&p.bob).await);
    assert_eq!(
        seqs,
        (1..=sent).collect::<Vec<_>>(),
        "each once, in seq order"
    );
    assert_eq!(inbox_status(&p.bob).await["owed"], 0);
    // Messages sent after the walk reached the end are owed too.
    p.send("late").await;
    assert_eq!(drain_inbox(&p.bob).await, vec![sent + 1]);
}

async fn confirm(client: &crate::support::McpClient, page: &Value) {
    client
        .call(
            "confirm_inbox_delivery",
            json!({"delivery_ids": delivery_ids(page)}),
        )
        .await
        .unwrap();
}

/// Add `count` stored messages from the conversation's owner to `p`'s
/// conversation with a receipt for bob's seat, as synchronous sends write
/// them (set-based: a thousand sends over MCP take too long here).
async fn seed_owed_messages(p: &crate::inbox::Pair, count: i64) {
    let mut tx = p.app.pool.begin().await.unwrap();
    sqlx::query(
        "WITH c AS (
             UPDATE conversations SET last_seq = last_seq + $2 WHERE id = $1
             RETURNING team_id, last_seq - $2 AS base)
         INSERT INTO conversation_messages
             (id, team_id, conversation_id, seq, sender_member_id, sender_id, sender_session,
              request_id, body, body_sha256, body_bytes)
         SELECT gen_random_uuid(), c.team_id, $1, c.base + s, o.id, o.agent_id, o.session,
                gen_random_uuid(), 'seeded ' || s, sha256(convert_to('seeded ' || s, 'UTF8')),
                octet_length('seeded ' || s)
           FROM c, generate_series(1, $2) s, conversation_members o
          WHERE o.conversation_id = $1 AND o.role = 'owner'",
    )
    .bind(p.conversation_id)
    .bind(count)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO message_receipts
             (team_id, message_id, member_id, recipient_id, recipient_session, stored_at)
         SELECT m.team_id, m.id, b.id, b.agent_id, b.session, now()
           FROM conversation_messages m
           JOIN conversation_members b
             ON b.team_id = m.team_id AND b.conversation_id = m.conversation_id
          WHERE m.conversation_id = $1 AND b.session = 'w1'
         ON CONFLICT DO NOTHING",
    )
    .bind(p.conversation_id)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn inbox_status_counts_stop_at_their_cap_and_say_at_least() {
    let p = pair().await;
    p.send("first").await;
    seed_owed_messages(&p, 1100).await;
    let status = inbox_status(&p.bob).await;
    assert_eq!(status["owed_at_least"], true, "{status}");
    assert_eq!(
        status["owed"], COUNTED_MAX,
        "counted up to the cap: {status}"
    );

    // The hand-out is unchanged: oldest first, in seq order, and more.
    let (page, seqs) = fetch_page(&p.bob).await;
    assert_eq!(seqs, (1..=50).collect::<Vec<_>>());
    assert_eq!(page["more"], true);
    let status = inbox_status(&p.bob).await;
    assert_eq!(status["owed_at_least"], true, "{status}");
    assert_eq!(status["owed"], COUNTED_MAX, "{status}");
    confirm(&p.bob, &page).await;

    // Below the cap the count is exact again and the flag is gone.
    let all = drain_inbox(&p.bob).await;
    assert_eq!(all, (51..=1101).collect::<Vec<_>>());
    let status = inbox_status(&p.bob).await;
    assert_eq!(status["owed"], 0, "{status}");
    assert!(status.get("owed_at_least").is_none(), "{status}");
}

/// `search_notes` for `query`: the answer and its keys, best first.
async fn search(client: &crate::support::McpClient, query: &str) -> (Value, Vec<String>) {
    let found = client
        .call("search_notes", json!({"query": query}))
        .await
        .unwrap();
    let keys = found["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap().to_string())
        .collect();
    (found, keys)
}

#[tokio::test]
async fn a_note_search_ranks_among_the_most_recently_updated_matches() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    alice
        .call(
            "set_note",
            json!({"key": "zebra zebra zebra", "value": "zebra zebra zebra zebra"}),
        )
        .await
        .unwrap();
    alice
        .call("set_note", json!({"key": "one", "value": "a zebra"}))
        .await
        .unwrap();
    // Few notes match: the best match first, as before.
    let (_, keys) = search(&alice, "zebra").await;
    assert_eq!(keys, ["zebra zebra zebra", "one"]);

    // 520 newer notes match too: the old best match is not among the 500
    // most recently updated matches, so it is not ranked.
    sqlx::query(
        "UPDATE notes SET updated_at = now() - interval '1000 days' WHERE key = 'zebra zebra zebra'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO notes (id, team_id, scope, key, value, tags, revision,
                            created_by_agent_id, created_by_session,
                            updated_by_agent_id, updated_by_session, updated_at)
         SELECT gen_random_uuid(), a.team_id, 'global', 'seeded-' || i, 'a zebra ' || i, '{}', 1,
                a.id, '', a.id, '', now() - make_interval(secs => i)
           FROM agents a, generate_series(1, 520) i WHERE a.name = 'alice'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let (found, keys) = search(&alice, "zebra").await;
    assert_eq!(keys.len(), 50);
    assert_eq!(found["truncated"], true);
    assert!(!keys.iter().any(|k| k == "zebra zebra zebra"), "{keys:?}");
    // Equal ranks: the most recently updated first.
    assert_eq!(keys[0], "one");
    assert_eq!(keys[1], "seeded-1");
    // A narrower query still reaches it.
    let (_, keys) = search(&alice, "zebra -seeded -one").await;
    assert_eq!(keys, ["zebra zebra zebra"]);
}

fn task_keys(list: &Value) -> Vec<String> {
    list["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn task_listings_answer_the_same_for_every_status_and_window() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("w1")).await;
    for key in ["t1", "t2", "t3", "t4", "t5"] {
        alice
            .call("create_task", json!({"key": key, "title": key}))
            .await
            .unwrap();
    }
    bob.call("claim_task", json!({"key": "t1"})).await.unwrap();
    alice
        .call("claim_task", json!({"key": "t2"}))
        .await
        .unwrap();
    alice
        .call("complete_task", json!({"key": "t2", "result": "ok"}))
        .await
        .unwrap();
    alice
        .call("cancel_task", json!({"key": "t3", "reason": "not needed"}))
        .await
        .unwrap();
    let list = async |client: &crate::support::McpClient, status: &str, mine: bool| {
        task_keys(
            &client
                .call("list_tasks", json!({"status": status, "mine_only": mine}))
                .await
                .unwrap(),
        )
    };
    assert_eq!(list(&alice, "open", false).await, ["t4", "t5"]);
    assert_eq!(list(&alice, "claimed", false).await, ["t1"]);
    assert_eq!(list(&bob, "claimed", true).await, ["t1"]);
    assert!(list(&alice, "claimed", true).await.is_empty());
    assert_eq!(list(&alice, "done", false).await, ["t2"]);
    assert_eq!(list(&alice, "done", true).await, ["t2"]);
    assert!(list(&bob, "done", true).await.is_empty());
    assert_eq!(list(&alice, "cancelled", false).await, ["t3"]);
    assert!(list(&alice, "cancelled", true).await.is_empty());
    let mut any = list(&alice, "any", false).await;
    any.sort();
    assert_eq!(any, ["t1", "t2", "t3", "t4", "t5"]);
    assert_eq!(list(&alice, "any", true).await, ["t2"]);
    // A lapsed claim is open again, in queue order, and still the holder's.
    sqlx::query("UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE key = 't1'")
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(list(&alice, "open", false).await, ["t1", "t4", "t5"]);
    assert!(list(&alice, "claimed", false).await.is_empty());
    assert_eq!(list(&bob, "open", true).await, ["t1"]);
}
