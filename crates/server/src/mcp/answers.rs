//! Read answers that are never silently empty (issue 38 item 4): every read
//! tool's answer says when it was read (`as_of`), whether more exists
//! (`more`), and an empty list says what it means (`note`). Added beside
//! what the store answers (fields it already has are kept as they are), so
//! existing clients keep working.

use chrono::{DateTime, SecondsFormat, Utc};
use rmcp::ErrorData;
use rmcp::model::CallToolResult;
use serde::Serialize;
use serde_json::{Value, json};

use super::reply;
use acs_store::error::BusResult;

/// How one read tool's answer is completed.
pub(crate) struct Read<'a> {
    /// When the read began: everything committed before it is in the answer.
    pub as_of: DateTime<Utc>,
    /// The list field an empty answer is about (`channels`, `tasks` …).
    pub list: &'a str,
    /// What an empty list means, said to the model ("no lock is held").
    pub empty: &'a str,
}

impl<'a> Read<'a> {
    /// A read that began now.
    pub(crate) fn now(list: &'a str, empty: &'a str) -> Self {
        Read {
            as_of: Utc::now(),
            list,
            empty,
        }
    }

    /// A read that is not a list (one item, a summary): only `as_of`.
    pub(crate) fn snapshot() -> Self {
        Read::now("", "")
    }

    /// A list answer (`{list: [...]}`); `limit` is the page size when the
    /// list was cut at it (a full page: `more`).
    pub(crate) fn list<T: Serialize>(
        &self,
        result: BusResult<Vec<T>>,
        limit: Option<i64>,
    ) -> Result<CallToolResult, ErrorData> {
        let result = result.map(|items| {
            let more = limit.is_some_and(|limit| items.len() as i64 >= limit);
            json!({ self.list: items, "more": more })
        });
        self.reply(result)
    }

    /// An object answer: `as_of` and `more` added where absent (`more` from
    /// the answer's `truncated`, else false), and a `note` when its list is
    /// empty.
    pub(crate) fn reply<T: Serialize>(
        &self,
        result: BusResult<T>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut answer = reply(result)?;
        if answer.is_error == Some(true) {
            return Ok(answer);
        }
        if let Some(Value::Object(fields)) = answer.structured_content.as_mut() {
            let as_of = self.as_of.to_rfc3339_opts(SecondsFormat::Millis, true);
            if !self.list.is_empty() {
                if !fields.contains_key("more") {
                    let truncated = fields.get("truncated").and_then(Value::as_bool);
                    fields.insert("more".into(), Value::Bool(truncated.unwrap_or(false)));
                }
                let empty = fields
                    .get(self.list)
                    .and_then(Value::as_array)
                    .is_some_and(Vec::is_empty);
                if empty && !fields.contains_key("note") {
                    let note = format!("{} (as of {as_of})", self.empty);
                    fields.insert("note".into(), Value::String(note));
                }
            }
            fields.entry("as_of").or_insert(Value::String(as_of));
        }
        // The text content mirrors the structured one.
        if let Some(value) = &answer.structured_content {
            answer = CallToolResult::structured(value.clone());
        }
        Ok(answer)
    }
}
