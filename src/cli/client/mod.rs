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
//!
//! This file holds the arguments and the dispatch. Each command group has a
//! file of its own, grouped as the tools are in `src/mcp/` (`identity`,
//! `messaging`, `presence`, `tasks`, `locks`, `reservations`, `notes`, `waiting`,
//! `attachments`, `conversation`): its flags, the request each command
//! builds, and how its answer is shown. `files` reads and writes local files
//! and stdin; `show` turns answers into text.

mod attachments;
mod conversation;
mod files;
mod identity;
mod locks;
mod messaging;
mod notes;
mod presence;
mod reservations;
mod show;
mod tasks;
mod waiting;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::{Map, Value, json};

use super::context::BusArgs;
use super::output;
use acs_agent::client::Connection;

#[derive(Args, Debug)]
#[command(
    long_about = "The console client: talk to a running bus as one more agent over MCP.\n\n\
                  It speaks as a local profile (`context profile add`; chosen by --profile / \
                  BUS_PROFILE, else the one .acs.toml names, else the default profile), or with \
                  BUS_URL (default http://127.0.0.1:8787/mcp) and BUS_TOKEN (an agent token \
                  acs_… or a session credential acss_…, or --token-file PATH; --token is refused, \
                  since other users can see it in the process list). BUS_SESSION is the window \
                  label, sent as X-Crew-Session. `context show` says what applies here."
)]
pub struct ClientArgs {
    #[command(flatten)]
    bus: BusArgs,
    /// Window label, sent as X-Crew-Session (omit for the agent's shared window).
    #[arg(long, env = "BUS_SESSION", global = true)]
    session: Option<String>,
    #[command(subcommand)]
    command: ClientCommand,
}

#[derive(Subcommand, Debug)]
enum ClientCommand {
    /// Who you are: agent, team, window, pending work (whoami).
    Whoami,
    /// Post to a channel or send a direct message (post_message).
    Send(messaging::SendArgs),
    /// Read what this window has not read yet, and mark it read (read_messages).
    Read(messaging::ReadArgs),
    /// Full-text search over channel messages and your DMs (search_messages).
    Search(messaging::SearchArgs),
    /// The team's channels (list_channels).
    Channels,
    /// The team's agents with their windows (list_agents).
    Agents(presence::AgentsArgs),
    /// Windows to talk to, by project and role (list_sessions).
    Sessions(presence::SessionsArgs),
    /// Say this window is here and what it does (heartbeat). Omitted fields keep their value.
    Beat(presence::BeatArgs),
    /// The team's tasks (list_tasks).
    Tasks(tasks::TasksArgs),
    /// One task: create, show, claim, next, renew, release, done, cancel, depends.
    #[command(subcommand)]
    Task(tasks::TaskCommand),
    /// Team-wide advisory locks: acquire, release, list.
    #[command(subcommand)]
    Lock(locks::LockCommand),
    /// Path reservations in this window's project: reserve, release, renew, list, check.
    #[command(subcommand)]
    Paths(reservations::PathsCommand),
    /// The team's shared notes: get, set, rm, search.
    #[command(subcommand)]
    Note(notes::NoteCommand),
    /// Conversations with seats and receipts: create, list, invite, join, send, read,
    /// ack, receipts, wait.
    #[command(subcommand)]
    Conversation(conversation::ConversationCommand),
    /// Block until something this window should see happens (wait_for_updates).
    Wait(waiting::WaitArgs),
    /// Ask another agent and wait for the answer (ask_agent). No answer in time exits 1.
    Ask(waiting::AskArgs),
    /// What the team did lately (team_digest).
    Digest(identity::DigestArgs),
    /// Attach a file (up to 256 KiB) to a task (attach_file).
    Attach(attachments::AttachArgs),
    /// Download an attachment (get_attachment) to --out or its own name here.
    Download(attachments::DownloadArgs),
    /// Call any tool with JSON arguments; prints its JSON answer.
    Call {
        /// The bus tool to call (e.g. `whoami`).
        tool: String,
        /// The arguments, a JSON object.
        #[arg(long, value_name = "JSON", default_value = "{}")]
        args: String,
    },
}

