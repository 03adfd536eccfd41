//! The envelope of a JSON-RPC message, read in one pass for the checks of
//! [`super::check_body`]: `jsonrpc`, `id`, `method`, and of `params` its
//! shape, a tool's `name`, the shape of `arguments` and whether `_meta`
//! names a protocol version. Short strings are kept; long ones, and the
//! contents of arrays and objects (the arguments above all), are skipped
//! without being copied, so reading an 8 MiB message allocates next to
//! nothing. Any JSON value is accepted: what is wrong with the message is
//! [`Message::problem`]'s to say, in words a model can act on.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};

use super::{EXAMPLE, INVALID_PARAMS, INVALID_REQUEST};

const PROTOCOL_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";

/// The longest string kept from the envelope (`id`, `method`, a tool name);
/// longer ones are only known to be long.
const KEPT_STRING_BYTES: usize = 256;

/// The scalar visits of a visitor, each turned into a [`Shape`] and then `$wrap`.
macro_rules! forward_scalars {
    (|$shape:ident| $wrap:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            ShapeVisitor.visit_unit().map(|$shape| $wrap)
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            ShapeVisitor.visit_bool(v).map(|$shape| $wrap)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            ShapeVisitor.visit_i64(v).map(|$shape| $wrap)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            ShapeVisitor.visit_u64(v).map(|$shape| $wrap)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            ShapeVisitor.visit_f64(v).map(|$shape| $wrap)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            ShapeVisitor.visit_str(v).map(|$shape| $wrap)
        }
    };
}

/// The top level of a body.
pub(super) enum Top {
    Message(Box<Message>),
    Batch(usize),
    Other(Shape),
}

/// The fields of a message the gate checks; the rest is skipped unread.
#[derive(Default)]
pub(super) struct Message {
    jsonrpc: Option<Shape>,
    id: Option<Shape>,
    pub(super) method: Option<Shape>,
    params: Option<Params>,
    answers: bool,
}

/// `params`: its shape, and what a `tools/call` and rmcp's version check need.
#[derive(Default)]
struct Params {
    is_object: bool,
    shape: Option<Shape>,
    name: Option<Shape>,
    arguments: Option<Shape>,
    names_version: bool,
    /// What `initialize` must carry: `protocolVersion`, `capabilities`, `clientInfo`.
    protocol_version: Option<Shape>,
    capabilities: Option<Shape>,
    client_info: Option<Shape>,
}

/// A JSON value as far as a message needs it: short strings kept, the
/// contents of arrays and objects skipped.
#[derive(Clone, PartialEq, Debug)]
pub(super) enum Shape {
    Null,
    Bool(bool),
    Integer(i64),
    /// A number that is not an `i64` (a fraction, or beyond its range).
    OtherNumber(String),
    Str(String),
    LongStr,
    Array(usize),
    Object,
}

impl Shape {
    pub(super) fn describe(&self) -> String {
        match self {
            Shape::Null => "null".to_string(),
            Shape::Bool(b) => format!("the boolean {b}"),
            Shape::Integer(n) => format!("the number {n}"),
            Shape::OtherNumber(n) => format!("the number {n}"),
            Shape::Str(s) => format!("the string {}", quoted(s)),
            Shape::LongStr => "a long string".to_string(),
            Shape::Array(0) => "an empty array".to_string(),
            Shape::Array(n) => format!("an array of {n} entries"),
            Shape::Object => "an object".to_string(),
        }
    }
}

/// A string for a message: JSON-quoted, cut at 60 characters.
fn quoted(s: &str) -> String {
    let cut: String = s.chars().take(60).collect();
    let ellipsis = if cut.len() < s.len() { "…" } else { "" };
    format!("{}{ellipsis}", Value::String(cut))
}

impl Message {
    /// The id to echo: a string or an integer, as JSON-RPC allows.
    pub(super) fn usable_id(&self) -> Value {
        match &self.id {
            Some(Shape::Integer(n)) => json!(n),
            Some(Shape::Str(s)) => json!(s),
            _ => Value::Null,
        }
    }

