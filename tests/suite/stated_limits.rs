//! What a tool's description says about a number is what its schema and the
//! server do. A model reads `1..300 s (default 50)` in a description and
//! `minimum`/`maximum`/`default` in the schema; both are written by hand, so
//! a guard compares them for every tool, and calls each tool over real HTTP
//! just outside every stated range to see the server refuse it.
//!
//! Stated forms read: a range `A..B` or `A..=B`, a bound `<= B`, a default
//! `default N`, and a conditional default `(N on a window's first …)`. The
//! last has no schema `default` (an omitted value later keeps the current
//! one), which is checked too; `heartbeat`'s own behaviour is checked in
//! [`a_first_heartbeat_without_ttl_gets_the_stated_ttl`].

use serde_json::{Map, Value, json};

use crate::support::spawn_app;

/// The numbers a description states.
#[derive(Debug, Default, PartialEq)]
struct Stated {
    min: Option<i64>,
    max: Option<i64>,
    default: Option<i64>,
    /// `(N on a … first …)`: a default for a first call only.
    first_default: Option<i64>,
}

/// The leading decimal number of `text`, if it starts with one.
fn number_at(text: &str) -> Option<i64> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Every number stated in `description`, by the forms this module reads.
fn stated(description: &str) -> Stated {
    let mut found = Stated::default();
    let bytes = description.as_bytes();
    for (at, _) in description.match_indices("..") {
        // The number before `..` must end right there and start at a word edge.
        let before: String = description[..at]
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let start = at - before.len();
        if before.is_empty() || (start > 0 && bytes[start - 1].is_ascii_alphanumeric()) {
            continue;
        }
        let rest = &description[at + 2..];
        let rest = rest.strip_prefix('=').unwrap_or(rest);
        if let (Ok(min), Some(max)) = (before.parse(), number_at(rest)) {
            found.min = Some(min);
            found.max = Some(max);
        }
    }
    if let Some(at) = description.find("<= ") {
        found.max = found.max.or(number_at(&description[at + 3..]));
    }
    if let Some(at) = description.find("default ") {
        found.default = number_at(&description[at + "default ".len()..]);
    }
    for (at, _) in description.match_indices('(') {
        let inner = &description[at + 1..];
        let Some(n) = number_at(inner) else { continue };
        let after = &inner[n.to_string().len()..];
        let clause = after.split([')', ';']).next().unwrap_or_default();
        if after.starts_with(" on a") && clause.contains("first") {
            found.first_default = Some(n);
        }
    }
    found
}

/// A tool's properties as its schema lists them.
fn properties_of(tool: &rmcp::model::Tool) -> Map<String, Value> {
    tool.input_schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// Integer properties of every tool: (tool, property, schema node).
fn integer_properties() -> Vec<(String, String, Map<String, Value>)> {
    let mut out = Vec::new();
    for tool in ai_crew_sync::mcp::BusServer::tool_list() {
        for (name, node) in properties_of(&tool) {
            let node = node.as_object().cloned().unwrap_or_default();
            let integer = match &node.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer"),
                _ => false,
            };
            if integer {
                out.push((tool.name.to_string(), name, node));
            }
        }
    }
    out
}

#[test]
fn the_forms_are_read() {
    assert_eq!(
        stated("How long to wait, 1..300 s (default 50: under the ~60 s)."),
        Stated {
            min: Some(1),
            max: Some(300),
            default: Some(50),
            first_default: None
        }
    );
    assert_eq!(
        stated("1..=200, default 50."),
        Stated {
            min: Some(1),
            max: Some(200),
            default: Some(50),
            first_default: None
        }
    );
    assert_eq!(
        stated("30..86400 (600 on a window's first heartbeat; omit later)").first_default,
        Some(600)
    );
    assert_eq!(stated("a name (<= 64 bytes)").max, Some(64));
    assert_eq!(stated("`agent/w2` or v1..x"), Stated::default());
}

