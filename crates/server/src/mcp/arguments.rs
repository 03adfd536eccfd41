//! A tool call's arguments checked against the tool's input schema before the
//! tool runs, so a wrong type, a number out of range, an unknown or a missing
//! argument is the bus's usual refusal naming the argument, what it got and
//! what it takes, for every tool at once, instead of serde's text
//! (`invalid type: string "5", expected i64`).
//!
//! The schemas are the ones schemars derives from the argument structs and
//! `tools/list` shows: an object with `properties`, `required`,
//! `additionalProperties: false` (from `deny_unknown_fields`), properties
//! typed `integer` (with a `format` such as `int64` or `uint64`), `string`
//! (`format: uuid`), `boolean`, `array` (with `items`), `object` (nested, or
//! via `$ref` into `$defs`), nullable by a type array holding `"null"`.
//!
//! Only what deserialisation itself would refuse is checked here (types,
//! integer ranges of the format, UUID syntax, unknown and missing fields), so
//! the check never refuses a call the tool would have taken: value rules
//! (lengths, ranges such as 30..86400, the statuses a schema lists) stay with
//! the store, which explains its own refusals. Anything this misses still
//! fails in deserialisation, and [`schema_summary`] words that refusal.
//!
//! Past 700 lines because of its tests: the check itself ends before the
//! first test module; the second (`every_tool`) runs the check against every
//! tool's real schema, which only this module's private functions can do.
//!
//! Size: about 460 lines of code (one schema walk) and 330 of unit tests.

use serde_json::{Map, Value};

/// At most this many problems are named in one refusal.
const PROBLEMS_MAX: usize = 8;

/// Keys and strings are shown up to this many characters.
const SHOWN_CHARS: usize = 60;

/// `Err` with the whole refusal message when `arguments` do not fit `schema`.
pub fn check(
    tool: &str,
    schema: &Map<String, Value>,
    arguments: Option<&Map<String, Value>>,
) -> Result<(), String> {
    let empty = Map::new();
    let mut checker = Checker {
        tool,
        root: schema,
        problems: Vec::new(),
    };
    checker.object(&Path::Root, schema, arguments.unwrap_or(&empty));
    if checker.problems.is_empty() {
        return Ok(());
    }
    let total = checker.problems.len();
    let mut named: Vec<String> = checker.problems.into_iter().take(PROBLEMS_MAX).collect();
    if total > PROBLEMS_MAX {
        named.push(format!("({} more not named here.)", total - PROBLEMS_MAX));
    }
    Err(format!(
        "{tool} was not run: its arguments do not fit what it takes. {} {} Nothing was done; \
         call it again with the arguments fixed.",
        named.join(" "),
        schema_summary(tool, schema)
    ))
}

/// `tool takes key (required), title (required), description.`: the
/// arguments a tool takes, for a refusal.
pub fn schema_summary(tool: &str, schema: &Map<String, Value>) -> String {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return format!("{tool} takes no arguments.");
    };
    if properties.is_empty() {
        return format!("{tool} takes no arguments.");
    }
    let required = required_of(schema);
    let (needed, optional): (Vec<&str>, Vec<&str>) = properties
        .keys()
        .map(String::as_str)
        .partition(|name| required.contains(name));
    let mut parts = Vec::new();
    if !needed.is_empty() {
        parts.push(format!("{} (required)", needed.join(", ")));
    }
    if !optional.is_empty() {
        parts.push(format!("optional: {}", optional.join(", ")));
    }
    format!(
        "{tool} takes {}; tools/list describes each.",
        parts.join("; ")
    )
}

/// Where a value sits in the arguments: `depends_on[2]`, `attachments[0].filename`.
enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn render(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Field(Path::Root, name) => shown_key(name),
            Path::Field(parent, name) => format!("{}.{}", parent.render(), shown_key(name)),
            Path::Index(parent, index) => format!("{}[{index}]", parent.render()),
        }
    }
}

/// A key as written, or JSON-quoted when it is not a plain name; cut short.
fn shown_key(name: &str) -> String {
    let cut: String = name.chars().take(SHOWN_CHARS).collect();
    let plain = !cut.is_empty()
        && cut
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let ellipsis = if cut.len() < name.len() { "…" } else { "" };
    if plain {
        format!("{cut}{ellipsis}")
    } else {
        format!("{}{ellipsis}", Value::String(cut))
    }
}

