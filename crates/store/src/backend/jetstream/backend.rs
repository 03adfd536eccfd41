//! `JetStreamBackend`: the `MessagingBackend` of one team on its body stream.
//!
//! Idempotency is the broker's: every publish carries `Nats-Msg-Id` = the
//! outbox `publish_key`, so a second presentation inside the stream's
//! duplicate window is answered with the first one's sequence (a PubAck with
//! `duplicate: true`) and nothing is stored twice. That is also all
//! `reconcile` needs: present the same envelope again and read the answer.
//!
//! A publish is classified by what the broker *said*, never by what it might
//! have done: an answer that refuses is `Fatal` or `Retryable`; no answer at
//! all is `Unanswered`, because the body may be stored.

use std::time::Instant;

use async_nats::HeaderMap;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{GetStreamErrorKind, PublishError, PublishErrorKind};
use async_nats::jetstream::stream::{
    DeleteMessageErrorKind, DirectGetErrorKind, RawMessageErrorKind, Stream,
};
use uuid::Uuid;

use super::{
    BODY_MAX_BYTES, Broker, ConditionKind, body_stream_name, body_subject, locator, parse_locator,
};
use crate::backend::{BackendKind, Envelope, Locator, MessagingBackend, Published};
use crate::error::{BusError, BusResult};

pub const HEADER_MESSAGE_ID: &str = "Acs-Message-Id";
pub const HEADER_CONVERSATION_ID: &str = "Acs-Conversation-Id";
pub const HEADER_TEAM_ID: &str = "Acs-Team-Id";

/// The JetStream backend for one team. Reads only that team's body stream.
#[derive(Clone)]
pub struct JetStreamBackend {
    broker: Broker,
    team_id: Uuid,
}

/// What one presentation of an envelope came to. Finer than `Published`,
/// because `reconcile` must tell "the broker answered: nothing stored" from
/// "nobody answered".
#[derive(Debug)]
enum Attempt {
    /// Stored now, or earlier under the same key (`duplicate`).
    Stored { sequence: u64 },
    /// The broker answered and stored nothing. `fatal`: it never will.
    Refused { fatal: bool, reason: String },
    /// The broker answered and stored nothing because of a condition of the
    /// team's stream an operator can fix (missing, full, out of storage):
    /// retryable, and recorded on the broker handle (`conditions.rs`).
    Blocked { kind: ConditionKind, reason: String },
    /// Never left this process (a full in-flight window, the client gone).
    NotSent(String),
    /// Sent, and no answer came back: stored or not, nobody knows.
    NoAnswer(String),
}

impl JetStreamBackend {
    pub fn new(broker: Broker, team_id: Uuid) -> Self {
        Self { broker, team_id }
    }

