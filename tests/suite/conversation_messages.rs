//! Conversation messages over real HTTP with real MCP clients as several
//! windows: the gap-free sequence, recipients frozen at send, idempotent
//! retries, receipts and their frozen denominator, history boundaries,
//! refusals, limits, and the conversation wait.
//!
//! Conversations and seats are laid down with SQL fixtures: creating them
//! through tools is another area's subject.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use ai_crew_sync::store::identity::teams;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{McpClient, TestApp, eventually, in_team, spawn_app, test_actor};

/// A team with conversations on and the given agents; their tokens in order.
async fn team_with(app: &TestApp, team: &str, agents: &[&str]) -> Vec<String> {
    app.team(team).await;
    teams::capability(&app.pool, team, Some(true), &test_actor())
        .await
        .unwrap();
    let mut tokens = Vec::new();
    for agent in agents {
        tokens.push(app.agent(team, agent).await);
    }
    tokens
}

async fn ids(pool: &PgPool, team: &str, agent: &str) -> (Uuid, Uuid) {
    sqlx::query_as(
        "SELECT t.id, a.id FROM teams t JOIN agents a ON a.team_id = t.id
         WHERE t.slug = $1 AND a.name = $2",
    )
    .bind(team)
    .bind(agent)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A conversation created by `creator` (private, or in `project`).
async fn conversation(pool: &PgPool, team: &str, creator: &str, project: Option<&str>) -> Uuid {
    let (team_id, creator_id) = ids(pool, team, creator).await;
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO conversations (id, team_id, title, visibility, project_id, created_by, created_session)
         VALUES ($1, $2, 'release plan', CASE WHEN $3::text IS NULL THEN 'private' ELSE 'project' END,
                 (SELECT id FROM projects WHERE team_id = $2 AND name = $3), $4, '')",
    )
    .bind(id)
    .bind(team_id)
    .bind(project)
    .bind(creator_id)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// A seat for window `address` (`agent` or `agent/session`) with a role,
/// a state and a history boundary.
async fn seat(
    pool: &PgPool,
    team: &str,
    conversation: Uuid,
    address: &str,
    role: &str,
    state: &str,
    history_from_seq: i64,
) -> Uuid {
    let (agent, session) = address.split_once('/').unwrap_or((address, ""));
    let (team_id, agent_id) = ids(pool, team, agent).await;
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO conversation_members
             (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq, joined_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())",
    )
    .bind(id)
    .bind(team_id)
    .bind(conversation)
    .bind(agent_id)
    .bind(session)
    .bind(role)
    .bind(state)
    .bind(history_from_seq)
    .execute(pool)
    .await
    .unwrap();
    id
}

async fn active(pool: &PgPool, team: &str, conversation: Uuid, agent: &str, session: &str) -> Uuid {
    seat(
        pool,
        team,
        conversation,
        &format!("{agent}/{session}"),
        "participant",
        "active",
        1,
    )
    .await
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

fn message_text(refusal: &Value) -> &str {
    refusal["message"].as_str().unwrap_or_default()
}

fn seqs(page: &Value) -> Vec<i64> {
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect()
}

fn addresses(value: &Value) -> BTreeSet<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

async fn stored_messages(pool: &PgPool, conversation: Uuid) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM conversation_messages WHERE conversation_id = $1),
                (SELECT last_seq FROM conversations WHERE id = $1)",
    )
    .bind(conversation)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Every receipt row of a conversation, as text, to compare before and after.
async fn receipt_snapshot(pool: &PgPool, conversation: Uuid) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT r::text FROM message_receipts r
         JOIN conversation_messages m ON m.id = r.message_id
         WHERE m.conversation_id = $1 ORDER BY r.message_id, r.member_id",
    )
    .bind(conversation)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Every window in `members` sends 3 messages, all windows at once.
async fn batch(
    conv: Uuid,
    members: &BTreeSet<String>,
    windows: &[(String, McpClient)],
) -> Vec<Vec<(String, Value)>> {
    let sends = windows
        .iter()
        .filter(|(address, _)| members.contains(address))
        .map(|(address, client)| async move {
            let mut sent = Vec::new();
            for i in 0..3 {
                let answer = send(client, conv, &format!("{address} says {i}"))
                    .await
                    .expect("an active participant sends");
                sent.push((address.clone(), answer));
            }
            sent
        });
    futures::future::join_all(sends).await
}

