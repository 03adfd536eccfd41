//! The HTTP surface: `POST /mcp`, `GET /health`, `GET /metrics` (see
//! [`metrics`]), `/admin`, and a JSON 404 for the rest.
//!
//! Checks run outside-in, cheapest first, and each refusal is a JSON body a
//! model or a human can act on:
//!
//! 0. Per connection, before any request ([`connections`]): the caps on open
//!    connections (overall and per address), the header and idle timeouts,
//!    and the time limit on every request body (408).
//! 1. `Host` against the allow-list (DNS-rebinding defence), every route.
//! 2. On `/mcp` and `/admin`: a slot among the requests in flight (503 +
//!    `Retry-After` when the server is full; see [`limits`]).
//! 3. On `/mcp`: a method other than POST (405), an `Accept` without both
//!    JSON and event streams (406), a `Content-Type` other than JSON (415), a
//!    declared body over the limit (413), then a malformed `X-Crew-Session` or
//!    `X-Crew-Epoch` (400) before the
//!    credential is looked up, then the bearer credential ([`caller`]): an agent token or
//!    a session credential (401 unknown/revoked/expired/stale, 403 disabled
//!    agent; from an address past its allowance of failed authentications
//!    the lookup waits its turn and a failure is 429, a valid credential is
//!    served), then the per-token rate limit (429 + `Retry-After`), then the
//!    caller's calls in flight per credential, agent and team (429), then the
//!    body is read against the buffered-bytes budget (503) with the limit
//!    enforced while streaming (413); then the body must be one JSON-RPC
//!    message, nested at most [`malformed::JSON_DEPTH_MAX`] deep, with a
//!    protocol version this server speaks (400; see [`malformed`]); a long
//!    poll then moves to its caller's long-poll counts (429 at a cap), and
//!    a `wait_for_updates` that needs nothing of rmcp while it blocks waits
//!    here ([`crate::mcp::park`]).
//! 4. rmcp's Streamable HTTP service, stateless with JSON responses, sees the
//!    caller's [`Identity`] in the request extensions. A refusal it still
//!    answers in plain text is rewritten as JSON on the way out.
//!
//! [`Identity`]: acs_store::auth::Identity

mod admin;
mod caller;
mod connections;
pub mod dashboard;
mod health;
pub mod limits;
pub mod malformed;
pub mod metrics;
mod rate_limit;
mod refusals;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use sqlx::PgPool;

pub(crate) use caller::bearer;
use caller::mcp_caller;
pub use connections::{connection_budget, serve};
pub use limits::Limits;
pub use rate_limit::RateLimiter;

use crate::config::HttpSettings;
use crate::mcp::{BusServer, RequestBody};
use acs_store::Bus;
use acs_store::error::BusError;
pub(crate) use refusals::{
    address_crowded, address_throttled, caller_busy, rate_limited, server_busy, too_many_in_flight,
};

pub const SESSION_HEADER: &str = "x-crew-session";
pub const EPOCH_HEADER: &str = "x-crew-epoch";

/// The routes that exist, named in every 404.
const ROUTES: &[&str] = &[
    "POST /mcp",
    "GET /health",
    "GET /metrics",
    "GET /admin/whoami",
    "GET|POST /admin/teams",
    "GET|POST /admin/teams/{team}/agents",
    "POST /admin/teams/{team}/agents/{name}/disable|enable",
    "GET|POST /admin/teams/{team}/tokens",
    "DELETE /admin/teams/{team}/tokens/{id}",
    "GET|POST /admin/teams/{team}/webhooks",
    "DELETE /admin/teams/{team}/webhooks/{id}",
    "POST /admin/teams/{team}/webhooks/{id}/pause|resume",
    "GET|POST /admin/credentials",
    "DELETE /admin/credentials/{id}",
    "GET /dashboard",
    "GET /dashboard/data",
    "POST /dashboard/sign-in|sign-out",
    "GET /admin/teams/{team}/usage",
    "POST /admin/teams/{team}/prune",
];

