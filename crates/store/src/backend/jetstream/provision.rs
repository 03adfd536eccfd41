//! Provisioning a team's two streams: create them with the bus's layout, or
//! adopt ones an operator created (with replicas 3, a placement, other
//! limits) and leave them as they are unless asked to update their quotas.
//! Replicas are asked for with the sizes (`StreamSizes::replicas`), checked
//! and undone on a refusal in `replicas.rs`.
//!
//! The bus never deletes a stream on its own: removal is an operator command
//! (`team stream --remove`), refused while the team routes bodies there.

use std::time::Duration;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::stream::{Config, DiscardPolicy, Info, RetentionPolicy, StorageType};
use serde::Serialize;
use uuid::Uuid;

use super::{Broker, body_stream_name, inbox_stream_name, token};
use crate::error::{BusError, BusResult};

/// Sizes of a team's streams, and how many copies the cluster keeps.
/// `Default` is the spec's: 2 GiB and 100 000 bodies; inbox references kept
/// 7 days, at most 256 MiB and 1 000 000 of them (a reference is a few
/// hundred bytes; what the inbox drops when full is still owed in
/// PostgreSQL); replicas not asked for.
#[derive(Clone, Debug)]
pub struct StreamSizes {
    pub max_bytes: i64,
    pub max_messages: i64,
    pub inbox_max_age: Duration,
    pub inbox_max_bytes: i64,
    pub inbox_max_messages: i64,
    /// Replicas of both streams (1, 3 or 5). `None`: a new stream gets 1 and
    /// an existing one keeps its own, with or without `--update-quotas`.
    pub replicas: Option<usize>,
}

impl Default for StreamSizes {
    fn default() -> Self {
        Self {
            max_bytes: 2 * 1024 * 1024 * 1024,
            max_messages: 100_000,
            inbox_max_age: Duration::from_secs(7 * 24 * 3600),
            inbox_max_bytes: 256 * 1024 * 1024,
            inbox_max_messages: 1_000_000,
            replicas: None,
        }
    }
}

/// Largest single inbox reference: ids, a seq and two short names in JSON.
pub const INBOX_MESSAGE_MAX_BYTES: i32 = 64 * 1024;

/// Largest single body message the body stream takes: a 1 MiB body plus
/// headers, with room to spare.
pub const BODY_MESSAGE_MAX_BYTES: i32 = 2 * 1024 * 1024;

/// How long the broker remembers a `Nats-Msg-Id`. Longer than NATS's 2 min
/// default because an uncertain publish is re-presented by the reconciler
/// (every 30 s) after the publish timeout, and a broker restart in between
/// must not push the second presentation outside the window — outside it,
/// the body would be stored twice.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(15 * 60);

