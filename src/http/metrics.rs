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
//! Either way the answer is the process's counters (`crate::metrics`) and
//! then the database's state read now through this server's pool
//! (`store::scrape`). The `Host` check of the main listener applies here too
//! (a web page must not read this through DNS rebinding).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sqlx::PgPool;

use super::{AppState, bearer, json_error, rate_limited};
use crate::Bus;
use crate::auth;
use crate::error::BusError;
use crate::events::Events;
use crate::store::admin::{self, Authority};

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
    let route = crate::metrics::route_of(request.uri().path());
    let response = next.run(request).await;
    crate::metrics::record_response(route, response.status().as_u16());
    response
}

async fn render(pool: &PgPool, events: &Events) -> Response {
    let mut text = crate::metrics::install().render();
    let state = crate::store::scrape::scrape(pool, events).await;
    text.push_str(&crate::metrics::render_state(&state));
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