pub struct AppState {
    /// For the waits the gate runs itself ([`crate::mcp::park`]).
    pub bus: Bus,
    pub pool: PgPool,
    pub events: acs_store::events::Events,
    pub backends: acs_store::backend::Backends,
    pub settings: HttpSettings,
    pub limiter: RateLimiter,
    /// `/admin` has its own allowance: a tenth of the MCP one.
    pub admin_limiter: RateLimiter,
    /// In-flight, buffered-bytes, per-credential and per-address caps.
    pub limits: Limits,
    /// `/health`'s snapshot (refreshed by one task) and latest checked look.
    pub health: health::Looks,
}

/// The whole HTTP application. Shutdown is [`serve`]'s business: it drains
/// connections, and long polls answer on their own ([`Bus::stopping`]), so
/// rmcp is given no token that would end a stream before its answer.
pub fn router(bus: Bus, settings: HttpSettings) -> Router {
    let state = Arc::new(AppState {
        bus: bus.clone(),
        pool: bus.pool.clone(),
        events: bus.events.clone(),
        backends: bus.backends.clone(),
        limiter: RateLimiter::new(settings.rate_limit_per_minute),
        admin_limiter: RateLimiter::new(settings.rate_limit_per_minute.div_ceil(10)),
        limits: Limits::new(&settings),
        settings: settings.clone(),
        health: health::Looks::default(),
    });
    tokio::spawn(health::refresh(
        Arc::downgrade(&state),
        bus.stopping.clone(),
    ));

    // Host is checked by our own layer for every route, so rmcp's copy of the
    // check is off rather than kept in step with it.
    let mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .disable_allowed_hosts()
        .with_allowed_origins(settings.allowed_origins.clone())
        .with_max_request_body_bytes(settings.max_request_bytes);
    let dashboard_bus = bus.clone();
    let server = BusServer::new(bus);
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        mcp_config,
    );

    let mcp_routes = Router::new()
        .fallback_service(mcp)
        .layer(middleware::from_fn_with_state(state.clone(), mcp_gate));

    Router::new()
        .route("/health", get(health::health))
        .route(
            "/metrics",
            get(metrics::on_main_listener).layer(middleware::from_fn_with_state(
                state.clone(),
                admin_admission,
            )),
        )
        .nest("/mcp", mcp_routes)
        .nest(
            "/admin",
            admin::routes(state.clone()).layer(middleware::from_fn_with_state(
                state.clone(),
                admin_admission,
            )),
        )
        .merge(dashboard::routes(state.clone(), dashboard_bus))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), host_check))
        .layer(middleware::from_fn(metrics::count_response))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// A JSON refusal: `{"error": kind, "message": text}`.
pub fn json_error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(json!({ "error": kind, "message": message.into() })),
    )
        .into_response()
}

pub(crate) fn bus_error_response(err: &BusError) -> Response {
    if err.is_pool_timeout() {
        acs_metrics::record_pool_timeout();
    }
    let status =
        StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_error(status, err.kind(), err.to_string());
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

pub(crate) async fn not_found(request: Request) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({
            "error": "not_found",
            "message": format!("no route for {method} {path}. The routes are: {}.", ROUTES.join(", ")),
            "routes": ROUTES,
        })),
    )
        .into_response()
}

/// The `Host` of a request without its port, and with it.
fn request_host(request: &Request) -> Option<(String, String)> {
    let authority = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.to_string()))?
        .to_ascii_lowercase();
    let bare = if let Some(rest) = authority.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default().to_string()
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority.as_str(), |(h, _)| h)
            .to_string()
    };
    Some((bare, authority))
}

async fn host_check(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match host_refusal(&state.settings.allowed_hosts, &request) {
        Some(refusal) => refusal,
        None => next.run(request).await,
    }
}

