//! Printing: aligned text tables for people, JSON for scripts.
//!
//! Much of what is printed was written by other agents (titles, bodies,
//! notes, names, activity, the server's refusals quoting them). A terminal
//! obeys control characters, so a teammate could clear the operator's screen,
//! rewrite what was shown or ring the bell. Text mode passes every answer
//! through [`clean_value`] and every error through [`clean`] (which also
//! spells out bidirectional formatting characters); JSON mode escapes what
//! serde_json would leave raw ([`json`]) and keeps the text as it is.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::Value;

use acs_store::store::text;

/// Print `value` as pretty JSON on stdout. serde_json escapes C0 controls
/// but writes DEL and the C1 controls (U+0080..U+009F, which some terminals
/// read as ESC-sequences) raw; they are escaped here, which is the same JSON.
pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    let text: String = if text.chars().any(is_raw_control) {
        text.chars()
            .map(|c| {
                if is_raw_control(c) {
                    format!("\\u{:04x}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        text
    };
    println!("{text}");
    Ok(())
}

/// A control character serde_json leaves unescaped.
fn is_raw_control(c: char) -> bool {
    c.is_control() && c as u32 >= 0x7f
}

/// `text` without control characters (C0, DEL, C1: escape sequences, the
/// bell, carriage returns, backspaces), except newline and tab, so foreign
/// text cannot drive the terminal it is printed on; and with the
/// bidirectional embeddings, overrides and isolates spelled out as
/// `<U+202E>` ([`text::show_bidi`], the dashboard's rule too), so it cannot
/// display in another order than it was written in.
pub fn clean(text: &str) -> Cow<'_, str> {
    let shown = text::show_bidi(text);
    if shown.chars().any(is_unsafe) {
        Cow::Owned(shown.chars().filter(|c| !is_unsafe(*c)).collect())
    } else {
        shown
    }
}

fn is_unsafe(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// [`clean`] on every string of a tool's answer (keys too), before text mode
/// reads any of it.
pub fn clean_value(value: Value) -> Value {
    match value {
        Value::String(text) => match clean(&text) {
            Cow::Borrowed(_) => Value::String(text),
            Cow::Owned(cleaned) => Value::String(cleaned),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(clean_value).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(key, value)| (clean(&key).into_owned(), clean_value(value)))
                .collect(),
        ),
        other => other,
    }
}

/// Print rows under headers, each column as wide as its widest cell.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    if rows.is_empty() {
        println!("(none)");
        return;
    }
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = widths[i]))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        line(row);
    }
}

pub fn time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

pub fn opt_time(t: &Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.as_ref().map(time).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clean_drops_every_control_character_but_newline_and_tab() {
        let hostile = "ok\x1b[2J\x1b]0;owned\x07 line\r\nnext\tcol\x08\x7f\u{9b}31m\0end";
        let cleaned = clean(hostile);
        assert_eq!(cleaned, "ok[2J]0;owned line\nnext\tcol31mend");
        assert!(!cleaned.contains('\x1b') && !cleaned.contains('\x07'));
        assert!(matches!(clean("plain text\n\tindented"), Cow::Borrowed(_)));
        assert_eq!(clean("ünïcödé ✓ 日本"), "ünïcödé ✓ 日本");
    }

    #[test]
    fn clean_value_reaches_every_string_and_key() {
        let answer = json!({
            "title\x1b": "a\x1b[2Jb",
            "messages": [{"body": "ring\x07", "seq": 3, "ok": true, "none": null}],
        });
        assert_eq!(
            clean_value(answer),
            json!({
                "title": "a[2Jb",
                "messages": [{"body": "ring", "seq": 3, "ok": true, "none": null}],
            })
        );
    }
}
