//! The baselines every figure is read against, when they are not one area's
//! own: `pg_insert_commit` (every scenario's yardstick, always run) and
//! `jetstream_publish_256` (raw broker publishes, the outbox drain's and the
//! move's). An area's own raw-SQL baseline lives beside its scenario.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use sqlx::PgPool;

use super::{Ctx, SHORT_BODY, nats_url};
use crate::harness::{Run, Timing, closed_loop};

/// What the machine's PostgreSQL can commit at all: one single-row INSERT per
/// transaction (autocommit), each worker on its own connection. Every write
/// the bus makes costs at least this, so it is the yardstick.
pub async fn pg_insert_commit(pool: PgPool, timing: Timing, clients: usize) -> Result<Run> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_baseline (id bigserial PRIMARY KEY, payload text)",
    )
    .execute(&pool)
    .await
    .context("creating bench_baseline")?;
    closed_loop(clients, timing, move |_, window| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.context("a baseline connection")?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                sqlx::query("INSERT INTO bench_baseline (payload) VALUES ($1)")
                    .bind("a short payload, about the size of a small message body")
                    .execute(&mut *conn)
                    .await
                    .context("baseline INSERT")?;
                rec.record(started);
            }
            Ok(rec.finish())
        }
    })
    .await
}

/// The name of the raw JetStream baseline's lines.
pub(super) const JETSTREAM_BASELINE: &str = "jetstream_publish_256";
/// Publishes the raw baseline keeps in flight, split over its clients: the
/// same window the drain keeps (`DrainSettings::in_flight`).
const BASELINE_IN_FLIGHT: usize = 256;

/// What the broker's own client can do with nothing in between: raw
/// async-nats JetStream publishes, [`BASELINE_IN_FLIGHT`] awaiting their
/// PubAck at any time (split over the clients, one connection), to a stream
/// laid out like a team's body stream (file storage, limits, discard new, the
/// same duplicate window, subjects `<prefix>.<team>.conv.<conversation>`),
/// each with a fresh `Nats-Msg-Id` and the bus's three `Acs-*` headers. One
/// operation is one PubAck; its latency is publish → PubAck.
pub(super) async fn jetstream_publish(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    use ai_crew_sync::backend::jetstream::DEFAULT_TIMEOUT;
    use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};

    let url = nats_url(&ctx)?;
    let client = async_nats::ConnectOptions::new()
        .name("bench-raw")
        .connect(&url)
        .await
        .context("connecting the raw baseline's NATS client")?;
    let js = async_nats::jetstream::ContextBuilder::new()
        .timeout(DEFAULT_TIMEOUT)
        .build(client);
    let team = uuid::Uuid::new_v4().simple().to_string();
    let name = "BENCH_RAW";
    // A fresh, empty stream every time, as the drain's is purged.
    let _ = js.delete_stream(name).await;
    js.create_stream(Config {
        name: name.into(),
        subjects: vec![format!("acsraw.{team}.conv.*")],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        discard: DiscardPolicy::New,
        max_bytes: 2 * 1024 * 1024 * 1024,
        max_messages: -1,
        max_message_size: 2 * 1024 * 1024,
        // As the body stream (provision.rs, DUPLICATE_WINDOW): the broker
        // remembers every Nats-Msg-Id this long, which costs the same here.
        duplicate_window: std::time::Duration::from_secs(15 * 60),
        allow_direct: true,
        num_replicas: 1,
        ..Default::default()
    })
    .await
    .context("creating the raw baseline's stream")?;
    let per_client = (BASELINE_IN_FLIGHT / clients).max(1);
    closed_loop(clients, ctx.timing, move |_, window| {
        let js = js.clone();
        let subject = format!("acsraw.{team}.conv.{}", uuid::Uuid::new_v4().simple());
        let (team_id, conversation_id) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        async move {
            let mut in_flight = futures::stream::FuturesUnordered::new();
            let mut rec = window.open().await;
            loop {
                while rec.is_open() && in_flight.len() < per_client {
                    let mut headers = async_nats::HeaderMap::new();
                    let key = uuid::Uuid::new_v4().to_string();
                    headers.insert(async_nats::header::NATS_MESSAGE_ID, key.as_str());
                    let message_id = uuid::Uuid::new_v4().to_string();
                    headers.insert("Acs-Message-Id", message_id.as_str());
                    headers.insert("Acs-Conversation-Id", conversation_id.to_string().as_str());
                    headers.insert("Acs-Team-Id", team_id.to_string().as_str());
                    let started = Instant::now();
                    let ack = js
                        .publish_with_headers(subject.clone(), headers, SHORT_BODY.into())
                        .await
                        .context("a raw JetStream publish")?;
                    in_flight.push(async move { ack.await.map(|_| started) });
                }
                match futures::StreamExt::next(&mut in_flight).await {
                    Some(acked) => rec.record(acked.context("a raw JetStream PubAck")?),
                    None => break,
                }
            }
            Ok(rec.finish())
        }
    })
    .await
}