/// The refusal of a request whose `Host` is not among `allowed`, if it is not.
fn host_refusal(allowed: &[String], request: &Request) -> Option<Response> {
    if allowed.iter().any(|h| h == "*") {
        return None;
    }
    let ok = request_host(request).is_some_and(|(bare, full)| {
        allowed
            .iter()
            .any(|h| h.eq_ignore_ascii_case(&bare) || h.eq_ignore_ascii_case(&full))
    });
    if ok {
        return None;
    }
    Some(json_error(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "the Host header is not one this server answers to (allowed: {}). This guards \
             against DNS rebinding. Connect with an allowed name, or start the server with \
             `--allowed-hosts` naming the host clients use.",
            allowed.join(", ")
        ),
    ))
}

pub(crate) fn too_large(limit: usize) -> Response {
    json_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid",
        format!(
            "the request body is larger than the limit of {limit} bytes ({} MiB). Send less per \
             call: split large content across messages or attachments.",
            limit / (1024 * 1024)
        ),
    )
}

/// The address a request comes from: its peer's, or behind a trusted proxy
/// the client `X-Forwarded-For` names (see [`Limits::client_address`]).
pub(crate) fn client_address(limits: &Limits, request: &Request) -> Option<std::net::IpAddr> {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    limits.client_address(peer, request.headers())
}

/// `/admin`'s share of the load limits: a request slot and the address's
/// allowance of failed authentications (the admin gate looks the credential
/// up; a 401 from it keeps the attempt counted).
async fn admin_admission(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let limits = &state.limits;
    let Some(_slot) = limits.enter() else {
        return too_many_in_flight(limits);
    };
    let address = client_address(limits, &request);
    // The admin gate looks the credential up inside the route: past the
    // address's allowance the whole request waits for its turn.
    let turn = limits.lookup_turn(address).await;
    if let (true, Some(wait)) = (turn.crowded(), turn.throttled()) {
        return address_crowded(address, wait, limits.unauthenticated_per_minute());
    }
    let response = next.run(request).await;
    if response.status() == StatusCode::UNAUTHORIZED {
        limits.failed_authentication(address);
        if let Some(wait) = turn.throttled() {
            return address_throttled(address, wait, limits.unauthenticated_per_minute());
        }
    }
    response
}

/// Everything `/mcp` checks before rmcp sees the request (see the module docs).
async fn mcp_gate(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let limits = &state.limits;
    let Some(_slot) = limits.enter() else {
        return too_many_in_flight(limits);
    };
    // What the method and headers say does not depend on who asks.
    if let Err(refusal) = malformed::check_headers(request.method(), request.headers()) {
        return refusal;
    }
    let limit = state.settings.max_request_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return too_large(limit);
    }

    let address = client_address(limits, &request);
    let identity = match mcp_caller(&state, request.headers(), address).await {
        Ok(identity) => identity,
        Err(refusal) => return refusal,
    };

    if let Err(wait) = state.limiter.check(identity.token_id) {
        return rate_limited(wait, state.limiter.per_minute(), "token");
    }

    let caller = limits::Caller::of(&identity);
    // Counted as ordinary before the body is read, so one caller holds at
    // most its cap of bodies in the buffered-bytes budget.
    let ordinary = match limits.ordinary_slot(caller) {
        Ok(slot) => slot,
        Err(at) => {
            return caller_busy(
                at,
                "ordinary calls",
                "batch work instead of sending calls in parallel.",
            );
        }
    };

    let (mut parts, body) = request.into_parts();
    let (bytes, _buffered) = match read_mcp_body(&state, body, declared).await {
        Ok(read) => read,
        Err(refusal) => return refusal,
    };
    let checked = match malformed::check_body(&parts.headers, &bytes) {
        Ok(checked) => checked,
        Err(refusal) => return refusal,
    };
    // A blocked wait moves to its own count, so waits never use up the slots
    // ordinary calls of the same credential need. The tool's name comes from
    // the same pass that checked the body: it is not read a second time.
    let _call = if checked.is_long_poll() {
        drop(ordinary);
        match limits.long_poll_slot(caller) {
            Ok(slot) => slot,
            Err(at) => {
                return caller_busy(
                    at,
                    "long polls (wait_for_updates, ask_agent, wait_for_conversation_updates)",
                    "one wait per window with `kinds` or `all_channels` covers what several \
                     would; end the windows you no longer use (revoke_session) rather than \
                     waiting in each.",
                );
            }
        }
    } else {
        ordinary
    };
    // A blocked wait waits here, before rmcp builds its service for the
    // request (`mcp::park`): what a fleet's idle windows hold is then the
    // request and the wait, not rmcp's tasks and channels.
    if checked.tool() == Some(crate::mcp::PARKED_TOOL) {
        own_the_head(&mut parts);
        if let Some(parked) = crate::mcp::park(&state.bus, &identity, &bytes).await {
            parts.extensions.insert(parked);
        }
    }
    parts.extensions.insert(identity);
    // Shared, not copied: only a call whose arguments fail to deserialise
    // reads it again, to name what is wrong (`mcp::BusServer::dispatch`).
    parts.extensions.insert(RequestBody(bytes.clone()));
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let response = malformed::explain_plain_refusal(&checked, response).await;
    // A long poll may answer as an event stream that flows for minutes after
    // the handler returned (rmcp switches to SSE once a progress notification
    // goes out): the slots are held until the answer is sent or abandoned.
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(HoldingSlots {
            body,
            _slots: (_slot, _call),
        }),
    )
}

