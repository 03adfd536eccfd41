//! `guard install` / `guard uninstall`: the repository's `pre-commit` hook
//! that runs `ai-crew-sync guard check`.
//!
//! The guard's part of the hook sits between two marker lines ([`BEGIN`],
//! [`END`]), so installing twice finds it and changes nothing.
//!
//! - No `pre-commit` hook: a new shell script holding that part.
//! - A shell script there (a `#!` line naming `sh`, `bash`, `zsh` or
//!   `dash`, or no `#!` line): the part is inserted right after its first
//!   line (at the top without a `#!` line), and the script keeps its name.
//!   Hooks that pick what to run by the name they run as (`basename "$0"`:
//!   husky 4's) go on working. Uninstall takes out exactly those lines.
//! - Anything else (another interpreter, a binary, a symlink): kept beside
//!   it as [`KEPT_NAME`] and run first with the same arguments by a new
//!   script; its refusal refuses the commit, as before. Uninstall puts it
//!   back where it was.
//!
//! A hooks directory inside `.husky/_` (husky 9's `core.hooksPath`) is
//! refused: husky writes that directory again on each install, and finds
//! the team's hook by the name it runs as; `.husky/pre-commit` is where
//! the check goes there.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use super::git;

/// The hook git runs before a commit.
pub const HOOK_NAME: &str = "pre-commit";
/// Where a `pre-commit` hook found at install is kept, beside the guard's.
pub const KEPT_NAME: &str = "pre-commit.before-acs-guard";
/// The first line of the guard's part of the hook.
pub const BEGIN: &str = "# >>> ai-crew-sync guard >>>";
/// Its last line.
pub const END: &str = "# <<< ai-crew-sync guard <<<";
/// The line after [`BEGIN`] when the part was inserted into a shell script
/// that was there: uninstall then takes out only the part.
const INSERTED: &str = "# Inserted by `ai-crew-sync guard install` into the hook that was here; \
                        `ai-crew-sync guard uninstall` takes out these lines only.";

/// What `install` did.
#[derive(Debug, PartialEq)]
pub enum Installed {
    /// A new hook (there was none).
    Written { hook: PathBuf },
    /// A new hook, running the one that was there (now `kept`) first.
    Chained { hook: PathBuf, kept: PathBuf },
    /// The guard's part inserted into the shell script that was there.
    Inserted { hook: PathBuf },
    /// The hook already runs the guard: nothing changed.
    Already { hook: PathBuf },
}

/// What `uninstall` did.
#[derive(Debug, PartialEq)]
pub enum Uninstalled {
    /// The hook held only the guard: it is gone.
    Removed { hook: PathBuf },
    /// The guard's part taken out of the shell script it was inserted in.
    TakenOut { hook: PathBuf },
    /// The guard's hook is gone and the one kept at install is back.
    Restored { hook: PathBuf },
    /// Lines someone added around the guard's part stay in the hook (and
    /// the hook kept at install, if any, stays where it is).
    PartRemoved {
        hook: PathBuf,
        kept: Option<PathBuf>,
    },
    /// No guard in the hook: nothing changed.
    NotInstalled { hook: PathBuf },
}

impl fmt::Display for Installed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Installed::Written { hook } => write!(
                f,
                "installed the guard as {}: a commit touching paths another window holds \
                 exclusively is refused (ACS_GUARD=off skips the check; `ai-crew-sync guard \
                 uninstall` removes it)",
                hook.display()
            ),
            Installed::Chained { hook, kept } => write!(
                f,
                "installed the guard as {}; the pre-commit hook that was there is kept as {} \
                 and runs first (its refusal still refuses the commit); `ai-crew-sync guard \
                 uninstall` puts it back",
                hook.display(),
                kept.display()
            ),
            Installed::Inserted { hook } => write!(
                f,
                "installed the guard in {}: its lines run first in that script, which keeps \
                 its name and the rest of its text (ACS_GUARD=off skips the check; \
                 `ai-crew-sync guard uninstall` takes out only the guard's lines)",
                hook.display()
            ),
            Installed::Already { hook } => write!(
                f,
                "the guard is already installed in {}; nothing changed",
                hook.display()
            ),
        }
    }
}

