//! Text for people: each tool's JSON answer in a few lines or a table. Reads
//! the answer as JSON (the wire contract), so a field the server adds later
//! only shows up in `--json`, and a missing one prints as `-`.
//!
//! Size: about 620 lines of one concept (one renderer per tool answer, all
//! in the same shape); split it by command group if it grows.

use serde_json::Value;

use crate::cli::output;

/// A JSON scalar as text: strings bare, null as `-`.
pub fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) if s.is_empty() => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// An RFC 3339 timestamp as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn when(value: &Value) -> String {
    value
        .as_str()
        .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
        .map(|t| output::time(&t.with_timezone(&chrono::Utc)))
        .unwrap_or_else(|| "-".into())
}

pub fn items(value: &Value) -> &[Value] {
    value.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A table with a row, made by `row`, per item of the JSON array `list`.
pub fn table_of(list: &Value, headers: &[&str], row: impl Fn(&Value) -> Vec<String>) {
    output::table(headers, items(list).iter().map(row).collect());
}

fn joined(value: &Value) -> String {
    listed(items(value).iter().map(text).collect(), "-")
}

/// `parts` joined by commas, or `none` when there are none.
pub fn listed(parts: Vec<String>, none: &str) -> String {
    if parts.is_empty() {
        none.into()
    } else {
        parts.join(", ")
    }
}

/// The first line of `s`, at most `max` characters, marked when cut.
fn one_line(s: &str, max: usize) -> String {
    let first = s.lines().next().unwrap_or_default();
    let cut: String = first.chars().take(max).collect();
    if cut.len() < s.trim_end().len() {
        format!("{cut}…")
    } else {
        cut
    }
}

/// An empty page of messages: the bus says what it read past (issue 38:
/// never a bare nothing), else `(no messages)`.
pub fn no_messages(answer: &Value) {
    match answer["note"].as_str() {
        Some(note) => println!("{note}"),
        None => println!("(no messages)"),
    }
}

/// `body` line by line, indented under the line it belongs to.
pub fn indented(body: &str) {
    for line in body.lines() {
        println!("    {line}");
    }
}

/// A wait that woke with nothing: the server restarting, a timeout (after
/// which `timed_out` says what did not come), or an empty wake-up.
pub fn woke_empty(answer: &Value, timed_out: &str) {
    if answer["server_restarting"] == true {
        println!("the server is restarting: wait again");
    } else if answer["timed_out"] == true {
        println!("timed out: {timed_out}");
    } else {
        println!("woke with nothing to show: read or wait again");
    }
}

fn yes_no(value: &Value) -> String {
    if value == true { "yes" } else { "no" }.into()
}

pub fn whoami(me: &Value) {
    let credential = if me["credential"] == "session" {
        "session credential"
    } else {
        "agent token"
    };
    println!(
        "{} in team {} ({credential})",
        text(&me["address"]),
        text(&me["team"])
    );
    let mut labels = Vec::new();
    if !me["project"].is_null() {
        labels.push(format!("project {}", text(&me["project"])));
    }
    if !me["role"].is_null() {
        labels.push(format!("role {}", text(&me["role"])));
    }
    if !labels.is_empty() {
        println!("{}", labels.join(", "));
    }
    let from = match me["default_channel_from"].as_str() {
        Some("set") => " (set for this window)",
        Some("project") => " (from the project)",
        Some("window") => " (from the window label)",
        _ => "",
    };
    println!(
        "default channel: {}{from}; unread direct messages: {}; claimed tasks: {}",
        text(&me["default_channel"]),
        text(&me["unread_direct_messages"]),
        text(&me["open_claimed_tasks"])
    );
}

pub fn sent(posted: &Value) {
    let message = &posted["message"];
    let created = if posted["channel_created"] == true {
        " (new channel)"
    } else {
        ""
    };
    println!(
        "sent {} to {}{created}",
        text(&message["id"]),
        joined(&posted["delivered_to"])
    );
}

/// `read_messages` (`{messages, more}`) and `search_messages` (`{messages}`):
/// a header line per message, its body indented under it.
pub fn messages(answer: &Value) {
    let list = items(&answer["messages"]);
    if list.is_empty() {
        no_messages(answer);
    }
    for message in list {
        let to = match message["channel"].as_str() {
            Some(channel) => format!("#{channel}"),
            None => text(&message["to"]),
        };
        let mut flags = String::new();
        if message["announce"] == true {
            flags.push_str(" [announce]");
        }
        if message["question"] == true {
            flags.push_str(" [question]");
        }
        if !message["reply_to"].is_null() {
            flags.push_str(&format!(" [reply to {}]", text(&message["reply_to"])));
        }
        println!(
            "{}  {} -> {}{flags}  id {}",
            when(&message["created_at"]),
            text(&message["from"]),
            to,
            text(&message["id"])
        );
        indented(message["body"].as_str().unwrap_or_default());
        for file in items(&message["attachments"]) {
            println!(
                "    attachment {} {} ({} bytes, {})",
                text(&file["id"]),
                text(&file["filename"]),
                text(&file["size_bytes"]),
                text(&file["content_type"])
            );
        }
    }
    if answer["more"] == true {
        println!("(more waiting: read again)");
    }
}

pub fn channels(answer: &Value) {
    table_of(
        &answer["channels"],
        &["channel", "messages", "last message", "topic"],
        |c| {
            vec![
                format!("#{}", text(&c["name"])),
                text(&c["messages"]),
                when(&c["last_message_at"]),
                text(&c["topic"]),
            ]
        },
    );
}

pub fn agents(answer: &Value) {
    let list = items(&answer["agents"]);
    println!(
        "{} of {} agents online",
        text(&answer["online_count"]),
        list.len()
    );
    table_of(
        &answer["agents"],
        &[
            "agent",
            "online",
            "status",
            "activity",
            "windows",
            "last seen",
        ],
        |a| {
            let windows = folded_windows(a);
            let online = if a["disabled"] == true {
                "disabled".into()
            } else {
                yes_no(&a["online"])
            };
            vec![
                text(&a["agent"]),
                online,
                text(&a["status"]),
                text(&a["activity"]),
                windows,
                when(&a["last_seen_at"]),
            ]
        },
    );
}

/// An agent's windows on one line: the live ones by address (idle ones
/// marked), the others counted.
fn folded_windows(agent: &Value) -> String {
    let windows = items(&agent["windows"]);
    let mut shown: Vec<String> = windows
        .iter()
        .filter(|w| w["online"] == true)
        .map(|w| {
            let address = text(&w["address"]);
            if w["state"] == "idle" {
                format!("{address} (idle)")
            } else {
                address
            }
        })
        .collect();
    let offline = windows.iter().filter(|w| w["online"] != true).count();
    if offline > 0 {
        shown.push(format!("+{offline} offline"));
    }
    let older = agent["older_windows"].as_u64().unwrap_or(0);
    if older > 0 {
        shown.push(format!("+{older} offline for over a day"));
    }
    listed(shown, "-")
}

pub fn sessions(answer: &Value) {
    table_of(
        &answer["sessions"],
        &[
            "address",
            "exact",
            "state",
            "status",
            "project",
            "role",
            "activity",
            "last seen",
        ],
        |s| {
            vec![
                text(&s["address"]),
                yes_no(&s["exact"]),
                text(&s["state"]),
                text(&s["status"]),
                text(&s["project"]),
                text(&s["role"]),
                text(&s["activity"]),
                when(&s["last_seen_at"]),
            ]
        },
    );
    if answer["truncated"] == true {
        println!("(more windows match: raise --limit or filter by --project/--role)");
    }
}

pub fn beat(window: &Value) {
    println!(
        "{} is {}, online until {} ({} s)",
        text(&window["address"]),
        text(&window["status"]),
        when(&window["expires_at"]),
        text(&window["ttl_seconds"])
    );
    if !window["activity"].is_null() {
        println!("activity: {}", text(&window["activity"]));
    }
}

fn holder(task: &Value) -> String {
    if !task["holder"].is_null() {
        text(&task["holder"]["address"])
    } else if !task["lapsed_holder"].is_null() {
        format!("{} (lapsed)", text(&task["lapsed_holder"]["address"]))
    } else {
        "-".into()
    }
}

/// `blocked_by`, each cancelled blocker marked: it will never be done.
fn blockers(task: &Value) -> String {
    let cancelled = items(&task["blocked_by_cancelled"]);
    let parts: Vec<String> = items(&task["blocked_by"])
        .iter()
        .map(|b| {
            if cancelled.contains(b) {
                format!("{} (cancelled)", text(b))
            } else {
                text(b)
            }
        })
        .collect();
    listed(parts, "-")
}

pub fn tasks(answer: &Value) {
    table_of(
        &answer["tasks"],
        &["key", "status", "priority", "holder", "blocked by", "title"],
        |t| {
            vec![
                text(&t["key"]),
                text(&t["status"]),
                text(&t["priority"]),
                holder(t),
                blockers(t),
                one_line(t["title"].as_str().unwrap_or_default(), 60),
            ]
        },
    );
    if answer["more"] == true {
        println!("(more tasks match: raise --limit or filter by --status)");
    }
}

/// One line for a task a command just changed.
pub fn task_line(task: &Value) {
    let mut line = format!(
        "task {}: {} ({})",
        text(&task["key"]),
        text(&task["status"]),
        one_line(task["title"].as_str().unwrap_or_default(), 60)
    );
    if task["priority"].is_string() && task["priority"] != "normal" {
        line.push_str(&format!(", priority {}", text(&task["priority"])));
    }
    if !task["holder"].is_null() {
        line.push_str(&format!(
            ", held by {} until {}",
            text(&task["holder"]["address"]),
            when(&task["holder"]["lease_expires_at"])
        ));
    }
    if !items(&task["blocked_by"]).is_empty() {
        line.push_str(&format!(", blocked by {}", blockers(task)));
    }
    println!("{line}");
}

/// `task cancel`: the task's line, then who is left waiting on it.
pub fn cancelled_task(answer: &Value) {
    task_line(answer);
    if !items(&answer["dependents"]).is_empty() {
        println!(
            "{} task(s) still wait on it: {} (their creators can re-point them with `task \
             depends KEY --on OTHER` or cancel them)",
            text(&answer["dependents_total"]),
            joined(&answer["dependents"])
        );
    }
}

pub fn task_detail(task: &Value) {
    println!("{}: {}", text(&task["key"]), text(&task["title"]));
    let mut status = format!("status: {}", text(&task["status"]));
    if !task["holder"].is_null() {
        status.push_str(&format!(
            ", held by {} until {}",
            text(&task["holder"]["address"]),
            when(&task["holder"]["lease_expires_at"])
        ));
    } else if !task["lapsed_holder"].is_null() {
        status.push_str(&format!(
            ", lease of {} lapsed",
            text(&task["lapsed_holder"]["address"])
        ));
    }
    println!("{status}");
    if !items(&task["depends_on"]).is_empty() {
        println!(
            "depends on: {} (blocked by: {})",
            joined(&task["depends_on"]),
            blockers(task)
        );
    }
    println!(
        "created by {} at {}",
        text(&task["created_by"]),
        when(&task["created_at"])
    );
    if !task["completed_by"].is_null() {
        println!(
            "completed by {} at {}",
            text(&task["completed_by"]),
            when(&task["completed_at"])
        );
    }
    if !task["cancelled_by"].is_null() {
        println!(
            "cancelled by {} at {}",
            text(&task["cancelled_by"]),
            when(&task["cancelled_at"])
        );
    }
    if task["metadata"].as_object().is_some_and(|m| !m.is_empty()) {
        println!("metadata: {}", task["metadata"]);
    }
    for (label, field) in [
        ("description", "description"),
        ("result", "result"),
        ("cancel reason", "cancel_reason"),
    ] {
        if let Some(body) = task[field].as_str() {
            println!("{label}:");
            indented(body);
        }
    }
    let events = items(&task["events"]);
    println!(
        "events ({} of {}):",
        events.len(),
        text(&task["events_total"])
    );
    table_of(&task["events"], &["at", "event", "by"], |e| {
        vec![when(&e["at"]), text(&e["kind"]), text(&e["by"])]
    });
}

pub fn lock(acquired: &Value) {
    let verb = if acquired["extended"] == true {
        "extended"
    } else {
        "acquired"
    };
    println!(
        "{verb} lock {} until {} ({} s)",
        text(&acquired["name"]),
        when(&acquired["expires_at"]),
        text(&acquired["seconds_left"])
    );
}

pub fn lock_released(released: &Value) {
    let mut line = format!("released lock {}", text(&released["name"]));
    if released["had_expired"] == true {
        line.push_str(" (it had already expired)");
    }
    println!("{line}");
}

pub fn locks(answer: &Value) {
    table_of(
        &answer["locks"],
        &["lock", "holder", "expires", "seconds left", "purpose"],
        |l| {
            vec![
                text(&l["name"]),
                text(&l["holder"]),
                when(&l["expires_at"]),
                text(&l["seconds_left"]),
                text(&l["purpose"]),
            ]
        },
    );
    if answer["more"] == true {
        println!("(more locks exist than were listed)");
    }
}

pub fn note_set(set: &Value) {
    let what = if set["created"] == true {
        "created"
    } else if set["changed"] == true {
        "updated"
    } else {
        "unchanged"
    };
    println!(
        "note {}/{} {what}: revision {}, {} bytes",
        text(&set["scope"]),
        text(&set["key"]),
        text(&set["revision"]),
        text(&set["bytes"])
    );
}

pub fn note_deleted(deleted: &Value) {
    let name = format!("{}/{}", text(&deleted["scope"]), text(&deleted["key"]));
    if deleted["deleted"] == true {
        println!("deleted note {name}");
    } else {
        println!("no note {name}: nothing deleted");
    }
}

pub fn note_hits(answer: &Value) {
    table_of(
        &answer["results"],
        &["scope", "key", "tags", "snippet"],
        |n| {
            vec![
                text(&n["scope"]),
                text(&n["key"]),
                joined(&n["tags"]),
                one_line(&text(&n["snippet"]).replace('\n', " "), 80),
            ]
        },
    );
    if answer["truncated"] == true {
        println!("(more notes match: narrow the query or --scope)");
    }
}

pub fn wait(answer: &Value) {
    let events = items(&answer["events"]);
    if events.is_empty() {
        woke_empty(answer, "nothing happened");
        return;
    }
    table_of(
        &answer["events"],
        &["kind", "what", "by", "where", "preview"],
        |e| {
            let place = match (e["channel"].as_str(), e["to"].as_str()) {
                (Some(channel), _) => format!("#{channel}"),
                (None, Some(to)) => to.to_string(),
                (None, None) => "-".into(),
            };
            vec![
                text(&e["kind"]),
                text(&e["id"]),
                text(&e["by"]),
                place,
                one_line(e["preview"].as_str().unwrap_or_default(), 60),
            ]
        },
    );
}

pub fn digest(digest: &Value) {
    let focus = match digest["focus"].as_str() {
        Some(channel) => format!("focus #{channel}"),
        None if digest["all_channels"] == true => "all channels".into(),
        None => "no focused channel".into(),
    };
    println!(
        "last {} h (since {}), {focus}",
        text(&digest["hours"]),
        when(&digest["since"])
    );
    println!("channels:");
    let channels = items(&digest["channels"]);
    if channels.is_empty() {
        println!("    (none)");
    }
    for channel in channels {
        println!(
            "  #{}: {} messages",
            text(&channel["channel"]),
            text(&channel["messages"])
        );
        for m in items(&channel["latest"]) {
            println!(
                "    {}  {}: {}",
                when(&m["created_at"]),
                text(&m["from"]),
                one_line(m["preview"].as_str().unwrap_or_default(), 100)
            );
        }
    }
    println!("tasks:");
    table_of(
        &digest["tasks"],
        &["task", "status", "last event", "by", "at"],
        |t| {
            vec![
                text(&t["key"]),
                text(&t["status"]),
                text(&t["last_event"]),
                text(&t["by"]),
                when(&t["at"]),
            ]
        },
    );
    println!("notes:");
    table_of(&digest["notes"], &["note", "change", "by", "at"], |n| {
        vec![
            format!("{}/{}", text(&n["scope"]), text(&n["key"])),
            if n["deleted"] == true {
                "deleted".into()
            } else {
                format!("revision {}", text(&n["revision"]))
            },
            text(&n["by"]),
            when(&n["at"]),
        ]
    });
    println!("agents seen:");
    table_of(
        &digest["agents_seen"],
        &["agent", "windows", "last seen"],
        |a| {
            vec![
                text(&a["agent"]),
                text(&a["windows"]),
                when(&a["last_seen_at"]),
            ]
        },
    );
    println!("reserved paths (now):");
    let rows = items(&digest["reservations"])
        .iter()
        .flat_map(|w| {
            items(&w["items"]).iter().map(move |r| {
                vec![
                    text(&w["holder"]),
                    text(&r["pattern"]),
                    if r["exclusive"] == true {
                        "exclusive"
                    } else {
                        "shared"
                    }
                    .into(),
                    when(&r["expires_at"]),
                ]
            })
        })
        .collect();
    output::table(&["holder", "paths", "mode", "until"], rows);
}

pub fn attached(info: &Value, path: &std::path::Path) {
    println!(
        "attached {} as {} ({} bytes, {}): attachment {}",
        path.display(),
        text(&info["filename"]),
        text(&info["size_bytes"]),
        text(&info["content_type"]),
        text(&info["id"])
    );
}