/// Copy the request's header values and URIs into allocations of their own.
/// hyper hands them out as slices of the connection's read buffer, so a
/// request kept for minutes (a blocked wait) would keep that 8 KiB buffer
/// alive beside the one hyper reads on with, to notice a client that goes
/// away: once copied, the first buffer is freed.
fn own_the_head(parts: &mut http::request::Parts) {
    let owned = |value: &HeaderValue| {
        let mut copy = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
        copy.set_sensitive(value.is_sensitive());
        copy
    };
    let headers = std::mem::take(&mut parts.headers);
    parts.headers = headers
        .iter()
        .map(|(name, value)| (name.clone(), owned(value)))
        .collect();
    let own_uri = |uri: &axum::http::Uri| axum::http::Uri::try_from(uri.to_string()).ok();
    if let Some(uri) = own_uri(&parts.uri) {
        parts.uri = uri;
    }
    if let Some(original) = parts.extensions.get_mut::<axum::extract::OriginalUri>()
        && let Some(uri) = own_uri(&original.0)
    {
        original.0 = uri;
    }
}

/// An `/mcp` request's body, read within the size limit, the server's
/// buffered-bytes budget (the permit is held until the request ends) and the
/// body timeout; or the refusal that says which.
async fn read_mcp_body(
    state: &AppState,
    body: Body,
    declared: Option<u64>,
) -> Result<(axum::body::Bytes, tokio::sync::OwnedSemaphorePermit), Response> {
    let limits = &state.limits;
    let limit = state.settings.max_request_bytes;
    match limits.read_body(body, declared, limit).await {
        Ok(read) => Ok(read),
        Err(limits::BodyRefusal::TooLarge) => Err(too_large(limit)),
        Err(limits::BodyRefusal::BudgetExhausted) => Err(server_busy(format!(
            "the server is buffering its maximum of {} MiB of request bodies at once",
            limits.max_buffered_bytes() / (1024 * 1024)
        ))),
        Err(limits::BodyRefusal::Unreadable(err)) => Err(json_error(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("could not read the request body: {err}"),
        )),
        Err(limits::BodyRefusal::TimedOut) => Err(json_error(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!(
                "the request body did not arrive within {} s; nothing was done. Send the whole \
                 body at once.",
                state.settings.body_read_timeout.as_secs()
            ),
        )),
    }
}

/// A response body that keeps the request's slots until it has been sent in
/// full or dropped (the client went away).
struct HoldingSlots<T> {
    body: Body,
    _slots: T,
}

impl<T: Unpin> http_body::Body for HoldingSlots<T> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
