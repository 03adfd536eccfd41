//! Remote administration: admin credentials, the `/admin` API and its scope
//! rules, and the admin CLI against a spawned server.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use ai_crew_sync::config::HttpSettings;
use ai_crew_sync::store::identity::admin;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, globally, http_client, in_team, spawn_app, test_actor};

pub(crate) async fn api(
    app: &TestApp,
    credential: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = http_client()
        .request(method, app.url(path))
        .bearer_auth(credential);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn global_credential(app: &TestApp) -> String {
    admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential
}

/// The installation's first global credential and one it grants, confined
/// to `team`: the two sides of every "only a global admin may" test.
pub(crate) async fn global_and_confined(app: &TestApp, team: &str) -> (String, String) {
    let root = global_credential(app).await;
    let (status, granted) = api(
        app,
        &root,
        Method::POST,
        "/admin/credentials",
        Some(json!({"team": team})),
    )
    .await;
    assert_eq!(status, 201, "{granted}");
    let confined = granted["credential"].as_str().unwrap().to_owned();
    (root, confined)
}

#[tokio::test]
async fn a_global_credential_onboards_a_team_end_to_end_and_every_change_is_audited() {
    let app = spawn_app().await;
    let root = global_credential(&app).await;
    assert!(
        admin::bootstrap(&app.pool, None, false, &test_actor())
            .await
            .is_err(),
        "a second bootstrap needs --force"
    );

    let (status, me) = api(&app, &root, Method::GET, "/admin/whoami", None).await;
    assert_eq!((status, me["scope"].as_str()), (200, Some("global")));

    let (status, team) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams",
        Some(json!({"slug": "acme", "name": "Acme"})),
    )
    .await;
    assert_eq!(status, 201, "{team}");
    let (status, added) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/agents",
        Some(json!({"name": "alice"})),
    )
    .await;
    assert_eq!(status, 201, "{added}");
    let (status, issued) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/tokens",
        Some(json!({"agent": "alice", "label": "ci"})),
    )
    .await;
    assert_eq!(status, 201, "{issued}");
    let token = issued["token"].as_str().unwrap();

    let me = app
        .mcp(token, None)
        .await
        .call("whoami", json!({}))
        .await
        .unwrap();
    assert_eq!(
        (me["agent"].as_str(), me["team"].as_str()),
        (Some("alice"), Some("acme"))
    );

    let (status, _) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/agents/alice/disable",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, revoked) = api(
        &app,
        &root,
        Method::DELETE,
        &format!(
            "/admin/teams/acme/tokens/{}",
            issued["id"].as_str().unwrap()
        ),
        None,
    )
    .await;
    assert_eq!((status, &revoked["revoked_now"]), (200, &json!(true)));
    let (status, granted) = api(
        &app,
        &root,
        Method::POST,
        "/admin/credentials",
        Some(json!({"team": "acme"})),
    )
    .await;
    assert_eq!((status, granted["scope"].as_str()), (201, Some("acme")));
    let (status, _) = api(
        &app,
        &root,
        Method::DELETE,
        &format!("/admin/credentials/{}", granted["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(status, 200);

    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT actor, source, action FROM audit_log ORDER BY id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    let actions: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(
        actions,
        [
            "admin_credential.grant",
            "team.create",
            "agent.add",
            "token.issue",
            "token.issue",
            "agent.disable",
            "token.revoke",
            "admin_credential.grant",
            "admin_credential.revoke"
        ]
    );
    assert!(
        rows[1..]
            .iter()
            .all(|r| r.0.starts_with("admin:acsa_") && r.1 == "http"),
        "{rows:?}"
    );
    let dump: String = sqlx::query_scalar("SELECT string_agg(a::text, ' ') FROM audit_log a")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    for secret in [
        &root,
        token,
        added["token"].as_str().unwrap(),
        granted["credential"].as_str().unwrap(),
    ] {
        assert!(
            !dump.contains(&secret[12..]),
            "the audit log holds a secret"
        );
    }
}

#[tokio::test]
async fn a_team_credential_cannot_leave_its_team_by_any_route() {
    let app = spawn_app().await;
    app.team("red").await;
    app.team("blue").await;
    app.agent("blue", "bob").await;
    let red = admin::grant(&app.pool, &globally(), Some("red"), Some("red ops"))
        .await
        .unwrap()
        .credential;

    let (status, teams) = api(&app, &red, Method::GET, "/admin/teams", None).await;
    assert_eq!(status, 200);
    assert_eq!(teams.as_array().unwrap().len(), 1);
    assert_eq!(teams[0]["slug"], "red");

    // Another team's slug is 403, whether the team exists or not: same answer.
    let (status_blue, blue) = api(&app, &red, Method::GET, "/admin/teams/blue/agents", None).await;
    let (status_none, none) = api(
        &app,
        &red,
        Method::GET,
        "/admin/teams/no-such-team/agents",
        None,
    )
    .await;
    assert_eq!((status_blue, status_none), (403, 403));
    assert_eq!(blue["message"], none["message"]);
    for (method, path, body) in [
        (
            Method::POST,
            "/admin/teams/blue/agents",
            Some(json!({"name": "eve"})),
        ),
        (
            Method::POST,
            "/admin/teams/blue/tokens",
            Some(json!({"agent": "bob"})),
        ),
        (Method::GET, "/admin/teams/blue/tokens", None),
        (Method::POST, "/admin/teams/blue/agents/bob/disable", None),
        (
            Method::POST,
            "/admin/teams",
            Some(json!({"slug": "green", "name": "Green"})),
        ),
        (Method::GET, "/admin/credentials", None),
        (
            Method::POST,
            "/admin/credentials",
            Some(json!({"team": "red"})),
        ),
    ] {
        let (status, body) = api(&app, &red, method.clone(), path, body).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
    }

    // A foreign token id under its own team's path: not found, and untouched.
    let blue_token = ai_crew_sync::store::identity::tokens::list(&app.pool, &in_team("blue"))
        .await
        .unwrap()[0]
        .id;
    let (status, _) = api(
        &app,
        &red,
        Method::DELETE,
        &format!("/admin/teams/red/tokens/{blue_token}"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let revoked: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT revoked_at FROM agent_tokens WHERE id = $1")
            .bind(blue_token)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(revoked.is_none());

    // The body never widens the path: unknown fields are refused.
    let (status, body) = api(
        &app,
        &red,
        Method::POST,
        "/admin/teams/red/agents",
        Some(json!({"name": "eve", "team": "blue"})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        ai_crew_sync::store::identity::agents::list(&app.pool, &in_team("blue"))
            .await
            .unwrap()
            .len(),
        1
    );

    // Inside its team it works.
    let (status, _) = api(
        &app,
        &red,
        Method::POST,
        "/admin/teams/RED/agents",
        Some(json!({"name": "rita"})),
    )
    .await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn credential_classes_never_cross_between_mcp_and_admin() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let root = global_credential(&app).await;

    let (status, body) = api(&app, &token, Method::GET, "/admin/whoami", None).await;
    assert_eq!(status, 401);
    assert!(
        body["message"].as_str().unwrap().contains("call /mcp"),
        "{body}"
    );

    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(&root)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("/admin only"),
        "{body}"
    );
    assert!(
        McpClient::connect(&app.mcp_url(), &root, None)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn the_admin_api_has_its_own_rate_and_body_limits_and_the_token_cap_holds() {
    let app = TestApp::builder()
        .http(HttpSettings {
            rate_limit_per_minute: 20,
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    let root = global_credential(&app).await;
    let statuses: Vec<u16> = {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let response = http_client()
                .get(app.url("/admin/whoami"))
                .bearer_auth(&root)
                .send()
                .await
                .unwrap();
            if response.status().as_u16() == 429 {
                assert!(response.headers().contains_key("retry-after"));
            }
            statuses.push(response.status().as_u16());
        }
        statuses
    };
    assert_eq!(statuses, [200, 200, 429], "a tenth of 20 per minute is 2");

    let open = TestApp::builder()
        .http(HttpSettings {
            rate_limit_per_minute: 0,
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    let root = global_credential(&open).await;
    let (status, _) = api(
        &open,
        &root,
        Method::POST,
        "/admin/teams",
        Some(json!({"slug": "acme", "name": "x".repeat(17 * 1024)})),
    )
    .await;
    assert_eq!(status, 413);
    open.team("acme").await;
    open.agent("acme", "alice").await;
    for _ in 1..100 {
        let (status, _) = api(
            &open,
            &root,
            Method::POST,
            "/admin/teams/acme/tokens",
            Some(json!({"agent": "alice"})),
        )
        .await;
        assert_eq!(status, 201);
    }
    let (status, body) = api(
        &open,
        &root,
        Method::POST,
        "/admin/teams/acme/tokens",
        Some(json!({"agent": "alice"})),
    )
    .await;
    assert_eq!(status, 409);
    assert!(
        body["message"].as_str().unwrap().contains("limit is 100"),
        "{body}"
    );
}

// A token's or a credential's label, or a team's name, past its limit is
// refused with the limit and what to give instead, and nothing is written.
#[tokio::test]
async fn labels_and_names_past_their_limits_are_refused_and_write_nothing() {
    let app = spawn_app().await;
    let root = global_credential(&app).await;
    app.team("acme").await;
    app.agent("acme", "alice").await;
    let count = async |table: &str| -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    let (tokens, credentials, teams) = (
        count("agent_tokens").await,
        count("admin_credentials").await,
        count("teams").await,
    );
    let refusals = [
        (
            "/admin/teams/acme/tokens",
            json!({"agent": "alice", "label": "x".repeat(65)}),
            "token label is 65 bytes; the limit is 64",
        ),
        (
            "/admin/credentials",
            json!({"label": "x".repeat(65)}),
            "credential label is 65 bytes; the limit is 64",
        ),
        (
            "/admin/teams",
            json!({"slug": "beta", "name": "x".repeat(201)}),
            "1-200 bytes",
        ),
    ];
    for (path, body, says) in refusals {
        let (status, answer) = api(&app, &root, Method::POST, path, Some(body)).await;
        assert_eq!(status, 400, "{path}: {answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains(says), "{path}: {message}");
        assert!(message.contains("nothing was"), "{path}: {message}");
    }
    assert_eq!(count("agent_tokens").await, tokens);
    assert_eq!(count("admin_credentials").await, credentials);
    assert_eq!(count("teams").await, teams);
}

/// Run the CLI off the runtime thread: the server under test shares this runtime.
async fn bus(
    app: &TestApp,
    config_dir: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    let (database_url, config_dir) = (app.database_url.clone(), config_dir.to_path_buf());
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let stdin = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        run_cli(&database_url, &config_dir, &args, stdin.as_deref())
    })
    .await
    .unwrap()
}

fn run_cli(
    database_url: &str,
    config_dir: &std::path::Path,
    args: &[String],
    stdin: Option<&str>,
) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("BUS_CONFIG_DIR", config_dir)
        .env_remove("BUS_ADMIN_URL")
        .env_remove("BUS_ADMIN_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[tokio::test]
async fn the_admin_cli_logs_in_and_onboards_a_team_with_a_verified_token() {
    let app = spawn_app().await;
    let config = tempfile::tempdir().unwrap();
    let url = app.url("");

    let (ok, out, err) = bus(&app, config.path(), &["admin", "bootstrap", "--json"], None).await;
    assert!(ok, "{err}");
    let credential = serde_json::from_str::<Value>(&out).unwrap()["credential"]
        .as_str()
        .unwrap()
        .to_string();

    let (ok, out, err) = bus(
        &app,
        config.path(),
        &["admin", "login", "--url", &url],
        Some(&format!("{credential}\n")),
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("scope global"), "{out}");
    let file = config.path().join("admin.json");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let steps: [&[&str]; 3] = [
        &[
            "admin", "team", "create", "--slug", "acme", "--name", "Acme", "--json",
        ],
        &[
            "admin", "agent", "add", "--team", "acme", "--name", "alice", "--json",
        ],
        &[
            "admin", "token", "issue", "--team", "acme", "--agent", "alice", "--label", "laptop",
            "--json",
        ],
    ];
    let mut last = Value::Null;
    for step in steps {
        let (ok, out, err) = bus(&app, config.path(), step, None).await;
        assert!(ok, "{step:?}: {err}");
        last = serde_json::from_str(&out).unwrap();
    }
    let token = last["token"].as_str().unwrap();
    let me = app
        .mcp(token, None)
        .await
        .call("whoami", json!({}))
        .await
        .unwrap();
    assert_eq!(me["agent"], "alice");

    let (ok, out, _) = bus(
        &app,
        config.path(),
        &["admin", "token", "list", "--team", "acme", "--json"],
        None,
    )
    .await;
    assert!(ok);
    assert!(!out.contains(&token[12..]), "listings never show secrets");

    let (ok, _, _) = bus(&app, config.path(), &["admin", "logout"], None).await;
    assert!(ok && !file.exists());
    let (ok, _, err) = bus(&app, config.path(), &["admin", "whoami"], None).await;
    assert!(!ok && err.contains("admin login"), "{err}");
}

/// A front that sends `/mcp` to one server and everything else to another:
/// the network fault that makes a freshly issued token fail verification.
async fn split_front(admin_side: String, mcp_side: String) -> String {
    use axum::body::{Body, to_bytes};
    use axum::extract::Request;
    use axum::response::Response;

    let forward = move |request: Request| {
        let (admin_side, mcp_side) = (admin_side.clone(), mcp_side.clone());
        async move {
            let path = request
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            let base = if path.starts_with("/mcp") {
                mcp_side
            } else {
                admin_side
            };
            let (parts, body) = request.into_parts();
            let body = to_bytes(body, usize::MAX).await.unwrap();
            let mut outgoing = http_client()
                .request(parts.method, format!("{base}{path}"))
                .body(body);
            for (name, value) in parts.headers.iter().filter(|(n, _)| *n != "host") {
                outgoing = outgoing.header(name, value);
            }
            let answer = outgoing.send().await.unwrap();
            let mut response = Response::builder().status(answer.status());
            for (name, value) in answer.headers() {
                response = response.header(name, value);
            }
            response
                .body(Body::from(answer.bytes().await.unwrap()))
                .unwrap()
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, axum::Router::new().fallback(forward)).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn admin_token_issue_revokes_a_token_that_does_not_verify() {
    let issuing = spawn_app().await;
    let elsewhere = spawn_app().await;
    let root = global_credential(&issuing).await;
    issuing.team("acme").await;
    issuing.agent("acme", "alice").await;
    let front = split_front(issuing.url(""), elsewhere.url("")).await;
    let config = tempfile::tempdir().unwrap();

    let (ok, out, err) = {
        let (root, front, dir) = (root.clone(), front.clone(), config.path().to_path_buf());
        tokio::task::spawn_blocking(move || {
            let out = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
                .args([
                    "admin", "token", "issue", "--team", "acme", "--agent", "alice", "--json",
                ])
                .env("BUS_ADMIN_URL", front)
                .env("BUS_ADMIN_TOKEN", root)
                .env("BUS_CONFIG_DIR", dir)
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        })
        .await
        .unwrap()
    };
    assert!(!ok, "a token that does not verify is an error");
    assert!(out.trim().is_empty(), "no token is printed: {out}");
    assert!(
        err.contains("did not verify") && err.contains("it was revoked"),
        "{err}"
    );
    let live: i64 =
        sqlx::query_scalar("SELECT count(*) FROM agent_tokens WHERE revoked_at IS NULL")
            .fetch_one(&issuing.pool)
            .await
            .unwrap();
    assert_eq!(
        live, 1,
        "only the first token is live; the unverified one was revoked"
    );
}
