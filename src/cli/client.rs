//! `ai-crew-sync client …`: the console client, one more agent over `/mcp`.
//!
//! Each command is thin: build the tool's arguments (the argument structs in
//! `src/mcp/` are the contract), call it on one [`Connection`], print short
//! text for people or the tool's JSON with `--json`. A refusal prints the
//! server's explanation on stderr and exits 1. Local input (stdin, files) is
//! read before connecting, so a typo costs no round trip.
//!
//! In text mode a command fails when what was asked for is not there (a
//! missing note, an unanswered question), so scripts can test the exit code;
//! with `--json` the tool's answer is printed as it came and says so itself.

mod conversation;
mod show;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use super::output;
use crate::client::Connection;

/// The server's per-file limit, checked here too: a bigger file would be
/// refused anyway, after travelling (or as an opaque 413 past 8 MiB).
const ATTACHMENT_MAX_BYTES: u64 = 256 * 1024;

#[derive(Args, Debug)]
#[command(
    long_about = "The console client: talk to a running bus as one more agent over MCP.\n\n\
                  Configure it from the environment: BUS_URL (default \
                  http://127.0.0.1:8787/mcp), BUS_TOKEN (an agent token acs_… or a session \
                  credential acss_…; prefer the environment to --token, which other users \
                  can see in the process list) and BUS_SESSION (the window label, sent as \
                  X-Crew-Session)."
)]
pub struct ClientArgs {
    /// The server's MCP endpoint.
    #[arg(
        long,
        env = "BUS_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8787/mcp",
        global = true
    )]
    url: String,
    /// Agent token (acs_…) or session credential (acss_…). Prefer setting BUS_TOKEN.
    #[arg(long, env = "BUS_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// Window label, sent as X-Crew-Session (omit for the agent's shared window).
    #[arg(long, env = "BUS_SESSION", global = true)]
    session: Option<String>,
    /// Print the tool's JSON answer instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: ClientCommand,
}

