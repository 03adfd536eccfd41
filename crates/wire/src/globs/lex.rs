//! Reading a pattern: refusals, tokens, segments, the normalised text and
//! the two compiled forms (by segment for matching, by character for
//! overlaps).

use super::{CTok, Class, GlobError, PATTERN_MAX_BYTES, PathGlob, Seg, Tok};
use crate::text::quote;

/// What the lexer reads: a token, or a `/`.
enum Item {
    Tok(Tok),
    Sep,
}

fn err(message: String) -> Result<PathGlob, GlobError> {
    Err(GlobError::new(message))
}

pub(super) fn refuse_control(raw: &str, what: &str) -> Result<(), GlobError> {
    if let Some(c) = raw.chars().find(|c| c.is_control()) {
        return Err(GlobError::new(format!(
            "{what} {} holds a control character (U+{:04X}); repository paths cannot hold line \
             breaks, tabs or other control characters. Give the path as it is in the repository.",
            quote(raw),
            c as u32
        )));
    }
    Ok(())
}

pub(super) fn refuse_os_absolute(raw: &str, what: &str) -> Result<(), GlobError> {
    let b = raw.as_bytes();
    let drive = b.len() >= 2
        && b[0].is_ascii_alphabetic()
        && b[1] == b':'
        && (b.len() == 2 || b[2] == b'\\' || b[2] == b'/');
    if drive || raw.starts_with("\\\\") {
        return Err(GlobError::new(format!(
            "{what} {} is an absolute OS path; paths are relative to the repository root, with \
             `/` between directories, e.g. `src/api/**`.",
            quote(raw)
        )));
    }
    Ok(())
}

/// Reads `raw`; `stored` reads the normalised form (always anchored).
pub(super) fn parse(raw: &str, stored: bool) -> Result<PathGlob, GlobError> {
    if raw.len() > PATTERN_MAX_BYTES {
        return err(format!(
            "pattern is {} bytes; the limit is {PATTERN_MAX_BYTES}. Reserve a directory (e.g. \
             `src/api/`) or a shorter glob instead.",
            raw.len()
        ));
    }
    refuse_control(raw, "pattern")?;
    let text = trim(raw);
    if text.is_empty() {
        return err(
            "pattern is empty; give a path or glob relative to the repository root, e.g. \
             `src/api/**` or `*.md`."
                .to_string(),
        );
    }
    if text.starts_with('!') {
        return err(format!(
            "pattern {} starts with `!`: a reservation cannot exclude paths. Reserve only what you \
             will edit (write `\\!` for a file name starting with `!`).",
            quote(raw)
        ));
    }
    if text.starts_with('#') {
        return err(format!(
            "pattern {} starts with `#`, which gitignore reads as a comment. Write `\\#` for a \
             file name starting with `#`.",
            quote(raw)
        ));
    }
    refuse_os_absolute(text, "pattern")?;
    let mut classes = Vec::new();
    let items = lex(raw, text, &mut classes)?;
    // Anchored: a `/` at the start or in the middle (not only trailing).
    let last_tok = items.iter().rposition(|i| matches!(i, Item::Tok(_)));
    let anchored = stored
        || items[..last_tok.unwrap_or(0)]
            .iter()
            .any(|i| matches!(i, Item::Sep));
    // Segments, without empty and `.` ones; `**` segments collapsed.
    let mut segments: Vec<Option<Vec<Tok>>> = Vec::new(); // None is `**`
    for seg in items.split(|i| matches!(i, Item::Sep)) {
        let toks: Vec<Tok> = seg
            .iter()
            .map(|i| match i {
                Item::Tok(t) => *t,
                Item::Sep => unreachable!(),
            })
            .collect();
        if toks.is_empty() || toks == [Tok::Lit('.')] {
            continue;
        }
        if toks == [Tok::Lit('.'), Tok::Lit('.')] {
            return err(format!(
                "pattern {} has a `..` segment; paths are relative to the repository root and \
                 stay inside it. Write the pattern from the root, e.g. `src/api/**`.",
                quote(raw)
            ));
        }
        // Two `Star`s come only from two unescaped stars: the segment is `**`.
        if toks == [Tok::Star, Tok::Star] {
            if segments.last() != Some(&None) {
                segments.push(None);
            }
            continue;
        }
        let mut kept: Vec<Tok> = Vec::with_capacity(toks.len());
        for t in toks {
            if !(t == Tok::Star && kept.last() == Some(&Tok::Star)) {
                kept.push(t);
            }
        }
        segments.push(Some(kept));
    }
    if segments.is_empty() {
        return err(format!(
            "pattern {} names nothing once `./` and `/` are normalised; give a path or glob \
             relative to the repository root, e.g. `src/api/**`.",
            quote(raw)
        ));
    }
    if !anchored && segments[0].is_some() {
        segments.insert(0, None);
    }
    let glob = compile(segments, classes);
    if glob.text.len() > PATTERN_MAX_BYTES {
        return err(format!(
            "pattern is {} bytes once normalised (as `{}…`); the limit is {PATTERN_MAX_BYTES}. \
             Reserve a directory or a shorter glob instead.",
            glob.text.len(),
            glob.text.chars().take(40).collect::<String>()
        ));
    }
    Ok(glob)
}

