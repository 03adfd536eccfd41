//! What `/mcp` says to a request that is not one well-formed MCP message.
//!
//! rmcp's Streamable HTTP service refuses such requests with plain text
//! (`fail to deserialize request body …`, `Not Acceptable: …`) and statuses
//! that do not fit (415 for a JSON syntax error). The gate checks the same
//! things first and answers in the bus's voice, so a client always gets JSON:
//!
//! - **HTTP-level** refusals (wrong method, `Accept`, `Content-Type`,
//!   `MCP-Protocol-Version`) are `{"error", "message"}` like every other
//!   refusal of the server: [`check_headers`] before the credential is looked
//!   up, the protocol version in [`check_body`] (whether an unknown version is
//!   an error depends on the body, as in rmcp).
//! - Refusals of the **message itself** (not JSON, empty, a batch, nested too
//!   deep, not a JSON-RPC request) are JSON-RPC error objects
//!   (`{"jsonrpc":"2.0","id":…,"error":{"code","message"}}`, HTTP 400), the
//!   answer the JSON-RPC and MCP specifications call for: -32700 for a body
//!   that does not parse, -32600 for one that is not a valid request, -32602
//!   for `params` of the wrong shape. `id` echoes the request's when it has a
//!   usable one, else `null`.
//! - Whatever rmcp still refuses in plain text is rewritten by
//!   [`explain_plain_refusal`] into the same JSON, so no text/plain refusal
//!   leaves `/mcp`. The rewrite goes by status, never by rmcp's words.
//!
//! The body is looked at in one pass that allocates only for short strings
//! (`jsonrpc`, `id`, `method`, a tool's name): an 8 MiB message costs a scan,
//! not a second copy of itself. The same pass tells a long poll apart
//! ([`Checked::is_long_poll`]); rmcp's own parse into its message types is
//! the only other one.
//!
//! Size: about 430 lines of code and 200 of unit tests for its refusals.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::model::ProtocolVersion;
use serde_json::{Value, json};

use super::json_error;
use super::limits::LONG_POLL_TOOLS;

mod envelope;

use envelope::{Shape, Top};

/// How deep arrays and objects may nest in a request body, the JSON-RPC
/// envelope included (a tool call's arguments sit at level 3). Deeper
/// structures are refused before anything parses them: parsing recurses, and
/// a stored value must stay readable inside the deeper envelopes of answers.
pub const JSON_DEPTH_MAX: usize = 64;

/// JSON-RPC 2.0 error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;

const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";

/// A request this server can read, for the reader of a refusal.
const EXAMPLE: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{}}}"#;

/// Method, `Accept` and `Content-Type`: checked before the credential is
/// looked up (what they say does not depend on who asks).
#[allow(clippy::result_large_err)]
pub(super) fn check_headers(method: &Method, headers: &HeaderMap) -> Result<(), Response> {
    if method != Method::POST {
        let mut response = json_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid",
            format!(
                "{method} is not answered on /mcp: this server speaks MCP's Streamable HTTP \
                 transport statelessly, so every message is a POST (there is no event stream to \
                 GET and no session to DELETE). POST one JSON-RPC message, such as {EXAMPLE}."
            ),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Err(response);
    }
    let (mut json, mut sse) = (false, false);
    for essence in media_ranges(headers, header::ACCEPT) {
        json |= essence.eq_ignore_ascii_case("application/json");
        sse |= essence.eq_ignore_ascii_case("text/event-stream");
    }
    if !(json && sse) {
        let sent = header_text(headers, header::ACCEPT);
        return Err(json_error(
            StatusCode::NOT_ACCEPTABLE,
            "invalid",
            format!(
                "the Accept header ({sent}) must list both application/json and \
                 text/event-stream: MCP's Streamable HTTP transport requires a client to take \
                 either answer. Send `Accept: application/json, text/event-stream`."
            ),
        ));
    }
    // Read as rmcp reads it (the first value, its essence before any `;`), so
    // a Content-Type that passes here passes there too, and rmcp's 415 can
    // only mean a body it could not read (see [`explain_plain_refusal`]).
    let content_type_ok = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
            essence.trim().eq_ignore_ascii_case("application/json")
        });
    if !content_type_ok {
        let sent = header_text(headers, header::CONTENT_TYPE);
        return Err(json_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid",
            format!(
                "the Content-Type header ({sent}) must be application/json: the body is one \
                 JSON-RPC message. Send `Content-Type: application/json`."
            ),
        ));
    }
    Ok(())
}

