//! What the checks read, as plain data: the history, the database's rows
//! and the team's body stream, loaded once after the quiet period. The
//! checks are pure functions over an [`Input`], so a self-test can feed
//! them a made-up run and see each one fail.

use std::collections::HashMap;

use anyhow::Context as _;
use sha2::Digest as _;
use uuid::Uuid;

use crate::history::Op;
use crate::model::AppliedFault;
use crate::workload::{Fixture, Mode};

/// Everything the checks look at.
pub struct Input {
    pub ops: Vec<Op>,
    pub db: Db,
    /// Every entry of the team's body stream.
    pub stream: Vec<StreamEntry>,
    /// The body stream's name (locators name it).
    pub stream_name: String,
    pub modes: HashMap<Uuid, Mode>,
    pub faults: Vec<AppliedFault>,
    /// The epoch milliseconds of the run's 0 ms.
    pub epoch_at_zero: i64,
}

impl Input {
    /// A run time as epoch milliseconds.
    pub fn epoch_ms(&self, run_ms: u64) -> i64 {
        self.epoch_at_zero + run_ms as i64
    }
}

/// A conversation message as the database holds it.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct StoredMessage {
    pub id: Uuid,
    pub conversation_id: Uuid,
    pub seq: i64,
    /// The sending window's address.
    pub sender: String,
    pub request_id: Uuid,
    pub sha256: String,
    /// `stored`, `pending_publication` or `failed`.
    pub state: String,
    pub locator: Option<String>,
    /// The outbox slot left behind (only a failed one stays).
    pub slot_state: Option<String>,
    pub slot_error: Option<String>,
}

/// One recipient's receipt of a message.
#[derive(Clone, Debug)]
pub struct Receipt {
    pub message_id: Uuid,
    pub window: String,
    pub delivered: bool,
    pub acknowledged: bool,
}

/// A `task_events` row; times in microseconds since the epoch (the
/// database's `now()`, which leases are measured on).
#[derive(Clone, Debug)]
pub struct TaskEvent {
    pub key: String,
    pub at_us: i64,
    /// `created`, `claimed`, `renewed`, `released`, `completed`, `cancelled`.
    pub kind: String,
    pub window: String,
    pub lease_seconds: Option<i64>,
    /// The request_id the change was made under, when the server notes it
    /// in the event's detail.
    pub request_id: Option<String>,
}

/// A channel message.
#[derive(Clone, Debug)]
pub struct ChannelMessage {
    pub id: Uuid,
    pub channel: String,
    pub position: i64,
    pub sender: String,
    pub sha256: String,
    /// The post's request_id as the workload put it in the metadata
    /// (`chaos_request_id`).
    pub request_id: Option<String>,
}

/// A `request_ids` row: a write made under a request_id, committed.
#[derive(Clone, Debug)]
pub struct RequestRow {
    pub window: String,
    pub request_id: String,
    pub tool: String,
    /// The answer stored, reduced as the history keeps answers
    /// ([`crate::workload::compact`]).
    pub answer: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default)]
pub struct Db {
    pub messages: Vec<StoredMessage>,
    /// Each conversation's `last_seq`.
    pub last_seq: HashMap<Uuid, i64>,
    pub receipts: Vec<Receipt>,
    /// In the order they were written.
    pub task_events: Vec<TaskEvent>,
    pub channel_messages: Vec<ChannelMessage>,
    /// Every request_id the server recorded (None: a server without the
    /// `request_ids` table).
    pub requests: Option<Vec<RequestRow>>,
}

/// One entry of the body stream.
#[derive(Clone, Debug)]
pub struct StreamEntry {
    pub sequence: u64,
    /// `Acs-Message-Id`.
    pub message_id: Option<String>,
    /// `Nats-Msg-Id` (the publish key).
    pub publish_key: Option<String>,
    pub sha256: String,
}

/// A window's address (`agent` or `agent/label`) from agent `a` and a
/// session column.
macro_rules! address {
    ($s:literal) => {
        concat!(
            "CASE WHEN ",
            $s,
            " = '' THEN a.name ELSE a.name || '/' || ",
            $s,
            " END"
        )
    };
}

