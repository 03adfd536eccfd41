//! The write fence (issue 13, item 1): once an agent disable, a token
//! revocation, a `revoke_session` or an admin credential's revocation has
//! committed, no write made with that credential commits, and no long poll
//! hands out what arrived after it.
//!
//! Each race test holds the row the revocation updates (`FOR NO KEY UPDATE`,
//! which no writer needs), so the real revocation (store function, MCP tool
//! or `/admin` route) is caught between taking its fence and committing. The
//! write then starts, and must be seen waiting on the fence (an advisory lock
//! of this test's database), not finishing. The row is let go, the revocation
//! commits, and the write must answer with the refusal and leave nothing.

use std::future::Future;
use std::time::Duration;

use ai_crew_sync::store::{identity::admin, identity::agents, identity::tokens};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{
    McpClient, TestApp, eventually, globally, http_client, in_team, spawn_app, test_actor,
};

/// Lock one row so the revocation that updates it stops just before.
pub(crate) async fn hold_row(
    pool: &PgPool,
    sql: &'static str,
    id: Uuid,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    let held = sqlx::query(sql).bind(id).execute(&mut *tx).await.unwrap();
    assert_eq!(held.rows_affected(), 1, "{sql} holds one row");
    tx
}

/// Backends of this test's database waiting on a lock of `kind`
/// (`advisory` for the fence, anything for the revocation's row wait).
pub(crate) async fn waiting_on(pool: &PgPool, advisory_only: bool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l
          WHERE NOT l.granted
            AND l.pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database())
            AND (NOT $1 OR l.locktype = 'advisory')",
    )
    .bind(advisory_only)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Run `revocation` until it waits on the held row, start `write`, show the
/// write waiting on the fence, release the row; the write's answer.
pub(crate) async fn race<R, W, T>(
    pool: &PgPool,
    held: sqlx::Transaction<'static, sqlx::Postgres>,
    revocation: R,
    write: W,
) -> T
where
    R: Future + Send + 'static,
    R::Output: Send + 'static,
    W: Future<Output = T> + Send + 'static,
    T: Send + std::fmt::Debug + 'static,
{
    let revocation = tokio::spawn(revocation);
    eventually("the revocation to wait on the held row", async || {
        waiting_on(pool, false).await >= 1
    })
    .await;
    let mut write = tokio::spawn(write);
    eventually("the write to wait on the fence", async || {
        if waiting_on(pool, true).await > 0 {
            return true;
        }
        if write.is_finished() {
            let answer = (&mut write).await.unwrap();
            panic!("not fenced: the write finished while the revocation was in flight: {answer:?}");
        }
        false
    })
    .await;
    held.commit().await.unwrap();
    revocation.await.unwrap();
    write.await.unwrap()
}

/// Hold the one row `hold` selects (`FOR UPDATE` or `FOR NO KEY UPDATE`),
/// start `first` and see it queue on the row, then `second` likewise, and let
/// the row go: `first` goes ahead, and `second` reads the row `first` left.
/// Their answers.
pub(crate) async fn queued_on_one_row<A, B>(
    pool: &PgPool,
    hold: &'static str,
    first: A,
    second: B,
) -> (A::Output, B::Output)
where
    A: Future + Send + 'static,
    A::Output: Send + 'static,
    B: Future + Send + 'static,
    B::Output: Send + 'static,
{
    let mut held = pool.begin().await.unwrap();
    let rows = sqlx::query(hold).execute(&mut *held).await.unwrap();
    assert_eq!(rows.rows_affected(), 1, "{hold} holds one row");
    let first = tokio::spawn(first);
    eventually("the first to queue on the held row", async || {
        waiting_on(pool, false).await >= 1
    })
    .await;
    let second = tokio::spawn(second);
    eventually("the second to queue on the held row", async || {
        waiting_on(pool, false).await >= 2
    })
    .await;
    held.rollback().await.unwrap();
    (first.await.unwrap(), second.await.unwrap())
}

pub(crate) async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

