//! What a person signed in to the dashboard may do: the writes, each one
//! call of the store function an agent's tool calls (so the write fence, the
//! quota and every argument check run as for an agent, with the person's
//! [`Identity`]), then one audit row naming the person (`dashboard.*`); and
//! the questions waiting for them (`ask_agent` addressed to the person).
//!
//! What is not here, on purpose: claiming, leases, locks, path reservations.
//! A person holds none (their credential is refused on `/mcp`, and the
//! dashboard offers no such write).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::messaging::acks::{self, AnyAck};
use crate::store::messaging::messages::{self, NewMessage, Posted};
use crate::store::requests::{self, Writer};
use crate::store::tasks::{self, CancelledTask, NewTask, Rights, Task};
use crate::store::{Actor, Source, identity::audit};

/// Questions to the person shown at most, oldest first.
pub const QUESTIONS_MAX: i64 = 50;

/// One of the person's lists: `sql` reads the team (`$1`), the person
/// (`$2`) and how many rows at most (`$3`, [`QUESTIONS_MAX`]).
async fn persons_list<T>(pool: &PgPool, me: &Identity, sql: &'static str) -> BusResult<Vec<T>>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    Ok(sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(QUESTIONS_MAX)
        .fetch_all(pool)
        .await?)
}

/// An `ask_agent` question addressed to the person and not answered yet.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct QuestionView {
    pub id: Uuid,
    /// The asker's address (`agent` or `agent/window`): the answer goes there.
    pub from: String,
    pub body: String,
    pub created_at: DateTime<Utc>,
}

/// The questions addressed to `me` (a person) that they have not answered,
/// oldest first: a question is answered once the person sent a message with
/// `reply_to` its id (what the asker's `ask_agent` waits for).
pub async fn questions(pool: &PgPool, me: &Identity) -> BusResult<Vec<QuestionView>> {
    persons_list(
        pool,
        me,
        "SELECT q.id, left(q.body, 2000) AS body, q.created_at,
                CASE WHEN q.sender_session = '' THEN s.name
                     ELSE s.name || '/' || q.sender_session END AS from
           FROM messages q
           JOIN agents s ON s.team_id = q.team_id AND s.id = q.sender_id
          WHERE q.team_id = $1 AND q.recipient_id = $2 AND q.is_question
            AND NOT EXISTS (SELECT 1 FROM messages a
                             WHERE a.team_id = q.team_id AND a.reply_to = q.id
                               AND a.sender_id = $2)
          ORDER BY q.position LIMIT $3",
    )
    .await
}

/// A direct message to the person (the dashboard's one view of direct
/// messages: only the signed-in person's own).
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct DirectView {
    pub id: Uuid,
    /// The sender's address: a reply goes there.
    pub from: String,
    pub body: String,
    /// True when the body was cut at 2,000 characters.
    pub truncated: bool,
    /// An `ask_agent` question (answered in "Questions for you").
    pub question: bool,
    /// It asks the person for an acknowledgement they have not given yet.
    pub ack_owed: bool,
    pub created_at: DateTime<Utc>,
}

/// The newest direct messages to `me` (a person), newest first.
pub async fn direct_messages(pool: &PgPool, me: &Identity) -> BusResult<Vec<DirectView>> {
    persons_list(
        pool,
        me,
        "SELECT m.id, left(m.body, 2000) AS body, char_length(m.body) > 2000 AS truncated,
                m.is_question AS question, m.created_at,
                m.ack_required AND NOT EXISTS (
                    SELECT 1 FROM message_acks k
                     WHERE k.team_id = m.team_id AND k.message_id = m.id
                       AND k.agent_id = $2) AS ack_owed,
                CASE WHEN m.sender_session = '' THEN s.name
                     ELSE s.name || '/' || m.sender_session END AS from
           FROM (SELECT * FROM messages WHERE team_id = $1 AND recipient_id = $2
                  ORDER BY position DESC LIMIT $3) m
           JOIN agents s ON s.team_id = m.team_id AND s.id = m.sender_id
          ORDER BY m.position DESC",
    )
    .await
}

/// A conversation the person is invited to and has not joined.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct InvitationView {
    pub conversation_id: Uuid,
    pub title: String,
}

/// The conversations inviting `me` (a person), newest first: joining one
/// makes the person a member, to read it here and acknowledge what is sent
/// to them.
pub async fn invitations(pool: &PgPool, me: &Identity) -> BusResult<Vec<InvitationView>> {
    persons_list(
        pool,
        me,
        "SELECT c.id AS conversation_id, c.title
           FROM conversation_members s
           JOIN conversations c ON c.team_id = s.team_id AND c.id = s.conversation_id
          WHERE s.team_id = $1 AND s.agent_id = $2 AND s.session = '' AND s.state = 'invited'
            AND c.archived_at IS NULL
          ORDER BY c.created_at DESC LIMIT $3",
    )
    .await
}

/// The audit trail's actor for a person's write: their name, over HTTP.
fn actor(me: &Identity) -> Actor {
    Actor {
        name: me.agent.clone(),
        source: Source::Http,
        admin_credential: None,
    }
}