struct Checker<'s> {
    tool: &'s str,
    root: &'s Map<String, Value>,
    problems: Vec<String>,
}

impl<'s> Checker<'s> {
    /// The schema `node` stands for, its `$ref` followed.
    fn resolve(&self, node: &'s Value) -> &'s Value {
        let mut node = node;
        for _ in 0..8 {
            let Some(target) = node.get("$ref").and_then(Value::as_str) else {
                break;
            };
            let Some(name) = target.strip_prefix("#/$defs/") else {
                break;
            };
            match self.root.get("$defs").and_then(|defs| defs.get(name)) {
                Some(found) => node = found,
                None => break,
            }
        }
        node
    }

    fn object(&mut self, path: &Path, schema: &'s Map<String, Value>, given: &Map<String, Value>) {
        let properties = schema.get("properties").and_then(Value::as_object);
        let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
        for name in required_of(schema) {
            if !given.contains_key(name) {
                let node = properties.and_then(|p| p.get(name)).unwrap_or(&Value::Null);
                let node = self.resolve(node);
                let here = Path::Field(path, name).render();
                self.problems.push(format!(
                    "`{here}` is missing; it is required: {}.{}",
                    accepts(self, node),
                    about(node)
                ));
            }
        }
        for (name, value) in given {
            match properties.and_then(|p| p.get(name)) {
                Some(node) => self.value(&Path::Field(path, name), node, value),
                None if closed => {
                    let here = Path::Field(path, name).render();
                    let known: Vec<&str> = properties
                        .map(|p| p.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    let guess = closest(name, &known)
                        .map(|k| format!(" Did you mean `{k}`?"))
                        .unwrap_or_default();
                    let owner = match path {
                        Path::Root => format!("an argument {} takes", self.tool),
                        _ => format!("a field of `{}`", path.render()),
                    };
                    self.problems
                        .push(format!("`{here}` is not {owner}.{guess}"));
                }
                None => {}
            }
        }
    }

    fn value(&mut self, path: &Path, node: &'s Value, value: &Value) {
        let node = self.resolve(node);
        let Some(schema) = node.as_object() else {
            return; // `true`: anything
        };
        if let Some(branches) = schema
            .get("anyOf")
            .or_else(|| schema.get("oneOf"))
            .and_then(Value::as_array)
        {
            let fits = branches.iter().any(|branch| {
                let mut trial = Checker {
                    tool: self.tool,
                    root: self.root,
                    problems: Vec::new(),
                };
                trial.value(path, branch, value);
                trial.problems.is_empty()
            });
            if !fits {
                self.mismatch(path, node, value);
            }
            return;
        }
        let types = types_of(node);
        if !types.is_empty() && !types.iter().any(|t| is_of_type(value, t)) {
            self.mismatch(path, node, value);
            return;
        }
        match value {
            Value::Number(number) if types.contains(&"integer") => {
                let n = number
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| number.as_u64().map(i128::from));
                let (low, high) = integer_bounds(node);
                if n.is_some_and(|n| n < low || n > high) {
                    let here = path.render();
                    self.problems.push(format!(
                        "`{here}` got {number}, which is out of range: it takes {}.{}",
                        accepts(self, node),
                        about(node)
                    ));
                }
            }
            Value::String(text)
                if format_of(node) == Some("uuid") && uuid::Uuid::parse_str(text).is_err() =>
            {
                let here = path.render();
                self.problems.push(format!(
                    "`{here}` got {}, which is not a UUID: it takes {}.{}",
                    got(value),
                    accepts(self, node),
                    about(node)
                ));
            }
            Value::Array(items) => {
                if let Some(item) = schema.get("items") {
                    for (index, entry) in items.iter().enumerate() {
                        self.value(&Path::Index(path, index), item, entry);
                        if self.problems.len() > PROBLEMS_MAX {
                            return;
                        }
                    }
                }
            }
            Value::Object(fields) if schema.contains_key("properties") => {
                self.object(path, schema, fields);
            }
            _ => {}
        }
    }

    fn mismatch(&mut self, path: &Path, node: &Value, value: &Value) {
        let here = path.render();
        self.problems.push(format!(
            "`{here}` got {}; it takes {}.{}",
            got(value),
            accepts(self, node),
            about(node)
        ));
    }
}

fn required_of(schema: &Map<String, Value>) -> Vec<&str> {
    schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn types_of(node: &Value) -> Vec<&str> {
    match node.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn format_of(node: &Value) -> Option<&str> {
    node.get("format").and_then(Value::as_str)
}

/// Whether `value` is of JSON Schema type `kind`, as deserialisation sees
/// it: `5.0` is no integer to serde, so it is none here either.
fn is_of_type(value: &Value, kind: &str) -> bool {
    match (kind, value) {
        ("null", Value::Null)
        | ("boolean", Value::Bool(_))
        | ("number", Value::Number(_))
        | ("string", Value::String(_))
        | ("array", Value::Array(_))
        | ("object", Value::Object(_)) => true,
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// The integers a `format` holds (schemars names Rust's integer widths).
fn integer_bounds(node: &Value) -> (i128, i128) {
    let signed = |bits: u32| (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1);
    let unsigned = |bits: u32| (0, (1i128 << bits) - 1);
    match format_of(node) {
        Some("int8") => signed(8),
        Some("int16") => signed(16),
        Some("int32") => signed(32),
        Some("int64" | "int") => signed(64),
        Some("uint8") => unsigned(8),
        Some("uint16") => unsigned(16),
        Some("uint32") => unsigned(32),
        Some("uint64" | "uint") => unsigned(64),
        _ => (i128::from(i64::MIN), i128::from(u64::MAX)),
    }
}

/// What a value was, for a refusal: `the string "5"`, `-1`, `a list of 3 entries`.
fn got(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let cut: String = s.chars().take(SHOWN_CHARS).collect();
            let ellipsis = if cut.len() < s.len() { "…" } else { "" };
            format!("the string {}{ellipsis}", Value::String(cut))
        }
        Value::Array(items) if items.is_empty() => "an empty list".to_string(),
        Value::Array(items) => format!("a list of {} entries", items.len()),
        Value::Object(_) => "an object".to_string(),
    }
}

/// What a schema takes, in words: `an integer of 0 or more, or null (the
/// same as leaving it out)`.
fn accepts(checker: &Checker, node: &Value) -> String {
    let node = checker.resolve(node);
    let types = types_of(node);
    let nullable = types.contains(&"null");
    let mut kinds: Vec<String> = types
        .iter()
        .filter(|t| **t != "null")
        .map(|t| one_kind(checker, node, t))
        .collect();
    if kinds.is_empty() {
        if let Some(branches) = node
            .get("anyOf")
            .or_else(|| node.get("oneOf"))
            .and_then(Value::as_array)
        {
            kinds = branches.iter().map(|b| accepts(checker, b)).collect();
        } else if !nullable {
            kinds.push("any JSON value".to_string());
        }
    }
    let mut words = kinds.join(" or ");
    if nullable {
        words.push_str(if words.is_empty() {
            "null"
        } else {
            ", or null (the same as leaving it out)"
        });
    }
    if let Some(default) = node.get("default") {
        words.push_str(&format!(" (leave it out for the default, {default})"));
    }
    words
}

fn one_kind(checker: &Checker, node: &Value, kind: &str) -> String {
    match kind {
        "integer" => match integer_bounds(node) {
            (0, high) if high >= i128::from(i64::MAX) => "an integer of 0 or more".to_string(),
            (low, high) if low <= i128::from(i64::MIN) && high >= i128::from(i64::MAX) => {
                "an integer".to_string()
            }
            (low, high) => format!("an integer from {low} to {high}"),
        },
        "number" => "a number".to_string(),
        "string" => {
            let listed: Vec<String> = node
                .get("enum")
                .and_then(Value::as_array)
                .map(|e| {
                    e.iter()
                        .filter_map(Value::as_str)
                        .map(|s| format!("`{s}`"))
                        .collect()
                })
                .unwrap_or_default();
            if !listed.is_empty() {
                format!("a string, one of {}", listed.join(", "))
            } else if format_of(node) == Some("uuid") {
                "a UUID, a string such as \"0190c4f2-7c1e-7a3b-9f00-1234567890ab\"".to_string()
            } else {
                "a string".to_string()
            }
        }
        "boolean" => "true or false".to_string(),
        "array" => match node.get("items") {
            Some(items) => format!("a list, each entry {}", accepts(checker, items)),
            None => "a list".to_string(),
        },
        "object" => match node.get("properties").and_then(Value::as_object) {
            Some(fields) if !fields.is_empty() => {
                let names: Vec<&str> = fields.keys().map(String::as_str).collect();
                format!("an object with the fields {}", names.join(", "))
            }
            _ => "a JSON object".to_string(),
        },
        other => format!("a JSON {other}"),
    }
}

/// The property's own description, when it has one, to end a problem with.
fn about(node: &Value) -> String {
    let Some(description) = node.get("description").and_then(Value::as_str) else {
        return String::new();
    };
    let mut text = description.split_whitespace().collect::<Vec<_>>().join(" ");
    if !text.ends_with('.') {
        text.push('.');
    }
    format!(" Its description: {text}")
}

/// The known name `unknown` was most likely meant to be: at most two edits
/// away ignoring case, or the start of it (`depends` for `depends_on`).
fn closest<'k>(unknown: &str, known: &[&'k str]) -> Option<&'k str> {
    if unknown.chars().count() > SHOWN_CHARS {
        return None;
    }
    let unknown = unknown.to_lowercase();
    known
        .iter()
        .filter_map(|k| {
            let lower = k.to_lowercase();
            let distance = edit_distance(&unknown, &lower);
            let prefix =
                unknown.len() >= 4 && (lower.starts_with(&unknown) || unknown.starts_with(&lower));
            (distance <= 2 || prefix).then_some((distance, *k))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(previous + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A schema as schemars writes them for the bus's argument structs.
    fn schema() -> Map<String, Value> {
        json!({
            "$defs": {"FileArg": {
                "additionalProperties": false,
                "properties": {
                    "filename": {"type": "string"},
                    "data_base64": {"type": "string"}
                },
                "required": ["filename", "data_base64"],
                "type": "object"
            }},
            "additionalProperties": false,
            "properties": {
                "key": {"description": "The task's key.", "type": "string"},
                "lease_seconds": {
                    "description": "Lease length in seconds, 30..86400 (default 900).",
                    "format": "int64", "type": ["integer", "null"]
                },
                "timeout_seconds": {"format": "uint64", "minimum": 0, "type": ["integer", "null"]},
                "hours": {"format": "int32", "type": ["integer", "null"]},
                "message_id": {"format": "uuid", "type": ["string", "null"]},
                "depends_on": {"items": {"type": "string"}, "type": ["array", "null"]},
                "announce": {"default": false, "type": "boolean"},
                "attachments": {"items": {"$ref": "#/$defs/FileArg"}, "type": "array"},
                "metadata": {"description": "Anything."}
            },
            "required": ["key"],
            "type": "object"
        })
        .as_object()
        .unwrap()
        .clone()
    }

    fn refusal(arguments: Value) -> String {
        check("claim_task", &schema(), arguments.as_object()).expect_err("refused")
    }

    fn assert_no_rust(message: &str) {
        for rust in [
            "Some(",
            "None",
            "i64",
            "u64",
            "i32",
            "invalid type",
            "expected",
            "struct",
            "Option",
            "Vec<",
            "String",
        ] {
            assert!(!message.contains(rust), "`{rust}` in: {message}");
        }
    }

    #[test]
    fn fitting_arguments_pass() {
        let args = json!({
            "key": "k", "lease_seconds": null, "timeout_seconds": 5, "hours": -3,
            "message_id": "0190c4f2-7c1e-7a3b-9f00-1234567890ab", "depends_on": ["a"],
            "announce": true, "attachments": [{"filename": "f", "data_base64": ""}],
            "metadata": {"deep": [1, {"x": null}]}
        });
        assert_eq!(check("claim_task", &schema(), args.as_object()), Ok(()));
    }

    #[test]
    fn a_string_for_an_integer_names_the_argument_what_it_got_and_what_it_takes() {
        let message = refusal(json!({"key": "k", "lease_seconds": "5"}));
        assert!(
            message.contains(
                "`lease_seconds` got the string \"5\"; it takes an integer, or null (the same as \
                 leaving it out). Its description: Lease length in seconds, 30..86400 (default \
                 900)."
            ),
            "{message}"
        );
        assert!(message.starts_with("claim_task was not run"), "{message}");
        assert!(
            message.contains("claim_task takes key (required); optional: announce, "),
            "{message}"
        );
        assert_no_rust(&message);
    }

    #[test]
    fn out_of_range_numbers_are_named_with_the_range() {
        let message = refusal(json!({"key": "k", "timeout_seconds": -1}));
        assert!(
            message.contains(
                "`timeout_seconds` got -1, which is out of range: it takes an integer of 0 or more"
            ),
            "{message}"
        );
        let message = refusal(json!({"key": "k", "hours": 3_000_000_000u64}));
        assert!(
            message.contains("an integer from -2147483648 to 2147483647"),
            "{message}"
        );
        let message = refusal(json!({"key": "k", "lease_seconds": 9_223_372_036_854_775_808u64}));
        assert!(message.contains("out of range"), "{message}");
        let message = refusal(json!({"key": "k", "lease_seconds": 5.0}));
        assert!(
            message.contains("`lease_seconds` got 5.0; it takes an integer"),
            "{message}"
        );
        assert_no_rust(&message);
    }

    #[test]
    fn unknown_and_missing_arguments_are_named() {
        let message = refusal(json!({"lease_secnds": 60}));
        assert!(
            message.contains(
                "`key` is missing; it is required: a string. Its description: The task's key."
            ),
            "{message}"
        );
        assert!(
            message.contains(
                "`lease_secnds` is not an argument claim_task takes. Did you mean `lease_seconds`?"
            ),
            "{message}"
        );
        assert_no_rust(&message);
    }

    #[test]
    fn entries_of_lists_and_nested_objects_are_named_by_their_path() {
        let message = refusal(json!({
            "key": "k",
            "depends_on": ["a", 7],
            "attachments": [{"filename": "f", "data_base64": "", "size": 3}, {"filename": 1}],
            "message_id": "not-a-uuid",
            "announce": null
        }));
        for expected in [
            "`depends_on[1]` got 7; it takes a string.",
            "`attachments[0].size` is not a field of `attachments[0]`.",
            "`attachments[1].filename` got 1; it takes a string.",
            "`attachments[1].data_base64` is missing",
            "`message_id` got the string \"not-a-uuid\", which is not a UUID",
            "`announce` got null; it takes true or false (leave it out for the default, false).",
        ] {
            assert!(message.contains(expected), "{expected} not in: {message}");
        }
        assert_no_rust(&message);
    }

    #[test]
    fn a_tool_without_arguments_says_so() {
        let schema = json!({"additionalProperties": false, "type": "object"});
        let message = check(
            "whoami",
            schema.as_object().unwrap(),
            json!({"pad": 1}).as_object(),
        )
        .unwrap_err();
        assert!(
            message.contains("`pad` is not an argument whoami takes."),
            "{message}"
        );
        assert!(message.contains("whoami takes no arguments."), "{message}");
        let open = json!({"properties": {}, "type": "object"});
        assert_eq!(
            check(
                "status",
                open.as_object().unwrap(),
                json!({"x": 1}).as_object()
            ),
            Ok(())
        );
    }

    #[test]
    fn many_problems_are_capped() {
        let mut args = json!({"key": "k"});
        for i in 0..20 {
            args[format!("extra{i}")] = json!(i);
        }
        let message = refusal(args);
        assert!(message.contains("(12 more not named here.)"), "{message}");
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(
            closest("Lease_Seconds", &["lease_seconds", "key"]),
            Some("lease_seconds")
        );
        assert_eq!(closest("zzz", &["lease_seconds", "key"]), None);
        assert_eq!(
            closest("depends", &["depends_on", "description"]),
            Some("depends_on")
        );
        assert_eq!(
            closest("desc", &["depends_on", "description"]),
            Some("description")
        );
    }
}

/// The check against the bus's own 59 tools.
#[cfg(test)]
mod every_tool {
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
        assert_eq!(tools.len(), 59);
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
}
