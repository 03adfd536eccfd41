//! `/admin/teams/{team}/webhooks`: list and add a team's webhooks,
//! `POST …/webhooks/{id}/pause` and `…/resume`, and `DELETE …/webhooks/{id}`
//! to remove one. Thin like the rest of `/admin`: the team check is
//! [`Authority::team`], the work and the audit row are in `store::operations::webhooks`,
//! exactly as `webhook add|list|pause|resume|remove` runs them.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{delete, get, post};
use axum::{Extension, Router};
use serde::Deserialize;

use super::{Answer, Team, created, ok, parse, parse_id};
use crate::http::AppState;
use acs_store::store::identity::admin::{Authority, TeamScope};
use acs_store::store::operations::webhooks::{self, NewWebhook, PrivateTargets, WebhookKind};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/teams/{team}/webhooks", get(list).post(add))
        .route("/teams/{team}/webhooks/{id}", delete(remove))
        .route("/teams/{team}/webhooks/{id}/pause", post(pause))
        .route("/teams/{team}/webhooks/{id}/resume", post(resume))
}

/// The body of `POST /admin/teams/{team}/webhooks`; `events` and `channels`
/// omitted mean all.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewHook {
    url: String,
    kind: Option<String>,
    #[serde(default)]
    events: Vec<String>,
    #[serde(default)]
    channels: Vec<String>,
    #[serde(default)]
    allow_private: bool,
}

async fn list(State(state): State<Arc<AppState>>, Team(team): Team) -> Answer {
    ok(webhooks::list(&state.pool, &team).await)
}

async fn add(
    State(state): State<Arc<AppState>>,
    Extension(me): Extension<Authority>,
    Team(team): Team,
    body: Bytes,
) -> Answer {
    let result = async {
        let new: NewHook = parse(&body)?;
        let kind = match new.kind.as_deref() {
            Some(kind) => WebhookKind::parse(kind)?,
            None => WebhookKind::Generic,
        };
        let new = NewWebhook {
            url: new.url,
            kind,
            events: new.events,
            channels: new.channels,
            allow_private: new
                .allow_private
                .then(|| PrivateTargets::grant(&me))
                .transpose()?,
        };
        webhooks::add(&state.pool, &team, new).await
    };
    created(result.await)
}

async fn remove(
    State(state): State<Arc<AppState>>,
    Team(team): Team,
    Path((_, id)): Path<(String, String)>,
) -> Answer {
    let result = async {
        let id = parse_id(&id, "webhook")?;
        webhooks::remove(&state.pool, id, &team).await
    };
    ok(result.await)
}

async fn pause(
    State(state): State<Arc<AppState>>,
    Team(team): Team,
    Path((_, id)): Path<(String, String)>,
) -> Answer {
    set_paused(&state, &team, &id, true).await
}

async fn resume(
    State(state): State<Arc<AppState>>,
    Team(team): Team,
    Path((_, id)): Path<(String, String)>,
) -> Answer {
    set_paused(&state, &team, &id, false).await
}

async fn set_paused(state: &AppState, team: &TeamScope, id: &str, paused: bool) -> Answer {
    let result = async {
        let id = parse_id(id, "webhook")?;
        webhooks::set_paused(&state.pool, id, team, paused).await
    };
    ok(result.await)
}
