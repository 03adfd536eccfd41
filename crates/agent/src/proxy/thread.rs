//! Moving the proxy to another window: [`Proxy::rebind`], the one path that
//! registers a window and speaks through it from then on (a profile switch
//! in `configure_session`, and the first call's thread below).
//!
//! The first call's thread: a host that names its conversation neither with
//! `--host-session` nor with `CLAUDE_CODE_SESSION_ID` may still send its id
//! in the `_meta` of each `tools/call` (Codex's `threadId`, OpenCode's
//! `sessionID`, …: [`window::THREAD_META_KEYS`]). Until the first call the
//! proxy holds a provisional random window (it needs one for `initialize`'s
//! instructions). When the first call names a thread, the proxy moves to that
//! thread's window *before* the call is carried out, so the call and all
//! after it run there, and a restart for the same thread finds the same
//! window. The provisional window leaves and is revoked (offline, and no
//! listing shows it any more), its record for the hooks removed; the inbox spool follows
//! the new host id at its next pass (`inbox.rs`).
//!
//! One proxy serves one host conversation: once decided, a call naming
//! another thread changes nothing; the proxy says so on stderr, once per
//! thread (for the first 16). A first call naming no thread keeps the random window.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::Proxy;
use super::calls::brief;
use super::window::{self, HostSession};
use crate::client::{self, local_files, window_state::WindowState};

/// The bound on saying goodbye to the provisional window.
const RETIRE_BOUND: Duration = Duration::from_secs(2);

/// How many other threads are reported on stderr, at most (a host might
/// name a new one on every call).
const IGNORED_REPORTED: usize = 16;

/// What the tool calls have said about the host conversation so far.
#[derive(Default)]
pub(super) struct Seen {
    /// The host conversation is settled: named at start, or by (the absence
    /// of) a thread in the first call.
    decided: bool,
    /// Other threads a call named, already reported on stderr.
    ignored: Vec<String>,
}

impl Proxy {
    /// Before a tool call runs: on the first call, move to the thread its
    /// `_meta` names when the host named no conversation at start. An error
    /// is what the model reads; nothing was done and the next call tries
    /// again.
    pub(super) async fn follow_thread(&self, meta: &Map<String, Value>) -> Result<(), String> {
        let named = window::thread_in(meta);
        let mut seen = self.thread.lock().await;
        let current = self.host();
        if seen.decided || !current.provisional {
            seen.decided = true;
            if let Some(other) = named
                && other.id != current.id
                && !seen.ignored.contains(&other.id)
                && seen.ignored.len() < IGNORED_REPORTED
            {
                tracing::info!(
                    "a tool call names host conversation {:?} ({}); this proxy stays in window {} \
                     of conversation {:?} ({}): one proxy serves one conversation",
                    other.id,
                    other.source.trim_end_matches(" of the first tool call"),
                    current.label,
                    current.id,
                    current.source
                );
                seen.ignored.push(other.id);
            }
            return Ok(());
        }
        let Some(thread) = named else {
            tracing::info!(
                label = %current.label,
                "the first tool call names no host conversation in its _meta; keeping the random \
                 window"
            );
            seen.decided = true;
            return Ok(());
        };
        self.switch_host(thread).await?;
        seen.decided = true;
        Ok(())
    }

    /// Serve `host` from now on: its window registered (taking over a live
    /// session, as at start), the provisional one retired. Before the bus
    /// was reached, only the host changes: the next attempt registers it.
    async fn switch_host(&self, host: HostSession) -> Result<(), String> {
        let _one = self.rebinding.lock().await;
        let old = self.host();
        let (url, token, profile, me, old_connection) = {
            let bound = self.bound.read().await;
            let me = json!({"team": bound.team, "agent": bound.agent});
            match (&bound.window, &bound.token) {
                (Some(_), Some(token)) => (
                    bound.url.clone(),
                    token.clone(),
                    bound.profile.clone(),
                    me,
                    bound.connection.clone(),
                ),
                _ => {
                    tracing::info!(label = %host.label, from = %host.source, "host conversation named before the bus was reached");
                    *self.host.write().expect("the host lock is never poisoned") = host;
                    return Ok(());
                }
            }
        };
        *self.host.write().expect("the host lock is never poisoned") = host.clone();
        if let Err(err) = self.rebind(&url, &token, profile, &me).await {
            *self.host.write().expect("the host lock is never poisoned") = old;
            return Err(format!(
                "this conversation's window {} (from {}) could not be registered on the bus at \
                 {url}: {}. Nothing was done; try the call again in a moment.",
                host.label,
                host.source,
                brief(&err)
            ));
        }
        tracing::info!(
            label = %host.label,
            from = %host.source,
            provisional = %old.label,
            "moved to the host conversation's window"
        );
        let retire = async {
            if let Some(connection) = old_connection {
                let _ = connection.call("heartbeat", window::leaving()).await;
            }
            let revoke = window::object(json!({"session": old.label}));
            if let Err(err) = client::call_tool(&url, &token, None, "revoke_session", revoke).await
            {
                tracing::warn!(
                    "could not revoke the provisional window {}: {err:#}",
                    old.label
                );
            }
        };
        if tokio::time::timeout(RETIRE_BOUND, retire).await.is_err() {
            tracing::warn!(
                "the bus was slow to retire the provisional window {}",
                old.label
            );
        }
        if let Err(err) = local_files::config_dir().and_then(|d| WindowState::remove(&d, &old.id)) {
            tracing::warn!("could not remove the provisional window's record: {err:#}");
        }
        Ok(())
    }

    /// Register the current host's window for the agent `token` (taking
    /// over a live session of that label), speak as `me` through it from now
    /// on, and say hello. The caller holds `rebinding`.
    pub(super) async fn rebind(
        &self,
        url: &str,
        token: &str,
        profile: Option<String>,
        me: &Value,
    ) -> anyhow::Result<()> {
        let label = self.host().label;
        let window =
            window::register(url, token, &label, self.options.session_ttl_seconds, true).await?;
        let connection = Arc::new(window::open(url, &window).await?);
        self.adopt(url, token, profile, me, window, connection)
            .await;
        *self.trouble.lock().await = None;
        if let Err(err) = self.hello().await {
            tracing::warn!("the first heartbeat of window {label} failed: {err:#}");
        }
        Ok(())
    }
}