/// A header's value for a message: quoted, or that it was missing.
fn header_text(headers: &HeaderMap, name: header::HeaderName) -> String {
    let values: Vec<String> = headers
        .get_all(&name)
        .iter()
        .map(|v| {
            String::from_utf8_lossy(v.as_bytes())
                .chars()
                .take(200)
                .collect()
        })
        .collect();
    if values.is_empty() {
        "missing".to_string()
    } else {
        format!("`{}`", values.join(", "))
    }
}

/// The media types of an `Accept` or `Content-Type` header, without parameters.
fn media_ranges(headers: &HeaderMap, name: header::HeaderName) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .into_iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|range| range.split(';').next())
        .map(str::trim)
}

/// What the gate learned from a body that passed [`check_body`], in the one
/// pass that reads it before rmcp does.
pub(super) struct Checked {
    /// The request's id, to echo in a later JSON-RPC error.
    id: Value,
    /// The method, when short enough to name.
    method: Option<String>,
    /// The tool a `tools/call` names (when short enough to keep).
    tool: Option<String>,
}

impl Checked {
    /// The tool a `tools/call` names, when short enough to keep.
    pub(super) fn tool(&self) -> Option<&str> {
        self.tool.as_deref()
    }

    /// Whether the message is a `tools/call` of a long-polling tool
    /// ([`LONG_POLL_TOOLS`]), which moves to its caller's long-poll counts.
    pub(super) fn is_long_poll(&self) -> bool {
        self.tool
            .as_deref()
            .is_some_and(|tool| LONG_POLL_TOOLS.contains(&tool))
    }
}

/// The body: not empty, not nested deeper than [`JSON_DEPTH_MAX`], JSON, one
/// JSON-RPC message of the shape rmcp reads; then the `MCP-Protocol-Version`
/// header, which an unknown value fails unless the body names its own version.
#[allow(clippy::result_large_err)]
pub(super) fn check_body(headers: &HeaderMap, body: &[u8]) -> Result<Checked, Response> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(jsonrpc_error(
            Value::Null,
            PARSE_ERROR,
            format!("the request body is empty. Send one JSON-RPC message, such as {EXAMPLE}."),
        ));
    }
    if nests_deeper_than(body, JSON_DEPTH_MAX) {
        return Err(jsonrpc_error(
            Value::Null,
            INVALID_REQUEST,
            format!(
                "the request body nests arrays and objects more than {JSON_DEPTH_MAX} levels \
                 deep, the limit of this server (the message, `params` and `arguments` take 3 of \
                 them). Nothing was done. Flatten the value: store deep structures as a string \
                 (JSON text) or split them up."
            ),
        ));
    }
    let top = match serde_json::from_slice::<Top>(body) {
        Ok(top) => top,
        Err(err) => {
            return Err(jsonrpc_error(
                Value::Null,
                PARSE_ERROR,
                format!(
                    "the request body is not valid JSON: {}. Send one JSON-RPC message, such as \
                     {EXAMPLE}.",
                    syntax_error(&err)
                ),
            ));
        }
    };
    let message = match top {
        Top::Message(message) => message,
        Top::Batch(0) => {
            return Err(jsonrpc_error(
                Value::Null,
                INVALID_REQUEST,
                format!(
                    "the body is an empty JSON array. Send one JSON-RPC message (an object), \
                     such as {EXAMPLE}."
                ),
            ));
        }
        Top::Batch(count) => {
            return Err(jsonrpc_error(
                Value::Null,
                INVALID_REQUEST,
                format!(
                    "the body is a JSON-RPC batch (an array of {count} messages); batches are \
                     not supported. MCP's Streamable HTTP transport carries one message per POST \
                     (revision 2025-06-18 removed batching). Nothing was done: send each message \
                     in its own request."
                ),
            ));
        }
        Top::Other(shape) => {
            return Err(jsonrpc_error(
                Value::Null,
                INVALID_REQUEST,
                format!(
                    "the body is {}, not a JSON-RPC message. Send one JSON object, such as \
                     {EXAMPLE}.",
                    shape.describe()
                ),
            ));
        }
    };
    let id = message.usable_id();
    message.problem().map_or(Ok(()), |(code, text)| {
        Err(jsonrpc_error(id.clone(), code, text))
    })?;
    check_protocol_version(headers, message.names_its_version())?;
    let method = match &message.method {
        Some(Shape::Str(method)) => Some(method.clone()),
        _ => None,
    };
    let tool = message.tool_name().map(str::to_string);
    Ok(Checked { id, method, tool })
}

