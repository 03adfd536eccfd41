//! What the embedded manager needs from the host, apart from PostgreSQL
//! itself: where the server binaries are, which user runs them when we are
//! root, and the small pid and private-file helpers. Kept apart from the
//! cluster's life cycle (`mod.rs`), which only calls these.

use std::fs::{self, OpenOptions};
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

/// The system user the server binaries run as when we are root.
pub const SERVER_USER: &str = "ai-crew-sync-pg";

/// [`SERVER_USER`], created (`useradd --system`, no home, no login shell)
/// when missing. A user of its own, never `nobody` (whose other processes,
/// every daemon that drops to it, would share the cluster's files) nor
/// `postgres` (a system PostgreSQL's clusters).
pub(super) fn unprivileged_user() -> Result<RunAs, EmbeddedError> {
    if let Some(user) = lookup_user(SERVER_USER) {
        return Ok(user);
    }
    let out = Command::new("useradd")
        .args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "ai-crew-sync embedded PostgreSQL",
            SERVER_USER,
        ])
        .output();
    // Another process may have created it meanwhile: look again either way.
    if let Some(user) = lookup_user(SERVER_USER) {
        return Ok(user);
    }
    let why = match out {
        Ok(out) => output_text(&out),
        Err(e) => format!("useradd could not run: {e}"),
    };
    Err(EmbeddedError::Command {
        command: format!("useradd --system {SERVER_USER}"),
        detail: format!(
            "running as root, the embedded PostgreSQL runs as the system user {SERVER_USER}, \
             which is missing and could not be created ({why}). Create it \
             (`useradd --system --user-group --no-create-home --shell /usr/sbin/nologin \
             {SERVER_USER}`), run as a normal user, or set DATABASE_URL"
        ),
    })
}

fn lookup_user(name: &str) -> Option<RunAs> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: getpwnam with a valid C string; the fields are copied out
    // before any other passwd call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Some(RunAs { uid, gid })
}

/// Let `user` reach `data_dir`: every directory above it (and it) that its
/// mode does not let `user` search gets one POSIX ACL entry, search (`x`)
/// for that user alone. This replaces the capability the server ran with
/// before (`CAP_DAC_READ_SEARCH`, which reads every file on the machine):
/// a default data directory under `/root` is reachable, nothing else is.
pub(super) fn grant_search(data_dir: &Path, user: &RunAs) -> Result<(), EmbeddedError> {
    use std::os::unix::fs::MetadataExt;
    for dir in data_dir.ancestors() {
        let meta = fs::metadata(dir).map_err(io_err(dir))?;
        let mode = meta.mode();
        let searchable = mode & 0o001 != 0
            || (meta.uid() == user.uid && mode & 0o100 != 0)
            || (meta.gid() == user.gid && mode & 0o010 != 0);
        if searchable {
            continue;
        }
        add_search_acl(dir, mode, user.uid).map_err(|e| EmbeddedError::Command {
            command: "embedded PostgreSQL".into(),
            detail: format!(
                "{} does not let the server's user {SERVER_USER} through (mode {:o}), and \
                 granting it search with an ACL failed ({e}). Grant it yourself (`setfacl -m \
                 u:{SERVER_USER}:x {}`), pick a --data-dir it can reach (e.g. \
                 /var/lib/ai-crew-sync), or set DATABASE_URL",
                dir.display(),
                mode & 0o7777,
                dir.display()
            ),
        })?;
    }
    Ok(())
}

/// `system.posix_acl_access` (version 2: entries of tag u16, perm u16, id
/// u32, little-endian, sorted by tag then id), with `uid` given search.
fn add_search_acl(dir: &Path, mode: u32, uid: u32) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    const USER_OBJ: u16 = 0x01;
    const USER: u16 = 0x02;
    const GROUP_OBJ: u16 = 0x04;
    const MASK: u16 = 0x10;
    const OTHER: u16 = 0x20;
    const NO_ID: u32 = u32::MAX;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let name = c"system.posix_acl_access";
    let mut buf = vec![0u8; 4096];
    // SAFETY: path and name are C strings; buf is writable for its length.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let mut entries: Vec<(u16, u16, u32)> = if n >= 4 {
        buf[4..n as usize]
            .chunks_exact(8)
            .map(|e| {
                (
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                )
            })
            .collect()
    } else {
        let err = std::io::Error::last_os_error();
        if n < 0 && err.raw_os_error() != Some(libc::ENODATA) {
            return Err(err);
        }
        // No ACL yet: the one the mode stands for.
        vec![
            (USER_OBJ, ((mode >> 6) & 7) as u16, NO_ID),
            (GROUP_OBJ, ((mode >> 3) & 7) as u16, NO_ID),
            (OTHER, (mode & 7) as u16, NO_ID),
        ]
    };
    match entries.iter_mut().find(|e| e.0 == USER && e.2 == uid) {
        Some(entry) => entry.1 |= 1,
        None => entries.push((USER, 1, uid)),
    }
    // The mask bounds every named entry: it must allow search too.
    let group = entries.iter().find(|e| e.0 == GROUP_OBJ).map_or(0, |e| e.1);
    match entries.iter_mut().find(|e| e.0 == MASK) {
        Some(mask) => mask.1 |= 1,
        None => entries.push((MASK, group | 1, NO_ID)),
    }
    entries.sort_by_key(|e| (e.0, e.2));
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    // SAFETY: as above; acl is readable for its length.
    let set = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            acl.as_ptr().cast(),
            acl.len(),
            0,
        )
    };
    if set != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Give `user` everything under `dir` (without following links), for a
/// cluster made by an earlier version as another user (`postgres`, `nobody`).
pub(super) fn chown_tree(dir: &Path, user: &RunAs) -> Result<(), EmbeddedError> {
    std::os::unix::fs::lchown(dir, Some(user.uid), Some(user.gid)).map_err(io_err(dir))?;
    if fs::symlink_metadata(dir).map_err(io_err(dir))?.is_dir() {
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            chown_tree(&entry.path(), user)?;
        }
    }
    Ok(())
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
    // A new file, never through a link left at the temporary name (one a
    // crash left is removed first: the link itself, not what it names).
    let _ = fs::remove_file(&tmp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
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
