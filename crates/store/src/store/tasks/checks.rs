//! The checks of every task tool's arguments. All run before a transaction
//! opens, so bad input writes nothing.

use chrono::Duration;
use serde_json::{Value, json};

use super::{
    DEPENDENCIES_MAX, DESCRIPTION_MAX_BYTES, KEY_MAX_BYTES, LEASE_DEFAULT_SECS, LEASE_MAX_SECS,
    LEASE_MIN_SECS, PAGE_DEFAULT, PAGE_MAX, RESULT_MAX_BYTES, StatusFilter, TITLE_MAX_BYTES,
    TaskStatus,
};
use crate::error::{BusError, BusResult};
use crate::store::limits;
use crate::store::text;

/// A key naming a task to create: one line ([`text::one_line`]), 1..=128 bytes.
pub(super) fn check_new_key(raw: &str) -> BusResult<String> {
    check_key_size(text::one_line("task key", raw)?)
}

/// A key naming an existing task: normalised the same way, never refused for
/// its characters ([`text::lookup`]): it can only find what exists.
pub(super) fn check_key(raw: &str) -> BusResult<String> {
    check_key_size(text::lookup(raw))
}

fn check_key_size(key: String) -> BusResult<String> {
    if key.is_empty() {
        return Err(BusError::invalid(
            "a task key is required: a short identifier unique in the team, such as \
             `api-auth-refactor` (at most 128 bytes).",
        ));
    }
    limits::bytes_at_most(
        key.len(),
        KEY_MAX_BYTES,
        "task key",
        "Use a short identifier such as `api-auth-refactor` and put the detail in the title or \
         description.",
    )?;
    Ok(key)
}

pub(super) fn check_title(raw: &str) -> BusResult<String> {
    let title = text::one_line_else("task title", raw, "put further lines in `description`")?;
    if title.is_empty() {
        return Err(BusError::invalid(
            "a task title is required: one line saying what is to be done (at most 512 bytes).",
        ));
    }
    limits::bytes_at_most(
        title.len(),
        TITLE_MAX_BYTES,
        "task title",
        "Keep the title to one line and put the rest in `description` (up to 64 KiB).",
    )?;
    Ok(title)
}

pub(super) fn check_description(raw: Option<String>) -> BusResult<Option<String>> {
    if let Some(text) = &raw {
        limits::bytes_at_most(
            text.len(),
            DESCRIPTION_MAX_BYTES,
            "task description",
            "Summarise it, or keep the long text in a note (set_note) and reference its key.",
        )?;
    }
    Ok(raw.filter(|text| !text.trim().is_empty()))
}

/// A JSON object, or a string that parses to one (models often send JSON as
/// a string); stored as the object. At most 16 KiB as compact JSON.
pub fn check_metadata(raw: Option<Value>) -> BusResult<Value> {
    let words = limits::MetadataWords {
        string_not_object: "metadata is a string that is not a JSON object. Pass an object such \
                            as {\"priority\": \"high\"} (or a string holding one).",
        not_object: "metadata must be a JSON object such as {\"priority\": \"high\"}, not an \
                     array, number or boolean.",
        too_big_hint: "Keep small facts in metadata and long text in the description or a note.",
    };
    Ok(limits::metadata(raw, words)?.unwrap_or_else(|| json!({})))
}

