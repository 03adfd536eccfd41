//! `context hook --event pre_tool_use`: before the host's model edits a
//! file, ask the bus whether another window holds the path exclusively
//! (`check_paths`), and if so deny the edit in the host's format with a
//! reason that names the holder, the reservation and how to ask them.
//! Anything else is allowed silently: a tool that edits no file, a path
//! outside any git repository, no window for the conversation, a path no
//! one else holds exclusively.
//!
//! The hosts' formats, as their references document them:
//!
//! - Claude Code (<https://code.claude.com/docs/en/hooks>, "PreToolUse"
//!   input and decision control): `tool_name` `Edit`, `Write`, `MultiEdit`
//!   with `tool_input.file_path`, `NotebookEdit` with
//!   `tool_input.notebook_path` (absolute paths), beside `session_id` and
//!   `cwd`; a denial is `{"hookSpecificOutput": {"hookEventName":
//!   "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason":
//!   …}}` on stdout with exit 0, the reason shown to the model.
//! - Codex (<https://developers.openai.com/codex/hooks>, "PreToolUse"; the
//!   payload and output schemas in openai/codex
//!   `codex-rs/hooks/schema/generated/pre-tool-use.command.*.schema.json`,
//!   and openai/codex#18391 for `apply_patch`): `tool_name` `apply_patch`
//!   with the patch itself in `tool_input.command`, whose `*** Add File:`,
//!   `*** Update File:`, `*** Delete File:` and `*** Move to:` lines name
//!   the files (relative to `cwd`); the same `hookSpecificOutput` denial.
//! - Cursor: not read. Its file-edit hook input is not in a reference we
//!   could cite, and its hooks name the conversation `conversation_id`, not
//!   the `session_id` a proxy window is found by.
//!
//! Never block work on an outage: the caller bounds the whole hook by
//! [`super::HookEvent::deadline`] and, when the bus is down, silent or
//! refuses the window's credential, allows the edit and says which in one
//! line on stderr, as it does when the bus is busy (rate limited,
//! unavailable). Nothing else lets an edit through unchecked: an input past
//! [`INPUT_MAX`] or not JSON, and a check whose arguments the bus refused
//! (kind `invalid`), deny.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::{Connection, object};
use crate::client::guard::PATHS_PER_CALL;
use crate::client::project;
use crate::client::{Refused, Unauthenticated};

/// Everything this hook does ends within this (the host waits on it before
/// every edit; the issue allows 2 s, the process's start and exit included).
pub const DEADLINE: Duration = Duration::from_millis(1_500);
/// The most input read: a `Write`'s input holds the whole file it writes.
/// Past it the edit is denied (its file cannot be read from a cut input).
pub const INPUT_MAX: u64 = 64 * 1024 * 1024;
/// How long closing the connection may take once the answer is known.
const CLOSE_WITHIN: Duration = Duration::from_millis(200);

/// Claude Code's file-editing tools and the `tool_input` field naming the
/// file (the plugin's `PreToolUse` matcher names exactly these).
pub const CLAUDE_CODE_EDITS: &[(&str, &str)] = &[
    ("Edit", "file_path"),
    ("Write", "file_path"),
    ("MultiEdit", "file_path"),
    ("NotebookEdit", "notebook_path"),
];
/// Codex's file-editing tool: one patch, any number of files.
const CODEX_PATCH: &str = "apply_patch";

