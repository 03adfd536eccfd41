//! `client wait` and `client ask`: block until something this window should
//! see happens, or until another agent answers (`wait_for_updates`,
//! `ask_agent`).

use anyhow::bail;
use clap::Args;
use serde_json::{Value, json};

use super::{Print, Request, request, show};

#[derive(Args, Debug)]
pub(super) struct WaitArgs {
    /// Seconds to wait, 1..300 (default 50).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Wake only for these: message, task, lock, note, reservation (comma-separated).
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Wake for chatter in every channel, not only the focused one.
    #[arg(long)]
    all_channels: bool,
}

impl WaitArgs {
    /// The wait wakes for the window's default channel.
    pub(super) fn focused(&self) -> bool {
        !self.all_channels
    }
}

#[derive(Args, Debug)]
pub(super) struct AskArgs {
    /// `agent` or `agent/window`.
    to: String,
    /// The question (not needed with --resume).
    #[arg(required_unless_present = "resume")]
    question: Option<String>,
    /// Seconds to wait, 1..300 (default 50).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// Keep waiting for an earlier question (its id) instead of asking again.
    #[arg(long, value_name = "ID")]
    resume: Option<String>,
}

/// How to show a waiting tool's answer.
pub(super) enum Show {
    Wait,
    Ask { to: String },
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Waiting(show))
}

pub(super) fn wait(args: WaitArgs) -> Request {
    let WaitArgs {
        timeout,
        kinds,
        all_channels,
    } = args;
    shown(
        "wait_for_updates",
        json!({
            "timeout_seconds": timeout,
            "kinds": (!kinds.is_empty()).then_some(kinds),
            "all_channels": all_channels.then_some(true),
        }),
        Show::Wait,
    )
}

pub(super) fn ask(args: AskArgs) -> Request {
    let AskArgs {
        to,
        question,
        timeout,
        resume,
    } = args;
    shown(
        "ask_agent",
        json!({
            "to": to, "question": question.unwrap_or_default(),
            "timeout_seconds": timeout, "resume_message_id": resume,
        }),
        Show::Ask { to },
    )
}

/// Print an answer as text (`--json` is handled by the caller). No answer
/// in time fails, and says how to keep waiting without asking again.
pub(super) fn print(show: Show, answer: &Value) -> anyhow::Result<()> {
    match show {
        Show::Wait => show::wait(answer),
        Show::Ask { .. } if answer["answered"] == true => {
            println!("{}", answer["answer"].as_str().unwrap_or_default());
        }
        Show::Ask { to } => bail!(
            "no answer from {to} yet{}. Keep waiting without asking again: \
             ai-crew-sync client ask {to} --resume {}",
            if answer["server_restarting"] == true {
                " (the server is restarting; the question was sent)"
            } else {
                ""
            },
            show::text(&answer["question_message_id"])
        ),
    }
    Ok(())
}