#[tokio::test]
async fn eight_windows_sending_at_once_get_seqs_without_gaps_and_recipients_frozen_at_each_send() {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob", "carol"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    let mut windows = Vec::new();
    for (agent, token) in [("alice", &tokens[0]), ("bob", &tokens[1])] {
        for w in 0..4 {
            let session = format!("w{w}");
            active(&app.pool, "acme", conv, agent, &session).await;
            windows.push((
                format!("{agent}/{session}"),
                app.mcp(token, Some(&session)).await,
            ));
        }
    }

    // Batch 1: every window sends 3 messages at once.
    let all: BTreeSet<String> = windows.iter().map(|(a, _)| a.clone()).collect();
    let first: Vec<(String, Value)> = batch(conv, &all, &windows)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(first.len(), 24);
    for (sender, answer) in &first {
        let mut expected = all.clone();
        expected.remove(sender);
        assert_eq!(addresses(&answer["recipients"]), expected, "{answer}");
        assert_eq!(answer["stored"], true);
        assert_eq!(answer["publication"], "stored");
    }

    // Between batches: bob/w3 leaves, carol/x joins.
    sqlx::query(
        "UPDATE conversation_members SET state = 'left', left_at = now()
         WHERE conversation_id = $1 AND session = 'w3'
           AND agent_id = (SELECT id FROM agents WHERE name = 'bob')",
    )
    .bind(conv)
    .execute(&app.pool)
    .await
    .unwrap();
    active(&app.pool, "acme", conv, "carol", "x").await;
    let mut now_active = all.clone();
    now_active.remove("bob/w3");
    now_active.insert("carol/x".into());
    let carol = app.mcp(&tokens[2], Some("x")).await;
    windows.push(("carol/x".into(), carol));
    let second: Vec<(String, Value)> = batch(conv, &now_active, &windows)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(second.len(), 24);
    for (sender, answer) in &second {
        let mut expected = now_active.clone();
        expected.remove(sender);
        assert_eq!(addresses(&answer["recipients"]), expected, "{answer}");
    }
    let left = windows.iter().find(|(a, _)| a == "bob/w3").unwrap();
    let refused = send(&left.1, conv, "still here?").await.unwrap_err();
    assert_eq!(
        refused["error"], "not_found",
        "a seat that left cannot send"
    );

    // The sequence: 1..48, no gap, no duplicate, and the answers agree with it.
    let mut answered: Vec<i64> = first
        .iter()
        .chain(&second)
        .map(|(_, a)| a["seq"].as_i64().unwrap())
        .collect();
    answered.sort();
    assert_eq!(answered, (1..=48).collect::<Vec<_>>());
    let reader = &windows[0].1;
    let mut read = Vec::new();
    let mut after = 0;
    loop {
        let page = reader
            .call(
                "read_conversation",
                json!({"conversation_id": conv, "after_seq": after, "limit": 20}),
            )
            .await
            .unwrap();
        if page["messages"].as_array().unwrap().is_empty() {
            break;
        }
        read.extend(seqs(&page));
        after = page["next_after_seq"].as_i64().unwrap();
    }
    assert_eq!(read, (1..=48).collect::<Vec<_>>(), "read in order, no gap");

    // What the receipts say each message owed matches what the send answered.
    for (sender, answer) in first.iter().chain(&second).step_by(5) {
        let client = &windows.iter().find(|(a, _)| a == sender).unwrap().1;
        let receipts = client
            .call(
                "get_message_receipts",
                json!({"message_id": answer["message_id"]}),
            )
            .await
            .unwrap();
        let owed: BTreeSet<String> = receipts["recipients"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["recipient"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(owed, addresses(&answer["recipients"]));
        assert_eq!(receipts["total"], 7);
        assert_eq!(receipts["stored"], 7);
    }
    let sends: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_audit_log WHERE conversation_id = $1 AND action = 'send'",
    )
    .bind(conv)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(sends, 48);
}

#[tokio::test]
async fn a_retried_send_returns_the_original_a_different_body_conflicts_and_racing_retries_store_once()
 {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    active(&app.pool, "acme", conv, "alice", "").await;
    active(&app.pool, "acme", conv, "bob", "").await;
    let alice = app.mcp(&tokens[0], None).await;
    let request_id = Uuid::new_v4().to_string();
    let args = json!({"conversation_id": conv, "body": "ship it", "request_id": request_id});

    let original = alice
        .call("send_conversation_message", args.clone())
        .await
        .unwrap();
    assert_eq!(original["seq"], 1);
    assert_eq!(original["replayed"], false);
    let retried = alice
        .call("send_conversation_message", args.clone())
        .await
        .unwrap();
    assert_eq!(retried["message_id"], original["message_id"]);
    assert_eq!(retried["seq"], 1);
    assert_eq!(retried["created_at"], original["created_at"]);
    assert_eq!(retried["recipients"], json!(["bob"]));
    assert_eq!(retried["replayed"], true);
    assert_eq!(stored_messages(&app.pool, conv).await, (1, 1));

    let other = alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": conv, "body": "do not ship", "request_id": request_id}),
        )
        .await
        .unwrap_err();
    assert_eq!(other["error"], "conflict");
    assert!(message_text(&other).contains("different body"), "{other}");
    assert_eq!(stored_messages(&app.pool, conv).await, (1, 1));

    // Once accepted, never refused: a retry after the conversation was
    // archived still gets the original, while a new send is refused.
    sqlx::query("UPDATE conversations SET archived_at = now() WHERE id = $1")
        .bind(conv)
        .execute(&app.pool)
        .await
        .unwrap();
    let late_retry = alice
        .call("send_conversation_message", args.clone())
        .await
        .unwrap();
    assert_eq!(late_retry["message_id"], original["message_id"]);
    let new_send = alice
        .call("send_conversation_message", json!({"conversation_id": conv, "body": "more", "request_id": Uuid::new_v4().to_string()}))
        .await
        .unwrap_err();
    assert!(message_text(&new_send).contains("archived"), "{new_send}");
    sqlx::query("UPDATE conversations SET archived_at = NULL WHERE id = $1")
        .bind(conv)
        .execute(&app.pool)
        .await
        .unwrap();

    // Eight clients retrying one new send at the same moment: stored once.
    let racing_id = Uuid::new_v4().to_string();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(app.mcp(&tokens[0], None).await);
    }
    let answers = futures::future::join_all(clients.iter().map(|c| {
        c.call(
            "send_conversation_message",
            json!({"conversation_id": conv, "body": "once", "request_id": racing_id}),
        )
    }))
    .await;
    let ids: HashSet<String> = answers
        .iter()
        .map(|a| a.as_ref().unwrap()["message_id"].to_string())
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "every retry got the same message: {answers:?}"
    );
    assert!(answers.iter().all(|a| a.as_ref().unwrap()["seq"] == 2));
    assert_eq!(
        answers
            .iter()
            .filter(|a| a.as_ref().unwrap()["replayed"] == false)
            .count(),
        1
    );
    assert_eq!(stored_messages(&app.pool, conv).await, (2, 2));
    let receipts: i64 = sqlx::query_scalar("SELECT count(*) FROM message_receipts")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(receipts, 2, "one receipt (bob) per stored message");
}

