//! The rule by example, and `overlaps` and `matches` against brute force.

use super::*;

fn g(raw: &str) -> PathGlob {
    PathGlob::parse(raw).unwrap_or_else(|e| panic!("{raw}: {e}"))
}
fn p(raw: &str) -> RepoPath {
    RepoPath::parse(raw).unwrap_or_else(|e| panic!("{raw}: {e}"))
}
fn m(glob: &str, path: &str) -> bool {
    g(glob).matches(&p(path))
}
fn o(a: &str, b: &str) -> bool {
    let (x, y) = (g(a), g(b));
    let there = x.overlaps(&y);
    assert_eq!(
        there,
        y.overlaps(&x),
        "overlap of {a} and {b} is not symmetric"
    );
    there
}
fn refused(raw: &str) -> String {
    match PathGlob::parse(raw) {
        Ok(glob) => panic!("{raw:?} was accepted as {}", glob.as_str()),
        Err(e) => e.message,
    }
}

#[test]
fn literals_and_directories_cover_what_is_below_them() {
    assert!(m("src/api", "src/api"));
    assert!(m("src/api", "src/api/x.rs"));
    assert!(m("src/api/", "src/api/deep/x.rs"));
    assert!(!m("src/api", "src/apix"));
    assert!(!m("src/api", "src"));
    assert!(!m("src/api/x.rs", "src/api"));
    assert!(o("src/api", "src/api/x.rs"));
    assert!(!o("src/api", "src/apix"));
    assert!(!o("src/api/a.rs", "src/api/b.rs"));
    assert!(o("src/api/", "/src/api"));
}

#[test]
fn star_and_question_mark_stay_inside_one_name() {
    assert!(m("src/*.rs", "src/lib.rs"));
    assert!(m("src/*.rs", "src/.rs"));
    assert!(!m("src/*.rs", "src/api/lib.rs"));
    assert!(
        m("src/*", "src/api/lib.rs"),
        "src/api matches, so below it too"
    );
    assert!(m("src/?.rs", "src/a.rs"));
    assert!(
        m("src/?.rs", "src/é.rs"),
        "? is one character, not one byte"
    );
    assert!(!m("src/?.rs", "src/ab.rs"));
    assert!(!m("a?b", "a/b"));
    assert!(!m("/a*b", "a/b"));
    assert!(!o("/a*b", "/a/b"));
    assert!(o("src/*.rs", "src/lib.*"));
    assert!(!o("src/*.rs", "src/*.md"));
    assert!(o("src/a*", "src/*b"));
    assert_eq!(g("/a**b").as_str(), "a*b");
    assert_eq!(g("a***b").as_str(), "**/a*b");
}

#[test]
fn double_star_forms() {
    assert!(m("**/x.rs", "x.rs"));
    assert!(m("**/x.rs", "a/b/x.rs"));
    assert!(m("src/**", "src/a"));
    assert!(m("src/**", "src/a/b"));
    assert!(!m("src/**", "src"));
    assert!(!m("src/**", "srcx/a"));
    assert!(m("a/**/b", "a/b"));
    assert!(m("a/**/b", "a/x/y/b"));
    assert!(m("a/**/b", "a/x/b/c"));
    assert!(!m("a/**/b", "a/xb"));
    assert!(m("**", "anything/at/all"));
    assert!(o("src/**", "**/*.rs"));
    assert!(o("a/**/b", "a/b"));
    assert!(!o("src/**", "lib/**"));
    assert!(o("src/**", "src"));
    assert!(
        o("a/**/b", "a/c"),
        "a/c/b is in both: a/c covers what is below it"
    );
    assert!(!o("a/**/b", "/b/**"));
    assert!(o("a/**/b", "a/c/**"));
    assert_eq!(g("a/**/**/b").as_str(), "a/**/b");
    assert_eq!(g("**/**/x").as_str(), "**/x");
}

