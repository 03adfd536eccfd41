//! The dashboard's HTML: the sign-in form and the first render of a team's
//! page. `app.js` then redraws each section from `/dashboard/data` with the
//! same markup (built with `createElement`/`textContent`).
//!
//! Every value from the database or the request passes through [`escape`]
//! exactly once, where it is written into the markup (which also spells out
//! bidirectional formatting characters); nothing else is interpolated. The page has no inline script or style (the CSP forbids
//! them): only `/dashboard/app.js` and `/dashboard/app.css`.

use std::fmt::Write;

use chrono::{DateTime, Utc};

use acs_store::events::ListenerState;
use acs_store::store::messaging::acks::overdue::OverdueAck;
use acs_store::store::operations::dashboard::{
    AgentView, ChannelMessageView, Conversations, Health, LockView, ReservationView, Snapshot,
    TaskView,
};
use acs_store::store::tasks::TaskStatus;
use acs_store::store::text;

/// Text made safe for HTML content and quoted attribute values, with the
/// bidirectional embeddings, overrides and isolates spelled out as
/// `&lt;U+202E&gt;` ([`text::show_bidi`], the console client's rule too;
/// `app.js` applies the same set to what it redraws).
pub fn escape(text: &str) -> String {
    let text = text::show_bidi(text);
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn head(title: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><link rel=\"stylesheet\" href=\"/dashboard/app.css\">\
         <script src=\"/dashboard/app.js\" defer></script></head>",
        escape(title)
    )
}

fn time(at: &DateTime<Utc>) -> String {
    escape(&at.format("%Y-%m-%d %H:%M:%S UTC").to_string())
}

fn or_dash(text: Option<&str>) -> String {
    text.map_or_else(|| "—".to_string(), escape)
}

/// The sign-in form, with `error` (already in words for a person) above it,
/// and when `dropped_over_http` (the cookie will be `Secure`, and this page
/// did not come over https) why signing in may lead back here.
pub fn sign_in(error: Option<&str>, dropped_over_http: bool) -> String {
    let mut html = head("ai-crew-sync · sign in");
    html.push_str("<body class=\"sign-in\"><main class=\"card narrow\"><h1>ai-crew-sync</h1>");
    html.push_str(
        "<p class=\"muted\">Your team at a glance: agents, tasks, locks, path reservations, \
         channels, conversations and the outbox. Signed in as a person of the team, you also \
         post, answer questions and manage tasks here.</p>",
    );
    if let Some(error) = error {
        let _ = write!(
            html,
            "<p class=\"error\" id=\"sign-in-error\">{}</p>",
            escape(error)
        );
    }
    html.push_str(
        "<form method=\"post\" action=\"/dashboard/sign-in\" autocomplete=\"off\">\
         <label for=\"token\">Agent token or person's credential (acs_…), or admin credential \
         (acsa_…)</label>\
         <input id=\"token\" name=\"token\" type=\"password\" required spellcheck=\"false\">\
         <label for=\"team\">Team <span class=\"muted\">(admin credentials only)</span></label>\
         <input id=\"team\" name=\"team\" type=\"text\" spellcheck=\"false\">\
         <button type=\"submit\" id=\"sign-in\">Sign in</button></form>\
         <p class=\"muted small\">The credential is exchanged for a cookie that lasts 8 hours \
         and only opens this page. Never put a credential in the address bar.</p>",
    );
    if dropped_over_http {
        html.push_str(
            "<p class=\"muted small\" id=\"secure-cookie-note\">This server marks its sign-in \
             cookie Secure. If signing in brings you back to this form, this page was opened \
             over plain http://, where browsers drop such a cookie: open it over https, or \
             have the operator start the server with --dashboard-plain-http.</p>",
        );
    }
    html.push_str("</main></body></html>");
    html
}

/// A person's write that was refused: why (as text), and the way back.
pub fn write_refused(message: &str) -> String {
    let mut html = head("ai-crew-sync · not done");
    let _ = write!(
        html,
        "<body class=\"sign-in\"><main class=\"card narrow\"><h1>Not done</h1>\
         <p class=\"error\" id=\"write-error\">{}</p>\
         <p><a href=\"/dashboard\">Back to the dashboard</a></p></main></body></html>",
        escape(message)
    );
    html
}

