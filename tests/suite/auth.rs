//! Who is calling: bearer tokens, disabled agents, the window header, and
//! `whoami` over a real MCP client.

use ai_crew_sync::store::{identity::agents, identity::tokens};
use serde_json::{Value, json};

use crate::support::{McpClient, eventually, globally, in_team, spawn_app};

#[tokio::test]
async fn whoami_over_mcp_returns_the_tokens_agent_team_and_window() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;

    let client = app.mcp(&token, Some("Frontend")).await;
    let info = client.server_info().expect("serverInfo after initialize");
    assert_eq!(info.name, "ai-crew-sync");
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    assert!(
        client
            .list_tool_names()
            .await
            .contains(&"whoami".to_string())
    );

    let me = client
        .call("whoami", json!({}))
        .await
        .expect("whoami answers");
    assert_eq!(me["agent"], "alice");
    assert_eq!(me["team"], "acme");
    assert_eq!(
        me["session"], "frontend",
        "the label is normalised to lower case"
    );
    assert_eq!(me["address"], "alice/frontend");
    let agent_id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM agents WHERE name = 'alice'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(me["agent_id"], agent_id.to_string());

    let shared = app.mcp(&token, None).await;
    let me = shared.call("whoami", json!({})).await.unwrap();
    assert_eq!(me["session"], "", "no header is the shared session");
    assert_eq!(me["address"], "alice");
}

async fn status_and_body(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON error body");
    (status, body)
}

#[tokio::test]
async fn missing_malformed_and_revoked_tokens_get_401_with_an_explanation() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;

    let (status, body) = status_and_body(app.raw_tool_call("whoami").send().await.unwrap()).await;
    assert_eq!(status, 401);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"),
        "{body}"
    );

    let malformed = app
        .raw_tool_call("whoami")
        .bearer_auth("acs_nothex")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.headers()["www-authenticate"], "Bearer");
    let (status, body) = status_and_body(malformed).await;
    assert_eq!(status, 401);
    assert!(
        body["message"].as_str().unwrap().contains("64 hex"),
        "{body}"
    );

    let unknown = format!("acs_{}", "0".repeat(64));
    let (status, body) = status_and_body(
        app.raw_tool_call("whoami")
            .bearer_auth(unknown)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("unknown agent token"),
        "{body}"
    );

    let (status, body) = status_and_body(
        app.raw_tool_call("whoami")
            .bearer_auth("acsa_admin")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401);
    assert!(
        body["message"].as_str().unwrap().contains("/admin"),
        "{body}"
    );

    // The token works, then is revoked, then is refused from the next request on.
    let client = app.mcp(&token, None).await;
    client
        .call("whoami", json!({}))
        .await
        .expect("a live token works");
    let id = tokens::list(&app.pool, &in_team("acme")).await.unwrap()[0].id;
    tokens::revoke(&app.pool, id, &globally()).await.unwrap();
    let (status, body) = status_and_body(
        app.raw_tool_call("whoami")
            .bearer_auth(&token)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401);
    assert!(
        body["message"].as_str().unwrap().contains("revoked"),
        "{body}"
    );
    assert!(
        McpClient::connect(&app.mcp_url(), &token, None)
            .await
            .is_err(),
        "MCP initialize is refused too"
    );
}

#[tokio::test]
async fn a_disabled_agent_gets_403_on_every_token_until_enabled() {
    let app = spawn_app().await;
    app.team("acme").await;
    let first = app.agent("acme", "alice").await;
    let second = tokens::issue(&app.pool, &in_team("acme"), "alice", Some("laptop"))
        .await
        .unwrap()
        .token;

    agents::set_disabled(&app.pool, &in_team("acme"), "alice", true)
        .await
        .unwrap();
    for token in [&first, &second] {
        let (status, body) = status_and_body(
            app.raw_tool_call("whoami")
                .bearer_auth(token)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 403);
        assert_eq!(body["error"], "forbidden");
        assert!(
            body["message"].as_str().unwrap().contains("agent enable"),
            "{body}"
        );
    }

    agents::set_disabled(&app.pool, &in_team("acme"), "alice", false)
        .await
        .unwrap();
    let me = app
        .mcp(&second, None)
        .await
        .call("whoami", json!({}))
        .await
        .unwrap();
    assert_eq!(me["agent"], "alice");
}

#[tokio::test]
async fn a_malformed_session_header_is_refused_before_the_token_is_looked_up() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;

    // With an unknown token the answer is still about the header: the token was never consulted.
    let unknown = format!("acs_{}", "f".repeat(64));
    for bad in ["alice/win", "x\tab", &"w".repeat(65), "wín"] {
        let (status, body) = status_and_body(
            app.raw_tool_call("whoami")
                .bearer_auth(&unknown)
                .header("X-Crew-Session", bad)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 400, "{bad:?}: {body}");
        assert_eq!(body["error"], "invalid");
        assert!(
            body["message"].as_str().unwrap().contains("label"),
            "{body}"
        );
    }

    // A valid token with a bad header is refused too, and its use is not recorded.
    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(&token)
        .header("X-Crew-Session", "a/b")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let last_used: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT last_used_at FROM agent_tokens")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(last_used.is_none(), "the token was not looked up");
}