#[derive(Subcommand, Debug)]
enum ClientCommand {
    /// Who you are: agent, team, window, pending work (whoami).
    Whoami,
    /// Post to a channel or send a direct message (post_message).
    Send {
        /// Channel to post in (default: the window's default channel).
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
    },
    /// Read what this window has not read yet, and mark it read (read_messages).
    Read {
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
    },
    /// Full-text search over channel messages and your DMs (search_messages).
    Search {
        /// Words to look for ("a phrase", OR, -word).
        query: String,
        #[arg(long)]
        limit: Option<i64>,
    },
    /// The team's channels (list_channels).
    Channels,
    /// The team's agents with their windows (list_agents).
    Agents {
        /// Only agents with a live window.
        #[arg(long)]
        online: bool,
    },
    /// Windows to talk to, by project and role (list_sessions).
    Sessions {
        #[arg(long)]
        project: Option<String>,
        #[arg(long)]
        role: Option<String>,
        /// Only live windows.
        #[arg(long)]
        online: bool,
        #[arg(long)]
        limit: Option<i64>,
    },
    /// Say this window is here and what it does (heartbeat). Omitted fields keep their value.
    Beat {
        /// active, idle, busy or blocked.
        #[arg(long)]
        status: Option<String>,
        /// What you are doing now, one short line ("" clears).
        #[arg(long)]
        activity: Option<String>,
        #[arg(long)]
        project: Option<String>,
        #[arg(long)]
        role: Option<String>,
        #[arg(long)]
        repo: Option<String>,
        #[arg(long)]
        branch: Option<String>,
        /// Seconds this keeps the window online, 30..86400.
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<i64>,
    },
    /// The team's tasks (list_tasks).
    Tasks {
        /// open, claimed, done, cancelled or any (default).
        #[arg(long)]
        status: Option<String>,
        /// Only tasks this window holds or completed.
        #[arg(long)]
        mine: bool,
        #[arg(long)]
        limit: Option<i64>,
    },
    /// One task: create, show, claim, next, renew, release, done, cancel, depends.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Team-wide advisory locks: acquire, release, list.
    #[command(subcommand)]
    Lock(LockCommand),
    /// The team's shared notes: get, set, rm, search.
    #[command(subcommand)]
    Note(NoteCommand),
    /// Conversations with seats and receipts: create, list, invite, join, send, read,
    /// ack, receipts, wait.
    #[command(subcommand)]
    Conversation(conversation::ConversationCommand),
    /// Block until something this window should see happens (wait_for_updates).
    Wait {
        /// Seconds to wait, 1..300 (default 50).
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<u64>,
        /// Wake only for these: message, task, lock, note (comma-separated).
        #[arg(long, value_delimiter = ',')]
        kinds: Vec<String>,
        /// Wake for chatter in every channel, not only the focused one.
        #[arg(long)]
        all_channels: bool,
    },
    /// Ask another agent and wait for the answer (ask_agent). No answer in time exits 1.
    Ask {
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
    },
    /// What the team did lately (team_digest).
    Digest {
        /// How far back, 1..336 hours (default 24).
        #[arg(long)]
        hours: Option<i32>,
        /// Every channel, not only this window's focused one.
        #[arg(long)]
        all_channels: bool,
    },
    /// Attach a file (up to 256 KiB) to a task (attach_file).
    Attach {
        /// The task's key.
        task: String,
        file: PathBuf,
        /// Media type [default: guessed from the extension].
        #[arg(long)]
        content_type: Option<String>,
    },
    /// Download an attachment (get_attachment) to --out or its own name here.
    Download {
        /// The attachment's id.
        id: String,
        /// Where to write it (a directory keeps the original name).
        #[arg(long, value_name = "PATH")]
        out: Option<PathBuf>,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Call any tool with JSON arguments; prints its JSON answer.
    Call {
        tool: String,
        /// The arguments, a JSON object.
        #[arg(long, value_name = "JSON", default_value = "{}")]
        args: String,
    },
}

#[derive(Subcommand, Debug)]
enum TaskCommand {
    /// Create a task in the team's queue (create_task).
    Create {
        /// Unique in the team, e.g. `api-auth-refactor`.
        key: String,
        /// One line saying what is to be done.
        title: String,
        #[arg(long)]
        description: Option<String>,
        /// A JSON object of small facts.
        #[arg(long, value_name = "JSON")]
        metadata: Option<String>,
        /// Key of a task that must be done first (repeat for several).
        #[arg(long = "depends-on", value_name = "KEY")]
        depends_on: Vec<String>,
    },
    /// A task with its history (get_task).
    Show { key: String },
    /// Claim a task by key (claim_task).
    Claim {
        key: String,
        /// Lease in seconds, 30..86400 (default 900).
        #[arg(long, value_name = "SECONDS")]
        lease: Option<i64>,
    },
    /// Claim the oldest ready task (claim_next_task). Nothing ready exits 1.
    Next {
        #[arg(long, value_name = "SECONDS")]
        lease: Option<i64>,
    },
    /// Extend this window's lease (renew_task_lease).
    Renew {
        key: String,
        #[arg(long, value_name = "SECONDS")]
        lease: Option<i64>,
    },
    /// Hand a task back (release_task).
    Release { key: String },
    /// Mark a task done (complete_task).
    Done {
        key: String,
        /// What was done; `-` reads it from stdin.
        result: String,
    },
    /// Cancel a task: by its creator or the window holding it (cancel_task).
    Cancel {
        key: String,
        /// Why, kept on the task; `-` reads it from stdin.
        reason: String,
    },
    /// Replace what a task waits for (set_task_dependencies); its creator only.
    Depends {
        key: String,
        /// Key of a task that must be done first (repeat for several).
        #[arg(long = "on", value_name = "KEY", required_unless_present = "none")]
        on: Vec<String>,
        /// Wait for nothing: remove every dependency.
        #[arg(long, conflicts_with = "on")]
        none: bool,
    },
}

#[derive(Subcommand, Debug)]
enum LockCommand {
    /// Take (or extend) a lock (acquire_lock).
    Acquire {
        name: String,
        /// Seconds to hold it, 5..86400 (default 300).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<i64>,
        /// One line saying why, shown to others.
        #[arg(long)]
        purpose: Option<String>,
    },
    /// Release a lock this window holds (release_lock).
    Release { name: String },
    /// Locks that have not expired (list_locks).
    List,
}

#[derive(Subcommand, Debug)]
enum NoteCommand {
    /// Print a note's value (get_note). A missing note exits 1.
    Get {
        key: String,
        /// The note's scope (default `global`).
        #[arg(long)]
        scope: Option<String>,
    },
    /// Write a note (set_note).
    Set {
        key: String,
        /// The value; `-` reads it from stdin.
        value: String,
        #[arg(long)]
        scope: Option<String>,
        /// A tag (repeat for several); without any, the current tags stay.
        #[arg(long = "tag")]
        tags: Vec<String>,
    },
    /// Delete a note (delete_note).
    Rm {
        key: String,
        #[arg(long)]
        scope: Option<String>,
    },
    /// Full-text search of the notes (search_notes).
    Search {
        query: String,
        #[arg(long)]
        scope: Option<String>,
    },
}

/// Run one client command against the bus.
pub async fn run(args: ClientArgs) -> anyhow::Result<()> {
    let token = args
        .token
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            anyhow!(
                "no token: set BUS_TOKEN to an agent token (acs_…) or a session credential \
                 (acss_…), or pass --token. An operator mints one with `ai-crew-sync agent add` \
                 or `token issue`."
            )
        })?;
    let request = prepare(args.command)?;
    let connection = Connection::open(&args.url, token, args.session.as_deref()).await?;
    let result = execute(&connection, request, args.json).await;
    connection.close().await;
    result
}