impl fmt::Display for Uninstalled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uninstalled::Removed { hook } => write!(f, "removed the guard ({})", hook.display()),
            Uninstalled::TakenOut { hook } => write!(
                f,
                "removed the guard's lines from {}; the rest is as it was",
                hook.display()
            ),
            Uninstalled::Restored { hook } => write!(
                f,
                "removed the guard; the pre-commit hook it had kept is back as {}",
                hook.display()
            ),
            Uninstalled::PartRemoved { hook, kept } => {
                write!(
                    f,
                    "removed the guard's part of {}; the lines added around it stay",
                    hook.display()
                )?;
                match kept {
                    Some(kept) => write!(
                        f,
                        ", and so does the hook kept at install ({}): move it back by hand if \
                         it should run",
                        kept.display()
                    ),
                    None => Ok(()),
                }
            }
            Uninstalled::NotInstalled { hook } => write!(
                f,
                "the guard is not installed in {} (no `{BEGIN}` line); nothing changed",
                hook.display()
            ),
        }
    }
}

/// The hook's text: run the kept hook first, then `exe guard check` (else
/// `ai-crew-sync` on PATH; neither: one line, and the commit goes ahead).
fn script(exe: &Path) -> String {
    let quoted = format!("'{}'", exe.to_string_lossy().replace('\'', r"'\''"));
    format!(
        r#"#!/bin/sh
{BEGIN}
# Written by `ai-crew-sync guard install`; `ai-crew-sync guard uninstall` takes it out
# and puts back the hook that was here before (kept as {KEPT_NAME}).
# Refuses a commit touching paths another window holds exclusively on the bus;
# ACS_GUARD=off skips the check.
kept="$(dirname "$0")/{KEPT_NAME}"
if [ -x "$kept" ]; then
    "$kept" "$@" || exit $?
fi
acs={quoted}
if [ ! -x "$acs" ]; then
    acs=$(command -v ai-crew-sync) || {{
        echo "ai-crew-sync guard: ai-crew-sync is not on PATH; this commit was not checked" >&2
        exit 0
    }}
fi
"$acs" guard check || exit $?
{END}
"#
    )
}

/// The guard's part inserted into a shell script: runs the check, and
/// carries on with the script when the commit may go ahead.
fn part(exe: &Path) -> String {
    let quoted = format!("'{}'", exe.to_string_lossy().replace('\'', r"'\''"));
    format!(
        r#"{BEGIN}
{INSERTED}
# Refuses a commit touching paths another window holds exclusively on the bus;
# ACS_GUARD=off skips the check.
acs_guard={quoted}
[ -x "$acs_guard" ] || acs_guard=$(command -v ai-crew-sync) || acs_guard=
if [ -n "$acs_guard" ]; then
    "$acs_guard" guard check || exit $?
else
    echo "ai-crew-sync guard: ai-crew-sync is not on PATH; this commit was not checked" >&2
fi
unset acs_guard
{END}
"#
    )
}

/// Where the guard's part goes in `bytes` (an existing hook) when it is a
/// shell script: after its `#!` line naming sh, bash, zsh or dash (its
/// newline included), or at 0 without a `#!` line; `None` for anything
/// else (another interpreter, not text, a `#!` line with no newline).
fn insertion_point(bytes: &[u8]) -> Option<usize> {
    if std::str::from_utf8(bytes).is_err() || bytes.contains(&0) {
        return None;
    }
    if !bytes.starts_with(b"#!") {
        return Some(0);
    }
    let end = bytes.iter().position(|b| *b == b'\n')?;
    let line = std::str::from_utf8(&bytes[2..end]).ok()?;
    let mut words = line.split_whitespace();
    let mut program = words.next()?.rsplit('/').next()?;
    if program == "env" {
        program = words.find(|w| !w.starts_with('-'))?;
    }
    matches!(program, "sh" | "bash" | "zsh" | "dash").then_some(end + 1)
}