#[test]
fn every_stated_range_and_default_is_in_the_schema() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (tool, name, node) in integer_properties() {
        let description = node
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let says = stated(description);
        let schema = |key: &str| node.get(key).and_then(Value::as_i64);
        let mut differ = |what: &str, stated: Option<i64>, schema: Option<i64>| {
            if stated.is_some() && stated != schema {
                wrong.push(format!(
                    "{tool}.{name}: the description says {what} {stated:?}, the schema {schema:?} \
                     ({description})"
                ));
            }
        };
        differ("minimum", says.min, schema("minimum"));
        differ("maximum", says.max, schema("maximum"));
        differ("default", says.default, schema("default"));
        // A schema that bounds what the description does not state is as untrue.
        for key in ["minimum", "maximum"] {
            let stated = if key == "minimum" { says.min } else { says.max };
            if stated.is_none()
                && let Some(bound) = schema(key)
                && !(key == "minimum" && bound == 0 && node.get("format") == Some(&json!("uint64")))
            {
                wrong.push(format!(
                    "{tool}.{name}: the schema has {key} {bound} the description does not state"
                ));
            }
        }
        if says.first_default.is_some() && node.contains_key("default") {
            wrong.push(format!(
                "{tool}.{name}: a default for a first call only is no schema default"
            ));
        }
        if says != Stated::default() {
            checked += 1;
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The guard reads something: if descriptions change form, it must too.
    assert!(
        checked >= 20,
        "only {checked} integer properties state a number"
    );
}

/// A tool's description (not its properties') naming a property with a
/// number says the same as the property's schema.
#[test]
fn a_tool_description_naming_a_property_states_its_schema_default() {
    let mut wrong = Vec::new();
    for tool in ai_crew_sync::mcp::BusServer::tool_list() {
        let text = tool.description.as_deref().unwrap_or_default();
        for (name, node) in &properties_of(&tool) {
            for (at, _) in text.match_indices(name.as_str()) {
                let near: String = text[at + name.len()..].chars().take(24).collect();
                let near = near.trim_start();
                let near = near.strip_prefix('(').unwrap_or(near);
                if let Some(rest) = near.strip_prefix("default ")
                    && let Some(n) = number_at(rest)
                    && node.get("default").and_then(Value::as_i64) != Some(n)
                {
                    wrong.push(format!(
                        "{}: says {name} default {n}, the schema {:?}",
                        tool.name,
                        node.get("default")
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Arguments that fit a tool's schema except for `name`, which is `value`:
/// required strings get a placeholder (a UUID where the format says so),
/// required lists one entry.
fn arguments_with(schema: &Map<String, Value>, name: &str, value: i64) -> Value {
    let properties = schema["properties"].as_object().unwrap();
    let mut args = Map::new();
    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let node = &properties[required];
        let placeholder = match (node.get("type"), node.get("format")) {
            (_, Some(f)) if f == "uuid" => json!(uuid::Uuid::now_v7()),
            (Some(t), _) if t == "array" => {
                let item = &node["items"];
                if item.get("format") == Some(&json!("uuid")) {
                    json!([uuid::Uuid::now_v7()])
                } else {
                    json!(["guard"])
                }
            }
            (Some(t), _) if t == "integer" => json!(1),
            (Some(t), _) if t == "boolean" => json!(false),
            _ => json!("guard"),
        };
        args.insert(required.to_string(), placeholder);
    }
    args.insert(name.to_string(), json!(value));
    Value::Object(args)
}

/// Over real HTTP: one past each end of every stated range is refused,
/// naming the argument, and changes nothing the caller can see.
#[tokio::test]
async fn every_stated_range_is_what_the_server_refuses_outside_of() {
    let app = spawn_app().await;
    // With conversations on, so that their tools are listed too.
    crate::conversations::team_with_conversations(&app, "acme").await;
    let token = app.agent("acme", "alice").await;
    app.agent("acme", "guard").await;
    let bus = app.mcp(&token, Some("w1")).await;
    // renew_session is a window credential's own call.
    let window = app
        .mcp(&token, None)
        .await
        .call("register_session", json!({"session": "guard-w"}))
        .await
        .unwrap();
    let window = app.mcp(window["credential"].as_str().unwrap(), None).await;
    let listed = bus.list_tool_names().await;
    let schemas: std::collections::HashMap<String, Map<String, Value>> =
        ai_crew_sync::mcp::BusServer::tool_list()
            .into_iter()
            .map(|t| (t.name.to_string(), (*t.input_schema).clone()))
            .collect();
    let mut wrong = Vec::new();
    let mut tried = 0;
    for (tool, name, node) in integer_properties() {
        assert!(listed.contains(&tool), "{tool} is not listed");
        let says = stated(node["description"].as_str().unwrap_or_default());
        let (Some(min), Some(max)) = (says.min, says.max) else {
            continue;
        };
        for outside in [min - 1, max + 1] {
            tried += 1;
            let args = arguments_with(&schemas[&tool], &name, outside);
            let caller = if tool == "renew_session" {
                &window
            } else {
                &bus
            };
            match caller.call(&tool, args.clone()).await {
                Ok(answer) => wrong.push(format!("{tool} {args}: taken: {answer}")),
                Err(refusal) => {
                    let message = refusal["message"].as_str().unwrap_or_default();
                    if !message.contains(name.as_str()) {
                        wrong.push(format!(
                            "{tool} {args}: refused without naming {name}: {message}"
                        ));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(tried >= 36, "only {tried} calls tried");
}

/// `heartbeat` says an omitted ttl is 600 on a window's first heartbeat:
/// so it is, and a later beat without one keeps the current ttl.
#[tokio::test]
async fn a_first_heartbeat_without_ttl_gets_the_stated_ttl() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let bus = app.mcp(&token, Some("w1")).await;
    let tool = ai_crew_sync::mcp::BusServer::tool_list()
        .into_iter()
        .find(|t| t.name == "heartbeat")
        .unwrap();
    let ttl = &tool.input_schema["properties"]["ttl_seconds"];
    let first = stated(ttl["description"].as_str().unwrap())
        .first_default
        .expect("heartbeat states the first beat's ttl");
    let beat = bus.call("heartbeat", json!({})).await.unwrap();
    assert_eq!(beat["ttl_seconds"], first, "{beat}");
    bus.call("heartbeat", json!({"ttl_seconds": 300}))
        .await
        .unwrap();
    let later = bus.call("heartbeat", json!({})).await.unwrap();
    assert_eq!(later["ttl_seconds"], 300, "{later}");
}
