//! Posting a message: the argument checks here (and, naming neither channel
//! nor recipient, the window's default channel: `default_channel_of`), then
//! one call of the SQL function `post_message` (migration 0031; 0047 adds
//! the acknowledgement request), which runs
//! the write fence, the quota, the channel, the recipient and reply_to checks
//! and the insert at a new position (see the module overview). A refusal
//! comes back as a code; the words are here. With attachments the same call
//! opens a transaction that then stores the files.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{
    MessageView, NewMessage, Posted, channel_labels, check_body, default_channel_of,
    normalize_metadata, parse_address,
};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};
use crate::store::fenced::BindCaller;
use crate::store::messaging::attachments::{self, TEAM_QUOTA_DEFAULT_BYTES};
use crate::store::requests::{self, Writer};
use crate::store::{identity::sessions, messaging::channels, operations::usage};

/// What `post_message` answered: a refusal (`fence` or `declined`) or the
/// message as stored.
#[derive(sqlx::FromRow)]
struct Outcome {
    #[sqlx(flatten)]
    fence: sessions::Refusal,
    declined: Option<String>,
    detail: Option<String>,
    limit_bytes: Option<i64>,
    used_bytes: Option<i64>,
    message_position: Option<i64>,
    created_at: Option<DateTime<Utc>>,
    channel_id: Option<Uuid>,
    channel: Option<String>,
    channel_created: Option<bool>,
    recipient_id: Option<Uuid>,
    sender: Option<String>,
    recipient: Option<String>,
    metadata: Option<Value>,
}

/// The post, as the function is asked for it.
struct Call<'a> {
    id: Uuid,
    /// The channel named, or the window's default channel when neither a
    /// channel nor a recipient was named.
    channel: Option<String>,
    recipient: Option<(String, Option<String>)>,
    metadata: &'a Option<Value>,
    incoming: i64,
}

fn no_default_channel() -> BusError {
    BusError::invalid(
        "no `channel` or `to`, and this window has no default channel (it is the channel set \
         for the window with heartbeat `channel`, else its `project` label's, else its window \
         name's; `inbox` and `all` name none, they are read_messages scopes). Name a channel \
         or an address, or set one with heartbeat `channel`.",
    )
}

/// `post_message`.
pub async fn post(bus: &Bus, me: &Identity, new: NewMessage) -> BusResult<Posted> {
    requests::plain(bus, |mut w| async move {
        let posted = post_in(&mut w, me, new).await;
        (w, posted)
    })
    .await
}

/// [`post`] on `w`: its event is emitted when `w`'s writes commit.
pub async fn post_in(w: &mut Writer, me: &Identity, new: NewMessage) -> BusResult<Posted> {
    check_body(&new.body)?;
    attachments::check_count(new.attachments.len())?;
    let metadata = normalize_metadata(new.metadata.clone())?;
    let channel = match (&new.channel, &new.to) {
        (Some(_), Some(_)) => {
            return Err(BusError::invalid(
                "give either `channel` or `to`, not both: a message goes to one channel or one address.",
            ));
        }
        (Some(channel), None) => Some(channels::normalize_name(channel)?),
        (None, _) => None,
    };
    let recipient = new.to.as_deref().map(parse_address).transpose()?;
    if new.announce && recipient.is_some() {
        return Err(BusError::invalid(
            "`announce` applies to channel messages only (it reaches every window whatever it is \
             focused on); a direct message already reaches its recipient.",
        ));
    }
    let incoming = new.body.len()
        + metadata.as_ref().map_or(0, |m| m.to_string().len())
        + new.attachments.iter().map(|a| a.data.len()).sum::<usize>();
    let mut call = Call {
        id: Uuid::new_v4(),
        channel,
        recipient,
        metadata: &metadata,
        incoming: incoming as i64,
    };

    // Without attachments, one statement committed on its own; with them,
    // the same call opens the transaction and the files follow the message
    // (its position stays held until the commit, so a reader waits for them).
    let (outcome, message) = if new.attachments.is_empty() {
        let outcome = place(w.conn(), me, &new, &mut call).await?;
        let message = view_of(&outcome, &new, me, call.id)?;
        (outcome, message)
    } else {
        let mut tx = w.begin().await?;
        let outcome = place(&mut tx, me, &new, &mut call).await?;
        attachments::insert_all(
            &mut tx,
            me,
            attachments::Owner::Message(call.id),
            &new.attachments,
        )
        .await?;
        let message: MessageView = sqlx::query_as(concat!(
            "SELECT ",
            view_columns!(),
            " WHERE m.team_id = $1 AND m.id = $2"
        ))
        .bind(me.team_id)
        .bind(call.id)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        (outcome, message)
    };

    let recipient_session = call.recipient.as_ref().and_then(|(_, w)| w.clone());
    let mut event = BusEvent::new(me.team_id, EventKind::Message, call.id.to_string()).by(me);
    event.channel_id = outcome.channel_id;
    event.recipient = outcome.recipient_id;
    event.recipient_session = recipient_session;
    event.announce = new.announce;
    w.emit(event);

    let delivered_to = match (&message.channel, &message.to) {
        (Some(channel), _) => vec![format!("#{channel}")],
        (None, Some(address)) => vec![address.clone()],
        (None, None) => Vec::new(),
    };
    Ok(Posted {
        message,
        delivered_to,
        channel_created: outcome.channel_created.unwrap_or(false),
    })
}

