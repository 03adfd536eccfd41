//! `/admin/*`: the remote JSON API for admin credentials (`acsa_…`).
//!
//! Thin like the tools: authenticate, call one store function with the
//! credential's [`Authority`] (the store's scope types make the check), answer
//! JSON. Its own limits: bodies up to 16 KiB, and a rate a
//! tenth of the MCP one per credential. Bodies are parsed strictly (unknown
//! fields refused), so a body can never widen what the path allows.

mod storage;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{AppState, bearer, bus_error_response, json_error, rate_limited, too_large};
use acs_store::auth;
use acs_store::error::{BusError, BusResult};
use acs_store::store::identity::admin::{self, AdminIdentity, Authority, TeamScope};
use acs_store::store::{
    identity::agents, identity::people, identity::teams, identity::tokens, text,
};

mod webhooks;

pub const ADMIN_BODY_MAX_BYTES: usize = 16 * 1024;

pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    Router::new()
        .route("/whoami", get(whoami))
        .route("/teams", get(list_teams).post(create_team))
        .route("/teams/{team}/agents", get(list_agents).post(add_agent))
        .route("/teams/{team}/agents/{name}/disable", post(disable_agent))
        .route("/teams/{team}/agents/{name}/enable", post(enable_agent))
        .route("/teams/{team}/people", get(list_people).post(add_person))
        .route("/teams/{team}/people/{name}/revoke", post(revoke_person))
        .route("/teams/{team}/tokens", get(list_tokens).post(issue_token))
        .route("/teams/{team}/tokens/{id}", delete(revoke_token))
        .route("/credentials", get(list_credentials).post(grant_credential))
        .route("/credentials/{id}", delete(revoke_credential))
        .merge(webhooks::routes())
        .route("/teams/{team}/usage", get(storage::usage))
        .route("/teams/{team}/prune", post(storage::prune))
        .fallback(super::not_found)
        .layer(middleware::from_fn_with_state(state, admin_gate))
}

/// A store error or a value, as an HTTP answer.
struct Answer(Result<(StatusCode, Value), BusError>);

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match self.0 {
            Ok((status, value)) => (status, Json(value)).into_response(),
            Err(err) => bus_error_response(&err),
        }
    }
}

fn ok<T: serde::Serialize>(result: BusResult<T>) -> Answer {
    answer(StatusCode::OK, result)
}

fn created<T: serde::Serialize>(result: BusResult<T>) -> Answer {
    answer(StatusCode::CREATED, result)
}

fn answer<T: serde::Serialize>(status: StatusCode, result: BusResult<T>) -> Answer {
    Answer(result.map(|v| (status, serde_json::to_value(v).unwrap_or(Value::Null))))
}

/// The `{team}` of a route, scoped by the caller's credential
/// ([`Authority::team`]): a credential confined to another team is refused
/// before the handler runs, so a handler holding a `Team` may act on it.
struct Team(TeamScope);

impl FromRequestParts<Arc<AppState>> for Team {
    type Rejection = Answer;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let me = parts
            .extensions
            .get::<Authority>()
            .cloned()
            .expect("admin_gate puts the caller's authority on every request");
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .expect("every route taking a Team has a {team} segment");
        let team = params.get("team").map(String::as_str).unwrap_or_default();
        me.team(team).map(Team).map_err(|err| Answer(Err(err)))
    }
}

fn parse<T: DeserializeOwned>(body: &Bytes) -> BusResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        BusError::invalid(format!(
            "the request body is not the JSON this route takes: {e}. See the route's fields in the \
             operator docs; unknown fields are refused."
        ))
    })
}

async fn admin_gate(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > ADMIN_BODY_MAX_BYTES as u64) {
        return too_large(ADMIN_BODY_MAX_BYTES);
    }
    let me = match bearer(request.headers()).and_then(auth::parse_admin_credential) {
        Ok(digest) => match admin::authenticate(&state.pool, &digest).await {
            Ok(me) => me,
            Err(err) => return bus_error_response(&err),
        },
        Err(err) => return bus_error_response(&err),
    };
    if let Err(wait) = state.admin_limiter.check(me.credential_id) {
        return rate_limited(wait, state.admin_limiter.per_minute(), "admin credential");
    }
    let (mut parts, body) = request.into_parts();
    let bytes = match Limited::new(body, ADMIN_BODY_MAX_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            return too_large(ADMIN_BODY_MAX_BYTES);
        }
        Err(err) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "invalid",
                format!("could not read the request body: {err}"),
            );
        }
    };
    parts.extensions.insert(Authority::Admin(me.clone()));
    parts.extensions.insert(me);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

async fn whoami(Extension(me): Extension<AdminIdentity>) -> Answer {
    ok(Ok(json!({
        "credential_id": me.credential_id,
        "display_prefix": me.display_prefix,
        "label": me.label,
        "scope": me.team.clone().unwrap_or_else(|| "global".into()),
    })))
}

