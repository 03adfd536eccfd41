//! Calls to the bus through the window's connection: reopened when a call
//! lost it, and when the bus refuses the window's credential (401/403), one
//! recovery: a session that died is registered again and the call repeated
//! (the bus did nothing), a token the bus no longer accepts is explained with
//! what to do. A call that got no answer may have been carried out: it is
//! repeated only when the tool takes a `request_id` (the bus answers a
//! repeat with the first call's answer), with the id the proxy gave it
//! before the first attempt ([`RETRIES`] times, with a growing pause); any
//! other call is not repeated.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::CallToolResult;
use rmcp::service::{ClientInitializeError, ServiceError};
use serde_json::{Map, Value};

use super::{Proxy, refusal, window};
use crate::client::{self, Connection};

impl Proxy {
    /// The window's connection, reopened when an earlier call lost it.
    pub(super) async fn connection(&self) -> Result<Arc<Connection>, String> {
        {
            let bound = self.bound.read().await;
            if let Some(connection) = &bound.connection {
                return Ok(connection.clone());
            }
        }
        let mut bound = self.bound.write().await;
        if let Some(connection) = &bound.connection {
            return Ok(connection.clone());
        }
        let Some(window) = bound.window.clone() else {
            let trouble = self.trouble.lock().await.clone();
            let why = trouble.unwrap_or_else(|| {
                format!(
                    "the bus at {} has not answered yet. {}",
                    bound.url,
                    what_to_check()
                )
            });
            return Err(format!(
                "not connected to the bus yet: {why} Nothing was done. Call session_status to \
                 see the state, and try again in a moment."
            ));
        };
        let connection = Arc::new(window::open(&bound.url, &window).await.map_err(|e| {
            if unreachable(&e) {
                format!(
                    "{} Nothing was done; try again in a moment.",
                    bus_down(&bound.url, &e)
                )
            } else {
                format!(
                    "the bus at {} could not be reached: {}. Nothing was done; try again in a \
                     moment.",
                    bound.url,
                    brief(&e)
                )
            }
        })?);
        bound.connection = Some(connection.clone());
        Ok(connection)
    }