#[tokio::test]
async fn reading_never_changes_a_receipt_and_acks_count_against_the_frozen_denominator() {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob", "carol", "dave"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    for agent in ["alice", "bob", "carol"] {
        active(&app.pool, "acme", conv, agent, "").await;
    }
    let alice = app.mcp(&tokens[0], None).await;
    let bob = app.mcp(&tokens[1], None).await;
    let carol = app.mcp(&tokens[2], None).await;
    let dave = app.mcp(&tokens[3], None).await;
    let sent = send(&alice, conv, "please review the plan").await.unwrap();
    let message_id = sent["message_id"].clone();

    let before = receipt_snapshot(&app.pool, conv).await;
    let page = bob
        .call("read_conversation", json!({"conversation_id": conv}))
        .await
        .unwrap();
    assert_eq!(page["messages"][0]["body"], "please review the plan");
    assert_eq!(page["messages"][0]["from"], "alice");
    assert!(page["messages"][0]["unavailable"].is_null());
    assert!(page["messages"][0]["my_receipt"]["stored_at"].is_string());
    assert!(page["messages"][0]["my_receipt"]["acknowledged_at"].is_null());
    bob.call(
        "get_conversation_message",
        json!({"message_id": message_id}),
    )
    .await
    .unwrap();
    alice
        .call("read_conversation", json!({"conversation_id": conv}))
        .await
        .unwrap();
    assert_eq!(
        receipt_snapshot(&app.pool, conv).await,
        before,
        "reading wrote no receipt"
    );
    let own = alice
        .call("read_conversation", json!({"conversation_id": conv}))
        .await
        .unwrap();
    assert!(
        own["messages"][0]["my_receipt"].is_null(),
        "the sender is not its own recipient"
    );

    // dave joins after the send: not in its denominator, cannot ack it.
    seat(&app.pool, "acme", conv, "dave", "participant", "active", 2).await;
    let refused = dave
        .call("ack_message", json!({"message_id": message_id}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "not_found", "before dave's history");

    let acked = bob
        .call("ack_message", json!({"message_id": message_id}))
        .await
        .unwrap();
    let first_ack = acked["receipt"]["acknowledged_at"].clone();
    assert!(first_ack.is_string());
    assert!(acked["receipt"]["resolved_at"].is_null());
    let counts = alice
        .call("get_message_receipts", json!({"message_id": message_id}))
        .await
        .unwrap();
    assert_eq!(
        (
            &counts["total"],
            &counts["stored"],
            &counts["acknowledged"],
            &counts["resolved"]
        ),
        (&json!(2), &json!(2), &json!(1), &json!(0))
    );

    // A note over the limit changes nothing.
    let long = carol
        .call(
            "ack_message",
            json!({"message_id": message_id, "resolved": true, "note": "n".repeat(1025)}),
        )
        .await
        .unwrap_err();
    assert_eq!(long["error"], "invalid");
    assert!(message_text(&long).contains("1024"), "{long}");
    let resolved = carol
        .call(
            "ack_message",
            json!({"message_id": message_id, "resolved": true, "note": "merged"}),
        )
        .await
        .unwrap();
    assert!(
        resolved["receipt"]["acknowledged_at"].is_string(),
        "resolved implies acknowledged"
    );
    assert!(resolved["receipt"]["resolved_at"].is_string());
    let again = bob
        .call("ack_message", json!({"message_id": message_id}))
        .await
        .unwrap();
    assert_eq!(
        again["receipt"]["acknowledged_at"], first_ack,
        "written once"
    );
    // One note per ack fact (issue 15, item 7): a second ack with another
    // note keeps the first, and the answer shows the kept one and says so.
    let renoted = carol
        .call(
            "ack_message",
            json!({"message_id": message_id, "note": "rewritten"}),
        )
        .await
        .unwrap();
    assert_eq!(renoted["receipt"]["note"], "merged", "{renoted}");
    assert!(
        renoted["note_not_kept"]
            .as_str()
            .is_some_and(|why| why.contains("written once")),
        "{renoted}"
    );

    let counts = dave
        .call("get_message_receipts", json!({"message_id": message_id}))
        .await
        .unwrap_err();
    assert_eq!(counts["error"], "not_found", "dave's history starts later");
    let counts = bob
        .call("get_message_receipts", json!({"message_id": message_id}))
        .await
        .unwrap();
    assert_eq!(counts["total"], 2, "dave, added later, is not counted");
    assert_eq!(counts["acknowledged"], 2);
    assert_eq!(counts["resolved"], 1);
    let carol_row = counts["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["recipient"] == "carol")
        .unwrap();
    assert_eq!(carol_row["note"], "merged");
    let not_recipient = alice
        .call("ack_message", json!({"message_id": message_id}))
        .await
        .unwrap_err();
    assert_eq!(not_recipient["error"], "forbidden");

    let audit: Vec<String> = sqlx::query_scalar(
        "SELECT action || ' ' || detail::text FROM conversation_audit_log
         WHERE conversation_id = $1 ORDER BY at",
    )
    .bind(conv)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        audit.iter().filter(|a| a.starts_with("ack ")).count(),
        4,
        "{audit:?}"
    );
    let sends: Vec<&String> = audit.iter().filter(|a| a.starts_with("send ")).collect();
    assert_eq!(sends.len(), 1, "{audit:?}");
    let detail: Value = serde_json::from_str(sends[0].trim_start_matches("send ")).unwrap();
    assert_eq!(detail["recipients"], 2, "{detail}");
    assert_eq!(detail["message_id"], message_id, "{detail}");
    assert!(
        audit.iter().all(|a| !a.contains("review the plan")
            && !a.contains("merged")
            && !a.contains("rewritten")),
        "never a body or a note in the audit: {audit:?}"
    );
}

