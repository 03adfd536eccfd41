//! Path reservations' patterns (issue 37): which repository paths a
//! reservation covers, and whether two reservations could cover one path.
//! Pure: no I/O. Both sides use it: the store decides overlaps with it, the
//! agent side (hooks, the git guard) matches paths with it.
//!
//! # The rule (gitignore-style, as `git help gitignore` says)
//!
//! - Paths are relative to the repository root and use `/`. Matching is
//!   case-sensitive (git is) and by characters, not bytes.
//! - `*` matches any run of characters except `/` (none included); `?`
//!   exactly one character except `/`.
//! - `[abc]`, `[a-z]`, `[!a-z]` (or `[^a-z]`) match one character of (not
//!   of) the class; a class never matches `/`. A `]` first in the class is
//!   itself; a `-` first or last is itself; `\` escapes inside a class too.
//!   Refused: an unclosed `[`, a reversed range (`[z-a]`), a `/` inside a
//!   class, and POSIX names such as `[[:alpha:]]` (write `[a-zA-Z]`).
//! - `**` as a whole segment: `**/x` is `x` at any depth, `x/**` is
//!   everything inside `x`, `a/**/b` is `b` zero or more directories below
//!   `a`, and `**` alone is every path. `**` inside a segment (`a**b`) is
//!   two `*`, which is one `*`.
//! - `\` escapes the next character (`\*` is a literal star). It escapes only
//!   characters that need it: `\` before a letter, digit, `.`, `_` or `-`
//!   reads as a Windows separator and is refused; a trailing `\` and `\/` are
//!   refused.
//! - A pattern with no `/` except a trailing one matches at any depth: `*.rs`
//!   is `**/*.rs`. A `/` at the start or in the middle anchors it at the
//!   root: `/Cargo.toml` is the root's `Cargo.toml` only, `src/*.rs` only
//!   `src`'s own.
//! - A trailing `/` is dropped (the pattern names a directory); matching a
//!   directory covers everything under it: a pattern matches a path when it
//!   matches the path itself or one of its ancestor directories (`src/api`
//!   covers `src/api` and `src/api/x.rs`, not `src/apix`).
//! - Patterns and paths are compared in Unicode's composed form (NFC): a
//!   name macOS hands over decomposed (`e` + U+0301) is the same name as
//!   the composed one (`é`) a person types.
//! - Surrounding spaces are dropped (`\ ` keeps a trailing one). `./` and
//!   repeated `/` are normalised away.
//! - Refused, with a reason worded for a language model: an empty pattern, a
//!   `!` at the start (a reservation cannot exclude), a `#` at the start
//!   (gitignore's comment; write `\#`), `..` segments, absolute OS paths
//!   (`C:\`, `\\server`), control characters, more than
//!   [`PATTERN_MAX_BYTES`] (raw or normalised), and more than
//!   [`PATTERN_MAX_STARS`] `*` and `**`.
//!
//! # The normalised form ([`PathGlob::as_str`]), what is stored and shown
//!
//! Anchored and relative to the root, without a leading `/`, `./`, empty
//! segments or a trailing `/`: an unanchored pattern is written with its
//! `**/` (`*.rs` is stored as `**/*.rs`), so the stored text says which it
//! is: `Cargo.toml` (from `/Cargo.toml`) is the root's only. Read stored text
//! back with [`PathGlob::from_stored`] (not [`PathGlob::parse`], which would
//! read `Cargo.toml` as unanchored); `from_stored(g.as_str()) == g`.
//!
//! # Overlap
//!
//! [`PathGlob::overlaps`] is exact for every pattern this grammar accepts:
//! it answers whether some valid repository path (no empty, `.` or `..`
//! segment, no control character; the length limit aside) is covered by
//! both, deciding the emptiness of the intersection of the two patterns'
//! languages (each with "or anything below a matched directory") over the
//! product of their tokens, with a representative of every class of
//! characters the two patterns tell apart.
//!
//! [`RepoPath`] is a path taken literally (it may hold `*`, `[`, a tab or a
//! line break: any character a file name may hold but NUL), with the same
//! normalisation.

mod lex;
mod matching;
#[cfg(test)]
mod tests;

use std::fmt;

/// The longest pattern, in bytes (as given, and as normalised).
pub const PATTERN_MAX_BYTES: usize = 1024;
/// The most `*` and `**` a pattern may hold (an unanchored pattern's
/// implied `**/` counts): they, not the length, make deciding an overlap
/// dear (two patterns of 500 stars each take tens of milliseconds; of 16,
/// about one at worst, microseconds as people write them).
pub const PATTERN_MAX_STARS: usize = 16;
/// The longest repository path, in bytes.
pub const PATH_MAX_BYTES: usize = 4096;

/// A refusal worded for a language model: what is wrong, the limit or rule,
/// what to do instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobError {
    pub message: String,
}

impl fmt::Display for GlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for GlobError {}