    pub fn team_id(&self) -> Uuid {
        self.team_id
    }

    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    async fn present(&self, envelope: &Envelope) -> Attempt {
        if envelope.team_id != self.team_id {
            // A handle is built per team; publishing another team's body
            // here would file it under the wrong stream for good.
            return Attempt::Refused {
                fatal: true,
                reason: "this envelope belongs to another team than the backend handle".into(),
            };
        }
        let subject = body_subject(self.team_id, envelope.conversation_id);
        let mut headers = HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            envelope.publish_key.to_string().as_str(),
        );
        headers.insert(HEADER_MESSAGE_ID, envelope.message_id.to_string().as_str());
        headers.insert(
            HEADER_CONVERSATION_ID,
            envelope.conversation_id.to_string().as_str(),
        );
        headers.insert(HEADER_TEAM_ID, self.team_id.to_string().as_str());
        let sent_at = Instant::now();
        let ack = match self
            .broker
            .js()
            .publish_with_headers(
                subject.clone(),
                headers,
                envelope.body.clone().into_bytes().into(),
            )
            .await
        {
            Ok(future) => future.await,
            Err(e) => Err(e),
        };
        let stream = body_stream_name(self.team_id);
        let attempt = match ack {
            Ok(ack) if ack.stream == stream => Attempt::Stored {
                sequence: ack.sequence,
            },
            Ok(ack) => Attempt::Refused {
                fatal: true,
                reason: format!(
                    "the broker filed this body in stream {} instead of {}: another stream \
                     captures the team's subjects. Remove or narrow that stream.",
                    ack.stream,
                    body_stream_name(self.team_id)
                ),
            },
            Err(e) => self.classify(e, &subject, sent_at, envelope.body.len()),
        };
        let attempt = self.missing_or_leaderless(attempt, &stream).await;
        // What the broker said about the stream, for health, status and the
        // outbox's choice to wait rather than spend an attempt.
        match &attempt {
            Attempt::Stored { .. } => self.broker.clear_condition(self.team_id, &stream, sent_at),
            Attempt::Blocked { kind, reason } => {
                self.broker
                    .raise_condition(self.team_id, &stream, *kind, reason, sent_at)
            }
            _ => {}
        }
        attempt
    }

    /// NATS answers "no stream" to a publish nobody took, and that is a
    /// stream that does not exist just as well as a replicated stream with
    /// no leader (an election, or too few of its servers up). Only the
    /// broker saying the stream does not exist makes it missing: the fix for
    /// that (`team stream`) is not the fix for the other, and a team whose
    /// stream is missing has new conversations refused.
    async fn missing_or_leaderless(&self, attempt: Attempt, stream: &str) -> Attempt {
        let Attempt::Blocked {
            kind: ConditionKind::StreamMissing,
            ..
        } = &attempt
        else {
            return attempt;
        };
        let exists = match self.broker.stream_info(stream).await {
            Ok(None) => return attempt,
            Ok(Some(_)) => "exists",
            Err(_) => "did not answer whether it exists",
        };
        Attempt::Blocked {
            kind: ConditionKind::StreamLeaderless,
            reason: format!(
                "no leader of stream {stream} took the publish, and the broker says the stream \
                 {exists}: its replicas are electing a leader, or too few of the servers \
                 holding them are up. The message waits pending without spending its \
                 attempts; nothing was stored, and it is published again under the same key."
            ),
        }
    }

    fn classify(
        &self,
        err: PublishError,
        subject: &str,
        sent_at: Instant,
        bytes: usize,
    ) -> Attempt {
        let stream = body_stream_name(self.team_id);
        match err.kind() {
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                // A denied publish gets an asynchronous -ERR and no reply; the
                // server has told us it stored nothing, just not on this channel.
                if self.broker.publish_denied_since(subject, sent_at) {
                    return Attempt::Refused {
                        fatal: true,
                        reason: format!(
                            "permission denied: the NATS user of this server may not publish \
                             to {subject}. Grant it publish on `acs.>` (and the JetStream API), \
                             then resend."
                        ),
                    };
                }
                Attempt::NoAnswer(format!(
                    "the broker did not answer within {} s ({err}); the body may or may not \
                     be stored, and the reconciler will ask again under the same key",
                    self.broker.timeout().as_secs_f32()
                ))
            }
            PublishErrorKind::StreamNotFound => Attempt::Blocked {
                kind: ConditionKind::StreamMissing,
                reason: format!(
                    "no stream takes {subject} on the broker: stream {stream} is missing. The \
                     message waits pending without spending its attempts; run `ai-crew-sync \
                     team stream --team TEAM --nats-url URL` to provision it."
                ),
            },
            PublishErrorKind::MaxPayloadExceeded if bytes <= BODY_MAX_BYTES => {
                // The bus checked the broker could take a full body at connect;
                // it has since been reconfigured. That is for an operator to
                // fix, and the body is fine, so it may succeed later.
                Attempt::NotSent(format!(
                    "the broker now accepts at most {} bytes per message, too few for this \
                     {bytes}-byte body plus headers. Raise `max_payload` in nats-server.conf \
                     (e.g. 2MB) and restart nats-server.",
                    self.broker.client().server_info().max_payload
                ))
            }
            PublishErrorKind::MaxPayloadExceeded => Attempt::Refused {
                fatal: true,
                reason: format!(
                    "this body is {bytes} bytes, over the 1 MiB ({BODY_MAX_BYTES} bytes) a \
                     conversation message may carry; send a shorter body or an attachment."
                ),
            },
            PublishErrorKind::MaxAckPending => Attempt::NotSent(
                "too many publishes are waiting for the broker's answer; retry shortly".into(),
            ),
            _ => match jetstream_error(&err) {
                Some(js) => refusal(js, &stream),
                // No answer from the server came into it: the request never
                // left (closed client, bad subject) or its reply was garbage.
                None => Attempt::NotSent(format!("the publish did not go through: {err}")),
            },
        }
    }
}

