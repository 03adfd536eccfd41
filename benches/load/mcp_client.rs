//! A kept-alive MCP client for the benchmark: JSON-RPC over Streamable HTTP
//! the way the official SDKs speak it, on one `reqwest::Client` per worker
//! (HTTP/1.1, keep-alive), so a tool call costs one request on a connection
//! already open.
//!
//! rmcp's client (the library's `Connection`) keeps no idle connection and
//! opens one per call, which roughly halves every MCP figure; the
//! `whoami_rmcp` scenario keeps one line through it for reference.
//!
//! A session: `initialize` (the `Mcp-Session-Id` the server answers with, if
//! any, is sent on every later request, as is the negotiated
//! `MCP-Protocol-Version`), `notifications/initialized`, then `tools/call`s.
//! Every request sends `Accept: application/json, text/event-stream`; an
//! answer is read either as one JSON body or as an SSE stream whose `data:`
//! lines carry JSON-RPC messages (the one with the request's id is the
//! answer). A JSON-RPC error, an HTTP error, or a tool result with
//! `isError: true` becomes an error: a benchmark counting refusals as work
//! measures nothing.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, Result, anyhow, bail};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};

/// The revision offered at `initialize`; the server's answer decides.
const PROTOCOL_VERSION: &str = "2025-06-18";
const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_HEADER: &str = "mcp-protocol-version";

/// One MCP session of one window on its own kept-alive HTTP/1.1 connection.
pub struct McpClient {
    http: reqwest::Client,
    url: String,
    /// Authorization, X-Crew-Session, and after `initialize` the session id
    /// and protocol version: sent on every request.
    headers: HeaderMap,
    next_id: AtomicU64,
}

impl McpClient {
    /// Open a session at `url` with `bearer` as window `window` (None: the
    /// agent's shared window): `initialize`, then `notifications/initialized`.
    pub async fn open(url: &str, bearer: &str, window: Option<&str>) -> Result<McpClient> {
        McpClient::open_on(http_client(4)?, url, bearer, window).await
    }