/// serde_json's account of a syntax error: JSON's own vocabulary (`expected
/// value`, `EOF while parsing a string`) and where, never a Rust type.
fn syntax_error(err: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match err.classify() {
        Category::Syntax | Category::Eof => err.to_string(),
        // Io cannot happen reading a slice, and Data cannot with the visitors
        // below, which take any JSON value; named plainly all the same.
        Category::Io | Category::Data => format!(
            "it could not be read at line {}, column {}",
            err.line(),
            err.column()
        ),
    }
}

/// Rejects an unknown `MCP-Protocol-Version` as rmcp would, in the bus's words.
#[allow(clippy::result_large_err)]
fn check_protocol_version(headers: &HeaderMap, body_names_version: bool) -> Result<(), Response> {
    let Some(value) = headers.get(PROTOCOL_VERSION_HEADER) else {
        return Ok(());
    };
    let known: Vec<&str> = ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .map(ProtocolVersion::as_str)
        .collect();
    let version = match value.to_str() {
        Ok(version) => version,
        Err(_) => {
            return Err(json_error(
                StatusCode::BAD_REQUEST,
                "invalid",
                format!(
                    "the MCP-Protocol-Version header is not ASCII text. Send one of {}, or omit \
                     the header (2025-03-26 is then assumed).",
                    known.join(", ")
                ),
            ));
        }
    };
    if body_names_version || known.contains(&version) {
        return Ok(());
    }
    let shown: String = version.chars().take(64).collect();
    Err(json_error(
        StatusCode::BAD_REQUEST,
        "invalid",
        format!(
            "MCP-Protocol-Version `{shown}` is not a protocol revision this server speaks. It \
             speaks {}; send one of those, or omit the header (2025-03-26 is then assumed). \
             Nothing was done.",
            known.join(", ")
        ),
    ))
}

/// A JSON-RPC error object with HTTP 400.
pub(super) fn jsonrpc_error(id: Value, code: i64, message: impl Into<String>) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": { "code": code, "message": message.into() },
        })),
    )
        .into_response()
}

/// Whether arrays and objects nest deeper than `limit` anywhere in `body`.
/// Brackets inside strings do not count; the body need not be valid JSON.
pub fn nests_deeper_than(body: &[u8], limit: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// A plain-text (or bodiless) error from rmcp, rewritten as JSON with the
/// same status; anything else passes unchanged. A body rmcp could not read as
/// an MCP message (its 415) becomes the JSON-RPC invalid request it is.
pub(super) async fn explain_plain_refusal(checked: &Checked, response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    // rmcp's refusals are a line of text; more is not worth reading.
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    tracing::debug!(
        status = status.as_u16(),
        text,
        "rewriting a plain refusal from rmcp"
    );
    // Told apart by status, never by rmcp's words: the gate has checked the
    // Content-Type as rmcp does, so its 415 is a body it could not read.
    let mut rewritten = if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
        let method = checked
            .method
            .as_deref()
            .map_or_else(|| "this message".to_string(), |m| format!("`{m}`"));
        jsonrpc_error(
            checked.id.clone(),
            INVALID_REQUEST,
            format!(
                "the body is JSON but not an MCP message this server can read: the fields of \
                 {method} (its `params` above all) do not have the shape the MCP specification \
                 gives them, or the method is not one MCP defines. Nothing was done. A tool call \
                 looks like {EXAMPLE}."
            ),
        )
    } else {
        let (kind, advice) = advice_for(status);
        let said = if text.is_empty() {
            String::new()
        } else {
            format!(" (the MCP transport said: {text})")
        };
        json_error(status, kind, format!("{advice}{said}"))
    };
    // Keep what rmcp said about the exchange (Allow, for one), not its framing.
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rewritten.headers_mut().insert(name.clone(), value.clone());
        }
    }
    rewritten
}