/// The hook's answer: the denial to print, or `None` to allow silently.
pub(super) async fn answer(
    input: &Value,
    dir: &Path,
    env_session: Option<String>,
    trail: &mut Vec<String>,
) -> anyhow::Result<Option<String>> {
    let tool = input["tool_name"].as_str().unwrap_or_default();
    let Some(files) = edited_files(input) else {
        trail.push(format!(
            "tool {tool:?} edits no file this hook reads: allowed without asking the bus"
        ));
        return Ok(None);
    };
    let cwd = input["cwd"].as_str().map(PathBuf::from);
    // The paths to check, by the project of the repository holding them.
    let mut groups: Vec<(Option<String>, Vec<String>)> = Vec::new();
    for file in &files {
        let Some((root, path)) = repository_path(file, cwd.as_deref()) else {
            trail.push(format!(
                "{tool} edits {}: outside any git repository, allowed",
                file.display()
            ));
            continue;
        };
        if path.len() > MAX_PATH_BYTES {
            // No repository holds such a path; the others are still checked.
            trail.push(format!(
                "{tool} edits a path of {} bytes, past {MAX_PATH_BYTES}: left out of the check",
                path.len()
            ));
            continue;
        }
        let project = project_of(&root);
        trail.push(format!(
            "{tool} edits {}: {path} in its repository {} (project {})",
            file.display(),
            root.display(),
            project.as_deref().unwrap_or("of the window")
        ));
        match groups.iter_mut().find(|(p, _)| *p == project) {
            Some((_, paths)) if paths.contains(&path) => {}
            Some((_, paths)) => paths.push(path),
            None => groups.push((project, vec![path])),
        }
    }
    if groups.is_empty() {
        return Ok(None);
    }
    let Some(host_session) = super::host_session_of(input, env_session, trail) else {
        return Ok(None);
    };
    let Some(window) = super::find_window(dir, &host_session, trail)? else {
        return Ok(None);
    };
    let bus = window
        .connect()
        .await
        .map_err(|err| outage(err, &window.url))?;
    let checked = check_all(&bus, &groups).await;
    // The answer is known: a slow goodbye must not cost the denial.
    let _ = tokio::time::timeout(CLOSE_WITHIN, bus.close()).await;
    let checked = match checked {
        Ok(checked) => checked,
        Err(err) if refused_as_invalid(&err) => {
            // The bus answered and refused what was asked (a path it would
            // not take): not an outage, so the edit is not waved through
            // unchecked. A busy or unavailable bus (rate limited, 503) is
            // an outage: the edit goes ahead.
            trail.push(format!("answer: denied (check_paths refused: {err:#})"));
            return Ok(Some(deny(&format!(
                "ai-crew-sync: this edit was not made: the bus would not check its path \
                 reservations ({}). Check them with check_paths, then edit again.",
                super::one_line(&Value::String(format!("{err:#}")))
            ))));
        }
        Err(err) => return Err(outage(err, &window.url)),
    };
    let denial = denial(&checked);
    trail.push(match &denial {
        Some(_) => "answer: denied (another window holds it exclusively)".into(),
        None => format!("answer: allowed (no other window holds {groups:?} exclusively)"),
    });
    Ok(denial.map(|reason| deny(&reason)))
}

/// The longest repository path checked: no repository holds a longer one
/// (and the bus refuses it).
const MAX_PATH_BYTES: usize = 4096;

/// Claude Code's (and Codex's) denial, with `reason` shown to the model.
pub fn deny(reason: &str) -> String {
    json!({"hookSpecificOutput": {
        "hookEventName": "PreToolUse",
        "permissionDecision": "deny",
        "permissionDecisionReason": reason,
    }})
    .to_string()
}

/// The project `.acs.toml` at the root of the repository names, if any.
fn project_of(root: &Path) -> Option<String> {
    let (_, file) = project::find(root).ok().flatten()?;
    file.project
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
}