/// One audit row for a person's write that went through.
/// Run a person's `write` and its audit row (`action` on the subject and
/// detail `describe` gives) in one transaction: both commit, or neither.
async fn audited<T>(
    bus: &Bus,
    me: &Identity,
    action: &str,
    write: impl AsyncFnOnce(&mut Writer) -> BusResult<T>,
    describe: impl FnOnce(&T) -> (String, Value),
) -> BusResult<T> {
    requests::atomic(bus, |mut w: Writer| async move {
        let result = async {
            let done = write(&mut w).await?;
            let (subject, detail) = describe(&done);
            audit::record(
                w.conn(),
                Some(me.team_id),
                &actor(me),
                action,
                &subject,
                detail,
            )
            .await?;
            Ok(done)
        }
        .await;
        (w, result)
    })
    .await
}

/// A channel post or a direct message, as the page's forms send it.
#[derive(Clone, Debug, Default)]
pub struct PersonPost {
    pub channel: Option<String>,
    pub to: Option<String>,
    pub body: String,
    pub announce: bool,
    pub reply_to: Option<Uuid>,
}

/// Post to a channel (`announce` to reach every window), or send a direct
/// message to `agent` or `agent/window`; with `reply_to` a question's id,
/// to its asker, it answers their `ask_agent`.
pub async fn post(bus: &Bus, me: &Identity, post: PersonPost) -> BusResult<Posted> {
    if post.channel.is_none() && post.to.is_none() {
        return Err(BusError::invalid(
            "name a channel or an address (`agent` or `agent/window`) to write to; a person \
             has no default channel. Nothing was sent.",
        ));
    }
    let action = if post.reply_to.is_some() && post.to.is_some() {
        "dashboard.answer"
    } else {
        "dashboard.post"
    };
    let new = NewMessage {
        channel: post.channel,
        to: post.to,
        body: post.body,
        announce: post.announce,
        reply_to: post.reply_to,
        ..Default::default()
    };
    let mut posted = audited(
        bus,
        me,
        action,
        async |w| messages::post_in(w, me, new).await,
        |posted: &Posted| {
            let m = &posted.message;
            let subject = match (&m.channel, &m.to) {
                (Some(channel), _) => format!("#{channel}"),
                (None, Some(to)) => to.clone(),
                (None, None) => String::new(),
            };
            let detail =
                json!({ "message_id": m.id, "announce": m.announce, "reply_to": m.reply_to });
            (subject, detail)
        },
    )
    .await?;
    posted.message.from_person = true;
    Ok(posted)
}

/// Create a task (the person is its creator).
pub async fn create_task(bus: &Bus, me: &Identity, new: NewTask) -> BusResult<Task> {
    audited(
        bus,
        me,
        "dashboard.task_create",
        async |w| tasks::create_in(w, me, new).await,
        |task: &Task| {
            let detail = json!({ "title": task.summary.title, "priority": task.summary.priority });
            (task.summary.key.clone(), detail)
        },
    )
    .await
}

/// Set a task's priority, with an overseer's rights (any task of the team).
pub async fn set_task_priority(
    bus: &Bus,
    me: &Identity,
    key: &str,
    priority: &str,
) -> BusResult<Task> {
    audited(
        bus,
        me,
        "dashboard.task_priority",
        async |w| tasks::set_priority_in(w, me, key, priority, Rights::Overseer).await,
        |task: &Task| {
            (
                task.summary.key.clone(),
                json!({ "priority": task.summary.priority }),
            )
        },
    )
    .await
}

/// Cancel a task, with an overseer's rights (any unfinished task of the team).
pub async fn cancel_task(
    bus: &Bus,
    me: &Identity,
    key: &str,
    reason: &str,
) -> BusResult<CancelledTask> {
    audited(
        bus,
        me,
        "dashboard.task_cancel",
        async |w| tasks::cancel_with_in(w, me, key, reason, Rights::Overseer).await,
        |cancelled: &CancelledTask| {
            (
                cancelled.task.summary.key.clone(),
                json!({ "reason": reason }),
            )
        },
    )
    .await
}

/// Join a conversation the person was invited to (`join_conversation`'s
/// rule), as the person's one window.
pub async fn join(bus: &Bus, me: &Identity, conversation_id: Uuid) -> BusResult<()> {
    audited(
        bus,
        me,
        "dashboard.join",
        async |w| crate::store::conversations::join(w, me, conversation_id).await,
        |_| {
            let detail = json!({ "conversation_id": conversation_id });
            (conversation_id.to_string(), detail)
        },
    )
    .await?;
    Ok(())
}

/// Acknowledge a message that asks the person for it: a direct or channel
/// message they owe, or a conversation message sent to them (their seat is a
/// recipient); `ack_message`'s rule, which audits a conversation ack too.
pub async fn ack(bus: &Bus, me: &Identity, message_id: Uuid) -> BusResult<AnyAck> {
    audited(
        bus,
        me,
        "dashboard.ack",
        async |w| acks::ack_on(w.conn(), me, message_id, false, None).await,
        |acked: &AnyAck| {
            let detail = match acked {
                AnyAck::Message(m) => json!({ "kind": m.kind }),
                AnyAck::Conversation(c) => {
                    json!({ "conversation_id": c.conversation_id, "seq": c.seq })
                }
            };
            (message_id.to_string(), detail)
        },
    )
    .await
}
