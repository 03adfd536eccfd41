//! Moving a conversation between backends: `migrate_conversation`, a
//! 10 000-message conversation moved to JetStream and back by the library's
//! move, measured once.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use sqlx::PgPool;

use super::conversations::{seat_conversations_on, seats};
use super::outbox::jetstream_team;
use super::{Ctx, SHORT_BODY};
use crate::harness::Run;

/// Messages in the conversation `migrate_conversation` moves (the figure).
const MIGRATED_MESSAGES: i64 = 10_000;
/// Stored messages are written in batches of this many.
const MIGRATE_BATCH: i64 = 1_000;

/// A conversation move (`conversations migrate --apply`, the library's
/// `moves::run`): a fresh 4-member conversation of [`MIGRATED_MESSAGES`]
/// stored synchronous PostgreSQL messages (each [`SHORT_BODY`] with its
/// SHA-256 and size, 3 receipts, written in raw SQL in batches) on the bench
/// team, its streams provisioned on the run's nats-server, is moved to
/// JetStream and then back to PostgreSQL. Two lines, `direction`
/// `to_jetstream` and `to_postgres`: one operation is one message copied and
/// verified; the time is the whole move (plan, copy, pause, tail, cut over);
/// the latency is the time between successive progress reports (one per
/// message copied; a page read of 200 lands on the next message); `paused_ms`
/// is how long writes to the thread were refused. Measured once, not per
/// client count: a move is one operator's command.
pub(super) async fn migrate_conversation(ctx: Arc<Ctx>) -> Result<Run> {
    use ai_crew_sync::backend::Backends;
    use ai_crew_sync::store::delivery::moves::{self, Direction, Progress};

    // The raw publish baseline ran right before; its rate is on its own line.
    let _ = ctx.own_baseline_ops.lock().expect("not poisoned").take();
    let pool = ctx.pool.clone();
    // The same streams as the drain scenarios, which may have provisioned first.
    let (broker, team_id, agent_id) = jetstream_team(&ctx).await?;
    let conversation =
        seat_conversations_on(&pool, team_id, agent_id, 1, "postgres", "sync").await?[0];
    store_messages(&pool, team_id, agent_id, conversation, MIGRATED_MESSAGES).await?;
    let backends = Backends::with_broker(pool.clone(), broker);

    let mut runs = Vec::new();
    for direction in [Direction::ToJetStream, Direction::ToPostgres] {
        let reports = std::sync::Mutex::new(Vec::with_capacity(MIGRATED_MESSAGES as usize));
        let record = |_: &Progress| reports.lock().expect("not poisoned").push(Instant::now());
        let started = Instant::now();
        let outcome = moves::run(
            &pool,
            &backends,
            team_id,
            conversation,
            direction,
            "bench",
            None,
            &record,
        )
        .await
        .with_context(|| format!("moving the conversation {}", direction.column()))?;
        let elapsed = started.elapsed();
        let reports = reports.into_inner().expect("not poisoned");
        let latencies = std::iter::once(started)
            .chain(reports.iter().copied())
            .zip(reports.iter().copied())
            .map(|(before, after)| after - before)
            .collect();
        let mut run = Run::open_loop(outcome.copied as usize, elapsed, latencies);
        run.migration = Some(crate::harness::Migration {
            direction: direction.column(),
            messages: outcome.copied,
            bytes: outcome.bytes,
            paused_ms: outcome.paused_ms,
        });
        if outcome.copied != MIGRATED_MESSAGES {
            bail!(
                "the move {} copied {} of {MIGRATED_MESSAGES} messages",
                direction.column(),
                outcome.copied
            );
        }
        runs.push(run);
    }
    let back = runs.pop().context("the move back")?;
    let mut there = runs.pop().context("the move there")?;
    there.then = Some(Box::new(back));
    Ok(there)
}

/// Write `n` stored messages into a synchronous PostgreSQL conversation as a
/// send would leave them (gap-free seqs, body with its SHA-256 and size, one
/// stored receipt per recipient seat), in batches of [`MIGRATE_BATCH`].
async fn store_messages(
    pool: &PgPool,
    team_id: uuid::Uuid,
    agent_id: uuid::Uuid,
    conversation: uuid::Uuid,
    n: i64,
) -> Result<()> {
    use sha2::Digest as _;
    let (sender, (rcpt_ids, rcpt_sessions)) = seats(pool, team_id, conversation).await?;
    let digest = sha2::Sha256::digest(SHORT_BODY.as_bytes()).to_vec();
    let mut written = 0;
    while written < n {
        let batch = (n - written).min(MIGRATE_BATCH);
        let mut tx = pool.begin().await?;
        let first: i64 = sqlx::query_scalar(
            "UPDATE conversations SET last_seq = last_seq + $3
             WHERE team_id = $1 AND id = $2 RETURNING last_seq - $3 + 1",
        )
        .bind(team_id)
        .bind(conversation)
        .bind(batch)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "WITH msgs AS (
                 INSERT INTO conversation_messages
                     (id, team_id, conversation_id, seq, sender_member_id, sender_id,
                      sender_session, request_id, body, body_sha256, body_bytes, backend,
                      publication_state)
                 SELECT gen_random_uuid(), $1, $2, $3 + g - 1, $4, $5, 'sender-0',
                        gen_random_uuid(), $6, $7, octet_length($6), 'postgres', 'stored'
                 FROM generate_series(1, $8::bigint) AS g
                 RETURNING id)
             INSERT INTO message_receipts
                 (team_id, message_id, member_id, recipient_id, recipient_session, stored_at)
             SELECT $1, msgs.id, s.member_id, $5, s.session, now()
             FROM msgs, unnest($9::uuid[], $10::text[]) AS s(member_id, session)",
        )
        .bind(team_id)
        .bind(conversation)
        .bind(first)
        .bind(sender)
        .bind(agent_id)
        .bind(SHORT_BODY)
        .bind(&digest)
        .bind(batch)
        .bind(&rcpt_ids)
        .bind(&rcpt_sessions)
        .execute(&mut *tx)
        .await
        .context("storing a batch of messages")?;
        tx.commit().await?;
        written += batch;
    }
    Ok(())
}
