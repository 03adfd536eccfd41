//! `/dashboard`: a page for the people on a team, served by the bus itself
//! with no build step and nothing fetched from elsewhere. Agents and admin
//! credentials look; a person of the team (their credential, `person add`)
//! also writes (`writes.rs`, the forms in `forms.rs`).
//!
//! - `GET /dashboard`: the team's page for a signed-in browser, else the
//!   sign-in form.
//! - `POST /dashboard/sign-in` (a form of at most [`FORM_MAX_BYTES`]:
//!   `token`, and `team` for an admin credential) exchanges an agent token
//!   or an admin credential for a signed cookie ([`session`]) naming a
//!   sign-in row kept in PostgreSQL; it takes one of the server's request
//!   slots and spends the address's failed-authentication allowance like
//!   `/mcp`. `POST /dashboard/sign-out` deletes the row (every copy of the
//!   cookie stops working, on every replica) and clears the cookie.
//! - `GET /dashboard/data`: the same content as JSON, polled by `app.js`
//!   every few seconds (polling survives replicas and needs no stream).
//!   It and `GET /dashboard` take a request slot and count against the
//!   principal's allowance: a tenth of `--rate-limit-per-minute` (60 a
//!   minute by default, three open pages), 429 past it.
//! - `POST /dashboard/write/{action}`: a person's write ([`writes`]: its
//!   origin, write-token and principal checks, then one store call).
//! - `GET /dashboard/app.js`, `/dashboard/app.css`: compiled into the binary.
//!
//! Every response carries `Cache-Control: no-store`, `Referrer-Policy:
//! no-referrer`, `nosniff`, `X-Frame-Options: DENY` and a CSP that allows
//! only this origin's script, style and fetches. A credential in the query
//! string is refused (400) before anything else: URLs end up in logs and
//! histories. The handlers hold no SQL: `store::operations::dashboard` signs in,
//! re-checks the principal on every request and reads the page.

mod forms;
mod page;
mod session;
mod writes;

use std::sync::{Arc, LazyLock};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::limits::BodyRefusal;
use super::{AppState, RateLimiter};
use crate::config::DashboardCookie;
use acs_store::Bus;
use acs_store::auth::{self, AgentCredential};
use acs_store::error::BusError;
use acs_store::store::operations::dashboard::{self as store, Viewer};
use acs_store::store::text;

pub use page::escape;
pub use session::{COOKIE_NAME, SECRET_MIN_CHARS};

/// `app.js` as written; [`script`] serves it with the bidi list filled in.
const APP_JS: &str = include_str!("app.js");
/// Where `app.js` takes the characters it spells out.
const BIDI_PLACEHOLDER: &str = "__BIDI_CONTROLS__";

/// `app.js` with [`text::BIDI_CONTROLS`] written in as JavaScript escapes, so
/// the redraws spell out exactly the set the first render and the console
/// client do, from the one list.
static SCRIPT: LazyLock<String> = LazyLock::new(|| {
    let set: String = text::BIDI_CONTROLS
        .iter()
        .map(|c| format!("\\u{:04X}", *c as u32))
        .collect();
    APP_JS.replacen(BIDI_PLACEHOLDER, &set, 1)
});
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

/// The largest sign-in form read: a credential and a team slug fit many
/// times over; a larger one is refused (413) before it is buffered.
pub const FORM_MAX_BYTES: usize = 4 * 1024;

struct Dashboard {
    app: Arc<AppState>,
    /// What a person's writes call the store with.
    bus: Bus,
    key: session::CookieKey,
    /// Pages and data per principal: a tenth of the MCP allowance.
    limiter: RateLimiter,
    cookie: DashboardCookie,
}

type Shared = Arc<Dashboard>;

/// The dashboard's routes, with its own state (the app's and the cookie key).
pub fn routes<S: Clone + Send + Sync + 'static>(app: Arc<AppState>, bus: Bus) -> Router<S> {
    let key = session::CookieKey::new(app.settings.dashboard_secret.as_deref());
    let limiter = RateLimiter::new(app.settings.rate_limit_per_minute.div_ceil(10));
    let cookie = app.settings.dashboard_cookie;
    let state = Arc::new(Dashboard {
        app,
        bus,
        key,
        limiter,
        cookie,
    });
    Router::new()
        .route("/dashboard", get(show))
        .route("/dashboard/", get(show))
        .route("/dashboard/data", get(data))
        .route("/dashboard/sign-in", post(sign_in))
        .route("/dashboard/sign-out", post(sign_out))
        .route("/dashboard/write/{action}", post(writes::write))
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
    let sign_in = state.key.open(value).ok_or_else(|| {
        BusError::unauthenticated(
            "the dashboard sign-in is not valid here: it expired (sign-ins last 8 hours), was \
             altered, or was issued by a server with another dashboard secret (a restart without \
             --dashboard-secret, or another replica). Sign in again.",
        )
    })?;
    store::recheck(&state.app.pool, sign_in).await.map(Some)
}

