//! The window's conversation inbox, kept on this machine: references the bus
//! hands out (`fetch_conversation_inbox`) are appended to the window's spool
//! and fsynced *before* `confirm_inbox_delivery` tells the bus they arrived
//! (`client::spool` says why that order loses nothing). At start, whatever
//! an earlier run of the same host conversation spooled and did not confirm
//! is confirmed first; a reference handed out again is spooled once.
//!
//! The loop polls every `inbox_poll` (at once again while the bus says
//! `more`), and backs off quietly while the team has conversations turned
//! off. Spool writes are a few small fsynced appends, done in place.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use super::Proxy;
use super::window::object;
use crate::client::spool::{self, Reference, Spool};
use crate::client::{Refused, local_files, window_state};

/// `confirm_inbox_delivery` takes at most this many ids.
const CONFIRM_MAX: usize = 100;
/// While the team has conversations off (the tools are refused), look again this seldom.
const OFF_POLL: Duration = Duration::from_secs(60);
/// How often a running proxy drops references confirmed long ago from its spool.
const COMPACT_EVERY: Duration = Duration::from_secs(3600);

impl Proxy {
    /// Keep the inbox until the proxy stops (the caller drops this future).
    /// The spool is the host conversation's: when the proxy moves to the
    /// conversation a first call named (`thread.rs`), the next pass opens
    /// that one's spool.
    pub(super) async fn keep_inbox(self: Arc<Self>) {
        let mut spool: Option<(String, Spool)> = None;
        let mut compacted_at: Option<tokio::time::Instant> = None;
        loop {
            let one = self.rebinding.lock().await;
            let host = self.host().id;
            if spool.as_ref().is_none_or(|(id, _)| *id != host) {
                match open_spool(&host) {
                    Ok(opened) => {
                        if let Some((_, left)) = spool.replace((host, opened)) {
                            retire(left);
                        }
                        compacted_at = None;
                    }
                    Err(err) => {
                        // Without a spool nothing is confirmed: the bus keeps
                        // owing the references, which is safe.
                        tracing::warn!("no inbox spool, so no delivery is confirmed: {err:#}");
                        return;
                    }
                }
            }
            let (_, spool) = spool.as_mut().expect("opened above");
            // At start and every hour: a proxy may run for days.
            if compacted_at.is_none_or(|at| at.elapsed() >= COMPACT_EVERY) {
                if let Err(err) = in_place(|| spool.compact(chrono::Utc::now())) {
                    tracing::warn!("compacting the inbox spool failed: {err:#}");
                }
                compacted_at = Some(tokio::time::Instant::now());
            }
            let pause = match self.inbox_pass(spool).await {
                Ok(true) => Duration::ZERO,
                Ok(false) => self.options.inbox_poll,
                Err(err) if refused_as(&err, "forbidden") => OFF_POLL,
                Err(err) => {
                    tracing::warn!("inbox: {err:#}");
                    self.options.inbox_poll
                }
            };
            drop(one);
            tokio::time::sleep(pause).await;
        }
    }

    /// Confirm what is spooled and unconfirmed, then fetch, spool and
    /// confirm one page. True when the bus says more is owed.
    async fn inbox_pass(&self, spool: &mut Spool) -> anyhow::Result<bool> {
        let leftover = spool.unconfirmed();
        self.confirm(spool, &leftover).await?;
        let page = self
            .call_json("fetch_conversation_inbox", object(json!({"limit": 50})))
            .await?;
        let references: Vec<Reference> =
            serde_json::from_value(page["deliveries"].clone()).unwrap_or_default();
        if !references.is_empty() {
            let to_confirm = in_place(|| spool.append(&references))?;
            self.confirm(spool, &to_confirm).await?;
        }
        Ok(page["more"] == Value::Bool(true))
    }

    /// Tell the bus these arrived, then record that it knows.
    async fn confirm(&self, spool: &mut Spool, ids: &[Uuid]) -> anyhow::Result<()> {
        for chunk in ids.chunks(CONFIRM_MAX) {
            self.call_json(
                "confirm_inbox_delivery",
                object(json!({"delivery_ids": chunk})),
            )
            .await?;
            in_place(|| spool.mark_confirmed(chunk))?;
        }
        Ok(())
    }
}

/// The spool of host conversation `host_id`'s window.
fn open_spool(host_id: &str) -> anyhow::Result<Spool> {
    let dir = local_files::config_dir()?;
    let path = spool::path_for(&dir, &window_state::key_for(host_id))?;
    in_place(|| Spool::open(&path))
}

/// The spool of a window the proxy left (the provisional one, revoked):
/// removed when it owes the bus nothing, else kept for a person to look at.
fn retire(left: Spool) {
    let owed = left.unconfirmed().len();
    if owed == 0 {
        if let Err(err) = std::fs::remove_file(left.path()) {
            tracing::warn!("could not remove {}: {err}", left.path().display());
        }
    } else {
        tracing::warn!(
            "{} keeps {owed} unconfirmed reference(s) of the window this proxy left",
            left.path().display()
        );
    }
}

/// Blocking file work (an fsync) without stalling the runtime's other tasks.
fn in_place<T>(work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    tokio::task::block_in_place(work)
}

fn refused_as(err: &anyhow::Error, kind: &str) -> bool {
    err.downcast_ref::<Refused>()
        .is_some_and(|r| r.kind == kind)
}