/// `raw` without surrounding spaces (an escaped trailing space stays).
fn trim(raw: &str) -> &str {
    let mut t = raw.trim_start_matches(' ');
    while t.ends_with(' ') {
        let body = &t[..t.len() - 1];
        let slashes = body.len() - body.trim_end_matches('\\').len();
        if slashes % 2 == 1 {
            break;
        }
        t = body;
    }
    t
}

fn lex(raw: &str, text: &str, classes: &mut Vec<Class>) -> Result<Vec<Item>, GlobError> {
    let mut items = Vec::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        items.push(match c {
            '/' => Item::Sep,
            '*' => Item::Tok(Tok::Star),
            '?' => Item::Tok(Tok::One),
            '\\' => Item::Tok(Tok::Lit(escaped(raw, chars.next())?)),
            '[' => {
                let class = class(raw, &mut chars)?;
                classes.push(class);
                Item::Tok(Tok::Class(classes.len() as u32 - 1))
            }
            c => Item::Tok(Tok::Lit(c)),
        });
    }
    Ok(items)
}

fn escaped(raw: &str, next: Option<char>) -> Result<char, GlobError> {
    match next {
        None => Err(GlobError::new(format!(
            "pattern {} ends with a lone `\\`; a backslash escapes the next character. Remove \
             it, or write `\\\\` for a literal backslash.",
            quote(raw)
        ))),
        Some('/') => Err(GlobError::new(format!(
            "pattern {} escapes a `/`; `/` always separates directories. Remove the backslash.",
            quote(raw)
        ))),
        Some(c) if c.is_alphanumeric() || matches!(c, '.' | '_' | '-') => {
            Err(GlobError::new(format!(
                "pattern {} has `\\{c}`: a backslash only escapes glob characters (`\\*`, `\\?`, \
                 `\\[`, `\\\\`), and paths are relative to the repository root with `/` between \
                 directories, e.g. `src/api/x.rs`, not `src\\api\\x.rs`.",
                quote(raw)
            )))
        }
        Some(c) => Ok(c),
    }
}