#[test]
fn classes_plain_ranges_and_negated() {
    assert!(m("v[12].txt", "v1.txt"));
    assert!(!m("v[12].txt", "v3.txt"));
    assert!(m("v[0-9].txt", "v7.txt"));
    assert!(!m("v[!0-9].txt", "v7.txt"));
    assert!(m("v[!0-9].txt", "vx.txt"));
    assert!(m("v[^0-9].txt", "vx.txt"));
    assert_eq!(g("v[^0-9]").as_str(), "**/v[!0-9]");
    assert!(!m("a[!x]b", "a/b"), "a class never matches /");
    assert!(m("[]]", "]"));
    assert!(m("[!]]", "a"));
    assert!(m("[a-]", "-"));
    assert!(o("[a-c]", "[c-e]"));
    assert!(!o("/[a-c]", "/[d-f]"));
    assert!(!o("/[!a]", "/a"));
    assert!(o("/[!a]", "/[!b]"), "c is in both");
    assert!(!o("/[!a-z]", "/[b-y]"));
    assert!(o("/[!a-z]", "/?"));
    assert!(!o("/[a-c]x", "/[!a-c]x"));
}

#[test]
fn unanchored_patterns_match_at_any_depth() {
    assert_eq!(g("*.rs").as_str(), "**/*.rs");
    assert_eq!(g("Cargo.toml").as_str(), "**/Cargo.toml");
    assert_eq!(g("/Cargo.toml").as_str(), "Cargo.toml");
    assert_eq!(g("target/").as_str(), "**/target");
    assert_eq!(g("src/lib.rs").as_str(), "src/lib.rs");
    assert!(m("*.rs", "a/b/c.rs"));
    assert!(m("Cargo.toml", "crates/wire/Cargo.toml"));
    assert!(!m("/Cargo.toml", "crates/wire/Cargo.toml"));
    assert!(m("/Cargo.toml", "Cargo.toml"));
    assert!(m("target/", "crates/x/target/debug/a"));
    assert!(!m("src/*.rs", "crates/src/a.rs"), "a middle / anchors");
    assert!(o("Cargo.toml", "/crates/**"));
    assert!(!o("/Cargo.toml", "/crates/**"));
    assert_eq!(g("*.rs").literal_prefix(), "");
    assert_eq!(g("/src/api/*.rs").literal_prefix(), "src/api/");
    assert_eq!(g("/a\\*b/*").literal_prefix(), "a*b/");
}

#[test]
fn the_stored_form_reads_back_as_itself() {
    for raw in [
        "/Cargo.toml",
        "Cargo.toml",
        "*.rs",
        "src/**",
        "a/**/b",
        "**",
        "\\!x",
        "/\\!x",
        "/\\#x",
        "v[!0-9]",
        "[\\]\\-a-c]",
        "a\\*b",
        " \\ x\\ ",
        "/a/./b//c/",
        "[]a]",
    ] {
        let glob = g(raw);
        let back = PathGlob::from_stored(glob.as_str()).unwrap();
        assert_eq!(back, glob, "{raw} stored as {}", glob.as_str());
    }
    assert_eq!(g("./src//api/").as_str(), "src/api");
    assert_eq!(g("/a/./b").as_str(), "a/b");
}

#[test]
fn escapes_are_literal() {
    assert!(m("/a\\*b", "a*b"));
    assert!(!m("/a\\*b", "axb"));
    assert!(m("/a\\?", "a?"));
    assert!(!m("/a\\?", "ab"));
    assert!(m("/\\[x]", "[x]"));
    assert!(m("\\!important", "docs/!important"));
    assert!(m("/\\#x", "#x"));
    assert_eq!(g("/a\\*b").as_str(), "a\\*b");
    assert!(!o("/a\\*", "/ab"));
    assert!(o("/a\\*", "/a*"));
    assert_eq!(g("x\\ ").as_str(), "**/x\\ ");
    assert_eq!(g("  x  ").as_str(), "**/x");
}

