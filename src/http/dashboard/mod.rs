//! `/dashboard`: a read-only page for the people on a team, served by the
//! bus itself with no build step and nothing fetched from elsewhere.
//!
//! - `GET /dashboard`: the team's page for a signed-in browser, else the
//!   sign-in form.
//! - `POST /dashboard/sign-in` (a form: `token`, and `team` for an admin
//!   credential) exchanges an agent token or an admin credential for a signed
//!   cookie ([`session`]); `POST /dashboard/sign-out` clears it.
//! - `GET /dashboard/data`: the same content as JSON, polled by `app.js`
//!   every few seconds (polling survives replicas and needs no stream).
//! - `GET /dashboard/app.js`, `/dashboard/app.css`: compiled into the binary.
//!
//! Every response carries `Cache-Control: no-store`, `Referrer-Policy:
//! no-referrer`, `nosniff`, `X-Frame-Options: DENY` and a CSP that allows
//! only this origin's script, style and fetches. A credential in the query
//! string is refused (400) before anything else: URLs end up in logs and
//! histories. The handlers hold no SQL: `store::dashboard` signs in,
//! re-checks the principal on every request and reads the page.

mod page;
mod session;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use serde::Deserialize;

use super::AppState;
use crate::auth::{self, AgentCredential};
use crate::error::BusError;
use crate::store::dashboard::{self as store, Viewer};

pub use page::escape;
pub use session::{COOKIE_NAME, SECRET_MIN_CHARS};

const APP_JS: &str = include_str!("app.js");
const APP_CSS: &str = include_str!("app.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Query parameters that would carry a credential.
const CREDENTIAL_PARAMETERS: &[&str] = &[
    "token",
    "access_token",
    "auth",
    "authorization",
    "credential",
    "api_key",
    "apikey",
    "key",
    "secret",
    "bearer",
];

struct Dashboard {
    app: Arc<AppState>,
    key: session::CookieKey,
}

type Shared = Arc<Dashboard>;

/// The dashboard's routes, with its own state (the app's and the cookie key).
pub fn routes<S: Clone + Send + Sync + 'static>(app: Arc<AppState>) -> Router<S> {
    let key = session::CookieKey::new(app.settings.dashboard_secret.as_deref());
    let state = Arc::new(Dashboard { app, key });
    Router::new()
        .route("/dashboard", get(show))
        .route("/dashboard/", get(show))
        .route("/dashboard/data", get(data))
        .route("/dashboard/sign-in", post(sign_in))
        .route("/dashboard/sign-out", post(sign_out))
        .route("/dashboard/app.js", get(script))
        .route("/dashboard/app.css", get(style))
        .layer(middleware::from_fn(refuse_query_credentials))
        .layer(middleware::map_response(protective_headers))
        .with_state(state)
}

async fn protective_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CONTENT_SECURITY_POLICY, CSP),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn refuse_query_credentials(request: Request, next: Next) -> Response {
    let query = request.uri().query().unwrap_or_default();
    let carries_credential = url::form_urlencoded::parse(query.as_bytes()).any(|(name, value)| {
        let name = name.to_ascii_lowercase();
        CREDENTIAL_PARAMETERS.contains(&name.as_str())
            || name.contains("token")
            || value.starts_with(auth::AGENT_TOKEN_PREFIX)
            || value.starts_with(auth::ADMIN_CREDENTIAL_PREFIX)
    });
    if carries_credential {
        return super::json_error(
            StatusCode::BAD_REQUEST,
            "invalid",
            "the dashboard never takes a credential in the URL (addresses end up in logs, \
             histories and Referer headers). Nothing was done. Open /dashboard without it and \
             paste the token into the sign-in form; treat the token as exposed and have it \
             replaced (`ai-crew-sync token issue`, then `token revoke`).",
        );
    }
    next.run(request).await
}

/// The signed-in viewer, re-checked now; `Err` says why there is none (a
/// missing cookie is `Ok(None)`).
async fn viewer(state: &Dashboard, headers: &HeaderMap) -> Result<Option<Viewer>, BusError> {
    let Some(value) = session::cookie_value(headers) else {
        return Ok(None);
    };
    let principal = state.key.open(value).ok_or_else(|| {
        BusError::unauthenticated(
            "the dashboard sign-in is not valid here: it expired (sign-ins last 8 hours), was \
             altered, or was issued by a server with another dashboard secret (a restart without \
             --dashboard-secret, or another replica). Sign in again.",
        )
    })?;
    store::recheck(&state.app.pool, principal).await.map(Some)
}

async fn show(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let Some(_slot) = state.app.limits.enter() else {
        return super::too_many_in_flight(&state.app.limits);
    };
    match viewer(&state, &headers).await {
        Ok(Some(viewer)) => {
            let app = &state.app;
            match store::snapshot(&app.pool, &app.backends, &app.events, viewer).await {
                Ok(snapshot) => Html(page::dashboard(&snapshot)).into_response(),
                Err(err) => super::bus_error_response(&err),
            }
        }
        Ok(None) => Html(page::sign_in(None)).into_response(),
        Err(BusError::Db(err)) => super::bus_error_response(&BusError::Db(err)),
        Err(err) => {
            let mut response = (
                StatusCode::UNAUTHORIZED,
                Html(page::sign_in(Some(&err.to_string()))),
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::SET_COOKIE, session::clear_cookie(&headers));
            response
        }
    }
}

