//! Text fields: the one rule every text argument of every tool follows.
//!
//! A text argument is one of two kinds:
//!
//! - **One-line** ([`one_line`]): identifiers, keys, names, labels, titles,
//!   topics, purposes, tags, filters. Leading and trailing whitespace is
//!   removed, the text is put in Unicode NFC (so a composed `é` and an `e`
//!   followed by a combining acute are one name, not two), and a new value is
//!   refused when it holds a character that makes text read differently from
//!   what it is: a control character (line break, tab, escape …), a line or
//!   paragraph separator (U+2028, U+2029), or a bidirectional formatting
//!   character (U+200E, U+200F, U+061C, U+202A–U+202E, U+2066–U+2069; U+202E
//!   makes `txt.exe` look like `exe.txt`). Fields with a fixed ASCII shape
//!   (channel, project, agent and window names, note scopes) are stricter
//!   still and keep their own patterns; they cannot hold any of these.
//! - **Multi-line** (message bodies, questions, task descriptions and
//!   results, note values): kept byte for byte, never trimmed or normalised.
//!   Only their size is limited, and NUL is refused for every argument (the
//!   database cannot store it; see `mcp::call_tool`).
//!
//! Lookups by name (get, delete, claim, complete, release, filters) go
//! through [`lookup`]: the same trimming and NFC, but no refusal, since a
//! lookup can only find what exists; a name stored before this rule (which
//! may hold such a character) stays reachable.
//!
//! [`quote`] is how a refusal shows what it was given: quoted, cut to 40
//! characters, invisible characters spelled out, and never in Rust syntax.
//!
//! [`show_bidi`] is how text for people (the console client's text mode, the
//! dashboard) shows a stored body: the bidirectional embeddings, overrides
//! and isolates spelled out as `<U+202E>`, so a body cannot display in an
//! order other than the one it was written in. JSON keeps them as they are.
//!
//! [`Literals`] is what full-text search cannot see: PostgreSQL's parser drops
//! emoji and other symbols, so `search_notes` and `search_messages` match
//! those as exact substrings.

use unicode_general_category::{GeneralCategory, get_general_category};

use crate::error::{BusError, BusResult};

// The character rules themselves are the contract both sides keep (the
// console client and the dashboard show text by them): `acs_wire::text`.
pub use acs_wire::text::{
    BIDI_CONTROLS, QUOTE_CHARS, REFUSED_SUMMARY, lookup, lookup_lower, nfc, quote, refused,
    show_bidi,
};

/// A one-line field as it is stored and compared: trimmed, NFC. Refused,
/// naming `field`, when it holds a character [`refused`] names. Emptiness and
/// length are the caller's (each field has its own limit, counted on the
/// returned text).
pub fn one_line(field: &str, raw: &str) -> BusResult<String> {
    one_line_else(field, raw, "")
}

/// An optional label (`field`): one line ([`one_line`]) of at most `max`
/// bytes; absent or empty is none. `instead` says what to give instead when
/// it is too long.
pub fn optional_label(
    field: &str,
    raw: Option<&str>,
    max: usize,
    instead: &str,
) -> BusResult<Option<String>> {
    let Some(label) = raw
        .map(|l| one_line(field, l))
        .transpose()?
        .filter(|l| !l.is_empty())
    else {
        return Ok(None);
    };
    super::limits::bytes_at_most(label.len(), max, field, instead)?;
    Ok(Some(label))
}

/// [`one_line`], with a hint of where the rest belongs (for example "put the
/// details in `description`").
pub fn one_line_else(field: &str, raw: &str, elsewhere: &str) -> BusResult<String> {
    let text = raw.trim();
    if let Some((at, reason)) = text
        .chars()
        .enumerate()
        .find_map(|(i, c)| refused(c).map(|why| (i + 1, why)))
    {
        let elsewhere = if elsewhere.is_empty() {
            String::new()
        } else {
            format!(" ({elsewhere})")
        };
        return Err(BusError::invalid(format!(
            "{field} {} holds {reason} at character {at}. The {field} is one line of plain text: \
             {REFUSED_SUMMARY} are refused, because they make text read differently from what it \
             is. Nothing was changed. Send it again without that character{elsewhere}.",
            quote(text)
        )));
    }
    Ok(nfc(text))
}

/// [`one_line`] lower-cased (lock names, tags): lower-casing can undo NFC,
/// so the text is normalised again after it.
pub fn one_line_lower(field: &str, raw: &str) -> BusResult<String> {
    Ok(nfc(&one_line(field, raw)?.to_lowercase()))
}

/// The parts of a search query that PostgreSQL's full-text parser drops
/// (emoji, arrows, `✅`, `€` …: runs of non-ASCII symbols with their joiners),
/// which search matches as exact substrings instead. A run in a word that
/// starts with `-` is excluded, as `-word` is in web-search syntax.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Literals {
    pub required: Vec<String>,
    pub excluded: Vec<String>,
}

