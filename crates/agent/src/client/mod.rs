//! Speaking to a bus server as an agent: a real MCP client (rmcp, Streamable
//! HTTP). Used by the admin CLI to verify a freshly issued token, by the
//! console client (`ai-crew-sync client …`), and by the integration tests
//! (their `McpClient` wraps a [`Connection`]).
//!
//! A [`Connection`] is one MCP session as one window (token + optional
//! `X-Crew-Session`); several tool calls share it. A tool's refusal
//! (`isError`) comes back as [`Refused`], carrying the server's explanation,
//! so callers tell "the bus said no" from "the bus could not be reached".
//!
//! What a client keeps on its own machine sits beside it: [`local_files`]
//! (private files in the config directory), [`profiles`] (which bus, team
//! and agent, with the token), [`project`] (`.acs.toml`), [`context`]
//! (which of them applies here, and why), [`spool`] (a window's inbox
//! references, kept durably before their delivery is confirmed),
//! [`window_state`] (the window a proxy holds per host conversation),
//! [`hook`] (what a host's hook hears, speaking as that window) and
//! [`guard`] (the git pre-commit hook refusing a commit that touches paths
//! another window reserved).

pub mod context;
pub mod guard;
pub mod hook;
pub mod local_files;
pub mod profiles;
pub mod project;
pub mod spool;
mod stop_hook;
pub mod window_state;

use std::collections::HashMap;

use anyhow::Context as _;
use rmcp::model::{CallToolRequestParams, CallToolResult, Implementation};
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, StreamableHttpClientTransportConfig,
};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};

/// A tool answered with `isError`: the server's `{error, message}`.
#[derive(Debug, thiserror::Error)]
#[error("{tool} was refused: {message}")]
pub struct Refused {
    pub tool: String,
    /// not_found, invalid, conflict, unauthenticated, forbidden (empty when absent).
    pub kind: String,
    pub message: String,
}

/// The server answered 401 to the credential: it does not know it (or no
/// longer: revoked). Often the token is of another installation (another
/// server, or a database other than this server's), so the message names the
/// server asked and how to ask another.
#[derive(Debug, thiserror::Error)]
#[error(
    "{url} refused the credential (401): that server does not know it as a live agent token \
     (acs_…) or session credential (acss_…). It may be revoked, or belong to another \
     installation (another server, or a data directory or DATABASE_URL other than this \
     server's). The credential came from BUS_TOKEN or the profile in use; to ask another server, give --url URL (BUS_URL) or --profile NAME \
     (`ai-crew-sync context show` says which applies here); for a new token of this one, an \
     operator runs `ai-crew-sync quickstart --new-token` or `token issue` beside its database."
)]
pub struct Unauthenticated {
    /// The MCP endpoint asked.
    pub url: String,
}

/// One MCP session to a bus server.
pub struct Connection {
    url: String,
    service: RunningService<RoleClient, ()>,
}

impl Connection {
    /// Connect to `mcp_url` with `bearer` (agent token or session
    /// credential) as window `session` (None: the agent's shared window).
    pub async fn open(
        mcp_url: &str,
        bearer: &str,
        session: Option<&str>,
    ) -> anyhow::Result<Connection> {
        let mut headers = HashMap::new();
        if let Some(session) = session {
            headers.insert(
                http::HeaderName::from_static("x-crew-session"),
                session.parse().with_context(|| {
                    format!("window label {session:?} cannot be sent as X-Crew-Session")
                })?,
            );
        }
        Self::open_with(mcp_url, bearer, headers).await
    }

