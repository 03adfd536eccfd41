//! `client lock …`: team-wide advisory locks (`acquire_lock`,
//! `release_lock`, `list_locks`).

use clap::Subcommand;
use serde_json::{Value, json};

use super::{Print, Request, request, show};

#[derive(Subcommand, Debug)]
pub(super) enum LockCommand {
    /// Take (or extend) a lock (acquire_lock).
    Acquire {
        /// The lock's name, team-wide (e.g. `deploy:prod`).
        name: String,
        /// Seconds to hold it, 5..86400 (default 300).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<i64>,
        /// One line saying why, shown to others.
        #[arg(long)]
        purpose: Option<String>,
    },
    /// Release a lock this window holds (release_lock).
    Release {
        /// The lock's name.
        name: String,
    },
    /// Locks that have not expired (list_locks).
    List,
}

/// How to show a lock tool's answer.
pub(super) enum Show {
    Lock,
    LockReleased,
    Locks,
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Locks(show))
}

pub(super) fn prepare(command: LockCommand) -> Request {
    match command {
        LockCommand::Acquire { name, ttl, purpose } => shown(
            "acquire_lock",
            json!({"name": name, "ttl_seconds": ttl, "purpose": purpose}),
            Show::Lock,
        ),
        LockCommand::Release { name } => {
            shown("release_lock", json!({"name": name}), Show::LockReleased)
        }
        LockCommand::List => shown("list_locks", json!({}), Show::Locks),
    }
}

/// Print an answer as text (`--json` is handled by the caller).
pub(super) fn print(show: Show, answer: &Value) -> anyhow::Result<()> {
    match show {
        Show::Lock => show::lock(answer),
        Show::LockReleased => show::lock_released(answer),
        Show::Locks => show::locks(answer),
    }
    Ok(())
}