impl GlobError {
    fn new(message: String) -> GlobError {
        GlobError { message }
    }
}

/// One character's test inside a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Tok {
    Lit(char),
    /// `?`
    One,
    /// `[...]`, an index into `classes`.
    Class(u32),
    /// `*`
    Star,
}

/// A character class: ranges (a single character is a range of one).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Class {
    negated: bool,
    ranges: Vec<(char, char)>,
}

impl Class {
    fn contains(&self, c: char) -> bool {
        c != '/' && self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
    }
}

/// The pattern by segments, for matching a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Seg {
    /// One segment matched by `toks[start..end]`.
    Name { start: u32, end: u32 },
    /// Any one segment.
    AnyName,
    /// Zero or more segments.
    AnyNames,
}

/// The pattern by characters, for deciding overlaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CTok {
    Lit(char),
    One,
    Class(u32),
    Star,
    /// `**/` at the start or `/**/` in the middle: nothing, or anything
    /// ending with `/`. Always followed by `DirsBody`: from `AnyDirs` the
    /// pattern may skip both (nothing) or take a character and go on in
    /// `DirsBody`, which takes anything and leaves after a `/`.
    AnyDirs,
    DirsBody,
    /// `/**` at the end, or `**` alone: anything.
    AnyRest,
}

/// A reservation pattern, normalised.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PathGlob {
    text: String,
    prefix: String,
    /// The longest run of literal characters after the prefix: a path the
    /// pattern matches holds it (a cheap test before matching).
    required: String,
    toks: Vec<Tok>,
    classes: Vec<Class>,
    segs: Vec<Seg>,
    chars: Vec<CTok>,
}

impl PathGlob {
    /// A pattern as an agent writes it (gitignore-style; see the module).
    pub fn parse(raw: &str) -> Result<PathGlob, GlobError> {
        lex::parse(&crate::text::nfc(raw), false)
    }

    /// A pattern as [`PathGlob::as_str`] wrote it (what the store keeps):
    /// always anchored at the root, an unanchored pattern carrying its `**/`.
    pub fn from_stored(text: &str) -> Result<PathGlob, GlobError> {
        lex::parse(text, true)
    }

    /// The normalised text, what is stored and shown.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the pattern matches the path itself or one of its ancestor
    /// directories.
    pub fn matches(&self, path: &RepoPath) -> bool {
        path.0.starts_with(&self.prefix)
            && matching::holds(
                &path.0.as_bytes()[self.prefix.len()..],
                self.required.as_bytes(),
            )
            && matching::matches(self, &path.0)
    }

    /// Whether some path could be matched by both (exact; see the module).
    pub fn overlaps(&self, other: &PathGlob) -> bool {
        if !(self.prefix.starts_with(&other.prefix) || other.prefix.starts_with(&self.prefix)) {
            return false;
        }
        matching::overlaps(self, other)
    }

    /// The longest glob-free leading part, unescaped ("" for unanchored
    /// patterns): every path the pattern matches starts with it.
    pub fn literal_prefix(&self) -> &str {
        &self.prefix
    }
}

impl fmt::Display for PathGlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A repository-relative file path (no glob: `*` and `[` are themselves),
/// normalised: no leading `/`, `./`, empty segment or trailing `/`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoPath(String);

impl RepoPath {
    pub fn parse(raw: &str) -> Result<RepoPath, GlobError> {
        let raw = &crate::text::nfc(raw);
        if raw.len() > PATH_MAX_BYTES {
            return Err(GlobError::new(format!(
                "path is {} bytes; the limit is {PATH_MAX_BYTES}. Give the path of one file or \
                 directory relative to the repository root.",
                raw.len()
            )));
        }
        // A file name may hold any character but NUL and `/` (git stores
        // tabs and line breaks too), and a pattern like `src/**` covers it:
        // a path is refused only for a NUL.
        if raw.contains('\0') {
            return Err(GlobError::new(
                "path holds a NUL character, which no file name holds. Give the path as it is \
                 in the repository."
                    .to_string(),
            ));
        }
        lex::refuse_os_absolute(raw, "path")?;
        let mut out = String::with_capacity(raw.len());
        for segment in raw.split('/') {
            match segment {
                "" | "." => continue,
                ".." => {
                    return Err(GlobError::new(format!(
                        "path {} has a `..` segment; paths are relative to the repository root \
                         and stay inside it. Write the path from the root, e.g. `src/lib.rs`.",
                        crate::text::quote(raw)
                    )));
                }
                _ => {
                    if !out.is_empty() {
                        out.push('/');
                    }
                    out.push_str(segment);
                }
            }
        }
        if out.is_empty() {
            return Err(GlobError::new(format!(
                "path {} names no file; give a path relative to the repository root, with `/`, \
                 e.g. `src/lib.rs`.",
                crate::text::quote(raw)
            )));
        }
        Ok(RepoPath(out))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RepoPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