    /// A bus tool's result as the bus gave it, or a refusal the model can act
    /// on when the call did not get through. A credential the bus refused
    /// (401) is recovered once and the call repeated: the bus did nothing. A
    /// call that got no answer is repeated when it carries a `request_id`
    /// (the proxy gives one to every tool that takes it), else told as
    /// perhaps carried out.
    pub(super) async fn forward(
        &self,
        tool: &str,
        arguments: Option<Map<String, Value>>,
    ) -> CallToolResult {
        let arguments = self.with_request_id(tool, arguments).await;
        let request_id = arguments
            .as_ref()
            .and_then(|a| a.get("request_id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut recovered = false;
        let mut unanswered = 0;
        loop {
            let connection = match self.connection().await {
                Ok(connection) => connection,
                Err(message) if unanswered == 0 => return refusal("unavailable", &message),
                // Not reconnected after a call that got no answer: its
                // outcome is still unknown.
                Err(message) => match &request_id {
                    Some(_) if unanswered <= RETRIES => {
                        unanswered += 1;
                        pause(unanswered).await;
                        continue;
                    }
                    Some(id) => return self.unknown_outcome(tool, id, unanswered, &message).await,
                    None => return refusal("unavailable", &message),
                },
            };
            let err = match connection.call_result(tool, arguments.clone()).await {
                Ok(result) => return result,
                Err(err) => err,
            };
            if credential_refused(&err) && !recovered {
                recovered = true;
                if let Err(message) = self.recover(&connection).await {
                    return refusal("unauthenticated", &message);
                }
                continue;
            }
            self.drop_connection(&connection).await;
            match &request_id {
                Some(_) if unanswered < RETRIES && !answered(&err) => {
                    unanswered += 1;
                    tracing::warn!(
                        tool,
                        error = %brief(&err),
                        unanswered,
                        "no answer; repeating with the same request_id"
                    );
                    pause(unanswered).await;
                }
                Some(id) if !answered(&err) => {
                    return self
                        .unknown_outcome(tool, id, unanswered + 1, &brief(&err))
                        .await;
                }
                _ if credential_refused(&err) => {
                    return refusal(
                        "unauthenticated",
                        "the bus refused this window's credential again right after it was \
                         renewed; nothing was done. Call session_status, and ask an operator \
                         to check the agent.",
                    );
                }
                _ => {
                    let url = self.bound.read().await.url.clone();
                    return refusal(
                        "unavailable",
                        &format!(
                            "{tool} did not get an answer from the bus at {url}: {}. It may \
                             or may not have been carried out: check (read or list) before \
                             repeating a change.",
                            brief(&err)
                        ),
                    );
                }
            }
        }
    }

    /// The refusal of a call with `request_id` that got no answer in
    /// `attempts` tries: the outcome is unknown, and repeating it is safe.
    async fn unknown_outcome(
        &self,
        tool: &str,
        request_id: &str,
        attempts: u32,
        why: &str,
    ) -> CallToolResult {
        let url = self.bound.read().await.url.clone();
        refusal(
            "unavailable",
            &format!(
                "{tool} did not get an answer from the bus at {url} in {attempts} attempts \
                 ({why}): whether it was carried out is unknown. Calling {tool} again with the \
                 same arguments and \"request_id\": \"{request_id}\" is safe: a call the bus \
                 carried out answers its first answer (with replayed: true) and changes nothing \
                 again; one it did not runs."
            ),
        )
    }

    /// `arguments` with a fresh `request_id` when `tool` takes one (its
    /// input schema, from the bus's tools/list, has the property) and the
    /// caller gave none: chosen before the first attempt, so every repeat
    /// carries the same.
    async fn with_request_id(
        &self,
        tool: &str,
        arguments: Option<Map<String, Value>>,
    ) -> Option<Map<String, Value>> {
        if arguments
            .as_ref()
            .is_some_and(|a| a.contains_key("request_id"))
        {
            return arguments;
        }
        let takes_one = self.tools.read().await.as_ref().is_some_and(|tools| {
            tools.iter().any(|t| {
                t.name == tool
                    && t.input_schema
                        .get("properties")
                        .and_then(Value::as_object)
                        .is_some_and(|p| p.contains_key("request_id"))
            })
        });
        if !takes_one {
            return arguments;
        }
        let mut arguments = arguments.unwrap_or_default();
        arguments.insert(
            "request_id".into(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
        Some(arguments)
    }

    /// [`Self::forward`] for the proxy's own use: the structured answer, or
    /// an error carrying the refusal's words.
    pub(super) async fn call_json(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
    ) -> anyhow::Result<Value> {
        let result = self.forward(tool, Some(arguments)).await;
        let value = result.structured_content.clone().unwrap_or(Value::Null);
        if result.is_error == Some(true) {
            let message = value["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("{value}"));
            anyhow::bail!(client::Refused {
                tool: tool.to_string(),
                kind: value["error"].as_str().unwrap_or_default().to_string(),
                message,
            });
        }
        Ok(value)
    }

    async fn drop_connection(&self, failed: &Arc<Connection>) {
        let mut bound = self.bound.write().await;
        if bound
            .connection
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, failed))
        {
            bound.connection = None;
        }
    }

    /// The bus refused the window's credential. If the agent token still
    /// works, the window's session died (expired, revoked): register again
    /// (never taking over a live one). If the token itself is refused, say
    /// so, and what to do.
    pub(super) async fn recover(&self, failed: &Arc<Connection>) -> Result<(), String> {
        let _one = self.recovering.lock().await;
        {
            let bound = self.bound.read().await;
            if let Some(current) = &bound.connection
                && !Arc::ptr_eq(current, failed)
            {
                // Another call recovered meanwhile.
                return Ok(());
            }
        }
        let (label, url, token, profile, team, agent) = {
            let bound = self.bound.read().await;
            (
                bound
                    .window
                    .as_ref()
                    .map_or_else(|| self.host().label, |w| w.label.clone()),
                bound.url.clone(),
                bound.token.clone().unwrap_or_default(),
                bound.profile.clone(),
                bound.team.clone().unwrap_or_else(|| "TEAM".into()),
                bound.agent.clone().unwrap_or_else(|| "AGENT".into()),
            )
        };
        if let Err(err) = client::whoami(&url, &token, None).await {
            let store = match &profile {
                Some(p) => format!(
                    "store it with `ai-crew-sync context profile add --name {p} --url {url} \
                     --team {team} --agent {agent}`, then call configure_session {{\"profile\": \
                     \"{p}\"}} (or restart this MCP server)"
                ),
                None => "put it in BUS_TOKEN (better: a profile, `ai-crew-sync context profile \
                         add`) and restart this MCP server"
                    .to_string(),
            };
            let message = format!(
                "the bus at {url} no longer accepts agent {agent}'s token, so this window cannot \
                 act; nothing was done. The token was probably revoked (or the agent disabled): \
                 ask an operator for a new one (`ai-crew-sync token issue --team {team} --agent \
                 {agent}`), {store}. The bus said: {err:#}"
            );
            *self.trouble.lock().await = Some(message.clone());
            return Err(message);
        }
        let window = window::register(
            &url,
            &token,
            &label,
            self.options.session_ttl_seconds,
            false,
        )
        .await
        .map_err(|e| format!("{e:#}"))?;
        let connection = Arc::new(
            window::open(&url, &window)
                .await
                .map_err(|e| format!("{e:#}"))?,
        );
        let mut bound = self.bound.write().await;
        // A switch to another window meanwhile: that one is current.
        if bound
            .connection
            .as_ref()
            .is_none_or(|current| Arc::ptr_eq(current, failed))
        {
            bound.window = Some(window);
            bound.connection = Some(connection);
            *self.trouble.lock().await = None;
        }
        Ok(())
    }
}

/// An error in a line a model reads: what failed and the root cause, without
/// the transport's layers in between.
pub(super) fn brief(err: &anyhow::Error) -> String {
    let root = root_of(err);
    let top = err.to_string();
    if top == root {
        top
    } else {
        format!("{top}: {root}")
    }
}

/// Nothing reached the bus: the connection was refused or timed out, or the
/// transport failed before an answer (as opposed to a refusal the bus gave).
pub(super) fn unreachable(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<ClientInitializeError>(),
            Some(
                ClientInitializeError::TransportError { .. }
                    | ClientInitializeError::ConnectionClosed(_)
            )
        ) || matches!(
            cause.downcast_ref::<ServiceError>(),
            Some(
                ServiceError::TransportSend(_)
                    | ServiceError::TransportClosed
                    | ServiceError::Timeout { .. }
            )
        ) || cause.downcast_ref::<BusSilent>().is_some()
    })
}