/// Run one client command against the bus.
pub async fn run(args: ClientArgs, json: bool) -> anyhow::Result<()> {
    let resolved = args.bus.resolve()?;
    let token = resolved.token()?;
    let mut command = args.command;
    // What .acs.toml says for this directory tree fills in what was not given.
    if let ClientCommand::Beat(beat) = &mut command {
        if let Some(project) = &resolved.project {
            beat.default_project(&project.value);
        }
        if let Some(channel) = &resolved.channel {
            beat.default_channel(&channel.value);
        }
    }
    // The bus decides the default channel; the channel .acs.toml names is
    // told to it first when the answer depends on it.
    let uses_default_channel = match &command {
        ClientCommand::Send(send) => send.to_default_channel(),
        ClientCommand::Digest(digest) => digest.focused(),
        ClientCommand::Wait(wait) => wait.focused(),
        ClientCommand::Whoami => true,
        _ => false,
    };
    let tell = resolved
        .channel
        .as_ref()
        .filter(|_| uses_default_channel)
        .map(|c| c.value.clone());
    let request = prepare(command)?;
    let connection = Connection::open(&resolved.url.value, token, args.session.as_deref())
        .await
        .map_err(|err| {
            // A 401 names the server asked; say where that URL came from.
            if err.is::<acs_agent::client::Unauthenticated>() {
                err.context(format!(
                    "the server asked ({}) comes from {}",
                    resolved.url.value, resolved.url.from
                ))
            } else {
                err
            }
        })?;
    if let Some(channel) = tell {
        tell_channel(&connection, &channel).await;
    }
    let result = execute(&connection, request, json).await;
    connection.close().await;
    result
}

/// Tell the bus the channel `.acs.toml` names for this window (heartbeat
/// `channel`) when it does not know it yet: it then decides the default
/// channel as for every window. A name it refuses is said on stderr, and the
/// command goes on with what the bus knows.
async fn tell_channel(connection: &Connection, channel: &str) {
    let wanted = channel.trim().trim_start_matches('#');
    let known = match connection.call("whoami", Map::new()).await {
        Ok(me) => me["channel"]
            .as_str()
            .is_some_and(|c| c.eq_ignore_ascii_case(wanted)),
        Err(_) => false,
    };
    if known {
        return;
    }
    let beat = json!({"channel": channel});
    let Value::Object(beat) = beat else {
        unreachable!("built as an object")
    };
    if let Err(err) = connection.call("heartbeat", beat).await {
        eprintln!(
            "ai-crew-sync: the bus refused the channel {channel:?} that .acs.toml names for this \
             window ({err:#}); the window's default channel stays as whoami says. Fix it with \
             `context set-project --channel NAME`."
        );
    }
}

/// A command with its local input already read.
struct Request {
    tool: String,
    arguments: Map<String, Value>,
    print: Print,
}

/// How to show the answer in text mode (and what a command does with it):
/// each command group's own `Show`, or the tool's JSON as it came.
enum Print {
    Identity(identity::Show),
    Messaging(messaging::Show),
    Presence(presence::Show),
    Tasks(tasks::Show),
    Locks(locks::Show),
    Paths(reservations::Show),
    Notes(notes::Show),
    Waiting(waiting::Show),
    Attachments(attachments::Show),
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
        C::Whoami => identity::whoami(),
        C::Send(args) => messaging::send(args)?,
        C::Read(args) => messaging::read(args),
        C::Search(args) => messaging::search(args),
        C::Channels => messaging::channels(),
        C::Agents(args) => presence::agents(args),
        C::Sessions(args) => presence::sessions(args),
        C::Beat(args) => presence::beat(args),
        C::Tasks(args) => tasks::list(args),
        C::Task(command) => tasks::prepare(command)?,
        C::Lock(command) => locks::prepare(command),
        C::Paths(command) => reservations::prepare(command),
        C::Note(command) => notes::prepare(command)?,
        C::Conversation(command) => conversation::prepare(command)?,
        C::Wait(args) => waiting::wait(args),
        C::Ask(args) => waiting::ask(args),
        C::Digest(args) => identity::digest(args),
        C::Attach(args) => attachments::attach(args)?,
        C::Download(args) => attachments::download(args),
        C::Call { tool, args } => {
            let arguments = parse_json_object("--args", Some(&args))?.unwrap_or(json!({}));
            request(tool, arguments, Print::Raw)
        }
    })
}

async fn execute(connection: &Connection, request: Request, json: bool) -> anyhow::Result<()> {
    // Downloads check the destination before fetching the bytes.
    if let Print::Attachments(show) = &request.print {
        attachments::before_call(show)?;
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
        Print::Raw => output::json(&answer),
        Print::Attachments(show) => attachments::print(show, &answer, json),
        Print::Conversation(show) => conversation::print(show, &answer, json),
        _ if json => output::json(&answer),
        Print::Identity(show) => identity::print(show, &answer),
        Print::Messaging(show) => messaging::print(show, &answer),
        Print::Presence(show) => presence::print(show, &answer),
        Print::Tasks(show) => tasks::print(show, &answer),
        Print::Locks(show) => locks::print(show, &answer),
        Print::Paths(show) => reservations::print(show, &answer),
        Print::Notes(show) => notes::print(show, &answer),
        Print::Waiting(show) => waiting::print(show, &answer),
    }
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
