//! The files a client keeps on its own machine: where they live and how
//! they are written. Everything here may hold a secret (a token, an admin
//! credential) or say which one to use, so files are written atomically
//! (temporary file, fsync, rename) with mode 0600 in a 0700 directory, and a
//! file that others can read is refused rather than trusted.
//!
//! The directory is checked before anything is written or read in it: it
//! must belong to this user and be writable by no one else
//! ([`check_private_dir`]). Whoever can write in it could plant a symlink
//! where a temporary file is about to be created, or replace a file between
//! two reads. New files are created with `O_EXCL | O_NOFOLLOW`
//! ([`create_new_private`]): never an existing file, never through a link.
//!
//! What this module deliberately does not do: parse the files. The admin
//! login, the profiles and the proxy's spool each own their format.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};

/// `$BUS_CONFIG_DIR`, else `$XDG_CONFIG_HOME/ai-crew-sync`, else
/// `~/.config/ai-crew-sync`.
pub fn config_dir() -> anyhow::Result<PathBuf> {
    let env = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("BUS_CONFIG_DIR")
        .or_else(|| env("XDG_CONFIG_HOME").map(|d| d.join("ai-crew-sync")))
        .or_else(|| env("HOME").map(|h| h.join(".config/ai-crew-sync")))
        .ok_or_else(|| {
            anyhow!("no HOME, XDG_CONFIG_HOME or BUS_CONFIG_DIR to keep local settings in")
        })
}

/// Create `dir` (0700, with its parents) when missing, then check it as
/// [`check_private_dir`] does.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    check_private_dir(dir)
}

/// Refuse a directory that is not this user's or that its group or others
/// may write in: files kept there could be planted, swapped or linked
/// elsewhere by someone else. A symlinked directory (a config directory kept
/// with one's dotfiles) is judged by what it points to.
pub fn check_private_dir(dir: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        bail!(
            "{} belongs to user id {}, not to you (user id {me}): whoever owns it can read or \
             replace the credentials and spools ai-crew-sync keeps there. Use a directory of \
             your own (set BUS_CONFIG_DIR), or make it yours with `chown {me} {}`, then try again",
            dir.display(),
            meta.uid(),
            dir.display()
        );
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        bail!(
            "{} is writable by its group or others (mode {:03o}): anyone who can write there can \
             plant or swap the credentials and spools ai-crew-sync keeps there. Make it private \
             with `chmod 700 {}`, then try again",
            dir.display(),
            mode & 0o777,
            dir.display()
        );
    }
    Ok(())
}

/// Create a new file at `path`, mode 0600, opened for writing: never an
/// existing file (`O_EXCL`) and never through a symlink (`O_NOFOLLOW`).
pub fn create_new_private(path: &Path) -> anyhow::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))
}

/// A name for a temporary file beside `path` that nobody can guess ahead:
/// `.<name>.<random>.<suffix>`.
pub fn temporary_beside(path: &Path, suffix: &str) -> anyhow::Result<PathBuf> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", path.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(dir.join(format!(
        ".{name}.{}.{suffix}",
        uuid::Uuid::new_v4().simple()
    )))
}

/// Write `bytes` to `path` atomically, readable and writable only by us,
/// creating its directory (0700) when missing; a directory that is not
/// private is refused ([`check_private_dir`]).
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", path.display()))?;
    private_dir(dir)?;
    let tmp = temporary_beside(path, "tmp")?;
    let mut file = create_new_private(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    // The rename is durable once the directory is.
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// The text of a private file; `None` when it does not exist. A file that
/// its group or others may read is refused: whatever it holds may already
/// have leaked, and using it would hide that. So is one in a directory that
/// is not private ([`check_private_dir`]): someone else could have put it
/// there.
pub fn read_private(path: &Path) -> anyhow::Result<Option<String>> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if let Some(dir) = path.parent() {
        check_private_dir(dir)?;
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "{} is readable by others (mode {mode:03o}) and holds credentials: make it private \
             with `chmod 600 {}` (and consider revoking the tokens in it), then try again",
            path.display(),
            path.display()
        );
    }
    std::fs::read_to_string(path)
        .map(Some)
        .with_context(|| format!("reading {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Issue 33 item 10: a temporary file is never an existing file nor a
    // symlink someone planted where it is about to be created.
    #[test]
    fn a_new_private_file_is_never_an_existing_file_or_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "theirs").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_new_private(&link).is_err(), "followed a symlink");
        assert!(create_new_private(&target).is_err(), "reused a file");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs");
        let fresh = dir.path().join("fresh");
        create_new_private(&fresh).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