/// Whether the hooks directory `dir` is husky's (`.husky/_`, which husky
/// writes again on each install).
fn is_husky(dir: &Path) -> bool {
    let parts: Vec<_> = dir.components().map(|c| c.as_os_str()).collect();
    parts.windows(2).any(|w| w[0] == ".husky" && w[1] == "_")
}

/// Whether `bytes` (a hook file) holds the guard's part.
fn has_guard(bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes)
        .lines()
        .any(|l| l.trim_end() == BEGIN)
}

/// Install the guard in `repo`'s hooks directory (`core.hooksPath` and
/// linked worktrees included); `exe` is the binary the hook runs.
pub fn install(repo: &Path, exe: &Path) -> anyhow::Result<Installed> {
    let dir = git::hooks_dir(repo)?;
    if is_husky(&dir) {
        bail!(
            "git runs this repository's hooks from {} (core.hooksPath), husky's directory: husky \
             writes it again on each install, so a guard put there would be lost, and it runs \
             your hooks by the name they are run as. Nothing changed. Add the line \
             `ai-crew-sync guard check` to .husky/pre-commit instead (husky runs it before each \
             commit; ACS_GUARD=off still skips it)",
            dir.display()
        );
    }
    let hook = dir.join(HOOK_NAME);
    let kept = dir.join(KEPT_NAME);
    let meta = hook.symlink_metadata().ok();
    let existing = meta.is_some();
    if let Some(meta) = meta {
        let bytes = std::fs::read(&hook).unwrap_or_default();
        if has_guard(&bytes) {
            return Ok(Installed::Already { hook });
        }
        if meta.file_type().is_file()
            && let Some(at) = insertion_point(&bytes)
        {
            let mut text = bytes[..at].to_vec();
            text.extend_from_slice(part(exe).as_bytes());
            text.extend_from_slice(&bytes[at..]);
            replace(&dir, &hook, &text, meta.permissions())?;
            return Ok(Installed::Inserted { hook });
        }
        if kept.symlink_metadata().is_ok() {
            bail!(
                "{} exists already, so the pre-commit hook in {} cannot be kept under that name; \
                 nothing changed. Move or remove one of them (it is a hook an earlier install \
                 kept), then install again",
                kept.display(),
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Write beside, then move the old hook away and the new one in: a
    // failure part-way leaves the old hook where it was.
    let fresh = dir.join(format!(".{HOOK_NAME}.acs-guard.tmp"));
    std::fs::write(&fresh, script(exe)).with_context(|| format!("writing {}", fresh.display()))?;
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", fresh.display()))?;
    if existing {
        std::fs::rename(&hook, &kept)
            .with_context(|| format!("moving {} to {}", hook.display(), kept.display()))?;
    }
    std::fs::rename(&fresh, &hook)
        .with_context(|| format!("moving {} to {}", fresh.display(), hook.display()))?;
    Ok(if existing {
        Installed::Chained { hook, kept }
    } else {
        Installed::Written { hook }
    })
}

/// Put `text` in place of `hook` with `permissions`: written beside, then
/// moved in, so a failure part-way leaves the hook as it was.
fn replace(
    dir: &Path,
    hook: &Path,
    text: &[u8],
    permissions: std::fs::Permissions,
) -> anyhow::Result<()> {
    let fresh = dir.join(format!(".{HOOK_NAME}.acs-guard.tmp"));
    std::fs::write(&fresh, text).with_context(|| format!("writing {}", fresh.display()))?;
    std::fs::set_permissions(&fresh, permissions)
        .with_context(|| format!("setting the mode of {}", fresh.display()))?;
    std::fs::rename(&fresh, hook)
        .with_context(|| format!("moving {} to {}", fresh.display(), hook.display()))
}

/// `bytes` without the guard's part inserted in place (from its [`BEGIN`]
/// line to its [`END`] line, both included), when it was inserted (the
/// line after [`BEGIN`] is [`INSERTED`]).
fn without_inserted_part(bytes: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        lines.push((offset, line));
        offset += line.len();
    }
    let begin = lines.iter().position(|(_, l)| l.trim_end() == BEGIN)?;
    if lines.get(begin + 1)?.1.trim_end() != INSERTED {
        return None;
    }
    let end = begin
        + lines[begin..]
            .iter()
            .position(|(_, l)| l.trim_end() == END)?;
    let (from, _) = lines[begin];
    let (at, last) = lines[end];
    let mut out = bytes[..from].to_vec();
    out.extend_from_slice(&bytes[at + last.len()..]);
    Some(out)
}

/// Take the guard out of `repo`'s pre-commit hook, and put back the hook
/// kept at install.
pub fn uninstall(repo: &Path) -> anyhow::Result<Uninstalled> {
    let dir = git::hooks_dir(repo)?;
    let hook = dir.join(HOOK_NAME);
    let kept = dir.join(KEPT_NAME);
    let bytes = match std::fs::read(&hook) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", hook.display())),
    };
    if !has_guard(&bytes) {
        return Ok(Uninstalled::NotInstalled { hook });
    }
    if let Some(rest) = without_inserted_part(&bytes) {
        let permissions = std::fs::metadata(&hook)
            .with_context(|| format!("reading {}", hook.display()))?
            .permissions();
        replace(&dir, &hook, &rest, permissions)?;
        return Ok(Uninstalled::TakenOut { hook });
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut inside = false;
    let mut rest = String::new();
    for line in text.lines() {
        match line.trim_end() {
            BEGIN => inside = true,
            END if inside => inside = false,
            _ if !inside => {
                rest.push_str(line);
                rest.push('\n');
            }
            _ => {}
        }
    }
    let only_shebang = rest
        .lines()
        .all(|l| l.trim().is_empty() || (l.starts_with("#!") && l.contains("sh")));
    if !only_shebang {
        std::fs::write(&hook, rest).with_context(|| format!("writing {}", hook.display()))?;
        let kept = kept.symlink_metadata().is_ok().then_some(kept);
        return Ok(Uninstalled::PartRemoved { hook, kept });
    }
    if kept.symlink_metadata().is_ok() {
        std::fs::rename(&kept, &hook)
            .with_context(|| format!("moving {} back to {}", kept.display(), hook.display()))?;
        return Ok(Uninstalled::Restored { hook });
    }
    std::fs::remove_file(&hook).with_context(|| format!("removing {}", hook.display()))?;
    Ok(Uninstalled::Removed { hook })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shell_script_takes_the_part_after_its_first_line_and_gives_it_back() {
        for (hook, at) in [
            ("#!/bin/sh\necho hi\n", Some(10)),
            ("#!/usr/bin/env bash\necho hi", Some(20)),
            ("#! /bin/zsh -e\r\necho hi\n", Some(16)),
            ("echo no shebang\n", Some(0)),
            ("#!/usr/bin/env python3\nprint(1)\n", None),
            ("#!/usr/bin/env -S sh -e\nexit 0\n", Some(24)),
            ("#!/bin/sh", None),
        ] {
            assert_eq!(insertion_point(hook.as_bytes()), at, "{hook:?}");
            if let Some(at) = at {
                let mut with = hook.as_bytes()[..at].to_vec();
                with.extend_from_slice(part(Path::new("/x/acs")).as_bytes());
                with.extend_from_slice(&hook.as_bytes()[at..]);
                assert!(has_guard(&with));
                assert_eq!(without_inserted_part(&with).unwrap(), hook.as_bytes());
            }
        }
        assert_eq!(insertion_point(b"\x7fELF\0\0"), None);
        assert!(is_husky(Path::new("/r/.husky/_")));
        assert!(!is_husky(Path::new("/r/.husky")));
        assert!(!is_husky(Path::new("/r/.git/hooks")));
    }
}
