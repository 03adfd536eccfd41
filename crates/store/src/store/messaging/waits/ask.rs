//! `ask_agent`: a question sent as a direct message, then a long poll for
//! the reply addressed back to the asking window.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::Instant;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::EventKind;
use crate::store::long_poll::{Rechecked, answer_if_still_valid, recheck_until};
use crate::store::messaging::messages;
use crate::store::requests;

#[derive(Clone, Debug, Serialize)]
pub struct AskResult {
    pub answered: bool,
    pub answer: Option<String>,
    /// Who answered (an address).
    pub answered_by: Option<String>,
    /// Present (true) when the answer came from a person (the dashboard).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_person: bool,
    pub answer_message_id: Option<Uuid>,
    pub question_message_id: Uuid,
    /// What to do when there is no answer yet.
    pub suggestion: Option<String>,
    /// Present (true) only when the wait ended because the server is stopping.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub server_restarting: bool,
    /// The answer asks for an acknowledgement (ack_message), due at
    /// `answer_ack_due_at`; `answer_acked`: whether your agent gave it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub answer_ack_required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_ack_due_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_acked: Option<bool>,
}

/// `ask_agent`: a direct message flagged as a question, then a wait for the
/// reply addressed back to this window. Only a reply (`reply_to` = the
/// question) sent to this window, or to this agent as a whole, by the agent
/// the question was addressed to (from any of its windows) answers it: a
/// third agent or a sibling window of the asker cannot answer for it, and
/// their replies stay ordinary direct messages. A DM that wakes the wait but
/// is not the answer sends it back to waiting.
pub async fn ask(
    bus: &Bus,
    me: &Identity,
    to: &str,
    question: &str,
    timeout: Duration,
    resume_message_id: Option<Uuid>,
    request: Option<&requests::Request>,
) -> BusResult<AskResult> {
    // No answer for a credential taken away while the call waited.
    let result = answer_if_still_valid(bus, me, async {
        // A DM to us may be the answer: those wake the wait, to look.
        let agent = me.agent_id;
        let mut events = bus.events.wait_for(
            me.team_id,
            Box::new(move |event| event.kind == EventKind::Message && event.recipient == Some(agent)),
        );
        let question_id = match resume_message_id {
            Some(id) => {
                let mine: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM messages WHERE team_id = $1 AND id = $2 AND is_question
                                    AND sender_id = $3 AND sender_session = $4)",
                )
                .bind(me.team_id)
                .bind(id)
                .bind(me.agent_id)
                .bind(&me.window)
                .fetch_one(&bus.pool)
                .await?;
                if !mine {
                    return Err(BusError::not_found(format!(
                        "resume_message_id {id} is not a question this window asked. Use the \
                         question_message_id an earlier ask_agent returned, from the same window."
                    )));
                }
                id
            }
            None => {
                let new = messages::NewMessage {
                    to: Some(to.to_string()),
                    body: question.to_string(),
                    question: true,
                    ..Default::default()
                };
                // Posted once per request_id: a retry waits for the answer
                // to the first question (as resume_message_id would).
                let posted = requests::once(bus, me, request, |mut w| async move {
                    let posted = messages::post_in(&mut w, me, new).await;
                    (w, posted)
                })
                .await?;
                posted["message"]["id"]
                    .as_str()
                    .and_then(|id| Uuid::parse_str(id).ok())
                    .ok_or_else(|| {
                        BusError::Db(sqlx::Error::Protocol(
                            "ask_agent's question was stored without its id".into(),
                        ))
                    })?
            }
        };
        let deadline = Instant::now() + timeout;
        let answered_by = recheck_until(&mut events, bus, deadline, || {
            messages::answer_to(bus, me, question_id)
        })
        .await?;
        let answer = match answered_by {
            Rechecked::Found(answer) => answer,
            Rechecked::Stopping => return Ok(not_answered_restarting(question_id)),
            Rechecked::TimedOut => {
                let suggestion = format!(
                    "No answer within {} s. Call ask_agent again with resume_message_id \
                     \"{question_id}\" to keep waiting without asking twice, or carry on and look \
                     for the reply later with read_messages (scope inbox).",
                    timeout.as_secs()
                );
                return Ok(not_answered(question_id, suggestion, false));
            }
        };
        Ok(answered(answer, question_id))
    })
    .await?;
    // The asker has the answer now: it is read, not an unread DM for the
    // next hook or `only_new` read. Were the mark lost, the answer still
    // goes out (it is what the call is for); it would only count as unread.
    if let Some(id) = result.answer_message_id
        && let Err(err) = messages::mark_read(bus, me, id).await
    {
        tracing::warn!("could not mark ask_agent's answer {id} read: {err}");
    }
    Ok(result)
}

fn answered(answer: messages::MessageView, question_id: Uuid) -> AskResult {
    AskResult {
        answered: true,
        answer: Some(answer.body),
        answered_by: Some(answer.from),
        from_person: answer.from_person,
        answer_message_id: Some(answer.id),
        question_message_id: question_id,
        suggestion: None,
        server_restarting: false,
        answer_ack_required: answer.ack_required,
        answer_ack_due_at: answer.ack_due_at,
        answer_acked: answer.acked,
    }
}

/// The question stands (it was sent); only the wait for its answer ended.
fn not_answered_restarting(question_id: Uuid) -> AskResult {
    let suggestion = format!(
        "The server is restarting, so this wait ended before an answer came; the question was \
         sent, and resuming finds its answer whenever it arrives. Call ask_agent again with \
         resume_message_id \"{question_id}\" to keep waiting without asking twice: it \
         reaches another replica, or this server once it is back (retry for a few seconds if \
         the connection is refused)."
    );
    not_answered(question_id, suggestion, true)
}

/// No answer (yet): what to do next, and whether the server is stopping.
fn not_answered(question_id: Uuid, suggestion: String, server_restarting: bool) -> AskResult {
    AskResult {
        answered: false,
        answer: None,
        answered_by: None,
        from_person: false,
        answer_message_id: None,
        question_message_id: question_id,
        suggestion: Some(suggestion),
        server_restarting,
        answer_ack_required: false,
        answer_ack_due_at: None,
        answer_acked: None,
    }
}