pub(crate) async fn agent_id(pool: &PgPool, name: &str) -> Uuid {
    sqlx::query_scalar("SELECT id FROM agents WHERE name = $1")
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

pub(crate) fn message(refusal: &Value) -> String {
    refusal["message"].as_str().unwrap_or_default().to_string()
}

pub(crate) async fn acme_with_alice(app: &TestApp) -> String {
    app.team("acme").await;
    app.agent("acme", "alice").await
}

/// alice's agent token, her window `w` on its own session credential, and
/// what register_session answered.
pub(crate) async fn alice_with_window_w(app: &TestApp) -> (McpClient, McpClient, Value) {
    let token = acme_with_alice(app).await;
    let agent = app.mcp(&token, None).await;
    let issued = agent
        .call("register_session", json!({ "session": "w" }))
        .await
        .unwrap();
    let window = app.mcp(issued["credential"].as_str().unwrap(), None).await;
    (agent, window, issued)
}

#[tokio::test]
async fn a_bare_token_write_in_flight_across_an_agent_disable_is_refused_and_leaves_nothing() {
    let app = spawn_app().await;
    let token = acme_with_alice(&app).await;
    let alice = app.mcp(&token, None).await;
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
                .call(
                    "post_message",
                    json!({ "channel": "general", "body": "late" }),
                )
                .await
        },
    )
    .await;

    let refusal = answer.expect_err("a disabled agent's post");
    assert!(
        message(&refusal).contains("agent `alice` of team `acme` is disabled"),
        "{refusal}"
    );
    assert_eq!(count(&app.pool, "messages").await, 0, "nothing was posted");
}

#[tokio::test]
async fn a_session_write_in_flight_across_its_token_revocation_is_refused_and_leaves_nothing() {
    let app = spawn_app().await;
    let (_agent, window, _) = alice_with_window_w(&app).await;
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
                .call("set_note", json!({ "key": "plan", "value": "late" }))
                .await
        },
    )
    .await;

    let refusal = answer.expect_err("a revoked token's window");
    assert!(
        message(&refusal).contains("the agent token it was registered with was revoked"),
        "{refusal}"
    );
    assert_eq!(count(&app.pool, "notes").await, 0, "no note was set");
}

#[tokio::test]
async fn a_window_write_in_flight_across_revoke_session_is_refused_and_leaves_nothing() {
    let app = spawn_app().await;
    let (agent, window, issued) = alice_with_window_w(&app).await;
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
        // Another window of the agent (here the agent token) revokes `w`.
        async move {
            agent
                .call("revoke_session", json!({ "session": "w" }))
                .await
                .unwrap()
        },
        async move {
            window
                .call("create_task", json!({ "key": "t1", "title": "late" }))
                .await
        },
    )
    .await;

    let refusal = answer.expect_err("a revoked window's task");
    assert!(
        message(&refusal).contains("session `w` was revoked"),
        "{refusal}"
    );
    assert_eq!(count(&app.pool, "tasks").await, 0, "no task was created");
}