/// The `presented` receipt (issue 21, item 5): only the client knows it
/// showed a message to the model, so reads, fetches and acks never write it;
/// `mark_presented` does, once, for this window's own receipts, all or none.
#[tokio::test]
async fn presented_is_written_only_by_mark_presented_once_and_all_or_nothing() {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob", "carol"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    for agent in ["alice", "bob"] {
        active(&app.pool, "acme", conv, agent, "").await;
    }
    let alice = app.mcp(&tokens[0], None).await;
    let bob = app.mcp(&tokens[1], None).await;
    let carol = app.mcp(&tokens[2], None).await;
    let first = send(&alice, conv, "one").await.unwrap()["message_id"].clone();
    let second = send(&alice, conv, "two").await.unwrap()["message_id"].clone();

    bob.call("read_conversation", json!({"conversation_id": conv}))
        .await
        .unwrap();
    bob.call("ack_message", json!({"message_id": first}))
        .await
        .unwrap();
    let presented = |counts: &Value| counts["presented"].clone();
    let counts = alice
        .call("get_message_receipts", json!({"message_id": first}))
        .await
        .unwrap();
    assert_eq!(
        presented(&counts),
        json!(0),
        "a read and an ack are not a showing"
    );

    // One id bob may not mark (carol's view of it is none): nothing recorded.
    let outsider = carol
        .call("mark_presented", json!({"message_ids": [first]}))
        .await
        .unwrap_err();
    assert_eq!(outsider["error"], "not_found", "{outsider}");
    let sender = alice
        .call("mark_presented", json!({"message_ids": [first, second]}))
        .await
        .unwrap_err();
    assert_eq!(
        sender["error"], "forbidden",
        "the sender is no recipient: {sender}"
    );
    let empty = bob
        .call("mark_presented", json!({"message_ids": []}))
        .await
        .unwrap_err();
    assert!(message_text(&empty).contains("1 to 100"), "{empty}");
    // One of bob's own and one unknown id: refused, and his is not marked.
    let mixed = bob
        .call(
            "mark_presented",
            json!({"message_ids": [first, uuid::Uuid::now_v7()]}),
        )
        .await
        .unwrap_err();
    assert_eq!(mixed["error"], "not_found", "{mixed}");
    let marked_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM message_receipts WHERE presented_at IS NOT NULL")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(marked_rows, 0, "nothing recorded by a refused call");

    let marked = bob
        .call(
            "mark_presented",
            json!({"message_ids": [second, first, first]}),
        )
        .await
        .unwrap();
    let rows = marked["messages"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "each message once: {marked}");
    let at = rows[0]["presented_at"].clone();
    let again = bob
        .call(
            "mark_presented",
            json!({"message_ids": [rows[0]["message_id"]]}),
        )
        .await
        .unwrap();
    assert_eq!(again["messages"][0]["presented_at"], at, "written once");
    for message in [&first, &second] {
        let counts = alice
            .call("get_message_receipts", json!({"message_id": message}))
            .await
            .unwrap();
        assert_eq!(presented(&counts), json!(1), "{counts}");
        assert_eq!(counts["total"], 1);
    }
}

#[tokio::test]
async fn a_seat_reads_from_its_history_boundary_and_a_project_grant_reads_everything() {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob", "carol"]).await;
    let alice = app.mcp(&tokens[0], None).await;
    let bob = app.mcp(&tokens[1], None).await;
    let carol = app.mcp(&tokens[2], None).await;
    alice
        .call("create_project", json!({"project": "web"}))
        .await
        .unwrap();
    alice
        .call(
            "grant_project_access",
            json!({"project": "web", "agent": "carol"}),
        )
        .await
        .unwrap();
    let conv = conversation(&app.pool, "acme", "alice", Some("web")).await;
    active(&app.pool, "acme", conv, "alice", "").await;
    for i in 1..=5 {
        send(&alice, conv, &format!("message {i}")).await.unwrap();
    }
    seat(&app.pool, "acme", conv, "bob", "participant", "active", 3).await;

    let page = bob
        .call("read_conversation", json!({"conversation_id": conv}))
        .await
        .unwrap();
    assert_eq!(page["history_from_seq"], 3);
    assert_eq!(seqs(&page), [3, 4, 5]);
    assert_eq!(page["next_after_seq"], 5);
    let page = bob
        .call(
            "read_conversation",
            json!({"conversation_id": conv, "after_seq": 0, "limit": 2}),
        )
        .await
        .unwrap();
    assert_eq!(
        seqs(&page),
        [3, 4],
        "after_seq below the boundary starts at it"
    );
    assert_eq!(page["next_after_seq"], 4);
    let page = bob
        .call(
            "read_conversation",
            json!({"conversation_id": conv, "after_seq": 4}),
        )
        .await
        .unwrap();
    assert_eq!(seqs(&page), [5]);
    let page = bob
        .call(
            "read_conversation",
            json!({"conversation_id": conv, "after_seq": 5}),
        )
        .await
        .unwrap();
    assert_eq!(seqs(&page), Vec::<i64>::new());
    assert_eq!(page["next_after_seq"], 5, "an empty page keeps the cursor");
    let second: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 AND seq = 2",
    )
    .bind(conv)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let hidden = bob
        .call("get_conversation_message", json!({"message_id": second}))
        .await
        .unwrap_err();
    assert_eq!(
        hidden["error"], "not_found",
        "seq 2 is before bob's history"
    );

    // carol has no seat but holds the project grant: reads from 1, no receipt, cannot send.
    let page = carol
        .call("read_conversation", json!({"conversation_id": conv}))
        .await
        .unwrap();
    assert_eq!(page["history_from_seq"], 1);
    assert_eq!(seqs(&page), [1, 2, 3, 4, 5]);
    assert!(page["messages"][0]["my_receipt"].is_null());
    let message = carol
        .call("get_conversation_message", json!({"message_id": second}))
        .await
        .unwrap();
    assert_eq!(message["body"], "message 2");
    let refused = send(&carol, conv, "may I?").await.unwrap_err();
    assert_eq!(refused["error"], "forbidden");
    assert!(
        message_text(&refused).contains("only active members send"),
        "{refused}"
    );

    // bob is a member without the grant: a project conversation owes nothing
    // to agents without the grant, and one who lost it cannot send.
    let sent = send(&alice, conv, "to grant holders").await.unwrap();
    assert_eq!(sent["recipients"], json!([]), "bob holds no grant on web");
    carol
        .call(
            "grant_project_access",
            json!({"project": "web", "agent": "alice", "grant": false}),
        )
        .await
        .unwrap();
    let refused = send(&alice, conv, "still granted?").await.unwrap_err();
    assert_eq!(refused["error"], "forbidden");
    assert!(
        message_text(&refused).contains("grant on project `web` is gone"),
        "{refused}"
    );
    assert_eq!(stored_messages(&app.pool, conv).await, (6, 6));
}