pub(super) fn check_dependencies(key: &str, raw: &[String]) -> BusResult<Vec<String>> {
    // The raw length, before any per-entry work: duplicates count, so a list
    // of a million copies of one key costs nothing.
    if raw.len() > DEPENDENCIES_MAX {
        return Err(BusError::invalid(format!(
            "depends_on holds {} entries; the limit is {DEPENDENCIES_MAX} (duplicates count). \
             Nothing was written. List each prerequisite once, and group many under fewer tasks \
             (for example one task that depends on the others).",
            raw.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(raw.len());
    let mut keys: Vec<String> = Vec::with_capacity(raw.len());
    for dep in raw {
        let dep = check_key(dep)?;
        if dep == key {
            return Err(BusError::invalid(format!(
                "task `{key}` cannot depend on itself; remove it from depends_on."
            )));
        }
        if seen.insert(dep.clone()) {
            keys.push(dep);
        }
    }
    Ok(keys)
}

pub(super) fn check_lease(lease_seconds: Option<i64>) -> BusResult<Duration> {
    limits::seconds_to_a_day(
        "lease_seconds",
        lease_seconds,
        LEASE_DEFAULT_SECS,
        LEASE_MIN_SECS..=LEASE_MAX_SECS,
        &format!("Omit it for {LEASE_DEFAULT_SECS} s, and call renew_task_lease while you work."),
    )
}

pub(super) fn check_result(result: &str) -> BusResult<()> {
    limits::bytes_at_most(
        result.len(),
        RESULT_MAX_BYTES,
        "result",
        "Summarise the outcome and keep long output in a note (set_note) whose key you mention.",
    )
}

/// The status `list_tasks` filters on (trimmed, any case); none or empty is
/// `any`.
pub(super) fn check_status_filter(raw: Option<&str>) -> BusResult<StatusFilter> {
    let status = raw
        .map(|s| s.trim().to_ascii_lowercase())
        .unwrap_or_default();
    if status.is_empty() || status == StatusFilter::Any.as_str() {
        return Ok(StatusFilter::Any);
    }
    match TaskStatus::from_text(&status) {
        Some(status) => Ok(StatusFilter::Is(status)),
        None => Err(BusError::invalid(format!(
            "status {} is not one of open, claimed, done, cancelled, any. A task whose \
             lease lapsed counts as open.",
            text::quote(&status)
        ))),
    }
}

pub(super) fn check_list_limit(limit: Option<i64>) -> BusResult<i64> {
    limits::page_limit(
        limit,
        limits::Page {
            default: PAGE_DEFAULT,
            max: PAGE_MAX,
        },
        "Narrow the listing with `status` or `mine_only` instead of asking for more.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_an_object_or_a_string_holding_one() {
        assert_eq!(check_metadata(None).unwrap(), json!({}));
        assert_eq!(
            check_metadata(Some(json!("{\"a\": 1}"))).unwrap(),
            json!({"a": 1})
        );
        assert!(check_metadata(Some(json!("[1]"))).is_err());
        assert!(check_metadata(Some(json!("not json"))).is_err());
        assert!(check_metadata(Some(json!([1, 2]))).is_err());
        let big = json!({ "x": "y".repeat(limits::METADATA_MAX_BYTES) });
        let err = check_metadata(Some(big)).unwrap_err().to_string();
        assert!(err.contains("16384"), "{err}");
    }

    #[test]
    fn limits_are_named_in_refusals() {
        assert!(
            check_key(&"k".repeat(129))
                .unwrap_err()
                .to_string()
                .contains("128")
        );
        assert_eq!(check_key("  a b ").unwrap(), "a b");
        assert_eq!(check_new_key(" a\u{2028}b ").unwrap_err().kind(), "invalid");
        assert_eq!(check_key(" e\u{301} ").unwrap(), "\u{e9}");
        assert!(check_title("one\ntwo").is_err());
        assert_eq!(check_title(" one line\n").unwrap(), "one line");
        assert!(
            check_lease(Some(29))
                .unwrap_err()
                .to_string()
                .contains("30")
        );
        assert_eq!(check_lease(None).unwrap(), Duration::seconds(900));
        assert!(
            check_list_limit(Some(201))
                .unwrap_err()
                .to_string()
                .contains("200")
        );
        assert_eq!(check_status_filter(None).unwrap(), StatusFilter::Any);
        assert_eq!(
            check_status_filter(Some(" Claimed ")).unwrap(),
            StatusFilter::Is(TaskStatus::Claimed)
        );
        assert!(check_status_filter(Some("lapsed")).is_err());
        let deps: Vec<String> = (0..33).map(|i| format!("d{i}")).collect();
        assert!(
            check_dependencies("t", &deps)
                .unwrap_err()
                .to_string()
                .contains("32")
        );
        let dup = vec!["a".to_string(), " a ".to_string()];
        assert_eq!(check_dependencies("t", &dup).unwrap(), vec!["a"]);
        assert!(check_dependencies("t", &["t".to_string()]).is_err());
    }
}