/// The server's JetStream error inside a publish error, when it answered one.
fn jetstream_error(err: &PublishError) -> Option<&async_nats::jetstream::Error> {
    std::error::Error::source(err)?.downcast_ref::<async_nats::jetstream::Error>()
}

/// Classify a JetStream error answer to a publish (the backend boundary's
/// rule, ARCHITECTURE.md B1): only a
/// payload the broker can never accept is fatal (a permission denied is
/// recognised before this, in [`JetStreamBackend::classify`]). Everything
/// else may succeed later, a full stream included: "maximum messages/bytes
/// exceeded" from a discard-new stream (10077), or the server or account out
/// of storage (10047/10028/10023), is cured by an operator raising a quota or
/// freeing space, and the slot must still be there when that happens, not
/// `failed` for good with a body nobody will publish.
fn refusal(err: &async_nats::jetstream::Error, stream: &str) -> Attempt {
    let code = err.error_code().0;
    let text = err.to_string();
    let lower = text.to_ascii_lowercase();
    let full = code == 10077 && lower.contains("maximum");
    let out_of_storage =
        matches!(code, 10047 | 10028 | 10023) || (code == 10077 && lower.contains("no space"));
    match code {
        // Larger than the stream's max_msg_size: this body, as it is, is
        // never taken by this stream.
        10054 => Attempt::Refused {
            fatal: true,
            reason: format!(
                "the broker refused the body as larger than stream {stream} allows ({text}); \
                 raise the stream's max_msg_size to 2 MiB (`team stream --update-quotas`), then \
                 `ai-crew-sync conversations retry --team TEAM --apply` publishes it again."
            ),
        },
        _ if full => Attempt::Blocked {
            kind: ConditionKind::StreamFull,
            reason: format!(
                "stream {stream} is full ({text}); it refuses new bodies rather than dropping \
                 old ones. The message waits pending without spending its attempts until the \
                 stream's quota is raised (`ai-crew-sync team stream --team TEAM --nats-url URL \
                 --update-quotas --max-messages N --max-bytes N`)."
            ),
        },
        _ if out_of_storage => Attempt::Blocked {
            kind: ConditionKind::BrokerOutOfStorage,
            reason: format!(
                "the broker is out of storage for stream {stream} ({text}); the message waits \
                 pending without spending its attempts. Free space on the broker or raise the \
                 account's JetStream limits."
            ),
        },
        _ => Attempt::Refused {
            fatal: false,
            reason: format!("the broker refused the publish for now ({text}); it is retried"),
        },
    }
}

impl MessagingBackend for JetStreamBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Jetstream
    }

    async fn publish(&self, envelope: &Envelope) -> Published {
        match self.present(envelope).await {
            Attempt::Stored { sequence } => {
                Published::Confirmed(locator(&body_stream_name(self.team_id), sequence))
            }
            Attempt::Refused {
                fatal: true,
                reason,
            } => Published::Fatal(reason),
            Attempt::Blocked { reason, .. } => Published::Blocked(reason),
            Attempt::Refused {
                fatal: false,
                reason,
            }
            | Attempt::NotSent(reason) => Published::Retryable(reason),
            Attempt::NoAnswer(reason) => Published::Unanswered(reason),
        }
    }

    async fn fetch(&self, locator: &Locator, message_id: Uuid) -> BusResult<Option<String>> {
        self.read(locator, message_id, true).await
    }

    async fn fetch_once(&self, locator: &Locator, message_id: Uuid) -> BusResult<Option<String>> {
        self.read(locator, message_id, false).await
    }

    async fn retain(&self, released: &[Locator]) -> BusResult<u64> {
        // Only what PostgreSQL released (tombstoned under a retention) is
        // dropped, by locator: a body on the broker is history the database
        // points at, and deleting by age behind its back would turn readable
        // messages into tombstones. A locator of another team's stream is
        // never acted on.
        let own = body_stream_name(self.team_id);
        let mut handle = None;
        let mut dropped = 0;
        for locator in released {
            let Some((stream, sequence)) = parse_locator(locator) else {
                continue;
            };
            if stream != own {
                continue;
            }
            let stream = match &handle {
                Some(stream) => stream,
                None => handle.insert(self.stream_handle(&own).await?),
            };
            match stream.delete_message(sequence).await {
                Ok(true) => dropped += 1,
                Ok(false) => {}
                Err(err) => match err.kind() {
                    DeleteMessageErrorKind::JetStream(e)
                        if e.error_code() == ErrorCode::NO_MESSAGE_FOUND => {}
                    _ => {
                        return Err(BusError::unavailable(format!(
                            "the broker did not drop the body at {own} sequence {sequence}: {err}"
                        )));
                    }
                },
            }
        }
        Ok(dropped)
    }

    async fn reconcile(&self, envelope: &Envelope) -> BusResult<Option<Locator>> {
        // The same envelope under the same Nats-Msg-Id: inside the duplicate
        // window the broker answers with the original sequence, outside it
        // the body lands now. Never a probe (B1).
        match self.present(envelope).await {
            Attempt::Stored { sequence } => {
                Ok(Some(locator(&body_stream_name(self.team_id), sequence)))
            }
            // The broker answered and stored nothing, and a duplicate would
            // have been answered as one: nothing is held under this key.
            Attempt::Refused { .. } | Attempt::Blocked { .. } => Ok(None),
            Attempt::NotSent(reason) | Attempt::NoAnswer(reason) => Err(BusError::unavailable(
                format!("the broker could not be asked whether it holds this body: {reason}"),
            )),
        }
    }
}

