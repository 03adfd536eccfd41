//! What the guard asks git: where a repository's hooks live, and which
//! paths a commit stages. Each is one `git` command run in the repository,
//! so git's own rules (`core.hooksPath`, linked worktrees, the temporary
//! index of `git commit -a` or `git commit PATH`, named by the
//! `GIT_INDEX_FILE` git exports to its hooks) decide, not a copy of them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// Run `git ARGS` in `repo`; its stdout, or an error quoting git's words.
fn git(repo: &Path, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .with_context(|| {
            format!(
                "could not run `git {}` in {}: is git installed and on PATH?",
                args.join(" "),
                repo.display()
            )
        })?;
    if !out.status.success() {
        bail!(
            "`git {}` in {} failed: {}",
            args.join(" "),
            repo.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The directory git runs `repo`'s hooks from: `.git/hooks`, or what
/// `core.hooksPath` names; a linked worktree shares its repository's.
pub fn hooks_dir(repo: &Path) -> anyhow::Result<PathBuf> {
    let out = git(repo, &["rev-parse", "--git-path", "hooks"]).with_context(|| {
        format!(
            "{} is not inside a git work tree (give --repo DIR naming one)",
            repo.display()
        )
    })?;
    let path = PathBuf::from(String::from_utf8_lossy(&out).trim_end_matches(['\n', '\r']));
    // Relative answers are relative to where git ran.
    Ok(if path.is_absolute() {
        path
    } else {
        repo.join(path)
    })
}

/// The top of `repo`'s work tree (where `.acs.toml` is looked for from).
pub fn top_level(repo: &Path) -> anyhow::Result<PathBuf> {
    let out = git(repo, &["rev-parse", "--show-toplevel"])?;
    Ok(PathBuf::from(
        String::from_utf8_lossy(&out).trim_end_matches(['\n', '\r']),
    ))
}

/// The paths the commit being made touches, relative to the repository's
/// root, each once, in git's order: added, copied (the copy), deleted,
/// modified, renamed (both the old and the new path) and type-changed.
pub fn staged_paths(repo: &Path) -> anyhow::Result<Vec<String>> {
    let out = git(
        repo,
        &[
            "diff",
            "--cached",
            "--name-status",
            "-z",
            "--no-relative",
            "--no-ext-diff",
            "--diff-filter=ACDMRT",
        ],
    )?;
    Ok(parse_name_status(&out))
}

/// `--name-status -z`: a status, then one path (two for a rename or copy),
/// each ended by NUL.
fn parse_name_status(out: &[u8]) -> Vec<String> {
    let mut fields = out.split(|b| *b == 0).filter(|f| !f.is_empty());
    let mut touched: Vec<&[u8]> = Vec::new();
    while let Some(status) = fields.next() {
        match status.first() {
            Some(b'R') => touched.extend(fields.next().into_iter().chain(fields.next())),
            // A copy leaves its source as it was.
            Some(b'C') => touched.extend(fields.nth(1)),
            _ => touched.extend(fields.next()),
        }
    }
    let mut seen = HashSet::new();
    touched
        .into_iter()
        .map(|path| String::from_utf8_lossy(path).into_owned())
        .filter(|path| seen.insert(path.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_name_status;

    #[test]
    fn renames_name_both_sides_and_copies_the_copy() {
        let out = b"M\0src/a.rs\0R087\0src/old.rs\0src/new.rs\0C100\0x.rs\0y.rs\0D\0gone.rs\0A\0src/a.rs\0";
        assert_eq!(
            parse_name_status(out),
            ["src/a.rs", "src/old.rs", "src/new.rs", "y.rs", "gone.rs"]
        );
        assert!(parse_name_status(b"").is_empty());
    }
}
