//! Authenticated windows: session credentials, epochs, the guard, cascades.

use ai_crew_sync::auth::{self, AgentCredential};
use ai_crew_sync::store::{identity::agents, identity::sessions, identity::tokens};
use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, globally, in_team, spawn_app};

async fn register(client: &McpClient, label: &str) -> Value {
    client
        .call("register_session", json!({ "session": label }))
        .await
        .unwrap_or_else(|e| panic!("register {label}: {e}"))
}

async fn session_client(app: &TestApp, credential: &Value) -> McpClient {
    app.mcp(credential["credential"].as_str().unwrap(), None)
        .await
}

async fn audit_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_windows_are_separate_a_live_label_is_refused_and_revoke_frees_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let agent = app.mcp(&token, None).await;

    let w1 = register(&agent, "W1").await;
    let w2 = register(&agent, "w2").await;
    assert_eq!(w1["session"], "w1");
    assert_eq!(w1["epoch"], 1);
    assert_eq!(w1["address"], "alice/w1");
    assert!(w1["credential"].as_str().unwrap().starts_with("acss_"));

    let one = session_client(&app, &w1)
        .await
        .call("whoami", json!({}))
        .await
        .unwrap();
    let two = session_client(&app, &w2)
        .await
        .call("whoami", json!({}))
        .await
        .unwrap();
    assert_eq!(
        (one["session"].as_str(), two["session"].as_str()),
        (Some("w1"), Some("w2"))
    );
    assert_eq!(one["agent"], two["agent"]);
    assert_eq!(one["credential"], "session");

    let refused = agent
        .call("register_session", json!({ "session": "w1" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("already has a live session"),
        "{refused}"
    );

    // Window 2 revokes window 1 by label; the label is free again, one epoch higher.
    let revoked = session_client(&app, &w2)
        .await
        .call("revoke_session", json!({ "session": "w1" }))
        .await
        .unwrap();
    assert!(revoked["revoked_at"].is_string());
    let again = register(&agent, "w1").await;
    assert_eq!(again["epoch"], 2);
    assert_eq!(
        again["session_id"], w1["session_id"],
        "one row per (agent, label)"
    );
    assert!(
        McpClient::connect(&app.mcp_url(), w1["credential"].as_str().unwrap(), None)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn resume_rotates_the_secret_and_fences_older_epochs() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let w1 = register(&app.mcp(&token, None).await, "w1").await;
    let old = w1["credential"].as_str().unwrap().to_string();

    let resumed = app
        .mcp(&old, None)
        .await
        .call("resume_session", json!({}))
        .await
        .unwrap();
    assert_eq!(resumed["epoch"], 2);
    let new = resumed["credential"].as_str().unwrap().to_string();
    assert_ne!(new, old);

    // The old secret is gone; the new one at an older epoch is stale.
    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(&old)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(&new)
        .header("X-Crew-Epoch", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 409);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("this connection is stale"),
        "{body}"
    );

    let current = McpClient::connect_with(
        &app.mcp_url(),
        &new,
        &[("x-crew-epoch", "2"), ("x-crew-session", "W1")],
    )
    .await
    .unwrap();
    let me = current.call("whoami", json!({})).await.unwrap();
    assert_eq!(me["epoch"], 2);

    // A header naming another window than the credential's is refused.
    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(&new)
        .header("X-Crew-Session", "w9")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);

    // The guard refuses an identity that authenticated at epoch 2 once epoch 3 exists.
    let AgentCredential::Session(digest) = auth::parse_agent_credential(&new).unwrap() else {
        unreachable!()
    };
    let at_two = sessions::authenticate(&app.pool, &digest, None, None)
        .await
        .unwrap();
    current.call("resume_session", json!({})).await.unwrap();
    let before = audit_count(&app).await;
    let err = sessions::renew(&app.pool, &at_two, Some(600))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("this connection is stale"),
        "{err}"
    );
    assert_eq!(
        audit_count(&app).await,
        before,
        "a refused mutation writes nothing"
    );
}