#[test]
fn refusals_say_what_to_do() {
    assert!(refused("").contains("empty"));
    assert!(refused("   ").contains("empty"));
    assert!(refused("!src/**").contains("cannot exclude"));
    assert!(refused("#x").contains("comment"));
    assert!(refused("../x").contains("`..`"));
    assert!(refused("a/../b").contains("`..`"));
    assert!(refused("C:\\repo\\src").contains("relative to the repository root"));
    assert!(refused("c:/repo").contains("absolute"));
    assert!(refused("\\\\server\\share").contains("absolute"));
    assert!(refused("src\\api\\x.rs").contains("with `/`"));
    assert!(refused("a\tb").contains("control character"));
    assert!(refused("a[bc").contains("unclosed `[`"));
    assert!(refused("a[").contains("unclosed `[`"));
    assert!(refused("a[b-").contains("unclosed `[`"));
    assert!(refused("[z-a]").contains("reversed"));
    assert!(refused("[a/b]").contains("`/` inside"));
    assert!(refused("[[:alpha:]]").contains("POSIX"));
    assert!(refused("x\\").contains("lone"));
    assert!(refused("a\\/b").contains("escapes a `/`"));
    assert!(refused("./").contains("names nothing"));
    assert!(refused(&"a".repeat(PATTERN_MAX_BYTES + 1)).contains("limit is 1024"));
    assert!(refused(&"*a".repeat(PATTERN_MAX_STARS)).contains("limit is 16"));
    g(&format!("/{}", "*a".repeat(PATTERN_MAX_STARS)));
    assert!(refused(&"a".repeat(PATTERN_MAX_BYTES)).contains("once normalised"));
    g(&format!("/{}", "a".repeat(PATTERN_MAX_BYTES - 1)));
}

#[test]
fn repo_paths_are_literal_and_normalised() {
    assert_eq!(p("./src//a.rs").as_str(), "src/a.rs");
    assert_eq!(p("/src/a.rs/").as_str(), "src/a.rs");
    assert_eq!(p("src/[x]*.rs").as_str(), "src/[x]*.rs");
    assert!(m("/src/\\[x\\]\\*.rs", "src/[x]*.rs"));
    for bad in ["", ".", "/", "../a", "a/../b", "C:\\x", "a\0b"] {
        assert!(RepoPath::parse(bad).is_err(), "{bad:?}");
    }
    // A file name may hold a tab or a line break (git stores them), and a
    // pattern over its directory covers it.
    assert_eq!(p("src/api/a\tb.rs").as_str(), "src/api/a\tb.rs");
    assert!(m("src/api/**", "src/api/a\tb.rs"));
    assert!(m("src/api/*.rs", "src/api/line\nbreak.rs"));
    assert!(RepoPath::parse(&"a".repeat(PATH_MAX_BYTES + 1)).is_err());
    assert!(RepoPath::parse(&"a".repeat(PATH_MAX_BYTES)).is_ok());
    assert!(m("SRC", "SRC") && !m("SRC", "src"), "case-sensitive");
    // A decomposed name (as macOS gives it) is the composed one.
    assert!(m("docs/caf\u{e9}/**", "docs/cafe\u{301}/menu.md"));
    assert!(m("docs/cafe\u{301}.md", "docs/caf\u{e9}.md"));
    assert_eq!(p("cafe\u{301}").as_str(), "caf\u{e9}");
}