#[tokio::test]
async fn concurrent_revocations_make_one_transition_and_one_audit_row() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.agent("acme", "alice").await;
    let id = tokens::list(&app.pool, &in_team("acme")).await.unwrap()[0].id;

    let attempts: Vec<_> = (0..8)
        .map(|_| {
            let pool = app.pool.clone();
            tokio::spawn(async move {
                tokens::revoke(&pool, id, &globally())
                    .await
                    .unwrap()
                    .revoked_now
            })
        })
        .collect();
    let mut transitions = 0;
    for attempt in attempts {
        transitions += usize::from(attempt.await.unwrap());
    }
    assert_eq!(transitions, 1);
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'token.revoke'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn an_agent_holds_at_most_100_active_tokens_and_secrets_are_never_stored() {
    let app = spawn_app().await;
    app.team("acme").await;
    let first = app.agent("acme", "alice").await;
    for _ in 1..100 {
        tokens::issue(&app.pool, &in_team("acme"), "alice", None)
            .await
            .unwrap();
    }
    let refused = tokens::issue(&app.pool, &in_team("acme"), "alice", None)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("limit is 100"), "{refused}");
    assert!(
        refused.to_string().contains("token revoke"),
        "says what to do: {refused}"
    );

    // Revoking one frees a slot.
    let id = tokens::list(&app.pool, &in_team("acme")).await.unwrap()[0].id;
    tokens::revoke(&app.pool, id, &globally()).await.unwrap();
    tokens::issue(&app.pool, &in_team("acme"), "alice", None)
        .await
        .expect("a freed slot");

    // Neither the tokens table nor the audit log holds a secret.
    let dump: String = sqlx::query_scalar(
        "SELECT (SELECT string_agg(t::text, ' ') FROM agent_tokens t) || (SELECT string_agg(a::text, ' ') FROM audit_log a)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(
        !dump.contains(&first[4..]),
        "a token's secret part is stored somewhere"
    );
}

/// Servers cache the credentials they have looked up; a revocation reaches
/// every replica's cache through the event channel at its commit. Replica B
/// has served a window's credential and an agent token (from its cache after
/// the first call); the window is revoked over MCP on replica A, the token
/// the way the CLI does it (straight in the database, no server involved):
/// B refuses each from the next request on.
#[tokio::test]
async fn a_revocation_on_one_replica_is_refused_on_another_that_cached_the_credential() {
    let a = spawn_app().await;
    let b = a.replica().spawn().await;
    a.team("acme").await;
    let token = a.agent("acme", "alice").await;
    let credential = a
        .mcp(&token, None)
        .await
        .call("register_session", json!({ "session": "w1" }))
        .await
        .unwrap()["credential"]
        .as_str()
        .unwrap()
        .to_string();
    // B caches only while its event listener is attached.
    let generation = || b.bus.events.credentials_generation();
    eventually(
        "the event listener to attach (a credentials generation)",
        async || generation().is_some(),
    )
    .await;
    let whoami_on_b = async |bearer: &str| {
        status_and_body(
            b.raw_tool_call("whoami")
                .bearer_auth(bearer)
                .send()
                .await
                .unwrap(),
        )
        .await
    };
    for bearer in [&token, &credential] {
        for _ in 0..2 {
            let (status, body) = whoami_on_b(bearer).await;
            assert_eq!(status, 200, "{body}");
        }
    }

    // The window, revoked on A over MCP.
    let before = generation();
    a.mcp(&credential, None)
        .await
        .call("revoke_session", json!({}))
        .await
        .unwrap();
    // The notification reaching B is what empties its cache; without it B
    // would serve the credential for the cache's lifetime (60 s).
    eventually(
        "the notification to reach the credentials cache",
        async || generation() != before,
    )
    .await;
    let (status, body) = whoami_on_b(&credential).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("revoked"),
        "{body}"
    );

    // The token still works on B, until revoked behind every server's back.
    let (status, body) = whoami_on_b(&token).await;
    assert_eq!(status, 200, "{body}");
    let before = generation();
    let id = tokens::list(&a.pool, &in_team("acme")).await.unwrap()[0].id;
    tokens::revoke(&a.pool, id, &globally()).await.unwrap();
    eventually(
        "the notification to reach the credentials cache",
        async || generation() != before,
    )
    .await;
    let (status, body) = whoami_on_b(&token).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("revoked"),
        "{body}"
    );
}
