//! Speaking to a bus server as an agent: a real MCP client (rmcp, Streamable
//! HTTP). Used by the admin CLI to verify a freshly issued token, and the base
//! of the console client.

use std::collections::HashMap;

use anyhow::{Context as _, anyhow};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;

/// Call `tool` at `mcp_url` with `bearer` (and an optional window label);
/// the structured answer, or an error carrying a refusal's message.
pub async fn call_tool(
    mcp_url: &str,
    bearer: &str,
    session: Option<&str>,
    tool: &str,
    arguments: serde_json::Map<String, Value>,
) -> anyhow::Result<Value> {
    let mut headers = HashMap::new();
    if let Some(session) = session {
        headers.insert(
            http::HeaderName::from_static("x-crew-session"),
            session.parse()?,
        );
    }
    let config = StreamableHttpClientTransportConfig::with_uri(mcp_url)
        .auth_header(bearer)
        .custom_headers(headers);
    let client = ()
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .with_context(|| format!("could not open an MCP connection to {mcp_url}"))?;
    let result = client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(arguments))
        .await
        .with_context(|| format!("calling {tool}"));
    let _ = client.cancel().await;
    let result = result?;
    let value = result
        .structured_content
        .ok_or_else(|| anyhow!("{tool} answered without structured content"))?;
    if result.is_error == Some(true) {
        return Err(anyhow!(
            "{tool} was refused: {}",
            value["message"].as_str().unwrap_or_default()
        ));
    }
    Ok(value)
}

/// `whoami` as the holder of `bearer`.
pub async fn whoami(mcp_url: &str, bearer: &str, session: Option<&str>) -> anyhow::Result<Value> {
    call_tool(mcp_url, bearer, session, "whoami", serde_json::Map::new()).await
}
