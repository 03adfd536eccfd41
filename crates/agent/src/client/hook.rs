//! `context hook`: what a host's hook hears from the bus, in the host's
//! format (Claude Code's hook JSON first). It speaks as the proxy's window
//! of that host conversation ([`WindowState`]) and as nothing else.
//!
//! - session start and user prompt: `hookSpecificOutput.additionalContext`
//!   with what is new for the window since it last looked (unread direct
//!   messages, questions asked of it, conversations owing its
//!   acknowledgement, leases about to lapse, announcements), short and cut at
//!   [`CONTEXT_MAX_CHARS`]. Never what this window's model was already
//!   shown: a message whose text a hook showed (remembered in [`HookMarks`];
//!   for a conversation message also its `presented` receipt), a lease
//!   already called out, and a direct message read (by any window of the
//!   agent, for one to the agent as a whole) is not unread any more;
//! - stop: a heartbeat, and a block (`decision: "block"`) naming what to
//!   finish, hand back or release when the window holds claimed tasks,
//!   locks or path reservations, owes an answer to a question or
//!   acknowledgements (`stop_hook.rs`): once per stop, never twice in a row
//!   for the same things, never a stop the host already continued because
//!   of a stop hook (`stop_hook_active`), so it cannot loop;
//! - session end: the window leaves (idle, and offline at once); the bus
//!   releases its locks and path reservations, and its claimed tasks unless
//!   it comes back within a grace (`serve --task-release-grace-secs`);
//! - status: one line for a status bar;
//! - pre tool use: deny an edit of a path another window reserved
//!   exclusively ([`pre_tool_use`]), within its own shorter deadline.
//!
//! A hook never fails the host: no window for the conversation, bad input,
//! a bus that is down or slow, each ends with nothing printed and exit 0,
//! within [`HOOK_DEADLINE`] (`pre_tool_use` denies on input it cannot read:
//! see [`pre_tool_use`]). The caller enforces that; this module returns
//! errors so they can be logged.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use super::window_state::{HookMarks, WindowState};
use super::{Connection, object};

pub mod pre_tool_use;

/// Everything a hook does, reading its input included, ends within this.
pub const HOOK_DEADLINE: Duration = Duration::from_secs(4);
/// The most input a hook other than `pre_tool_use` reads (a host's
/// payload is a few KiB).
const HOOK_INPUT_MAX: u64 = 1024 * 1024;
/// The most a hook's context adds to the model's input.
pub const CONTEXT_MAX_CHARS: usize = 2_000;
/// A first look reaches back this far for announcements.
const FIRST_LOOK_HOURS: i64 = 24;
/// How many shown messages a window's marks remember (the lists a hook
/// shows from are a few entries each, the newest or the oldest pending).
const SHOWN_REMEMBERED: usize = 200;

/// The events, named as `--event` takes them (`session_start`; the
/// kebab-case spelling clap would give is accepted too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HookEvent {
    #[value(name = "session_start", alias = "session-start")]
    SessionStart,
    #[value(name = "user_prompt", alias = "user-prompt")]
    UserPrompt,
    Stop,
    #[value(name = "session_end", alias = "session-end")]
    SessionEnd,
    Status,
    #[value(name = "pre_tool_use", alias = "pre-tool-use")]
    PreToolUse,
}

impl HookEvent {
    /// The name Claude Code gives the event in `hookEventName`.
    fn host_name(self) -> &'static str {
        match self {
            HookEvent::SessionStart => "SessionStart",
            HookEvent::UserPrompt => "UserPromptSubmit",
            HookEvent::Stop => "Stop",
            HookEvent::SessionEnd => "SessionEnd",
            HookEvent::Status => "Status",
            HookEvent::PreToolUse => "PreToolUse",
        }
    }

    /// Everything the hook does ends within this: the host waits on a
    /// `pre_tool_use` before every edit, so it has less time.
    pub fn deadline(self) -> Duration {
        match self {
            HookEvent::PreToolUse => pre_tool_use::DEADLINE,
            _ => HOOK_DEADLINE,
        }
    }

    /// What the host does when this hook does not answer (said on stderr,
    /// after the cause).
    pub fn without_an_answer(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "the edit goes ahead without a reservation check",
            _ => "carrying on without it",
        }
    }

    /// The most hook input read: a `pre_tool_use` carries the whole text a
    /// `Write` writes, so it reads far more than a host's other payloads.
    pub fn input_max(self) -> u64 {
        match self {
            HookEvent::PreToolUse => pre_tool_use::INPUT_MAX,
            _ => HOOK_INPUT_MAX,
        }
    }
}

