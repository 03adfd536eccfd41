//! Where `serve` listens (migration 0043): recorded in the database it
//! serves, so a local command on the same database (`quickstart`, `doctor`)
//! finds the running server's URL instead of assuming the default address.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::error::BusResult;

/// One address a server announced.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Listener {
    /// The base URL a client on the server's machine uses (`http://127.0.0.1:8787`).
    pub url: String,
    pub host_name: String,
    pub pid: i32,
    pub started_at: DateTime<Utc>,
}

/// Record that a server listens at `url` now (a restart at the same address
/// updates its row).
pub async fn record(pool: &PgPool, url: &str, host_name: &str, pid: u32) -> BusResult<()> {
    sqlx::query(
        "INSERT INTO server_listeners (url, host_name, pid, started_at)
         VALUES ($1, $2, $3, now())
         ON CONFLICT (url) DO UPDATE
            SET host_name = EXCLUDED.host_name, pid = EXCLUDED.pid, started_at = now()",
    )
    .bind(url)
    .bind(host_name)
    .bind(i32::try_from(pid).unwrap_or(i32::MAX))
    .execute(pool)
    .await?;
    Ok(())
}

/// The most recently started server's address, if any server ever started
/// on this database.
pub async fn latest(pool: &PgPool) -> BusResult<Option<Listener>> {
    Ok(sqlx::query_as(
        "SELECT url, host_name, pid, started_at FROM server_listeners
         ORDER BY started_at DESC, url LIMIT 1",
    )
    .fetch_optional(pool)
    .await?)
}
