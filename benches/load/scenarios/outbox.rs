//! The outbox drain to JetStream: `outbox_drain_jetstream_backlog` (the
//! drain's capacity) against `conversation_send_outbox` (how fast the same
//! run's clients send into outbox conversations over MCP: a drain at least
//! that fast shrinks every backlog), and `outbox_drain_jetstream` (an offered
//! load of a quarter of that capacity, open loop: acceptance to stored)
//! against the raw publish baseline. Messages are accepted in raw SQL by a
//! [`Feeder`], as `send` writes them.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use sqlx::PgPool;

use ai_crew_sync::backend::jetstream::{Broker, StreamSizes};

use super::conversations::{bench_team, seat_conversations_on, seats};
use super::{Ctx, SHORT_BODY, nats_url};
use crate::harness::Run;

/// The offered load of `outbox_drain_jetstream`, as a fraction of the
/// drain's capacity measured by `outbox_drain_jetstream_backlog` in the same
/// run at the same client count (issue 19: acceptance to stored p99 under
/// 100 ms at a quarter of the capacity).
pub(super) const TARGET_LOAD: f64 = 0.25;
/// The last capacity `outbox_drain_jetstream_backlog` measured, in stored
/// messages per second: what `outbox_drain_jetstream` offers a share of.
static CAPACITY: std::sync::Mutex<Option<f64>> = std::sync::Mutex::new(None);
/// `outbox_drain_jetstream_backlog` accepts this many messages before the
/// drain starts, and times how fast the drain empties the outbox: its
/// capacity, with no feeder competing for PostgreSQL.
const BACKLOG: i64 = 20_000;
/// The feeder writes a batch of accepted messages this often, at most
/// [`FEED_MAX_BATCH`] per tick: a feeder that falls behind offers less
/// (`offered_per_s` says how much), it does not stretch the window.
const FEED_TICK: std::time::Duration = std::time::Duration::from_millis(5);
const FEED_MAX_BATCH: u64 = 1_000;
/// How long the drain may go on after the window to store what was accepted
/// in it; whatever is left then counts with its age at that moment.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The outbox drain to JetStream. `clients` drain workers (`spawn_drain`
/// with `serve`'s settings, each like one replica) publish a 4-member
/// conversation's accepted messages to the run's nats-server and settle them,
/// on a JetStream team with `publication = outbox`.
///
/// `Some(load)`, open loop: a feeder accepts messages at a fixed rate,
/// `load` × the capacity `None` measured before it in the same run (at the
/// same client count), for the window. One
/// operation is one message becoming `stored` inside the window; the latency
/// is acceptance → stored (the message's `created_at` to the `stored_at` its
/// confirmation wrote, both on the database's clock) of every message
/// accepted inside the window, waited for up to [`SETTLE_LIMIT`] after it.
///
/// `None`, capacity: [`BACKLOG`] messages are accepted first, then the drain
/// starts and one operation is one message stored until the outbox is empty
/// (no latency: every message waited from the start).
///
/// Accepting is raw SQL (the message, its 3 receipts and its outbox slot, as
/// `send` writes them, in batches, one wake-up event per batch): the send
/// path is measured by `conversation_send_store`, not here.
pub(super) async fn outbox_drain_jetstream(
    ctx: Arc<Ctx>,
    clients: usize,
    load: Option<f64>,
) -> Result<Run> {
    use ai_crew_sync::backend::Backends;
    use ai_crew_sync::backend::jetstream::body_stream_name;
    use ai_crew_sync::workers::publication::{DrainSettings, spawn_drain};

    let capacity = match load {
        Some(_) => Some(*CAPACITY.lock().expect("not poisoned"))
            .flatten()
            .context(
                "outbox_drain_jetstream offers a share of the drain's capacity: select \
             outbox_drain_jetstream_backlog too, which measures it first",
            )?,
        None => 0.0,
    };
    let pool = ctx.pool.clone();
    let (broker, team_id, agent_id) = jetstream_team(&ctx).await?;
    broker
        .js()
        .get_stream(body_stream_name(team_id))
        .await
        .context("opening the team's body stream")?
        .purge()
        .await
        .context("purging the team's body stream")?;
    let conversation =
        seat_conversations_on(&pool, team_id, agent_id, 1, "jetstream", "outbox").await?[0];
    let feeder = Feeder::new(&pool, team_id, agent_id, conversation).await?;

    let shutdown = tokio_util::sync::CancellationToken::new();
    let bus = ai_crew_sync::Bus::start(
        pool.clone(),
        std::time::Duration::from_secs(30),
        shutdown.clone(),
    )
    .with_backends(Backends::with_broker(pool.clone(), broker));
    // `serve`'s settings; BENCH_DRAIN_LANES overrides the lanes, to compare.
    let mut settings = DrainSettings::default();
    if let Ok(lanes) = std::env::var("BENCH_DRAIN_LANES") {
        settings.lanes = lanes
            .parse()
            .context("BENCH_DRAIN_LANES must be a whole number")?;
    }
    let spawn_workers = || -> Vec<_> {
        (0..clients)
            .map(|_| spawn_drain(bus.clone(), settings.clone(), shutdown.clone()))
            .collect()
    };
    let mut workers = Vec::new();
    let outcome = async {
        let Some(load) = load else {
            let mut accepted = 0;
            while accepted < BACKLOG {
                let n = (BACKLOG - accepted).min(FEED_MAX_BATCH as i64);
                feeder.accept(&pool, n).await?;
                accepted += n;
            }
            let from = db_now(&pool).await?;
            workers = spawn_workers();
            let to = feeder.settled(&pool, SETTLE_LIMIT * 4).await?;
            let stored = feeder.stored_between(&pool, from, to).await?;
            let mut run = Run::open_loop(stored as usize, db_secs(from, to)?, Vec::new());
            run.backlog = Some(BACKLOG);
            *CAPACITY.lock().expect("not poisoned") = Some(run.ops_per_s());
            return Ok(run);
        };
        let rate = (capacity * load).max(1.0);
        workers = spawn_workers();
        let started = Instant::now();
        let measure_from = started + ctx.timing.warmup;
        let deadline = measure_from + ctx.timing.measure;
        let mut window_from = None;
        let mut ticker = tokio::time::interval(FEED_TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut fed = 0u64;
        loop {
            ticker.tick().await;
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if window_from.is_none() && now >= measure_from {
                window_from = Some((db_now(&pool).await?, fed));
            }
            let due = ((now - started).as_secs_f64() * rate) as u64;
            if due > fed {
                let n = (due - fed).min(FEED_MAX_BATCH);
                feeder.accept(&pool, n as i64).await?;
                bus.events.emit(feeder.event());
                // Behind schedule, the feeder offers less rather than bursting.
                fed = if n < due - fed { due } else { fed + n };
            }
        }
        let window_to = db_now(&pool).await?;
        let (window_from, _) = window_from.context("the window never opened")?;
        let (offered, backlog) = feeder
            .offered_and_backlog(&pool, window_from, window_to)
            .await?;
        let until = feeder.settled(&pool, SETTLE_LIMIT).await;
        let stored = feeder.stored_between(&pool, window_from, window_to).await?;
        let latencies = feeder.latencies(&pool, window_from, window_to).await?;
        until?;
        let secs = db_secs(window_from, window_to)?;
        let mut run = Run::open_loop(stored as usize, secs, latencies);
        run.offered_per_s = Some(offered as f64 / secs.as_secs_f64());
        run.backlog = Some(backlog);
        Ok(run)
    }
    .await;
    shutdown.cancel();
    for worker in workers {
        let _ = worker.await;
    }
    // Whatever is left must not be drained into the next run's figures.
    sqlx::query("DELETE FROM conversation_outbox WHERE conversation_id = $1")
        .bind(conversation)
        .execute(&pool)
        .await?;
    outcome
}

/// `send_conversation_message` over MCP into outbox conversations of a
/// JetStream team: `conversation_send` (client `i` as window `sender-i` into
/// its own conversation of 4 members), with `publication = outbox`. The rate
/// a drain must at least match so a backlog always shrinks. The server of the
/// run has no broker, so what is sent stays queued; it is deleted afterwards,
/// so no later drain spends its time on it.
pub(super) async fn conversation_send_outbox(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let (_broker, team_id, agent_id) = jetstream_team(&ctx).await?;
    let conversations =
        seat_conversations_on(&ctx.pool, team_id, agent_id, clients, "jetstream", "outbox").await?;
    let run = super::conversations::send_into(ctx.clone(), conversations.clone()).await;
    sqlx::query("DELETE FROM conversation_outbox WHERE conversation_id = ANY($1)")
        .bind(&conversations)
        .execute(&ctx.pool)
        .await?;
    run
}

/// Connect to the run's nats-server, turn conversations on for team `bench`
/// and provision its streams there (adopting them when an earlier scenario
/// did, with the same sizes): the broker, the team's id and agent `bench`'s.
pub(super) async fn jetstream_team(ctx: &Ctx) -> Result<(Broker, uuid::Uuid, uuid::Uuid)> {
    let broker = Broker::connect(&nats_url(ctx)?, None).await?;
    let (team_id, agent_id) = bench_team(&ctx.pool).await?;
    // The default 100 000 bodies would fill up within a run.
    let sizes = StreamSizes {
        max_messages: 100_000_000,
        ..StreamSizes::default()
    };
    broker.provision_team(team_id, &sizes, true).await?;
    Ok((broker, team_id, agent_id))
}

async fn db_now(pool: &PgPool) -> Result<chrono::DateTime<chrono::Utc>> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .context("reading the database clock")
}