/// A command with its local input already read.
struct Request {
    tool: String,
    arguments: Map<String, Value>,
    print: Print,
}

/// How to show the answer in text mode (and what a command does with it).
enum Print {
    Whoami,
    Sent,
    Messages,
    Channels,
    Agents,
    Sessions,
    Beat,
    Tasks,
    Task,
    TaskDetail,
    NextTask,
    CancelledTask,
    Lock,
    LockReleased,
    Locks,
    Note,
    NoteSet,
    NoteDeleted,
    NoteHits,
    Wait,
    Ask { to: String },
    Digest,
    Attached { path: PathBuf },
    Download { out: Option<PathBuf>, force: bool },
    Conversation(conversation::Show),
    Raw,
}

fn request(tool: impl Into<String>, arguments: Value, print: Print) -> Request {
    let Value::Object(mut arguments) = arguments else {
        unreachable!("tool arguments are built as objects")
    };
    // Absent optional flags are left out rather than sent as null: some
    // fields (`announce`, `all_channels`) take a bool and no null.
    arguments.retain(|_, v| !v.is_null());
    Request {
        tool: tool.into(),
        arguments,
        print,
    }
}

fn prepare(command: ClientCommand) -> anyhow::Result<Request> {
    use ClientCommand as C;
    Ok(match command {
        C::Whoami => request("whoami", json!({}), Print::Whoami),
        C::Send {
            channel,
            to,
            announce,
            reply_to,
            metadata,
            body,
        } => {
            let body = if body == ["-"] {
                read_stdin()?
            } else {
                body.join(" ")
            };
            request(
                "post_message",
                json!({
                    "channel": channel, "to": to, "body": body,
                    "announce": announce.then_some(true), "reply_to": reply_to,
                    "metadata": parse_json_object("--metadata", metadata.as_deref())?,
                }),
                Print::Sent,
            )
        }
        C::Read {
            scope,
            all,
            limit,
            all_sessions,
        } => request(
            "read_messages",
            json!({
                "scope": scope, "only_new": all.then_some(false), "limit": limit,
                "all_sessions": all_sessions.then_some(true),
            }),
            Print::Messages,
        ),
        C::Search { query, limit } => request(
            "search_messages",
            json!({"query": query, "limit": limit}),
            Print::Messages,
        ),
        C::Channels => request("list_channels", json!({}), Print::Channels),
        C::Agents { online } => request(
            "list_agents",
            json!({"online_only": online.then_some(true)}),
            Print::Agents,
        ),
        C::Sessions {
            project,
            role,
            online,
            limit,
        } => request(
            "list_sessions",
            json!({
                "project": project, "role": role,
                "online_only": online.then_some(true), "limit": limit,
            }),
            Print::Sessions,
        ),
        C::Beat {
            status,
            activity,
            project,
            role,
            repo,
            branch,
            ttl,
        } => request(
            "heartbeat",
            json!({
                "status": status, "activity": activity, "project": project, "role": role,
                "repo": repo, "branch": branch, "ttl_seconds": ttl,
            }),
            Print::Beat,
        ),
        C::Tasks {
            status,
            mine,
            limit,
        } => request(
            "list_tasks",
            json!({"status": status, "mine_only": mine.then_some(true), "limit": limit}),
            Print::Tasks,
        ),
        C::Task(command) => prepare_task(command)?,
        C::Lock(LockCommand::Acquire { name, ttl, purpose }) => request(
            "acquire_lock",
            json!({"name": name, "ttl_seconds": ttl, "purpose": purpose}),
            Print::Lock,
        ),
        C::Lock(LockCommand::Release { name }) => {
            request("release_lock", json!({"name": name}), Print::LockReleased)
        }
        C::Lock(LockCommand::List) => request("list_locks", json!({}), Print::Locks),
        C::Note(command) => prepare_note(command)?,
        C::Conversation(command) => conversation::prepare(command)?,
        C::Wait {
            timeout,
            kinds,
            all_channels,
        } => request(
            "wait_for_updates",
            json!({
                "timeout_seconds": timeout,
                "kinds": (!kinds.is_empty()).then_some(kinds),
                "all_channels": all_channels.then_some(true),
            }),
            Print::Wait,
        ),
        C::Ask {
            to,
            question,
            timeout,
            resume,
        } => request(
            "ask_agent",
            json!({
                "to": to, "question": question.unwrap_or_default(),
                "timeout_seconds": timeout, "resume_message_id": resume,
            }),
            Print::Ask { to },
        ),
        C::Digest {
            hours,
            all_channels,
        } => request(
            "team_digest",
            json!({"hours": hours, "all_channels": all_channels.then_some(true)}),
            Print::Digest,
        ),
        C::Attach {
            task,
            file,
            content_type,
        } => {
            let (filename, data) = read_attachment(&file)?;
            let content_type = content_type.unwrap_or_else(|| guess_content_type(&file).into());
            request(
                "attach_file",
                json!({
                    "task": task, "filename": filename, "content_type": content_type,
                    "data_base64": STANDARD.encode(data),
                }),
                Print::Attached { path: file },
            )
        }
        C::Download { id, out, force } => request(
            "get_attachment",
            json!({"id": id}),
            Print::Download { out, force },
        ),
        C::Call { tool, args } => {
            let arguments = parse_json_object("--args", Some(&args))?.unwrap_or(json!({}));
            request(tool, arguments, Print::Raw)
        }
    })
}

