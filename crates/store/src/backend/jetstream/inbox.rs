//! The inbox stream: one reference per (message, recipient window), consumed
//! by a durable pull consumer per window (`IN_<recipient_key>`, explicit
//! ack). Small on purpose: PostgreSQL decides what is owed and when it was
//! delivered; the broker only carries references and forgets them once
//! acked.
//!
//! Ack comes *after* the caller has written `delivered` in PostgreSQL,
//! possibly in another request, so a delivery carries its ack subject as a
//! plain string the caller can keep and hand back to [`Broker::ack_inbox`].
//! An unacked delivery is redelivered after [`INBOX_ACK_WAIT`].

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::stream::{ConsumerErrorKind, Stream};
use futures::StreamExt;
use uuid::Uuid;

use super::{Broker, inbox_consumer_name, inbox_stream_name, inbox_subject};
use crate::error::{BusError, BusResult};

/// How long a handed-out reference stays with one fetch before the broker
/// offers it again.
pub const INBOX_ACK_WAIT: Duration = Duration::from_secs(60);
/// How long an inbox fetch waits for the broker beyond the wait it asked
/// for; past it the window is served from PostgreSQL alone.
pub const FETCH_BUDGET: Duration = Duration::from_secs(2);

/// One reference handed out by the broker, not yet acked.
#[derive(Clone, Debug)]
pub struct InboxDelivery {
    pub payload: Vec<u8>,
    /// The reference's sequence in the inbox stream.
    pub stream_sequence: u64,
    /// How many times the broker has handed it out (1 the first time).
    pub delivered: i64,
    /// Hand this back to [`Broker::ack_inbox`] once `delivered` is written.
    pub ack_subject: String,
}

fn broker_error(what: &str, err: &dyn std::fmt::Display) -> BusError {
    BusError::unavailable(format!(
        "the message broker did not complete {what} ({err}); PostgreSQL still holds what \
         is owed, retry shortly"
    ))
}