fn db_secs(
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> Result<std::time::Duration> {
    (to - from)
        .to_std()
        .context("the database clock went backwards")
}

/// Accepts messages into one outbox conversation as `send` would, and reads
/// back what became of them.
struct Feeder {
    team_id: uuid::Uuid,
    agent_id: uuid::Uuid,
    conversation: uuid::Uuid,
    sender: uuid::Uuid,
    recipients: (Vec<uuid::Uuid>, Vec<String>),
    digest: Vec<u8>,
}

/// The `stored_at` a message `m`'s confirmation wrote (on each receipt).
macro_rules! stored_at {
    () => {
        "(SELECT r.stored_at FROM message_receipts r
          WHERE r.team_id = m.team_id AND r.message_id = m.id LIMIT 1)"
    };
}

impl Feeder {
    async fn new(
        pool: &PgPool,
        team_id: uuid::Uuid,
        agent_id: uuid::Uuid,
        conversation: uuid::Uuid,
    ) -> Result<Feeder> {
        use sha2::Digest as _;
        let (sender, recipients) = seats(pool, team_id, conversation).await?;
        Ok(Feeder {
            team_id,
            agent_id,
            conversation,
            sender,
            recipients,
            digest: sha2::Sha256::digest(SHORT_BODY.as_bytes()).to_vec(),
        })
    }

