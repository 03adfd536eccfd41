//! `GET /metrics` as an operator's Prometheus sees it: on the separate
//! metrics listener without a credential, on the main listener only to a
//! global admin credential, in text that parses as the exposition format,
//! with counters that move after tool calls, refusals and drain passes, and
//! database gauges exact for the scraping server.
//!
//! The recorder is process-wide and these tests share the process with
//! every other test: counters are asserted to have grown, never to hold a
//! value. The scrape-time gauges come from the app's own database, so they
//! are asserted exactly.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use ai_crew_sync::config::HttpSettings;
use ai_crew_sync::store::identity::admin;
use ai_crew_sync::workers::publication;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::nats::nats_url;
use crate::support::{
    TestApp, drain_settings, eventually, free_port, globally, http_client, spawn_app, test_actor,
};

/// One sample line: `name{label="value",…} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parse Prometheus text strictly: every line is a comment (`# HELP`,
/// `# TYPE`), blank, or a sample; anything else fails the test.
fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            assert!(
                comment.starts_with("HELP ") || comment.starts_with("TYPE "),
                "a comment that is neither HELP nor TYPE: {line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("a sample line without a value: {line}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("not a number in: {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels in: {line}"));
                (name, parse_labels(body, line))
            }
        };
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                && !name.starts_with(|c: char| c.is_ascii_digit()),
            "not a metric name: {name:?} in {line}"
        );
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    samples
}

/// `a="x",b="y"`, with `\\`, `\"` and `\n` escapes inside values.
fn parse_labels(body: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("a label without =\" in: {line}"));
        assert!(
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "not a label name: {key:?} in {line}"
        );
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("a dangling escape in: {line}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("an unclosed label value in: {line}"),
            }
        };
        labels.insert(key.to_owned(), value);
        rest = after[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&after[end + 1..]);
    }
    labels
}