impl Broker {
    /// Publish one reference to a window's inbox, deduplicated on
    /// `reference_id` (`Nats-Msg-Id`). Returns its stream sequence (the
    /// original one when the reference was already published).
    pub async fn publish_inbox_reference(
        &self,
        team_id: Uuid,
        recipient_key: &str,
        reference_id: Uuid,
        payload: &[u8],
    ) -> BusResult<u64> {
        let subject = inbox_subject(team_id, recipient_key)?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            reference_id.to_string().as_str(),
        );
        let ack = match self
            .js()
            .publish_with_headers(subject, headers, payload.to_vec().into())
            .await
        {
            Ok(future) => future.await,
            Err(e) => Err(e),
        };
        ack.map(|a| a.sequence)
            .map_err(|e| broker_error("publishing an inbox reference", &e))
    }

    /// The team's inbox stream (without asking the broker for its info) and
    /// the name of the window's consumer in it.
    async fn inbox_window(
        &self,
        team_id: Uuid,
        recipient_key: &str,
    ) -> BusResult<(Stream<()>, String)> {
        let name = inbox_consumer_name(recipient_key)?;
        let stream = self
            .js()
            .get_stream_no_info(inbox_stream_name(team_id))
            .await
            .map_err(|e| broker_error("opening the inbox stream", &e))?;
        Ok((stream, name))
    }

    /// The window's durable consumer, created when missing.
    async fn inbox_consumer(
        &self,
        team_id: Uuid,
        recipient_key: &str,
    ) -> BusResult<async_nats::jetstream::consumer::Consumer<pull::Config>> {
        let (stream, name) = self.inbox_window(team_id, recipient_key).await?;
        stream
            .get_or_create_consumer(
                &name,
                pull::Config {
                    durable_name: Some(name.clone()),
                    filter_subject: inbox_subject(team_id, recipient_key)?,
                    ack_policy: AckPolicy::Explicit,
                    deliver_policy: DeliverPolicy::All,
                    ack_wait: INBOX_ACK_WAIT,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| broker_error(&format!("opening inbox consumer {name}"), &e))
    }

    /// Make sure the window's consumer exists (it is also ensured by
    /// [`Broker::fetch_inbox`]).
    pub async fn ensure_inbox_consumer(&self, team_id: Uuid, recipient_key: &str) -> BusResult<()> {
        self.inbox_consumer(team_id, recipient_key)
            .await
            .map(|_| ())
    }

    /// Up to `max` references for the window, waiting at most `wait` for
    /// the first one when none is ready, and at most [`FETCH_BUDGET`] more
    /// for the broker to answer at all. Nothing is acked here.
    pub async fn fetch_inbox(
        &self,
        team_id: Uuid,
        recipient_key: &str,
        max: usize,
        wait: Duration,
    ) -> BusResult<Vec<InboxDelivery>> {
        // A pull the broker never answers (a consumer without a leader after
        // the cluster restarted) has no timeout of its own: the window's
        // fetch hung until its client gave up (seen in a chaos run), and
        // the references it then handed out from PostgreSQL went unseen.
        let budget = wait + FETCH_BUDGET;
        tokio::time::timeout(
            budget,
            self.fetch_inbox_now(team_id, recipient_key, max, wait),
        )
        .await
        .unwrap_or_else(|_| {
            Err(BusError::unavailable(format!(
                "the message broker did not answer an inbox fetch within {:.1} s; \
                     PostgreSQL still holds what is owed",
                budget.as_secs_f32()
            )))
        })
    }

    async fn fetch_inbox_now(
        &self,
        team_id: Uuid,
        recipient_key: &str,
        max: usize,
        wait: Duration,
    ) -> BusResult<Vec<InboxDelivery>> {
        let max = max.clamp(1, 256);
        let consumer = self.inbox_consumer(team_id, recipient_key).await?;
        let mut out = Vec::new();
        // What is ready now, without leaving a pull request behind.
        let ready = consumer
            .fetch()
            .max_messages(max)
            .messages()
            .await
            .map_err(|e| broker_error("fetching inbox references", &e))?;
        collect(ready, max, &mut out).await?;
        if out.is_empty() && !wait.is_zero() {
            // Wait for one: a batch of one completes as soon as it arrives,
            // so no request stays open on the server holding references for
            // a reader that has gone.
            let one = consumer
                .batch()
                .max_messages(1)
                .expires(wait.max(Duration::from_millis(100)))
                .messages()
                .await
                .map_err(|e| broker_error("waiting for inbox references", &e))?;
            collect(one, 1, &mut out).await?;
            if !out.is_empty() && max > 1 {
                let more = consumer
                    .fetch()
                    .max_messages(max - 1)
                    .messages()
                    .await
                    .map_err(|e| broker_error("fetching inbox references", &e))?;
                collect(more, max - 1, &mut out).await?;
            }
        }
        Ok(out)
    }

    /// Ack a delivery by the subject it came with, once `delivered` is
    /// written. The subject must belong to this window's consumer: it is
    /// kept by the bus, but an ack is a deletion on a work-queue stream and
    /// is never sent anywhere else.
    pub async fn ack_inbox(
        &self,
        team_id: Uuid,
        recipient_key: &str,
        ack_subject: &str,
    ) -> BusResult<()> {
        let prefix = format!(
            "$JS.ACK.{}.{}.",
            inbox_stream_name(team_id),
            inbox_consumer_name(recipient_key)?
        );
        if !ack_subject.starts_with(&prefix) {
            return Err(BusError::invalid(
                "that ack subject does not belong to this window's inbox; nothing was acked",
            ));
        }
        // A request, not a fire-and-forget publish: the server answers once
        // it has processed the ack, so "acked" is never reported early.
        let ask = self.client().request(ack_subject.to_owned(), "+ACK".into());
        match tokio::time::timeout(self.timeout(), ask).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(broker_error("acking an inbox reference", &e)),
            Err(_) => Err(broker_error("acking an inbox reference", &"timed out")),
        }
    }

    /// Whether the window's consumer exists ("consumer missing" is not
    /// "empty": a missing one is rebuilt from PostgreSQL).
    pub async fn inbox_consumer_exists(
        &self,
        team_id: Uuid,
        recipient_key: &str,
    ) -> BusResult<bool> {
        let (stream, name) = self.inbox_window(team_id, recipient_key).await?;
        match stream.consumer_info(&name).await {
            Ok(_) => Ok(true),
            Err(e) => match e.kind() {
                ConsumerInfoErrorKind::NotFound => Ok(false),
                ConsumerInfoErrorKind::JetStream(js) if js.code() == 404 => Ok(false),
                _ => Err(broker_error(&format!("reading inbox consumer {name}"), &e)),
            },
        }
    }

    /// Delete the window's consumer (what it had not acked stays in the
    /// stream for the next one). Returns whether it existed.
    pub async fn delete_inbox_consumer(
        &self,
        team_id: Uuid,
        recipient_key: &str,
    ) -> BusResult<bool> {
        let (stream, name) = self.inbox_window(team_id, recipient_key).await?;
        match stream.delete_consumer(&name).await {
            Ok(_) => Ok(true),
            Err(e) => match e.kind() {
                ConsumerErrorKind::JetStream(js) if js.code() == 404 => Ok(false),
                _ => Err(broker_error(&format!("deleting inbox consumer {name}"), &e)),
            },
        }
    }
}

async fn collect<S, E>(mut messages: S, max: usize, out: &mut Vec<InboxDelivery>) -> BusResult<()>
where
    S: futures::Stream<Item = Result<async_nats::jetstream::Message, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut taken = 0;
    while taken < max {
        let Some(next) = messages.next().await else {
            break;
        };
        let message = next.map_err(|e| broker_error("reading inbox references", &e))?;
        let info = message
            .info()
            .map_err(|e| broker_error("reading an inbox reference's metadata", &e))?;
        let (stream_sequence, delivered) = (info.stream_sequence, info.delivered);
        let Some(reply) = message.message.reply.as_ref() else {
            continue;
        };
        out.push(InboxDelivery {
            payload: message.message.payload.to_vec(),
            stream_sequence,
            delivered,
            ack_subject: reply.to_string(),
        });
        taken += 1;
    }
    Ok(())
}
