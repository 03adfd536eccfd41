//! The bounds every tool argument is checked against, and the checks that
//! refuse what falls outside them: page sizes (`limit`), ranges of seconds
//! (`ttl_seconds`, `lease_seconds`, `timeout_seconds`), byte caps on text, and
//! metadata objects. Each store module keeps its own constants and its own
//! hint (what to do instead); the shape of the refusal is written here once,
//! so the same mistake reads the same in every tool.
//!
//! All of these run before a transaction opens, so a refused argument writes
//! nothing. Checks that are not a plain bound (one-line text, names, the
//! shape of an address) stay with the module that owns the value.

use std::fmt::Display;
use std::ops::RangeInclusive;

use serde_json::Value;

use crate::error::{BusError, BusResult};

pub use acs_wire::limits::BODY_MAX_BYTES;
/// The largest metadata object, as compact JSON, on a message or a task.
pub const METADATA_MAX_BYTES: usize = 16 * 1024;

/// How many rows one call returns: `default` when `limit` is omitted, and at
/// most `max`.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    pub default: i64,
    pub max: i64,
}

/// A `limit` argument: `page.default` when omitted, refused outside
/// `1..=page.max`. `hint` follows the refusal and says what to do instead.
pub fn page_limit(requested: Option<i64>, page: Page, hint: &str) -> BusResult<i64> {
    let limit = requested.unwrap_or(page.default);
    within("limit", limit, 1..=page.max, "", hint)
}

/// A page read as `limit + 1` rows: cut to `limit`, and whether there were
/// more (the answer's `more` / `truncated`).
pub fn cut_page<T>(rows: &mut Vec<T>, limit: i64) -> bool {
    let more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    more
}

/// A number that must lie in `range`: refused as `{name} must be between MIN
/// and MAX{shown}; got V. {hint}`. `shown` says the maximum in words where a
/// reader would not see it in the number (" (24 h)"); either may be empty.
pub fn within<T: PartialOrd + Display + Copy>(
    name: &str,
    value: T,
    range: RangeInclusive<T>,
    shown: &str,
    hint: &str,
) -> BusResult<T> {
    if range.contains(&value) {
        return Ok(value);
    }
    let (min, max) = (range.start(), range.end());
    let hint = if hint.is_empty() {
        String::new()
    } else {
        format!(" {hint}")
    };
    Err(BusError::invalid(format!(
        "{name} must be between {min} and {max}{shown}; got {value}.{hint}"
    )))
}

/// A span of seconds of at most a day (`ttl_seconds`, `lease_seconds`):
/// `default` when omitted, refused outside `range` (which ends at a day,
/// shown as 24 h) as [`within`] words it, with `hint` after.
pub fn seconds_to_a_day(
    name: &str,
    requested: Option<i64>,
    default: i64,
    range: RangeInclusive<i64>,
    hint: &str,
) -> BusResult<chrono::Duration> {
    debug_assert_eq!(*range.end(), 86_400, "{name}: the refusal says 24 h");
    let seconds = within(name, requested.unwrap_or(default), range, " (24 h)", hint)?;
    Ok(chrono::Duration::seconds(seconds))
}

/// A byte cap: refused as `{what} is N bytes; the limit is MAX (N KiB). {hint}`
/// (the size in KiB or MiB is shown from 4 KiB up; below, the number reads
/// plainly).
pub fn bytes_at_most(len: usize, max: usize, what: &str, hint: &str) -> BusResult<()> {
    refuse_bytes(len, max, what, "", hint)
}

/// [`bytes_at_most`] worded `the limit is MAX bytes (N KiB)`, as notes and
/// presence say it.
pub fn bytes_at_most_spelled(len: usize, max: usize, what: &str, hint: &str) -> BusResult<()> {
    refuse_bytes(len, max, what, " bytes", hint)
}

fn refuse_bytes(len: usize, max: usize, what: &str, unit: &str, hint: &str) -> BusResult<()> {
    if len <= max {
        return Ok(());
    }
    Err(BusError::invalid(format!(
        "{what} is {len} bytes; the limit is {max}{unit}{}. {hint}",
        in_units(max)
    )))
}

/// " (16 KiB)" for 16 384, " (1 MiB)" for 1 048 576; nothing below 4 KiB or
/// for a size that is not a whole number of KiB.
fn in_units(bytes: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!(" ({} MiB)", bytes / MIB)
    } else if bytes >= 4 * KIB && bytes.is_multiple_of(KIB) {
        format!(" ({} KiB)", bytes / KIB)
    } else {
        String::new()
    }
}

/// The refusals of a metadata argument, worded for the tool that takes it.
#[derive(Clone, Copy, Debug)]
pub struct MetadataWords {
    /// A string was given that does not parse to a JSON object.
    pub string_not_object: &'static str,
    /// An array, number or boolean was given.
    pub not_object: &'static str,
    /// Follows the refusal of an object over [`METADATA_MAX_BYTES`].
    pub too_big_hint: &'static str,
}

/// A metadata argument: a JSON object, or a string that parses to one (models
/// often send JSON as a string), stored as the object; `None` when omitted or
/// null. At most [`METADATA_MAX_BYTES`] as compact JSON.
pub fn metadata(raw: Option<Value>, words: MetadataWords) -> BusResult<Option<Value>> {
    let value = match raw {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(object @ Value::Object(_)) => object,
            _ => return Err(BusError::invalid(words.string_not_object)),
        },
        Some(object @ Value::Object(_)) => object,
        Some(_) => return Err(BusError::invalid(words.not_object)),
    };
    bytes_at_most(
        value.to_string().len(),
        METADATA_MAX_BYTES,
        "metadata",
        words.too_big_hint,
    )?;
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_bound() {
        let page = Page {
            default: 50,
            max: 200,
        };
        assert_eq!(page_limit(None, page, "").unwrap(), 50);
        assert_eq!(
            page_limit(Some(0), page, "Page on.")
                .unwrap_err()
                .to_string(),
            "limit must be between 1 and 200; got 0. Page on."
        );
        assert_eq!(
            within("hours", 400, 1..=336, " (two weeks)", "")
                .unwrap_err()
                .to_string(),
            "hours must be between 1 and 336 (two weeks); got 400."
        );
        assert_eq!(
            bytes_at_most(20_000, 16 * 1024, "metadata", "Keep it small.")
                .unwrap_err()
                .to_string(),
            "metadata is 20000 bytes; the limit is 16384 (16 KiB). Keep it small."
        );
        assert_eq!(
            bytes_at_most(1025, 1024, "the note", "Keep it short.")
                .unwrap_err()
                .to_string(),
            "the note is 1025 bytes; the limit is 1024. Keep it short."
        );
        assert_eq!(
            bytes_at_most_spelled(257, 256, "repo label", "Shorten it.")
                .unwrap_err()
                .to_string(),
            "repo label is 257 bytes; the limit is 256 bytes. Shorten it."
        );
        assert_eq!(in_units(BODY_MAX_BYTES), " (1 MiB)");
        assert_eq!(in_units(256), "");
    }
}
