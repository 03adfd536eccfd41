//! Every refusal on `/mcp` is JSON that explains itself: malformed requests
//! over plain HTTP (each with its status, as `{error, message}` or a JSON-RPC
//! error object), and tool arguments of the wrong shape over a real MCP
//! client (the bus's refusal naming the argument, what it got and what it
//! takes), with nothing changed.

use ai_crew_sync::config::HttpSettings;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, http_client, spawn_app};

/// Text a client must never be shown: rmcp's and serde's words, Rust syntax.
const NOT_FOR_CLIENTS: &[&str] = &[
    "fail to deserialize",
    "failed to deserialize",
    "recursion limit",
    "invalid type",
    "expected i64",
    "expected u64",
    "Some(",
    "JsonRpc",
    "untagged enum",
];

fn assert_clean(text: &str) {
    for bad in NOT_FOR_CLIENTS {
        assert!(!text.contains(bad), "`{bad}` reached the client: {text}");
    }
}

/// A response as a client sees it: status, headers, the body parsed as JSON
/// (a panic if it is not JSON, or not labelled so).
async fn answer(response: reqwest::Response) -> (u16, HeaderMap, Value) {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(
        content_type.starts_with("application/json"),
        "status {status} came as `{content_type}`: {text}"
    );
    assert_clean(&text);
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("status {status} is not JSON ({e}): {text}"));
    (status, headers, body)
}

/// POST `body` to /mcp as a conforming client would, with `token`.
fn post(app: &TestApp, token: &str, body: impl Into<reqwest::Body>) -> reqwest::RequestBuilder {
    http_client()
        .post(app.mcp_url())
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(body)
}

/// The `{error, message}` of a plain refusal, checked for shape.
fn plain(body: &Value) -> (&str, &str) {
    let kind = body["error"].as_str().unwrap_or_else(|| panic!("{body}"));
    let message = body["message"].as_str().unwrap_or_else(|| panic!("{body}"));
    (kind, message)
}

/// The `(id, code, message)` of a JSON-RPC error object, checked for shape.
fn jsonrpc(body: &Value) -> (&Value, i64, &str) {
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    let code = body["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("{body}"));
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"));
    (&body["id"], code, message)
}

fn call(id: u64, tool: &str, arguments: Value) -> String {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}
    })
    .to_string()
}

async fn count(app: &TestApp, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_wrong_method_accept_or_content_type_gets_json_with_its_status_before_any_lookup() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;

    // GET and DELETE: there is no stream and no session in stateless mode.
    // Refused without a credential too: the method needs no lookup.
    for (method, with_token) in [
        (reqwest::Method::GET, true),
        (reqwest::Method::DELETE, true),
        (reqwest::Method::GET, false),
    ] {
        let mut request = http_client()
            .request(method.clone(), app.mcp_url())
            .header("Accept", "application/json, text/event-stream");
        if with_token {
            request = request.bearer_auth(&token);
        }
        let (status, headers, body) = answer(request.send().await.unwrap()).await;
        assert_eq!(status, 405, "{method}: {body}");
        assert_eq!(headers["allow"], "POST", "{method}");
        let (kind, message) = plain(&body);
        assert_eq!(kind, "invalid");
        assert!(
            message.contains(&format!("{method} is not answered on /mcp"))
                && message.contains("POST"),
            "{message}"
        );
    }

    // Accept taking anything (reqwest's default), or only one of the two types.
    for accept in [None, Some("application/json"), Some("text/event-stream")] {
        let mut request = http_client()
            .post(app.mcp_url())
            .bearer_auth(&token)
            .header("Content-Type", "application/json")
            .body(call(1, "whoami", json!({})));
        if let Some(accept) = accept {
            request = request.header("Accept", accept);
        }
        let (status, _, body) = answer(request.send().await.unwrap()).await;
        assert_eq!(status, 406, "{accept:?}: {body}");
        let (_, message) = plain(&body);
        let sent = format!("`{}`", accept.unwrap_or("*/*"));
        assert!(
            message.contains(&format!("the Accept header ({sent})"))
                && message.contains("application/json, text/event-stream"),
            "{message}"
        );
    }

    // Content-Type other than JSON, or none; or JSON listed with another
    // type, which the transport beneath would not read as JSON either.
    for content_type in [
        Some("text/plain"),
        None,
        Some("application/json, text/plain"),
    ] {
        let mut request = http_client()
            .post(app.mcp_url())
            .bearer_auth(&token)
            .header("Accept", "application/json, text/event-stream")
            .body(call(1, "whoami", json!({})));
        if let Some(content_type) = content_type {
            request = request.header("Content-Type", content_type);
        }
        let (status, _, body) = answer(request.send().await.unwrap()).await;
        assert_eq!(status, 415, "{content_type:?}: {body}");
        let (_, message) = plain(&body);
        assert!(message.contains("must be application/json"), "{message}");
    }

    // The same request, well formed, is answered.
    let (status, _, body) = answer(
        post(&app, &token, call(1, "whoami", json!({})))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["structuredContent"]["agent"], "alice");
}

