//! The write tools that are one SQL call each (issue 34 item 1, migration
//! 0033: acquire_lock, release_lock, heartbeat, set_note and the rest;
//! 0039: the inbox fetch) run the write fence inside that call, in the same transaction as their writes: a
//! revocation caught between taking its fence and committing makes the call
//! wait, and once it commits the call is refused with today's words and
//! leaves everything as it was. The race itself is `write_fence::race`.

use ai_crew_sync::store::{identity::agents, identity::teams, identity::tokens};
use serde_json::json;
use uuid::Uuid;

use crate::support::{McpClient, TestApp, in_team, spawn_app, test_actor};
use crate::write_fence::{
    acme_with_alice, agent_id, alice_with_window_w, count, hold_row, message, race,
};

const DISABLED: &str = "agent `alice` of team `acme` is disabled";

// Breakage: `IF refusal IS NOT NULL THEN` -> `IF false THEN` in
// acquire_team_lock makes the call take the lock across the disable.
#[tokio::test]
async fn an_acquire_lock_in_flight_across_an_agent_disable_is_refused_and_takes_nothing() {
    let app = spawn_app().await;
    let alice = app.mcp(&acme_with_alice(&app).await, None).await;
    let held = hold_row(
        &app.pool,
        "SELECT 1 FROM agents WHERE id = $1 FOR NO KEY UPDATE",
        agent_id(&app.pool, "alice").await,
    )
    .await;

    let pool = app.pool.clone();
    let answer = race(
        &app.pool,
        held,
        async move {
            agents::set_disabled(&pool, &in_team("acme"), "alice", true)
                .await
                .unwrap()
        },
        async move {
            alice
                .call("acquire_lock", json!({ "name": "deploy:prod" }))
                .await
        },
    )
    .await;

    let refusal = answer.expect_err("a disabled agent's acquire");
    assert!(message(&refusal).contains(DISABLED), "{refusal}");
    assert_eq!(count(&app.pool, "locks").await, 0, "no lock was taken");
}

// Breakage: `IF refusal IS NOT NULL THEN` -> `IF false THEN` in
// release_team_lock makes the call run across the revocation: it finds the
// lock the revocation released and answers "not held" instead of the fence.
#[tokio::test]
async fn a_release_lock_in_flight_across_its_token_revocation_is_refused_by_the_fence() {
    let app = spawn_app().await;
    let (_agent, window, _) = alice_with_window_w(&app).await;
    window
        .call("acquire_lock", json!({ "name": "deploy:prod" }))
        .await
        .unwrap();
    let token_id: Uuid = sqlx::query_scalar("SELECT id FROM agent_tokens")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let held = hold_row(
        &app.pool,
        "SELECT 1 FROM agent_tokens WHERE id = $1 FOR NO KEY UPDATE",
        token_id,
    )
    .await;

    let pool = app.pool.clone();
    let answer = race(
        &app.pool,
        held,
        async move {
            tokens::revoke(&pool, token_id, &in_team("acme"))
                .await
                .unwrap()
        },
        async move {
            window
                .call("release_lock", json!({ "name": "deploy:prod" }))
                .await
        },
    )
    .await;

    let refusal = answer.expect_err("a revoked token's window releasing");
    assert!(
        message(&refusal).contains("the agent token it was registered with was revoked"),
        "{refusal}"
    );
    // The revocation released what the dead window held (issue 37).
    let holders: Vec<String> = sqlx::query_scalar("SELECT holder_session FROM locks")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert!(holders.is_empty(), "{holders:?}");
}

