//! One window's tool calls over plain HTTP, so a failure keeps its HTTP
//! status (the checker allows a 503 only while PostgreSQL is down, and no
//! other 5xx at all). The server is stateless Streamable HTTP with JSON
//! answers: every `tools/call` is one POST to any replica, no handshake.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use serde_json::{Value, json};

use crate::history::Outcome;

/// Longer than any tool takes on a healthy replica, shorter than a paused
/// one stays paused: the call then ends `Failed` and the client moves on.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// One window (token + `X-Crew-Session`) speaking to every replica.
pub struct Window {
    http: reqwest::Client,
    replicas: Vec<String>,
    headers: HeaderMap,
    next_id: AtomicU64,
}

impl Window {
    pub fn new(replicas: &[String], token: &str, label: &str) -> anyhow::Result<Window> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .timeout(CALL_TIMEOUT)
            .build()
            .context("building a chaos client's HTTP client")?;
        let mut headers = HeaderMap::new();
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).context("the token")?,
        );
        headers.insert(
            "x-crew-session",
            HeaderValue::from_str(label).context("the window label")?,
        );
        headers.insert(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-06-18"),
        );
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Ok(Window {
            http,
            replicas: replicas.to_vec(),
            headers,
            next_id: AtomicU64::new(1),
        })
    }

    /// Call `tool` on replica `replica`: the structured answer, the refusal,
    /// or the failure (with the HTTP status when there was one).
    pub async fn call(&self, replica: usize, tool: &str, arguments: Value) -> Outcome {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        });
        let failed = |status: Option<u16>, message: String| Outcome::Failed { status, message };
        let response = match self
            .http
            .post(&self.replicas[replica])
            .headers(self.headers.clone())
            .body(request.to_string())
            .send()
            .await
        {
            Ok(response) => response,
            Err(e) => return failed(None, format!("{e:#}")),
        };
        let status = response.status();
        let body = match response.bytes().await {
            Ok(body) => body,
            Err(e) => return failed(Some(status.as_u16()), format!("reading the answer: {e}")),
        };
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            return failed(Some(status.as_u16()), text.chars().take(300).collect());
        }
        let message = match parse_answer(&body, id) {
            Some(message) => message,
            None => {
                let text = String::from_utf8_lossy(&body);
                return failed(
                    Some(status.as_u16()),
                    format!(
                        "no JSON-RPC answer: {}",
                        text.chars().take(300).collect::<String>()
                    ),
                );
            }
        };
        if let Some(error) = message.get("error") {
            return failed(Some(status.as_u16()), format!("JSON-RPC error: {error}"));
        }
        let result = &message["result"];
        // Every bus tool answers structured JSON; its text stands in for
        // anything else.
        let value = result
            .get("structuredContent")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or_else(|| {
                let texts = result["content"].as_array().into_iter().flatten();
                Value::String(texts.filter_map(|c| c["text"].as_str()).collect())
            });
        if result["isError"] == true {
            return Outcome::Refused {
                kind: value["error"].as_str().unwrap_or_default().to_string(),
                message: match &value {
                    Value::String(text) => text.clone(),
                    other => other["message"].as_str().unwrap_or_default().to_string(),
                },
            };
        }
        Outcome::Ok { result: value }
    }
}

/// The JSON-RPC answer with `id`: a JSON body, or an SSE stream's event.
fn parse_answer(body: &[u8], id: u64) -> Option<Value> {
    if let Ok(message) = serde_json::from_slice::<Value>(body) {
        return Some(message);
    }
    let text = String::from_utf8_lossy(body);
    text.split("\n\n").find_map(|event| {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim_start)
            .collect();
        let message: Value = serde_json::from_str(&data.join("\n")).ok()?;
        (message["id"] == id).then_some(message)
    })
}
