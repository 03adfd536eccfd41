//! `guard install` / `guard uninstall`: the repository's `pre-commit` hook
//! that runs `ai-crew-sync guard check`.
//!
//! The hook is a shell script whose guard part sits between two marker
//! lines ([`BEGIN`], [`END`]), so installing twice finds it and changes
//! nothing. A `pre-commit` hook already there (a script, a binary, a
//! symlink: anything) is kept beside it as [`KEPT_NAME`] and run first with
//! the same arguments: its refusal refuses the commit, as before. Uninstall
//! takes the guard part out and puts the kept hook back where it was.

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

/// What `install` did.
#[derive(Debug, PartialEq)]
pub enum Installed {
    /// A new hook (there was none).
    Written { hook: PathBuf },
    /// A new hook, running the one that was there (now `kept`) first.
    Chained { hook: PathBuf, kept: PathBuf },
    /// The hook already runs the guard: nothing changed.
    Already { hook: PathBuf },
}

/// What `uninstall` did.
#[derive(Debug, PartialEq)]
pub enum Uninstalled {
    /// The hook held only the guard: it is gone.
    Removed { hook: PathBuf },
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
    let hook = dir.join(HOOK_NAME);
    let kept = dir.join(KEPT_NAME);
    let existing = hook.symlink_metadata().is_ok();
    if existing {
        let bytes = std::fs::read(&hook).unwrap_or_default();
        if has_guard(&bytes) {
            return Ok(Installed::Already { hook });
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
