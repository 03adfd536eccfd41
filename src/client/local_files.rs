//! The files a client keeps on its own machine: where they live and how
//! they are written. Everything here may hold a secret (a token, an admin
//! credential) or say which one to use, so files are written atomically
//! (temporary file, fsync, rename) with mode 0600 in a 0700 directory, and a
//! file that others can read is refused rather than trusted.
//!
//! What this module deliberately does not do: parse the files. The admin
//! login, the profiles and the proxy's spool each own their format.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
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

/// Write `bytes` to `path` atomically, readable and writable only by us,
/// creating its directory (0700) when missing.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", path.display()))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
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
/// have leaked, and using it would hide that.
pub fn read_private(path: &Path) -> anyhow::Result<Option<String>> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
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