async fn list_teams(
    State(state): State<Arc<AppState>>,
    Extension(me): Extension<Authority>,
) -> Answer {
    ok(teams::list(&state.pool, &me).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewTeam {
    slug: String,
    name: String,
}

async fn create_team(
    State(state): State<Arc<AppState>>,
    Extension(me): Extension<Authority>,
    body: Bytes,
) -> Answer {
    let result = async {
        let global = me.global("create teams")?;
        let new: NewTeam = parse(&body)?;
        teams::create(&state.pool, &global, &new.slug, &new.name).await
    };
    created(result.await)
}

async fn list_agents(State(state): State<Arc<AppState>>, Team(team): Team) -> Answer {
    ok(agents::list(&state.pool, &team).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewAgent {
    name: String,
}

async fn add_agent(State(state): State<Arc<AppState>>, Team(team): Team, body: Bytes) -> Answer {
    let result = async {
        let new: NewAgent = parse(&body)?;
        agents::add(&state.pool, &team, &new.name).await
    };
    created(result.await)
}

async fn set_disabled(state: &AppState, team: &TeamScope, name: &str, disabled: bool) -> Answer {
    let result = agents::set_disabled(&state.pool, team, name, disabled).await;
    // This replica forgets at once; the others hear the commit's notification.
    state.events.credentials_changed();
    ok(result)
}

async fn disable_agent(
    State(state): State<Arc<AppState>>,
    Team(team): Team,
    Path((_, name)): Path<(String, String)>,
) -> Answer {
    set_disabled(&state, &team, &name, true).await
}

async fn enable_agent(
    State(state): State<Arc<AppState>>,
    Team(team): Team,
    Path((_, name)): Path<(String, String)>,
) -> Answer {
    set_disabled(&state, &team, &name, false).await
}

async fn list_people(State(state): State<Arc<AppState>>, Team(team): Team) -> Answer {
    ok(people::list(&state.pool, &team).await)
}

async fn add_person(State(state): State<Arc<AppState>>, Team(team): Team, body: Bytes) -> Answer {
    let result = async {
        let new: NewAgent = parse(&body)?;
        people::add(&state.pool, &team, &new.name).await
    };
    created(result.await)
}

async fn revoke_person(
    State(state): State<Arc<AppState>>,
    Team(team): Team,
    Path((_, name)): Path<(String, String)>,
) -> Answer {
    let result = people::revoke(&state.pool, &team, &name).await;
    // This replica forgets at once; the others hear the commit's notification.
    state.events.credentials_changed();
    ok(result)
}

async fn list_tokens(State(state): State<Arc<AppState>>, Team(team): Team) -> Answer {
    ok(tokens::list(&state.pool, &team).await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewToken {
    agent: String,
    label: Option<String>,
}

async fn issue_token(State(state): State<Arc<AppState>>, Team(team): Team, body: Bytes) -> Answer {
    let result = async {
        let new: NewToken = parse(&body)?;
        tokens::issue(&state.pool, &team, &new.agent, new.label.as_deref()).await
    };
    created(result.await)
}

async fn revoke_token(
    State(state): State<Arc<AppState>>,
    Team(team): Team,
    Path((_, id)): Path<(String, String)>,
) -> Answer {
    let result = async {
        let id = parse_id(&id, "token")?;
        tokens::revoke(&state.pool, id, &team).await
    };
    let result = result.await;
    state.events.credentials_changed();
    ok(result)
}

fn parse_id(raw: &str, what: &str) -> BusResult<Uuid> {
    raw.parse().map_err(|_| {
        BusError::not_found(format!(
            "no {what} with id {}: ids are UUIDs from the listing.",
            text::quote(raw)
        ))
    })
}

async fn list_credentials(
    State(state): State<Arc<AppState>>,
    Extension(me): Extension<Authority>,
) -> Answer {
    let result = async {
        let global = me.global("list admin credentials")?;
        admin::list(&state.pool, &global).await
    };
    ok(result.await)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewCredential {
    /// Confine the credential to this team; omit for a global credential.
    team: Option<String>,
    label: Option<String>,
}

async fn grant_credential(
    State(state): State<Arc<AppState>>,
    Extension(me): Extension<Authority>,
    body: Bytes,
) -> Answer {
    let result = async {
        let global = me.global("grant admin credentials")?;
        let new: NewCredential = parse(&body)?;
        admin::grant(
            &state.pool,
            &global,
            new.team.as_deref(),
            new.label.as_deref(),
        )
        .await
    };
    created(result.await)
}

async fn revoke_credential(
    State(state): State<Arc<AppState>>,
    Extension(me): Extension<Authority>,
    Path(id): Path<String>,
) -> Answer {
    let result = async {
        let global = me.global("revoke admin credentials")?;
        let id = parse_id(&id, "admin credential")?;
        admin::revoke(&state.pool, &global, id).await
    };
    ok(result.await)
}
