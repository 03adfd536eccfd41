//! A person's part of the page: the people of the team, the questions
//! waiting for the person (each with its answer form), and the write forms
//! (post to a channel, a direct message, create / re-prioritise / cancel a
//! task, acknowledge a message). Plain HTML forms that post to
//! `/dashboard/write/{action}` (`writes.rs`), each carrying the sign-in's
//! write token in a hidden `csrf` field; no script is needed to write. Every
//! value goes through [`escape`] once. `app.js` does not redraw these
//! sections: a write answers 303 back to the page, which renders them anew.

use std::fmt::Write;

use acs_store::store::messaging::acks::owed::PendingAcks;
use acs_store::store::operations::dashboard::Snapshot;
use acs_store::store::operations::dashboard::person::{DirectView, InvitationView, QuestionView};
use acs_store::store::tasks::TaskPriority;

use super::page::escape;

/// The write forms' hidden field, with the sign-in's token.
fn csrf(token: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        escape(token)
    )
}

fn priorities() -> String {
    let mut html = String::from("<select name=\"priority\">");
    for p in TaskPriority::ALL {
        let selected = if p == TaskPriority::Normal {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            html,
            "<option value=\"{0}\"{selected}>{0}</option>",
            escape(p.as_str())
        );
    }
    html.push_str("</select>");
    html
}

/// The people of the team, for every viewer.
pub fn people(snapshot: &Snapshot) -> String {
    if snapshot.people.is_empty() {
        return "<p class=\"muted\">No people on this team (`ai-crew-sync person add` makes \
                one).</p>"
            .to_string();
    }
    let mut html = String::from("<ul class=\"people\">");
    for p in &snapshot.people {
        let _ = write!(
            html,
            "<li>{}{}</li>",
            escape(&p.name),
            if p.disabled {
                " <span class=\"pill pill-disabled\">revoked</span>"
            } else {
                ""
            }
        );
    }
    html.push_str("</ul>");
    html
}

/// The questions waiting for the person, each with its answer form (a
/// direct message to the asker with `reply_to` the question: what the
/// asker's `ask_agent` waits for).
pub fn questions(questions: &[QuestionView], token: &str) -> String {
    // app.js says here when the waiting questions are no longer those shown.
    let note = "<p class=\"muted\" id=\"questions-note\"></p>";
    if questions.is_empty() {
        return format!(
            "<p class=\"muted\" id=\"no-questions\">No questions waiting for you.</p>{note}"
        );
    }
    let mut html = format!("{note}<ul class=\"questions\">");
    for q in questions {
        let _ = write!(
            html,
            "<li class=\"question\" data-question=\"{id}\"><div class=\"meta\"><strong>{from}</strong> \
             <span class=\"muted\">asks</span></div><div class=\"text\">{body}</div>\
             <form method=\"post\" action=\"/dashboard/write/post\" class=\"write answer\">{csrf}\
             <input type=\"hidden\" name=\"to\" value=\"{from}\">\
             <input type=\"hidden\" name=\"reply_to\" value=\"{id}\">\
             <textarea name=\"body\" required rows=\"2\" aria-label=\"Your answer\"></textarea>\
             <button type=\"submit\">Answer</button></form></li>",
            id = escape(&q.id.to_string()),
            from = escape(&q.from),
            body = escape(&q.body),
            csrf = csrf(token),
        );
    }
    html.push_str("</ul>");
    html
}