    /// The tool a `tools/call` names, when it is a short string.
    pub(super) fn tool_name(&self) -> Option<&str> {
        match (
            &self.method,
            self.params.as_ref().and_then(|p| p.name.as_ref()),
        ) {
            (Some(Shape::Str(method)), Some(Shape::Str(name))) if method == "tools/call" => {
                Some(name)
            }
            _ => None,
        }
    }

    pub(super) fn names_its_version(&self) -> bool {
        self.params.as_ref().is_some_and(|p| p.names_version)
    }

    /// The first thing wrong with the envelope: a JSON-RPC code and a message.
    pub(super) fn problem(&self) -> Option<(i64, String)> {
        match &self.jsonrpc {
            Some(Shape::Str(v)) if v == "2.0" => {}
            other => {
                let got = other
                    .as_ref()
                    .map_or_else(|| "nothing".to_string(), Shape::describe);
                return Some((
                    INVALID_REQUEST,
                    format!(
                        "`jsonrpc` must be the string \"2.0\"; the message has {got}. Every \
                         message carries it, e.g. {EXAMPLE}."
                    ),
                ));
            }
        }
        match &self.id {
            None | Some(Shape::Integer(_) | Shape::Str(_)) => {}
            Some(other) => {
                return Some((
                    INVALID_REQUEST,
                    format!(
                        "`id` must be a string or an integer (MCP allows no null id); the \
                         message has {}. Use a number that counts your requests, e.g. \"id\": 1.",
                        other.describe()
                    ),
                ));
            }
        }
        let method = match &self.method {
            Some(Shape::Str(method)) => method.as_str(),
            Some(other) => {
                return Some((
                    INVALID_REQUEST,
                    format!(
                        "`method` must be a string naming the method, such as \"tools/call\"; \
                         the message has {}.",
                        other.describe()
                    ),
                ));
            }
            None if self.answers => return None,
            None => {
                return Some((
                    INVALID_REQUEST,
                    format!(
                        "the message has no `method` (and is no answer, which would carry \
                         `result` or `error`). A request names its method, e.g. {EXAMPLE}."
                    ),
                ));
            }
        };
        if let Some(params) = &self.params
            && !params.is_object
        {
            let got = params
                .shape
                .as_ref()
                .map_or_else(|| "something else".to_string(), Shape::describe);
            return Some((
                INVALID_PARAMS,
                format!(
                    "`params` must be an object (MCP names its parameters); the message has \
                     {got}. E.g. {EXAMPLE}."
                ),
            ));
        }
        if method == "initialize" {
            // rmcp reads an initialize it cannot parse as some other request and
            // answers "method not found"; name the missing field instead.
            return initialize_problem(self.params.as_ref());
        }
        if method == "tools/call" {
            let Some(params) = &self.params else {
                return Some((
                    INVALID_PARAMS,
                    format!("tools/call needs `params` naming the tool, e.g. {EXAMPLE}."),
                ));
            };
            match &params.name {
                Some(Shape::Str(_)) => {}
                other => {
                    let got = other
                        .as_ref()
                        .map_or_else(|| "no `name`".to_string(), Shape::describe);
                    return Some((
                        INVALID_PARAMS,
                        format!(
                            "tools/call needs `params.name`, the tool's name as a string; the \
                             message has {got}. tools/list names the tools, e.g. {EXAMPLE}."
                        ),
                    ));
                }
            }
            match &params.arguments {
                None | Some(Shape::Null | Shape::Object) => {}
                Some(other) => {
                    return Some((
                        INVALID_PARAMS,
                        format!(
                            "`params.arguments` must be an object mapping each argument's name \
                             to its value, e.g. {{\"key\": \"deploy\"}}; the message has {}.",
                            other.describe()
                        ),
                    ));
                }
            }
        }
        None
    }
}