#[tokio::test]
async fn observers_archived_and_paused_conversations_refuse_sends_and_store_nothing() {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    active(&app.pool, "acme", conv, "alice", "").await;
    seat(&app.pool, "acme", conv, "bob", "observer", "active", 1).await;
    let alice = app.mcp(&tokens[0], None).await;
    let bob = app.mcp(&tokens[1], None).await;

    let refused = send(&bob, conv, "hello").await.unwrap_err();
    assert_eq!(refused["error"], "forbidden");
    assert!(message_text(&refused).contains("observer"), "{refused}");
    bob.call("read_conversation", json!({"conversation_id": conv}))
        .await
        .expect("an observer reads");
    // Refused after the send claimed its seq (the reply_to is checked under
    // the conversation's lock): the claim rolls back with it.
    let unknown_reply = alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": conv, "body": "re: nothing",
                   "request_id": Uuid::new_v4().to_string(), "reply_to": Uuid::new_v4()}),
        )
        .await
        .unwrap_err();
    assert_eq!(unknown_reply["error"], "not_found", "{unknown_reply}");
    assert_eq!(
        stored_messages(&app.pool, conv).await,
        (0, 0),
        "no seq claimed"
    );

    sqlx::query("UPDATE conversations SET write_paused_at = now() - interval '7 s' WHERE id = $1")
        .bind(conv)
        .execute(&app.pool)
        .await
        .unwrap();
    let paused = send(&alice, conv, "hello").await.unwrap_err();
    assert_eq!(paused["error"], "conflict");
    let text = message_text(&paused);
    assert!(
        text.starts_with("writes to this conversation are paused for a backend move, ")
            && text.ends_with(" s so far; retry shortly"),
        "{paused}"
    );
    assert!(text.contains(", 7 s") || text.contains(", 8 s"), "{paused}");

    sqlx::query(
        "UPDATE conversations SET write_paused_at = NULL, archived_at = now(),
                archived_by = created_by WHERE id = $1",
    )
    .bind(conv)
    .execute(&app.pool)
    .await
    .unwrap();
    let archived = send(&alice, conv, "hello").await.unwrap_err();
    assert_eq!(archived["error"], "conflict");
    assert!(message_text(&archived).contains("archived"), "{archived}");
    alice
        .call("read_conversation", json!({"conversation_id": conv}))
        .await
        .expect("archived history stays readable");
    assert_eq!(stored_messages(&app.pool, conv).await, (0, 0));
}