#[tokio::test]
async fn an_admin_change_in_flight_across_its_credentials_revocation_is_refused() {
    let app = spawn_app().await;
    app.team("acme").await;
    let global = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;
    let doomed = admin::grant(&app.pool, &globally(), Some("acme"), Some("doomed"))
        .await
        .unwrap();
    // Used once, so authenticating it again writes nothing to its row for a
    // minute (last_used_at) and the write reaches its fence.
    let whoami = http_client()
        .get(app.url("/admin/whoami"))
        .bearer_auth(&doomed.credential)
        .send()
        .await
        .unwrap();
    assert_eq!(whoami.status().as_u16(), 200);
    let held = hold_row(
        &app.pool,
        "SELECT 1 FROM admin_credentials WHERE id = $1 FOR NO KEY UPDATE",
        doomed.id,
    )
    .await;

    let revoke_url = app.url(&format!("/admin/credentials/{}", doomed.id));
    let add_url = app.url("/admin/teams/acme/agents");
    let (status, body) = race(
        &app.pool,
        held,
        async move {
            let revoked = http_client()
                .delete(revoke_url)
                .bearer_auth(global)
                .send()
                .await
                .unwrap();
            assert_eq!(revoked.status().as_u16(), 200);
        },
        async move {
            let added = http_client()
                .post(add_url)
                .bearer_auth(doomed.credential)
                .json(&json!({ "name": "mallory" }))
                .send()
                .await
                .unwrap();
            let status = added.status().as_u16();
            (status, added.json::<Value>().await.unwrap())
        },
    )
    .await;

    assert_eq!(status, 401, "{body}");
    assert!(
        message(&body).contains("this admin credential was revoked"),
        "{body}"
    );
    let mallory: i64 = sqlx::query_scalar("SELECT count(*) FROM agents WHERE name = 'mallory'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(mallory, 0, "no agent was added");
}

/// Alice (`acme_with_alice`) blocks in `wait_for_updates` for `timeout`
/// seconds; once the wait is registered, her token is revoked.
async fn wait_then_revoke_alices_token(
    app: &TestApp,
    alice: McpClient,
    timeout: u64,
) -> tokio::task::JoinHandle<Result<Value, Value>> {
    let wait = tokio::spawn(async move {
        alice
            .call("wait_for_updates", json!({ "timeout_seconds": timeout }))
            .await
    });
    app.until_waiting(1).await;
    let token_id: Uuid = sqlx::query_scalar(
        "SELECT t.id FROM agent_tokens t JOIN agents a ON a.id = t.agent_id WHERE a.name = 'alice'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    tokens::revoke(&app.pool, token_id, &in_team("acme"))
        .await
        .unwrap();
    wait
}

/// A long poll blocked when its credential is taken away answers the refusal
/// when it wakes, never the message that woke it.
#[tokio::test]
async fn a_wait_blocked_across_its_token_revocation_answers_the_refusal_not_the_news() {
    let app = spawn_app().await;
    let token = acme_with_alice(&app).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let alice = app.mcp(&token, None).await;

    let wait = wait_then_revoke_alices_token(&app, alice, 30).await;
    bob.call(
        "post_message",
        json!({ "to": "alice", "body": "secret after revoke" }),
    )
    .await
    .unwrap();

    let answer = tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the wait wakes on bob's message")
        .unwrap();
    let refusal = answer.expect_err("a revoked token's wait");
    assert!(
        message(&refusal).contains("this agent token was revoked"),
        "{refusal}"
    );
    assert!(!refusal.to_string().contains("secret"), "{refusal}");
}

/// A wait that ends on its own look (at its deadline, or finding a change
/// whose notification was lost) reads the credential in that look's
/// statement: a token revoked while it waited is refused when it times out,
/// and an agent disabled behind the bus's back is refused even though the
/// look found news for it.
#[tokio::test]
async fn a_wait_that_ends_on_its_own_look_answers_the_refusal_of_a_credential_taken_away() {
    let app = spawn_app().await;
    let token = acme_with_alice(&app).await;
    let alice = app.mcp(&token, None).await;
    let bob_token = app.agent("acme", "bob").await;
    let bob = app.mcp(&bob_token, None).await;

    // Timed out: nothing wakes alice's wait; her token is revoked meanwhile.
    let wait = wait_then_revoke_alices_token(&app, alice, 3).await;
    let refusal = wait
        .await
        .unwrap()
        .expect_err("a revoked token's timed-out wait");
    assert!(
        message(&refusal).contains("this agent token was revoked"),
        "{refusal}"
    );

    // Found by a look: bob is disabled and a lock appears, both written
    // behind the bus's back (no notification wakes the wait or clears the
    // credential cache): the look that finds the lock refuses.
    let wait = tokio::spawn(async move {
        bob.call("wait_for_updates", json!({ "timeout_seconds": 4 }))
            .await
    });
    app.until_waiting(1).await;
    sqlx::query("UPDATE agents SET disabled_at = now() WHERE name = 'bob'")
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO locks (team_id, name, holder_agent_id, holder_session, expires_at)
         SELECT team_id, 'secret-lock', id, '', now() + interval '1 minute'
         FROM agents WHERE name = 'alice'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let refusal = wait.await.unwrap().expect_err("a disabled agent's wait");
    assert!(message(&refusal).contains("is disabled"), "{refusal}");
    assert!(!refusal.to_string().contains("secret"), "{refusal}");
}

#[tokio::test]
async fn an_ask_blocked_across_its_agents_disable_answers_the_refusal_not_the_reply() {
    let app = spawn_app().await;
    let token = acme_with_alice(&app).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let alice = app.mcp(&token, None).await;

    let ask = tokio::spawn(async move {
        alice
            .call(
                "ask_agent",
                json!({ "to": "bob", "question": "ready?", "timeout_seconds": 30 }),
            )
            .await
    });
    let mut question = None;
    eventually("bob to receive the question", async || {
        let read = bob
            .call("read_messages", json!({ "scope": "inbox" }))
            .await
            .unwrap();
        question = read["messages"]
            .as_array()
            .and_then(|m| m.first())
            .map(|m| m["id"].as_str().unwrap().to_string());
        question.is_some()
    })
    .await;
    agents::set_disabled(&app.pool, &in_team("acme"), "alice", true)
        .await
        .unwrap();
    bob.call(
        "post_message",
        json!({ "to": "alice", "body": "secret reply", "reply_to": question.unwrap() }),
    )
    .await
    .unwrap();

    let answer = tokio::time::timeout(Duration::from_secs(20), ask)
        .await
        .expect("the ask wakes on bob's reply")
        .unwrap();
    let refusal = answer.expect_err("a disabled agent's ask");
    assert!(message(&refusal).contains("is disabled"), "{refusal}");
    assert!(!refusal.to_string().contains("secret"), "{refusal}");
}