/// What is wrong with an `initialize` request's params, if anything.
fn initialize_problem(params: Option<&Params>) -> Option<(i64, String)> {
    let empty = Params::default();
    let params = params.unwrap_or(&empty);
    let fields = [
        ("protocolVersion", &params.protocol_version, "a string"),
        ("capabilities", &params.capabilities, "an object"),
        ("clientInfo", &params.client_info, "an object"),
    ];
    for (field, shape, wanted) in fields {
        let fits = match (field, shape) {
            ("protocolVersion", Some(Shape::Str(_) | Shape::LongStr)) => true,
            ("protocolVersion", _) => false,
            (_, Some(Shape::Object)) => true,
            _ => false,
        };
        if !fits {
            let got = shape
                .as_ref()
                .map_or_else(|| "nothing".to_string(), Shape::describe);
            return Some((
                INVALID_PARAMS,
                format!(
                    "initialize needs `params.{field}`, {wanted}; the message has {got}. E.g.                      {INITIALIZE_EXAMPLE}."
                ),
            ));
        }
    }
    None
}

const INITIALIZE_EXAMPLE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"my-agent","version":"1.0"}}}"#;

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TopVisitor;
        impl<'de> Visitor<'de> for TopVisitor {
            type Value = Top;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
                let mut message = Message::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "jsonrpc" => message.jsonrpc = Some(map.next_value()?),
                        "id" => message.id = Some(map.next_value()?),
                        "method" => message.method = Some(map.next_value()?),
                        "params" => message.params = Some(map.next_value()?),
                        "result" | "error" => {
                            map.next_value::<IgnoredAny>()?;
                            message.answers = true;
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Top::Message(Box::new(message)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top, A::Error> {
                ShapeVisitor.visit_seq(seq).map(|shape| match shape {
                    Shape::Array(n) => Top::Batch(n),
                    other => Top::Other(other),
                })
            }
            forward_scalars!(|shape| Top::Other(shape));
        }
        deserializer.deserialize_any(TopVisitor)
    }
}

impl<'de> Deserialize<'de> for Params {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ParamsVisitor;
        impl<'de> Visitor<'de> for ParamsVisitor {
            type Value = Params;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Params, A::Error> {
                let mut params = Params {
                    is_object: true,
                    ..Params::default()
                };
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => params.name = Some(map.next_value()?),
                        "arguments" => params.arguments = Some(map.next_value()?),
                        "protocolVersion" => params.protocol_version = Some(map.next_value()?),
                        "capabilities" => params.capabilities = Some(map.next_value()?),
                        "clientInfo" => params.client_info = Some(map.next_value()?),
                        "_meta" => params.names_version = map.next_value::<NamesVersion>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(params)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Params, A::Error> {
                ShapeVisitor.visit_seq(seq).map(Params::not_an_object)
            }
            forward_scalars!(|shape| Params::not_an_object(shape));
        }
        deserializer.deserialize_any(ParamsVisitor)
    }
}

impl Params {
    fn not_an_object(shape: Shape) -> Params {
        Params {
            shape: Some(shape),
            ..Params::default()
        }
    }
}

/// Whether `params._meta` carries a protocol version (a string), which lets
/// rmcp accept an unknown version header and answer the request itself.
struct NamesVersion(bool);

impl<'de> Deserialize<'de> for NamesVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MetaVisitor;
        impl<'de> Visitor<'de> for MetaVisitor {
            type Value = NamesVersion;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NamesVersion, A::Error> {
                let mut names = false;
                while let Some(key) = map.next_key::<String>()? {
                    if key == PROTOCOL_VERSION_META {
                        names = matches!(map.next_value()?, Shape::Str(_) | Shape::LongStr);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(NamesVersion(names))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<NamesVersion, A::Error> {
                ShapeVisitor.visit_seq(seq).map(|_| NamesVersion(false))
            }
            forward_scalars!(|_shape| NamesVersion(false));
        }
        deserializer.deserialize_any(MetaVisitor)
    }
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ShapeVisitor)
    }
}

struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Shape, E> {
        Ok(Shape::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Shape, E> {
        Ok(Shape::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Shape, E> {
        Ok(Shape::Integer(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Shape, E> {
        Ok(i64::try_from(v).map_or_else(|_| Shape::OtherNumber(v.to_string()), Shape::Integer))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Shape, E> {
        Ok(Shape::OtherNumber(v.to_string()))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Shape, E> {
        Ok(if v.len() <= KEPT_STRING_BYTES {
            Shape::Str(v.to_string())
        } else {
            Shape::LongStr
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let mut count = 0;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            count += 1;
        }
        Ok(Shape::Array(count))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Shape::Object)
    }
}