/// The sum of `name`'s samples carrying every label of `with` (0 when none).
fn value(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

async fn get_metrics(addr: SocketAddr) -> (u16, String) {
    let response = http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("the metrics listener answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// A scrape of the app's separate metrics listener, parsed.
async fn scrape(app: &TestApp) -> Vec<Sample> {
    let addr = app.metrics_addr.expect("spawned with a metrics listener");
    let (status, text) = get_metrics(addr).await;
    assert_eq!(status, 200, "{text}");
    parse(&text)
}

fn assert_grew(before: &[Sample], after: &[Sample], name: &str, with: &[(&str, &str)]) {
    let (b, a) = (value(before, name, with), value(after, name, with));
    assert!(a > b, "{name}{with:?} did not grow: {b} then {a}");
}

#[tokio::test]
async fn tool_calls_are_counted_by_tool_and_outcome_and_timed_and_labels_carry_no_names() {
    let app = TestApp::builder().metrics_listener().spawn().await;
    app.team("metrics-a").await;
    let agent = "zq-metrics-agent-7";
    let token = app.agent("metrics-a", agent).await;
    let client = app.mcp(&token, Some("zq-window-7")).await;
    let before = scrape(&app).await;

    client.call("whoami", json!({})).await.expect("whoami");
    let refused = client
        .call("claim_task", json!({ "key": "zq-no-such-task" }))
        .await
        .expect_err("no such task");
    let kind = refused["error"]
        .as_str()
        .expect("a refusal kind")
        .to_owned();
    let after = scrape(&app).await;

    assert_grew(
        &before,
        &after,
        "bus_mcp_tool_calls_total",
        &[("tool", "whoami"), ("outcome", "ok")],
    );
    assert_grew(
        &before,
        &after,
        "bus_mcp_tool_calls_total",
        &[("tool", "claim_task"), ("outcome", &kind)],
    );
    assert_grew(
        &before,
        &after,
        "bus_mcp_tool_call_duration_seconds_count",
        &[("tool", "whoami")],
    );
    assert_grew(
        &before,
        &after,
        "bus_http_responses_total",
        &[("route", "/mcp"), ("status", "200")],
    );
    // The event listener hears the publisher's pings (every second here).
    eventually("a notification to be counted", async || {
        let now = scrape(&app).await;
        let name = "bus_event_notifications_received_total";
        value(&now, name, &[]) > value(&before, name, &[])
    })
    .await;
    // The listener's state is one of three, exactly one set.
    let states: f64 = ["live", "silent", "detached"]
        .iter()
        .map(|s| value(&after, "bus_event_listener_state", &[("state", s)]))
        .sum();
    assert_eq!(states, 1.0);
    assert!(value(&after, "bus_db_pool_max_connections", &[]) >= 1.0);

    for sample in &after {
        for (key, label) in &sample.labels {
            assert!(
                label != agent && label != &token && !label.contains("zq-"),
                "{}: label {key}={label:?} carries a name, token or argument",
                sample.name
            );
        }
    }
}

#[tokio::test]
async fn a_blocked_long_poll_is_an_open_long_poll_until_it_answers() {
    let app = TestApp::builder().metrics_listener().spawn().await;
    app.team("metrics-w").await;
    let waiter = app.mcp(&app.agent("metrics-w", "waiter").await, None).await;
    let before = scrape(&app).await;
    let wait = tokio::spawn(async move {
        waiter
            .call("wait_for_updates", json!({ "timeout_seconds": 3 }))
            .await
    });
    // Seen while it waits (other tests' waits may add to the gauge, never
    // take this one away).
    eventually("an open long poll in the metrics", async || {
        value(&scrape(&app).await, "bus_long_polls_open", &[]) >= 1.0
    })
    .await;
    wait.await.unwrap().expect("the wait times out normally");
    let after = scrape(&app).await;
    assert_grew(
        &before,
        &after,
        "bus_mcp_tool_call_duration_seconds_count",
        &[("tool", "wait_for_updates")],
    );
    // Timed from when the wait began: the HTTP gate runs a plain wait before
    // rmcp sees the call (`mcp::park`), and the tool only answers it.
    let sum = "bus_mcp_tool_call_duration_seconds_sum";
    let with = [("tool", "wait_for_updates")];
    let waited = value(&after, sum, &with) - value(&before, sum, &with);
    assert!(waited >= 3.0, "a 3 s wait was timed as {waited} s in {sum}");
}

#[tokio::test]
async fn rate_limit_refusals_are_counted_by_kind() {
    let settings = HttpSettings {
        rate_limit_per_minute: 2,
        ..HttpSettings::default()
    };
    let app = TestApp::builder()
        .http(settings)
        .metrics_listener()
        .spawn()
        .await;
    app.team("metrics-r").await;
    let token = app.agent("metrics-r", "rater").await;
    let before = scrape(&app).await;
    let mut limited = false;
    for _ in 0..5 {
        let response = app.raw_tool_call("whoami").bearer_auth(&token).send().await;
        if response.unwrap().status() == 429 {
            limited = true;
            break;
        }
    }
    assert!(limited, "a third call within the minute is refused");
    let after = scrape(&app).await;
    assert_grew(
        &before,
        &after,
        "bus_http_refusals_total",
        &[("kind", "rate_limit")],
    );
    assert_grew(
        &before,
        &after,
        "bus_http_responses_total",
        &[("route", "/mcp"), ("status", "429")],
    );
}

#[tokio::test]
async fn the_main_listener_serves_metrics_only_to_a_global_admin_credential() {
    let app = spawn_app().await;
    assert_eq!(app.metrics_addr, None, "tests start no metrics listener");
    app.team("metrics-m").await;
    let token = app.agent("metrics-m", "reader").await;
    let global = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;
    let confined = admin::grant(&app.pool, &globally(), Some("metrics-m"), None)
        .await
        .unwrap()
        .credential;

    let get = |credential: Option<String>| {
        let app = &app;
        async move {
            let mut request = http_client().get(app.url("/metrics"));
            if let Some(credential) = credential {
                request = request.bearer_auth(credential);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    for (who, credential, status) in [
        ("no credential", None, 401),
        ("an agent token", Some(token.clone()), 401),
        ("a team's admin credential", Some(confined), 403),
    ] {
        let (got, body) = get(credential).await;
        assert_eq!(got, status, "{who}: {body}");
        let body: Value = serde_json::from_str(&body).expect("a JSON refusal");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("--metrics-bind") && message.contains("acsa_"),
            "{who}: {message}"
        );
    }
    let (status, text) = get(Some(global)).await;
    assert_eq!(status, 200, "{text}");
    let samples = parse(&text);
    assert_eq!(
        value(&samples, "bus_outbox_slots", &[("state", "pending")]),
        0.0
    );
    assert_eq!(
        value(
            &samples,
            "bus_outbox_team_pending_slots",
            &[("team", "metrics-m")]
        ),
        0.0
    );
    assert!(
        samples
            .iter()
            .any(|s| s.name == "bus_outbox_team_pending_slots"
                && s.labels.get("team").map(String::as_str) == Some("metrics-m")),
        "every team has its backlog gauge:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_pass_counts_publish_outcomes_and_empties_the_outbox_gauges() {
    let app = TestApp::builder()
        .broker_at(&nats_url())
        .metrics_listener()
        .spawn()
        .await;
    let slug = "metrics-js";
    let team_id = app.jetstream_team(slug).await;
    let alice = app.mcp(&app.agent(slug, "alice").await, None).await;
    let _bob = app.agent(slug, "bob").await;
    let created = alice
        .call(
            "create_conversation",
            json!({"title": "Metered", "private": true, "invite": ["bob"]}),
        )
        .await
        .unwrap();
    let conversation = created["id"].as_str().unwrap().to_owned();
    for body in ["first body", "second body"] {
        let sent = alice
            .call(
                "send_conversation_message",
                json!({"conversation_id": conversation, "body": body,
                       "request_id": Uuid::new_v4()}),
            )
            .await
            .unwrap();
        assert_eq!(sent["publication"], "pending_publication", "{sent}");
    }

    let before = scrape(&app).await;
    assert_eq!(
        value(&before, "bus_outbox_slots", &[("state", "pending")]),
        2.0
    );
    assert_eq!(
        value(&before, "bus_outbox_team_pending_slots", &[("team", slug)]),
        2.0
    );
    assert!(value(&before, "bus_outbox_pending_bytes", &[]) > 0.0);

    let mut stored = 0;
    eventually("the drain to store both messages", async || {
        let pass = publication::drain_once(&app.bus, "metrics-test", &drain_settings())
            .await
            .expect("a drain pass");
        stored += pass.stored;
        stored >= 2
    })
    .await;

    let after = scrape(&app).await;
    assert!(
        value(
            &after,
            "bus_outbox_publish_outcomes_total",
            &[("outcome", "stored")]
        ) >= value(
            &before,
            "bus_outbox_publish_outcomes_total",
            &[("outcome", "stored")]
        ) + 2.0,
        "both publications counted as stored"
    );
    assert_eq!(
        value(&after, "bus_outbox_slots", &[("state", "pending")]),
        0.0
    );
    assert_eq!(
        value(&after, "bus_outbox_slots", &[("state", "leased")]),
        0.0
    );
    assert_eq!(
        value(&after, "bus_outbox_team_pending_slots", &[("team", slug)]),
        0.0
    );
    assert_eq!(value(&after, "bus_outbox_pending_bytes", &[]), 0.0);
    assert_eq!(
        value(&after, "bus_outbox_oldest_pending_age_seconds", &[]),
        0.0
    );
    app.broker().remove_team_streams(team_id).await.unwrap();
}

fn serve(database_url: &str, port: u16, metrics_bind: &str) -> Command {
    let mut command = serve_on_default_metrics(database_url, port);
    command.args(["--metrics-bind", metrics_bind]);
    command
}

/// `serve` as an operator starts it without saying where metrics go.
fn serve_on_default_metrics(database_url: &str, port: u16) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
    command
        .env("DATABASE_URL", database_url)
        .env_remove("BUS_METRICS_BIND")
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null());
    command
}

/// A second server on the machine finds the default metrics address taken
/// (the first server holds it): it starts anyway, says so, and answers.
#[tokio::test]
async fn serve_starts_without_the_metrics_listener_when_the_default_address_is_taken() {
    let database_url = crate::support::postgres::fresh_database_url().await;
    // The first server's listener. Held by someone else already is as good.
    let _first = std::net::TcpListener::bind("127.0.0.1:9187");
    let log = tempfile::NamedTempFile::new().unwrap();
    let port = free_port();
    let mut child = serve_on_default_metrics(&database_url, port)
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("spawn serve");
    eventually("serve to answer /health", async || {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "serve stopped ({status}) because the default metrics address was taken: {}",
                std::fs::read_to_string(log.path()).unwrap()
            );
        }
        http_client()
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            .is_ok_and(|response| response.status().is_success())
    })
    .await;
    crate::binary::sigterm_and_wait(child);
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        stderr.contains("127.0.0.1:9187 is taken") && stderr.contains("--metrics-bind ADDR"),
        "the log says the listener is missing and how to get one: {stderr}"
    );
}

#[tokio::test]
async fn serve_answers_on_its_metrics_bind_and_names_the_flag_when_the_port_is_taken() {
    let database_url = crate::support::postgres::fresh_database_url().await;
    let (port, metrics_port) = (free_port(), free_port());
    let child = serve(&database_url, port, &format!("127.0.0.1:{metrics_port}"))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn serve");
    let addr: SocketAddr = format!("127.0.0.1:{metrics_port}").parse().unwrap();
    let response = eventually("metrics on the metrics bind", async || {
        http_client()
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .ok()
            .filter(|response| response.status() == 200)
    })
    .await;
    let text = response.text().await.unwrap();
    let samples = parse(&text);
    assert!(value(&samples, "bus_db_pool_max_connections", &[]) >= 1.0);
    let other = http_client()
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        404,
        "the metrics listener serves only /metrics"
    );
    crate::binary::sigterm_and_wait(child);

    // A port someone else holds: serve refuses to start and says what to do.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let output = serve(&database_url, free_port(), &taken_addr)
        .stderr(Stdio::piped())
        .output()
        .expect("run serve");
    assert!(
        !output.status.success(),
        "serve starts with its metrics port taken"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&taken_addr) && stderr.contains("--metrics-bind") && stderr.contains("off"),
        "{stderr}"
    );
    drop(taken);
}
