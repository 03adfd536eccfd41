//! The Stop hook's decision: block the stop once when this window would
//! leave work stranded, and say by name what to finish, hand back or
//! release. Stranded means: tasks it claimed, locks or path reservations it
//! holds, a question (`ask_agent`) to it still unanswered, conversation
//! messages awaiting its acknowledgement, direct and channel messages that
//! asked its agent for an acknowledgement it has not given (`owed_acks`,
//! overdue ones said so). All of it comes from one
//! `pending_for_me` call (its `holdings`).
//!
//! The host's format is Claude Code's Stop hook output,
//! `{"decision": "block", "reason": …}`: the reason is fed to the model as
//! its next instruction and the turn goes on; `stop_hook_active` in the
//! input says the turn already goes on because of a stop hook, and then the
//! caller says nothing ([`super::hook`]), so a block never loops. Checked
//! against Claude Code's hooks reference, <https://code.claude.com/docs/en/hooks>,
//! sections "Stop and SubagentStop input" and "Stop/SubagentStop decision
//! control".
//!
//! Never twice in a row for the same things: the marks remember what the
//! last block was for ([`HookMarks::stop_blocked_for`]); a stop that finds
//! exactly that again lets the host stop (the model was told, and chose).
//! A question blocks one stop only, ever ([`HookMarks::blocked_for`]).

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::hook::{CONTEXT_MAX_CHARS, one_line, text};
use super::window_state::{HookMarks, WindowState};

/// How many question ids the marks keep (questions are found among the
/// newest direct messages anyway).
const QUESTIONS_REMEMBERED: usize = 50;

/// One thing a stop would strand: a stable key and the line that says it.
struct Owed {
    key: String,
    line: String,
    /// The question's message id, when it is one.
    question: Option<uuid::Uuid>,
}

/// The hook's output for this stop, or `None` to let the host stop.
/// Updates `marks` (the caller saves them).
pub(super) fn decide(
    window: &WindowState,
    pending: &Value,
    marks: &mut HookMarks,
) -> Option<String> {
    let owed = owed(pending, marks);
    if owed.is_empty() {
        marks.stop_blocked_for.clear();
        return None;
    }
    let mut keys: Vec<String> = owed.iter().map(|o| o.key.clone()).collect();
    keys.sort();
    if keys == marks.stop_blocked_for {
        return None;
    }
    marks.stop_blocked_for = keys;
    marks
        .blocked_for
        .extend(owed.iter().filter_map(|o| o.question));
    let keep = marks.blocked_for.len().saturating_sub(QUESTIONS_REMEMBERED);
    marks.blocked_for.drain(..keep);
    Some(json!({"decision": "block", "reason": reason(window, &owed)}).to_string())
}

fn list<'a>(value: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    value[key].as_array().into_iter().flatten()
}

/// "and N more" for a held kind whose count is past what was listed.
fn more(held: &Value, kind: &str) -> Option<Owed> {
    let count = held["count"].as_i64().unwrap_or(0);
    let listed = held["items"].as_array().map_or(0, Vec::len) as i64;
    (count > listed).then(|| {
        let plus = if held["at_least"] == Value::Bool(true) {
            "+"
        } else {
            ""
        };
        Owed {
            key: format!("{kind}:count:{count}{plus}"),
            line: format!(
                "- and {}{plus} more {kind}(s): see pending_for_me",
                count - listed
            ),
            question: None,
        }
    })
}

/// Everything a stop would strand, in the order the reason lists it.
fn owed(pending: &Value, marks: &HookMarks) -> Vec<Owed> {
    let mut owed = Vec::new();
    let holdings = &pending["holdings"];
    let tasks = &holdings["claimed_tasks"];
    for t in list(tasks, "items") {
        let key = text(&t["key"]);
        let lapsed = if t["lapsed"] == Value::Bool(true) {
            " (its lease lapsed)"
        } else {
            ""
        };
        owed.push(Owed {
            key: format!("task:{key}"),
            line: format!(
                "- task {key} \"{}\" is claimed by you{lapsed}: finish it (complete_task {{key: \
                 \"{key}\", result: …}}) or hand it back (release_task {{key: \"{key}\"}})",
                one_line(&t["title"])
            ),
            question: None,
        });
    }
    owed.extend(more(tasks, "task"));
    let locks = &holdings["locks"];
    for l in list(locks, "items") {
        let name = text(&l["name"]);
        owed.push(Owed {
            key: format!("lock:{name}"),
            line: format!("- lock `{name}` is held by you: release_lock {{name: \"{name}\"}}"),
            question: None,
        });
    }
    owed.extend(more(locks, "lock"));
    let reservations = &holdings["reservations"];
    for r in list(reservations, "items") {
        let pattern = text(&r["pattern"]);
        let how = if r["exclusive"] == Value::Bool(true) {
            "exclusive"
        } else {
            "shared"
        };
        owed.push(Owed {
            key: format!("reservation:{}:{pattern}", text(&r["project"])),
            line: format!(
                "- path reservation `{pattern}` ({how}) is held by you: release_paths {{paths: \
                 [\"{pattern}\"]}} (release_paths {{}} releases all of yours)"
            ),
            question: None,
        });
    }
    owed.extend(more(reservations, "reservation"));
    for q in list(pending, "open_questions") {
        let Some(id) = q["message_id"]
            .as_str()
            .and_then(|s| s.parse::<uuid::Uuid>().ok())
        else {
            continue;
        };
        if marks.blocked_for.contains(&id) {
            continue;
        }
        let from = text(&q["from"]);
        owed.push(Owed {
            key: format!("question:{id}"),
            line: format!(
                "- {from} asked you a question that is still unanswered: \"{}\" (message {id}): \
                 answer it with post_message {{to: \"{from}\", reply_to: \"{id}\", body: …}} (or \
                 say you cannot)",
                one_line(&q["preview"])
            ),
            question: Some(id),
        });
    }
    for c in list(pending, "conversations") {
        let id = text(&c["conversation_id"]);
        owed.push(Owed {
            key: format!(
                "ack:{id}@{}@{}",
                c["first_unacknowledged_seq"], c["unacknowledged"]
            ),
            line: format!(
                "- conversation \"{}\" ({id}): {} message(s) await your acknowledgement from seq \
                 {}: read_conversation, then ack_message",
                one_line(&c["title"]),
                c["unacknowledged"],
                c["first_unacknowledged_seq"]
            ),
            question: None,
        });
    }
    let acks = &pending["owed_acks"];
    for a in list(acks, "items") {
        let id = text(&a["message_id"]);
        owed.push(Owed {
            key: format!("owed-ack:{id}:{}", a["overdue"]),
            line: format!(
                "- {}: ack_message {{message_id: \"{id}\"}} once dealt with",
                owed_ack(a)
            ),
            question: None,
        });
    }
    owed.extend(more(acks, "acknowledgement"));
    owed
}