    /// Accept `n` messages in one transaction.
    async fn accept(&self, pool: &PgPool, n: i64) -> Result<()> {
        let mut tx = pool.begin().await?;
        let first: i64 = sqlx::query_scalar(
            "UPDATE conversations SET last_seq = last_seq + $3
             WHERE team_id = $1 AND id = $2 RETURNING last_seq - $3 + 1",
        )
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(n)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "WITH msgs AS (
                 INSERT INTO conversation_messages
                     (id, team_id, conversation_id, seq, sender_member_id, sender_id,
                      sender_session, request_id, body, body_sha256, body_bytes, backend,
                      publication_state)
                 SELECT gen_random_uuid(), $1, $2, $3 + g - 1, $4, $5, 'sender-0',
                        gen_random_uuid(), $6, $7, octet_length($6), 'jetstream',
                        'pending_publication'
                 FROM generate_series(1, $8::bigint) AS g
                 RETURNING id),
             receipts AS (
                 INSERT INTO message_receipts
                     (team_id, message_id, member_id, recipient_id, recipient_session)
                 SELECT $1, msgs.id, s.member_id, $5, s.session
                 FROM msgs, unnest($9::uuid[], $10::text[]) AS s(member_id, session))
             INSERT INTO conversation_outbox
                 (message_id, conversation_id, team_id, backend, payload, payload_bytes,
                  publish_key)
             SELECT id, $2, $1, 'jetstream', $6, octet_length($6), gen_random_uuid()
             FROM msgs",
        )
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(first)
        .bind(self.sender)
        .bind(self.agent_id)
        .bind(SHORT_BODY)
        .bind(&self.digest)
        .bind(n)
        .bind(&self.recipients.0)
        .bind(&self.recipients.1)
        .execute(&mut *tx)
        .await
        .context("accepting a batch of messages")?;
        tx.commit().await?;
        Ok(())
    }

    /// What a send into an outbox emits to wake an idle drain.
    fn event(&self) -> ai_crew_sync::events::BusEvent {
        use ai_crew_sync::events::{BusEvent, EventKind};
        let mut event = BusEvent::new(
            self.team_id,
            EventKind::Outbox,
            self.conversation.to_string(),
        );
        event.channel_id = Some(self.conversation);
        event
    }

    /// Wait until the conversation's outbox is empty, at most `limit`;
    /// returns the database's clock then.
    async fn settled(
        &self,
        pool: &PgPool,
        limit: std::time::Duration,
    ) -> Result<chrono::DateTime<chrono::Utc>> {
        let give_up = Instant::now() + limit;
        loop {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM conversation_outbox WHERE conversation_id = $1",
            )
            .bind(self.conversation)
            .fetch_one(pool)
            .await?;
            if left == 0 {
                return db_now(pool).await;
            }
            if Instant::now() > give_up {
                bail!(
                    "{left} message(s) were still in the outbox {}s on",
                    limit.as_secs()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Messages accepted in the window, and slots still queued at its end.
    async fn offered_and_backlog(
        &self,
        pool: &PgPool,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
    ) -> Result<(i64, i64)> {
        Ok(sqlx::query_as(
            "SELECT (SELECT count(*) FROM conversation_messages m
                     WHERE m.team_id = $1 AND m.conversation_id = $2
                       AND m.created_at >= $3 AND m.created_at < $4),
                    (SELECT count(*) FROM conversation_outbox WHERE conversation_id = $2)",
        )
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(from)
        .bind(to)
        .fetch_one(pool)
        .await?)
    }

    /// Messages whose confirmation was written in [from, to).
    async fn stored_between(
        &self,
        pool: &PgPool,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
    ) -> Result<i64> {
        let failed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_messages
             WHERE team_id = $1 AND conversation_id = $2 AND publication_state = 'failed'",
        )
        .bind(self.team_id)
        .bind(self.conversation)
        .fetch_one(pool)
        .await?;
        if failed > 0 {
            bail!("{failed} message(s) failed to publish");
        }
        Ok(sqlx::query_scalar(concat!(
            "SELECT count(*) FROM conversation_messages m
             WHERE m.team_id = $1 AND m.conversation_id = $2 AND ",
            stored_at!(),
            " >= $3 AND ",
            stored_at!(),
            " < $4"
        ))
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(from)
        .bind(to)
        .fetch_one(pool)
        .await?)
    }

    /// Acceptance → stored of each message accepted in [from, to); one not
    /// stored yet counts with its age now.
    async fn latencies(
        &self,
        pool: &PgPool,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<std::time::Duration>> {
        let secs: Vec<f64> = sqlx::query_scalar(concat!(
            "SELECT extract(epoch FROM COALESCE(",
            stored_at!(),
            ", clock_timestamp()) - m.created_at)::float8
             FROM conversation_messages m
             WHERE m.team_id = $1 AND m.conversation_id = $2
               AND m.created_at >= $3 AND m.created_at < $4"
        ))
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(from)
        .bind(to)
        .fetch_all(pool)
        .await?;
        Ok(secs
            .into_iter()
            .map(|s| std::time::Duration::from_secs_f64(s.max(0.0)))
            .collect())
    }
}
