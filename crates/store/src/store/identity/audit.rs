//! The audit log: one row per issue, grant, revocation, enable/disable and
//! capability change, written inside the transaction that made the change, so
//! a change without its row (or a row without its change) cannot exist.
//! Never a secret: callers pass a display prefix at most.
//!
//! Every change made over `/admin` is recorded here, so this is also where the
//! admin credential's write fence is taken: `admin_write_refusal` (migration
//! 0016) takes the credential's advisory lock shared (a revocation takes it
//! exclusively) and re-reads it in a fresh snapshot. A change made with a
//! credential whose revocation committed first is refused and rolled back.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use chrono::{DateTime, Utc};

use crate::error::{BusError, BusResult};
use crate::store::Actor;

pub async fn record(
    conn: &mut PgConnection,
    team_id: Option<Uuid>,
    actor: &Actor,
    action: &str,
    subject: &str,
    detail: Value,
) -> BusResult<()> {
    fence(conn, actor, "nothing was changed").await?;
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

/// The admin write fence alone, for a change made in several transactions
/// (a prune's batches) whose audit row is written once: each transaction
/// takes it first, so a revocation that commits stops the next one. Nothing
/// for the local operator or an agent (their own fences guard their writes).
/// `stopped` says what a refusal leaves behind.
pub async fn fence(conn: &mut PgConnection, actor: &Actor, stopped: &str) -> BusResult<()> {
    if let Some(credential) = actor.admin_credential {
        let (refusal, since): (Option<String>, Option<DateTime<Utc>>) =
            sqlx::query_as("SELECT refusal, refused_since FROM admin_write_refusal($1)")
                .bind(credential)
                .fetch_one(&mut *conn)
                .await?;
        if refusal.is_some() {
            let when = since
                .map(|at| format!(" at {}", at.to_rfc3339()))
                .unwrap_or_default();
            return Err(BusError::unauthenticated(format!(
                "this admin credential was revoked{when}; {stopped}. Ask a global admin for a new \
                 one."
            )));
        }
    }
    Ok(())
}
