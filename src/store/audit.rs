//! The audit log: one row per issue, grant, revocation, enable/disable and
//! capability change, written inside the transaction that made the change, so
//! a change without its row (or a row without its change) cannot exist.
//! Never a secret: callers pass a display prefix at most.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::Actor;
use crate::error::BusResult;

pub async fn record(
    conn: &mut PgConnection,
    team_id: Option<Uuid>,
    actor: &Actor,
    action: &str,
    subject: &str,
    detail: Value,
) -> BusResult<()> {
    sqlx::query(
        "INSERT INTO audit_log (team_id, actor, source, action, subject, detail)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(team_id)
    .bind(&actor.name)
    .bind(actor.source.as_str())
    .bind(action)
    .bind(subject)
    .bind(detail)
    .execute(conn)
    .await?;
    Ok(())
}