/// The answer to an input past [`HookEvent::input_max`]: a `pre_tool_use`
/// denies (the file it edits cannot be read, so may be reserved); any other
/// hook prints nothing.
pub fn input_too_large(event: HookEvent) -> anyhow::Result<Option<String>> {
    if event != HookEvent::PreToolUse {
        anyhow::bail!(
            "the hook input is over {} bytes, past what this hook reads; nothing printed",
            event.input_max()
        );
    }
    Ok(Some(pre_tool_use::deny(&format!(
        "ai-crew-sync: this edit was not made: its PreToolUse input is over {} MiB, past what \
         the reservation check reads, so the file it edits was not checked. Write the file in \
         smaller parts (a Write, then Edits).",
        pre_tool_use::INPUT_MAX / (1024 * 1024)
    ))))
}

/// Answer one hook: the text to print on stdout, or `None` for nothing.
/// `input` is the host's hook JSON; `env_session` the host conversation id
/// from the environment (`CLAUDE_CODE_SESSION_ID`) when the JSON has none.
/// `trail` gets, line by line, how the window was found or why none was
/// (`context hook --explain`); it never holds a credential or the prompt.
pub async fn answer(
    event: HookEvent,
    input: &[u8],
    dir: &Path,
    env_session: Option<String>,
    trail: &mut Vec<String>,
) -> anyhow::Result<Option<String>> {
    let input: Value = if input.iter().all(u8::is_ascii_whitespace) {
        trail.push("stdin: empty (the host sent no hook JSON)".into());
        Value::Null
    } else {
        let input: Value = match serde_json::from_slice(input) {
            Ok(input) => input,
            // The edit's file is unknown: it may be reserved, and the bus
            // is not down, so it is not waved through.
            Err(err) if event == HookEvent::PreToolUse => {
                trail.push(format!("stdin: not JSON ({err})"));
                return Ok(Some(pre_tool_use::deny(&format!(
                    "ai-crew-sync: this edit was not made: the PreToolUse input is not JSON \
                     ({err}), so which file it edits is unknown and its path reservations \
                     were not checked. Try the edit again."
                ))));
            }
            Err(err) => return Err(err).context("the hook input is not JSON"),
        };
        trail.push(stdin_fields(&input));
        input
    };
    if event == HookEvent::PreToolUse {
        return pre_tool_use::answer(&input, dir, env_session, trail).await;
    }
    let Some(host_session) = host_session_of(&input, env_session, trail) else {
        return Ok(None);
    };
    let Some(window) = find_window(dir, &host_session, trail)? else {
        return Ok(None);
    };
    if event == HookEvent::Stop && input["stop_hook_active"].as_bool() == Some(true) {
        // The host is already continuing because of a stop hook: saying
        // more here is how hooks loop.
        trail.push("stop_hook_active is true: nothing said, so stop hooks cannot loop".into());
        return Ok(None);
    }
    let bus = window.connect().await?;
    let result = speak(event, &bus, &window, dir).await;
    bus.close().await;
    if let Ok(answer) = &result {
        trail.push(match answer {
            Some(out) => format!("answer: {} bytes on stdout", out.len() + 1),
            None => format!(
                "answer: none ({} has nothing to print now)",
                event.host_name()
            ),
        });
    }
    result
}