/// What `team stream` reports for each stream.
#[derive(Clone, Debug, Serialize)]
pub struct StreamReport {
    pub name: String,
    /// `created`, `adopted` (existed, left as it was) or `updated` (existed,
    /// quotas updated).
    pub state: &'static str,
    /// On an adopted stream: each size limit it keeps that differs from the
    /// one asked for (or the default), as `limit: kept N, asked M`. Only
    /// `--update-quotas` applies them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quotas_not_applied: Vec<String>,
    pub subjects: Vec<String>,
    pub retention: String,
    pub replicas: usize,
    pub max_bytes: i64,
    pub max_messages: i64,
    pub max_message_size: i32,
    pub max_age_seconds: u64,
    pub allow_direct: bool,
    pub messages: u64,
    pub bytes: u64,
    /// The broker's creation time of the stream: its identity. A stream
    /// deleted and created again under the same name has a new one (and
    /// holds none of the old bodies); a restart or a restore keeps it.
    pub created: chrono::DateTime<chrono::Utc>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TeamStreams {
    pub team_id: Uuid,
    pub body: StreamReport,
    pub inbox: StreamReport,
}

impl StreamReport {
    fn new(info: &Info, state: &'static str) -> Self {
        let c = &info.config;
        Self {
            name: c.name.clone(),
            state,
            quotas_not_applied: Vec::new(),
            subjects: c.subjects.clone(),
            retention: format!("{:?}", c.retention).to_lowercase(),
            replicas: c.num_replicas,
            max_bytes: c.max_bytes,
            max_messages: c.max_messages,
            max_message_size: c.max_message_size,
            max_age_seconds: c.max_age.as_secs(),
            allow_direct: c.allow_direct,
            messages: info.state.messages,
            bytes: info.state.bytes,
            created: created_at(info),
        }
    }
}

/// The stream's creation time (async-nats gives a `time` date) as the
/// chrono one the rest of the bus and sqlx use.
fn created_at(info: &Info) -> chrono::DateTime<chrono::Utc> {
    let nanos = info.created.unix_timestamp_nanos();
    chrono::DateTime::from_timestamp_nanos(i64::try_from(nanos).unwrap_or(i64::MAX))
}

pub(super) fn body_config(team_id: Uuid, sizes: &StreamSizes) -> Config {
    Config {
        name: body_stream_name(team_id),
        description: Some("ai-crew-sync conversation bodies".into()),
        subjects: vec![format!("acs.{}.conv.*", token(team_id))],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        // Full means refuse the new body, never drop an old one: history
        // that PostgreSQL points at must not vanish to make room.
        discard: DiscardPolicy::New,
        max_bytes: sizes.max_bytes,
        max_messages: sizes.max_messages,
        max_message_size: BODY_MESSAGE_MAX_BYTES,
        duplicate_window: DUPLICATE_WINDOW,
        allow_direct: true,
        num_replicas: sizes.replicas.unwrap_or(1),
        ..Default::default()
    }
}

pub(super) fn inbox_config(team_id: Uuid, sizes: &StreamSizes) -> Config {
    Config {
        name: inbox_stream_name(team_id),
        description: Some("ai-crew-sync inbox references".into()),
        subjects: vec![format!("acsi.{}.inbox.*", token(team_id))],
        storage: StorageType::File,
        // A reference goes once its window acked it; one consumer per
        // window, each on its own subject, as work-queue streams require.
        retention: RetentionPolicy::WorkQueue,
        // What expires here is rebuilt from PostgreSQL, which never expires
        // what is owed; so the inbox may drop its oldest when full.
        discard: DiscardPolicy::Old,
        max_age: sizes.inbox_max_age,
        max_bytes: sizes.inbox_max_bytes,
        max_messages: sizes.inbox_max_messages,
        max_message_size: INBOX_MESSAGE_MAX_BYTES,
        duplicate_window: DUPLICATE_WINDOW.min(sizes.inbox_max_age),
        num_replicas: sizes.replicas.unwrap_or(1),
        ..Default::default()
    }
}

fn check_sizes(sizes: &StreamSizes) -> BusResult<()> {
    if sizes.max_bytes < 16 * 1024 * 1024 {
        return Err(BusError::invalid(format!(
            "--max-bytes {} is too small: the body stream must hold at least 16 MiB \
             (16 full bodies). The default is 2 GiB.",
            sizes.max_bytes
        )));
    }
    if sizes.max_messages < 1 {
        return Err(BusError::invalid(
            "--max-messages must be at least 1 (the default is 100000).",
        ));
    }
    if sizes.inbox_max_age < Duration::from_secs(3600) {
        return Err(BusError::invalid(
            "--inbox-max-age-hours must be at least 1 (the default is 168, 7 days).",
        ));
    }
    if sizes.inbox_max_bytes < 1024 * 1024 {
        return Err(BusError::invalid(format!(
            "--inbox-max-bytes {} is too small: the inbox stream must hold at least 1 MiB \
             (some thousands of references). The default is 256 MiB.",
            sizes.inbox_max_bytes
        )));
    }
    if let Some(replicas) = sizes.replicas
        && !super::replicas::ALLOWED.contains(&replicas)
    {
        return Err(BusError::invalid(format!(
            "--replicas {replicas} is not one the bus uses: a team's streams take 1, 3 or 5 \
             replicas (an odd count, so a majority is left when a server is lost). The \
             default is 1."
        )));
    }
    if sizes.inbox_max_messages < 1000 {
        return Err(BusError::invalid(format!(
            "--inbox-max-messages {} is too small: the inbox stream must hold at least 1000 \
             references. The default is 1000000.",
            sizes.inbox_max_messages
        )));
    }
    Ok(())
}

/// Stream subjects as a refusal names them: `a`, `b` (or "none").
fn subject_list(subjects: &[String]) -> String {
    if subjects.is_empty() {
        return "none".into();
    }
    subjects
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn broker_error(what: &str, err: &dyn std::fmt::Display) -> BusError {
    BusError::unavailable(format!(
        "the broker did not complete {what} ({err}); nothing else was changed, try again"
    ))
}

/// The size limits `asked` sets differently from `kept`, as
/// `limit: kept N, asked M`.
fn quota_differences(kept: &Config, asked: &Config) -> Vec<String> {
    let mut differences = Vec::new();
    let mut compare = |limit: &str, kept: String, asked: String| {
        if kept != asked {
            differences.push(format!("{limit}: kept {kept}, asked {asked}"));
        }
    };
    compare(
        "max_bytes",
        kept.max_bytes.to_string(),
        asked.max_bytes.to_string(),
    );
    compare(
        "max_messages",
        kept.max_messages.to_string(),
        asked.max_messages.to_string(),
    );
    compare(
        "max_message_size",
        kept.max_message_size.to_string(),
        asked.max_message_size.to_string(),
    );
    compare(
        "max_age_seconds",
        kept.max_age.as_secs().to_string(),
        asked.max_age.as_secs().to_string(),
    );
    compare(
        "replicas",
        kept.num_replicas.to_string(),
        asked.num_replicas.to_string(),
    );
    differences
}

impl Broker {
    /// Create the team's body and inbox streams, or adopt existing ones. An
    /// adopted stream keeps its replicas, placement and limits; with
    /// `update_quotas` its size limits (body: bytes, messages, message size;
    /// inbox: max age, bytes, messages, message size) are set to `sizes`,
    /// and its replicas raised to `sizes.replicas` when given (never
    /// lowered: refused). Without it, the report names every limit left
    /// different from `sizes` (`quotas_not_applied`), so a flag is never
    /// ignored silently.
    ///
    /// A refusal changes nothing: replicas the server cannot place are
    /// refused before anything is written when it is not clustered, and
    /// otherwise by the broker on the inbox stream, which goes first (what
    /// it holds PostgreSQL rebuilds), so the change to it is undone if the
    /// body stream is then refused.
    pub async fn provision_team(
        &self,
        team_id: Uuid,
        sizes: &StreamSizes,
        update_quotas: bool,
    ) -> BusResult<TeamStreams> {
        check_sizes(sizes)?;
        let body_wanted = body_config(team_id, sizes);
        let inbox_wanted = inbox_config(team_id, sizes);
        let body_found = self.stream_info(&body_wanted.name).await?;
        let inbox_found = self.stream_info(&inbox_wanted.name).await?;
        self.check_replicas(
            sizes.replicas,
            update_quotas,
            [&body_found, &inbox_found].into_iter().flatten(),
        )?;
        let inbox_before = inbox_found.as_ref().map(|i| i.config.clone());
        let inbox = self
            .ensure_stream(inbox_wanted, inbox_found, update_quotas, |c| {
                c.max_age = sizes.inbox_max_age;
                c.max_bytes = sizes.inbox_max_bytes;
                c.max_messages = sizes.inbox_max_messages;
                c.max_message_size = INBOX_MESSAGE_MAX_BYTES;
                if let Some(replicas) = sizes.replicas {
                    c.num_replicas = replicas;
                }
            })
            .await?;
        let body = self
            .ensure_stream(body_wanted, body_found, update_quotas, |c| {
                c.max_bytes = sizes.max_bytes;
                c.max_messages = sizes.max_messages;
                c.max_message_size = BODY_MESSAGE_MAX_BYTES;
                if let Some(replicas) = sizes.replicas {
                    c.num_replicas = replicas;
                }
            })
            .await;
        let body = match body {
            Ok(body) => body,
            Err(refused) => return Err(self.undo(&inbox, inbox_before, refused).await),
        };
        Ok(TeamStreams {
            team_id,
            body,
            inbox,
        })
    }

    async fn ensure_stream(
        &self,
        wanted: Config,
        found: Option<Info>,
        update_quotas: bool,
        quotas: impl Fn(&mut Config),
    ) -> BusResult<StreamReport> {
        let name = wanted.name.clone();
        let replicas = wanted.num_replicas;
        let Some(info) = found else {
            let mut created = self
                .js()
                .create_stream(wanted)
                .await
                .map_err(|e| self.refused(&format!("creating stream {name}"), replicas, &e))?;
            let info = created
                .info()
                .await
                .map_err(|e| broker_error(&format!("reading stream {name}"), &e))?;
            return Ok(StreamReport::new(info, "created"));
        };
        // Adopting a stream that does not take the team's subjects would
        // route every body into nothing.
        if info.config.subjects != wanted.subjects {
            return Err(BusError::conflict(format!(
                "stream {name} exists on the broker with subjects {}, not {}, so the bus \
                 cannot adopt it. Fix its subjects (nats stream edit {name}) or remove it.",
                subject_list(&info.config.subjects),
                subject_list(&wanted.subjects)
            )));
        }
        let mut config = info.config.clone();
        quotas(&mut config);
        if !update_quotas {
            let mut report = StreamReport::new(&info, "adopted");
            report.quotas_not_applied = quota_differences(&info.config, &config);
            return Ok(report);
        }
        if config == info.config {
            return Ok(StreamReport::new(&info, "adopted"));
        }
        let replicas = config.num_replicas;
        let updated = self.js().update_stream(config).await.map_err(|e| {
            self.refused(
                &format!("updating the quotas of stream {name}"),
                replicas,
                &e,
            )
        })?;
        Ok(StreamReport::new(&updated, "updated"))
    }

    /// The stream's info, `None` when the broker says it does not exist.
    pub(super) async fn stream_info(&self, name: &str) -> BusResult<Option<Info>> {
        match self.js().get_stream(name).await {
            Ok(mut stream) => Ok(Some(
                stream
                    .info()
                    .await
                    .map_err(|e| broker_error(&format!("reading stream {name}"), &e))?
                    .clone(),
            )),
            Err(e) => match e.kind() {
                GetStreamErrorKind::JetStream(js) if js.error_code().0 == 10059 => Ok(None),
                _ => Err(broker_error(&format!("reading stream {name}"), &e)),
            },
        }
    }

    /// Both of the team's streams, as they are now (`None` for a missing one).
    pub async fn team_streams(
        &self,
        team_id: Uuid,
    ) -> BusResult<(Option<StreamReport>, Option<StreamReport>)> {
        let body = self.stream_info(&body_stream_name(team_id)).await?;
        let inbox = self.stream_info(&inbox_stream_name(team_id)).await?;
        Ok((
            body.map(|i| StreamReport::new(&i, "adopted")),
            inbox.map(|i| StreamReport::new(&i, "adopted")),
        ))
    }

    /// Whether both of the team's streams exist on this broker.
    pub async fn team_streams_exist(&self, team_id: Uuid) -> BusResult<bool> {
        Ok(self
            .stream_info(&body_stream_name(team_id))
            .await?
            .is_some()
            && self
                .stream_info(&inbox_stream_name(team_id))
                .await?
                .is_some())
    }

    /// Delete both of the team's streams, bodies and references with them.
    /// Returns the names that existed and were removed. The caller checks
    /// that nothing routes there first (`store::identity::teams::jetstream_routing`).
    pub async fn remove_team_streams(&self, team_id: Uuid) -> BusResult<Vec<String>> {
        let mut removed = Vec::new();
        for name in [body_stream_name(team_id), inbox_stream_name(team_id)] {
            match self.js().delete_stream(&name).await {
                Ok(_) => removed.push(name),
                Err(e) => {
                    let missing = matches!(
                        e.kind(),
                        async_nats::jetstream::context::DeleteStreamErrorKind::JetStream(ref js)
                            if js.error_code().0 == 10059
                    );
                    if !missing {
                        return Err(broker_error(&format!("removing stream {name}"), &e));
                    }
                }
            }
        }
        Ok(removed)
    }
}
