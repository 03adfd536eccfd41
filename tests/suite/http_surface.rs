//! The HTTP surface outside the tools: health, the JSON 404, body and rate
//! limits, and the Host allow-list.

use ai_crew_sync::config::HttpSettings;
use serde_json::{Value, json};

use crate::support::{TestApp, eventually, http_client, spawn_app};

#[tokio::test]
async fn health_answers_200_json_while_the_database_answers() {
    let app = spawn_app().await;
    let response = http_client().get(app.url("/health")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "ok");
    assert_eq!(body["database"], "ok");

    // Probes are answered from a snapshot refreshed about once a second:
    // the closed pool shows within a few.
    app.pool.close().await;
    eventually("a closed pool to be reported, not hidden", async || {
        let response = http_client().get(app.url("/health")).send().await.unwrap();
        response.status().as_u16() == 503
    })
    .await;
}

// `/health` is unauthenticated, and each look at the installation costs
// database queries: a burst of probes while the database is slow must not
// take the pool that tool calls need. Here the outbox table is locked, so a
// look waits in the database: thirty probes at once leave one query waiting
// (the refresher's), not one per probe, and every probe is answered.
#[tokio::test]
async fn a_burst_of_health_probes_holds_one_database_connection_not_the_pool() {
    use std::time::{Duration, Instant};

    use crate::write_fence::waiting_on;

    let app = spawn_app().await;
    let mut lock = app.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE conversation_outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let probes: Vec<_> = (0..30)
        .map(|_| {
            let url = app.url("/health");
            tokio::spawn(async move { http_client().get(url).send().await.unwrap().status() })
        })
        .collect();
    eventually("a look to reach the database", async || {
        waiting_on(&app.pool, false).await > 0
    })
    .await;
    // A second of the burst: a look per probe would have queued several.
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(1) {
        assert_eq!(
            waiting_on(&app.pool, false).await,
            1,
            "one look waits in the database"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lock.rollback().await.unwrap();
    for probe in probes {
        assert_eq!(probe.await.unwrap().as_u16(), 200);
    }
}

#[tokio::test]
async fn unknown_paths_get_a_json_404_naming_the_real_routes() {
    let app = spawn_app().await;
    let response = http_client()
        .get(app.url("/api/v1/nothing"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "not_found");
    let routes = body["routes"].as_array().unwrap();
    for route in [
        "POST /mcp",
        "GET /health",
        "GET /admin/whoami",
        "GET|POST /admin/teams",
    ] {
        assert!(
            routes.contains(&json!(route)),
            "{route} missing from {routes:?}"
        );
    }
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("/api/v1/nothing")
    );
}

#[tokio::test]
async fn an_oversized_request_gets_413_json_whether_declared_or_streamed() {
    let settings = HttpSettings {
        max_request_bytes: 64 * 1024,
        ..HttpSettings::default()
    };
    let app = TestApp::builder().http(settings).spawn().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"whoami","arguments":{{"pad":"{}"}}}}}}"#,
        "x".repeat(100 * 1024)
    );

    // Declared by Content-Length.
    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(&token)
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().contains("65536 bytes"),
        "{body}"
    );

    // Streamed without a length: the limit holds while reading.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .into_bytes()
        .chunks(8192)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let stream = futures::stream::iter(chunks);
    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(&token)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "invalid");
}

#[tokio::test]
async fn a_burst_over_the_rate_limit_gets_429_with_retry_after_per_token() {
    let settings = HttpSettings {
        rate_limit_per_minute: 5,
        ..HttpSettings::default()
    };
    let app = TestApp::builder().http(settings).spawn().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;

    let mut statuses = Vec::new();
    for _ in 0..7 {
        let response = app
            .raw_tool_call("whoami")
            .bearer_auth(&alice)
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
        if response.status().as_u16() == 429 {
            let retry: u64 = response.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                (1..=13).contains(&retry),
                "one request in 12 s comes back: {retry}"
            );
            let body: Value = response.json().await.unwrap();
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .contains("more than 5 requests"),
                "{body}"
            );
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);

    let response = app
        .raw_tool_call("whoami")
        .bearer_auth(&bob)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        200,
        "another token has its own allowance"
    );
}

#[tokio::test]
async fn a_host_outside_the_allow_list_is_refused_on_every_route() {
    let app = spawn_app().await;
    for path in ["/health", "/mcp", "/nothing"] {
        let response = http_client()
            .get(app.url(path))
            .header("Host", "evil.example:8787")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 403, "{path}");
        let body: Value = response.json().await.unwrap();
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("--allowed-hosts"),
            "{body}"
        );
    }
    let response = http_client()
        .get(app.url("/health"))
        .header("Host", format!("localhost:{}", app.addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);

    let open = TestApp::builder()
        .http(HttpSettings {
            allowed_hosts: vec!["bus.internal".into()],
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    let response = http_client()
        .get(open.url("/health"))
        .header("Host", "bus.internal")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        200,
        "a configured name is accepted"
    );
}

#[tokio::test]
async fn health_reports_a_failing_database_in_fixed_words_without_driver_text() {
    use std::str::FromStr;

    let app = spawn_app().await;
    let options = sqlx::postgres::PgConnectOptions::from_str(&app.database_url).unwrap();
    let database = options.get_database().unwrap().to_string();
    let admin = sqlx::PgPool::connect_with(options.database("postgres"))
        .await
        .unwrap();
    // The bus's connections are cut and no new one is let in: the driver
    // now has plenty to say (the database's name, the server's wording).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" WITH ALLOW_CONNECTIONS false"
    )))
    .execute(&admin)
    .await
    .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&database)
        .execute(&admin)
        .await
        .unwrap();

    let response = http_client().get(app.url("/health")).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" WITH ALLOW_CONNECTIONS true"
    )))
    .execute(&admin)
    .await
    .unwrap();
    assert_eq!(status, 503, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (body["status"].as_str(), body["database"].as_str()),
        (Some("unavailable"), Some("unreachable")),
        "{text}"
    );
    for driver_text in [database.as_str(), "error", "connection", "terminat"] {
        assert!(
            !text.to_lowercase().contains(driver_text),
            "health shows `{driver_text}` to an unauthenticated caller: {text}"
        );
    }
}