impl JetStreamBackend {
    /// A body by locator, checked to be this team's and this message's.
    /// `confirm_absence`: a "not found" is settled by [`Self::look_again`]
    /// before it is reported as `None`.
    async fn read(
        &self,
        locator: &Locator,
        message_id: Uuid,
        confirm_absence: bool,
    ) -> BusResult<Option<String>> {
        let Some((stream, sequence)) = parse_locator(locator) else {
            return Err(BusError::invalid(
                "not a locator the jetstream backend issued",
            ));
        };
        let own = body_stream_name(self.team_id);
        if stream != own {
            // A locator is opaque and proves nothing: one copied from another
            // team reads nothing here, whether that stream exists or not.
            return Err(BusError::forbidden(
                "that locator names another team's stream; it reads nothing here",
            ));
        }
        let message = match self.get(&own, sequence).await? {
            Some(message) => message,
            None if !confirm_absence => return Ok(None),
            None => match self.look_again(&own, sequence).await? {
                Some(message) => message,
                None => return Ok(None),
            },
        };
        self.broker.forget_miss(&own, sequence);
        let header = |name: &str| {
            message
                .headers
                .get(name)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        let conversation = header(HEADER_CONVERSATION_ID);
        let same_team = header(HEADER_TEAM_ID) == self.team_id.to_string();
        let same_message = header(HEADER_MESSAGE_ID) == message_id.to_string();
        let subject_matches = conversation
            .parse::<Uuid>()
            .is_ok_and(|c| message.subject.as_str() == body_subject(self.team_id, c));
        if !(same_team && same_message && subject_matches) {
            // Forbidden, not None: "no longer holds it" would let a reader
            // record a tombstone for a body that is still there.
            return Err(BusError::forbidden(
                "that locator names another message; it reads nothing",
            ));
        }
        String::from_utf8(message.payload.to_vec())
            .map(Some)
            .map_err(|_| {
                BusError::conflict("the stored body is not UTF-8 text; it cannot be shown")
            })
    }

    /// A handle on `stream`, without asking the broker for its info.
    async fn stream_handle(&self, stream: &str) -> BusResult<Stream<()>> {
        self.broker
            .js()
            .get_stream_no_info(stream)
            .await
            .map_err(|e| unreachable_broker(&e))
    }

    /// The broker answered that it holds nothing at `sequence`. One such
    /// answer does not make a body lost: a direct get may be answered by a
    /// replica that lags, and a broker lost and re-provisioned a moment ago
    /// may be having its stream restored. So the stream leader is asked now
    /// (a replica that merely lags is settled at once), and the absence
    /// counts only when the leader still reports it at least
    /// `absence_confirm_delay` after the first "not found" this process saw;
    /// until then the read is `unavailable`, because a tombstone is for good
    /// and unknown is not lost. `None`: absence confirmed.
    async fn look_again(
        &self,
        stream: &str,
        sequence: u64,
    ) -> BusResult<Option<async_nats::jetstream::message::StreamMessage>> {
        let asked_at = Instant::now();
        let handle = self.stream_handle(stream).await?;
        if let Some(message) = self.leader_get(&handle, stream, sequence, asked_at).await? {
            return Ok(Some(message));
        }
        // The first "not found" stays recorded after a confirmation: any
        // later leader answer of absence is again one the delay apart.
        let missing_for = self.broker.note_miss(stream, sequence);
        let delay = self.broker.absence_confirm_delay();
        if missing_for >= delay {
            return Ok(None);
        }
        Err(BusError::unavailable(format!(
            "the broker answers that stream {stream} holds no message at sequence {sequence}, \
             and one answer does not make a body lost (a replica may lag, a stream may be \
             being restored): it counts only if the stream leader still says so {:.1} s after \
             the first answer ({:.1} s so far)",
            delay.as_secs_f32(),
            missing_for.as_secs_f32()
        )))
    }

    /// The message at `sequence`: direct get when the stream allows it (any
    /// replica answers), the leader's get otherwise. `None`: the broker
    /// answered that there is no message there (deleted, never written, or a
    /// replica not caught up: see [`Self::look_again`]).
    async fn get(
        &self,
        stream: &str,
        sequence: u64,
    ) -> BusResult<Option<async_nats::jetstream::message::StreamMessage>> {
        let asked_at = Instant::now();
        let direct = match self.broker.allows_direct(stream) {
            Some(direct) => direct,
            None => {
                let info = match self.broker.js().get_stream(stream).await {
                    Ok(handle) => handle.cached_info().config.allow_direct,
                    Err(e) => match e.kind() {
                        GetStreamErrorKind::JetStream(js) if js.error_code().0 == 10059 => {
                            return Err(self.stream_missing(stream, asked_at));
                        }
                        _ => return Err(unreachable_broker(&e)),
                    },
                };
                self.broker.remember_direct(stream, Some(info));
                info
            }
        };
        let handle = self.stream_handle(stream).await?;
        if direct {
            match handle.direct_get(sequence).await {
                Ok(message) => return Ok(Some(message)),
                Err(e) if e.kind() == DirectGetErrorKind::NotFound => return Ok(None),
                Err(e) => {
                    // Maybe direct get was turned off since: ask again next
                    // time, and the leader now.
                    self.broker.remember_direct(stream, None);
                    tracing::debug!(error = %e, stream, "direct get failed; asking the leader");
                }
            }
        }
        self.leader_get(&handle, stream, sequence, asked_at).await
    }

    /// `STREAM.MSG.GET`, answered by the stream's leader: never a replica's
    /// possibly older view. `None`: the leader holds no message there.
    async fn leader_get(
        &self,
        handle: &Stream<()>,
        stream: &str,
        sequence: u64,
        asked_at: Instant,
    ) -> BusResult<Option<async_nats::jetstream::message::StreamMessage>> {
        match handle.get_raw_message(sequence).await {
            Ok(message) => Ok(Some(message)),
            Err(e) => match e.kind() {
                RawMessageErrorKind::NoMessageFound => Ok(None),
                RawMessageErrorKind::JetStream(js) if js.error_code().0 == 10059 => {
                    Err(self.stream_missing(stream, asked_at))
                }
                _ => Err(unreachable_broker(&e)),
            },
        }
    }

    /// The stream itself is gone: said so rather than "no longer holds it",
    /// which would tombstone every body of a team pointed at the wrong server.
    /// Recorded as the stream's condition, as a publish's answer is, so
    /// health, status, the outbox and the reader all know it (a read may be
    /// the first to learn it, within a stream check's cache).
    fn stream_missing(&self, stream: &str, asked_at: Instant) -> BusError {
        self.broker.raise_condition(
            self.team_id,
            stream,
            ConditionKind::StreamMissing,
            "a read was answered that the stream does not exist",
            asked_at,
        );
        BusError::unavailable(format!(
            "stream {stream} does not exist on the broker at {}, so whether it held this body \
             is not known. Point the server at the broker that holds it, or restore the stream; \
             if its store was lost, run `ai-crew-sync team stream` for this team (bodies of the \
             old stream then read as lost).",
            self.broker.url()
        ))
    }
}

fn unreachable_broker(err: &dyn std::fmt::Display) -> BusError {
    BusError::unavailable(format!(
        "the message broker did not answer ({err}); whether it still holds the body is not \
         known. Read again shortly."
    ))
}