#[tokio::test]
async fn a_body_that_is_not_one_json_rpc_message_gets_a_json_rpc_error_and_changes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;

    let set_note = |id: u64, key: &str| {
        json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "set_note", "arguments": {"key": key, "value": "v"}}
        })
    };
    let batch = json!([set_note(1, "a"), set_note(2, "b")]).to_string();
    // 124 levels deep in all: under serde's own recursion limit of 128, so
    // this used to reach rmcp (and deeper answered 415 in plain text).
    let deep = call(
        7,
        "create_task",
        json!({"key": "deep", "title": "t", "metadata": {"x": "PLACEHOLDER"}}),
    )
    .replace(
        "\"PLACEHOLDER\"",
        &format!("{}1{}", "[".repeat(120), "]".repeat(120)),
    );
    let cases: Vec<(&str, String, i64, Value, &str)> = vec![
        (
            "empty",
            String::new(),
            -32700,
            Value::Null,
            "the request body is empty",
        ),
        (
            "not JSON",
            "{\"jsonrpc\": \"2.0\", ".into(),
            -32700,
            Value::Null,
            "is not valid JSON: EOF while parsing",
        ),
        (
            "a batch",
            batch,
            -32600,
            Value::Null,
            "batch (an array of 2 messages); batches are not supported",
        ),
        (
            "too deep",
            deep,
            -32600,
            Value::Null,
            "more than 64 levels deep, the limit of this server",
        ),
        (
            "a string",
            "\"tools/list\"".into(),
            -32600,
            Value::Null,
            "the string \"tools/list\", not a JSON-RPC message",
        ),
        (
            "no jsonrpc",
            json!({"id": 4, "method": "tools/list"}).to_string(),
            -32600,
            json!(4),
            "`jsonrpc` must be the string \"2.0\"",
        ),
        (
            "arguments not an object",
            json!({
                "jsonrpc": "2.0", "id": "q5", "method": "tools/call",
                "params": {"name": "set_note", "arguments": "key=a"}
            })
            .to_string(),
            -32602,
            json!("q5"),
            "`params.arguments` must be an object",
        ),
        (
            // rmcp alone answers an initialize it cannot read with "method
            // not found", which sends a client looking for the wrong fault.
            "initialize with empty params",
            json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {}}).to_string(),
            -32602,
            json!(7),
            "initialize needs `params.protocolVersion`, a string",
        ),
        (
            // Shaped like a message (an answer), but not one rmcp can read:
            // its plain 415 is rewritten on the way out.
            "an error that is not an object",
            json!({"jsonrpc": "2.0", "id": 6, "error": "broken"}).to_string(),
            -32600,
            json!(6),
            "the body is JSON but not an MCP message this server can read",
        ),
    ];
    for (what, body, code, id, words) in cases {
        let (status, _, answer_body) = answer(post(&app, &token, body).send().await.unwrap()).await;
        assert_eq!(status, 400, "{what}: {answer_body}");
        let (got_id, got_code, message) = jsonrpc(&answer_body);
        assert_eq!((got_code, got_id), (code, &id), "{what}: {answer_body}");
        assert!(message.contains(words), "{what}: {message}");
    }
    assert_eq!(count(&app, "notes").await, 0, "the batch stored nothing");
    assert_eq!(
        count(&app, "tasks").await,
        0,
        "the deep call stored nothing"
    );

    // 60 levels of metadata fit (the envelope takes the other 4) and are stored.
    let fits = call(
        8,
        "create_task",
        json!({"key": "ok", "title": "t", "metadata": {"x": "PLACEHOLDER"}}),
    )
    .replace(
        "\"PLACEHOLDER\"",
        &format!("{}1{}", "[".repeat(59), "]".repeat(59)),
    );
    let (status, _, body) = answer(post(&app, &token, fits).send().await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["structuredContent"]["key"], "ok", "{body}");
    assert_eq!(count(&app, "tasks").await, 1);
}

