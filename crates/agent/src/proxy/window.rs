//! The proxy's window: which label a host conversation gets, the session
//! credential that makes it an authenticated window, and what the proxy says
//! about it on the bus (heartbeats).
//!
//! The label is derived from the host conversation's id (`--host-session`,
//! `CLAUDE_CODE_SESSION_ID`, or the thread a first tool call names in its
//! `_meta`: [`thread_in`], and `thread.rs` for the move), never random when an
//! id is known, so a restarted proxy for the same conversation is the same
//! window (its claims, locks, cursors and inbox are still there). It is a short
//! readable prefix of the id plus a hash of the whole id: valid whatever the
//! host sends, and two ids that share a prefix still differ.
//!
//! Registering a label that has a live session is refused by the bus. At start
//! the proxy revokes that session and registers again (epoch + 1): the host
//! restarted its server, so the older process is gone or must stop acting for
//! the window. When a session dies while the proxy runs, it registers again
//! but never revokes: a live session then belongs to a newer proxy.
//!
//! Not here: forwarding tool calls (`forward.rs`), the start-of-session text
//! (`instructions.rs`).

use std::path::Path;

use anyhow::{Context as _, anyhow};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::client::{self, Connection, Refused};

/// Where the host conversation's id came from, and the window label it maps to.
#[derive(Clone, Debug)]
pub struct HostSession {
    /// `--host-session`, `CLAUDE_CODE_SESSION_ID`, the first tool call's
    /// `_meta` key, or a random id.
    pub source: String,
    /// The host's id of the conversation (what its hooks receive as `session_id`).
    pub id: String,
    pub label: String,
    /// A random id: the first tool call may still name the conversation
    /// ([`thread_in`]), and the proxy then moves to that conversation's window.
    pub provisional: bool,
}

impl HostSession {
    fn named(source: impl Into<String>, id: String) -> HostSession {
        HostSession {
            source: source.into(),
            label: label_for(&id),
            id,
            provisional: false,
        }
    }
}

/// The host conversation this proxy serves: `--host-session`, else the id
/// Claude Code gives its MCP servers, else a random one, provisional until
/// the first tool call ([`thread_in`]); a random window is one a restart
/// does not find again.
pub fn host_session(flag: Option<String>) -> HostSession {
    let given = |v: Option<String>| v.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if let Some(id) = given(flag) {
        return HostSession::named("--host-session", id);
    }
    if let Some(id) = given(std::env::var("CLAUDE_CODE_SESSION_ID").ok()) {
        return HostSession::named("CLAUDE_CODE_SESSION_ID", id);
    }
    let id = format!("random-{}", hex::encode(rand::random::<[u8; 8]>()));
    HostSession {
        provisional: true,
        ..HostSession::named("random (the host named no conversation)", id)
    }
}

/// The `_meta` keys of a `tools/call` in which hosts send the id of the
/// conversation (thread, session) that made the call, in the order they are
/// looked at: Codex's `threadId`, OpenCode's `sessionID`, VS Code's
/// `vscode.conversationId`, ChatGPT's `openai/session`, and the plain
/// spellings of the same.
pub const THREAD_META_KEYS: &[&str] = &[
    "threadId",
    "thread_id",
    "sessionID",
    "sessionId",
    "session_id",
    "conversationId",
    "conversation_id",
    "vscode.conversationId",
    "openai/session",
];

/// A thread id longer than this is not taken for one (ids are UUID-sized).
const THREAD_ID_MAX_CHARS: usize = 256;

/// The host conversation a tool call's `_meta` names: the first of
/// [`THREAD_META_KEYS`] holding a non-empty string of at most 256 characters.
pub fn thread_in(meta: &serde_json::Map<String, serde_json::Value>) -> Option<HostSession> {
    THREAD_META_KEYS.iter().find_map(|key| {
        let id = meta.get(*key)?.as_str()?.trim();
        (!id.is_empty() && id.chars().count() <= THREAD_ID_MAX_CHARS).then(|| {
            HostSession::named(
                format!("_meta.{key} of the first tool call"),
                id.to_string(),
            )
        })
    })
}

/// `conv-<up to 12 letters and digits of the id>-<10 hex of its SHA-256>`:
/// at most 33 bytes of `[a-z0-9-]`, inside every label rule of the bus.
pub fn label_for(host_id: &str) -> String {
    let readable: String = host_id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .take(12)
        .collect();
    let digest = hex::encode(&Sha256::digest(host_id.as_bytes())[..5]);
    if readable.is_empty() {
        format!("conv-{digest}")
    } else {
        format!("conv-{readable}-{digest}")
    }
}

/// A session credential for the window: what every forwarded call carries.
/// The secret is never shown to the model or printed.
#[derive(Clone, Serialize, Deserialize)]
pub struct WindowCredential {
    pub label: String,
    pub address: String,
    pub credential: String,
    pub epoch: i64,
    pub expires_at: DateTime<Utc>,
    pub issued_at: DateTime<Utc>,
}

impl WindowCredential {
    /// When to renew: half-way through its lifetime.
    pub fn renew_at(&self) -> DateTime<Utc> {
        self.issued_at + (self.expires_at - self.issued_at) / 2
    }
}