/// The whole page for a signed-in viewer; `write_token` (a person's
/// sign-in only) adds the person's questions and write forms.
pub fn dashboard(snapshot: &Snapshot, write_token: Option<&str>) -> String {
    let viewer = &snapshot.viewer;
    let mut html = head(&format!("ai-crew-sync · {}", viewer.team));
    let _ = write!(
        html,
        "<body><header><h1>ai-crew-sync <span class=\"team\">{}</span></h1>\
         <div class=\"who\">signed in as <strong>{}</strong> ({}) · \
         <span id=\"updated\">updated {}</span>\
         <form method=\"post\" action=\"/dashboard/sign-out\">\
         <button type=\"submit\" id=\"sign-out\">Sign out</button></form></div></header><main>",
        escape(&viewer.team),
        escape(&viewer.name),
        escape(viewer.kind),
        time(&snapshot.generated_at),
    );
    if let (Some(token), Some(questions)) = (write_token, &snapshot.questions) {
        let _ = write!(
            html,
            "<section class=\"card wide\"><h2>Questions for you</h2>\
             <div class=\"body\" id=\"questions\">{}</div></section>\
             <section class=\"card wide\"><h2>Direct messages to you</h2>\
             <div class=\"body\" id=\"direct\">{}</div></section>\
             <section class=\"card wide\"><h2>Write as {}</h2>\
             <div class=\"body\" id=\"person-writes\">{}</div></section>",
            super::forms::questions(questions, token)
                + &super::forms::invitations(
                    snapshot.invitations.as_deref().unwrap_or_default(),
                    token
                )
                + &snapshot
                    .owed
                    .as_ref()
                    .map(|owed| super::forms::owed(owed, token))
                    .unwrap_or_default(),
            super::forms::direct_messages(
                snapshot.direct_messages.as_deref().unwrap_or_default(),
                token
            ),
            escape(&viewer.name),
            super::forms::writes(token),
        );
    }
    // Two columns; a wide card takes a whole row.
    let sections = [
        ("agents", "Agents", " wide", agents(&snapshot.agents)),
        ("tasks", "Task board", " wide", tasks(&snapshot.tasks)),
        (
            "messages",
            "Recent channel messages",
            "",
            messages(&snapshot.messages),
        ),
        (
            "conversations",
            "Conversations",
            "",
            conversations(&snapshot.conversations),
        ),
        ("locks", "Locks", "", locks(&snapshot.locks)),
        (
            "reservations",
            "Path reservations",
            "",
            reservations(&snapshot.reservations),
        ),
        (
            "overdue-acks",
            "Overdue acknowledgements",
            "",
            overdue_acks(&snapshot.overdue_acks),
        ),
        ("health", "Outbox and broker", "", health(&snapshot.health)),
        ("people", "People", "", super::forms::people(snapshot)),
    ];
    for (id, title, class, body) in sections {
        let _ = write!(
            html,
            "<section class=\"card{class}\"><h2>{title}</h2>\
             <div class=\"body\" id=\"{id}\">{body}</div></section>"
        );
    }
    html.push_str("</main></body></html>");
    html
}

fn table(headers: &[&str], rows: &[String], empty: &str) -> String {
    if rows.is_empty() {
        return format!("<p class=\"muted\">{}</p>", escape(empty));
    }
    let mut html = String::from("<table><thead><tr>");
    for h in headers {
        let _ = write!(html, "<th>{}</th>", escape(h));
    }
    html.push_str("</tr></thead><tbody>");
    for row in rows {
        html.push_str(row);
    }
    html.push_str("</tbody></table>");
    html
}

fn pill(state: &str) -> String {
    format!(
        "<span class=\"pill pill-{}\">{}</span>",
        escape(state),
        escape(state)
    )
}

fn health(health: &Health) -> String {
    let o = &health.outbox;
    let oldest = o
        .oldest_pending_seconds
        .map_or_else(|| "—".to_string(), |s| format!("{s} s"));
    let mut html = String::from("<dl class=\"facts\">");
    for (name, value) in [
        ("pending", o.pending.to_string()),
        ("leased", o.leased.to_string()),
        ("failed", o.failed.to_string()),
        ("uncertain", o.uncertain.to_string()),
        ("oldest pending", oldest),
        ("bytes waiting", o.pending_bytes.to_string()),
    ] {
        let _ = write!(html, "<dt>{name}</dt><dd>{}</dd>", escape(&value));
    }
    let _ = write!(
        html,
        "<dt>broker</dt><dd>{}</dd><dt>events</dt><dd>{}</dd></dl>",
        pill(health.broker),
        pill(match health.events {
            ListenerState::Live => "live",
            ListenerState::Silent => "silent",
            ListenerState::Detached => "detached",
        }),
    );
    for condition in &health.broker_conditions {
        let _ = write!(html, "<p class=\"error\">{}</p>", escape(condition));
    }
    html
}