#[tokio::test]
async fn a_window_outside_a_private_conversation_gets_the_same_not_found_as_a_foreign_team() {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob"]).await;
    let foreign = team_with(&app, "globex", &["eve"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    active(&app.pool, "acme", conv, "alice", "").await;
    seat(&app.pool, "acme", conv, "bob", "participant", "invited", 1).await;
    let alice = app.mcp(&tokens[0], None).await;
    let message_id = send(&alice, conv, "secret").await.unwrap()["message_id"].clone();
    let outsider = app.mcp(&tokens[0], Some("other-window")).await;
    let bob = app.mcp(&tokens[1], None).await;
    let eve = app.mcp(&foreign[0], None).await;

    let calls = [
        ("read_conversation", json!({"conversation_id": conv})),
        (
            "send_conversation_message",
            json!({"conversation_id": conv, "body": "hi", "request_id": Uuid::new_v4()}),
        ),
    ];
    for (tool, args) in &calls {
        let theirs = eve.call(tool, args.clone()).await.unwrap_err();
        let ours = outsider.call(tool, args.clone()).await.unwrap_err();
        assert_eq!(theirs["error"], "not_found", "{tool}: {theirs}");
        assert_eq!(
            ours, theirs,
            "{tool}: a sibling window without a seat learns nothing more"
        );
    }
    for tool in [
        "get_conversation_message",
        "ack_message",
        "get_message_receipts",
    ] {
        let args = json!({"message_id": message_id});
        let theirs = eve.call(tool, args.clone()).await.unwrap_err();
        let ours = outsider.call(tool, args.clone()).await.unwrap_err();
        assert_eq!(theirs["error"], "not_found", "{tool}: {theirs}");
        assert_eq!(ours, theirs, "{tool}");
    }
    // An invitation is not membership.
    let invited = bob
        .call("read_conversation", json!({"conversation_id": conv}))
        .await
        .unwrap_err();
    assert!(
        message_text(&invited).contains("join_conversation"),
        "{invited}"
    );
    assert_eq!(stored_messages(&app.pool, conv).await, (1, 1));
}

#[tokio::test]
async fn limits_are_refused_with_their_numbers_and_nothing_is_stored() {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    active(&app.pool, "acme", conv, "alice", "").await;
    active(&app.pool, "acme", conv, "bob", "").await;
    let alice = app.mcp(&tokens[0], None).await;

    let too_big = send(&alice, conv, &"x".repeat(1024 * 1024 + 1))
        .await
        .unwrap_err();
    assert_eq!(too_big["error"], "invalid");
    assert!(message_text(&too_big).contains("1048576"), "{too_big}");
    let empty = send(&alice, conv, "  ").await.unwrap_err();
    assert!(message_text(&empty).contains("empty"), "{empty}");
    let metadata = alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": conv, "body": "hi", "request_id": Uuid::new_v4(),
                   "metadata": {"blob": "m".repeat(16 * 1024)}}),
        )
        .await
        .unwrap_err();
    assert!(message_text(&metadata).contains("16384"), "{metadata}");
    let bad_id = alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": conv, "body": "hi", "request_id": "retry-1"}),
        )
        .await
        .unwrap_err();
    assert!(message_text(&bad_id).contains("not a UUID"), "{bad_id}");
    assert_eq!(stored_messages(&app.pool, conv).await, (0, 0));

    let fits = send(&alice, conv, &"x".repeat(1024 * 1024)).await.unwrap();
    assert_eq!(fits["seq"], 1, "exactly 1 MiB is accepted");
    for limit in [0, 201] {
        let refused = alice
            .call(
                "read_conversation",
                json!({"conversation_id": conv, "limit": limit}),
            )
            .await
            .unwrap_err();
        assert!(
            message_text(&refused).contains("between 1 and 200"),
            "{refused}"
        );
    }
    let bob = app.mcp(&tokens[1], None).await;
    let before = receipt_snapshot(&app.pool, conv).await;
    let note = bob
        .call(
            "ack_message",
            json!({"message_id": fits["message_id"], "note": "n".repeat(1025)}),
        )
        .await
        .unwrap_err();
    assert!(
        message_text(&note).contains("1025 bytes; the limit is 1024"),
        "{note}"
    );
    assert_eq!(receipt_snapshot(&app.pool, conv).await, before);
    assert_eq!(stored_messages(&app.pool, conv).await, (1, 1));
}

#[tokio::test]
async fn the_conversation_wait_wakes_for_an_unacknowledged_message_and_not_for_an_acked_one() {
    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    let elsewhere = conversation(&app.pool, "acme", "alice", None).await;
    active(&app.pool, "acme", conv, "alice", "").await;
    active(&app.pool, "acme", conv, "bob", "w1").await;
    active(&app.pool, "acme", elsewhere, "alice", "").await;
    let alice = app.mcp(&tokens[0], None).await;
    let bob = app.mcp(&tokens[1], Some("w1")).await;

    // Nothing owed: the wait times out, and a send elsewhere does not wake it.
    let started = Instant::now();
    let (quiet, _) = tokio::join!(
        bob.call(
            "wait_for_conversation_updates",
            json!({"timeout_seconds": 2})
        ),
        async {
            app.until_waiting(1).await;
            send(&alice, elsewhere, "not for bob").await.unwrap();
        }
    );
    let quiet = quiet.unwrap();
    assert_eq!(
        (quiet["woke"].clone(), quiet["timed_out"].clone()),
        (json!(false), json!(true))
    );
    assert!(started.elapsed() >= Duration::from_secs(2));

    // A send to bob wakes a blocked wait, well before the timer's re-check.
    let started = Instant::now();
    let (woke, sent) = tokio::join!(
        bob.call(
            "wait_for_conversation_updates",
            json!({"timeout_seconds": 30})
        ),
        async {
            app.until_waiting(1).await;
            send(&alice, conv, "your turn").await.unwrap()
        }
    );
    let woke = woke.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "woken by the event"
    );
    assert_eq!(woke["woke"], true);
    assert_eq!(woke["conversations"][0]["conversation_id"], json!(conv));
    assert_eq!(woke["conversations"][0]["unacknowledged"], 1);
    assert_eq!(woke["conversations"][0]["latest_seq"], 1);

    // Still owed: the next wait returns at once. Acked: it blocks again.
    let again = bob
        .call(
            "wait_for_conversation_updates",
            json!({"timeout_seconds": 5}),
        )
        .await
        .unwrap();
    assert_eq!(again["woke"], true);
    bob.call("ack_message", json!({"message_id": sent["message_id"]}))
        .await
        .unwrap();
    let after_ack = bob
        .call(
            "wait_for_conversation_updates",
            json!({"timeout_seconds": 1}),
        )
        .await
        .unwrap();
    assert_eq!(after_ack["timed_out"], true);
    assert_eq!(after_ack["conversations"], json!([]));
    let refused = bob
        .call(
            "wait_for_conversation_updates",
            json!({"timeout_seconds": 301}),
        )
        .await
        .unwrap_err();
    assert!(
        message_text(&refused).contains("between 1 and 300"),
        "{refused}"
    );
}

