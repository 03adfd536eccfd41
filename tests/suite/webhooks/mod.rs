//! Outgoing webhooks against a real receiver: a small axum server on a
//! loopback port that records every request and answers what it is told.
//! Hooks point at loopback, so every add passes `allow_private`. The test
//! servers dispatch with a short backoff (`support::webhook_settings`).
//! This file holds what the tests share (the receiver, the delivery rows,
//! posting through MCP); the tests live by concept in `delivery` (which
//! event reaches which hook, exactly once, through retries and leases),
//! `security` (private addresses, URL validation, the signature, what is
//! never forwarded) and `surfaces` (the CLI and the admin routes).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ai_crew_sync::store::operations::webhooks::{
    self, CreatedWebhook, NewWebhook, PrivateTargets, WebhookKind,
};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{McpClient, TestApp, eventually, in_team, test_authority};

mod delivery;
mod security;
mod surfaces;
mod task_events;

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

fn hook(url: &str, events: &[&str]) -> NewWebhook {
    NewWebhook {
        url: url.to_owned(),
        kind: WebhookKind::Generic,
        events: events.iter().map(|e| e.to_string()).collect(),
        channels: vec![],
        allow_private: Some(
            PrivateTargets::grant(&test_authority()).expect("the local operator allows private"),
        ),
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

async fn call(client: &McpClient, tool: &str, args: Value) -> Value {
    client
        .call(tool, args.clone())
        .await
        .unwrap_or_else(|e| panic!("{tool} {args}: {e}"))
}