async fn data(State(state): State<Shared>, headers: HeaderMap) -> Response {
    // A page left open polls forever: it takes a request slot like any call.
    let Some(_slot) = state.app.limits.enter() else {
        return super::too_many_in_flight(&state.app.limits);
    };
    let viewer = match viewer(&state, &headers).await {
        Ok(Some(viewer)) => viewer,
        Ok(None) => {
            return super::json_error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "not signed in to the dashboard: open /dashboard and sign in with an agent token \
                 or an admin credential.",
            );
        }
        Err(err) => return super::bus_error_response(&err),
    };
    let app = &state.app;
    match store::snapshot(&app.pool, &app.backends, &app.events, viewer).await {
        Ok(snapshot) => Json(snapshot).into_response(),
        Err(err) => super::bus_error_response(&err),
    }
}

#[derive(Deserialize)]
struct SignIn {
    #[serde(default)]
    token: String,
    #[serde(default)]
    team: String,
}

async fn sign_in(
    State(state): State<Shared>,
    request_headers: HeaderMap,
    request: Request,
) -> Response {
    if !same_origin(&request_headers) {
        return refused(
            StatusCode::FORBIDDEN,
            "this sign-in came from another site's page. Open /dashboard on this server and sign \
             in there.",
        );
    }
    let limits = &state.app.limits;
    let address = super::client_address(limits, &request);
    // Past the address's allowance of failures the sign-in waits its turn
    // for the lookup; a token that verifies is never refused for it.
    let _turn = limits.lookup_turn(address).await;
    let form = match read_form(request).await {
        Ok(form) => form,
        Err(message) => return refused(StatusCode::BAD_REQUEST, &message),
    };
    let signed_in = match exchange(&state, &form).await {
        Ok(viewer) => viewer,
        Err(err) => {
            if matches!(err, BusError::Unauthenticated(_)) {
                limits.failed_authentication(address);
            }
            let status =
                StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::UNAUTHORIZED);
            return refused(status, &err.to_string());
        }
    };
    let expires = chrono::Utc::now() + session::LIFETIME;
    let value = state.key.seal(signed_in.principal, expires);
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/dashboard")]).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session::set_cookie(&request_headers, &value),
    );
    response
}

/// Whether a sign-in was posted from this server's own page, so no page
/// elsewhere can sign a browser in to a team of its choosing. Browsers say
/// so in `Sec-Fetch-Site`; without it, an `Origin` (other than `null`, which
/// `Referrer-Policy: no-referrer` makes a browser send) must name this host.
/// A client that is not a browser sends neither, and passes.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text("sec-fetch-site") {
        return site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none");
    }
    match text(header::ORIGIN.as_str()) {
        None | Some("null") => true,
        Some(origin) => origin.split_once("://").is_some_and(|(_, authority)| {
            authority.eq_ignore_ascii_case(text(header::HOST.as_str()).unwrap_or_default())
        }),
    }
}

fn refused(status: StatusCode, message: &str) -> Response {
    (status, Html(page::sign_in(Some(message)))).into_response()
}

/// A credential from the form, by its class: an agent token, or an admin
/// credential with a team.
async fn exchange(state: &Dashboard, form: &SignIn) -> Result<Viewer, BusError> {
    let token = form.token.trim();
    let pool = &state.app.pool;
    if token.is_empty() {
        return Err(BusError::invalid(
            "paste an agent token (acs_…) or an admin credential (acsa_…) into the token field.",
        ));
    }
    if !token.starts_with(auth::AGENT_TOKEN_PREFIX)
        && !token.starts_with(auth::SESSION_CREDENTIAL_PREFIX)
        && !token.starts_with(auth::ADMIN_CREDENTIAL_PREFIX)
    {
        return Err(BusError::invalid(
            "this is not an agent token (acs_ followed by 64 hex characters) nor an admin \
             credential (acsa_…). Copy the whole credential as it was printed.",
        ));
    }
    if token.starts_with(auth::ADMIN_CREDENTIAL_PREFIX) {
        let digest = auth::parse_admin_credential(token)?;
        return store::sign_in_admin(pool, &digest, &form.team).await;
    }
    match auth::parse_agent_credential(token)? {
        AgentCredential::Token(digest) => store::sign_in_agent(pool, &digest).await,
        AgentCredential::Session(_) => Err(BusError::invalid(
            "a session credential (acss_…) belongs to one window of an agent; sign in to the \
             dashboard with the agent token (acs_…) or an admin credential (acsa_…).",
        )),
    }
}

async fn sign_out(headers: HeaderMap) -> Response {
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/dashboard")]).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session::clear_cookie(&headers));
    response
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}

/// The sign-in form, or a refusal in words.
async fn read_form(request: Request) -> Result<SignIn, String> {
    use axum::extract::FromRequest;
    match Form::<SignIn>::from_request(request, &()).await {
        Ok(Form(form)) => Ok(form),
        Err(rejection) => Err(format!(
            "the sign-in form could not be read ({rejection}). Send it as \
             application/x-www-form-urlencoded with the fields token and team."
        )),
    }
}
