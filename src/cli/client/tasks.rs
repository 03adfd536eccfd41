//! `client tasks` and `client task …`: the team's queue (`list_tasks`, and
//! `create_task`, `get_task`, `claim_task`, `claim_next_task`,
//! `renew_task_lease`, `release_task`, `complete_task`, `cancel_task`,
//! `set_task_dependencies`, `set_task_priority`).

use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::files::read_stdin;
use super::{Print, Request, parse_json_object, request, show};

#[derive(Args, Debug)]
pub(super) struct TasksArgs {
    /// open, claimed, done, cancelled or any (default).
    #[arg(long)]
    status: Option<String>,
    /// Only tasks this window holds or completed.
    #[arg(long)]
    mine: bool,
    /// At most this many tasks, 1..200 (default 50).
    #[arg(long)]
    limit: Option<i64>,
}

#[derive(Subcommand, Debug)]
pub(super) enum TaskCommand {
    /// Create a task in the team's queue (create_task).
    Create {
        /// Unique in the team, e.g. `api-auth-refactor`.
        key: String,
        /// One line saying what is to be done.
        title: String,
        /// The details, kept exactly as given.
        #[arg(long)]
        description: Option<String>,
        /// A JSON object of small facts.
        #[arg(long, value_name = "JSON")]
        metadata: Option<String>,
        /// Key of a task that must be done first (repeat for several).
        #[arg(long = "depends-on", value_name = "KEY")]
        depends_on: Vec<String>,
        /// low, normal (default), high or urgent: `task next` takes the highest first.
        #[arg(long, value_name = "WORD")]
        priority: Option<String>,
    },
    /// A task with its history (get_task).
    Show {
        /// The task's key.
        key: String,
    },
    /// Claim a task by key (claim_task).
    Claim {
        /// The task's key.
        key: String,
        /// Lease in seconds, 30..86400 (default 900).
        #[arg(long, value_name = "SECONDS")]
        lease: Option<i64>,
    },
    /// Claim the ready task of the highest priority, oldest first within one
    /// (claim_next_task). Nothing ready exits 1.
    Next {
        /// Lease in seconds, 30..86400 (default 900).
        #[arg(long, value_name = "SECONDS")]
        lease: Option<i64>,
    },
    /// Extend this window's lease (renew_task_lease).
    Renew {
        /// The task's key.
        key: String,
        /// New lease in seconds from now, 30..86400 (default 900).
        #[arg(long, value_name = "SECONDS")]
        lease: Option<i64>,
    },
    /// Hand a task back (release_task).
    Release {
        /// The task's key.
        key: String,
    },
    /// Mark a task done (complete_task).
    Done {
        /// The task's key.
        key: String,
        /// What was done; `-` reads it from stdin.
        result: String,
    },
    /// Cancel a task: by its creator or the window holding it (cancel_task).
    Cancel {
        /// The task's key.
        key: String,
        /// Why, kept on the task; `-` reads it from stdin.
        reason: String,
    },
    /// Replace what a task waits for (set_task_dependencies); its creator only.
    Depends {
        /// The task's key.
        key: String,
        /// Key of a task that must be done first (repeat for several).
        #[arg(long = "on", value_name = "KEY", required_unless_present = "none")]
        on: Vec<String>,
        /// Wait for nothing: remove every dependency.
        #[arg(long, conflicts_with = "on")]
        none: bool,
    },
    /// Set a task's priority (set_task_priority); its creator only.
    Priority {
        /// The task's key.
        key: String,
        /// low, normal, high or urgent.
        priority: String,
    },
}

/// How to show a task tool's answer.
pub(super) enum Show {
    Tasks,
    Task,
    TaskDetail,
    NextTask,
    CancelledTask,
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Tasks(show))
}

pub(super) fn list(args: TasksArgs) -> Request {
    let TasksArgs {
        status,
        mine,
        limit,
    } = args;
    shown(
        "list_tasks",
        json!({"status": status, "mine_only": mine.then_some(true), "limit": limit}),
        Show::Tasks,
    )
}

pub(super) fn prepare(command: TaskCommand) -> anyhow::Result<Request> {
    use TaskCommand as T;
    Ok(match command {
        T::Create {
            key,
            title,
            description,
            metadata,
            depends_on,
            priority,
        } => shown(
            "create_task",
            json!({
                "key": key, "title": title, "description": description,
                "metadata": parse_json_object("--metadata", metadata.as_deref())?,
                "depends_on": (!depends_on.is_empty()).then_some(depends_on),
                "priority": priority,
            }),
            Show::Task,
        ),
        T::Show { key } => shown("get_task", json!({"key": key}), Show::TaskDetail),
        T::Claim { key, lease } => shown(
            "claim_task",
            json!({"key": key, "lease_seconds": lease}),
            Show::Task,
        ),
        T::Next { lease } => shown(
            "claim_next_task",
            json!({"lease_seconds": lease}),
            Show::NextTask,
        ),
        T::Renew { key, lease } => shown(
            "renew_task_lease",
            json!({"key": key, "lease_seconds": lease}),
            Show::Task,
        ),
        T::Release { key } => shown("release_task", json!({"key": key}), Show::Task),
        T::Done { key, result } => {
            let result = if result == "-" { read_stdin()? } else { result };
            shown(
                "complete_task",
                json!({"key": key, "result": result}),
                Show::Task,
            )
        }
        T::Cancel { key, reason } => {
            let reason = if reason == "-" { read_stdin()? } else { reason };
            shown(
                "cancel_task",
                json!({"key": key, "reason": reason}),
                Show::CancelledTask,
            )
        }
        T::Depends { key, on, none: _ } => shown(
            "set_task_dependencies",
            json!({"key": key, "depends_on": on}),
            Show::Task,
        ),
        T::Priority { key, priority } => shown(
            "set_task_priority",
            json!({"key": key, "priority": priority}),
            Show::Task,
        ),
    })
}

/// Print an answer as text (`--json` is handled by the caller). Nothing
/// claimed by `task next` fails, so scripts can test the exit code.
pub(super) fn print(show: Show, answer: &Value) -> anyhow::Result<()> {
    match show {
        Show::Tasks => show::tasks(answer),
        Show::Task => show::task_line(answer),
        Show::TaskDetail => show::task_detail(answer),
        Show::CancelledTask => show::cancelled_task(answer),
        Show::NextTask if answer["claimed"] == true => show::task_line(&answer["task"]),
        Show::NextTask => bail!(
            "no task claimed: {}",
            answer["message"].as_str().unwrap_or("nothing is ready")
        ),
    }
    Ok(())
}