/// `check_paths` for every group, [`PATHS_PER_CALL`] paths a call, each in
/// its repository's project (the window's when `.acs.toml` names none):
/// one answer holding every call's paths and `exclusive_elsewhere`.
async fn check_all(
    bus: &Connection,
    groups: &[(Option<String>, Vec<String>)],
) -> anyhow::Result<Value> {
    let mut held = Vec::new();
    let mut paths = Vec::new();
    for (project, all) in groups {
        for chunk in all.chunks(PATHS_PER_CALL) {
            let mut arguments = json!({ "paths": chunk });
            if let Some(project) = project {
                arguments["project"] = json!(project);
            }
            let answer = bus.call("check_paths", object(arguments)).await?;
            held.extend(
                answer["exclusive_elsewhere"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            );
            paths.extend(answer["paths"].as_array().cloned().unwrap_or_default());
        }
    }
    Ok(json!({"exclusive_elsewhere": held, "paths": paths}))
}

/// Whether the bus refused the check's arguments (kind `invalid`): the one
/// refusal that denies, since the file may be reserved and the bus is up.
fn refused_as_invalid(err: &anyhow::Error) -> bool {
    err.downcast_ref::<Refused>()
        .is_some_and(|r| r.kind == "invalid")
}

/// Whether the bus refused the window's credential: 401 at connection, or
/// a tool refusal of kind `unauthenticated` or `forbidden` (a window
/// revoked or replaced).
fn credential_refused(err: &anyhow::Error) -> bool {
    err.is::<Unauthenticated>()
        || err
            .downcast_ref::<Refused>()
            .is_some_and(|r| matches!(r.kind.as_str(), "unauthenticated" | "forbidden"))
}

/// Why the bus could not be asked, said as what it is: the credential
/// refused, or the bus down (not reached).
fn outage(err: anyhow::Error, url: &str) -> anyhow::Error {
    if credential_refused(&err) {
        return anyhow::anyhow!(
            "the bus at {url} refused this window's credential (401, or the window was revoked \
             or replaced): restart the host's `mcp proxy` for a new one"
        );
    }
    err.context(format!("the bus at {url} is down or unreachable"))
}

/// The files an edit tool names, as the host gave them (absolute, or
/// relative to `cwd`); `None` when the tool edits no file we know of.
fn edited_files(input: &Value) -> Option<Vec<PathBuf>> {
    let tool = input["tool_name"].as_str()?;
    let tool_input = &input["tool_input"];
    if tool == CODEX_PATCH {
        let patch = tool_input["command"].as_str()?;
        return Some(patch_files(patch));
    }
    let field = CLAUDE_CODE_EDITS
        .iter()
        .find(|(name, _)| *name == tool)
        .map(|(_, field)| *field)?;
    let path = tool_input[field].as_str().filter(|p| !p.is_empty())?;
    Some(vec![PathBuf::from(path)])
}

/// The files a Codex patch adds, updates, deletes or moves to (its header
/// lines, read with their surrounding whitespace trimmed as Codex does).
fn patch_files(patch: &str) -> Vec<PathBuf> {
    const HEADERS: &[&str] = &[
        "*** Add File:",
        "*** Update File:",
        "*** Delete File:",
        "*** Move to:",
    ];
    patch
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            HEADERS
                .iter()
                .find_map(|h| line.strip_prefix(h))
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
        })
        .collect()
}

