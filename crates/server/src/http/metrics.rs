//! `GET /metrics` in Prometheus text format, in two places:
//!
//! - On its own listener (`serve --metrics-bind`, default `127.0.0.1:9187`),
//!   which serves nothing else and asks for no credential: who can reach the
//!   address may scrape, so by default only this machine can.
//! - On the main listener, only to a **global** admin credential
//!   (`Authorization: Bearer acsa_…`): the numbers span every team, so a
//!   credential confined to one team is refused. Anything else is refused
//!   with the way to the separate listener.
//!
//! Either way the answer is the process's counters (`acs_metrics`) and
//! then the database's state read now through this server's pool
//! (`store::operations::scrape`). The `Host` check of the main listener applies here too
//! (a web page must not read this through DNS rebinding).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sqlx::PgPool;

use super::{AppState, bearer, json_error, rate_limited};
use acs_metrics as names;
use acs_store::Bus;
use acs_store::auth;
use acs_store::error::BusError;
use acs_store::events::Events;
use acs_store::store::identity::admin::{self, Authority};
use acs_store::store::operations::scrape::{Scraped, TeamOutbox};

/// The text format's media type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics` on the main listener: a global admin credential only.
pub(super) async fn on_main_listener(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Response {
    let me = match global_admin(&state.pool, &headers).await {
        Ok(me) => me,
        Err(err) => return refused(&err),
    };
    if let Err(wait) = state.admin_limiter.check(me.credential_id) {
        return rate_limited(wait, state.admin_limiter.per_minute(), "admin credential");
    }
    render(&state.pool, &state.events).await
}

async fn global_admin(
    pool: &PgPool,
    headers: &HeaderMap,
) -> Result<admin::AdminIdentity, BusError> {
    let digest = bearer(headers).and_then(auth::parse_admin_credential)?;
    let me = admin::authenticate(pool, &digest).await?;
    Authority::Admin(me.clone()).global("read /metrics")?;
    Ok(me)
}

/// The refusal, and where metrics can be read instead.
fn refused(err: &BusError) -> Response {
    let status =
        StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_error(
        status,
        err.kind(),
        format!(
            "{err} /metrics on this listener answers only a global admin credential \
             (Authorization: Bearer acsa_…). Scrape the separate metrics listener instead: \
             `serve --metrics-bind ADDR` (default 127.0.0.1:9187, `off` turns it off) serves \
             GET /metrics without a credential to whoever can reach that address."
        ),
    );
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

#[derive(Clone)]
struct ListenerState {
    pool: PgPool,
    events: Events,
    allowed_hosts: Arc<Vec<String>>,
}

/// The router of the separate metrics listener: `GET /metrics` and a JSON
/// 404 for everything else.
pub fn listener_router(bus: &Bus, allowed_hosts: Vec<String>) -> Router {
    let state = ListenerState {
        pool: bus.pool.clone(),
        events: bus.events.clone(),
        allowed_hosts: Arc::new(allowed_hosts),
    };
    Router::new()
        .route("/metrics", get(on_metrics_listener))
        .fallback(only_metrics)
        .layer(middleware::from_fn_with_state(state.clone(), host_check))
        .layer(middleware::from_fn(count_response))
        .with_state(state)
}

async fn on_metrics_listener(State(state): State<ListenerState>) -> Response {
    render(&state.pool, &state.events).await
}

async fn only_metrics(request: Request) -> Response {
    json_error(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no route for {} {} on the metrics listener: it serves only GET /metrics. The bus \
             itself (/mcp, /health, /admin) is on the main listener (`serve --bind`).",
            request.method(),
            request.uri().path()
        ),
    )
}

async fn host_check(State(state): State<ListenerState>, request: Request, next: Next) -> Response {
    match super::host_refusal(&state.allowed_hosts, &request) {
        Some(refusal) => refusal,
        None => next.run(request).await,
    }
}

/// Count each response by route template and status (every route, both
/// listeners).
pub(super) async fn count_response(request: Request, next: Next) -> Response {
    let route = acs_metrics::route_of(request.uri().path());
    let response = next.run(request).await;
    acs_metrics::record_response(route, response.status().as_u16());
    response
}

async fn render(pool: &PgPool, events: &Events) -> Response {
    let mut text = acs_metrics::install().render();
    let state = acs_store::store::operations::scrape::scrape(pool, events).await;
    text.push_str(&render_state(&state));
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, CONTENT_TYPE),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

/// The scrape-time gauges in Prometheus text, to follow the recorder's.
fn render_state(state: &Scraped) -> String {
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
        out.push('\n');
    };
    let one = |v: f64| vec![(String::new(), v)];
    gauge(
        names::DB_POOL_CONNECTIONS,
        "Connections open in this server's pool.",
        &one(f64::from(state.pool_size)),
    );
    gauge(
        names::DB_POOL_IDLE,
        "Idle connections in this server's pool.",
        &one(state.pool_idle as f64),
    );
    gauge(
        names::DB_POOL_MAX,
        "Most connections this server's pool opens.",
        &one(f64::from(state.pool_max)),
    );
    let listener: Vec<(String, f64)> = ["live", "silent", "detached"]
        .into_iter()
        .map(|s| {
            let on = state.listener_state == s;
            (format!("{{state=\"{s}\"}}"), if on { 1.0 } else { 0.0 })
        })
        .collect();
    gauge(
        names::EVENT_LISTENER_STATE,
        "The event listener's state: 1 for the state it is in.",
        &listener,
    );
    let Some(db) = &state.database else {
        return out;
    };
    let outbox = &db.outbox;
    gauge(
        names::OUTBOX_SLOTS,
        "Outbox slots, by state.",
        &[
            ("{state=\"pending\"}".into(), outbox.pending as f64),
            ("{state=\"leased\"}".into(), outbox.leased as f64),
            ("{state=\"failed\"}".into(), outbox.failed as f64),
        ],
    );
    let per_team = |f: fn(&TeamOutbox) -> f64| -> Vec<(String, f64)> {
        db.teams
            .iter()
            .map(|t| (format!("{{team=\"{}\"}}", escape(&t.team)), f(t)))
            .collect()
    };
    gauge(
        names::OUTBOX_TEAM_PENDING,
        "Outbox slots not failed, per team.",
        &per_team(|t| t.pending as f64),
    );
    gauge(
        names::OUTBOX_TEAM_OLDEST_PENDING,
        "Age of a team's oldest outbox slot not failed (0 when none).",
        &per_team(|t| t.oldest_pending_seconds as f64),
    );
    let single: [(&str, &str, i64); 6] = [
        (
            names::OUTBOX_OLDEST_PENDING,
            "Age of the oldest outbox slot not failed (0 when none).",
            outbox.oldest_pending_seconds.unwrap_or(0),
        ),
        (
            names::OUTBOX_PENDING_BYTES,
            "Bytes waiting in the outbox (failed slots excluded).",
            outbox.pending_bytes,
        ),
        (
            names::OUTBOX_UNCERTAIN,
            "Messages whose last publication attempt had no answer.",
            outbox.uncertain,
        ),
        (
            names::INBOX_OWED,
            "Inbox references not yet delivered, counted up to a cap (the cap means at least).",
            db.inbox_owed,
        ),
        (
            names::MOVES_RUNNING,
            "Moves of conversations between backends still open.",
            db.moves_running,
        ),
        (
            names::MOVES_PAUSED,
            "Conversations whose writes an open move has paused.",
            db.moves_paused,
        ),
    ];
    for (name, help, value) in single {
        gauge(name, help, &one(value as f64));
    }
    out
}

/// A label value in Prometheus text: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
