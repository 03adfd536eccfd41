//! The windows held on this machine, one small private file per host
//! conversation: which bus, which agent, which window label, and the
//! window's session credential and epoch. The stdio proxy writes it when it
//! registers or renews its window (and reuses it after a restart, so the
//! same host conversation keeps the same window); the hooks read it, so a
//! hook speaks as the proxy's window of that conversation and as nothing
//! else. No file: no proxy for that conversation, and a hook does nothing.
//!
//! Beside each state file, the hooks keep their own marks (when the window
//! last looked, which questions already stopped a stop and what the last
//! blocked stop was for, which messages the model was shown), in a file of their
//! own so a hook never rewrites what the proxy wrote.
//!
//! Files live in `windows/` under the config directory, named by a digest
//! of the host conversation's id (the id itself may be long or odd), mode
//! 0600 in a 0700 directory.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::local_files;

/// One host conversation's window, as its proxy holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowState {
    /// The host's id of the conversation (Claude Code's session id).
    pub host_session: String,
    /// The window label on the bus.
    pub label: String,
    /// The bus's MCP endpoint.
    pub url: String,
    pub team: String,
    pub agent: String,
    /// The window's session credential (`acss_…`).
    pub credential: String,
    pub epoch: i64,
    pub expires_at: DateTime<Utc>,
    /// The proxy process holding it.
    pub pid: u32,
    pub updated_at: DateTime<Utc>,
}

/// What the hooks remember for a window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HookMarks {
    /// When a hook last put the window's news in front of the model.
    pub last_looked_at: Option<DateTime<Utc>>,
    /// Questions a stop was already blocked for: each stops one stop only.
    #[serde(default)]
    pub blocked_for: Vec<Uuid>,
    /// Leases already called out as about to lapse (`key@expiry`): a
    /// renewed lease is news again, the same one is not.
    #[serde(default)]
    pub leases_called_out: Vec<String>,
    /// Messages whose text a hook already put in front of the model (direct
    /// messages, questions, announcements, conversation messages), newest
    /// last: no later hook of the window shows them again.
    #[serde(default)]
    pub shown: Vec<Uuid>,
    /// Conversations already called out as owing acknowledgements
    /// (`id@first seq owed@how many`): the same debt is not news again.
    #[serde(default)]
    pub owed_called_out: Vec<String>,
    /// What the last stop was blocked for (its sorted keys: `task:K`,
    /// `lock:N`, `reservation:project:pattern`, `question:id`, `ack:…`);
    /// empty when the last stop blocked for nothing. A stop that finds
    /// exactly this again is not blocked: never twice in a row.
    #[serde(default)]
    pub stop_blocked_for: Vec<String>,
}

/// The file name stem for a host conversation: 32 hex digits of SHA-256.
pub fn key_for(host_session: &str) -> String {
    hex::encode(&Sha256::digest(host_session.as_bytes())[..16])
}

fn path_for(dir: &Path, host_session: &str, suffix: &str) -> PathBuf {
    dir.join("windows")
        .join(format!("{}{suffix}", key_for(host_session)))
}

impl WindowState {
    /// The state of `host_session`'s window, if a proxy holds one.
    pub fn load(dir: &Path, host_session: &str) -> anyhow::Result<Option<WindowState>> {
        let path = path_for(dir, host_session, ".json");
        let Some(text) = local_files::read_private(&path)? else {
            return Ok(None);
        };
        let state: WindowState = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a window state file", path.display()))?;
        // A digest collision is not worth a guess: the file must name it.
        Ok((state.host_session == host_session).then_some(state))
    }

    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let path = path_for(dir, &self.host_session, ".json");
        local_files::write_private(&path, &serde_json::to_vec_pretty(self)?)
    }

    /// Where `host_session`'s window record is (or would be).
    pub fn path(dir: &Path, host_session: &str) -> PathBuf {
        path_for(dir, host_session, ".json")
    }

    /// Every window record on this machine, newest first, with what could
    /// not be read as such (for `context hook --explain`).
    pub fn all(dir: &Path) -> Vec<(PathBuf, anyhow::Result<WindowState>)> {
        let Ok(entries) = std::fs::read_dir(dir.join("windows")) else {
            return Vec::new();
        };
        let mut found: Vec<(PathBuf, anyhow::Result<WindowState>)> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "json")
                    && !p.to_string_lossy().ends_with(".hook.json")
            })
            .map(|path| {
                let state = local_files::read_private(&path).and_then(|text| {
                    let text = text.context("gone meanwhile")?;
                    Ok(serde_json::from_str::<WindowState>(&text)?)
                });
                (path, state)
            })
            .collect();
        found.sort_by_key(|(_, s)| std::cmp::Reverse(s.as_ref().ok().map(|s| s.updated_at)));
        found
    }

    /// A connection to the bus as this window (its credential, label and
    /// epoch).
    pub async fn connect(&self) -> anyhow::Result<super::Connection> {
        super::Connection::open_as_window(&self.url, &self.credential, &self.label, self.epoch)
            .await
    }

    /// Whether the proxy that wrote the record still runs (a signal-0 probe).
    pub fn proxy_running(&self) -> bool {
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return false;
        };
        // SAFETY: kill with signal 0 sends nothing; it only checks the pid.
        pid > 0
            && (unsafe { libc::kill(pid, 0) } == 0
                || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
    }

    /// Forget the window (the proxy ended it).
    pub fn remove(dir: &Path, host_session: &str) -> anyhow::Result<()> {
        for suffix in [".json", ".hook.json"] {
            match std::fs::remove_file(path_for(dir, host_session, suffix)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }
}

impl HookMarks {
    pub fn load(dir: &Path, host_session: &str) -> anyhow::Result<HookMarks> {
        let path = path_for(dir, host_session, ".hook.json");
        match local_files::read_private(&path)? {
            None => Ok(HookMarks::default()),
            // Marks only spare the model repeats: unreadable ones start over.
            Some(text) => Ok(serde_json::from_str(&text).unwrap_or_default()),
        }
    }

    pub fn save(&self, dir: &Path, host_session: &str) -> anyhow::Result<()> {
        let path = path_for(dir, host_session, ".hook.json");
        local_files::write_private(&path, &serde_json::to_vec(self)?)
    }
}
