//! `/admin/teams/{team}/usage` and `/admin/teams/{team}/prune`: what a team
//! stores and trimming it, over the remote API. Thin: one call into
//! `store::operations::usage` or `store::operations::retention`, the same functions `team usage` and
//! `team prune` call.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use serde::Deserialize;

use super::{Answer, Team, ok, parse};
use crate::http::AppState;
use acs_store::store::operations::retention::{self, PruneRequest};
use acs_store::store::operations::usage;

pub(super) async fn usage(State(state): State<Arc<AppState>>, Team(team): Team) -> Answer {
    ok(usage::usage(&state.pool, &team).await)
}

/// The body of a prune: `apply` false (the default) is the dry run.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Prune {
    older_than_days: i64,
    audit_older_than_days: Option<i64>,
    #[serde(default)]
    apply: bool,
}

pub(super) async fn prune(
    State(state): State<Arc<AppState>>,
    Team(team): Team,
    body: Bytes,
) -> Answer {
    let result = async {
        let asked: Prune = parse(&body)?;
        let request = PruneRequest {
            older_than_days: asked.older_than_days,
            audit_older_than_days: asked.audit_older_than_days,
            apply: asked.apply,
        };
        retention::prune(&state.pool, &state.backends, &team, &request, &|_| {}).await
    };
    ok(result.await)
}