/// The bus's kind and first sentence for a status rmcp answered in text.
/// Its Host check is off (the gate's own runs first), so its one 403 is the
/// Origin guard's.
fn advice_for(status: StatusCode) -> (&'static str, String) {
    match status.as_u16() {
        403 => (
            "forbidden",
            "the request's Origin header is not one this server accepts (a guard against \
             cross-site requests from browsers). Send no Origin header from a non-browser \
             client, or start the server with `--allowed-origins` naming the origin."
                .to_string(),
        ),
        404 => (
            "not_found",
            "the MCP transport found nothing to answer this request with.".to_string(),
        ),
        405 => (
            "invalid",
            "this method is not answered on /mcp: POST one JSON-RPC message.".to_string(),
        ),
        406 => (
            "invalid",
            "send `Accept: application/json, text/event-stream`.".to_string(),
        ),
        413 => ("invalid", "the request body is too large.".to_string()),
        415 => (
            "invalid",
            "send the body as `Content-Type: application/json`.".to_string(),
        ),
        400..=499 => (
            "invalid",
            "the request was refused as malformed; nothing was done.".to_string(),
        ),
        _ => (
            "unavailable",
            "the server could not answer this request. Try again; if it keeps failing, the \
             server log says why."
                .to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(body: &str) -> Option<(u16, Value)> {
        let headers = HeaderMap::new();
        check_body(&headers, body.as_bytes()).err().map(|response| {
            let status = response.status().as_u16();
            let body =
                futures::executor::block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
                    .unwrap();
            (status, serde_json::from_slice(&body).unwrap())
        })
    }

    fn code_and_message(body: &str) -> (i64, String) {
        let (status, value) = refusal(body).expect("refused");
        assert_eq!(status, 400, "{value}");
        (
            value["error"]["code"].as_i64().unwrap(),
            value["error"]["message"].as_str().unwrap().to_string(),
        )
    }

    #[test]
    fn brackets_inside_strings_do_not_nest() {
        assert!(!nests_deeper_than(br#"{"a":"[[[[[[[[[["}"#, 2));
        assert!(!nests_deeper_than(br#"{"a":"\"[[[[[[\\"}"#, 2));
        assert!(nests_deeper_than(br#"{"a":[[[]]]}"#, 3));
        assert!(!nests_deeper_than(br#"{"a":[[]]}"#, 3));
        // An escaped backslash ends before the quote, which closes the string.
        assert!(nests_deeper_than(br#"{"a":"\\",[[[["#, 3));
    }

    #[test]
    fn a_well_formed_call_passes_and_keeps_its_id() {
        let checked = check_body(&HeaderMap::new(), EXAMPLE.as_bytes()).unwrap_or_else(|_| {
            panic!("the example is refused");
        });
        assert_eq!(checked.id, json!(1));
        assert_eq!(checked.method.as_deref(), Some("tools/call"));
        let notification = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert!(check_body(&HeaderMap::new(), notification).is_ok());
    }

    #[test]
    fn long_polls_are_told_apart_by_tool_name() {
        let call = |name: &str| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": name, "arguments": {"timeout_seconds": 5}}})
            .to_string()
        };
        let long_poll = |body: &str| {
            check_body(&HeaderMap::new(), body.as_bytes()).is_ok_and(|c| c.is_long_poll())
        };
        assert!(long_poll(&call("wait_for_updates")));
        assert!(long_poll(&call("ask_agent")));
        assert!(long_poll(&call("wait_for_conversation_updates")));
        assert!(!long_poll(&call("whoami")));
        assert!(!long_poll(
            r#"{"jsonrpc":"2.0","method":"tools/list","id":1}"#
        ));
        // The name of another method's params is no tool.
        assert!(!long_poll(
            r#"{"jsonrpc":"2.0","method":"prompts/get","id":1,"params":{"name":"ask_agent"}}"#
        ));
    }

    #[test]
    fn each_malformed_body_gets_its_code_and_words() {
        let cases: &[(&str, i64, &str)] = &[
            ("", PARSE_ERROR, "empty"),
            ("  \n", PARSE_ERROR, "empty"),
            ("{\"jsonrpc\":", PARSE_ERROR, "not valid JSON: EOF"),
            ("?what", PARSE_ERROR, "expected value at line 1 column 1"),
            ("[]", INVALID_REQUEST, "empty JSON array"),
            (
                &format!("[{EXAMPLE},{EXAMPLE}]"),
                INVALID_REQUEST,
                "batch (an array of 2 messages); batches are not supported",
            ),
            (
                "\"hello\"",
                INVALID_REQUEST,
                "the string \"hello\", not a JSON-RPC",
            ),
            (
                r#"{"id":1,"method":"tools/list"}"#,
                INVALID_REQUEST,
                "`jsonrpc` must be the string \"2.0\"; the message has nothing",
            ),
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"tools/list"}"#,
                INVALID_REQUEST,
                "`id` must be a string or an integer",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#,
                INVALID_REQUEST,
                "the number 1.5",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
                INVALID_REQUEST,
                "`method` must be a string",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1}"#,
                INVALID_REQUEST,
                "no `method`",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":[1]}"#,
                INVALID_PARAMS,
                "`params` must be an object",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
                INVALID_PARAMS,
                "tools/call needs `params`",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#,
                INVALID_PARAMS,
                "`params.name`, the tool's name as a string; the message has the number 5",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":"x"}}"#,
                INVALID_PARAMS,
                "`params.arguments` must be an object",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
                INVALID_PARAMS,
                "initialize needs `params.protocolVersion`, a string; the message has nothing",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#,
                INVALID_PARAMS,
                "initialize needs `params.protocolVersion`",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":"me"}}"#,
                INVALID_PARAMS,
                "`params.clientInfo`, an object; the message has the string \"me\"",
            ),
        ];
        for (body, code, words) in cases {
            let (got_code, message) = code_and_message(body);
            assert_eq!(got_code, *code, "{body}: {message}");
            assert!(message.contains(words), "{body}: {message}");
            for rust in ["Some(", "expected i64", "invalid type", "JsonRpc", "struct"] {
                assert!(!message.contains(rust), "{body}: {message}");
            }
        }
    }

    #[test]
    fn the_request_id_is_echoed_when_it_is_usable() {
        let (_, value) = refusal(r#"{"jsonrpc":"2.0","id":"q-7","method":"tools/call"}"#).unwrap();
        assert_eq!(value["id"], "q-7");
        let (_, value) = refusal("[1,2]").unwrap();
        assert_eq!(value["id"], Value::Null);
    }

    #[test]
    fn nesting_over_the_limit_is_refused_naming_it() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"set_note","arguments":{{"key":"k","value":{}1{}}}}}}}"#,
            "[".repeat(JSON_DEPTH_MAX),
            "]".repeat(JSON_DEPTH_MAX)
        );
        let (code, message) = code_and_message(&deep);
        assert_eq!(code, INVALID_REQUEST);
        assert!(message.contains("more than 64 levels"), "{message}");
        let fits = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"set_note","arguments":{{"key":"k","value":{}1{}}}}}}}"#,
            "[".repeat(JSON_DEPTH_MAX - 3),
            "]".repeat(JSON_DEPTH_MAX - 3)
        );
        assert!(refusal(&fits).is_none());
    }

    #[test]
    fn an_unknown_protocol_version_is_refused_unless_the_body_names_its_own() {
        let mut headers = HeaderMap::new();
        headers.insert(
            PROTOCOL_VERSION_HEADER,
            HeaderValue::from_static("1999-01-01"),
        );
        let response = check_body(&headers, EXAMPLE.as_bytes()).err().unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let with_meta = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"1999-01-01"}}}"#;
        assert!(check_body(&headers, with_meta.as_bytes()).is_ok());
        headers.insert(
            PROTOCOL_VERSION_HEADER,
            HeaderValue::from_static("2025-06-18"),
        );
        assert!(check_body(&headers, EXAMPLE.as_bytes()).is_ok());
    }

    #[test]
    fn headers_are_checked_in_the_transports_terms() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            check_headers(&Method::GET, &headers)
                .err()
                .unwrap()
                .status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            check_headers(&Method::POST, &headers)
                .err()
                .unwrap()
                .status(),
            StatusCode::NOT_ACCEPTABLE
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json;q=0.9, Text/Event-Stream"),
        );
        assert_eq!(
            check_headers(&Method::POST, &headers)
                .err()
                .unwrap()
                .status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        assert!(check_headers(&Method::POST, &headers).is_ok());
    }
}
