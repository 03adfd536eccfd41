//! `client send`, `read`, `search` and `channels`: channel posts and direct
//! messages (`post_message`, `read_messages`, `search_messages`,
//! `list_channels`).

use clap::Args;
use serde_json::{Value, json};

use super::files::read_stdin;
use super::{Print, Request, parse_json_object, request, show};

#[derive(Args, Debug)]
pub(super) struct SendArgs {
    /// Channel to post in (default: the window's default channel, as `whoami` names it; the
    /// channel .acs.toml names is told to the bus first).
    #[arg(long, conflicts_with = "to")]
    channel: Option<String>,
    /// Direct message to an address: `agent` (every window) or `agent/window`.
    #[arg(long)]
    to: Option<String>,
    /// Reach every window whatever channel it is focused on (channels only).
    #[arg(long)]
    announce: bool,
    /// Id of the message this answers.
    #[arg(long, value_name = "ID")]
    reply_to: Option<String>,
    /// A JSON object of small facts, up to 16 KiB.
    #[arg(long, value_name = "JSON")]
    metadata: Option<String>,
    /// The text (words are joined by spaces); `-` reads it from stdin.
    #[arg(required = true, value_name = "TEXT")]
    body: Vec<String>,
}

#[derive(Args, Debug)]
pub(super) struct ReadArgs {
    /// `all` (channels + your DMs), `inbox` (your DMs) or a channel name.
    #[arg(long)]
    scope: Option<String>,
    /// The latest page, read or not, without moving the cursor.
    #[arg(long)]
    all: bool,
    /// Page size, 1..200 (default 50).
    #[arg(long)]
    limit: Option<i64>,
    /// Include DMs addressed to this agent's other windows.
    #[arg(long)]
    all_sessions: bool,
}

#[derive(Args, Debug)]
pub(super) struct SearchArgs {
    /// Words to look for ("a phrase", OR, -word).
    query: String,
    /// At most this many results, 1..200 (default 50).
    #[arg(long)]
    limit: Option<i64>,
}

/// How to show a messaging tool's answer.
pub(super) enum Show {
    Sent,
    Messages,
    Channels,
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Messaging(show))
}

impl SendArgs {
    /// Neither --channel nor --to: the post goes to the window's default channel.
    pub(super) fn to_default_channel(&self) -> bool {
        self.channel.is_none() && self.to.is_none()
    }
}

pub(super) fn send(args: SendArgs) -> anyhow::Result<Request> {
    let SendArgs {
        channel,
        to,
        announce,
        reply_to,
        metadata,
        body,
    } = args;
    let body = if body == ["-"] {
        read_stdin()?
    } else {
        body.join(" ")
    };
    Ok(shown(
        "post_message",
        json!({
            "channel": channel, "to": to, "body": body,
            "announce": announce.then_some(true), "reply_to": reply_to,
            "metadata": parse_json_object("--metadata", metadata.as_deref())?,
        }),
        Show::Sent,
    ))
}

pub(super) fn read(args: ReadArgs) -> Request {
    let ReadArgs {
        scope,
        all,
        limit,
        all_sessions,
    } = args;
    shown(
        "read_messages",
        json!({
            "scope": scope, "only_new": all.then_some(false), "limit": limit,
            "all_sessions": all_sessions.then_some(true),
        }),
        Show::Messages,
    )
}

pub(super) fn search(args: SearchArgs) -> Request {
    let SearchArgs { query, limit } = args;
    shown(
        "search_messages",
        json!({"query": query, "limit": limit}),
        Show::Messages,
    )
}

pub(super) fn channels() -> Request {
    shown("list_channels", json!({}), Show::Channels)
}

/// Print an answer as text (`--json` is handled by the caller).
pub(super) fn print(show: Show, answer: &Value) -> anyhow::Result<()> {
    match show {
        Show::Sent => show::sent(answer),
        Show::Messages => show::messages(answer),
        Show::Channels => show::channels(answer),
    }
    Ok(())
}
