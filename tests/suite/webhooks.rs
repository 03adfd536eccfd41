//! Outgoing webhooks against a real receiver: a small axum server on a
//! loopback port that records every request and answers what it is told.
//! Hooks point at loopback, so every add passes `allow_private`. The test
//! servers dispatch with a short backoff (`support::webhook_settings`).

use std::collections::{BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ai_crew_sync::store::teams;
use ai_crew_sync::store::webhooks::{self, CreatedWebhook, NewWebhook, WebhookKind, delivery};
use ai_crew_sync::workers::webhook_dispatcher::Dispatcher;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::Sha256;
use uuid::Uuid;

use crate::admin::api;
use crate::cli::{bus, ok_json};
use crate::support::{
    McpClient, TestApp, free_port, globally, in_team, postgres::fresh_database_url,
    postgres::fresh_pool, spawn_app, test_actor, webhook_settings,
};

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Request {
    headers: HeaderMap,
    body: Bytes,
}

impl Request {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a delivery body is JSON")
    }
}

#[derive(Default)]
struct Inbox {
    requests: Vec<Request>,
    /// Statuses to answer next, in order; then `otherwise`.
    plan: VecDeque<(u16, &'static str)>,
    otherwise: u16,
    /// Requests to answer only after the dispatcher has given up on them.
    stall_next: usize,
}

/// A webhook receiver on a loopback port.
struct Receiver {
    addr: SocketAddr,
    inbox: Arc<Mutex<Inbox>>,
    server: tokio::task::JoinHandle<()>,
}

async fn record(
    State(inbox): State<Arc<Mutex<Inbox>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, &'static str) {
    let (answer, stall) = {
        let mut inbox = inbox.lock().unwrap();
        inbox.requests.push(Request { headers, body });
        let stall = inbox.stall_next > 0;
        inbox.stall_next = inbox.stall_next.saturating_sub(1);
        let answer = inbox.plan.pop_front().unwrap_or((inbox.otherwise, "ok"));
        (answer, stall)
    };
    if stall {
        // Longer than the test dispatcher's request timeout (3 s).
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    (StatusCode::from_u16(answer.0).unwrap(), answer.1)
}

impl Receiver {
    async fn start() -> Receiver {
        Receiver::start_on(0).await
    }

    async fn start_on(port: u16) -> Receiver {
        let inbox = Arc::new(Mutex::new(Inbox {
            otherwise: 200,
            ..Inbox::default()
        }));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the receiver");
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(axum::routing::post(record))
            .with_state(inbox.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            addr,
            inbox,
            server,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// Answer these statuses (with these bodies) first, in order.
    fn answer_first(&self, plan: &[(u16, &'static str)]) {
        self.inbox.lock().unwrap().plan.extend(plan.iter().copied());
    }

    fn stall_next(&self, n: usize) {
        self.inbox.lock().unwrap().stall_next = n;
    }

    fn answer_always(&self, status: u16) {
        self.inbox.lock().unwrap().otherwise = status;
    }

    fn requests(&self) -> Vec<Request> {
        self.inbox.lock().unwrap().requests.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Poll `check` until it holds; fail naming `what` after 30 s (a bound on a
/// hang, not a timing assertion).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn hook(url: &str, events: &[&str]) -> NewWebhook {
    NewWebhook {
        url: url.to_owned(),
        kind: WebhookKind::Generic,
        events: events.iter().map(|e| e.to_string()).collect(),
        channels: vec![],
        allow_private: true,
    }
}

async fn add(app: &TestApp, team: &str, new: NewWebhook) -> CreatedWebhook {
    webhooks::add(&app.pool, &in_team(team), new)
        .await
        .expect("add the webhook")
}

#[derive(Debug, sqlx::FromRow)]
struct Row {
    id: Uuid,
    state: String,
    attempts: i32,
    last_status: Option<i32>,
    last_error: Option<String>,
}

async fn deliveries(app: &TestApp) -> Vec<Row> {
    sqlx::query_as(
        "SELECT id, state, attempts, last_status, last_error FROM webhook_deliveries
         ORDER BY created_at, id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

async fn in_state(app: &TestApp, state: &str) -> usize {
    deliveries(app)
        .await
        .iter()
        .filter(|r| r.state == state)
        .count()
}

async fn post(client: &McpClient, channel: &str, body: &str) {
    call(
        client,
        "post_message",
        json!({"channel": channel, "body": body}),
    )
    .await;
}

#[tokio::test]
async fn three_replicas_deliver_each_event_exactly_once() {
    let app = spawn_app().await;
    let second = app.replica().await;
    let third = app.replica().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    add(&app, "acme", hook(&receiver.url(), &["message"])).await;

    // Posts through every replica; all three dispatchers run.
    const N: usize = 30;
    let clients = [
        app.mcp(&token, None).await,
        second.mcp(&token, None).await,
        third.mcp(&token, None).await,
    ];
    for i in 0..N {
        post(&clients[i % 3], "general", &format!("event {i}")).await;
    }

    eventually("every delivery delivered", || async {
        in_state(&app, "delivered").await == N
    })
    .await;
    // Settled rows are never claimed again, so what was received is final.
    let received = receiver.requests();
    let ids: Vec<String> = received
        .iter()
        .map(|r| r.header("x-bus-delivery").to_owned())
        .collect();
    let distinct: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(received.len(), N, "exactly one request per event: {ids:?}");
    assert_eq!(distinct.len(), N, "each delivery id once");
    let rows: BTreeSet<String> = deliveries(&app)
        .await
        .iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(
        rows,
        distinct.into_iter().cloned().collect(),
        "the ids received are the delivery rows"
    );
    let bodies: BTreeSet<String> = received
        .iter()
        .map(|r| r.json()["data"]["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bodies.len(), N, "every event arrived");
}

#[tokio::test]
async fn a_receiver_that_is_down_is_retried_until_it_answers() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let port = free_port();
    add(
        &app,
        "acme",
        hook(&format!("http://127.0.0.1:{port}/hook"), &["message"]),
    )
    .await;
    let alice = app.mcp(&token, None).await;
    post(&alice, "general", "while nobody listens").await;

    eventually("two failed attempts, still pending", || async {
        let rows = deliveries(&app).await;
        rows.len() == 1 && rows[0].attempts >= 2 && rows[0].state == "pending"
    })
    .await;
    let row = &deliveries(&app).await[0];
    assert!(
        row.last_error
            .as_deref()
            .unwrap()
            .contains("could not reach the receiver"),
        "{row:?}"
    );

    let receiver = Receiver::start_on(port).await;
    eventually("delivered once the receiver is back", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    let received = receiver.requests();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].header("x-bus-delivery"), row.id.to_string());
    assert_eq!(received[0].json()["data"]["body"], "while nobody listens");
}

#[tokio::test]
async fn a_503_is_retried_and_a_400_fails_with_its_error_listed() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    let created = add(&app, "acme", hook(&receiver.url(), &["message"])).await;
    let alice = app.mcp(&token, None).await;

    receiver.answer_first(&[(503, "busy"), (503, "busy")]);
    post(&alice, "general", "first").await;
    eventually("delivered after two 503s", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    let received = receiver.requests();
    assert_eq!(received.len(), 3, "two refused attempts, then the delivery");
    let ids: BTreeSet<&str> = received
        .iter()
        .map(|r| r.header("x-bus-delivery"))
        .collect();
    assert_eq!(ids.len(), 1, "every retry carries the same delivery id");
    assert_eq!(deliveries(&app).await[0].attempts, 3);

    receiver.answer_always(400);
    receiver.answer_first(&[(400, "unknown payload shape")]);
    post(&alice, "general", "second").await;
    eventually("the 400 failed", || async {
        in_state(&app, "failed").await == 1
    })
    .await;
    let failed = deliveries(&app)
        .await
        .into_iter()
        .find(|r| r.state == "failed")
        .unwrap();
    assert_eq!(
        (failed.attempts, failed.last_status),
        (1, Some(400)),
        "a 400 is permanent: no retry"
    );
    assert_eq!(receiver.requests().len(), 4);

    let listed = webhooks::list(&app.pool, &in_team("acme")).await.unwrap();
    assert_eq!(listed.len(), 1);
    let listed = &listed[0];
    assert_eq!(listed.id, created.webhook.id);
    assert_eq!(
        (listed.deliveries.delivered, listed.deliveries.failed),
        (1, 1)
    );
    let error = listed.failures[0].last_error.as_deref().unwrap();
    assert!(
        error.contains("400") && error.contains("unknown payload shape"),
        "{error}"
    );
    assert!(
        !serde_json::to_string(&listed)
            .unwrap()
            .contains(&created.secret),
        "a listing never shows the secret"
    );
}

#[tokio::test]
async fn a_receiver_that_does_not_answer_in_time_is_retried() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    add(&app, "acme", hook(&receiver.url(), &["message"])).await;
    receiver.stall_next(1);
    post(&app.mcp(&token, None).await, "general", "slow").await;

    eventually("delivered after a timeout", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    let row = &deliveries(&app).await[0];
    assert_eq!(row.attempts, 2, "the stalled attempt, then the delivery");
    let received = receiver.requests();
    assert_eq!(received.len(), 2);
    assert!(
        received
            .iter()
            .all(|r| r.header("x-bus-delivery") == row.id.to_string())
    );
}

#[tokio::test]
async fn a_lease_keeps_a_delivery_from_everyone_else_until_it_lapses() {
    // No server: this test is the only dispatcher, so it decides who claims.
    let (pool, _) = fresh_pool().await;
    teams::create(&pool, &globally(), "acme", "Acme")
        .await
        .unwrap();
    let receiver = Receiver::start().await;
    let hook_id = webhooks::add(&pool, &in_team("acme"), hook(&receiver.url(), &["task"]))
        .await
        .unwrap()
        .webhook
        .id;
    sqlx::query(
        "INSERT INTO webhook_deliveries (team_id, webhook_id, event, payload)
         SELECT team_id, id, 'task.created', '{\"key\": \"k\"}' FROM webhooks WHERE id = $1",
    )
    .bind(hook_id)
    .execute(&pool)
    .await
    .unwrap();

    // A replica claims it and dies before settling.
    let dead = delivery::claim(&pool, 10, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert!(
        delivery::claim(&pool, 10, Duration::from_secs(2))
            .await
            .unwrap()
            .is_empty(),
        "nobody else takes a leased delivery"
    );
    let dispatcher = Dispatcher::new(pool.clone(), webhook_settings()).unwrap();
    assert_eq!(dispatcher.run_once().await.unwrap(), 0);
    assert!(receiver.requests().is_empty());

    // Once the lease lapses, another replica sends it.
    eventually("claimed again after the lease", || async {
        dispatcher.run_once().await.unwrap() == 1
    })
    .await;
    assert_eq!(receiver.requests().len(), 1);
    assert_eq!(
        receiver.requests()[0].header("x-bus-delivery"),
        dead[0].id.to_string()
    );
    // The dead replica's late settle changes nothing.
    assert!(
        !delivery::settle_delivered(&pool, &dead[0], 200)
            .await
            .unwrap()
    );
    let (state, attempts): (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM webhook_deliveries")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("delivered", 2));
}

/// A name that resolved to a public address at `add` and resolves to
/// loopback now (DNS rebinding) is refused at send time: here the hooks are
/// added with `allow_private` and the flag is then cleared underneath them.
#[tokio::test]
async fn a_hook_without_allow_private_never_connects_to_a_private_address() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    let port = receiver.addr.port();
    for url in [
        format!("http://localhost:{port}/by-name"),
        format!("http://127.0.0.1:{port}/by-address"),
    ] {
        add(&app, "acme", hook(&url, &["message"])).await;
    }
    sqlx::query("UPDATE webhooks SET allow_private = false")
        .execute(&app.pool)
        .await
        .unwrap();
    post(&app.mcp(&token, None).await, "general", "stay inside").await;

    eventually("both deliveries failed", || async {
        in_state(&app, "failed").await == 2
    })
    .await;
    assert!(receiver.requests().is_empty(), "nothing was sent");
    for row in deliveries(&app).await {
        let error = row.last_error.unwrap();
        assert_eq!(row.attempts, 1, "refused at once, not retried: {error}");
        assert!(
            error.contains("--allow-private") && error.contains("127.0.0.1"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn generic_deliveries_are_signed_over_the_exact_body() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    let created = add(&app, "acme", hook(&receiver.url(), &["message"])).await;
    assert!(created.secret.starts_with("whsec_"), "{}", created.secret);
    let alice = app.mcp(&token, None).await;
    post(&alice, "general", "sign me").await;

    eventually("one request", || async { receiver.requests().len() == 1 }).await;
    let request = &receiver.requests()[0];
    let verify = |body: &[u8]| {
        let mut mac = Hmac::<Sha256>::new_from_slice(created.secret.as_bytes()).unwrap();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    };
    assert_eq!(request.header("x-bus-signature"), verify(&request.body));
    let mut tampered = request.body.to_vec();
    tampered.push(b' ');
    assert_ne!(
        request.header("x-bus-signature"),
        verify(&tampered),
        "the signature covers the exact bytes"
    );

    let body = request.json();
    assert_eq!(
        body["id"].as_str().unwrap(),
        request.header("x-bus-delivery")
    );
    assert_eq!(body["event"], "message.posted");
    assert_eq!(request.header("x-bus-event"), "message.posted");
    assert_eq!(body["team"], "acme");
    assert_eq!(body["webhook_id"], json!(created.webhook.id));
    assert_eq!(body["data"]["channel"], "general");
    assert_eq!(body["data"]["sender"], "alice");
    assert_eq!(body["data"]["body"], "sign me");
    assert!(body["occurred_at"].is_string());
}

async fn call(client: &McpClient, tool: &str, args: Value) -> Value {
    client
        .call(tool, args.clone())
        .await
        .unwrap_or_else(|e| panic!("{tool} {args}: {e}"))
}

fn conversation_id(created: &Value) -> String {
    created["conversation"]["id"]
        .as_str()
        .or(created["id"].as_str())
        .unwrap_or_else(|| panic!("a conversation id in {created}"))
        .to_owned()
}

async fn say(client: &McpClient, conversation: &str, body: &str) {
    let args = json!({"conversation_id": conversation, "body": body,
                      "request_id": Uuid::new_v4().to_string()});
    call(client, "send_conversation_message", args).await;
}

#[tokio::test]
async fn direct_messages_and_conversation_bodies_never_reach_the_receiver() {
    let app = spawn_app().await;
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice_token = app.agent("acme", "alice").await;
    let bob_token = app.agent("acme", "bob").await;
    let receiver = Receiver::start().await;
    add(&app, "acme", hook(&receiver.url(), &[])).await;
    let alice = app.mcp(&alice_token, None).await;
    let bob = app.mcp(&bob_token, None).await;

    call(
        &alice,
        "post_message",
        json!({"to": "bob", "body": "DM-SECRET-7731"}),
    )
    .await;
    call(&alice, "create_project", json!({"project": "web"})).await;
    let grant = json!({"project": "web", "agent": "bob"});
    call(&alice, "grant_project_access", grant).await;
    let project = json!({"title": "release plan", "project": "web", "invite": ["bob"]});
    let project_conv = conversation_id(&call(&alice, "create_conversation", project).await);
    let join = json!({"conversation_id": project_conv});
    call(&bob, "join_conversation", join).await;
    say(&alice, &project_conv, "CONV-BODY-4410").await;
    let private = json!({"title": "PRIVATE-TITLE-9902", "private": true});
    let private_conv = conversation_id(&call(&alice, "create_conversation", private).await);
    say(&alice, &private_conv, "PRIVATE-BODY-5521").await;
    let note = json!({"key": "deploy", "value": "NOTE-VALUE-8812"});
    call(&alice, "set_note", note).await;
    call(
        &alice,
        "create_task",
        json!({"key": "ship", "title": "ship it"}),
    )
    .await;
    call(&alice, "claim_task", json!({"key": "ship"})).await;
    call(&alice, "acquire_lock", json!({"name": "deploy"})).await;
    call(&alice, "release_lock", json!({"name": "deploy"})).await;
    let announcement = json!({"channel": "general", "body": "freeze at 5", "announce": true});
    call(&alice, "post_message", announcement).await;
    post(&alice, "general", "the last event").await;

    // Triggers enqueue at commit: every row exists now; wait until all are sent.
    eventually("every delivery sent", || async {
        let rows = deliveries(&app).await;
        !rows.is_empty() && rows.iter().all(|r| r.state == "delivered")
    })
    .await;
    let received = receiver.requests();
    let events: BTreeSet<String> = received
        .iter()
        .map(|r| r.json()["event"].as_str().unwrap().to_owned())
        .collect();
    for expected in [
        "message.posted",
        "announcement.posted",
        "task.created",
        "task.claimed",
        "lock.acquired",
        "lock.released",
        "note.set",
        "conversation.created",
        "conversation.member_joined",
        "conversation.message_sent",
    ] {
        assert!(
            events.contains(expected),
            "{expected} missing from {events:?}"
        );
    }
    let everything: String = received
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    for secret in [
        "DM-SECRET-7731",
        "CONV-BODY-4410",
        "PRIVATE-BODY-5521",
        "PRIVATE-TITLE-9902",
        "NOTE-VALUE-8812",
        private_conv.as_str(),
    ] {
        assert!(
            !everything.contains(secret),
            "{secret} reached the receiver: {everything}"
        );
    }
    let sent = received
        .iter()
        .map(Request::json)
        .find(|b| b["event"] == "conversation.message_sent")
        .unwrap();
    assert_eq!(sent["data"]["conversation_id"], json!(project_conv));
    assert_eq!(sent["data"]["title"], "release plan");
    assert_eq!(sent["data"]["sender"], "alice");
    assert_eq!(sent["data"]["seq"], 1);
    let messages = received
        .iter()
        .filter(|r| r.json()["event"] == "message.posted")
        .count();
    assert_eq!(messages, 1, "the DM is not a channel message");
}

#[tokio::test]
async fn slack_and_channel_filters_shape_what_is_sent() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    add(
        &app,
        "acme",
        NewWebhook {
            kind: WebhookKind::Slack,
            channels: vec!["#ops".into()],
            ..hook(&receiver.url(), &["message"])
        },
    )
    .await;
    let alice = app.mcp(&token, None).await;
    app.team("other").await;
    let other = app.agent("other", "carol").await;
    post(&app.mcp(&other, None).await, "ops", "another team's #ops").await;
    post(&alice, "general", "not for this hook").await;
    post(&alice, "ops", "disk <full> & rising").await;
    alice
        .call(
            "create_task",
            json!({"key": "t1", "title": "not subscribed"}),
        )
        .await
        .unwrap();

    eventually("one delivery sent", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    assert_eq!(
        deliveries(&app).await.len(),
        1,
        "only #ops messages of this team match; a team without hooks enqueues nothing"
    );
    let body = receiver.requests()[0].json();
    assert_eq!(
        body,
        json!({"text": "[acme] #ops alice wrote: disk &lt;full&gt; &amp; rising"})
    );
}

#[tokio::test]
async fn urls_are_validated_and_a_refusal_writes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let refusal = |new: NewWebhook| {
        let pool = app.pool.clone();
        async move {
            webhooks::add(&pool, &in_team("acme"), new)
                .await
                .expect_err("refused")
                .to_string()
        }
    };
    let ftp = refusal(hook("ftp://example.com/hook", &[])).await;
    assert!(ftp.contains("only http and https"), "{ftp}");
    let loopback = refusal(NewWebhook {
        allow_private: false,
        ..hook("http://127.0.0.1:9/hook", &[])
    })
    .await;
    assert!(
        loopback.contains("127.0.0.1") && loopback.contains("--allow-private"),
        "{loopback}"
    );
    let localhost = refusal(NewWebhook {
        allow_private: false,
        ..hook("http://localhost:9/hook", &[])
    })
    .await;
    assert!(localhost.contains("loopback"), "{localhost}");
    let credentials = refusal(hook("https://user:pw@example.com/hook", &[])).await;
    assert!(
        credentials.contains("user name or password"),
        "{credentials}"
    );
    let event = refusal(hook("http://127.0.0.1:9/hook", &["messages"])).await;
    assert!(event.contains("message, announcement"), "{event}");

    let (hooks, audits): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhooks),
                (SELECT count(*) FROM audit_log WHERE action LIKE 'webhook.%')",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((hooks, audits), (0, 0), "a refused add writes nothing");
}

/// `words` split on spaces, as a shell would (no quoting needed here).
fn argv(words: &str) -> Vec<&str> {
    words.split_whitespace().collect()
}

#[tokio::test]
async fn the_cli_adds_lists_and_removes_webhooks_and_audits_them() {
    let db = fresh_database_url().await;
    ok_json(&db, &argv("team create --slug acme --name Acme --json"));

    let refused = bus(
        &db,
        &argv("webhook add --team acme --url http://127.0.0.1:9/hook"),
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--allow-private"), "{stderr}");

    let added = ok_json(
        &db,
        &argv(
            "webhook add --team acme --url http://127.0.0.1:9/hook --kind discord \
             --events task,lock --channel ops --allow-private --json",
        ),
    );
    let secret = added["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"));
    assert_eq!(added["events"], json!(["task", "lock"]));
    assert_eq!(added["kind"], "discord");
    let id = added["id"].as_str().unwrap();

    let text = bus(
        &db,
        &argv("webhook add --team acme --url http://127.0.0.1:9/x --allow-private"),
    );
    let shown = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success() && shown.contains("shown once"),
        "{shown}"
    );

    let list = argv("webhook list --team acme --json");
    let listed = ok_json(&db, &list);
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["channels"], json!(["ops"]));
    assert!(!listed.to_string().contains(secret), "never the secret");
    let table = bus(&db, &argv("webhook list --team acme"));
    assert!(String::from_utf8_lossy(&table.stdout).contains(id));

    let removed = ok_json(&db, &["webhook", "remove", "--id", id, "--json"]);
    assert_eq!(removed["id"], id);
    assert_eq!(ok_json(&db, &list).as_array().unwrap().len(), 1);
    let again = bus(&db, &["webhook", "remove", "--id", id]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("no webhook with id"));

    let pool = ai_crew_sync::db::connect(&db, 2).await.unwrap();
    let actions: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, detail::text FROM audit_log WHERE action LIKE 'webhook.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let names: Vec<&str> = actions.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(names, ["webhook.add", "webhook.add", "webhook.remove"]);
    assert!(
        actions[0].1.contains("http://127.0.0.1:9"),
        "{}",
        actions[0].1
    );
    assert!(
        !actions[0].1.contains("/hook"),
        "the audit names the origin only"
    );
}

#[tokio::test]
async fn admin_routes_add_list_and_remove_within_the_credentials_team() {
    use ai_crew_sync::store::admin;
    let app = spawn_app().await;
    app.team("acme").await;
    app.team("other").await;
    let root = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;
    let (status, scoped) = api(
        &app,
        &root,
        Method::POST,
        "/admin/credentials",
        Some(json!({"team": "other"})),
    )
    .await;
    assert_eq!(status, 201, "{scoped}");
    let scoped = scoped["credential"].as_str().unwrap().to_owned();

    let receiver = Receiver::start().await;
    let (status, refused) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/webhooks",
        Some(json!({"url": receiver.url()})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("allow_private")
    );

    let (status, added) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/webhooks",
        Some(json!({"url": receiver.url(), "events": ["task"], "allow_private": true})),
    )
    .await;
    assert_eq!(status, 201, "{added}");
    assert!(added["secret"].as_str().unwrap().starts_with("whsec_"));
    let id = added["id"].as_str().unwrap().to_owned();

    let (status, _) = api(
        &app,
        &scoped,
        Method::GET,
        "/admin/teams/acme/webhooks",
        None,
    )
    .await;
    assert_eq!(status, 403, "a credential of another team");
    let (status, _) = api(
        &app,
        &scoped,
        Method::DELETE,
        &format!("/admin/teams/acme/webhooks/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = api(
        &app,
        &scoped,
        Method::DELETE,
        &format!("/admin/teams/other/webhooks/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "another team's hook is not found from here");

    // A task event is delivered; the listing counts it.
    let token = app.agent("acme", "alice").await;
    app.mcp(&token, None)
        .await
        .call("create_task", json!({"key": "t", "title": "a task"}))
        .await
        .unwrap();
    eventually("the task event delivered", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    let (status, listed) = api(&app, &root, Method::GET, "/admin/teams/acme/webhooks", None).await;
    assert_eq!(status, 200);
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["deliveries"]["delivered"], 1);
    assert!(listed[0].get("secret").is_none());
    assert_eq!(receiver.requests()[0].json()["event"], "task.created");

    let (status, removed) = api(
        &app,
        &root,
        Method::DELETE,
        &format!("/admin/teams/acme/webhooks/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    let (_, listed) = api(&app, &root, Method::GET, "/admin/teams/acme/webhooks", None).await;
    assert_eq!(listed, json!([]));
    assert_eq!(
        deliveries(&app).await.len(),
        0,
        "deliveries go with their hook"
    );

    let audit: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, source FROM audit_log WHERE action LIKE 'webhook.%' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        audit,
        [
            ("webhook.add".to_owned(), "http".to_owned()),
            ("webhook.remove".to_owned(), "http".to_owned())
        ]
    );
}