#[tokio::test]
async fn an_unknown_protocol_version_gets_400_json_naming_the_ones_spoken() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let response = post(&app, &token, call(1, "whoami", json!({})))
        .header("MCP-Protocol-Version", "1999-01-01")
        .send()
        .await
        .unwrap();
    let (status, _, body) = answer(response).await;
    assert_eq!(status, 400, "{body}");
    let (kind, message) = plain(&body);
    assert_eq!(kind, "invalid");
    assert!(
        message.contains("`1999-01-01` is not a protocol revision this server speaks")
            && message.contains("2025-06-18"),
        "{message}"
    );

    let response = post(&app, &token, call(2, "whoami", json!({})))
        .header("MCP-Protocol-Version", "2025-06-18")
        .send()
        .await
        .unwrap();
    let (status, _, body) = answer(response).await;
    assert_eq!(status, 200, "a version it speaks is answered: {body}");
}

#[tokio::test]
async fn a_plain_text_refusal_from_the_transport_is_rewritten_as_json() {
    // The Origin guard is rmcp's; its refusal is plain text on the way in.
    let app = TestApp::builder()
        .http(HttpSettings {
            allowed_origins: vec!["http://allowed.example".into()],
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let response = post(&app, &token, call(1, "whoami", json!({})))
        .header("Origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    let (status, _, body) = answer(response).await;
    assert_eq!(status, 403, "{body}");
    let (kind, message) = plain(&body);
    assert_eq!(kind, "forbidden");
    assert!(message.contains("--allowed-origins"), "{message}");

    let response = post(&app, &token, call(2, "whoami", json!({})))
        .header("Origin", "http://allowed.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

/// Team `acme`; alice's and bob's clients.
async fn team(app: &TestApp) -> (McpClient, McpClient) {
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    (alice, bob)
}

/// A refusal's message, after checking it is the bus's `invalid` refusal.
fn refused(result: Result<Value, Value>) -> String {
    let refusal = result.expect_err("refused");
    assert_eq!(refusal["error"], "invalid", "{refusal}");
    let message = refusal["message"].as_str().unwrap().to_string();
    assert_clean(&message);
    message
}

#[tokio::test]
async fn tool_arguments_of_the_wrong_shape_are_refused_naming_the_argument_and_change_nothing() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    alice
        .call("create_task", json!({"key": "build", "title": "build it"}))
        .await
        .unwrap();

    // A string where an integer is expected: the task stays open.
    let message = refused(
        alice
            .call(
                "claim_task",
                json!({"key": "build", "lease_seconds": "600"}),
            )
            .await,
    );
    assert!(
        message.contains("`lease_seconds` got the string \"600\"; it takes an integer")
            && message.contains("30..86400"),
        "{message}"
    );
    let task = alice
        .call("get_task", json!({"key": "build"}))
        .await
        .unwrap();
    assert_eq!(task["status"], "open", "{task}");

    // A negative number for an unsigned one: no question is sent.
    let message = refused(
        alice
            .call(
                "ask_agent",
                json!({"to": "bob", "question": "ready?", "timeout_seconds": -1}),
            )
            .await,
    );
    assert!(
        message.contains(
            "`timeout_seconds` got -1, which is out of range: it takes an integer of 0 or more"
        ),
        "{message}"
    );
    let inbox = bob
        .call("read_messages", json!({"scope": "inbox"}))
        .await
        .unwrap();
    assert_eq!(inbox["messages"], json!([]), "{inbox}");

    // An unknown argument, with the likely one named.
    let message = refused(
        alice
            .call(
                "create_task",
                json!({"key": "deploy", "title": "t", "depends": ["build"]}),
            )
            .await,
    );
    assert!(
        message
            .contains("`depends` is not an argument create_task takes. Did you mean `depends_on`?"),
        "{message}"
    );
    assert!(
        message.contains("create_task takes key, title (required); optional:"),
        "{message}"
    );

    // A required argument missing.
    let message = refused(alice.call("create_task", json!({"key": "deploy"})).await);
    assert!(
        message.contains("`title` is missing; it is required: a string"),
        "{message}"
    );
    assert_eq!(
        count(&app, "tasks").await,
        1,
        "neither create_task created a task"
    );

    // A wrong type inside a list, and inside an object in a list.
    let message = refused(
        alice
            .call(
                "set_note",
                json!({"key": "k", "value": "v", "tags": ["ci", 5]}),
            )
            .await,
    );
    assert!(
        message.contains("`tags[1]` got 5; it takes a string"),
        "{message}"
    );
    assert_eq!(count(&app, "notes").await, 0);
    let message = refused(
        alice
            .call(
                "post_message",
                json!({"to": "bob", "body": "log", "attachments": [
                    {"filename": "a.log", "content_type": "text/plain", "data_base64": "", "size": 0}
                ]}),
            )
            .await,
    );
    assert!(
        message.contains("`attachments[0].size` is not a field of `attachments[0]`"),
        "{message}"
    );
    let inbox = bob
        .call("read_messages", json!({"scope": "inbox"}))
        .await
        .unwrap();
    assert_eq!(inbox["messages"], json!([]), "{inbox}");

    // A UUID argument that is not one, and null for an argument with a default.
    let message = refused(
        alice
            .call("ack_message", json!({"message_id": "m-1"}))
            .await,
    );
    assert!(
        message.contains("`message_id` got the string \"m-1\", which is not a UUID"),
        "{message}"
    );
    let message = refused(
        alice
            .call("read_messages", json!({"all_sessions": null}))
            .await,
    );
    assert!(
        message.contains(
            "`all_sessions` got null; it takes true or false (leave it out for the default, false)"
        ),
        "{message}"
    );
}

#[tokio::test]
async fn a_scope_that_is_not_valid_is_quoted_as_text_not_as_rust() {
    let app = spawn_app().await;
    let (alice, _bob) = team(&app).await;
    let scope = "s".repeat(100);
    let message = refused(
        alice
            .call(
                "set_note",
                json!({"key": "k", "value": "v", "scope": scope}),
            )
            .await,
    );
    // Quoted as text, cut after its first 40 characters: no `Some(…)`.
    assert!(
        message.contains(&format!("scope \"{}…\" is not valid", &scope[..40])),
        "{message}"
    );
    assert!(!message.contains("Some("), "{message}");
    assert_eq!(count(&app, "notes").await, 0);
}

#[tokio::test]
async fn an_unknown_tool_is_a_json_rpc_error_naming_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let (status, _, body) = answer(
        post(&app, &token, call(9, "delete_everything", json!({})))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (id, code, message) = jsonrpc(&body);
    assert_eq!((id, code), (&json!(9), -32602), "{body}");
    assert!(
        message.contains("no tool named `delete_everything`") && message.contains("tools/list"),
        "{message}"
    );
}
