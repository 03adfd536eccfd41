//! What the embedded manager needs from the host, apart from PostgreSQL
//! itself: where the server binaries are, which user runs them when we are
//! root, and the small pid and private-file helpers. Kept apart from the
//! cluster's life cycle (`mod.rs`), which only calls these.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{EmbeddedError, PORT, RunAs, io_err};

/// PostgreSQL's socket lives at `<data-dir>/pgrun/.s.PGSQL.5432`: that path
/// must fit a Unix socket address (107 bytes on Linux), and the directory is
/// passed quoted in a server option, so it cannot hold a quote.
pub(super) fn check_socket_path(data_dir: &Path) -> Result<(), EmbeddedError> {
    let socket = data_dir.join("pgrun").join(format!(".s.PGSQL.{PORT}"));
    let text = socket.to_string_lossy();
    if text.len() > 100 || text.contains('\'') || text.contains('\\') {
        return Err(EmbeddedError::Command {
            command: "embedded PostgreSQL".into(),
            detail: format!(
                "its socket path {text} is too long (over 100 bytes) or holds a quote or \
                 backslash. Pick a shorter, plainer --data-dir (or BUS_DATA_DIR), or set DATABASE_URL."
            ),
        });
    }
    Ok(())
}

pub(super) fn command_error(name: &str, out: &Output) -> EmbeddedError {
    EmbeddedError::Command {
        command: name.into(),
        detail: output_text(out),
    }
}

pub(super) fn output_text(out: &Output) -> String {
    let mut text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if text.is_empty() {
        text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }
    format!("{} ({})", text, out.status)
}

pub(super) fn has_server_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// `BUS_PG_BIN_DIR` alone when set; otherwise PATH first, then
/// `pg_config --bindir`, then the newest `/usr/lib/postgresql/*/bin`.
/// (`scripts/lib/install-servers.sh` looks in the same places.)
pub(super) fn find_bin_dir() -> Result<PathBuf, EmbeddedError> {
    if let Some(dir) = std::env::var_os("BUS_PG_BIN_DIR").map(PathBuf::from) {
        if has_server_binaries(&dir) {
            return Ok(dir);
        }
        return Err(EmbeddedError::NoBinaries {
            searched: format!(
                "are in BUS_PG_BIN_DIR ({}), the only place looked while it is set. Point it at \
                 the directory that holds them (Debian/Ubuntu: /usr/lib/postgresql/<version>/bin), \
                 or unset it to search PATH, `pg_config --bindir` and /usr/lib/postgresql/*/bin",
                dir.display()
            ),
        });
    }
    search_bin_dir().ok_or_else(|| EmbeddedError::NoBinaries {
        searched: "were found on PATH, via `pg_config --bindir`, or under \
                   /usr/lib/postgresql/*/bin (if they are elsewhere, set BUS_PG_BIN_DIR to their \
                   directory)"
            .into(),
    })
}

pub(super) fn search_bin_dir() -> Option<PathBuf> {
    if let Some(initdb) = which("initdb") {
        let resolved = initdb.canonicalize().unwrap_or(initdb);
        if let Some(dir) = resolved.parent().filter(|d| has_server_binaries(d)) {
            return Some(dir.to_path_buf());
        }
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_server_binaries(&dir) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_server_binaries(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

pub(super) fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

pub(super) fn unprivileged_user() -> RunAs {
    for name in [c"postgres", c"nobody"] {
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        if !pw.is_null() {
            let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
            return RunAs { uid, gid };
        }
    }
    RunAs {
        uid: 65534,
        gid: 65534,
    }
}

pub(super) fn chown(path: &Path, user: &RunAs) -> Result<(), EmbeddedError> {
    std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid)).map_err(io_err(path))
}

/// Write `text` to a new file readable by its owner only.
pub(super) fn write_private(path: &Path, text: &str) -> Result<(), EmbeddedError> {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = fs::remove_file(path);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    file.write_all(text.as_bytes()).map_err(io_err(path))
}

pub(super) fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub(super) fn write_pid(path: &Path, pid: u32) -> Result<(), EmbeddedError> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
    writeln!(file, "{pid}").map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))
}

pub(super) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // Signal 0 checks existence; EPERM means it exists but is someone else's.
    unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM }
}
