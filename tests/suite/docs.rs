//! The documentation a newcomer reads: README.md, ARCHITECTURE.md and the
//! reference in docs/. Every relative link resolves (the file exists, and an
//! anchor names one of its headings by GitHub's rule), every MCP tool the
//! server lists is named in docs/, and every command `--help` reaches is named
//! in docs/cli.md. No database and no server: the tools come from the
//! server's own list, the commands from the binary's `--help`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// docs/*.md, sorted.
fn reference() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "docs/ holds the reference, one file per topic; found only {files:?}"
    );
    files
}

/// Every Markdown file a reader follows links in.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md"), repo().join("ARCHITECTURE.md")];
    files.extend(reference());
    files
}

/// The lines outside fenced code blocks, with their numbers (from 1): a `#`
/// in a block is a comment, a `](` there is code.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// `line` without its inline code spans (`...`).
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The text inside code: inline spans and fenced blocks.
fn code_text(text: &str) -> String {
    let mut code = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            code.push_str(line);
            code.push('\n');
            continue;
        }
        for (i, span) in line.split('`').enumerate() {
            if i % 2 == 1 {
                code.push_str(span);
                code.push('\n');
            }
        }
    }
    code
}

/// `[text](target)` -> `text`, for headings whose anchor comes from what is shown.
fn link_texts(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(open) = rest.find("](") {
        let Some(close) = rest[open..].find(')') else {
            break;
        };
        out.push_str(&rest[..open]);
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out.replace(['[', ']'], "")
}

/// The anchor GitHub gives a heading: lower case, everything but letters,
/// digits, spaces, `-` and `_` dropped, each space a `-`.
fn anchor(heading: &str) -> String {
    link_texts(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every heading's anchor; a repeated heading gets `-1`, `-2`, ... as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let level = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) || !line[level..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[level..]);
        let mut candidate = base.clone();
        let mut n = 0;
        while found.contains(&candidate) {
            n += 1;
            candidate = format!("{base}-{n}");
        }
        found.insert(candidate);
    }
    found
}

/// The targets of inline links and images (`[text](target)`, `![alt](target)`)
/// and of reference definitions (`[label]: target`) outside code, with their
/// line numbers. Targets with a scheme (`https:`, `mailto:`) are left out.
fn relative_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    for (number, line) in prose_lines(text) {
        let line = without_code_spans(line);
        let mut targets = Vec::new();
        let mut rest = line.as_str();
        while let Some(open) = rest.find("](") {
            rest = &rest[open + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            // `(target "title")`: the target is the first word.
            targets.push(
                rest[..end]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
            rest = &rest[end..];
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
        {
            targets.push(
                trimmed[close + 2..]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
        }
        for target in targets {
            let scheme = target
                .split_once(':')
                .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic()));
            if !scheme {
                links.push((number, target));
            }
        }
    }
    links
}

/// What is wrong with the relative links of `text`, the file at `path`.
fn broken_links(path: &Path, text: &str) -> Vec<String> {
    let dir = path.parent().unwrap();
    let mut problems = Vec::new();
    for (line, target) in relative_links(text) {
        let place = format!("{}:{line}: `{target}`", path.display());
        if target.is_empty() {
            problems.push(format!("{place}: an empty link"));
            continue;
        }
        let (file, fragment) = match target.split_once('#') {
            Some((file, fragment)) => (file, Some(fragment)),
            None => (target.as_str(), None),
        };
        let linked = if file.is_empty() {
            path.to_path_buf()
        } else {
            dir.join(file)
        };
        if !file.is_empty() && !linked.exists() {
            problems.push(format!("{place}: {} does not exist", linked.display()));
            continue;
        }
        let Some(fragment) = fragment else { continue };
        if linked.extension().is_none_or(|x| x != "md") {
            problems.push(format!(
                "{place}: an anchor into a file that is not Markdown"
            ));
            continue;
        }
        // A link within the page reads the text given, not the file on disk.
        let headings = if file.is_empty() {
            anchors(text)
        } else {
            anchors(&read(&linked))
        };
        if !headings.contains(fragment) {
            problems.push(format!(
                "{place}: no heading of {} has the anchor `#{fragment}` (it has: {})",
                linked.display(),
                headings.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    problems
}

#[test]
fn anchors_follow_githubs_rule() {
    for (heading, expected) in [
        (" Storage: usage, quota, prune", "storage-usage-quota-prune"),
        (" Profiles and `.acs.toml`", "profiles-and-acstoml"),
        (
            " Connect Claude Code / Codex / Cursor",
            "connect-claude-code--codex--cursor",
        ),
        (" Refusals on /mcp", "refusals-on-mcp"),
        (
            " The [CLI](cli.md) and snake_case",
            "the-cli-and-snake_case",
        ),
    ] {
        assert_eq!(anchor(heading), expected, "{heading}");
    }
    let twice = anchors("# A\n\n## A\n\n```sh\n# not a heading\n```\n#not one either\n");
    assert_eq!(twice, BTreeSet::from(["a".to_string(), "a-1".to_string()]));
}

/// The checker itself reports a missing file, a missing anchor and a link
/// into a heading that only a code block holds; it passes what resolves.
#[test]
fn the_link_checker_finds_broken_links() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("other.md"), "# Other\n\n## A part\n").unwrap();
    let page = dir.path().join("page.md");
    let text = "# Page\n\n\
        [fine](other.md#a-part), [here](#page), ![img](other.md) and [web](https://example.com/x#y).\n\
        [gone](nowhere.md) and [no such part](other.md#b-part) and [self](#nothing).\n\
        `[code](not-a-link.md)`\n\
        ```\n[block](not-a-link-either.md)\n# fenced\n```\n\
        [fenced](#fenced)\n\
        [ref]: also-gone.md\n";
    let problems = broken_links(&page, text);
    let joined = problems.join("\n");
    assert_eq!(problems.len(), 5, "{joined}");
    for expected in [
        "`nowhere.md`",
        "other.md#b-part",
        "#nothing",
        "#fenced",
        "also-gone.md",
    ] {
        assert!(
            joined.contains(expected),
            "`{expected}` not reported: {joined}"
        );
    }
}

#[test]
fn every_relative_link_in_the_readme_architecture_and_docs_resolves() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for path in documents() {
        let text = read(&path);
        checked += relative_links(&text).len();
        problems.extend(broken_links(&path, &text));
    }
    // The README's map alone links every docs file: a parser that finds
    // nothing would pass anything.
    assert!(checked >= 30, "only {checked} relative links found");
    assert!(
        problems.is_empty(),
        "{} broken link(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Words (letters, digits, `_`, `-`) of `text`.
fn words(text: &str) -> BTreeSet<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn every_tool_the_server_lists_is_documented_in_docs() {
    let tools: Vec<String> = ai_crew_sync::mcp::BusServer::tool_list()
        .into_iter()
        .map(|tool| tool.name.to_string())
        .collect();
    for known in ["whoami", "post_message", "send_conversation_message"] {
        assert!(tools.iter().any(|t| t == known), "{known} not in {tools:?}");
    }
    let code: String = reference().iter().map(|p| code_text(&read(p))).collect();
    let named = words(&code);
    let missing: Vec<&String> = tools
        .iter()
        .filter(|tool| !named.contains(tool.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "tools the server lists that no docs/*.md names in code (`tool`): {missing:?}. \
         Describe each in docs/tools.md and add it to the table at its top."
    );
}

/// The subcommands `ai-crew-sync ARGS --help` lists under "Commands:", less `help`.
fn subcommands(args: &[String]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run ai-crew-sync --help");
    assert!(
        out.status.success(),
        "{args:?} --help: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let help = String::from_utf8(out.stdout).unwrap();
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        // A description wrapped onto a further line is indented deeper.
        .filter(|l| !l[2..].starts_with(' '))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect()
}

/// Every command path (`team`, `team create`, ...), walking `--help` down.
fn command_paths() -> Vec<String> {
    let mut paths = Vec::new();
    let mut queue = vec![Vec::<String>::new()];
    while let Some(parent) = queue.pop() {
        for name in subcommands(&parent) {
            let mut path = parent.clone();
            path.push(name);
            paths.push(path.join(" "));
            queue.push(path);
        }
    }
    paths.sort();
    paths
}

#[test]
fn every_cli_command_is_documented_in_docs_cli() {
    let paths = command_paths();
    for known in [
        "serve",
        "team create",
        "admin token issue",
        "client task claim",
    ] {
        assert!(
            paths.iter().any(|p| p == known),
            "`{known}` not found walking --help: {paths:?}"
        );
    }
    let cli = read(&repo().join("docs/cli.md"));
    let spans: Vec<String> = cli
        .lines()
        .flat_map(|line| {
            line.split('`')
                .enumerate()
                .filter(|(i, _)| i % 2 == 1)
                .map(|(_, span)| span.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let named = |path: &str| {
        spans.iter().any(|span| {
            let span = span.strip_prefix("ai-crew-sync ").unwrap_or(span);
            span == path || span.starts_with(&format!("{path} "))
        })
    };
    let missing: Vec<&String> = paths.iter().filter(|p| !named(p)).collect();
    assert!(
        missing.is_empty(),
        "commands `--help` lists that docs/cli.md does not name in code \
         (`command` or `command ARGS`): {missing:?}. Add each to its \"Every command\" list."
    );
}