/// 429 + `Retry-After` for a principal past its allowance of pages.
fn rate_limited(state: &Dashboard, viewer: &Viewer) -> Option<Response> {
    let wait = state.limiter.check(viewer.principal.rate_key()).err()?;
    let seconds = wait.as_secs() + 1;
    Some(super::refusals::too_many_requests(
        seconds,
        format!(
            "this dashboard sign-in's credential asked for more than {} pages a minute (a tenth \
             of this server's --rate-limit-per-minute). Wait {seconds} s; one open page polls \
             every 3 s, so close other pages signed in with the same credential.",
            state.limiter.per_minute()
        ),
    ))
}

/// What the sign-in form says besides any error: when the cookie is
/// `Secure` and this request did not come over https, a browser on a plain
/// http:// address would drop it and show the form again.
fn sign_in_page(state: &Dashboard, headers: &HeaderMap, error: Option<&str>) -> String {
    let dropped = state.cookie == DashboardCookie::Secure && !session::over_https(headers);
    page::sign_in(error, dropped)
}

async fn show(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let Some(_slot) = state.app.limits.enter() else {
        return super::too_many_in_flight(&state.app.limits);
    };
    match viewer(&state, &headers).await {
        Ok(Some(viewer)) => {
            if let Some(refusal) = rate_limited(&state, &viewer) {
                return refusal;
            }
            // A person's forms carry their sign-in's write token.
            let write_token = viewer
                .person()
                .and(session::cookie_value(&headers))
                .and_then(|v| state.key.open(v))
                .map(|sign_in| state.key.write_token(sign_in.session_id));
            let app = &state.app;
            match store::snapshot(&app.pool, &app.backends, &app.events, viewer).await {
                Ok(snapshot) => {
                    Html(page::dashboard(&snapshot, write_token.as_deref())).into_response()
                }
                Err(err) => super::bus_error_response(&err),
            }
        }
        Ok(None) => Html(sign_in_page(&state, &headers, None)).into_response(),
        Err(BusError::Db(err)) => super::bus_error_response(&BusError::Db(err)),
        Err(err) => {
            let mut response = (
                StatusCode::UNAUTHORIZED,
                Html(sign_in_page(&state, &headers, Some(&err.to_string()))),
            )
                .into_response();
            response.headers_mut().insert(
                header::SET_COOKIE,
                session::clear_cookie(state.cookie, &headers),
            );
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
    if let Some(refusal) = rate_limited(&state, &viewer) {
        return refusal;
    }
    let app = &state.app;
    match store::snapshot(&app.pool, &app.backends, &app.events, viewer).await {
        Ok(snapshot) => Json(snapshot).into_response(),
        Err(err) => super::bus_error_response(&err),
    }
}

/// The sign-in form's fields.
#[derive(Default)]
struct SignInForm {
    token: String,
    team: String,
}

async fn sign_in(
    State(state): State<Shared>,
    request_headers: HeaderMap,
    request: Request,
) -> Response {
    // Signing in looks a credential up and writes a row: a request like any.
    let limits = &state.app.limits;
    let Some(_slot) = limits.enter() else {
        return super::too_many_in_flight(limits);
    };
    if !same_origin(&request_headers) {
        return refused(
            StatusCode::FORBIDDEN,
            "this sign-in came from another site's page. Open /dashboard on this server and sign \
             in there.",
        );
    }
    let address = super::client_address(limits, &request);
    // Past the address's allowance of failures the sign-in waits its turn
    // for the lookup; a token that verifies is never refused for it.
    let turn = limits.lookup_turn(address).await;
    if let (true, Some(wait)) = (turn.crowded(), turn.throttled()) {
        return super::address_crowded(address, wait, limits.unauthenticated_per_minute());
    }
    let form = match read_form(&state, request).await {
        Ok(form) => form,
        Err(refusal) => return refusal,
    };
    let viewer = match exchange(&state, &form).await {
        Ok(viewer) => viewer,
        Err(err) => {
            if matches!(err, BusError::Unauthenticated(_)) {
                limits.failed_authentication(address);
                if let Some(wait) = turn.throttled() {
                    return super::address_throttled(
                        address,
                        wait,
                        limits.unauthenticated_per_minute(),
                    );
                }
            }
            let status =
                StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::UNAUTHORIZED);
            return refused(status, &err.to_string());
        }
    };
    let expires = chrono::Utc::now() + session::LIFETIME;
    let signed_in = match store::begin(&state.app.pool, viewer.principal, expires).await {
        Ok(signed_in) => signed_in,
        Err(err) => return super::bus_error_response(&err),
    };
    let value = state.key.seal(signed_in, expires);
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/dashboard")]).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session::set_cookie(state.cookie, &request_headers, &value),
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
    (status, Html(page::sign_in(Some(message), false))).into_response()
}

/// A credential from the form, by its class: an agent token, or an admin
/// credential with a team.
async fn exchange(state: &Dashboard, form: &SignInForm) -> Result<Viewer, BusError> {
    let token = form.token.trim();
    let pool = &state.app.pool;
    if token.is_empty() {
        return Err(BusError::invalid(
            "paste an agent token or a person's credential (acs_…), or an admin credential \
             (acsa_…), into the token field.",
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

/// End the sign-in on the server (its row goes, so a copy of the cookie
/// stops working too), then have the browser forget the cookie; posted
/// from this dashboard's page only ([`same_origin`]).
async fn sign_out(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let Some(_slot) = state.app.limits.enter() else {
        return super::too_many_in_flight(&state.app.limits);
    };
    // Another site's page cannot sign a browser out either.
    if !same_origin(&headers) {
        return refused(
            StatusCode::FORBIDDEN,
            "this sign-out came from another site's page (its Origin or Sec-Fetch-Site is not              this dashboard's), so it was refused and the sign-in goes on. Sign out from              /dashboard on this server.",
        );
    }
    // A cookie that no longer opens (expired, altered) names nothing to end.
    if let Some(signed_in) = session::cookie_value(&headers).and_then(|v| state.key.open(v))
        && let Err(err) = store::end(&state.app.pool, signed_in.session_id).await
    {
        return super::bus_error_response(&err);
    }
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/dashboard")]).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session::clear_cookie(state.cookie, &headers),
    );
    response
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT.as_str(),
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS).into_response()
}

/// The words a form's refusals use: what it is ("the write"), what the
/// refusal left (`"; nothing was changed"`, or nothing), how to send it, and
/// what to say when it is too large or arrives too late.
pub(super) struct FormWords<'a> {
    pub what: &'a str,
    pub unchanged: &'a str,
    pub how: &'a str,
    pub too_large: String,
    pub late: &'a str,
}

/// Why a form could not be read: a status and its words, for the caller's
/// page to say, or the answer of a server buffering all it may.
pub(super) enum FormRefusal {
    Said(StatusCode, String),
    Busy(Response),
}

impl FormRefusal {
    /// The refusal as `page` shows a status and its words.
    pub(super) fn answer(self, page: fn(StatusCode, &str) -> Response) -> Response {
        match self {
            FormRefusal::Said(status, words) => page(status, &words),
            FormRefusal::Busy(response) => response,
        }
    }
}

/// A form's bytes (`application/x-www-form-urlencoded`), read within `max`
/// bytes and the server's buffered-bytes budget.
pub(super) async fn form_bytes(
    limits: &super::Limits,
    request: Request,
    max: usize,
    words: FormWords<'_>,
) -> Result<axum::body::Bytes, FormRefusal> {
    let FormWords {
        what,
        unchanged,
        how,
        too_large,
        late,
    } = words;
    let is_form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !is_form {
        return Err(FormRefusal::Said(
            StatusCode::BAD_REQUEST,
            format!("{what} could not be read (it is not a form){unchanged}. {how}"),
        ));
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match limits.read_body(request.into_body(), declared, max).await {
        Ok((bytes, _buffered)) => Ok(bytes),
        Err(BodyRefusal::TooLarge) => {
            Err(FormRefusal::Said(StatusCode::PAYLOAD_TOO_LARGE, too_large))
        }
        Err(BodyRefusal::BudgetExhausted) => Err(FormRefusal::Busy(super::server_busy(format!(
            "the server is buffering its maximum of {} MiB of request bodies at once",
            limits.max_buffered_bytes() / (1024 * 1024)
        )))),
        Err(BodyRefusal::Unreadable(err)) => Err(FormRefusal::Said(
            StatusCode::BAD_REQUEST,
            format!("{what} could not be read ({err}){unchanged}. {how}"),
        )),
        Err(BodyRefusal::TimedOut) => Err(FormRefusal::Said(
            StatusCode::REQUEST_TIMEOUT,
            late.to_string(),
        )),
    }
}

/// The sign-in form, read within [`FORM_MAX_BYTES`] and the server's
/// buffered-bytes budget, or the refusal to answer with.
async fn read_form(state: &Dashboard, request: Request) -> Result<SignInForm, Response> {
    let words = FormWords {
        what: "the sign-in form",
        unchanged: "",
        how: "Send it as application/x-www-form-urlencoded with the fields token and team.",
        too_large: format!(
            "the sign-in form is larger than {FORM_MAX_BYTES} bytes (4 KiB); it holds only a \
             credential and a team slug. Nothing was done. Paste just the credential (acs_… or \
             acsa_…) into the token field and sign in again."
        ),
        late: "the sign-in form did not arrive in time; nothing was done. Sign in again.",
    };
    let bytes = form_bytes(&state.app.limits, request, FORM_MAX_BYTES, words)
        .await
        .map_err(|refusal| refusal.answer(refused))?;
    let mut form = SignInForm::default();
    for (name, value) in url::form_urlencoded::parse(&bytes) {
        match name.as_ref() {
            "token" => form.token = value.into_owned(),
            "team" => form.team = value.into_owned(),
            _ => {}
        }
    }
    Ok(form)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_served_with_the_one_bidi_list_written_in() {
        assert!(APP_JS.matches(BIDI_PLACEHOLDER).count() == 1);
        assert!(!SCRIPT.contains(BIDI_PLACEHOLDER));
        assert!(SCRIPT.contains(
            "\"[\" + \"\\u202A\\u202B\\u202C\\u202D\\u202E\\u2066\\u2067\\u2068\\u2069\" + \"]\""
        ));
    }
}