    /// [`McpClient::open`] on an HTTP client shared with other sessions (its
    /// pool keeps up to the idle connections it was built with): many
    /// simulated agents without a client each.
    pub async fn open_on(
        http: reqwest::Client,
        url: &str,
        bearer: &str,
        window: Option<&str>,
    ) -> Result<McpClient> {
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {bearer}")).context("the bearer token")?,
        );
        if let Some(window) = window {
            headers.insert(
                "x-crew-session",
                HeaderValue::from_str(window)
                    .with_context(|| format!("window label {window:?} as X-Crew-Session"))?,
            );
        }
        let mut client = McpClient {
            http,
            url: url.to_string(),
            headers,
            next_id: AtomicU64::new(1),
        };
        let (answer, session) = client
            .request(
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "ai-crew-sync-bench", "version": "0"},
                }),
            )
            .await
            .with_context(|| format!("initializing an MCP session at {url}"))?;
        if let Some(session) = session {
            client.headers.insert(SESSION_HEADER, session);
        }
        let version = answer["protocolVersion"]
            .as_str()
            .unwrap_or(PROTOCOL_VERSION);
        client.headers.insert(
            PROTOCOL_HEADER,
            HeaderValue::from_str(version).context("the negotiated protocol version")?,
        );
        client.notify("notifications/initialized").await?;
        Ok(client)
    }

    /// The same session on another HTTP client (a second pool): what an
    /// agent does when it keeps its blocked wait on a connection of its own.
    pub fn on(&self, http: reqwest::Client) -> McpClient {
        McpClient {
            http,
            url: self.url.clone(),
            headers: self.headers.clone(),
            next_id: AtomicU64::new(1_000_000_000),
        }
    }

    /// Call `tool` with a JSON object of arguments: its structured answer
    /// (or its text, for a tool that sends none); an error for a refusal.
    pub async fn call(&self, tool: &str, arguments: Value) -> Result<Value> {
        if !arguments.is_object() {
            bail!("the arguments of {tool} are not a JSON object: {arguments}");
        }
        let (result, _) = self
            .request("tools/call", json!({"name": tool, "arguments": arguments}))
            .await
            .with_context(|| format!("calling {tool}"))?;
        let value = match result.get("structuredContent") {
            Some(value) if !value.is_null() => value.clone(),
            _ => Value::String(
                result["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
        };
        if result["isError"] == true {
            let message = value["message"].as_str().map(str::to_string);
            bail!(
                "{tool} was refused: {}",
                message.unwrap_or_else(|| value.to_string())
            );
        }
        Ok(value)
    }

    /// End the session: a DELETE when the server gave a session id (a
    /// stateless server gives none, and there is nothing to end).
    pub async fn close(self) {
        if self.headers.contains_key(SESSION_HEADER) {
            let _ = self
                .http
                .delete(&self.url)
                .headers(self.headers.clone())
                .send()
                .await;
        }
    }

    /// A notification: no id, the server answers 202 with no body.
    async fn notify(&self, method: &str) -> Result<()> {
        let response = self
            .post(&json!({"jsonrpc": "2.0", "method": method}))
            .await?;
        let status = response.status();
        // Read the (empty) body so the connection goes back to the pool.
        let body = response.bytes().await.unwrap_or_default();
        if !status.is_success() {
            bail!(
                "{method} answered HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        Ok(())
    }

    /// A request: its JSON-RPC `result`, and the session id header if the
    /// server sent one.
    async fn request(&self, method: &str, params: Value) -> Result<(Value, Option<HeaderValue>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut response = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        let status = response.status();
        let session = response.headers().get(SESSION_HEADER).cloned();
        let sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("{method} answered HTTP {status}: {body}");
        }
        let message = if sse {
            // Read events as they come until the one answering this id; the
            // rest of the stream is then drained so the connection is reusable.
            let mut buffer = String::new();
            let mut found = None;
            while let Some(chunk) = response.chunk().await.context("reading the SSE stream")? {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find("\n\n") {
                    let event: String = buffer.drain(..end + 2).collect();
                    if found.is_none() {
                        found = answer_in_event(&event, id)?;
                    }
                }
            }
            if found.is_none() && !buffer.trim().is_empty() {
                found = answer_in_event(&buffer, id)?;
            }
            found.with_context(|| format!("the SSE stream of {method} ended without an answer"))?
        } else {
            let body = response.bytes().await.context("reading the answer")?;
            serde_json::from_slice(&body).with_context(|| {
                format!(
                    "the answer to {method} is not JSON: {}",
                    String::from_utf8_lossy(&body)
                )
            })?
        };
        if let Some(error) = message.get("error") {
            bail!("{method} failed: {error}");
        }
        let result = message
            .get("result")
            .cloned()
            .ok_or_else(|| anyhow!("the answer to {method} has no result: {message}"))?;
        Ok((result, session))
    }

    async fn post(&self, body: &Value) -> Result<reqwest::Response> {
        self.http
            .post(&self.url)
            .headers(self.headers.clone())
            .header(ACCEPT, "application/json, text/event-stream")
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .with_context(|| format!("POST {}", self.url))
    }
}

/// A kept-alive HTTP/1.1 client keeping up to `idle` idle connections to
/// the server; every request stays on 127.0.0.1, whatever the environment says.
pub fn http_client(idle: usize) -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(idle)
        .build()
        .context("building the benchmark's HTTP client")
}

/// The JSON-RPC response with `id` in one SSE event (its `data:` lines
/// joined), if that is what the event carries.
fn answer_in_event(event: &str, id: u64) -> Result<Option<Value>> {
    let data: Vec<&str> = event
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return Ok(None);
    }
    let message: Value = serde_json::from_str(&data.join("\n"))
        .with_context(|| format!("an SSE event is not JSON: {event}"))?;
    Ok((message["id"] == id).then_some(message))
}