fn prepare_task(command: TaskCommand) -> anyhow::Result<Request> {
    use TaskCommand as T;
    Ok(match command {
        T::Create {
            key,
            title,
            description,
            metadata,
            depends_on,
        } => request(
            "create_task",
            json!({
                "key": key, "title": title, "description": description,
                "metadata": parse_json_object("--metadata", metadata.as_deref())?,
                "depends_on": (!depends_on.is_empty()).then_some(depends_on),
            }),
            Print::Task,
        ),
        T::Show { key } => request("get_task", json!({"key": key}), Print::TaskDetail),
        T::Claim { key, lease } => request(
            "claim_task",
            json!({"key": key, "lease_seconds": lease}),
            Print::Task,
        ),
        T::Next { lease } => request(
            "claim_next_task",
            json!({"lease_seconds": lease}),
            Print::NextTask,
        ),
        T::Renew { key, lease } => request(
            "renew_task_lease",
            json!({"key": key, "lease_seconds": lease}),
            Print::Task,
        ),
        T::Release { key } => request("release_task", json!({"key": key}), Print::Task),
        T::Done { key, result } => {
            let result = if result == "-" { read_stdin()? } else { result };
            request(
                "complete_task",
                json!({"key": key, "result": result}),
                Print::Task,
            )
        }
        T::Cancel { key, reason } => {
            let reason = if reason == "-" { read_stdin()? } else { reason };
            request(
                "cancel_task",
                json!({"key": key, "reason": reason}),
                Print::CancelledTask,
            )
        }
        T::Depends { key, on, none: _ } => request(
            "set_task_dependencies",
            json!({"key": key, "depends_on": on}),
            Print::Task,
        ),
    })
}

