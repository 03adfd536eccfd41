//! `client whoami` and `client digest`: who this window is, and what the
//! team did lately (`whoami`, `team_digest`).

use clap::Args;
use serde_json::{Value, json};

use super::{Print, Request, request, show};

#[derive(Args, Debug)]
pub(super) struct DigestArgs {
    /// How far back, 1..336 hours (default 24).
    #[arg(long)]
    hours: Option<i32>,
    /// Every channel, not only this window's focused one.
    #[arg(long)]
    all_channels: bool,
}

impl DigestArgs {
    /// The digest focuses on the window's default channel.
    pub(super) fn focused(&self) -> bool {
        !self.all_channels
    }
}

/// How to show an identity tool's answer.
pub(super) enum Show {
    Whoami,
    Digest,
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Identity(show))
}

pub(super) fn whoami() -> Request {
    shown("whoami", json!({}), Show::Whoami)
}

pub(super) fn digest(args: DigestArgs) -> Request {
    let DigestArgs {
        hours,
        all_channels,
    } = args;
    shown(
        "team_digest",
        json!({"hours": hours, "all_channels": all_channels.then_some(true)}),
        Show::Digest,
    )
}

/// Print an answer as text (`--json` is handled by the caller).
pub(super) fn print(show: Show, answer: &Value) -> anyhow::Result<()> {
    match show {
        Show::Whoami => show::whoami(answer),
        Show::Digest => show::digest(answer),
    }
    Ok(())
}
