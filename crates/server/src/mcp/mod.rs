//! The MCP surface: one [`BusServer`] answering every tool, served statelessly
//! over Streamable HTTP (any replica answers any call).
//!
//! Tools are thin: read the caller's [`Identity`] (put on the request by the
//! HTTP layer before any tool runs), parse arguments, call one store function,
//! shape the answer. A refusal is a tool result with `isError: true` and a
//! structured `{error, message}` body, so the model reads the explanation
//! instead of a bare protocol error.

mod answers;
mod arguments;
mod conversation_messages;
mod conversations;
mod locks;
mod messages;
mod notes;
mod overview;
mod presence;
mod projects;
mod reservations;
mod sessions;
mod tasks;
mod waits;

pub use waits::{PARKED_TOOL, Parked, park};

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorCode, Implementation,
    ListToolsResult, PaginatedRequestParams, ResultType, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool_handler};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

use acs_store::Bus;
use acs_store::auth::Identity;
use acs_store::error::{BusError, BusResult};
use acs_store::store::requests;

pub const SERVER_NAME: &str = "ai-crew-sync";

const INSTRUCTIONS: &str = "ai-crew-sync is the coordination bus your team's agents share. \
Your identity comes from your token; your window from the X-Crew-Session header. \
Call `whoami` to see who and where you are. \
Text: names, keys, titles, topics, labels and tags are one line: leading and trailing whitespace \
is removed, the text is Unicode NFC-normalised, and control characters (line breaks, tabs), \
U+2028/U+2029 and bidirectional formatting characters are refused. Bodies, questions, \
descriptions, results and note values are kept exactly as given.";

/// Everything a tool call may need; built once per process and shared.
pub struct Shared {
    pub bus: Bus,
    tools: ToolRouter<BusServer>,
}

/// The MCP handler. Cheap to clone: the service factory makes one per request.
#[derive(Clone)]
pub struct BusServer {
    shared: Arc<Shared>,
}

impl BusServer {
    pub fn new(bus: Bus) -> Self {
        BusServer {
            shared: Arc::new(Shared {
                bus,
                tools: Self::tools(),
            }),
        }
    }

    /// Every tool of the bus as `tools/list` shows it (name, description,
    /// input schema), for checks of what other texts name.
    pub fn tool_list() -> Vec<rmcp::model::Tool> {
        Self::tools().list_all()
    }

    /// Every tool of the bus.
    fn tools() -> ToolRouter<BusServer> {
        Self::identity_router()
            + Self::session_router()
            + Self::messaging_router()
            + Self::waiting_router()
            + Self::presence_router()
            + Self::note_router()
            + Self::task_router()
            + Self::lock_router()
            + Self::reservation_router()
            + Self::project_router()
            + Self::conversation_router()
            + Self::conversation_message_router()
    }

    pub fn pool(&self) -> &PgPool {
        &self.shared.bus.pool
    }

    pub fn bus(&self) -> &Bus {
        &self.shared.bus
    }
}

#[tool_handler(router = self.shared.tools)]
impl ServerHandler for BusServer {
    /// Every tool, less the conversation tools while the caller's team has
    /// conversations off.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = self.shared.tools.list_all();
        if !self.conversations_on(&context).await? {
            tools.retain(|tool| !conversations::TOOLS.contains(&tool.name.as_ref()));
        }
        Ok(ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            tools,
            meta: None,
            next_cursor: None,
            // The list depends on the caller's team: nobody else may reuse it.
            ttl_ms: None,
            cache_scope: None,
        })
    }

    /// Every tool call passes here: [`BusServer::dispatch`] answers it, and
    /// it is counted and timed once (`acs_metrics`), by tool and outcome.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // A wait the HTTP gate ran before this ([`park`]) is timed from its start.
        let started = http_parts(&context)
            .ok()
            .and_then(|parts| parts.extensions.get::<Parked>())
            .map_or_else(std::time::Instant::now, Parked::started);
        // Only a tool that exists names its label: a caller's text never does.
        let tool = match self.shared.tools.get(&request.name) {
            Some(tool) => tool.name.clone(),
            None => "unknown".into(),
        };
        let response = self.dispatch(request, context).await;
        acs_metrics::record_tool_call(&tool, tool_outcome(&response), started.elapsed());
        response
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

