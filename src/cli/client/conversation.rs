//! `ai-crew-sync client conversation …`: conversations with a seat each,
//! gap-free seqs and per-recipient receipts. The argument structs in
//! `src/mcp/conversations.rs` and `src/mcp/conversation_messages.rs` are the
//! contract; the answers are read as JSON, like [`super::show`].

use clap::Subcommand;
use serde_json::{Value, json};
use uuid::Uuid;

use super::files::read_stdin;
use super::show::{indented, items, listed, no_messages, table_of, text, when, woke_empty};
use super::{Print, Request, parse_json_object, request};
use crate::cli::output;

#[derive(Subcommand, Debug)]
pub(super) enum ConversationCommand {
    /// Start a conversation, in a project or private (create_conversation).
    Create {
        /// One line, 1-200 bytes.
        title: String,
        /// The project it belongs to (readable with that project's grant).
        #[arg(long, required_unless_present = "private", conflicts_with = "private")]
        project: Option<String>,
        /// Members only.
        #[arg(long)]
        private: bool,
        /// Invite `agent` or `agent/window` as a participant (repeat for several).
        #[arg(long = "invite", value_name = "ADDR")]
        invite: Vec<String>,
    },
    /// Conversations this window has a seat in or reads by project (list_conversations).
    List {
        /// Include archived conversations.
        #[arg(long)]
        archived: bool,
    },
    /// Invite a window, re-admit it, or change its role (invite_to_conversation).
    Invite {
        /// The conversation's id.
        id: String,
        /// `agent` or `agent/window`.
        address: String,
        /// participant, moderator or observer.
        #[arg(
            long,
            default_value = "participant",
            value_parser = ["participant", "moderator", "observer"]
        )]
        role: String,
        /// Let the invitee read from the first message (default: from now).
        #[arg(long)]
        history_from_start: bool,
    },
    /// Accept this window's invitation (join_conversation).
    Join {
        /// The conversation's id.
        id: String,
    },
    /// Send a message (send_conversation_message); prints the request id to retry with.
    Send {
        /// The conversation's id.
        id: String,
        /// The text (words are joined by spaces); `-` reads it from stdin.
        #[arg(required = true, value_name = "BODY")]
        body: Vec<String>,
        /// Reuse the request id of a send that may have failed: nothing is stored twice
        /// [default: a new random one].
        #[arg(long, value_name = "UUID")]
        request_id: Option<String>,
        /// Id of the message of this conversation this one answers.
        #[arg(long, value_name = "ID")]
        reply_to: Option<String>,
        /// A JSON object of small facts, up to 16 KiB.
        #[arg(long, value_name = "JSON")]
        metadata: Option<String>,
    },
    /// Read messages in seq order (read_conversation); writes no receipt.
    Read {
        /// The conversation's id.
        id: String,
        /// Read after this seq (the `next after seq` of the last read).
        #[arg(long, value_name = "SEQ")]
        after: Option<i64>,
        /// Page size, 1..200 (default 50).
        #[arg(long)]
        limit: Option<i64>,
    },
    /// Acknowledge a message addressed to this window (ack_message).
    Ack {
        /// The message's id.
        message_id: String,
        /// Also mark it resolved.
        #[arg(long)]
        resolved: bool,
        /// A short note for the sender, at most 1024 bytes.
        #[arg(long)]
        note: Option<String>,
    },
    /// Who received, read, acknowledged and resolved a message (get_message_receipts).
    Receipts {
        /// The message's id.
        message_id: String,
    },
    /// Block until a message addressed to this window awaits its acknowledgement
    /// (wait_for_conversation_updates).
    Wait {
        /// Seconds to wait, 1..300 (default 50).
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<u64>,
    },
}

/// How to show a conversation tool's answer.
#[derive(Debug)]
pub(super) enum Show {
    Created,
    List,
    Membership,
    Sent { request_id: String },
    Read,
    Acked,
    Receipts,
    Wait,
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Conversation(show))
}

