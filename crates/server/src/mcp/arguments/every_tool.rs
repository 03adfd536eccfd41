//! The check against the bus's own 65 tools.

use serde_json::json;

use super::*;

/// The keywords the check understands or may ignore; a schema using any
/// other would be checked less than it says.
const UNDERSTOOD: &[&str] = &[
    "$schema",
    "$defs",
    "$ref",
    "type",
    "format",
    "minimum",
    // Ranges a description states (the store refuses outside them, in
    // its own words); the check keeps to the format's bounds.
    "maximum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "description",
    "default",
    "enum",
    "anyOf",
    "oneOf",
    "title",
];

fn keywords_of(node: &Value, found: &mut Vec<String>) {
    let Some(schema) = node.as_object() else {
        return;
    };
    for (keyword, inner) in schema {
        found.push(keyword.clone());
        match keyword.as_str() {
            "properties" | "$defs" => {
                for sub in inner.as_object().into_iter().flat_map(|m| m.values()) {
                    keywords_of(sub, found);
                }
            }
            "items" => keywords_of(inner, found),
            "anyOf" | "oneOf" => {
                for sub in inner.as_array().into_iter().flatten() {
                    keywords_of(sub, found);
                }
            }
            _ => {}
        }
    }
}

/// A value of the wrong JSON type for a property of these types.
fn wrong_value(types: &[&str]) -> Value {
    if types.contains(&"string") {
        json!(12)
    } else {
        json!("12")
    }
}

#[test]
fn every_tool_schema_uses_only_what_the_check_understands() {
    let tools = crate::mcp::BusServer::tools().list_all();
    assert_eq!(tools.len(), 66);
    for tool in &tools {
        let mut found = Vec::new();
        keywords_of(&Value::Object((*tool.input_schema).clone()), &mut found);
        for keyword in found {
            assert!(
                UNDERSTOOD.contains(&keyword.as_str()),
                "{}: `{keyword}` is not understood by arguments::check",
                tool.name
            );
        }
    }
}

#[test]
fn every_argument_of_every_tool_is_refused_with_a_wrong_type_and_named() {
    for tool in crate::mcp::BusServer::tools().list_all() {
        let schema = &*tool.input_schema;
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let required = required_of(schema);
        // Nothing given: exactly the required arguments are missing.
        match check(&tool.name, schema, None) {
            Ok(()) => assert!(required.is_empty(), "{}", tool.name),
            Err(message) => {
                for name in &required {
                    assert!(
                        message.contains(&format!("`{name}` is missing")),
                        "{}: {message}",
                        tool.name
                    );
                }
            }
        }
        for (name, node) in &properties {
            let types = types_of(node);
            if types.is_empty() {
                continue; // any JSON value
            }
            let mut args = Map::new();
            args.insert(name.clone(), wrong_value(&types));
            let message = check(&tool.name, schema, Some(&args)).unwrap_err();
            assert!(
                message.contains(&format!("`{name}` got ")),
                "{} {name}: {message}",
                tool.name
            );
        }
    }
}