fn agents(agents: &[AgentView]) -> String {
    let mut rows = Vec::new();
    for agent in agents {
        let name = if agent.disabled {
            format!(
                "{} <span class=\"pill pill-disabled\">disabled</span>",
                escape(&agent.name)
            )
        } else {
            escape(&agent.name)
        };
        if agent.windows.is_empty() {
            rows.push(format!(
                "<tr><td>{name}</td><td>—</td><td>{}</td><td>—</td><td>—</td><td>—</td><td>—</td><td>{}</td></tr>",
                pill("offline"),
                if agent.older_windows > 0 { "over a day ago" } else { "never" },
            ));
        }
        for w in &agent.windows {
            let window = if w.session.is_empty() {
                "(shared)".to_string()
            } else {
                escape(&w.session)
            };
            rows.push(format!(
                "<tr><td>{name}</td><td>{window}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                pill(w.state.as_str()),
                escape(w.status.as_str()),
                or_dash(w.activity.as_deref()),
                or_dash(w.project.as_deref()),
                or_dash(w.role.as_deref()),
                time(&w.last_seen_at),
            ));
        }
        if agent.older_windows > 0 {
            rows.push(format!(
                "<tr class=\"older\"><td>{name}</td><td colspan=\"7\" class=\"muted\">{}</td></tr>",
                escape(&older_windows(agent.older_windows))
            ));
        }
    }
    table(
        &[
            "Agent",
            "Window",
            "State",
            "Status",
            "Activity",
            "Project",
            "Role",
            "Last seen",
        ],
        &rows,
        "No agents yet.",
    )
}

/// The line that stands for an agent's windows offline for over a day (the
/// script writes the same words).
fn older_windows(count: i64) -> String {
    format!(
        "+ {count} window(s) offline for more than a day (list_sessions {{all: true}} lists them)"
    )
}

fn tasks(tasks: &[TaskView]) -> String {
    let mut html = String::from("<div class=\"board\">");
    for column in TaskStatus::ALL {
        let in_column: Vec<&TaskView> = tasks.iter().filter(|t| t.status == column).collect();
        let _ = write!(
            html,
            "<div class=\"column\"><h3>{} <span class=\"count\">{}</span></h3>",
            escape(column.as_str()),
            in_column.len()
        );
        for task in in_column {
            let _ = write!(
                html,
                "<div class=\"task task-{}\"><div class=\"title\">{}</div><div class=\"key\">{}</div>",
                escape(task.status.as_str()),
                escape(&task.title),
                escape(&task.key),
            );
            if let Some(holder) = &task.holder {
                let _ = write!(html, "<div class=\"holder\">held by {}", escape(holder));
                if let Some(until) = &task.lease_expires_at {
                    let _ = write!(html, " · lease until {}", time(until));
                }
                html.push_str("</div>");
            }
            html.push_str("</div>");
        }
        html.push_str("</div>");
    }
    html.push_str("</div>");
    html
}

fn locks(locks: &[LockView]) -> String {
    let rows: Vec<String> = locks
        .iter()
        .map(|l| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&l.name),
                escape(&l.holder),
                or_dash(l.purpose.as_deref()),
                time(&l.expires_at)
            )
        })
        .collect();
    table(
        &["Lock", "Holder", "Purpose", "Expires"],
        &rows,
        "No locks held.",
    )
}

fn reservations(reservations: &[ReservationView]) -> String {
    let rows: Vec<String> = reservations
        .iter()
        .map(|r| {
            format!(
                "<tr><td class=\"pattern\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>",
                escape(&r.pattern),
                escape(&r.holder),
                pill(if r.exclusive { "exclusive" } else { "shared" }),
                or_dash(Some(r.project.as_str()).filter(|p| !p.is_empty())),
                or_dash(r.reason.as_deref()),
                time(&r.expires_at)
            )
        })
        .collect();
    table(
        &["Paths", "Holder", "Mode", "Project", "Reason", "Expires"],
        &rows,
        "No paths reserved.",
    )
}