/// A direct or channel message owed an acknowledgement, in words: who asked,
/// where, and whether it is overdue (pending_for_me's `owed_acks`).
pub(super) fn owed_ack(a: &Value) -> String {
    let id = text(&a["message_id"]);
    let place = match a["channel"].as_str() {
        Some(channel) => format!("in #{channel}"),
        None => "in a direct message".to_string(),
    };
    let due = match a["due_at"].as_str() {
        Some(due) if a["overdue"] == Value::Bool(true) => format!(", OVERDUE since {due}"),
        Some(due) => format!(", due {due}"),
        None => String::new(),
    };
    format!(
        "{} asked you {place} to acknowledge message {id}{due}",
        text(&a["from"])
    )
}

/// The reason the model reads, cut to fit.
fn reason(window: &WindowState, owed: &[Owed]) -> String {
    let mut reason = format!(
        "ai-crew-sync: before you stop, finish, hand back or release what window {}/{} still \
         holds or owes (this stop is blocked once: if you cannot deal with it now, say so and \
         stop again):\n",
        window.agent, window.label
    );
    for o in owed {
        if reason.chars().count() + o.line.chars().count() + 1 > CONTEXT_MAX_CHARS - 40 {
            reason.push_str("- … more: call pending_for_me\n");
            break;
        }
        let _ = writeln!(reason, "{}", o.line);
    }
    reason.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;

    fn window() -> WindowState {
        WindowState {
            host_session: "cc".into(),
            label: "cc-one".into(),
            url: "http://127.0.0.1:1/mcp".into(),
            team: "acme".into(),
            agent: "alice".into(),
            credential: "acss_x".into(),
            epoch: 1,
            expires_at: Utc::now(),
            pid: 1,
            updated_at: Utc::now(),
        }
    }

    fn holding(tasks: &[&str]) -> Value {
        let items: Vec<Value> = tasks
            .iter()
            .map(|k| json!({"key": k, "title": "t", "lease_expires_at": "x", "lapsed": false}))
            .collect();
        let none = json!({"count": 0, "at_least": false, "items": []});
        json!({"holdings": {
            "claimed_tasks": {"count": items.len(), "at_least": false, "items": items},
            "locks": none.clone(),
            "reservations": none,
        }})
    }

    // Breakage: dropping the `keys == marks.stop_blocked_for` check blocks
    // every stop while a task is held.
    #[test]
    fn the_same_holdings_block_one_stop_in_a_row_and_new_ones_block_again() {
        let mut marks = HookMarks::default();
        let first = decide(&window(), &holding(&["T-1"]), &mut marks).expect("blocks");
        assert!(first.contains("\"decision\":\"block\"") && first.contains("T-1"));
        assert_eq!(decide(&window(), &holding(&["T-1"]), &mut marks), None);
        assert!(decide(&window(), &holding(&["T-1", "T-2"]), &mut marks).is_some());
        // A stop with nothing held forgets the last block.
        assert_eq!(decide(&window(), &holding(&[]), &mut marks), None);
        assert!(decide(&window(), &holding(&["T-1"]), &mut marks).is_some());
    }

    fn owing(overdue: bool) -> Value {
        let mut pending = holding(&[]);
        pending["owed_acks"] = json!({"count": 3, "at_least": false, "overdue": 1, "items": [
            {"message_id": "m-1", "kind": "channel", "from": "bob", "channel": "ops",
             "due_at": "2026-01-01T00:00:00Z", "overdue": overdue},
        ]});
        pending
    }

    // An owed ack blocks a stop, says who asked where, and says OVERDUE once
    // it is; the same debt does not block twice in a row, but its turning
    // overdue does.
    #[test]
    fn an_owed_acknowledgement_blocks_once_and_again_when_it_becomes_overdue() {
        let mut marks = HookMarks::default();
        let first = decide(&window(), &owing(false), &mut marks).expect("blocks");
        assert!(
            first.contains("bob asked you in #ops to acknowledge message m-1, due")
                && first.contains("and 2 more acknowledgement(s)"),
            "{first}"
        );
        assert_eq!(decide(&window(), &owing(false), &mut marks), None);
        let overdue = decide(&window(), &owing(true), &mut marks).expect("blocks again");
        assert!(overdue.contains("OVERDUE since 2026-01-01"), "{overdue}");
    }
}