pub async fn load_db(database_url: &str, team_id: Uuid) -> anyhow::Result<Db> {
    let pool = sqlx::PgPool::connect(database_url)
        .await
        .context("connecting to the bus's database")?;
    let messages: Vec<StoredMessage> = sqlx::query_as(concat!(
        "SELECT m.id, m.conversation_id, m.seq, ",
        address!("m.sender_session"),
        " AS sender, m.request_id, encode(m.body_sha256, 'hex') AS sha256,
                m.publication_state AS state, m.canonical_locator AS locator,
                o.state AS slot_state, o.last_error AS slot_error
         FROM conversation_messages m
         JOIN agents a ON a.id = m.sender_id
         LEFT JOIN conversation_outbox o ON o.message_id = m.id
         WHERE m.team_id = $1"
    ))
    .bind(team_id)
    .fetch_all(&pool)
    .await
    .context("reading conversation messages")?;
    let last_seq: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT id, last_seq FROM conversations WHERE team_id = $1")
            .bind(team_id)
            .fetch_all(&pool)
            .await?;
    let receipts: Vec<(Uuid, String, bool, bool)> = sqlx::query_as(concat!(
        "SELECT r.message_id, ",
        address!("r.recipient_session"),
        ", r.delivered_at IS NOT NULL, r.acknowledged_at IS NOT NULL
         FROM message_receipts r JOIN agents a ON a.id = r.recipient_id
         WHERE r.team_id = $1"
    ))
    .bind(team_id)
    .fetch_all(&pool)
    .await
    .context("reading receipts")?;
    type EventRow = (String, i64, String, String, Option<i64>, Option<String>);
    let events: Vec<EventRow> = sqlx::query_as(concat!(
        "SELECT t.key, (extract(epoch FROM e.at) * 1000000)::bigint, e.kind, ",
        address!("e.session"),
        ",
                (e.detail->>'lease_seconds')::bigint, e.detail->>'request_id'
         FROM task_events e JOIN tasks t ON t.id = e.task_id JOIN agents a ON a.id = e.agent_id
         WHERE e.team_id = $1 ORDER BY e.id"
    ))
    .bind(team_id)
    .fetch_all(&pool)
    .await
    .context("reading task events")?;
    type ChannelRow = (Uuid, String, i64, String, String, Option<String>);
    let channel_rows: Vec<ChannelRow> = sqlx::query_as(concat!(
        "SELECT m.id, c.name, m.position, ",
        address!("m.sender_session"),
        ", encode(sha256(convert_to(m.body, 'UTF8')), 'hex'),
                m.metadata->>'chaos_request_id'
         FROM messages m JOIN channels c ON c.id = m.channel_id JOIN agents a ON a.id = m.sender_id
         WHERE m.team_id = $1"
    ))
    .bind(team_id)
    .fetch_all(&pool)
    .await
    .context("reading channel messages")?;
    let requests = load_requests(&pool, team_id).await?;
    pool.close().await;
    Ok(Db {
        requests,
        messages,
        last_seq: last_seq.into_iter().collect(),
        receipts: receipts
            .into_iter()
            .map(|(message_id, window, delivered, acknowledged)| Receipt {
                message_id,
                window,
                delivered,
                acknowledged,
            })
            .collect(),
        task_events: events
            .into_iter()
            .map(
                |(key, at_us, kind, window, lease_seconds, request_id)| TaskEvent {
                    key,
                    at_us,
                    kind,
                    window,
                    lease_seconds,
                    request_id,
                },
            )
            .collect(),
        channel_messages: channel_rows
            .into_iter()
            .map(
                |(id, channel, position, sender, sha256, request_id)| ChannelMessage {
                    id,
                    channel,
                    position,
                    sender,
                    sha256,
                    request_id,
                },
            )
            .collect(),
    })
}

/// The team's `request_ids` rows, if the server keeps them.
async fn load_requests(
    pool: &sqlx::PgPool,
    team_id: Uuid,
) -> anyhow::Result<Option<Vec<RequestRow>>> {
    let kept: bool = sqlx::query_scalar("SELECT to_regclass('request_ids') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !kept {
        return Ok(None);
    }
    let rows: Vec<(String, Uuid, String, Option<serde_json::Value>)> = sqlx::query_as(concat!(
        "SELECT ",
        address!("r.window_label"),
        ", r.request_id, r.tool, r.answer
         FROM request_ids r JOIN agents a ON a.id = r.agent_id
         WHERE r.team_id = $1"
    ))
    .bind(team_id)
    .fetch_all(pool)
    .await
    .context("reading request ids")?;
    Ok(Some(
        rows.into_iter()
            .map(|(window, request_id, tool, answer)| {
                let answer = match (answer, crate::history::OpKind::of_tool(&tool)) {
                    (Some(raw), Some(kind)) => {
                        crate::workload::compact(kind, crate::history::Outcome::Ok { result: raw })
                            .ok()
                            .cloned()
                    }
                    (raw, _) => raw,
                };
                RequestRow {
                    window,
                    request_id: request_id.to_string(),
                    tool,
                    answer,
                }
            })
            .collect(),
    ))
}

/// Every entry of `stream`, read from the first NATS node that answers.
pub async fn load_stream(nats_urls: &[String], stream: &str) -> anyhow::Result<Vec<StreamEntry>> {
    let mut last_error = None;
    for url in nats_urls {
        match read_stream(url, stream).await {
            Ok(entries) => return Ok(entries),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no NATS URL to read {stream} from")))
}

async fn read_stream(url: &str, name: &str) -> anyhow::Result<Vec<StreamEntry>> {
    let client = async_nats::connect(url)
        .await
        .with_context(|| format!("connecting to NATS at {url}"))?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js
        .get_stream(name)
        .await
        .with_context(|| format!("stream {name} at {url}"))?;
    let state = stream.info().await?.state.clone();
    let mut entries = Vec::new();
    if state.messages == 0 {
        return Ok(entries);
    }
    for sequence in state.first_sequence..=state.last_sequence {
        let message = match stream.get_raw_message(sequence).await {
            Ok(message) => message,
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound =>
            {
                continue;
            }
            Err(e) => return Err(e).with_context(|| format!("{name} sequence {sequence}")),
        };
        let header = |h: &str| message.headers.get(h).map(|v| v.as_str().to_string());
        entries.push(StreamEntry {
            sequence,
            message_id: header("Acs-Message-Id"),
            publish_key: header("Nats-Msg-Id"),
            sha256: hex::encode(sha2::Sha256::digest(&message.payload)),
        });
    }
    Ok(entries)
}

/// The input of a run's checks.
pub fn modes(fixture: &Fixture) -> HashMap<Uuid, Mode> {
    fixture
        .conversations
        .iter()
        .map(|c| (c.id, c.mode))
        .collect()
}
