//! Which server the local commands speak of, and whether it answers: the
//! address the last `serve` on this database recorded (migration 0043), an
//! MCP URL's base, and `GET /health` there. `quickstart` puts the recorded
//! address in the profile it writes; `doctor` checks the servers a profile
//! or the record names.

use std::time::Duration;

use sqlx::PgPool;

use acs_store::store::operations::listeners;

/// How long a server may take to answer `GET /health` before it is taken as
/// not answering.
const HEALTH_WITHIN: Duration = Duration::from_secs(5);

/// The MCP endpoint the most recently started `serve` on this database
/// recorded (`http://127.0.0.1:18787/mcp`), if one ever started.
pub(crate) async fn recorded_mcp_url(pool: &PgPool) -> anyhow::Result<Option<String>> {
    Ok(listeners::latest(pool)
        .await?
        .map(|l| format!("{}/mcp", l.url.trim_end_matches('/'))))
}

/// `http://host:port` of an MCP URL (`…/mcp` dropped).
pub(crate) fn base_of(mcp_url: &str) -> String {
    let trimmed = mcp_url.trim_end_matches('/');
    trimmed.strip_suffix("/mcp").unwrap_or(trimmed).to_string()
}

/// `GET /health` at the server of `mcp_url`: `Ok` when it answers as a bus
/// (any status with a JSON body: a degraded server still answers), else
/// why not, in words.
pub(crate) async fn answers(mcp_url: &str) -> Result<(), String> {
    let url = format!("{}/health", base_of(mcp_url));
    let client = reqwest::Client::builder()
        .timeout(HEALTH_WITHIN)
        .build()
        .map_err(|e| e.to_string())?;
    let response = client.get(&url).send().await.map_err(|e| {
        if e.is_timeout() {
            format!(
                "GET {url} got no answer within {} s",
                HEALTH_WITHIN.as_secs()
            )
        } else if e.is_connect() {
            format!("nothing answers at {url} (connection refused or unreachable)")
        } else {
            format!("GET {url} failed: {e}")
        }
    })?;
    let status = response.status();
    match response.json::<serde_json::Value>().await {
        Ok(body) if body.get("database").is_some() => Ok(()),
        _ => Err(format!(
            "GET {url} answered {status}, but not as an ai-crew-sync server (another program \
             listens there?)"
        )),
    }
}