/// Call `post_message` once it knows where the message goes: naming
/// neither a channel nor a recipient, the window's default channel, read on
/// the same connection and decided by [`default_channel_of`] (the one
/// decision), so the function's own default (its `project_label` and
/// `no_default_channel` codes, migration 0031) is never reached.
async fn place(
    db: &mut PgConnection,
    me: &Identity,
    new: &NewMessage,
    call: &mut Call<'_>,
) -> BusResult<Outcome> {
    if call.channel.is_none() && call.recipient.is_none() {
        let labels = channel_labels(&mut *db, me).await?;
        let default = default_channel_of(&labels, me).ok_or_else(no_default_channel)?;
        call.channel = Some(default.name);
    }
    let outcome = call_once(&mut *db, me, new, call).await?;
    outcome.fence.check(me)?;
    match outcome.declined.as_deref() {
        None => Ok(outcome),
        Some(code) => Err(refused(code, &outcome, me, new, call)),
    }
}

async fn call_once(
    db: &mut PgConnection,
    me: &Identity,
    new: &NewMessage,
    call: &Call<'_>,
) -> BusResult<Outcome> {
    let reserved = call
        .channel
        .as_deref()
        .is_some_and(|name| channels::RESERVED_NAMES.contains(&name));
    Ok(sqlx::query_as(
        "SELECT * FROM post_message($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                                    $15, $16, $17, $18, $19, $20, $21)",
    )
    .bind_caller(me)
    .bind(call.id)
    .bind(&call.channel)
    .bind(reserved)
    .bind(None::<String>)
    .bind(call.recipient.as_ref().map(|(agent, _)| agent))
    .bind(
        call.recipient
            .as_ref()
            .and_then(|(_, window)| window.as_ref()),
    )
    .bind(&new.body)
    .bind(new.announce)
    .bind(new.question)
    .bind(new.reply_to)
    .bind(call.metadata)
    .bind(call.incoming)
    .bind(TEAM_QUOTA_DEFAULT_BYTES)
    .bind(new.ack.is_some())
    .bind(new.ack.flatten())
    .fetch_one(db)
    .await?)
}

/// The message as a reader sees it, from what the function returned (a post
/// without attachments has none).
fn view_of(outcome: &Outcome, new: &NewMessage, me: &Identity, id: Uuid) -> BusResult<MessageView> {
    let (Some(position), Some(created_at)) = (outcome.message_position, outcome.created_at) else {
        return Err(unexpected("returned no position"));
    };
    Ok(MessageView {
        id,
        from: outcome.sender.clone().unwrap_or_else(|| me.address()),
        // Over /mcp the sender is an agent; the dashboard sets it for a person.
        from_person: false,
        channel: outcome.channel.clone(),
        to: outcome.recipient.clone(),
        body: new.body.clone(),
        announce: new.announce,
        question: new.question,
        reply_to: new.reply_to,
        metadata: outcome.metadata.clone(),
        attachments: json!([]),
        created_at,
        position,
        ack_required: new.ack.is_some(),
        ack_due_at: new
            .ack
            .flatten()
            .map(|seconds| created_at + chrono::Duration::seconds(seconds.into())),
        acked: None,
    })
}

fn unexpected(what: &str) -> BusError {
    BusError::Db(sqlx::Error::Protocol(format!("post_message {what}")))
}

/// A `declined` code in words, as the checks said it before they moved into
/// the function.
fn refused(
    code: &str,
    outcome: &Outcome,
    me: &Identity,
    new: &NewMessage,
    call: &Call,
) -> BusError {
    let detail = outcome.detail.as_deref().unwrap_or_default();
    match code {
        "quota" => usage::quota_refusal(
            outcome.limit_bytes.unwrap_or_default(),
            outcome.used_bytes.unwrap_or_default(),
            call.incoming,
            &me.team,
        ),
        "no_default_channel" | "project_label" => no_default_channel(),
        "reserved_channel" => channels::reserved_refused(detail),
        "no_recipient" => BusError::not_found(format!(
            "no agent `{detail}` in your team. list_agents shows who is here."
        )),
        "bad_reply_to" => BusError::not_found(format!(
            "reply_to {} is not a message of your team. Use the id read_messages returned.",
            new.reply_to.unwrap_or_default()
        )),
        other => unexpected(&format!("declined with an unknown code {other}")),
    }
}