#[tokio::test]
async fn a_revoked_session_is_refused_and_writes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let agent = app.mcp(&token, None).await;
    let w1 = register(&agent, "w1").await;
    let credential = w1["credential"].as_str().unwrap();
    let AgentCredential::Session(digest) = auth::parse_agent_credential(credential).unwrap() else {
        unreachable!()
    };
    let me = sessions::authenticate(&app.pool, &digest, None, None)
        .await
        .unwrap();

    agent
        .call("revoke_session", json!({ "session": "w1" }))
        .await
        .unwrap();
    let expiry_before: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT expires_at FROM agent_sessions")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let audit_before = audit_count(&app).await;

    let err = sessions::renew(&app.pool, &me, Some(600))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("was revoked"), "{err}");
    let response = app
        .raw_tool_call("renew_session")
        .bearer_auth(credential)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("register"),
        "says what to do: {body}"
    );

    let expiry_after: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT expires_at FROM agent_sessions")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(expiry_before, expiry_after);
    assert_eq!(audit_count(&app).await, audit_before);
}

/// A mutation racing a revoke either commits before it (and the revoke sees
/// its effect) or is refused: it never commits after the revoke.
#[tokio::test]
async fn a_mutation_racing_a_revoke_never_commits_after_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let AgentCredential::Token(token_digest) = auth::parse_agent_credential(&token).unwrap() else {
        unreachable!()
    };
    let agent = tokens::authenticate(&app.pool, &token_digest, String::new())
        .await
        .unwrap();

    let (mut renewed_first, mut refused) = (0, 0);
    for round in 0..30 {
        let issued = sessions::register(&app.pool, &agent, "race", Some(3600), 0)
            .await
            .unwrap();
        assert_eq!(issued.epoch, round + 1);
        let AgentCredential::Session(digest) =
            auth::parse_agent_credential(&issued.credential).unwrap()
        else {
            unreachable!()
        };
        let window = sessions::authenticate(&app.pool, &digest, None, None)
            .await
            .unwrap();

        let renew = {
            let (pool, window) = (app.pool.clone(), window.clone());
            tokio::spawn(async move { sessions::renew(&pool, &window, Some(60 + round)).await })
        };
        let revoke = {
            let (pool, agent) = (app.pool.clone(), agent.clone());
            tokio::spawn(async move { sessions::revoke(&pool, &agent, Some("race")).await })
        };
        let (renew, revoke) = (renew.await.unwrap(), revoke.await.unwrap().unwrap());
        let final_expiry: chrono::DateTime<chrono::Utc> =
            sqlx::query_scalar("SELECT expires_at FROM agent_sessions WHERE label = 'race'")
                .fetch_one(&app.pool)
                .await
                .unwrap();
        assert_eq!(
            final_expiry, revoke.expires_at,
            "round {round}: a renew committed after the revoke"
        );
        match renew {
            Ok(state) => {
                assert_eq!(
                    state.expires_at, revoke.expires_at,
                    "the revoke saw the renew"
                );
                renewed_first += 1;
            }
            Err(err) => {
                assert!(err.to_string().contains("was revoked"), "{err}");
                refused += 1;
            }
        }
    }
    eprintln!("race outcomes: renew first {renewed_first}, refused {refused}");
}

#[tokio::test]
async fn revoking_the_token_kills_its_sessions_and_disabling_refuses_everything() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let spare = tokens::issue(&app.pool, &in_team("acme"), "alice", None)
        .await
        .unwrap()
        .token;
    let agent = app.mcp(&token, None).await;
    let w1 = register(&agent, "w1").await;
    let w2 = register(&app.mcp(&spare, None).await, "w2").await;

    // Session credentials never mint anything.
    let refused = session_client(&app, &w2)
        .await
        .call("register_session", json!({ "session": "w3" }))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden");

    let id = tokens::list(&app.pool, &in_team("acme"))
        .await
        .unwrap()
        .into_iter()
        .find(|t| token.starts_with(&t.display_prefix))
        .unwrap()
        .id;
    tokens::revoke(&app.pool, id, &globally()).await.unwrap();
    let revoked_at: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT revoked_at FROM agent_sessions WHERE label = 'w1'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(
        revoked_at.is_some(),
        "the session was revoked in the token's transaction"
    );
    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(w1["credential"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);

    // w2 hangs off the spare token and lives on, until the agent is disabled.
    session_client(&app, &w2)
        .await
        .call("whoami", json!({}))
        .await
        .unwrap();
    agents::set_disabled(&app.pool, &in_team("acme"), "alice", true)
        .await
        .unwrap();
    for bearer in [w2["credential"].as_str().unwrap(), spare.as_str()] {
        let response = app
            .raw_tool_call("whoami")
            .bearer_auth(bearer)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 403);
    }
}