/// A deterministic generator (xorshift), no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random pattern over {a, b}: up to three segments, `**` ones among
/// them, of at most three tokens in all (so that two patterns that meet do
/// so mostly on a path of at most 7 characters), anchored or not, a trailing `/`
/// sometimes.
fn random_pattern(rng: &mut Rng) -> String {
    const TOKENS: [&str; 10] = [
        "a", "b", "?", "*", "[ab]", "[!a]", "[a-b]", "[!ab]", "a", "b",
    ];
    let mut out = String::new();
    if rng.below(3) == 0 {
        out.push('/');
    }
    let segments = 1 + rng.below(3);
    let mut budget = 3;
    for s in 0..segments {
        if s > 0 {
            out.push('/');
        }
        if budget == 0 || rng.below(5) == 0 {
            out.push_str("**");
            continue;
        }
        let n = (1 + rng.below(2)).min(budget);
        budget -= n;
        for _ in 0..n {
            out.push_str(TOKENS[rng.below(TOKENS.len())]);
        }
    }
    if rng.below(6) == 0 {
        out.push('/');
    }
    out
}

/// Every valid path over {a, b, c, /} up to `max` characters (`c` stands for
/// every character the patterns do not name).
fn every_path(max: usize) -> Vec<RepoPath> {
    let mut out = Vec::new();
    let mut layer = vec![String::new()];
    for _ in 0..max {
        let mut next = Vec::new();
        for s in &layer {
            for c in ['a', 'b', 'c', '/'] {
                let t = format!("{s}{c}");
                if !t.starts_with('/') && !t.contains("//") {
                    next.push(t);
                }
            }
        }
        out.extend(
            next.iter()
                .filter(|t| !t.ends_with('/'))
                .map(|t| RepoPath(t.clone())),
        );
        layer = next;
    }
    out
}

/// A second matcher, written as plainly as possible over the character
/// tokens: backtracking, with "or below a match".
fn naive(toks: &[CTok], classes: &[Class], s: &[char]) -> bool {
    match toks.split_first() {
        None => s.is_empty() || s[0] == '/',
        Some((t, rest)) => match t {
            CTok::Lit(c) => s.first() == Some(c) && naive(rest, classes, &s[1..]),
            CTok::One => s.first().is_some_and(|c| *c != '/') && naive(rest, classes, &s[1..]),
            CTok::Class(k) => {
                s.first().is_some_and(|c| classes[*k as usize].contains(*c))
                    && naive(rest, classes, &s[1..])
            }
            CTok::Star => (0..=s.len())
                .take_while(|n| !s[..*n].contains(&'/'))
                .any(|n| naive(rest, classes, &s[n..])),
            CTok::AnyDirs => {
                let rest = &rest[1..]; // its DirsBody
                naive(rest, classes, s)
                    || (1..=s.len()).any(|n| s[n - 1] == '/' && naive(rest, classes, &s[n..]))
            }
            CTok::DirsBody => unreachable!("read with its AnyDirs"),
            CTok::AnyRest => (0..=s.len()).any(|n| naive(rest, classes, &s[n..])),
        },
    }
}

#[test]
fn overlaps_and_matches_agree_with_brute_force() {
    let paths = every_path(7);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let globs: Vec<PathGlob> = (0..300).map(|_| g(&random_pattern(&mut rng))).collect();
    let words = paths.len().div_ceil(64);
    let mut sets = Vec::new();
    for glob in &globs {
        let mut set = vec![0u64; words];
        for (k, path) in paths.iter().enumerate() {
            let hit = glob.matches(path);
            {
                let chars: Vec<char> = path.as_str().chars().collect();
                assert_eq!(
                    hit,
                    naive(&glob.chars, &glob.classes, &chars),
                    "{} on {}",
                    glob.as_str(),
                    path.as_str()
                );
            }
            if hit {
                assert!(path.as_str().starts_with(glob.literal_prefix()));
                set[k / 64] |= 1 << (k % 64);
            }
        }
        sets.push(set);
    }
    let mut both = 0;
    let mut longer = 0;
    for x in 0..globs.len() {
        for y in x..globs.len() {
            let (gx, gy) = (&globs[x], &globs[y]);
            let brute = sets[x].iter().zip(&sets[y]).any(|(a, b)| a & b != 0);
            let there = gx.overlaps(gy);
            assert_eq!(
                there,
                gy.overlaps(gx),
                "{} and {}",
                gx.as_str(),
                gy.as_str()
            );
            if brute {
                both += 1;
                assert!(there, "{} and {} meet", gx.as_str(), gy.as_str());
            } else if there {
                // They meet only on a longer path: the one the search found
                // must be covered by both.
                longer += 1;
                let found = matching::witness(gx, gy).unwrap();
                let path = RepoPath::parse(&found).unwrap();
                assert_eq!(path.as_str(), found, "{found} is a valid path");
                assert!(found.len() > 7, "{found} was in the brute force's reach");
                for glob in [gx, gy] {
                    let chars: Vec<char> = found.chars().collect();
                    assert!(glob.matches(&path), "{} on {found}", glob.as_str());
                    assert!(naive(&glob.chars, &glob.classes, &chars));
                }
            }
        }
    }
    eprintln!("{both} pairs meet; {longer} meet only past 7 characters");
    assert!(
        both > 1000,
        "the patterns meet often enough to test both answers: {both}"
    );
}