/// Why a registration did not give a credential.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The label has a live session and taking it over was not allowed.
    #[error(
        "window `{0}` has a live session held by another process (a newer proxy for the same \
         host conversation?); this proxy no longer acts for it. Restart this MCP server to take \
         the window back."
    )]
    TakenOver(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// `register_session` for `label` with the agent token; with `take_over`, a
/// live session of that label is revoked first (see the module comment).
pub async fn register(
    url: &str,
    agent_token: &str,
    label: &str,
    ttl_seconds: i64,
    take_over: bool,
) -> Result<WindowCredential, RegisterError> {
    let args = object(json!({"session": label, "ttl_seconds": ttl_seconds}));
    let issued_at = Utc::now();
    let answer =
        match client::call_tool(url, agent_token, None, "register_session", args.clone()).await {
            Ok(answer) => answer,
            Err(err) if is_conflict(&err) => {
                if !take_over {
                    return Err(RegisterError::TakenOver(label.to_string()));
                }
                client::call_tool(
                    url,
                    agent_token,
                    None,
                    "revoke_session",
                    object(json!({"session": label})),
                )
                .await
                .with_context(|| format!("revoking the older session of window `{label}`"))?;
                client::call_tool(url, agent_token, None, "register_session", args)
                    .await
                    .with_context(|| format!("registering window `{label}`"))?
            }
            Err(err) => {
                return Err(RegisterError::Other(
                    err.context(format!("registering window `{label}`")),
                ));
            }
        };
    let text = |key: &str| {
        answer[key]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow!("register_session answered without `{key}`: {answer}"))
    };
    Ok(WindowCredential {
        label: text("session")?,
        address: text("address")?,
        credential: text("credential")?,
        epoch: answer["epoch"]
            .as_i64()
            .ok_or_else(|| anyhow!("register_session answered without `epoch`"))?,
        expires_at: text("expires_at")?
            .parse()
            .context("register_session's expires_at")?,
        issued_at,
    })
}

fn is_conflict(err: &anyhow::Error) -> bool {
    err.downcast_ref::<Refused>()
        .is_some_and(|r| r.kind == "conflict")
}

/// A connection that acts as the window: its credential, label and epoch on
/// every request (the epoch fences a connection the window has moved past).
pub async fn open(url: &str, window: &WindowCredential) -> anyhow::Result<Connection> {
    Connection::open_as_window(url, &window.credential, &window.label, window.epoch).await
}

/// `renew_session`: a new expiry, same secret and epoch.
pub async fn renew(
    connection: &Connection,
    window: &WindowCredential,
    ttl_seconds: i64,
) -> anyhow::Result<WindowCredential> {
    let issued_at = Utc::now();
    let answer = connection
        .call("renew_session", object(json!({"ttl_seconds": ttl_seconds})))
        .await?;
    let expires_at = answer["expires_at"]
        .as_str()
        .ok_or_else(|| anyhow!("renew_session answered without `expires_at`: {answer}"))?
        .parse()
        .context("renew_session's expires_at")?;
    Ok(WindowCredential {
        expires_at,
        issued_at,
        ..window.clone()
    })
}

/// The repository and branch of `dir` according to `git` (None outside a
/// repository or without git). Output is captured: stdout is the host's.
pub async fn git_place(dir: &Path) -> (Option<String>, Option<String>) {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(&dir)
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
                .filter(|out| out.status.success())
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
                .filter(|s| !s.is_empty())
        };
        let repo = git(&["rev-parse", "--show-toplevel"]).map(|top| {
            Path::new(&top)
                .file_name()
                .map_or(top.clone(), |n| n.to_string_lossy().into_owned())
        });
        let branch = repo
            .as_ref()
            .and_then(|_| git(&["branch", "--show-current"]));
        (repo, branch)
    })
    .await
    .unwrap_or((None, None))
}

pub use crate::client::{leaving, object};

/// What the proxy keeps about its window on this machine, so the hooks of
/// the same host conversation act as the same window
/// ([`client::window_state`]): written at registration, at a switch and at
/// each renewal.
pub fn keep_record(
    host: &HostSession,
    url: &str,
    team: &str,
    agent: &str,
    window: &WindowCredential,
) -> anyhow::Result<()> {
    let state = client::window_state::WindowState {
        host_session: host.id.clone(),
        label: window.label.clone(),
        url: url.to_string(),
        team: team.to_string(),
        agent: agent.to_string(),
        credential: window.credential.clone(),
        epoch: window.epoch,
        expires_at: window.expires_at,
        pid: std::process::id(),
        updated_at: Utc::now(),
    };
    state.save(&client::local_files::config_dir()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_stable_valid_and_tell_ids_apart() {
        let a = label_for("4f1c2a9e-7b7d-4c1e-9a55-0d3c1b2e9f10");
        assert_eq!(a, label_for("4f1c2a9e-7b7d-4c1e-9a55-0d3c1b2e9f10"));
        assert!(a.starts_with("conv-4f1c2a9e7b7d-"), "{a}");
        assert_ne!(label_for("same-prefix-1"), label_for("same-prefix-2"));
        for id in ["a", "///", "Ünïcödé and spaces", &"x".repeat(500)] {
            let label = label_for(id);
            assert_eq!(acs_wire::label::normalize(&label).unwrap(), label, "{id:?}");
        }
    }

    #[test]
    fn the_first_known_meta_key_names_the_thread() {
        let meta = |v: serde_json::Value| v.as_object().unwrap().clone();
        let codex = thread_in(&meta(json!({"progressToken": 3, "threadId": " T-1 "}))).unwrap();
        assert_eq!((codex.id.as_str(), codex.label), ("T-1", label_for("T-1")));
        assert_eq!(codex.source, "_meta.threadId of the first tool call");
        assert!(!codex.provisional);
        let both = thread_in(&meta(json!({"openai/session": "s", "sessionID": "o"}))).unwrap();
        assert_eq!(both.id, "o");
        for none in [
            json!({}),
            json!({"threadId": ""}),
            json!({"threadId": 7}),
            json!({"threadId": "x".repeat(257)}),
            json!({"claudecode/toolUseId": "toolu_1"}),
        ] {
            assert!(thread_in(&meta(none.clone())).is_none(), "{none}");
        }
    }
}