/// Two tokens of one agent register the same dead label at once; the row is
/// held so both are seen queued on it, then let go. One takes the label over
/// (its token now on the row); the other waited that out and must be told
/// the window is live. It once failed instead: the token came from a join,
/// which a locked read does not evaluate again against the newer row, so the
/// row dropped out.
#[tokio::test]
async fn two_tokens_taking_over_one_dead_label_at_once_leave_one_live_window() {
    let app = spawn_app().await;
    app.team("acme").await;
    let first = app.mcp(&app.agent("acme", "alice").await, None).await;
    let laptop = tokens::issue(&app.pool, &in_team("acme"), "alice", Some("laptop"))
        .await
        .unwrap()
        .token;
    let second = app.mcp(&laptop, None).await;
    register(&first, "w1").await;
    first
        .call("revoke_session", json!({ "session": "w1" }))
        .await
        .unwrap();

    let (taken, refused) = crate::write_fence::queued_on_one_row(
        &app.pool,
        "SELECT 1 FROM agent_sessions WHERE label = 'w1' FOR UPDATE",
        async move {
            second
                .call("register_session", json!({ "session": "w1" }))
                .await
        },
        async move {
            first
                .call("register_session", json!({ "session": "w1" }))
                .await
        },
    )
    .await;
    let taken = taken.expect("the laptop takes w1 over");
    assert_eq!(taken["epoch"], 2, "{taken}");
    let refused = refused.unwrap_err();
    assert_eq!(refused["error"], "conflict", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("already has a live session"),
        "{refused}"
    );
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_sessions WHERE label = 'w1' AND revoked_at IS NULL",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(live, 1);
}

/// Each window is a row, a credential and a share of the agent's calls: an
/// agent holds at most its cap of live sessions, is told the limit and what
/// to do, and has room again once it ends one.
#[tokio::test]
async fn an_agent_holds_at_most_its_cap_of_live_sessions() {
    let app = crate::support::TestApp::builder()
        .http(ai_crew_sync::config::HttpSettings {
            max_sessions_per_agent: 2,
            ..Default::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let other = app.agent("acme", "bob").await;
    let agent = app.mcp(&token, None).await;
    register(&agent, "w1").await;
    register(&agent, "w2").await;

    let refused = agent
        .call("register_session", json!({ "session": "w3" }))
        .await
        .expect_err("a third live session is refused");
    let text = refused.to_string();
    assert!(
        text.contains("already has 2 live sessions") && text.contains("the limit is 2 per agent"),
        "{text}"
    );
    assert!(text.contains("revoke_session"), "says what to do: {text}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_sessions WHERE label = 'w3'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "a refused registration writes nothing");

    // Another agent has its own allowance.
    register(&app.mcp(&other, None).await, "w1").await;
    // The rows windows leave are outside the quota, but counted.
    let team_id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = 'acme'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let usage = ai_crew_sync::store::operations::usage::count(&app.pool, team_id, "acme")
        .await
        .unwrap();
    let sessions = usage.kind("sessions").expect("sessions are counted");
    assert_eq!((sessions.rows, sessions.in_quota), (3, false));
    assert!(usage.kind("presence").is_some() && usage.kind("read_cursors").is_some());

    agent
        .call("revoke_session", json!({ "session": "w1" }))
        .await
        .expect("revoke w1");
    register(&agent, "w3").await;
    // Taking over a dead label counts like a new one.
    let refused = agent
        .call("register_session", json!({ "session": "w1" }))
        .await
        .expect_err("w1 again would be a third live session");
    assert!(refused.to_string().contains("the limit is 2"), "{refused}");
}