/// The root of the git repository holding `file` (the one above the
/// file's directory, else above `cwd`), and `file` relative to it with `/`
/// separators; `None` when it is in no repository (or is not UTF-8).
fn repository_path(file: &Path, cwd: Option<&Path>) -> Option<(PathBuf, String)> {
    let file = if file.is_absolute() {
        file.to_path_buf()
    } else {
        cwd?.join(file)
    };
    let file = resolve(&lexical(&file));
    let root = file.parent().and_then(git_root).or_else(|| {
        cwd.map(|cwd| resolve(&lexical(cwd)))
            .and_then(|c| git_root(&c))
    })?;
    let relative = file.strip_prefix(&root).ok()?;
    let parts: Option<Vec<&str>> = relative
        .components()
        .map(|c| match c {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect();
    let parts = parts.filter(|p| !p.is_empty())?;
    let path = parts.join("/");
    Some((root, path))
}

/// `path` without `.` and with each `..` taking its parent away, without
/// asking the file system (the file may not exist yet).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `path` with its longest existing ancestor's symbolic links resolved (a
/// repository reached through a link is the same repository), the part not
/// yet created kept as written.
fn resolve(path: &Path) -> PathBuf {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            let mut out = real;
            out.extend(rest.iter().rev());
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// The nearest directory at or above `dir` holding `.git` (a directory, or
/// the file a worktree or submodule has).
fn git_root(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| d.join(".git").exists())
        .map(Path::to_path_buf)
}

/// The reason to deny, from `check_paths`' answer, when another window holds
/// one of the paths exclusively; `None` otherwise.
fn denial(checked: &Value) -> Option<String> {
    let held: Vec<&str> = checked["exclusive_elsewhere"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if held.is_empty() {
        return None;
    }
    let mut lines = Vec::new();
    let mut holders: Vec<String> = Vec::new();
    for entry in checked["paths"].as_array().into_iter().flatten() {
        let path = entry["path"].as_str().unwrap_or_default();
        if !held.contains(&path) {
            continue;
        }
        for r in entry["reservations"].as_array().into_iter().flatten() {
            if r["exclusive"] != Value::Bool(true) || r["mine"] == Value::Bool(true) {
                continue;
            }
            let holder = super::one_line(&r["holder"]);
            let reason = match super::one_line(&r["reason"]) {
                none if none.is_empty() => "no reason given".to_string(),
                reason => format!("\"{reason}\""),
            };
            lines.push(format!(
                "{path} is reserved exclusively by {holder} (pattern {}, {reason}) until {} \
                 ({} s left)",
                super::one_line(&r["pattern"]),
                super::text(&r["expires_at"]),
                r["seconds_left"],
            ));
            if !holders.contains(&holder) {
                holders.push(holder);
            }
        }
    }
    if lines.is_empty() {
        // The bus said held without the detail: say what it said.
        lines.push(format!(
            "{} held exclusively by another window",
            held.join(", ")
        ));
    }
    let ask = match holders.first() {
        Some(holder) => format!(
            "Ask them to release it or to make the change: post_message {{to: \"{holder}\", \
             body: …}}, or ask_agent {{to: \"{holder}\", question: …}} to wait for their answer"
        ),
        None => "Ask the holder (list_reservations names them)".to_string(),
    };
    Some(format!(
        "ai-crew-sync: this edit was not made. {}. {ask}; or work on another file until the \
         reservation is released or expires (check_paths says when it is free).",
        lines.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_of_claude_code_edits_and_of_a_codex_patch() {
        let edit = json!({"tool_name": "Edit", "tool_input": {"file_path": "/r/src/a.rs"}});
        assert_eq!(
            edited_files(&edit),
            Some(vec![PathBuf::from("/r/src/a.rs")])
        );
        let notebook = json!({"tool_name": "NotebookEdit",
                              "tool_input": {"notebook_path": "/r/n.ipynb", "new_source": ""}});
        assert_eq!(
            edited_files(&notebook),
            Some(vec![PathBuf::from("/r/n.ipynb")])
        );
        let bash = json!({"tool_name": "Bash", "tool_input": {"command": "ls"}});
        assert_eq!(edited_files(&bash), None);
        let patch = "*** Begin Patch\n*** Update File: src/api/x.rs\n@@\n-a\n+b\n  *** Add File: \
                     docs/new.md\n+hi\n*** Delete File: old.txt\n*** Update File: a.rs\n*** \
                     Move to: b.rs\n*** End Patch";
        let codex = json!({"tool_name": "apply_patch", "tool_input": {"command": patch}});
        assert_eq!(
            edited_files(&codex).unwrap(),
            ["src/api/x.rs", "docs/new.md", "old.txt", "a.rs", "b.rs"]
                .map(PathBuf::from)
                .to_vec()
        );
    }

    #[test]
    fn a_path_is_relative_to_its_repository_and_none_outside_one() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(repo.join("src")).unwrap();
        let nested = repo.join("src/api/new/x.rs");
        assert_eq!(
            repository_path(&nested, None).map(|(_, p)| p).as_deref(),
            Some("src/api/new/x.rs"),
            "a file not created yet, in a directory not created yet"
        );
        assert_eq!(
            repository_path(Path::new("src/../src/./a.rs"), Some(&repo))
                .map(|(_, p)| p)
                .as_deref(),
            Some("src/a.rs")
        );
        let outside = dir.path().join("elsewhere/x.rs");
        assert_eq!(repository_path(&outside, Some(&repo)), None);
        assert_eq!(repository_path(Path::new("x.rs"), None), None);
    }

    #[test]
    fn only_an_exclusive_reservation_of_another_window_denies() {
        let held = |exclusive: bool, mine: bool, elsewhere: &[&str]| {
            json!({"project": "", "exclusive_elsewhere": elsewhere, "paths": [{
                "path": "src/api/x.rs",
                "reservations": [{"pattern": "src/api/**", "exclusive": exclusive,
                    "reason": "API rewrite\u{1b}[2J", "agent": "bob", "session": "cc-b",
                    "holder": "bob/cc-b", "expires_at": "2026-12-05T20:00:00Z",
                    "seconds_left": 540, "mine": mine}]}]})
        };
        let reason = denial(&held(true, false, &["src/api/x.rs"])).unwrap();
        for said in [
            "src/api/x.rs",
            "bob/cc-b",
            "src/api/**",
            "API rewrite",
            "2026-12-05T20:00:00Z",
            "post_message {to: \"bob/cc-b\"",
            "ask_agent",
        ] {
            assert!(reason.contains(said), "{said:?} not in {reason}");
        }
        assert!(!reason.contains('\u{1b}'), "{reason}");
        assert_eq!(denial(&held(false, false, &[])), None);
        assert_eq!(denial(&held(true, true, &[])), None);
    }
}