/// The stdin fields a hook reads, and which of them the host sent.
fn stdin_fields(input: &Value) -> String {
    let keys: Vec<&str> = input
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let shown = |key: &str| match &input[key] {
        Value::Null => "absent".to_string(),
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    format!(
        "stdin: JSON with {} field(s) [{}]; read: session_id = {}, hook_event_name = {}, \
         stop_hook_active = {}",
        keys.len(),
        keys.join(", "),
        shown("session_id"),
        shown("hook_event_name"),
        shown("stop_hook_active"),
    )
}

/// The host conversation's id: stdin's `session_id`, else the environment's.
fn host_session_of(
    input: &Value,
    env_session: Option<String>,
    trail: &mut Vec<String>,
) -> Option<String> {
    if let Some(id) = input["session_id"].as_str().filter(|s| !s.is_empty()) {
        trail.push(format!(
            "host conversation: {id:?}, from stdin's session_id"
        ));
        return Some(id.to_string());
    }
    match env_session.filter(|s| !s.is_empty()) {
        Some(id) => {
            trail.push(format!(
                "host conversation: {id:?}, from CLAUDE_CODE_SESSION_ID (stdin has no session_id)"
            ));
            Some(id)
        }
        None => {
            trail.push(
                "no window: stdin has no session_id and CLAUDE_CODE_SESSION_ID is unset, so \
                 there is no host conversation to look for; nothing printed"
                    .into(),
            );
            None
        }
    }
}

/// The proxy's window of `host_session`, and what was looked at.
fn find_window(
    dir: &Path,
    host_session: &str,
    trail: &mut Vec<String>,
) -> anyhow::Result<Option<WindowState>> {
    let path = WindowState::path(dir, host_session);
    if let Some(window) = WindowState::load(dir, host_session)? {
        trail.push(format!(
            "found: window {}/{} of team {} at {}, recorded in {} by `mcp proxy` pid {} ({}) \
             at {}; its credential expires at {}",
            window.agent,
            window.label,
            window.team,
            window.url,
            path.display(),
            window.pid,
            if window.proxy_running() {
                "running"
            } else {
                "no longer running"
            },
            window.updated_at.to_rfc3339(),
            window.expires_at.to_rfc3339(),
        ));
        return Ok(Some(window));
    }
    trail.push(format!(
        "no window: no `mcp proxy` recorded one for host conversation {host_session:?} (looked \
         for {})",
        path.display()
    ));
    let all = WindowState::all(dir);
    if all.is_empty() {
        trail.push(format!(
            "no proxy has recorded any window under {}: is `mcp proxy` in this host's MCP \
             config (`ai-crew-sync proxy-config`), started, and using this config directory \
             (BUS_CONFIG_DIR)?",
            dir.join("windows").display()
        ));
    }
    for (path, state) in &all {
        trail.push(match state {
            Ok(w) => format!(
                "  seen: host conversation {:?} -> window {}/{} of team {} (proxy pid {}, {}, \
                 recorded {})",
                w.host_session,
                w.agent,
                w.label,
                w.team,
                w.pid,
                if w.proxy_running() {
                    "running"
                } else {
                    "no longer running"
                },
                w.updated_at.to_rfc3339()
            ),
            Err(err) => format!("  unreadable: {}: {err:#}", path.display()),
        });
    }
    if !all.is_empty() {
        trail.push(
            "a hook finds the window whose proxy has the same host conversation id: the proxy \
             takes it from --host-session, else CLAUDE_CODE_SESSION_ID, else the first tool \
             call's _meta; the hook from stdin's session_id, else CLAUDE_CODE_SESSION_ID. \
             Nothing printed"
                .into(),
        );
    }
    Ok(None)
}

async fn speak(
    event: HookEvent,
    bus: &Connection,
    window: &WindowState,
    dir: &Path,
) -> anyhow::Result<Option<String>> {
    let mut marks = HookMarks::load(dir, &window.host_session)?;
    match event {
        // Answered by `pre_tool_use::answer` before any connection.
        HookEvent::PreToolUse => Ok(None),
        HookEvent::SessionEnd => {
            bus.call("heartbeat", super::leaving()).await?;
            Ok(None)
        }
        HookEvent::Status => {
            let pending = pending(bus, None).await?;
            Ok(Some(status_line(window, &pending)))
        }
        HookEvent::Stop => {
            bus.call("heartbeat", Map::new()).await?;
            let pending = pending(bus, None).await?;
            let answer = super::stop_hook::decide(window, &pending, &mut marks);
            marks.save(dir, &window.host_session)?;
            Ok(answer)
        }
        HookEvent::SessionStart | HookEvent::UserPrompt => {
            let first_look = event == HookEvent::SessionStart || marks.last_looked_at.is_none();
            let since = marks
                .last_looked_at
                .filter(|_| !first_look)
                .unwrap_or_else(|| Utc::now() - chrono::Duration::hours(FIRST_LOOK_HOURS));
            let looked_at = Utc::now();
            let pending = pending(bus, Some(since)).await?;
            let (context, shown) =
                news(window, &pending, (!first_look).then_some(since), &mut marks);
            marks.last_looked_at = Some(looked_at);
            marks.shown.extend(shown.iter().map(|s| s.id));
            let keep = marks.shown.len().saturating_sub(SHOWN_REMEMBERED);
            marks.shown.drain(..keep);
            marks.save(dir, &window.host_session)?;
            let conversation: Vec<String> = shown
                .iter()
                .filter(|s| s.conversation)
                .map(|s| s.id.to_string())
                .collect();
            if !conversation.is_empty() {
                // The `presented` receipt: only we know these bodies reach
                // the model now.
                let presented = object(json!({"message_ids": conversation}));
                if let Err(err) = bus.call("mark_presented", presented).await {
                    tracing::warn!("could not record presented: {err:#}");
                }
            }
            Ok(context.map(|context| {
                json!({"hookSpecificOutput": {
                    "hookEventName": event.host_name(),
                    "additionalContext": context,
                }})
                .to_string()
            }))
        }
    }
}

async fn pending(bus: &Connection, since: Option<DateTime<Utc>>) -> anyhow::Result<Value> {
    let mut arguments = Map::new();
    if let Some(since) = since {
        arguments.insert("since".into(), json!(since.to_rfc3339()));
    }
    bus.call("pending_for_me", arguments).await
}

pub(super) fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

/// A preview on one line, without control characters another agent put there.
pub(super) fn one_line(value: &Value) -> String {
    value
        .as_str()
        .unwrap_or_default()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Whether `at` (RFC 3339) is after `since` (always, without `since`).
fn after(at: &Value, since: Option<DateTime<Utc>>) -> bool {
    let Some(since) = since else { return true };
    at.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .is_none_or(|at| at.with_timezone(&Utc) > since)
}

fn list<'a>(pending: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    pending[key].as_array().into_iter().flatten()
}

/// A message whose text a line shows.
struct Shown {
    id: uuid::Uuid,
    /// A conversation message (its `presented` receipt is recorded).
    conversation: bool,
}

/// The message `entry[key]` names, unless this window's model was already
/// shown it.
fn unseen(entry: &Value, key: &str, marks: &HookMarks, conversation: bool) -> Option<Shown> {
    let id: uuid::Uuid = entry[key].as_str()?.parse().ok()?;
    (!marks.shown.contains(&id)).then_some(Shown { id, conversation })
}

/// The window's news for the model, or `None` when there is none: what
/// pending_for_me lists that this window's model was not shown before (by
/// id, remembered in `marks`; a conversation message also by its
/// `presented` receipt). With `since`, only what arrived after it (a first
/// look shows conversations owing acknowledgement too, each debt once); a
/// lease about to lapse is news once per lease.
/// Also returns the messages whose text it shows.
fn news(
    window: &WindowState,
    pending: &Value,
    since: Option<DateTime<Utc>>,
    marks: &mut HookMarks,
) -> (Option<String>, Vec<Shown>) {
    // Each line, with the message whose text it shows.
    let mut lines: Vec<(String, Option<Shown>)> = Vec::new();
    for m in list(pending, "direct_messages") {
        let Some(shown) = unseen(m, "message_id", marks, false) else {
            continue;
        };
        lines.push((
            format!(
                "- direct message from {}: \"{}\" (read_messages scope inbox)",
                text(&m["from"]),
                one_line(&m["preview"])
            ),
            Some(shown),
        ));
    }
    for q in list(pending, "open_questions") {
        let Some(shown) = unseen(q, "message_id", marks, false) else {
            continue;
        };
        lines.push((
            format!(
                "- {} asked you: \"{}\" — answer with post_message {{to: \"{}\", reply_to: \"{}\"}}",
                text(&q["from"]),
                one_line(&q["preview"]),
                text(&q["from"]),
                text(&q["message_id"])
            ),
            Some(shown),
        ));
    }
    if since.is_none() {
        lines.extend(owed(pending, marks));
    }
    for m in list(pending, "awaiting_ack") {
        let Some(preview) = m["preview"].as_str() else {
            continue;
        };
        if m["presented"] == Value::Bool(true) {
            continue;
        }
        let Some(shown) = unseen(m, "message_id", marks, true) else {
            continue;
        };
        lines.push((
            format!(
                "- in conversation \"{}\" (seq {}) from {}: \"{}\" — ack_message \
                 {{message_id: \"{}\"}} once dealt with",
                one_line(&m["title"]),
                m["seq"],
                text(&m["from"]),
                one_line(&json!(preview)),
                text(&m["message_id"])
            ),
            Some(shown),
        ));
    }
    for t in list(pending, "expiring_tasks") {
        let lease = format!("{}@{}", text(&t["key"]), text(&t["lease_expires_at"]));
        if !called_out_now(&mut marks.leases_called_out, lease) {
            continue;
        }
        lines.push((
            format!(
                "- your task {} \"{}\": lease lapses at {} (renew_task_lease, or complete_task)",
                text(&t["key"]),
                one_line(&t["title"]),
                text(&t["lease_expires_at"])
            ),
            None,
        ));
    }
    for a in list(pending, "announcements").filter(|a| after(&a["at"], since)) {
        let Some(shown) = unseen(a, "message_id", marks, false) else {
            continue;
        };
        lines.push((
            format!(
                "- announcement in #{} from {}: \"{}\"",
                text(&a["channel"]),
                text(&a["from"]),
                one_line(&a["preview"])
            ),
            Some(shown),
        ));
    }
    compose(window, pending, lines)
}

/// Whether `key` is news to call out: not in `called_out` (the newest 50
/// call-outs), which from now on holds it.
fn called_out_now(called_out: &mut Vec<String>, key: String) -> bool {
    if called_out.contains(&key) {
        return false;
    }
    called_out.push(key);
    let keep = called_out.len().saturating_sub(50);
    called_out.drain(..keep);
    true
}

/// Conversations owing this window's acknowledgement, each debt (where it
/// starts and how much) called out once; and the direct and channel
/// messages its agent owes an acknowledgement (`owed_acks`).
fn owed(pending: &Value, marks: &mut HookMarks) -> Vec<(String, Option<Shown>)> {
    let mut lines = Vec::new();
    for c in list(pending, "conversations") {
        let owed = format!(
            "{}@{}@{}",
            text(&c["conversation_id"]),
            c["first_unacknowledged_seq"],
            c["unacknowledged"]
        );
        if !called_out_now(&mut marks.owed_called_out, owed) {
            continue;
        }
        lines.push((
            format!(
                "- conversation \"{}\" ({}): {} message(s) await your acknowledgement \
                 from seq {} (read_conversation, then ack_message)",
                one_line(&c["title"]),
                text(&c["conversation_id"]),
                c["unacknowledged"],
                c["first_unacknowledged_seq"]
            ),
            None,
        ));
    }
    // Direct and channel messages owed an ack: each called out once, and
    // again once it is overdue.
    for a in pending["owed_acks"]["items"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let owed = format!("msg:{}:{}", text(&a["message_id"]), a["overdue"]);
        if !called_out_now(&mut marks.owed_called_out, owed) {
            continue;
        }
        lines.push((
            format!(
                "- {} (ack_message {{message_id: \"{}\"}}; list_owed lists them)",
                super::stop_hook::owed_ack(a),
                text(&a["message_id"])
            ),
            None,
        ));
    }
    lines
}

/// The context from its lines, cut to fit; and the messages whose text made
/// it in.
fn compose(
    window: &WindowState,
    pending: &Value,
    lines: Vec<(String, Option<Shown>)>,
) -> (Option<String>, Vec<Shown>) {
    if lines.is_empty() {
        return (None, Vec::new());
    }
    let mut context = format!(
        "ai-crew-sync: you are {}/{} in team {} ({} unread direct message(s)). New for you:\n",
        window.agent,
        window.label,
        window.team,
        unread_count(pending)
    );
    let mut shown = Vec::new();
    for (line, message) in lines {
        if context.chars().count() + line.chars().count() + 1 > CONTEXT_MAX_CHARS - 40 {
            context.push_str("- … more: call pending_for_me\n");
            break;
        }
        let _ = writeln!(context, "{line}");
        shown.extend(message);
    }
    (Some(context.trim_end().to_string()), shown)
}

/// The unread count as the bus gave it: a count that stopped at its cap
/// says so (`1000+`), never more than is known.
fn unread_count(pending: &Value) -> String {
    let unread = &pending["unread_direct_messages"];
    let count = unread["count"].as_i64().unwrap_or(0);
    if unread["at_least"] == Value::Bool(true) {
        format!("{count}+")
    } else {
        count.to_string()
    }
}

fn status_line(window: &WindowState, pending: &Value) -> String {
    let count = |key: &str| pending[key].as_array().map_or(0, Vec::len);
    format!(
        "acs {}/{} · {} unread · {} question(s) · {} to ack · {} lease(s) lapsing",
        window.agent,
        window.label,
        unread_count(pending),
        count("open_questions"),
        count("conversations") as i64 + pending["owed_acks"]["count"].as_i64().unwrap_or(0),
        count("expiring_tasks")
    )
}