fn prepare_note(command: NoteCommand) -> anyhow::Result<Request> {
    use NoteCommand as N;
    Ok(match command {
        N::Get { key, scope } => {
            request("get_note", json!({"key": key, "scope": scope}), Print::Note)
        }
        N::Set {
            key,
            value,
            scope,
            tags,
        } => {
            let value = if value == "-" { read_stdin()? } else { value };
            request(
                "set_note",
                json!({
                    "key": key, "value": value, "scope": scope,
                    "tags": (!tags.is_empty()).then_some(tags),
                }),
                Print::NoteSet,
            )
        }
        N::Rm { key, scope } => request(
            "delete_note",
            json!({"key": key, "scope": scope}),
            Print::NoteDeleted,
        ),
        N::Search { query, scope } => request(
            "search_notes",
            json!({"query": query, "scope": scope}),
            Print::NoteHits,
        ),
    })
}

async fn execute(connection: &Connection, request: Request, json: bool) -> anyhow::Result<()> {
    // Downloads check the destination before fetching the bytes.
    if let Print::Download {
        out: Some(out),
        force: false,
    } = &request.print
        && out.exists()
        && !out.is_dir()
    {
        bail!(refuse_overwrite(out));
    }
    let answer = connection.call(&request.tool, request.arguments).await?;
    // Text for a person shows what other agents wrote: no control character
    // of theirs reaches the terminal (JSON escapes them in `output::json`).
    let answer = if json || matches!(request.print, Print::Raw) {
        answer
    } else {
        output::clean_value(answer)
    };
    match request.print {
        Print::Raw => return output::json(&answer),
        Print::Download { out, force } => return download(&answer, out, force, json),
        Print::Conversation(show) => return conversation::print(show, &answer, json),
        _ if json => return output::json(&answer),
        Print::Whoami => show::whoami(&answer),
        Print::Sent => show::sent(&answer),
        Print::Messages => show::messages(&answer),
        Print::Channels => show::channels(&answer),
        Print::Agents => show::agents(&answer),
        Print::Sessions => show::sessions(&answer),
        Print::Beat => show::beat(&answer),
        Print::Tasks => show::tasks(&answer),
        Print::Task => show::task_line(&answer),
        Print::TaskDetail => show::task_detail(&answer),
        Print::CancelledTask => show::cancelled_task(&answer),
        Print::NextTask if answer["claimed"] == true => show::task_line(&answer["task"]),
        Print::NextTask => bail!(
            "no task claimed: {}",
            answer["message"].as_str().unwrap_or("nothing is ready")
        ),
        Print::Lock => show::lock(&answer),
        Print::LockReleased => show::lock_released(&answer),
        Print::Locks => show::locks(&answer),
        Print::Note if answer["found"] == true => {
            let value = answer["value"].as_str().unwrap_or_default();
            if value.ends_with('\n') {
                print!("{value}");
            } else {
                println!("{value}");
            }
        }
        Print::Note => bail!(
            "no note `{}` in scope `{}`",
            show::text(&answer["key"]),
            show::text(&answer["scope"])
        ),
        Print::NoteSet => show::note_set(&answer),
        Print::NoteDeleted => show::note_deleted(&answer),
        Print::NoteHits => show::note_hits(&answer),
        Print::Wait => show::wait(&answer),
        Print::Ask { .. } if answer["answered"] == true => {
            println!("{}", answer["answer"].as_str().unwrap_or_default());
        }
        Print::Ask { to } => bail!(
            "no answer from {to} yet{}. Keep waiting without asking again: \
             ai-crew-sync client ask {to} --resume {}",
            if answer["server_restarting"] == true {
                " (the server is restarting; the question was sent)"
            } else {
                ""
            },
            show::text(&answer["question_message_id"])
        ),
        Print::Digest => show::digest(&answer),
        Print::Attached { path } => show::attached(&answer, &path),
    }
    Ok(())
}