impl BusServer {
    /// Answer one tool call (see [`ServerHandler::call_tool`]).
    async fn dispatch(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // An unknown tool is a protocol error (MCP: -32602), named.
        let Some(route) = self.shared.tools.map.get(&request.name) else {
            let shown: String = request.name.chars().take(64).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "there is no tool named `{shown}` on this server; tools/list names the tools \
                     you may call. Nothing was done."
                ),
                None,
            ));
        };
        // PostgreSQL text cannot hold NUL; refuse it here, for every tool, so
        // it is an explained refusal rather than a failed write. The decoded
        // values are looked at: the six characters `\u0000` written as text
        // (common in code) are not a NUL.
        if let Some(arguments) = &request.arguments
            && arguments.iter().any(|(key, value)| holds_nul(key, value))
        {
            let err = BusError::invalid(
                "an argument contains a NUL character (U+0000, sent as the JSON escape \\u0000), \
                 which the bus cannot store. Nothing was done. Remove it, or send binary content \
                 as an attachment (base64). Text that spells the escape out (a backslash, then \
                 u0000) is fine.",
            );
            return Ok(refusal(&err).into());
        }
        if conversations::TOOLS.contains(&request.name.as_ref())
            && !self.conversations_on(&context).await?
        {
            // Arguments that do not fit are refused first, as for a team
            // with conversations on (there deserialisation finds them).
            if let Err(message) = arguments::check(
                &request.name,
                &route.attr.input_schema,
                request.arguments.as_ref(),
            ) {
                return Ok(refusal(&BusError::invalid(message)).into());
            }
            let me = identity_of(&context)?;
            return Ok(refusal(&conversations::disabled_error(me)).into());
        }
        // Every tool reads the caller from the HTTP parts, so a call without
        // them is a wiring bug, refused before any tool runs; past this, the
        // one way a route answers "invalid params" is arguments that do not
        // deserialise into the tool's argument struct.
        let body = http_parts(&context)?
            .extensions
            .get::<RequestBody>()
            .cloned();
        let call = ToolCallContext::new(self, request, context);
        match (route.call)(call).await {
            Err(error) if error.code == ErrorCode::INVALID_PARAMS => {
                Ok(argument_refusal(&route.attr, body.as_ref(), &error).into())
            }
            answer => answer,
        }
    }

    async fn conversations_on(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<bool, ErrorData> {
        let me = identity_of(context)?;
        // Cached like credentials (`auth::cache`): switching the capability
        // notifies every replica.
        let events = &self.bus().events;
        let generation = events.credentials_generation();
        let cache = events.credential_cache();
        if let Some(on) = generation.and_then(|g| cache.conversations_enabled(me.team_id, g)) {
            return Ok(on);
        }
        let on = conversations::enabled(self.pool(), me)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        if let Some(generation) = generation {
            cache.remember_conversations_enabled(me.team_id, generation, on);
        }
        Ok(on)
    }
}

/// The refusal of a call whose arguments did not deserialise: the schema
/// check ([`arguments::check`]) names each problem, in the bus's words; it is
/// only run now, on the way to a refusal, against the arguments as the body
/// carried them. Should it find nothing (deserialisation refused something
/// the check does not know), the refusal lists what the tool takes, and
/// serde's text goes to the log, not to the model.
fn argument_refusal(tool: &Tool, body: Option<&RequestBody>, error: &ErrorData) -> CallToolResult {
    let arguments = body.and_then(RequestBody::arguments);
    let message = match arguments::check(&tool.name, &tool.input_schema, arguments.as_ref()) {
        Err(message) => message,
        Ok(()) => {
            tracing::warn!(
                tool = %tool.name,
                error = %error.message,
                "arguments passed the schema check but failed to deserialise"
            );
            format!(
                "{} was not run: its arguments do not fit what it takes. {} Nothing was done; \
                 call it again with the arguments fixed.",
                tool.name,
                arguments::schema_summary(&tool.name, &tool.input_schema)
            )
        }
    };
    refusal(&BusError::invalid(message))
}

/// The body of the POST a call came in, as the HTTP layer read it (a shared
/// buffer, not a copy), in the request's extensions. rmcp hands a tool its
/// arguments by value; this is where a refusal finds them again.
#[derive(Clone)]
pub struct RequestBody(pub axum::body::Bytes);

impl RequestBody {
    /// `params.arguments` of the JSON-RPC message, when it is an object.
    fn arguments(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        #[derive(serde::Deserialize)]
        struct Message {
            params: Params,
        }
        #[derive(serde::Deserialize)]
        struct Params {
            arguments: Option<serde_json::Map<String, serde_json::Value>>,
        }
        serde_json::from_slice::<Message>(&self.0)
            .ok()
            .and_then(|m| m.params.arguments)
    }
}