/// What the store and the hook do with many patterns: the literal-prefix
/// pre-filter, then `matches`, finds each path's one holder among 1 000
/// patterns and no other. (What it costs is the benchmark's `check_paths`
/// line, never a timing here.)
#[test]
fn the_literal_prefix_pre_filter_loses_no_match() {
    let mut globs = Vec::new();
    for k in 0..1000 {
        globs.push(g(&match k % 5 {
            0 => format!("crates/c{k}/src/**"),
            1 => format!("crates/c{k}/src/*.rs"),
            2 => format!("docs/d{k}/[a-m]*.md"),
            3 => format!("/src/m{k}/lib.rs"),
            _ => format!("**/gen{k}/*"),
        }));
    }
    let paths: Vec<RepoPath> = (0..50)
        .map(|k| p(&format!("crates/c{}/src/deep/f{k}.rs", k * 20)))
        .collect();
    for path in &paths {
        let filtered: Vec<&str> = globs
            .iter()
            .filter(|g| path.as_str().starts_with(g.literal_prefix()) && g.matches(path))
            .map(PathGlob::as_str)
            .collect();
        let all: Vec<&str> = globs
            .iter()
            .filter(|g| g.matches(path))
            .map(PathGlob::as_str)
            .collect();
        assert_eq!(filtered, all, "{}", path.as_str());
        assert_eq!(all.len(), 1, "{}: {all:?}", path.as_str());
    }
}

/// Patterns at the limits (1 KiB, [`PATTERN_MAX_STARS`] stars) are decided,
/// and rightly: the last 901 characters of `d` and `e` differ, `d` and `f`
/// end in different letters, and a directory `f` matches covers the deep
/// paths `h` asks for.
#[test]
fn patterns_at_the_limits_are_decided() {
    let n = PATTERN_MAX_STARS;
    let a = g(&format!("/{}", "*[ab]".repeat(n)));
    let b = g(&format!("/{}", "*[!a]?".repeat(n)));
    let c = g(&format!("/{}", "**/a*".repeat(n / 2)));
    let d = g(&format!("/{}c{}", "*a".repeat(n), "a".repeat(900)));
    let e = g(&format!("/{}d{}", "*a".repeat(n), "a".repeat(900)));
    let f = g(&format!("/{}d", "*[!b]".repeat(n)));
    let h = g(&format!("/{}/d", "**/*[!b]".repeat(n / 2)));
    for (x, y, meet) in [
        (&a, &b, true),
        (&a, &c, true),
        (&b, &c, true),
        (&d, &e, false),
        (&d, &f, false),
        (&f, &h, true),
        (&d, &h, true),
    ] {
        assert_eq!(x.overlaps(y), meet, "{} x {}", x.as_str(), y.as_str());
        assert_eq!(y.overlaps(x), meet, "{} x {}", y.as_str(), x.as_str());
    }
}
