//! `GET /health`: 200 while the database answers, with a JSON body saying so,
//! and the event listener's state (`live`, `silent`, `detached`).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::json;

use super::AppState;

pub async fn health(State(state): State<Arc<AppState>>) -> (StatusCode, Json<serde_json::Value>) {
    let probe = crate::db::ping(&state.pool);
    let database = match tokio::time::timeout(Duration::from_secs(3), probe).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(format!("error: {err}")),
        Err(_) => Err("no answer within 3 s".to_string()),
    };
    let version = env!("CARGO_PKG_VERSION");
    let events = state.events.state();
    match database {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({ "status": "ok", "database": "ok", "events": events, "version": version })),
        ),
        Err(detail) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                json!({ "status": "unavailable", "database": detail, "events": events, "version": version }),
            ),
        ),
    }
}