// Breakage: `IF refusal IS NOT NULL THEN` -> `IF false THEN` in
// store_heartbeat makes the revoked window's beat land.
#[tokio::test]
async fn a_heartbeat_in_flight_across_revoke_session_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let (agent, window, issued) = alice_with_window_w(&app).await;
    window
        .call("heartbeat", json!({ "activity": "before" }))
        .await
        .unwrap();
    let before: (String, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT activity, last_seen_at FROM presence WHERE session = 'w'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let session_id: Uuid = issued["session_id"].as_str().unwrap().parse().unwrap();
    let held = hold_row(
        &app.pool,
        "SELECT 1 FROM agent_sessions WHERE id = $1 FOR NO KEY UPDATE",
        session_id,
    )
    .await;

    let answer = race(
        &app.pool,
        held,
        async move {
            agent
                .call("revoke_session", json!({ "session": "w" }))
                .await
                .unwrap()
        },
        async move {
            window
                .call("heartbeat", json!({ "activity": "late", "status": "busy" }))
                .await
        },
    )
    .await;

    let refusal = answer.expect_err("a revoked window's heartbeat");
    assert!(
        message(&refusal).contains("session `w` was revoked"),
        "{refusal}"
    );
    let after: (String, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT activity, last_seen_at FROM presence WHERE session = 'w'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(after, before, "the window's presence is as it was");
}

// Breakage: `IF refusal IS NOT NULL THEN` -> `IF false THEN` in store_note
// makes the disabled agent's note and its revision land.
#[tokio::test]
async fn a_set_note_in_flight_across_an_agent_disable_is_refused_and_writes_no_revision() {
    let app = spawn_app().await;
    let alice = app.mcp(&acme_with_alice(&app).await, None).await;
    let held = hold_row(
        &app.pool,
        "SELECT 1 FROM agents WHERE id = $1 FOR NO KEY UPDATE",
        agent_id(&app.pool, "alice").await,
    )
    .await;

    let pool = app.pool.clone();
    let answer = race(
        &app.pool,
        held,
        async move {
            agents::set_disabled(&pool, &in_team("acme"), "alice", true)
                .await
                .unwrap()
        },
        async move {
            alice
                .call("set_note", json!({ "key": "plan", "value": "late" }))
                .await
        },
    )
    .await;

    let refusal = answer.expect_err("a disabled agent's note");
    assert!(message(&refusal).contains(DISABLED), "{refusal}");
    assert_eq!(count(&app.pool, "notes").await, 0, "no note was set");
    assert_eq!(
        count(&app.pool, "note_revisions").await,
        0,
        "no revision was written"
    );
}

/// acme with conversations enabled; alice (bare token) sends bob (window
/// `w`, its own session credential) a message. bob's agent-token client,
/// his window's client and the message.
async fn a_message_for_bob_w(app: &TestApp) -> (McpClient, McpClient, Uuid) {
    let alice = app.mcp(&acme_with_alice(app).await, None).await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let bob_agent = app.mcp(&app.agent("acme", "bob").await, None).await;
    let issued = bob_agent
        .call("register_session", json!({ "session": "w" }))
        .await
        .unwrap();
    let bob = app.mcp(issued["credential"].as_str().unwrap(), None).await;
    let created = alice
        .call(
            "create_conversation",
            json!({ "title": "release", "private": true, "invite": ["bob/w"] }),
        )
        .await
        .unwrap();
    let conversation = created["id"].as_str().unwrap().to_owned();
    bob.call(
        "join_conversation",
        json!({ "conversation_id": conversation }),
    )
    .await
    .unwrap();
    let sent = alice
        .call(
            "send_conversation_message",
            json!({ "conversation_id": conversation, "body": "ship it?",
                    "request_id": Uuid::new_v4() }),
        )
        .await
        .unwrap();
    let message_id = sent["message_id"].as_str().unwrap().parse().unwrap();
    (bob_agent, bob, message_id)
}

/// bob's receipt facts and the conversation's audit rows of the ack.
async fn receipt_and_acks(app: &TestApp) -> (bool, bool, i64) {
    sqlx::query_as(
        "SELECT acknowledged_at IS NOT NULL, presented_at IS NOT NULL,
                (SELECT count(*) FROM conversation_audit WHERE action = 'ack')
         FROM message_receipts",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

// Breakage: `IF refusal IS NOT NULL THEN` -> `IF false THEN` in store_ack
// makes the disabled agent's ack and its audit row land.
#[tokio::test]
async fn an_ack_in_flight_across_the_recipients_disable_is_refused_and_records_nothing() {
    let app = spawn_app().await;
    let (_, bob, message_id) = a_message_for_bob_w(&app).await;
    let held = hold_row(
        &app.pool,
        "SELECT 1 FROM agents WHERE id = $1 FOR NO KEY UPDATE",
        agent_id(&app.pool, "bob").await,
    )
    .await;

    let pool = app.pool.clone();
    let answer = race(
        &app.pool,
        held,
        async move {
            agents::set_disabled(&pool, &in_team("acme"), "bob", true)
                .await
                .unwrap()
        },
        async move {
            bob.call(
                "ack_message",
                json!({ "message_id": message_id, "resolved": true, "note": "done" }),
            )
            .await
        },
    )
    .await;

    let refusal = answer.expect_err("a disabled agent's ack");
    assert!(
        message(&refusal).contains("agent `bob` of team `acme` is disabled"),
        "{refusal}"
    );
    assert_eq!(
        receipt_and_acks(&app).await,
        (false, false, 0),
        "no fact, no audit"
    );
}

// Breakage: `IF refusal IS NOT NULL THEN` -> `IF false THEN` in
// store_presented makes the revoked window's `presented` land.
#[tokio::test]
async fn a_mark_presented_in_flight_across_revoke_session_is_refused_and_records_nothing() {
    let app = spawn_app().await;
    let (bob_agent, bob, message_id) = a_message_for_bob_w(&app).await;
    let session_id: Uuid = sqlx::query_scalar("SELECT id FROM agent_sessions WHERE label = 'w'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let held = hold_row(
        &app.pool,
        "SELECT 1 FROM agent_sessions WHERE id = $1 FOR NO KEY UPDATE",
        session_id,
    )
    .await;

    let answer = race(
        &app.pool,
        held,
        async move {
            bob_agent
                .call("revoke_session", json!({ "session": "w" }))
                .await
                .unwrap()
        },
        async move {
            bob.call("mark_presented", json!({ "message_ids": [message_id] }))
                .await
        },
    )
    .await;

    let refusal = answer.expect_err("a revoked window's mark_presented");
    assert!(
        message(&refusal).contains("session `w` was revoked"),
        "{refusal}"
    );
    assert_eq!(
        receipt_and_acks(&app).await,
        (false, false, 0),
        "nothing recorded"
    );
}

/// `call` by bob's window of an inbox pair, caught between its fence and its
/// commit by bob's disable: the refusal, checked to be the disable's words.
async fn refused_across_bobs_disable<W>(app: &TestApp, call: W) -> serde_json::Value
where
    W: Future<Output = Result<serde_json::Value, serde_json::Value>> + Send + 'static,
{
    let held = hold_row(
        &app.pool,
        "SELECT 1 FROM agents WHERE id = $1 FOR NO KEY UPDATE",
        agent_id(&app.pool, "bob").await,
    )
    .await;
    let pool = app.pool.clone();
    let answer = race(
        &app.pool,
        held,
        async move {
            agents::set_disabled(&pool, &in_team("ib"), "bob", true)
                .await
                .unwrap()
        },
        call,
    )
    .await;
    let refusal = answer.expect_err("a disabled agent's call");
    assert!(
        message(&refusal).contains("agent `bob` of team `ib` is disabled"),
        "{refusal}"
    );
    refusal
}

// Breakage: `IF refusal IS NOT NULL THEN` -> `IF false THEN` in
// confirm_inbox_references makes the disabled agent's confirmation land.
#[tokio::test]
async fn a_confirm_inbox_delivery_in_flight_across_an_agent_disable_is_refused_and_marks_nothing() {
    let p = crate::inbox::pair().await;
    p.send("one").await;
    let ids = crate::inbox::delivery_ids(&crate::inbox::fetch(&p.bob).await);
    assert_eq!(ids.len(), 1);
    let bob = p.bob;
    refused_across_bobs_disable(&p.app, async move {
        bob.call("confirm_inbox_delivery", json!({ "delivery_ids": ids }))
            .await
    })
    .await;
    let delivered: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM inbox_references WHERE delivered_at IS NOT NULL),
                (SELECT count(*) FROM message_receipts WHERE delivered_at IS NOT NULL)",
    )
    .fetch_one(&p.app.pool)
    .await
    .unwrap();
    assert_eq!(delivered, (0, 0), "nothing was marked delivered");
}

// Breakage: `IF refusal IS NOT NULL THEN` -> `IF false THEN` in
// fetch_inbox_page (migration 0039) makes the disabled agent's fetch hand
// the reference out.
#[tokio::test]
async fn a_fetch_conversation_inbox_in_flight_across_an_agent_disable_is_refused_and_hands_out_nothing()
 {
    let p = crate::inbox::pair().await;
    p.send("one").await;
    let bob = p.bob;
    refused_across_bobs_disable(&p.app, async move {
        bob.call("fetch_conversation_inbox", json!({})).await
    })
    .await;
    let handed_out: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_references WHERE handed_out_at IS NOT NULL")
            .fetch_one(&p.app.pool)
            .await
            .unwrap();
    assert_eq!(handed_out, 0, "nothing was handed out");
}
