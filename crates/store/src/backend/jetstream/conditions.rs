//! Conditions of a team's streams that an operator can fix: a stream missing
//! (the broker's store was wiped, or nobody ran `team stream`), a stream
//! without a leader (a replicated stream whose servers are too few to elect
//! one), a body stream full (discard new, at its message or byte quota), a
//! broker out of storage.
//!
//! None of them is the message's fault, so none may fail a message behind
//! the operator's back: while one holds, the outbox puts the team's slots
//! back without spending an attempt (`store::delivery::outbox::settle_waiting`), and
//! health, `conversations status` and `create_conversation` name it with
//! the command that fixes it.
//!
//! The state is kept here, in memory, per (team, stream), by whoever last
//! learned something from the broker: a publish's answer, a read answered
//! "no such stream" (raised only), or a stream-info check. A condition is raised and cleared once: the server logs a WARN when
//! one appears (or changes) and an INFO when it clears, never once per
//! message. An answer older than the last change is ignored: a publish sent
//! before the stream filled up says nothing about the stream now, so its
//! late PubAck does not clear a condition raised since (the drain's
//! publishes of one pass complete in any order).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use uuid::Uuid;

use super::{Broker, REQUIRED_MAX_PAYLOAD, StreamReport, body_stream_name, inbox_stream_name};
use crate::error::BusResult;

/// How long a stream-info check is reused: `create_conversation` and
/// `/health?broker=check` may run often, the streams change rarely.
pub const CHECK_CACHE: Duration = Duration::from_secs(2);

acs_wire::text_enum! {
    /// What is wrong with one stream.
    pub enum ConditionKind {
        /// The broker answers that no such stream exists (or that nothing takes
        /// its subjects).
        StreamMissing = "stream_missing",
        /// Nothing took a publish to the stream's subjects, yet the broker does
        /// not say the stream is gone: it has no leader (its replicas are
        /// electing one, or too few of the servers holding them are up).
        StreamLeaderless = "stream_leaderless",
        /// The body stream is at its message or byte quota and refuses new bodies.
        StreamFull = "stream_full",
        /// The broker or the account has no JetStream storage left.
        BrokerOutOfStorage = "broker_out_of_storage",
    }
}

impl ConditionKind {
    /// Why messages wait, in fixed words (health is unauthenticated).
    pub fn why(self, stream: &str) -> String {
        match self {
            ConditionKind::StreamMissing => format!(
                "stream {stream} does not exist on the broker (its store was wiped, or it was \
                 never provisioned there); the team's messages wait pending, attempts unspent"
            ),
            ConditionKind::StreamLeaderless => format!(
                "stream {stream} has no leader to store bodies (its replicas are electing one, \
                 or too few of the servers holding them are up); the team's messages wait \
                 pending, attempts unspent"
            ),
            ConditionKind::StreamFull => format!(
                "stream {stream} is full (at its message or byte quota) and refuses new bodies; \
                 the team's messages wait pending, attempts unspent"
            ),
            ConditionKind::BrokerOutOfStorage => format!(
                "the broker has no JetStream storage left for stream {stream}; the team's \
                 messages wait pending, attempts unspent"
            ),
        }
    }

    /// The command (or action) that fixes it.
    pub fn fix(self, team: &str, nats_url: &str) -> String {
        match self {
            ConditionKind::StreamMissing => {
                format!("ai-crew-sync team stream --team {team} --nats-url {nats_url}")
            }
            ConditionKind::StreamLeaderless => "bring back the JetStream servers holding the \
                 team's streams: a stream with N replicas needs a majority of them up (an \
                 election alone ends within seconds, nothing to do)"
                .to_owned(),
            ConditionKind::StreamFull => format!(
                "ai-crew-sync team stream --team {team} --nats-url {nats_url} --update-quotas \
                 --max-messages N --max-bytes N"
            ),
            ConditionKind::BrokerOutOfStorage => "free disk space on the broker or raise the \
                 account's JetStream storage limit (max_file_store in nats-server.conf)"
                .to_owned(),
        }
    }
}

/// One condition as it stands.
#[derive(Clone, Debug, Serialize)]
pub struct StreamCondition {
    pub team_id: Uuid,
    pub stream: String,
    pub condition: ConditionKind,
    /// What the broker said (server log and operator surfaces; never health).
    pub detail: String,
    pub since_seconds: u64,
}

struct Entry {
    /// `None`: cleared (kept so a stale answer cannot raise it again).
    kind: Option<ConditionKind>,
    detail: String,
    changed_at: Instant,
}

#[derive(Default)]
pub(super) struct Conditions {
    entries: Mutex<HashMap<(Uuid, String), Entry>>,
    /// The last stream-info check per team, and when.
    checked: Mutex<HashMap<Uuid, Instant>>,
}