/// Write a fetched attachment: to `out`, into `out` when it is a directory,
/// or under its own name in the current directory. Never overwrites without
/// `force`; the bytes are checked against the server's SHA-256 first.
fn download(answer: &Value, out: Option<PathBuf>, force: bool, json: bool) -> anyhow::Result<()> {
    let filename = answer["filename"].as_str().unwrap_or_default();
    let data = STANDARD
        .decode(answer["data_base64"].as_str().unwrap_or_default())
        .context("the server sent an attachment that is not base64")?;
    let digest = hex::encode(Sha256::digest(&data));
    if let Some(expected) = answer["sha256"].as_str()
        && !expected.eq_ignore_ascii_case(&digest)
    {
        bail!(
            "the downloaded bytes do not match the attachment's SHA-256 ({expected}); nothing written"
        );
    }
    let path = match out {
        Some(dir) if dir.is_dir() => dir.join(safe_file_name(filename)?),
        Some(path) => path,
        None => PathBuf::from(safe_file_name(filename)?),
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = match options.open(&path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!(refuse_overwrite(&path))
        }
        Err(err) => return Err(err).with_context(|| format!("could not write {}", path.display())),
    };
    file.write_all(&data)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("could not write {}", path.display()))?;
    if json {
        let mut shown = answer.clone();
        if let Some(fields) = shown.as_object_mut() {
            fields.remove("data_base64");
            fields.insert("path".into(), json!(path.display().to_string()));
        }
        return output::json(&shown);
    }
    println!(
        "wrote {} ({} bytes, {}, from {})",
        path.display(),
        data.len(),
        show::text(&answer["content_type"]),
        show::text(&answer["uploaded_by"]),
    );
    Ok(())
}

fn refuse_overwrite(path: &Path) -> String {
    format!(
        "{} already exists; pass --force to overwrite it, or --out to choose another path",
        path.display()
    )
}

/// The uploader chose the name: keep only a plain file name, never a path.
fn safe_file_name(filename: &str) -> anyhow::Result<&str> {
    match Path::new(filename).file_name().and_then(|n| n.to_str()) {
        Some(name) if name == filename && !name.is_empty() => Ok(name),
        _ => bail!(
            "the attachment's name {filename:?} is not a plain file name; choose one with --out"
        ),
    }
}

fn read_attachment(file: &Path) -> anyhow::Result<(String, Vec<u8>)> {
    let size = std::fs::metadata(file)
        .with_context(|| format!("could not read {}", file.display()))?
        .len();
    if size > ATTACHMENT_MAX_BYTES {
        bail!(
            "{} is {size} bytes; attachments are at most {ATTACHMENT_MAX_BYTES} (256 KiB). \
             Attach an excerpt, or split it across files.",
            file.display()
        );
    }
    let data = std::fs::read(file).with_context(|| format!("could not read {}", file.display()))?;
    let filename = file
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{} has no usable file name", file.display()))?;
    Ok((filename.to_string(), data))
}

/// A small table of common types; `--content-type` covers the rest.
fn guess_content_type(file: &Path) -> &'static str {
    let extension = file
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    match extension.as_str() {
        "txt" | "log" | "rs" | "py" | "go" | "sh" | "c" | "h" | "java" | "sql" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "diff" | "patch" => "text/x-diff",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "webp" => "image/webp",
        _ => "application/octet-stream",
    }
}

/// All of stdin, without the one trailing newline `echo` and heredocs add.
fn read_stdin() -> anyhow::Result<String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("could not read stdin")?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

fn parse_json_object(flag: &str, raw: Option<&str>) -> anyhow::Result<Option<Value>> {
    let Some(raw) = raw else { return Ok(None) };
    let value: Value =
        serde_json::from_str(raw).with_context(|| format!("{flag} is not valid JSON"))?;
    if !value.is_object() {
        bail!("{flag} must be a JSON object, like '{{\"key\": \"value\"}}'");
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_come_from_the_extension() {
        assert_eq!(guess_content_type(Path::new("a/trace.LOG")), "text/plain");
        assert_eq!(guess_content_type(Path::new("x.json")), "application/json");
        assert_eq!(
            guess_content_type(Path::new("noext")),
            "application/octet-stream"
        );
    }

    #[test]
    fn an_uploaded_name_never_becomes_a_path() {
        assert_eq!(safe_file_name("report.txt").unwrap(), "report.txt");
        assert!(safe_file_name("..").is_err());
        assert!(safe_file_name("../x").is_err());
        assert!(safe_file_name("").is_err());
    }
}