pub(super) fn prepare(command: ConversationCommand) -> anyhow::Result<Request> {
    use ConversationCommand as C;
    Ok(match command {
        C::Create {
            title,
            project,
            private,
            invite,
        } => shown(
            "create_conversation",
            json!({
                "title": title, "project": project, "private": private.then_some(true),
                "invite": (!invite.is_empty()).then_some(invite),
            }),
            Show::Created,
        ),
        C::List { archived } => shown(
            "list_conversations",
            json!({"include_archived": archived.then_some(true)}),
            Show::List,
        ),
        C::Invite {
            id,
            address,
            role,
            history_from_start,
        } => shown(
            "invite_to_conversation",
            json!({
                "conversation_id": id, "address": address, "role": role,
                "history_from_start": history_from_start.then_some(true),
            }),
            Show::Membership,
        ),
        C::Join { id } => shown(
            "join_conversation",
            json!({"conversation_id": id}),
            Show::Membership,
        ),
        C::Send {
            id,
            body,
            request_id,
            reply_to,
            metadata,
        } => {
            let body = if body == ["-"] {
                read_stdin()?
            } else {
                body.join(" ")
            };
            let request_id = request_id.unwrap_or_else(|| Uuid::new_v4().to_string());
            shown(
                "send_conversation_message",
                json!({
                    "conversation_id": id, "body": body, "request_id": request_id,
                    "reply_to": reply_to,
                    "metadata": parse_json_object("--metadata", metadata.as_deref())?,
                }),
                Show::Sent { request_id },
            )
        }
        C::Read { id, after, limit } => shown(
            "read_conversation",
            json!({"conversation_id": id, "after_seq": after, "limit": limit}),
            Show::Read,
        ),
        C::Ack {
            message_id,
            resolved,
            note,
        } => shown(
            "ack_message",
            json!({
                "message_id": message_id, "resolved": resolved.then_some(true), "note": note,
            }),
            Show::Acked,
        ),
        C::Receipts { message_id } => shown(
            "get_message_receipts",
            json!({"message_id": message_id}),
            Show::Receipts,
        ),
        C::Wait { timeout } => shown(
            "wait_for_conversation_updates",
            json!({"timeout_seconds": timeout}),
            Show::Wait,
        ),
    })
}

/// Print an answer: its JSON with `--json` (a send's with the request id it
/// used), otherwise a few lines.
pub(super) fn print(show: Show, answer: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        if let Show::Sent { request_id } = &show
            && let Some(fields) = answer.as_object()
            && !fields.contains_key("request_id")
        {
            let mut fields = fields.clone();
            fields.insert("request_id".into(), json!(request_id));
            return output::json(&fields);
        }
        return output::json(answer);
    }
    match show {
        Show::Created => println!(
            "created conversation {} \"{}\" ({}); invited {}",
            text(&answer["id"]),
            text(&answer["title"]),
            place(answer),
            answer["members"].as_i64().map_or(0, |n| (n - 1).max(0)),
        ),
        Show::List => list(answer),
        Show::Membership => {
            println!(
                "{} {} as {} in {} (state {}, reads from seq {})",
                text(&answer["outcome"]),
                text(&answer["address"]),
                text(&answer["role"]),
                text(&answer["conversation_id"]),
                text(&answer["state"]),
                text(&answer["history_from_seq"]),
            );
            if let Some(note) = answer["note"].as_str() {
                println!("{note}");
            }
        }
        Show::Sent { request_id } => sent(answer, &request_id),
        Show::Read => read(answer),
        Show::Acked => {
            let receipt = &answer["receipt"];
            let what = if receipt["resolved_at"].is_null() {
                "acknowledged"
            } else {
                "resolved"
            };
            println!(
                "{what} message {} (seq {})",
                text(&answer["message_id"]),
                text(&answer["seq"])
            );
        }
        Show::Receipts => receipts(answer),
        Show::Wait => wait(answer),
    }
    Ok(())
}