/// The store's send for `me`, a fresh request id.
async fn send_as(
    app: &TestApp,
    me: &ai_crew_sync::auth::Identity,
    conversation: Uuid,
) -> Result<String, ai_crew_sync::error::BusError> {
    use ai_crew_sync::store::conversations::messages::{self, NewConversationMessage};
    let new = NewConversationMessage {
        conversation_id: conversation,
        body: "hello".into(),
        request_id: Uuid::new_v4().to_string(),
        reply_to: None,
        metadata: None,
    };
    messages::send(&app.bus, me, new)
        .await
        .map(|sent| sent.recipients.join(","))
}

/// Team acme with alice and bob, active in one private conversation; alice
/// as the store sees her (bare token, shared session) and her seat's id, for
/// tests that call the store directly while another writer holds a lock.
async fn alice_and_bob_in_a_conversation() -> (TestApp, Uuid, ai_crew_sync::auth::Identity, Uuid) {
    use ai_crew_sync::auth::{self, AgentCredential};
    use ai_crew_sync::store::identity::tokens;

    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice", "bob"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    let alice_seat = active(&app.pool, "acme", conv, "alice", "").await;
    active(&app.pool, "acme", conv, "bob", "").await;
    let AgentCredential::Token(digest) = auth::parse_agent_credential(&tokens[0]).unwrap() else {
        panic!("not an agent token")
    };
    let alice = tokens::authenticate(&app.pool, &digest, String::new())
        .await
        .unwrap();
    (app, conv, alice, alice_seat)
}

// The send takes the write fence first (store_conversation_message calls
// agent_write_refusal, as every writer does): a send that starts while an
// agent disable is in flight waits for it, then answers its refusal and
// stores nothing, not even a claimed seq.
#[tokio::test]
async fn a_send_in_flight_across_an_agent_disable_is_refused_and_claims_no_seq() {
    use ai_crew_sync::store::identity::agents;

    let (app, conv, alice, _) = alice_and_bob_in_a_conversation().await;
    let held = crate::write_fence::hold_row(
        &app.pool,
        "SELECT 1 FROM agents WHERE id = $1 FOR NO KEY UPDATE",
        alice.agent_id,
    )
    .await;
    let pool = app.pool.clone();
    let bus = app.bus.clone();
    let sent = crate::write_fence::race(
        &app.pool,
        held,
        async move {
            agents::set_disabled(&pool, &in_team("acme"), "alice", true)
                .await
                .unwrap()
        },
        async move {
            use ai_crew_sync::store::conversations::messages::{self, NewConversationMessage};
            let new = NewConversationMessage {
                conversation_id: conv,
                body: "late".into(),
                request_id: Uuid::new_v4().to_string(),
                reply_to: None,
                metadata: None,
            };
            messages::send(&bus, &alice, new).await.map(|sent| sent.seq)
        },
    )
    .await;
    let refused = sent.expect_err("a disabled agent's send").to_string();
    assert!(
        refused.contains("agent `alice` of team `acme` is disabled"),
        "{refused}"
    );
    assert_eq!(stored_messages(&app.pool, conv).await, (0, 0));
}