/// A class after its `[`, through its `]`.
fn class(
    raw: &str,
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
) -> Result<Class, GlobError> {
    let unclosed = || {
        GlobError::new(format!(
            "pattern {} has an unclosed `[`; a character class ends with `]` (e.g. `[a-z]`). \
             Close it, or write `\\[` for a literal `[`.",
            quote(raw)
        ))
    };
    let mut negated = false;
    if matches!(chars.peek(), Some('!' | '^')) {
        negated = true;
        chars.next();
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let c = chars.next().ok_or_else(unclosed)?;
        let lo = match c {
            ']' if !first => break,
            '\\' => chars.next().ok_or_else(unclosed)?,
            '[' if matches!(chars.peek(), Some(':' | '=' | '.')) => {
                return Err(GlobError::new(format!(
                    "pattern {} uses a POSIX class name such as `[:alpha:]`, which reservations \
                     do not support. Write the characters or ranges instead, e.g. `[a-zA-Z0-9]`.",
                    quote(raw)
                )));
            }
            c => c,
        };
        first = false;
        if lo == '/' {
            return Err(slash_in_class(raw));
        }
        let mut hi = lo;
        if chars.peek() == Some(&'-') {
            let mut ahead = chars.clone();
            ahead.next();
            match ahead.next() {
                None => return Err(unclosed()),
                Some(']') => {}
                Some(mut end) => {
                    chars.next();
                    chars.next();
                    if end == '\\' {
                        end = chars.next().ok_or_else(unclosed)?;
                    }
                    if end == '/' {
                        return Err(slash_in_class(raw));
                    }
                    if end < lo {
                        return Err(GlobError::new(format!(
                            "pattern {} has the reversed range `{lo}-{end}` in a character \
                             class; write the smaller character first, e.g. `[a-z]`.",
                            quote(raw)
                        )));
                    }
                    hi = end;
                }
            }
        }
        ranges.push((lo, hi));
    }
    Ok(Class { negated, ranges })
}

fn slash_in_class(raw: &str) -> GlobError {
    GlobError::new(format!(
        "pattern {} has a `/` inside a character class; a class matches one character of a name \
         and never `/`. Take the `/` out of the brackets.",
        quote(raw)
    ))
}

/// The normalised text and both compiled forms of `segments` (None: `**`).
fn compile(segments: Vec<Option<Vec<Tok>>>, classes: Vec<Class>) -> PathGlob {
    let mut text = String::new();
    let mut toks = Vec::new();
    let mut segs = Vec::new();
    let mut chars = Vec::new();
    let last = segments.len() - 1;
    for (n, seg) in segments.iter().enumerate() {
        if n > 0 {
            text.push('/');
        }
        match seg {
            None => {
                text.push_str("**");
                if n == last {
                    segs.push(Seg::AnyName);
                    segs.push(Seg::AnyNames);
                    chars.push(CTok::AnyRest);
                } else {
                    segs.push(Seg::AnyNames);
                    chars.extend([CTok::AnyDirs, CTok::DirsBody]);
                }
            }
            Some(seg) => {
                let start = toks.len() as u32;
                for (k, t) in seg.iter().enumerate() {
                    let at_start = text.is_empty();
                    let at_end = n == last && k == seg.len() - 1;
                    render(&mut text, *t, &classes, at_start, at_end);
                    toks.push(*t);
                    chars.push(match *t {
                        Tok::Lit(c) => CTok::Lit(c),
                        Tok::One => CTok::One,
                        Tok::Class(i) => CTok::Class(i),
                        Tok::Star => CTok::Star,
                    });
                }
                segs.push(Seg::Name {
                    start,
                    end: toks.len() as u32,
                });
                if n != last {
                    chars.push(CTok::Lit('/'));
                }
            }
        }
    }
    let prefix = chars
        .iter()
        .map_while(|t| match t {
            CTok::Lit(c) => Some(*c),
            _ => None,
        })
        .collect();
    PathGlob {
        text,
        prefix,
        toks,
        classes,
        segs,
        chars,
    }
}

fn render(text: &mut String, t: Tok, classes: &[Class], at_start: bool, at_end: bool) {
    match t {
        Tok::Lit(c) => {
            let escape = matches!(c, '\\' | '*' | '?' | '[' | ']')
                || (at_start && matches!(c, '!' | '#' | ' '))
                || (at_end && c == ' ');
            if escape {
                text.push('\\');
            }
            text.push(c);
        }
        Tok::One => text.push('?'),
        Tok::Star => text.push('*'),
        Tok::Class(i) => {
            let class = &classes[i as usize];
            text.push('[');
            if class.negated {
                text.push('!');
            }
            for &(lo, hi) in &class.ranges {
                render_class_char(text, lo);
                if hi != lo {
                    text.push('-');
                    render_class_char(text, hi);
                }
            }
            text.push(']');
        }
    }
}

fn render_class_char(text: &mut String, c: char) {
    if matches!(c, '\\' | ']' | '[' | '-' | '!' | '^') {
        text.push('\\');
    }
    text.push(c);
}