/// How many times a call that takes a `request_id` is repeated after it got
/// no answer.
pub(super) const RETRIES: u32 = 3;

/// The pause before the first repeat; doubled before each next one.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Wait before the `n`th repeat (1-based): [`RETRY_PAUSE`], doubled each time.
async fn pause(n: u32) {
    tokio::time::sleep(RETRY_PAUSE * 2u32.pow(n.saturating_sub(1))).await;
}

/// The bus answered the call with a JSON-RPC error: it got it, and refused.
fn answered(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<ServiceError>(),
            Some(ServiceError::McpError(_))
        )
    })
}

/// The bus took longer than the proxy waits for it.
#[derive(Debug, thiserror::Error)]
#[error("the bus did not answer within {0} s")]
pub(super) struct BusSilent(pub(super) u64);

/// A bus that did not answer, in words a model and a person can act on: which
/// URL, what to check, and that nothing was lost.
pub(super) fn bus_down(url: &str, err: &anyhow::Error) -> String {
    format!(
        "the bus at {url} did not answer ({}). {}",
        root_of(err),
        what_to_check()
    )
}

/// What to do about a bus that does not answer, and that nothing is lost.
fn what_to_check() -> &'static str {
    "Check that the server runs there (`ai-crew-sync serve`) and that this is its address: \
     `ai-crew-sync context show` names the URL and the profile it comes from (BUS_URL or --url \
     override it). Nothing is lost: messages and tasks stay on the bus, and this proxy keeps \
     trying."
}

/// The innermost cause, without the transport's type names.
fn root_of(err: &anyhow::Error) -> String {
    let root = err.root_cause().to_string();
    // rmcp prints its transport's type names before the cause.
    match root.rfind("] error: ") {
        Some(at) => root[at + "] error: ".len()..].to_string(),
        None => root,
    }
}

/// The bus answered 401 or 403 to a request on an open connection.
fn credential_refused(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<ServiceError>()
            .is_some_and(|e| e.auth_challenge().is_some())
    })
}