/// The newest direct messages to the person (reply with the direct message
/// form, to the address shown); one asking for an acknowledgement they owe
/// carries its acknowledge form.
pub fn direct_messages(messages: &[DirectView], token: &str) -> String {
    if messages.is_empty() {
        return "<p class=\"muted\">No direct messages to you yet.</p>".to_string();
    }
    let mut html = String::from("<ul class=\"messages\" id=\"direct-list\">");
    for m in messages {
        let _ = write!(
            html,
            "<li><div class=\"meta\"><strong>{}</strong> <span class=\"muted\">{}</span>{}</div>\
             <div class=\"text\">{}{}</div>{}</li>",
            escape(&m.from),
            escape(&m.created_at.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
            if m.question {
                " <span class=\"pill pill-announce\">question</span>"
            } else {
                ""
            },
            escape(&m.body),
            if m.truncated { " …" } else { "" },
            if m.ack_owed {
                format!(
                    "<form method=\"post\" action=\"/dashboard/write/ack\" class=\"write ack\">{}\
                     <input type=\"hidden\" name=\"message_id\" value=\"{}\">\
                     <button type=\"submit\">Acknowledge</button></form>",
                    csrf(token),
                    escape(&m.id.to_string())
                )
            } else {
                String::new()
            },
        );
    }
    html.push_str("</ul>");
    html
}

/// The direct and channel messages asking the person for an
/// acknowledgement they have not given (`list_owed`'s `i_owe`), oldest first,
/// each with its acknowledge form; never a body (read the message in the
/// lists above).
pub fn owed(owed: &PendingAcks, token: &str) -> String {
    if owed.items.is_empty() {
        return "<p class=\"muted\" id=\"no-owed\">No acknowledgement asked of you.</p>"
            .to_string();
    }
    let mut html = String::from(
        "<h3>Acknowledgements asked of you</h3><ul class=\"questions\" id=\"owed-list\">",
    );
    for o in &owed.items {
        let place = match (&o.channel, &o.to) {
            (Some(channel), _) => format!("#{channel}"),
            (None, Some(to)) => format!("direct to {to}"),
            (None, None) => String::new(),
        };
        let _ = write!(
            html,
            "<li><div class=\"meta\"><strong>{}</strong> <span class=\"muted\">{} · {}{}</span></div>\
             <form method=\"post\" action=\"/dashboard/write/ack\" class=\"write ack\">{}\
             <input type=\"hidden\" name=\"message_id\" value=\"{}\">\
             <button type=\"submit\">Acknowledge</button></form></li>",
            escape(&o.from),
            escape(&place),
            escape(&o.sent_at.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
            if o.overdue { " · overdue" } else { "" },
            csrf(token),
            escape(&o.message_id.to_string()),
        );
    }
    if owed.count > owed.items.len() as i64 {
        let _ = write!(
            html,
            "<li class=\"muted\">{}{} in all; the oldest are shown.</li>",
            owed.count,
            if owed.at_least { " or more" } else { "" }
        );
    }
    html.push_str("</ul>");
    html
}

/// The conversations inviting the person, each with its join form.
pub fn invitations(invitations: &[InvitationView], token: &str) -> String {
    if invitations.is_empty() {
        return String::new();
    }
    let mut html = String::from("<h3>Conversations inviting you</h3><ul class=\"questions\">");
    for i in invitations {
        let _ = write!(
            html,
            "<li class=\"invitation\">{title} \
             <form method=\"post\" action=\"/dashboard/write/conversation-join\" class=\"write join\">{csrf}\
             <input type=\"hidden\" name=\"conversation_id\" value=\"{id}\">\
             <button type=\"submit\">Join</button></form></li>",
            title = escape(&i.title),
            id = escape(&i.conversation_id.to_string()),
            csrf = csrf(token),
        );
    }
    html.push_str("</ul>");
    html
}

/// The write forms.
pub fn writes(token: &str) -> String {
    let csrf = csrf(token);
    let priorities = priorities();
    format!(
        "<div class=\"forms\">\
         <form method=\"post\" action=\"/dashboard/write/post\" class=\"write\" id=\"post-form\">{csrf}\
         <h3>Post to a channel</h3>\
         <label>Channel <input name=\"channel\" required spellcheck=\"false\"></label>\
         <label>Message <textarea name=\"body\" required rows=\"3\"></textarea></label>\
         <label class=\"inline\"><input type=\"checkbox\" name=\"announce\" value=\"1\"> \
         Announcement (reaches every window)</label>\
         <button type=\"submit\">Post</button></form>\
         <form method=\"post\" action=\"/dashboard/write/post\" class=\"write\" id=\"dm-form\">{csrf}\
         <h3>Direct message</h3>\
         <label>To (agent or agent/window) <input name=\"to\" required spellcheck=\"false\"></label>\
         <label>Message <textarea name=\"body\" required rows=\"3\"></textarea></label>\
         <button type=\"submit\">Send</button></form>\
         <form method=\"post\" action=\"/dashboard/write/task-create\" class=\"write\" id=\"task-create-form\">{csrf}\
         <h3>Create a task</h3>\
         <label>Key <input name=\"key\" required spellcheck=\"false\"></label>\
         <label>Title <input name=\"title\" required></label>\
         <label>Description <textarea name=\"description\" rows=\"2\"></textarea></label>\
         <label>Priority {priorities}</label>\
         <button type=\"submit\">Create</button></form>\
         <form method=\"post\" action=\"/dashboard/write/task-priority\" class=\"write\" id=\"task-priority-form\">{csrf}\
         <h3>Re-prioritise a task</h3>\
         <label>Key <input name=\"key\" required spellcheck=\"false\"></label>\
         <label>Priority {priorities}</label>\
         <button type=\"submit\">Set priority</button></form>\
         <form method=\"post\" action=\"/dashboard/write/task-cancel\" class=\"write\" id=\"task-cancel-form\">{csrf}\
         <h3>Cancel a task</h3>\
         <label>Key <input name=\"key\" required spellcheck=\"false\"></label>\
         <label>Reason <input name=\"reason\" required></label>\
         <button type=\"submit\">Cancel task</button></form>\
         <form method=\"post\" action=\"/dashboard/write/ack\" class=\"write\" id=\"ack-form\">{csrf}\
         <h3>Acknowledge a message</h3>\
         <label>Message id <input name=\"message_id\" required spellcheck=\"false\"></label>\
         <button type=\"submit\">Acknowledge</button></form>\
         </div>"
    )
}