impl Literals {
    pub fn of(query: &str) -> Literals {
        let mut literals = Literals::default();
        for word in query.split_whitespace() {
            let negated = word.starts_with('-');
            let mut run = String::new();
            for c in word.chars() {
                if is_symbol(c) || (!run.is_empty() && joins_symbol(c)) {
                    run.push(c);
                } else if !run.is_empty() {
                    literals.push(negated, std::mem::take(&mut run));
                }
            }
            if !run.is_empty() {
                literals.push(negated, run);
            }
        }
        literals
    }

    pub fn is_empty(&self) -> bool {
        self.required.is_empty() && self.excluded.is_empty()
    }

    fn push(&mut self, negated: bool, run: String) {
        let list = if negated {
            &mut self.excluded
        } else {
            &mut self.required
        };
        if !list.contains(&run) {
            list.push(run);
        }
    }
}

/// Whether `query` gives full text (configuration `config`) any word to look
/// for. Only asked when it holds literals: with words, search uses the index
/// and filters its hits by the literals; without, it matches literals alone.
pub async fn has_words(
    pool: &sqlx::PgPool,
    config: &'static str,
    query: &str,
    literals: &Literals,
) -> BusResult<bool> {
    if literals.is_empty() {
        return Ok(true);
    }
    let nodes: i32 = sqlx::query_scalar("SELECT numnode(websearch_to_tsquery($1::regconfig, $2))")
        .bind(config)
        .bind(query)
        .fetch_one(pool)
        .await?;
    Ok(nodes > 0)
}

/// A symbol full text cannot see. ASCII is left to the parser (`-`, `"` and
/// `or` are its syntax).
fn is_symbol(c: char) -> bool {
    !c.is_ascii()
        && matches!(
            get_general_category(c),
            GeneralCategory::OtherSymbol
                | GeneralCategory::MathSymbol
                | GeneralCategory::CurrencySymbol
                | GeneralCategory::ModifierSymbol
        )
}

/// What continues an emoji: the zero-width joiner, variation selectors,
/// combining and enclosing marks (keycaps), tag characters (flags).
fn joins_symbol(c: char) -> bool {
    matches!(c, '\u{200D}' | '\u{FE00}'..='\u{FE0F}' | '\u{E0020}'..='\u{E007F}')
        || matches!(
            get_general_category(c),
            GeneralCategory::NonspacingMark | GeneralCategory::EnclosingMark
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_fields_are_trimmed_normalised_or_refused() {
        // Composed and decomposed é are one name.
        assert_eq!(
            one_line("note key", "  caf\u{65}\u{301} ").unwrap(),
            "caf\u{e9}"
        );
        assert_eq!(one_line("note key", "caf\u{e9}").unwrap(), "caf\u{e9}");
        // A trailing line break is trimmed away; an inner one is refused.
        assert_eq!(one_line("task title", "Fix it\n").unwrap(), "Fix it");
        let err = one_line_else("task title", "Fix\nit", "put the rest in `description`")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("task title \"Fix\\nit\" holds a line break (U+000A) at character 4.")
        );
        assert!(err.contains("Nothing was changed"), "{err}");
        assert!(err.contains("(put the rest in `description`)"), "{err}");
        let err = one_line("note key", "a\u{202E}txt.exe")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"a<U+202E>txt.exe\""), "{err}");
        assert!(err.contains("right-to-left override"), "{err}");
        assert!(one_line("note key", "a\u{2028}b").is_err());
        assert_eq!(
            one_line_lower("lock name", " E\u{301}TE\u{301} ").unwrap(),
            "\u{e9}t\u{e9}"
        );
        // Lookups normalise and never refuse.
        assert_eq!(lookup(" e\u{301}\u{202E} "), "\u{e9}\u{202E}");
        assert_eq!(lookup_lower(" E\u{301} "), "\u{e9}");
    }

    #[test]
    fn quotes_are_short_readable_and_not_rust() {
        assert_eq!(quote("plain"), "\"plain\"");
        assert_eq!(quote("a\"b\\c\td"), "\"a\\\"b\\\\c\\td\"");
        assert_eq!(quote("x\u{2028}y\u{FEFF}"), "\"x<U+2028>y<U+FEFF>\"");
        assert_eq!(quote("👩\u{200D}💻"), "\"👩\u{200D}💻\"");
        let long = "s".repeat(100);
        let quoted = quote(&long);
        assert_eq!(quoted, format!("\"{}…\"", "s".repeat(QUOTE_CHARS)));
        assert!(!quote("Some(x)").contains("Some(\"")); // what `{:?}` of an Option looked like
    }

    #[test]
    fn search_literals_are_the_symbols_full_text_drops() {
        assert_eq!(Literals::of("deploy staging"), Literals::default());
        assert_eq!(
            Literals::of("\"a phrase\" -word or café 中文"),
            Literals::default()
        );
        assert_eq!(
            Literals::of("🦀 rust ✅done -❌ 👩\u{200D}💻 1\u{FE0F}\u{20E3} 🦀"),
            Literals {
                // The keycap `1️⃣` starts with an ASCII digit, a word the
                // parser keeps: no literal.
                required: vec!["🦀".into(), "✅".into(), "👩\u{200D}💻".into()],
                excluded: vec!["❌".into()],
            }
        );
        assert_eq!(Literals::of("€ → ±").required, vec!["€", "→", "±"]);
    }
}