fn place(conversation: &Value) -> String {
    match conversation["project"].as_str() {
        Some(project) => format!("project {project}"),
        None => text(&conversation["visibility"]),
    }
}

fn list(answer: &Value) {
    table_of(
        &answer["conversations"],
        &[
            "id", "title", "where", "role", "access", "last seq", "members",
        ],
        |c| {
            let mut state = text(&c["access"]);
            if !c["archived_at"].is_null() {
                state.push_str(", archived");
            }
            vec![
                text(&c["id"]),
                text(&c["title"]),
                place(c),
                text(&c["role"]),
                state,
                text(&c["last_seq"]),
                text(&c["members"]),
            ]
        },
    );
}

fn sent(answer: &Value, request_id: &str) {
    let recipients = listed(
        items(&answer["recipients"]).iter().map(text).collect(),
        "no one yet",
    );
    println!(
        "sent seq {} ({}) to {recipients}",
        text(&answer["seq"]),
        text(&answer["message_id"]),
    );
    if answer["replayed"] == true {
        println!("(a retry: the earlier send with this request id, nothing stored twice)");
    }
    if answer["publication"] != "stored" {
        println!("publication: {}", text(&answer["publication"]));
    }
    println!("request id {request_id} (pass --request-id {request_id} to retry safely)");
}

fn read(answer: &Value) {
    let list = items(&answer["messages"]);
    if list.is_empty() {
        no_messages(answer);
    }
    for message in list {
        let reply = if message["reply_to"].is_null() {
            String::new()
        } else {
            format!(" [reply to {}]", text(&message["reply_to"]))
        };
        println!(
            "#{}  {}  {}{reply}  id {}",
            text(&message["seq"]),
            when(&message["created_at"]),
            text(&message["from"]),
            text(&message["message_id"]),
        );
        let unavailable = &message["unavailable"];
        if unavailable.is_null() {
            indented(message["body"].as_str().unwrap_or_default());
        } else {
            println!(
                "    [unavailable: {}: {}]",
                text(&unavailable["reason"]),
                text(&unavailable["detail"])
            );
        }
    }
    println!("next after seq: {}", text(&answer["next_after_seq"]));
}

fn receipts(answer: &Value) {
    println!(
        "message {} (seq {}): total {}; stored {}, delivered {}, presented {}, \
         acknowledged {}, resolved {}",
        text(&answer["message_id"]),
        text(&answer["seq"]),
        text(&answer["total"]),
        text(&answer["stored"]),
        text(&answer["delivered"]),
        text(&answer["presented"]),
        text(&answer["acknowledged"]),
        text(&answer["resolved"]),
    );
    table_of(
        &answer["recipients"],
        &[
            "recipient",
            "stored",
            "delivered",
            "presented",
            "acknowledged",
            "resolved",
            "note",
        ],
        |r| {
            vec![
                text(&r["recipient"]),
                when(&r["stored_at"]),
                when(&r["delivered_at"]),
                when(&r["presented_at"]),
                when(&r["acknowledged_at"]),
                when(&r["resolved_at"]),
                text(&r["note"]),
            ]
        },
    );
}

fn wait(answer: &Value) {
    let pending = items(&answer["conversations"]);
    if pending.is_empty() {
        woke_empty(answer, "nothing to acknowledge");
        return;
    }
    table_of(
        &answer["conversations"],
        &[
            "conversation",
            "title",
            "unacknowledged",
            "first unacked seq",
            "latest seq",
        ],
        |p| {
            vec![
                text(&p["conversation_id"]),
                text(&p["title"]),
                text(&p["unacknowledged"]),
                text(&p["first_unacknowledged_seq"]),
                text(&p["latest_seq"]),
            ]
        },
    );
}
