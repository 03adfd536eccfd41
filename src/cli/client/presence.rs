//! `client agents`, `sessions` and `beat`: who is here and saying that this
//! window is (`list_agents`, `list_sessions`, `heartbeat`).

use clap::Args;
use serde_json::{Value, json};

use super::{Print, Request, request, show};

#[derive(Args, Debug)]
pub(super) struct AgentsArgs {
    /// Only agents with a live window.
    #[arg(long)]
    online: bool,
    /// Also list windows offline for more than a day (else only counted).
    #[arg(long)]
    all: bool,
}

#[derive(Args, Debug)]
pub(super) struct SessionsArgs {
    /// Only windows working on this project.
    #[arg(long)]
    project: Option<String>,
    /// Only windows with this role (e.g. reviewer).
    #[arg(long)]
    role: Option<String>,
    /// Only live windows.
    #[arg(long)]
    online: bool,
    /// At most this many windows, 1..200 (default 50).
    #[arg(long)]
    limit: Option<i64>,
    /// Also windows offline for more than a day.
    #[arg(long)]
    all: bool,
}

#[derive(Args, Debug)]
pub(super) struct BeatArgs {
    /// active, idle, busy or blocked.
    #[arg(long)]
    status: Option<String>,
    /// What you are doing now, one short line ("" clears).
    #[arg(long)]
    activity: Option<String>,
    /// The project this window works on (default: the one .acs.toml names, else unchanged).
    #[arg(long)]
    project: Option<String>,
    /// This window's role label, e.g. reviewer ("" clears).
    #[arg(long)]
    role: Option<String>,
    /// This window's default channel, before the project's and the window's (default: the one
    /// .acs.toml names, else unchanged; "" clears).
    #[arg(long)]
    channel: Option<String>,
    /// The repository you work in ("" clears).
    #[arg(long)]
    repo: Option<String>,
    /// The branch you work on ("" clears).
    #[arg(long)]
    branch: Option<String>,
    /// Seconds this keeps the window online, 30..86400.
    #[arg(long, value_name = "SECONDS")]
    ttl: Option<i64>,
}

/// How to show a presence tool's answer.
pub(super) enum Show {
    Agents,
    Sessions,
    Beat,
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Presence(show))
}

pub(super) fn agents(args: AgentsArgs) -> Request {
    shown(
        "list_agents",
        json!({"online_only": args.online.then_some(true), "all": args.all.then_some(true)}),
        Show::Agents,
    )
}

pub(super) fn sessions(args: SessionsArgs) -> Request {
    let SessionsArgs {
        project,
        role,
        online,
        limit,
        all,
    } = args;
    shown(
        "list_sessions",
        json!({
            "project": project, "role": role,
            "online_only": online.then_some(true), "limit": limit,
            "all": all.then_some(true),
        }),
        Show::Sessions,
    )
}

impl BeatArgs {
    /// Say `project` when --project was not given.
    pub(super) fn default_project(&mut self, project: &str) {
        if self.project.is_none() {
            self.project = Some(project.to_string());
        }
    }

    /// Say `channel` when --channel was not given.
    pub(super) fn default_channel(&mut self, channel: &str) {
        if self.channel.is_none() {
            self.channel = Some(channel.to_string());
        }
    }
}

pub(super) fn beat(args: BeatArgs) -> Request {
    let BeatArgs {
        status,
        activity,
        project,
        role,
        channel,
        repo,
        branch,
        ttl,
    } = args;
    shown(
        "heartbeat",
        json!({
            "status": status, "activity": activity, "project": project, "role": role,
            "channel": channel, "repo": repo, "branch": branch, "ttl_seconds": ttl,
        }),
        Show::Beat,
    )
}

/// Print an answer as text (`--json` is handled by the caller).
pub(super) fn print(show: Show, answer: &Value) -> anyhow::Result<()> {
    match show {
        Show::Agents => show::agents(answer),
        Show::Sessions => show::sessions(answer),
        Show::Beat => show::beat(answer),
    }
    Ok(())
}
