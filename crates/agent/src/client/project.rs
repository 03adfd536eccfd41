//! `.acs.toml`: what a directory tree (usually a repository) works with —
//! which profile, which project, which default channel. It holds no secret
//! (a profile is named, never its token), so it may be committed for the
//! team; each person keeps a profile of that name on their own machine.
//!
//! ```toml
//! profile = "acme"
//! project = "billing"
//! channel = "billing-dev"
//! role = "backend"
//! ```
//!
//! The nearest file wins: the current directory, then each parent up to the
//! top of the git work tree (the first directory holding `.git`) or `$HOME`,
//! whichever comes first, and no further. Outside both, only the current
//! directory counts. A file above that line is not the user's to trust: a
//! `/tmp/.acs.toml` anyone can plant would otherwise choose the profile (and
//! so the token) of everyone working under `/tmp`. Within the search, a file
//! owned by another user (not root), or writable by every user, is skipped
//! with a warning on stderr: a `.git` is only a name, and anyone may create
//! `/tmp/.git` beside their `/tmp/.acs.toml`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};

pub const FILE_NAME: &str = ".acs.toml";

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProjectFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The role a window working here says it has (e.g. `reviewer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

/// The nearest `.acs.toml` at or above `dir` within its search (the module
/// doc says where it stops), with its path.
pub fn find(dir: &Path) -> anyhow::Result<Option<(PathBuf, ProjectFile)>> {
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| std::fs::canonicalize(&h).unwrap_or_else(|_| PathBuf::from(h)));
    for dir in searched(dir, home.as_deref()) {
        let path = dir.join(FILE_NAME);
        if let Some(why) = not_trusted(&path) {
            eprintln!(
                "ai-crew-sync: ignoring {}: {why}. Only your own project file (or root's) is \
                 used; remove it or, if it is yours, `chown` it to you and `chmod o-w` it.",
                path.display()
            );
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let file = toml::from_str(&text).with_context(|| {
                    format!(
                        "{} is not a project file: it may hold `profile`, `project`, \
                         `channel` and `role` (strings); fix it or write it again with `context set-project`",
                        path.display()
                    )
                })?;
                return Ok(Some((path, file)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }
    Ok(None)
}

/// Why the project file at `path` is not to be trusted, if it is not: owned
/// by another user than the caller or root, or writable by every user. A
/// file that is missing or unreadable is left to the read that follows.
fn not_trusted(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Some(format!(
            "it belongs to user id {}, not you ({me})",
            meta.uid()
        ));
    }
    if meta.mode() & 0o002 != 0 {
        return Some("every user of this machine may write it".to_owned());
    }
    None
}

/// The directories [`find`] looks in, nearest first: `dir` up to the first
/// that holds `.git` or is `home`; only `dir` when neither is above it.
fn searched<'a>(dir: &'a Path, home: Option<&Path>) -> Vec<&'a Path> {
    let mut walked = Vec::new();
    for d in dir.ancestors() {
        walked.push(d);
        if d.join(".git").exists() || home.is_some_and(|h| h == d) {
            return walked;
        }
    }
    vec![dir]
}

/// Where `set-project` writes from `dir`: the top of its git work tree, so
/// the whole repository shares it; `dir` itself outside a repository.
pub fn home_for(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|d| d.join(".git").exists())
        .unwrap_or(dir)
        .join(FILE_NAME)
}

/// Write `file` at `path` (not a secret: ordinary permissions).
pub fn write(path: &Path, file: &ProjectFile) -> anyhow::Result<()> {
    if file.profile.is_none()
        && file.project.is_none()
        && file.channel.is_none()
        && file.role.is_none()
    {
        bail!("nothing to write: give --profile, --project, --channel or --role");
    }
    let text = format!(
        "# ai-crew-sync: what work in this directory tree uses (see `ai-crew-sync context show`).\n\
         # No secret here: the profile's token stays in your own profiles file.\n{}",
        toml::to_string(file).context("writing the project file as TOML")?
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