// A conversation wait blocked when its token is revoked answers the refusal
// when a send wakes it, not the receipts that send owes it.
#[tokio::test]
async fn a_conversation_wait_blocked_across_its_token_revocation_answers_the_refusal() {
    use ai_crew_sync::auth::{self, AgentCredential};
    use ai_crew_sync::store::{conversations::receipts, identity::tokens};

    let (app, conv, alice, _) = alice_and_bob_in_a_conversation().await;
    let bob_id: Uuid = sqlx::query_scalar("SELECT id FROM agents WHERE name = 'bob'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let bob_token = tokens::issue(&app.pool, &in_team("acme"), "bob", None)
        .await
        .unwrap()
        .token;
    let AgentCredential::Token(digest) = auth::parse_agent_credential(&bob_token).unwrap() else {
        panic!("not an agent token")
    };
    let bob = tokens::authenticate(&app.pool, &digest, String::new())
        .await
        .unwrap();
    assert_eq!(bob.agent_id, bob_id);

    let bus = app.bus.clone();
    let waiter = alice.clone();
    let wait = tokio::spawn(async move {
        receipts::wait_for_conversation_updates(&bus, &waiter, Duration::from_secs(30)).await
    });
    app.until_waiting(1).await;
    tokens::revoke(&app.pool, alice.token_id, &in_team("acme"))
        .await
        .unwrap();
    send_as(&app, &bob, conv).await.expect("bob's send");

    let answer = tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the wait wakes on bob's send")
        .unwrap();
    let refused = answer.expect_err("a revoked token's wait").to_string();
    assert!(
        refused.contains("this agent token was revoked"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_send_rechecks_the_window_inside_its_transaction_with_the_guards_refusals() {
    use ai_crew_sync::auth::{self, AgentCredential};
    use ai_crew_sync::store::{identity::agents, identity::sessions, identity::tokens};

    let app = spawn_app().await;
    let tokens = team_with(&app, "acme", &["alice"]).await;
    let conv = conversation(&app.pool, "acme", "alice", None).await;
    active(&app.pool, "acme", conv, "alice", "w1").await;
    active(&app.pool, "acme", conv, "alice", "w2").await;
    let registered = app
        .mcp(&tokens[0], None)
        .await
        .call("register_session", json!({"session": "w1"}))
        .await
        .unwrap();
    // Identities as a request resolved them, before anything below changed.
    let AgentCredential::Session(digest) =
        auth::parse_agent_credential(registered["credential"].as_str().unwrap()).unwrap()
    else {
        panic!("not a session credential")
    };
    let window = sessions::authenticate(&app.pool, &digest, None, None)
        .await
        .unwrap();
    let AgentCredential::Token(digest) = auth::parse_agent_credential(&tokens[0]).unwrap() else {
        panic!("not an agent token")
    };
    let bare = tokens::authenticate(&app.pool, &digest, "w2".into())
        .await
        .unwrap();
    assert_eq!(send_as(&app, &window, conv).await.unwrap(), "alice/w2");
    assert_eq!(send_as(&app, &bare, conv).await.unwrap(), "alice/w1");

    let refusal = |result: Result<String, ai_crew_sync::error::BusError>| {
        result.expect_err("refused").to_string()
    };
    let change = |sql: &'static str| {
        let pool = app.pool.clone();
        async move { sqlx::query(sql).execute(&pool).await.unwrap() }
    };
    change("UPDATE agent_sessions SET epoch = epoch + 1").await;
    let stale = refusal(send_as(&app, &window, conv).await);
    assert!(stale.contains("this connection is stale"), "{stale}");
    change("UPDATE agent_sessions SET epoch = epoch - 1, expires_at = now() - interval '1 s'")
        .await;
    let expired = refusal(send_as(&app, &window, conv).await);
    assert!(expired.contains("session `w1` has expired"), "{expired}");
    change("UPDATE agent_sessions SET expires_at = now() + interval '1 h', revoked_at = now()")
        .await;
    let revoked = refusal(send_as(&app, &window, conv).await);
    assert!(revoked.contains("session `w1` was revoked at"), "{revoked}");
    // The guard's word comes before "not found", as when it ran on its own.
    let elsewhere = refusal(send_as(&app, &window, Uuid::new_v4()).await);
    assert!(elsewhere.contains("was revoked at"), "{elsewhere}");
    change("UPDATE agent_sessions SET revoked_at = NULL").await;
    let missing = refusal(send_as(&app, &window, Uuid::new_v4()).await);
    assert!(missing.contains("no conversation"), "{missing}");

    agents::set_disabled(&app.pool, &in_team("acme"), "alice", true)
        .await
        .unwrap();
    for me in [&window, &bare] {
        let disabled = refusal(send_as(&app, me, conv).await);
        assert!(
            disabled.contains("agent `alice` of team `acme` is disabled"),
            "{disabled}"
        );
    }
    agents::set_disabled(&app.pool, &in_team("acme"), "alice", false)
        .await
        .unwrap();
    change("UPDATE agent_tokens SET revoked_at = now()").await;
    let token_gone = refusal(send_as(&app, &window, conv).await);
    assert!(
        token_gone.contains("the agent token it was registered with was revoked"),
        "{token_gone}"
    );
    let bare_gone = refusal(send_as(&app, &bare, conv).await);
    assert!(
        bare_gone.contains("this agent token was revoked"),
        "{bare_gone}"
    );
    assert_eq!(
        stored_messages(&app.pool, conv).await,
        (2, 2),
        "refusals store nothing"
    );
}

// A send the database declines (here: the sender's seat was `left` when the
// send ran) is explained afterwards. If what stood in the way was undone in
// between (the seat active again before the explanation could look), the
// explanation finds no refusal and the send is tried again and stored, at the
// next seq with no gap, instead of failing.
//
// The order is made by locks, not by timing: a transaction holds the
// conversation row `FOR KEY SHARE` (as any insert referencing it does). The
// send's `UPDATE conversations SET last_seq` (FOR NO KEY UPDATE) goes past
// it and is declined; the explanation's `FOR UPDATE` waits for it. While the
// explanation waits, that transaction makes the seat active and commits.
#[tokio::test]
async fn a_send_declined_for_a_change_undone_before_it_is_explained_is_tried_again() {
    let (app, conv, alice, alice_seat) = alice_and_bob_in_a_conversation().await;
    let set_seat_state = |state: &'static str| {
        sqlx::query("UPDATE conversation_members SET state = $2 WHERE id = $1")
            .bind(alice_seat)
            .bind(state)
    };
    // Alice's seat goes, the way a leave does: under the conversation's lock.
    let mut leaving = app.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
        .bind(conv)
        .execute(&mut *leaving)
        .await
        .unwrap();
    set_seat_state("left").execute(&mut *leaving).await.unwrap();
    leaving.commit().await.unwrap();

    let mut returning = crate::write_fence::hold_row(
        &app.pool,
        "SELECT 1 FROM conversations WHERE id = $1 FOR KEY SHARE",
        conv,
    )
    .await;
    let returning_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *returning)
        .await
        .unwrap();
    let meanwhile = async {
        // Only the explanation takes the row FOR UPDATE and so waits for
        // `returning` (the app's workers share this database: the blocker is
        // named, and so is the statement).
        eventually(
            "the explanation to wait for the conversation's lock",
            async || {
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                 WHERE datname = current_database()
                                   AND $1 = ANY (pg_blocking_pids(pid))
                                   AND query LIKE '%FOR UPDATE OF c%')",
                )
                .bind(returning_pid)
                .fetch_one(&app.pool)
                .await
                .unwrap()
            },
        )
        .await;
        set_seat_state("active")
            .execute(&mut *returning)
            .await
            .unwrap();
        returning.commit().await.unwrap();
    };
    let (sent, ()) = tokio::join!(send_as(&app, &alice, conv), meanwhile);
    assert_eq!(sent.expect("stored on the second try"), "bob");
    assert_eq!(stored_messages(&app.pool, conv).await, (1, 1));
    let seq: i64 =
        sqlx::query_scalar("SELECT seq FROM conversation_messages WHERE conversation_id = $1")
            .bind(conv)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(seq, 1, "the declined try used no seq");
}