impl Broker {
    /// The broker answered, for a request sent at `sent_at`, that `stream`
    /// of `team_id` is in `kind`. Logged once when it appears or changes.
    pub(crate) fn raise_condition(
        &self,
        team_id: Uuid,
        stream: &str,
        kind: ConditionKind,
        detail: &str,
        sent_at: Instant,
    ) {
        let mut entries = self
            .conditions()
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let key = (team_id, stream.to_owned());
        if let Some(entry) = entries.get(&key)
            && (entry.changed_at > sent_at || entry.kind == Some(kind))
        {
            return;
        }
        tracing::warn!(
            %team_id, stream, condition = kind.as_str(), detail,
            "a team's stream needs an operator: its messages wait pending without spending \
             attempts until this clears"
        );
        entries.insert(
            key,
            Entry {
                kind: Some(kind),
                detail: detail.to_owned(),
                changed_at: Instant::now(),
            },
        );
    }

    /// The broker took a body (or showed the stream healthy) for a request
    /// sent at `sent_at`: a condition raised before that is over.
    pub(crate) fn clear_condition(&self, team_id: Uuid, stream: &str, sent_at: Instant) {
        let mut entries = self
            .conditions()
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if entries.is_empty() {
            return;
        }
        let Some(entry) = entries.get_mut(&(team_id, stream.to_owned())) else {
            return;
        };
        let Some(kind) = entry.kind else { return };
        if entry.changed_at > sent_at {
            return;
        }
        tracing::info!(
            %team_id, stream, condition = kind.as_str(),
            "a team's stream condition cleared; its waiting messages are published again"
        );
        entry.kind = None;
        entry.changed_at = Instant::now();
    }

    /// Every condition that holds now, as this process last learned it.
    pub fn stream_conditions(&self) -> Vec<StreamCondition> {
        let entries = self
            .conditions()
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<StreamCondition> = entries
            .iter()
            .filter_map(|((team_id, stream), entry)| {
                Some(StreamCondition {
                    team_id: *team_id,
                    stream: stream.clone(),
                    condition: entry.kind?,
                    detail: entry.detail.clone(),
                    since_seconds: entry.changed_at.elapsed().as_secs(),
                })
            })
            .collect();
        all.sort_by(|a, b| (a.team_id, &a.stream).cmp(&(b.team_id, &b.stream)));
        all
    }

    /// The condition of `team_id`'s body stream, if one holds: what the
    /// outbox asks before spending an attempt on a refused publish.
    pub fn body_stream_condition(&self, team_id: Uuid) -> Option<StreamCondition> {
        let stream = body_stream_name(team_id);
        self.stream_conditions()
            .into_iter()
            .find(|c| c.team_id == team_id && c.stream == stream)
    }

    /// Ask the broker about both of `team_id`'s streams (at most once per
    /// [`CHECK_CACHE`]), record what it says, and answer the team's
    /// conditions. A stream that exists clears `stream_missing`; a body
    /// stream with room for a full body clears `stream_full` (a fuller one
    /// may still refuse a large body, so only room for any body clears it).
    /// An unreachable broker is an error: unknown is not missing.
    pub async fn check_team_streams(&self, team_id: Uuid) -> BusResult<Vec<StreamCondition>> {
        let fresh = self
            .conditions()
            .checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&team_id)
            .is_some_and(|at| at.elapsed() < CHECK_CACHE);
        if !fresh {
            let asked_at = Instant::now();
            let (body, inbox) = self.team_streams(team_id).await?;
            let body_name = body_stream_name(team_id);
            match &body {
                None => self.raise_condition(
                    team_id,
                    &body_name,
                    ConditionKind::StreamMissing,
                    "the broker answers that the stream does not exist",
                    asked_at,
                ),
                Some(report) if is_full(report) => self.raise_condition(
                    team_id,
                    &body_name,
                    ConditionKind::StreamFull,
                    &format!(
                        "{} messages / {} bytes of a quota of {} messages / {} bytes",
                        report.messages, report.bytes, report.max_messages, report.max_bytes
                    ),
                    asked_at,
                ),
                Some(report) => {
                    let current = self.body_stream_condition(team_id).map(|c| c.condition);
                    let has_room = has_room_for_a_body(report);
                    if current == Some(ConditionKind::StreamMissing)
                        || (current == Some(ConditionKind::StreamFull) && has_room)
                    {
                        self.clear_condition(team_id, &body_name, asked_at);
                    }
                }
            }
            let inbox_name = inbox_stream_name(team_id);
            match inbox {
                None => self.raise_condition(
                    team_id,
                    &inbox_name,
                    ConditionKind::StreamMissing,
                    "the broker answers that the stream does not exist",
                    asked_at,
                ),
                Some(_) => self.clear_condition(team_id, &inbox_name, asked_at),
            }
            self.conditions()
                .checked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(team_id, asked_at);
        }
        Ok(self
            .stream_conditions()
            .into_iter()
            .filter(|c| c.team_id == team_id)
            .collect())
    }
}

fn is_full(report: &StreamReport) -> bool {
    (report.max_messages > 0 && report.messages >= report.max_messages as u64)
        || (report.max_bytes > 0 && report.bytes >= report.max_bytes as u64)
}

fn has_room_for_a_body(report: &StreamReport) -> bool {
    (report.max_messages <= 0 || report.messages < report.max_messages as u64)
        && (report.max_bytes <= 0
            || report.bytes + REQUIRED_MAX_PAYLOAD as u64 <= report.max_bytes as u64)
}