/// Whether a decoded argument (its name, a string, or anything nested in it)
/// holds a NUL character. One pass over what the request already parsed.
fn holds_nul(key: &str, value: &serde_json::Value) -> bool {
    use serde_json::Value;
    key.contains('\0')
        || match value {
            Value::String(text) => text.contains('\0'),
            Value::Array(items) => items.iter().any(|item| holds_nul("", item)),
            Value::Object(fields) => fields.iter().any(|(key, value)| holds_nul(key, value)),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
}

fn http_parts(context: &RequestContext<RoleServer>) -> Result<&http::request::Parts, ErrorData> {
    context
        .extensions
        .get::<http::request::Parts>()
        .ok_or_else(|| {
            ErrorData::internal_error("request reached MCP without its HTTP parts", None)
        })
}

fn identity_of(context: &RequestContext<RoleServer>) -> Result<&Identity, ErrorData> {
    caller(http_parts(context)?)
}

/// The caller of this request. The HTTP layer refuses every request it cannot
/// authenticate, so a missing identity is a wiring bug, not a user error.
pub(crate) fn caller(parts: &http::request::Parts) -> Result<&Identity, ErrorData> {
    parts.extensions.get::<Identity>().ok_or_else(|| {
        ErrorData::internal_error("request reached a tool without an identity", None)
    })
}

/// The request a write tool was given as `request_id`, parsed, with the
/// digest of the call's arguments as the body carried them; `None` without
/// one. A `request_id` that is not a UUID is refused.
pub(crate) fn request_of(
    parts: &http::request::Parts,
    tool: &str,
    raw: Option<&str>,
) -> Result<BusResult<Option<requests::Request>>, ErrorData> {
    let Some(raw) = raw else {
        return Ok(Ok(None));
    };
    let arguments = parts
        .extensions
        .get::<RequestBody>()
        .and_then(RequestBody::arguments)
        .ok_or_else(|| ErrorData::internal_error("a tool call came without its body", None))?;
    Ok(requests::Request::parse(raw, tool, &arguments).map(Some))
}

impl BusServer {
    /// A write tool's call: `write` on a [`requests::Writer`], once per
    /// `request_id` when the call carries one (`store::requests`), its
    /// answer (or the first call's, replayed) as the tool's result.
    pub(crate) async fn once<T, F, Fut>(
        &self,
        parts: &http::request::Parts,
        tool: &str,
        request_id: Option<&str>,
        write: F,
    ) -> Result<CallToolResult, ErrorData>
    where
        T: Serialize,
        F: FnOnce(requests::Writer) -> Fut,
        Fut: std::future::Future<Output = (requests::Writer, BusResult<T>)>,
    {
        let me = caller(parts)?;
        let request = match request_of(parts, tool, request_id)? {
            Ok(request) => request,
            Err(err) => return Ok(refusal(&err)),
        };
        reply(requests::once(self.bus(), me, request.as_ref(), write).await)
    }
}

/// Shape a store answer as a tool result: the value as structured JSON, or a
/// refusal the model can read and act on.
pub(crate) fn reply<T: Serialize>(result: BusResult<T>) -> Result<CallToolResult, ErrorData> {
    match result {
        Ok(value) => {
            let value = serde_json::to_value(value).map_err(|e| {
                ErrorData::internal_error(format!("could not encode the answer: {e}"), None)
            })?;
            Ok(CallToolResult::structured(value))
        }
        Err(err) => Ok(refusal(&err)),
    }
}

pub(crate) fn refusal(err: &BusError) -> CallToolResult {
    if err.is_pool_timeout() {
        acs_metrics::record_pool_timeout();
    }
    CallToolResult::structured_error(json!({ "error": err.kind(), "message": err.to_string() }))
}

/// The refusal kinds a tool result may carry ([`BusError::kind`]);
/// anything else is counted as `refused`, so a label never carries free text.
const REFUSAL_KINDS: &[&str] = &[
    "not_found",
    "invalid",
    "conflict",
    "unauthenticated",
    "forbidden",
    "unavailable",
    "rate_limited",
    "limit",
];

/// How a tool call ended, as a label: `ok`, the refusal's kind (from a
/// fixed list; any other kind is `refused`), or `error` (a protocol error:
/// no result at all).
fn tool_outcome(response: &Result<CallToolResponse, ErrorData>) -> &'static str {
    let result = match response {
        Err(_) => return "error",
        Ok(CallToolResponse::Complete(result)) => result,
        Ok(_) => return "ok",
    };
    if result.is_error != Some(true) {
        return "ok";
    }
    let kind = result
        .structured_content
        .as_ref()
        .and_then(|body| body.get("error"))
        .and_then(|kind| kind.as_str());
    kind.and_then(|kind| REFUSAL_KINDS.iter().find(|k| **k == kind).copied())
        .unwrap_or("refused")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(result: &CallToolResult) -> String {
        let body = result
            .structured_content
            .as_ref()
            .expect("a structured refusal");
        assert_eq!(body["error"], "invalid");
        body["message"].as_str().unwrap().to_string()
    }

    fn set_note() -> Tool {
        BusServer::tool_list()
            .into_iter()
            .find(|tool| tool.name == "set_note")
            .unwrap()
    }

    fn body(arguments: serde_json::Value) -> RequestBody {
        let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                             "params": {"name": "set_note", "arguments": arguments}});
        RequestBody(message.to_string().into())
    }

    #[test]
    fn a_refusal_names_what_the_body_got_wrong_and_what_the_tool_takes() {
        let serde = ErrorData::invalid_params("failed to deserialize parameters: …", None);
        let refused = argument_refusal(&set_note(), Some(&body(json!({"key": 5}))), &serde);
        let message = message(&refused);
        assert!(
            message.starts_with("set_note was not run") && message.contains("`key` got 5"),
            "{message}"
        );
        assert!(
            message.contains("set_note takes key, value (required)"),
            "{message}"
        );
        assert!(!message.contains("deserialize"), "{message}");
    }

    #[test]
    fn a_refusal_the_check_cannot_explain_still_lists_what_the_tool_takes() {
        let serde = ErrorData::invalid_params("failed to deserialize parameters: …", None);
        let fitting = body(json!({"key": "k", "value": "v"}));
        for given in [Some(&fitting), None] {
            let message = message(&argument_refusal(&set_note(), given, &serde));
            assert!(
                message.starts_with("set_note was not run")
                    && message.contains("set_note takes key, value (required)"),
                "{message}"
            );
        }
    }

    /// The writes that take no `request_id`, and why (docs/tools.md,
    /// "Retries and request_id", says the same).
    const WITHOUT_REQUEST_ID: &[&str] = &[
        // The answer holds a new credential, kept only as a digest.
        "register_session",
        "resume_session",
        "renew_session",
        // Repeating changes nothing: a revoked window stays revoked.
        "revoke_session",
        // Repeats answer the same; its broker acks must follow its commit.
        "confirm_inbox_delivery",
        // Its own required request_id (`store_conversation_message`).
        "send_conversation_message",
        // Reads that move a cursor or hand out references: a repeat reads
        // again (what it missed stays owed).
        "read_messages",
        "fetch_conversation_inbox",
        "wait_for_updates",
        "wait_for_conversation_updates",
    ];

    #[test]
    fn every_write_tool_takes_a_request_id_described_alike() {
        let mut described = std::collections::BTreeSet::new();
        let mut missing = Vec::new();
        for tool in BusServer::tool_list() {
            let read_only = tool
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false);
            let property = tool
                .input_schema
                .get("properties")
                .and_then(|p| p.get("request_id"));
            let name = tool.name.as_ref();
            if read_only || WITHOUT_REQUEST_ID.contains(&name) {
                if name != "send_conversation_message" {
                    assert!(property.is_none(), "{name} takes a request_id it ignores");
                }
                continue;
            }
            let Some(property) = property else {
                missing.push(name.to_string());
                continue;
            };
            if name != "ask_agent" {
                described.insert(property["description"].to_string());
            }
        }
        assert!(missing.is_empty(), "writes without request_id: {missing:?}");
        assert_eq!(described.len(), 1, "described alike: {described:?}");
    }

    #[test]
    fn refusal_kinds_are_a_fixed_list() {
        use rmcp::model::CallToolResult;
        use serde_json::json;
        let answer = |result: CallToolResult| Ok(CallToolResponse::from(result));
        assert_eq!(
            tool_outcome(&answer(CallToolResult::structured(json!({})))),
            "ok"
        );
        let refused = |kind: &str| {
            answer(CallToolResult::structured_error(
                json!({ "error": kind, "message": "m" }),
            ))
        };
        assert_eq!(tool_outcome(&refused("conflict")), "conflict");
        assert_eq!(tool_outcome(&refused("acst_secret")), "refused");
        let error = Err(ErrorData::internal_error("x", None));
        assert_eq!(tool_outcome(&error), "error");
    }
}
