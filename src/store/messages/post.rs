//! Posting a message: checks, then one short transaction whose last
//! statement takes the team's next position (see the module overview).

use super::{
    MessageView, NewMessage, Posted, check_body, default_channel, normalize_metadata, parse_address,
};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};
use crate::store::{attachments, channels, sessions, usage};
use uuid::Uuid;

/// `post_message`.
pub async fn post(bus: &Bus, me: &Identity, new: NewMessage) -> BusResult<Posted> {
    check_body(&new.body)?;
    attachments::check_count(new.attachments.len())?;
    let metadata = normalize_metadata(new.metadata)?;
    let channel = match (&new.channel, &new.to) {
        (Some(_), Some(_)) => {
            return Err(BusError::invalid(
                "give either `channel` or `to`, not both: a message goes to one channel or one address.",
            ));
        }
        (Some(channel), None) => Some(channels::normalize_name(channel)?),
        (None, Some(_)) => None,
        (None, None) => Some(default_channel(bus, me).await?.ok_or_else(|| {
            BusError::invalid(
                "no `channel` or `to`, and this window has no default channel (it comes from the \
                 heartbeat `project` label, or the window name; `inbox` and `all` name none, they \
                 are read_messages scopes). Name a channel or an address.",
            )
        })?),
    };
    let recipient = new.to.as_deref().map(parse_address).transpose()?;
    if new.announce && channel.is_none() {
        return Err(BusError::invalid(
            "`announce` applies to channel messages only (it reaches every window whatever it is \
             focused on); a direct message already reaches its recipient.",
        ));
    }

    let mut tx = bus.pool.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let incoming = new.body.len()
        + metadata.as_ref().map_or(0, |m| m.to_string().len())
        + new.attachments.iter().map(|a| a.data.len()).sum::<usize>();
    usage::check_quota(&mut *tx, me.team_id, &me.team, incoming).await?;
    let (channel, channel_created) = match &channel {
        Some(name) => {
            let (channel, created) = channels::find_or_create(&mut tx, me, name).await?;
            (Some(channel), created)
        }
        None => (None, false),
    };
    let recipient_id = match &recipient {
        Some((agent, _)) => Some(
            sqlx::query_scalar::<_, Uuid>("SELECT id FROM agents WHERE team_id = $1 AND name = $2")
                .bind(me.team_id)
                .bind(agent)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| {
                    BusError::not_found(format!(
                        "no agent `{agent}` in your team. list_agents shows who is here."
                    ))
                })?,
        ),
        None => None,
    };
    if let Some(reply_to) = new.reply_to {
        let exists: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM messages WHERE team_id = $1 AND id = $2)",
        )
        .bind(me.team_id)
        .bind(reply_to)
        .fetch_one(&mut *tx)
        .await?;
        if !exists {
            return Err(BusError::not_found(format!(
                "reply_to {reply_to} is not a message of your team. Use the id read_messages returned."
            )));
        }
    }
    let id = Uuid::new_v4();
    let recipient_session = recipient.as_ref().and_then(|(_, window)| window.clone());
    if !new.attachments.is_empty() {
        // The attachments go in before their message, whose insert must be
        // the last statement (see below); their reference is checked at commit.
        sqlx::query("SET CONSTRAINTS attachments_team_id_message_id_fkey DEFERRED")
            .execute(&mut *tx)
            .await?;
    }
    attachments::insert_all(
        &mut tx,
        me,
        attachments::Owner::Message(id),
        &new.attachments,
    )
    .await?;
    // Last before the commit, in one statement: take the team's next position
    // (its counter row stays locked until the commit, so positions commit in
    // order), count the message on its channel, insert it. Nothing slow runs
    // while the lock is held.
    let message: MessageView = sqlx::query_as(concat!(
        "WITH pos AS (
             INSERT INTO message_counters (team_id, last_position) VALUES ($2, 1)
             ON CONFLICT (team_id) DO UPDATE SET last_position = message_counters.last_position + 1
             RETURNING last_position),
         counted AS (
             UPDATE channels SET message_count = message_count + 1,
                                 last_position = pos.last_position, last_message_at = now()
             FROM pos WHERE channels.team_id = $2 AND channels.id = $3
             RETURNING channels.id),
         m AS (
             INSERT INTO messages (id, team_id, channel_id, sender_id, sender_session, recipient_id,
                                   recipient_session, body, announce, is_question, reply_to,
                                   metadata, position)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, pos.last_position FROM pos
             RETURNING *)
         SELECT ",
        view_columns_from!(),
        " FROM m",
        view_joins!()
    ))
    .bind(id)
    .bind(me.team_id)
    .bind(channel.as_ref().map(|c| c.id))
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(recipient_id)
    .bind(&recipient_session)
    .bind(&new.body)
    .bind(new.announce)
    .bind(new.question)
    .bind(new.reply_to)
    .bind(&metadata)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut event = BusEvent::new(me.team_id, EventKind::Message, id.to_string()).by(me);
    event.channel_id = channel.as_ref().map(|c| c.id);
    event.recipient = recipient_id;
    event.recipient_session = recipient_session;
    event.announce = new.announce;
    bus.events.emit(event);

    let delivered_to = match (&channel, &message.to) {
        (Some(channel), _) => vec![format!("#{}", channel.name)],
        (None, Some(address)) => vec![address.clone()],
        (None, None) => Vec::new(),
    };
    Ok(Posted {
        message,
        delivered_to,
        channel_created,
    })
}