    /// Connect with `bearer` and extra headers given as `(name, value)`
    /// (`x-crew-session`, `x-crew-epoch`, or anything a test sends).
    pub async fn open_with_headers(
        mcp_url: &str,
        bearer: &str,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<Connection> {
        let mut headers = HashMap::new();
        for (name, value) in extra {
            headers.insert(
                http::HeaderName::from_bytes(name.as_bytes())
                    .with_context(|| format!("{name:?} is not a header name"))?,
                value
                    .parse()
                    .with_context(|| format!("{value:?} cannot be sent as {name}"))?,
            );
        }
        Self::open_with(mcp_url, bearer, headers).await
    }

    /// Connect as a window: its session credential, label and epoch on
    /// every request (the epoch fences a connection the window has moved
    /// past).
    pub async fn open_as_window(
        mcp_url: &str,
        credential: &str,
        label: &str,
        epoch: i64,
    ) -> anyhow::Result<Connection> {
        let epoch = epoch.to_string();
        Self::open_with_headers(
            mcp_url,
            credential,
            &[("x-crew-session", label), ("x-crew-epoch", &epoch)],
        )
        .await
    }

    async fn open_with(
        mcp_url: &str,
        bearer: &str,
        headers: HashMap<http::HeaderName, http::HeaderValue>,
    ) -> anyhow::Result<Connection> {
        let config = StreamableHttpClientTransportConfig::with_uri(mcp_url)
            .auth_header(bearer)
            .custom_headers(headers);
        let service = match ().serve(StreamableHttpClientTransport::from_config(config)).await {
            Ok(service) => service,
            Err(err) if is_unauthorized(&err) => {
                return Err(Unauthenticated {
                    url: mcp_url.to_string(),
                }
                .into());
            }
            Err(err) => {
                return Err(err)
                    .with_context(|| format!("could not open an MCP connection to {mcp_url}"));
            }
        };
        Ok(Connection {
            url: mcp_url.to_string(),
            service,
        })
    }

    /// Who answered the handshake (`serverInfo`), when it said.
    pub fn server_info(&self) -> Option<Implementation> {
        self.service
            .peer_info()
            .and_then(|info| info.server_info.clone())
    }

    /// The names of every tool the server lists (all pages).
    pub async fn tool_names(&self) -> anyhow::Result<Vec<String>> {
        Ok(self
            .tools()
            .await?
            .into_iter()
            .map(|t| t.name.to_string())
            .collect())
    }

    /// Every tool the server lists (all pages), schemas included: what the
    /// stdio proxy offers its host.
    pub async fn tools(&self) -> anyhow::Result<Vec<rmcp::model::Tool>> {
        self.service
            .list_all_tools()
            .await
            .with_context(|| format!("listing tools at {}", self.url))
    }

    /// Call `tool` (`None`: with no arguments at all) and return its result
    /// as the server sent it, refusal (`isError`) included; an error only
    /// when the call did not get through.
    pub async fn call_result(
        &self,
        tool: &str,
        arguments: Option<Map<String, Value>>,
    ) -> anyhow::Result<CallToolResult> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Some(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        self.service
            .call_tool(params)
            .await
            .with_context(|| format!("calling {tool} at {}", self.url))
    }

    /// Call `tool`: its structured answer, [`Refused`] when the tool said no,
    /// another error when the call did not get through.
    pub async fn call(&self, tool: &str, arguments: Map<String, Value>) -> anyhow::Result<Value> {
        let result = self.call_result(tool, Some(arguments)).await?;
        // Every bus tool answers structured JSON; text is the fallback for
        // anything else speaking MCP at that URL.
        let value = match result.structured_content {
            Some(value) => value,
            None => Value::String(
                result
                    .content
                    .iter()
                    .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
        };
        if result.is_error == Some(true) {
            let message = match &value {
                Value::String(text) => text.clone(),
                other => other["message"].as_str().unwrap_or_default().to_string(),
            };
            return Err(Refused {
                tool: tool.to_string(),
                kind: value["error"].as_str().unwrap_or_default().to_string(),
                message,
            }
            .into());
        }
        Ok(value)
    }

    /// End the session (dropping it also does, without waiting).
    pub async fn close(self) {
        let _ = self.service.cancel().await;
    }
}

/// The server answered 401. rmcp keeps that as a typed error inside its
/// transport error, which the initialize error does not expose as a source.
fn is_unauthorized(err: &ClientInitializeError) -> bool {
    let ClientInitializeError::TransportError { error, .. } = err else {
        return false;
    };
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error.error.as_ref());
    while let Some(err) = next {
        if err.is::<AuthRequiredError>() {
            return true;
        }
        next = err.source();
    }
    false
}

/// Call `tool` at `mcp_url` with `bearer` (and an optional window label) on
/// a connection of its own; the structured answer, or an error carrying a
/// refusal's message.
pub async fn call_tool(
    mcp_url: &str,
    bearer: &str,
    session: Option<&str>,
    tool: &str,
    arguments: Map<String, Value>,
) -> anyhow::Result<Value> {
    let connection = Connection::open(mcp_url, bearer, session).await?;
    let result = connection.call(tool, arguments).await;
    connection.close().await;
    result
}

/// `whoami` as the holder of `bearer`.
pub async fn whoami(mcp_url: &str, bearer: &str, session: Option<&str>) -> anyhow::Result<Value> {
    call_tool(mcp_url, bearer, session, "whoami", Map::new()).await
}

/// The heartbeat of a window whose host conversation ended (the proxy at
/// exit, the `session_end` hook): idle, and offline at once instead of when
/// its presence ttl runs out.
pub fn leaving() -> Map<String, Value> {
    object(serde_json::json!({"status": "idle", "offline": true}))
}

/// A JSON object literal as tool arguments.
pub fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}