/// Who owes which acknowledgement past its due time (never a body).
fn overdue_acks(overdue: &[OverdueAck]) -> String {
    let rows: Vec<String> = overdue
        .iter()
        .map(|o| {
            let place = match (&o.channel, &o.to) {
                (Some(channel), _) => format!("#{channel}"),
                (None, Some(to)) => format!("direct to {to}"),
                (None, None) => "-".to_string(),
            };
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&o.debtor),
                escape(&o.from),
                escape(&place),
                time(&o.sent_at),
                time(&o.due_at)
            )
        })
        .collect();
    table(
        &["Owed by", "Asked by", "Where", "Sent", "Due"],
        &rows,
        "No acknowledgement is overdue.",
    )
}

fn messages(messages: &[ChannelMessageView]) -> String {
    if messages.is_empty() {
        return "<p class=\"muted\">No channel messages yet.</p>".to_string();
    }
    let mut html = String::from("<ul class=\"messages\">");
    for m in messages {
        let _ = write!(
            html,
            "<li{}><div class=\"meta\"><span class=\"channel\">#{}</span> <strong>{}</strong>{} \
             <span class=\"muted\">{}</span>{}</div><div class=\"text\">{}{}</div></li>",
            if m.announce {
                " class=\"announce\""
            } else {
                ""
            },
            escape(&m.channel),
            escape(&m.from),
            if m.from_person {
                " <span class=\"pill pill-person\">person</span>"
            } else {
                ""
            },
            time(&m.created_at),
            if m.announce {
                " <span class=\"pill pill-announce\">announcement</span>"
            } else {
                ""
            },
            escape(&m.body),
            if m.truncated { " …" } else { "" },
        );
    }
    html.push_str("</ul>");
    html
}

fn conversations(conversations: &Conversations) -> String {
    let mut html = format!("<p class=\"muted\">{}</p>", escape(&conversations.note));
    if conversations.items.is_empty() {
        html.push_str("<p class=\"muted\">No conversations to show.</p>");
    }
    for c in &conversations.items {
        let _ = write!(
            html,
            "<div class=\"conversation\"><h3>{} <span class=\"muted\">{}{}</span></h3>",
            escape(&c.title),
            escape(&c.visibility),
            if c.archived { " · archived" } else { "" },
        );
        let rows: Vec<String> = c
            .messages
            .iter()
            .map(|m| {
                let body = match &m.body {
                    Some(body) => escape(body),
                    None => format!(
                        "<span class=\"muted\">{}</span>",
                        or_dash(m.body_note.as_deref())
                    ),
                };
                format!(
                    "<tr><td>{}<div class=\"key\">{}</div></td><td>{}</td><td>{body}</td><td>{}</td>\
                     <td>stored {}/{} · delivered {}/{} · acknowledged {}/{}</td></tr>",
                    m.seq,
                    escape(&m.id.to_string()),
                    escape(&m.from),
                    pill(m.publication_state.as_str()),
                    m.stored,
                    m.recipients,
                    m.delivered,
                    m.recipients,
                    m.acknowledged,
                    m.recipients,
                )
            })
            .collect();
        html.push_str(&table(
            &["Seq", "From", "Message", "State", "Receipts"],
            &rows,
            "No messages yet.",
        ));
        html.push_str("</div>");
    }
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_neutralises_every_markup_character() {
        assert_eq!(
            escape(r#"<img src=x onerror="a('b')">&amp;"#),
            "&lt;img src=x onerror=&quot;a(&#39;b&#39;)&quot;&gt;&amp;amp;"
        );
        assert_eq!(escape("plain text, é ✓"), "plain text, é ✓");
        assert_eq!(escape("a\u{202E}b"), "a&lt;U+202E&gt;b");
        assert_eq!(escape(""), "");
    }

    #[test]
    fn the_sign_in_form_escapes_its_error() {
        let html = sign_in(Some("<script>x</script>"), false);
        assert!(html.contains("&lt;script&gt;x&lt;/script&gt;"));
        assert!(!html.contains("<script>x"));
        assert!(!html.contains("<style"), "no inline style");
        assert_eq!(html.matches("<script").count(), 1, "only app.js");
    }
}
