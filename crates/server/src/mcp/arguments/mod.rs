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
//! Tests beside it: `tests.rs` (hand-written schemas) and `every_tool.rs`
//! (every tool's real schema); both reach this module's private functions.

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
mod tests;

#[cfg(test)]
mod every_tool;
