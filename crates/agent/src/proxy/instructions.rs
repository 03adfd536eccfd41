//! The start-of-session text in `initialize`'s `instructions`: who you are,
//! what is waiting for you, what you hold, what the team did lately. A host
//! puts it in front of the model once, so it is short (at most
//! [`INSTRUCTIONS_MAX_CHARS`]) and never delays the handshake for long: the
//! bus gets a bounded time, then a note says what is missing.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::Proxy;
use super::window::object;

pub const INSTRUCTIONS_MAX_CHARS: usize = 2_000;
/// How long the bus may take to answer the three reads.
const READS_BOUND: Duration = Duration::from_secs(3);

const HOW: &str = "Use this server's tools to coordinate with your team: read_messages, \
                   post_message, list_tasks / claim_task / complete_task, acquire_lock, \
                   wait_for_updates. session_status says which window you are; configure_session \
                   sets your project, role and default channel.";

/// The reserve -> edit -> release flow, in a few lines.
const RESERVE: &str = "Before editing files: reserve_paths {\"paths\": [\"src/api/**\"], \
                       \"reason\": \"...\"} (repository-relative, gitignore-style globs; \
                       exclusive unless \"exclusive\": false), then edit, then release_paths when \
                       the change is committed or handed off. A refused path names its holder: \
                       ask them (ask_agent) or work elsewhere; check_paths says who holds a path.";

/// Reservations listed in the instructions (the digest holds more).
const RESERVATIONS_SHOWN: usize = 5;

pub(super) async fn build(proxy: &Proxy) -> String {
    proxy.wait_settled().await;
    let connected = proxy.bound.read().await.window.is_some();
    if !connected {
        let trouble = proxy.trouble.lock().await.clone();
        let text = format!(
            "ai-crew-sync: this conversation is not connected to the team's bus yet ({}). The \
             bus tools appear when it answers; call session_status to see the state.",
            trouble.unwrap_or_else(|| "it has not answered yet".into())
        );
        return cut(&text);
    }
    let reads = async {
        tokio::join!(
            proxy.call_json("whoami", Map::new()),
            proxy.call_json(
                "list_tasks",
                object(json!({"status": "claimed", "mine_only": true, "limit": 10})),
            ),
            proxy.call_json("team_digest", object(json!({"hours": 24}))),
        )
    };
    let Ok((me, tasks, digest)) = tokio::time::timeout(READS_BOUND, reads).await else {
        return cut(&format!(
            "ai-crew-sync: you are window {} on the team's bus; it was slow to say what is new, \
             so call whoami, list_tasks {{\"mine_only\": true}} and team_digest yourself. {HOW} \
             {RESERVE}",
            proxy.host().label
        ));
    };
    let mut text = String::new();
    match &me {
        Ok(me) => {
            let _ = write!(
                text,
                "ai-crew-sync: you are agent {} of team {}, in window {} (address {}).",
                me["agent"].as_str().unwrap_or("?"),
                me["team"].as_str().unwrap_or("?"),
                me["session"].as_str().unwrap_or("?"),
                me["address"].as_str().unwrap_or("?"),
            );
            if proxy.host().provisional {
                // The first tool call may name the conversation (`thread.rs`).
                text.push_str(
                    " That window is provisional until your first tool call; session_status \
                     says which one you are in then.",
                );
            }
            if let Some(project) = me["project"].as_str() {
                let _ = write!(text, " Project: {project}.");
            }
            // The bus's decision (whoami), never the proxy's own.
            if let Some(channel) = me["default_channel"].as_str() {
                let why = match me["default_channel_from"].as_str() {
                    Some("set") => "set for this window",
                    Some("project") => "named after your project",
                    Some("window") => "named after your window",
                    _ => "",
                };
                let why = if why.is_empty() {
                    String::new()
                } else {
                    format!(", {why}")
                };
                let _ = write!(
                    text,
                    " Default channel: #{channel}{why} (post_message without channel or to goes \
                     there)."
                );
            }
            let unread = me["unread_direct_messages"].as_i64().unwrap_or(0);
            let more = if me["unread_direct_messages_at_least"] == true {
                "+"
            } else {
                ""
            };
            let _ = write!(
                text,
                "\nUnread direct messages: {unread}{more}{}.",
                if unread > 0 {
                    " (read_messages {\"scope\": \"inbox\"})"
                } else {
                    ""
                }
            );
        }
        Err(err) => {
            let _ = write!(text, "ai-crew-sync: whoami failed: {err:#}.");
        }
    }
    if let Ok(tasks) = &tasks {
        let held: Vec<String> = tasks["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                format!(
                    "{} \"{}\" (lease {} s left)",
                    t["key"].as_str().unwrap_or("?"),
                    t["title"].as_str().unwrap_or(""),
                    t["holder"]["lease_seconds_left"].as_i64().unwrap_or(0)
                )
            })
            .collect();
        if held.is_empty() {
            text.push_str("\nTasks you hold: none.");
        } else {
            let _ = write!(text, "\nTasks you hold: {}.", held.join("; "));
        }
    }
    if let Ok(digest) = &digest {
        news(&mut text, digest);
    }
    let _ = write!(text, "\n{HOW}\n{RESERVE}");
    cut(&text)
}

