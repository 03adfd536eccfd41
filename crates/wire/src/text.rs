//! The character rules of text fields, shared by the server (which refuses
//! and normalises by them: `acs_store::store::text`, where the whole rule is
//! described) and the agent side (which shows text by them).
//!
//! - [`refused`]: what a one-line field may not hold, and why, in words.
//! - [`quote`]: how a refusal shows what it was given.
//! - [`show_bidi`]: how text for people shows a stored body.
//! - [`nfc`], [`lookup`]: the normal form names are stored and looked up in.

use unicode_general_category::{GeneralCategory, get_general_category};
use unicode_normalization::{UnicodeNormalization, is_nfc_quick};

/// Characters of the input a refusal shows before cutting it with `…`.
pub const QUOTE_CHARS: usize = 40;

/// What the rule refuses in a one-line field, in words, for every refusal.
pub const REFUSED_SUMMARY: &str = "control characters (line breaks, tabs), line and paragraph \
    separators (U+2028, U+2029) and bidirectional formatting characters (U+200E, U+200F, U+061C, \
    U+202A-U+202E, U+2066-U+2069)";

/// Why `c` may not appear in a one-line field, or `None` when it may.
pub fn refused(c: char) -> Option<String> {
    let code = c as u32;
    let what = match c {
        '\n' => "a line break".to_string(),
        '\r' => "a carriage return".to_string(),
        '\t' => "a tab".to_string(),
        c if c.is_control() => "a control character".to_string(),
        '\u{2028}' => "a line separator".to_string(),
        '\u{2029}' => "a paragraph separator".to_string(),
        _ => {
            let name = bidi_name(c)?;
            return Some(format!(
                "a bidirectional formatting character (U+{code:04X}, {name})"
            ));
        }
    };
    Some(format!("{what} (U+{code:04X})"))
}

/// The name of a bidirectional formatting character, `None` for others.
fn bidi_name(c: char) -> Option<&'static str> {
    Some(match c {
        '\u{200E}' => "left-to-right mark",
        '\u{200F}' => "right-to-left mark",
        '\u{061C}' => "Arabic letter mark",
        '\u{202A}' => "left-to-right embedding",
        '\u{202B}' => "right-to-left embedding",
        '\u{202C}' => "pop directional formatting",
        '\u{202D}' => "left-to-right override",
        '\u{202E}' => "right-to-left override",
        '\u{2066}' => "left-to-right isolate",
        '\u{2067}' => "right-to-left isolate",
        '\u{2068}' => "first strong isolate",
        '\u{2069}' => "pop directional isolate",
        _ => return None,
    })
}

/// The bidirectional formatting characters that text for people shows as
/// `<U+XXXX>` ([`show_bidi`]): the explicit embeddings and overrides
/// (U+202A-U+202E) and isolates (U+2066-U+2069), the characters of
/// CVE-2021-42574 ("Trojan Source") that make text display in an order other
/// than the one it is stored in. The implicit marks (U+200E, U+200F, U+061C)
/// are not among them: they only settle the direction of neutral characters
/// next to them, cannot reverse a run of letters, and are how people who
/// write Hebrew, Arabic or Persian keep punctuation and numbers in place, so
/// spelling them out would garble their messages. (A one-line field refuses
/// them all the same: a name has no use for them.) `app.js` receives this
/// very list from the server, so the console client, the dashboard's first
/// render and its redraws escape one set.
pub const BIDI_CONTROLS: [char; 9] = [
    '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}',
    '\u{2069}',
];

/// `text` as a person should see it: every character of [`BIDI_CONTROLS`]
/// spelled out as `<U+XXXX>`, everything else as it is. For display only
/// (the console client's text mode, the dashboard); stored text and JSON
/// answers keep those characters byte for byte.
pub fn show_bidi(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(BIDI_CONTROLS) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if BIDI_CONTROLS.contains(&c) {
            out.push_str(&format!("<U+{:04X}>", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Unicode NFC (the quick check skips the work for text already in NFC).
pub fn nfc(text: &str) -> String {
    if is_nfc_quick(text.chars()) == unicode_normalization::IsNormalized::Yes {
        text.to_string()
    } else {
        text.nfc().collect()
    }
}

/// A name given to look something up: trimmed and NFC like [`one_line`], but
/// never refused (a lookup finds only what exists).
pub fn lookup(raw: &str) -> String {
    nfc(raw.trim())
}

/// [`lookup`] lower-cased, for names stored lower-cased (lock names, tags).
pub fn lookup_lower(raw: &str) -> String {
    nfc(&lookup(raw).to_lowercase())
}

/// User input as a refusal shows it: in double quotes, at most
/// [`QUOTE_CHARS`] characters then `…`, with line breaks and tabs as `\n`,
/// `\r`, `\t`, a quote as `\"`, a backslash as `\\`, and other invisible or
/// refused characters as `<U+XXXX>`.
pub fn quote(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len().min(4 * QUOTE_CHARS) + 2);
    out.push('"');
    for (i, c) in raw.chars().enumerate() {
        if i == QUOTE_CHARS {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if refused(c).is_some() || is_invisible(c) => {
                out.push_str(&format!("<U+{:04X}>", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Characters that show nothing (format characters other than the emoji
/// joiners, separators other than a plain space): spelled out when quoted.
fn is_invisible(c: char) -> bool {
    if matches!(c, '\u{200D}' | ' ') {
        return false;
    }
    matches!(
        get_general_category(c),
        GeneralCategory::Format
            | GeneralCategory::SpaceSeparator
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refused_characters_are_exactly_the_documented_ones() {
        for c in [
            '\0', '\n', '\r', '\t', '\u{1B}', '\u{7F}', '\u{85}', '\u{9F}', '\u{2028}', '\u{2029}',
            '\u{200E}', '\u{200F}', '\u{061C}', '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}',
            '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ] {
            assert!(refused(c).is_some(), "U+{:04X} must be refused", c as u32);
        }
        // Emoji joiners, non-breaking and other spaces, accents, scripts that
        // run right to left: all text, all kept.
        for c in [
            ' ', 'a', 'é', '\u{301}', '\u{200D}', '\u{FE0F}', '\u{A0}', '\u{3000}', 'ש', 'ع', '中',
            '🦀', '\u{200B}', '\u{2060}', '\u{FEFF}',
        ] {
            assert!(refused(c).is_none(), "U+{:04X} must be kept", c as u32);
        }
        assert_eq!(
            refused('\u{202E}').unwrap(),
            "a bidirectional formatting character (U+202E, right-to-left override)"
        );
        assert_eq!(refused('\n').unwrap(), "a line break (U+000A)");
    }

    #[test]
    fn show_bidi_spells_out_exactly_the_explicit_formatting_characters() {
        assert_eq!(
            show_bidi("invoice\u{202E}fdp.exe\u{202C} \u{2066}x\u{2069}"),
            "invoice<U+202E>fdp.exe<U+202C> <U+2066>x<U+2069>"
        );
        for c in BIDI_CONTROLS {
            assert_eq!(show_bidi(&c.to_string()), format!("<U+{:04X}>", c as u32));
        }
        // The implicit marks, right-to-left scripts, the emoji joiner: kept.
        let kept = "שלום\u{200F}, مرحبا\u{061C} a\u{200E}b 👩\u{200D}💻\n\tend";
        assert!(matches!(show_bidi(kept), std::borrow::Cow::Borrowed(_)));
    }
}