/// The team's last 24 hours from `team_digest`, a line per kind.
fn news(text: &mut String, digest: &Value) {
    let list = |key: &str| digest[key].as_array().cloned().unwrap_or_default();
    let channels: Vec<String> = list("channels")
        .iter()
        .filter(|c| c["messages"].as_i64().unwrap_or(0) > 0)
        .map(|c| {
            let latest = c["latest"]
                .as_array()
                .and_then(|l| l.last())
                .map(|m| {
                    format!(
                        ", latest {}: \"{}\"",
                        m["from"].as_str().unwrap_or("?"),
                        m["preview"].as_str().unwrap_or("")
                    )
                })
                .unwrap_or_default();
            format!(
                "#{} {} message(s){latest}",
                c["channel"].as_str().unwrap_or("?"),
                c["messages"]
            )
        })
        .collect();
    if !channels.is_empty() {
        let _ = write!(text, "\nTeam news (24 h): {}.", channels.join("; "));
    }
    let tasks: Vec<String> = list("tasks")
        .iter()
        .take(5)
        .map(|t| {
            format!(
                "{} {} by {}",
                t["key"].as_str().unwrap_or("?"),
                t["last_event"].as_str().unwrap_or("?"),
                t["by"].as_str().unwrap_or("?")
            )
        })
        .collect();
    if !tasks.is_empty() {
        let _ = write!(text, "\nTasks that moved: {}.", tasks.join("; "));
    }
    reserved(text, &list("reservations"));
    let agents: Vec<String> = list("agents_seen")
        .iter()
        .filter_map(|a| a["agent"].as_str().map(str::to_string))
        .collect();
    if !agents.is_empty() {
        let _ = write!(text, "\nTeammates seen: {}.", agents.join(", "));
    }
}

/// The team's live path reservations (`team_digest`'s `reservations`, one
/// entry per window), the first [`RESERVATIONS_SHOWN`] of them.
fn reserved(text: &mut String, windows: &[Value]) {
    let mut shown = Vec::new();
    let mut total = 0;
    for window in windows {
        total += window["count"].as_u64().unwrap_or(0) as usize;
        for r in window["items"].as_array().into_iter().flatten() {
            if shown.len() < RESERVATIONS_SHOWN {
                shown.push(format!(
                    "{} by {} ({}, until {})",
                    r["pattern"].as_str().unwrap_or("?"),
                    window["holder"].as_str().unwrap_or("?"),
                    if r["exclusive"] == true {
                        "exclusive"
                    } else {
                        "shared"
                    },
                    r["expires_at"]
                        .as_str()
                        .and_then(|at| at.get(11..16))
                        .map_or_else(|| "?".to_string(), |hm| format!("{hm} UTC")),
                ));
            }
        }
    }
    if shown.is_empty() {
        return;
    }
    let more = total.saturating_sub(shown.len());
    let _ = write!(
        text,
        "\nPaths reserved: {}{}.",
        shown.join("; "),
        if more > 0 {
            format!("; and {more} more (list_reservations)")
        } else {
            String::new()
        }
    );
}

/// At most [`INSTRUCTIONS_MAX_CHARS`] characters, cut at a character
/// boundary with a mark that more was left out.
fn cut(text: &str) -> String {
    if text.chars().count() <= INSTRUCTIONS_MAX_CHARS {
        return text.to_string();
    }
    let kept: String = text.chars().take(INSTRUCTIONS_MAX_CHARS - 1).collect();
    format!("{kept}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_to_the_bound() {
        let long = "é".repeat(5_000);
        let cut = cut(&long);
        assert_eq!(cut.chars().count(), INSTRUCTIONS_MAX_CHARS);
        assert!(cut.ends_with('…'));
        assert_eq!(super::cut("short"), "short");
    }
}
