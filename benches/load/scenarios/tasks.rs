//! The task queue: `claim_complete` (claim the next task and complete it over
//! MCP) against `pg_claim_complete` (the same claim and complete in raw SQL).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use sqlx::{Connection as _, PgPool};

use super::{Ctx, call_tool};
use crate::harness::{Run, Timing, closed_loop};

/// The most operations per second the queue scenarios provision tasks for:
/// more than this machine does (claim + complete is two commits; raw commits
/// top out near 20k/s on 8 connections), so the queue cannot run dry
/// inside a window. If it does anyway, the run fails and says so.
const RAW_QUEUE_CEILING: f64 = 15_000.0;
const MCP_QUEUE_CEILING: f64 = 4_000.0;

/// How many queued tasks a window of `timing` needs at `ceiling` ops/s
/// (warm-up, window, and a second for the last operations to finish).
fn queue_depth(timing: Timing, ceiling: f64) -> i64 {
    let secs = (timing.warmup + timing.measure).as_secs_f64() + 1.0;
    (secs * ceiling).ceil() as i64
}

/// `claim_next_task` then `complete_task` over MCP, each contender its own
/// window (agent `bench`, session `contender-N`), on tasks queued beforehand.
/// One operation is one task claimed and completed.
pub(super) async fn claim_complete(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let depth = queue_depth(ctx.timing, MCP_QUEUE_CEILING);
    queue_tasks(&ctx.pool, depth).await?;
    closed_loop(clients, ctx.timing, move |index, window| {
        let ctx = ctx.clone();
        async move {
            let session = format!("contender-{index}");
            let client = ctx.connect(Some(&session)).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                let next = call_tool(&client, "claim_next_task", json!({})).await?;
                let Some(key) = next["task"]["key"].as_str() else {
                    bail!(
                        "the queue ran dry ({depth} tasks were queued for this window): {}",
                        next["message"]
                    );
                };
                call_tool(
                    &client,
                    "complete_task",
                    json!({ "key": key, "result": "done by the benchmark" }),
                )
                .await?;
                rec.record(started);
            }
            client.close().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// Queue `depth` fresh open tasks for team `bench`, after setting aside
/// whatever an earlier run left open, so every run starts from the same queue.
async fn queue_tasks(pool: &PgPool, depth: i64) -> Result<()> {
    let (team_id, agent_id): (uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "SELECT t.id, a.id FROM teams t JOIN agents a ON a.team_id = t.id
         WHERE t.slug = 'bench' AND a.name = 'bench'",
    )
    .fetch_one(pool)
    .await
    .context("finding the bench team and agent")?;
    sqlx::query(
        "UPDATE tasks SET status = 'cancelled', holder_agent_id = NULL, holder_session = NULL,
                          lease_expires_at = NULL, claimed_at = NULL, updated_at = now()
         WHERE team_id = $1 AND status IN ('open', 'claimed')",
    )
    .bind(team_id)
    .execute(pool)
    .await
    .context("setting aside an earlier run's tasks")?;
    let prefix = format!("bench-{}", uuid::Uuid::new_v4().simple());
    sqlx::query(
        "INSERT INTO tasks (id, team_id, key, title, created_by, created_session)
         SELECT gen_random_uuid(), $1, $2 || '-' || g, 'benchmark task ' || g, $3, ''
         FROM generate_series(1, $4) AS g",
    )
    .bind(team_id)
    .bind(&prefix)
    .bind(agent_id)
    .bind(depth)
    .execute(pool)
    .await
    .context("queueing the benchmark's tasks")?;
    // Fresh statistics, so the claim query plans as it would on a settled table.
    sqlx::query("VACUUM ANALYZE tasks")
        .execute(pool)
        .await
        .context("VACUUM ANALYZE tasks")?;
    Ok(())
}

/// What PostgreSQL can do for the same queue with nothing in between: each
/// worker on its own connection claims the oldest open row (`FOR UPDATE SKIP
/// LOCKED` + UPDATE, one transaction) and completes it (one UPDATE). One
/// operation is one row claimed and completed, as in `claim_complete`.
pub(super) async fn pg_claim_complete(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let pool = ctx.pool.clone();
    for statement in [
        "CREATE TABLE IF NOT EXISTS bench_queue (
             id bigserial PRIMARY KEY,
             status text NOT NULL DEFAULT 'open',
             holder text,
             lease_expires_at timestamptz,
             result text)",
        "CREATE INDEX IF NOT EXISTS bench_queue_claimable ON bench_queue (id)
             WHERE status IN ('open', 'claimed')",
        "TRUNCATE bench_queue",
    ] {
        sqlx::query(statement)
            .execute(&pool)
            .await
            .context("preparing bench_queue")?;
    }
    let depth = queue_depth(ctx.timing, RAW_QUEUE_CEILING);
    sqlx::query("INSERT INTO bench_queue (status) SELECT 'open' FROM generate_series(1, $1)")
        .bind(depth)
        .execute(&pool)
        .await
        .context("filling bench_queue")?;
    sqlx::query("VACUUM ANALYZE bench_queue")
        .execute(&pool)
        .await
        .context("VACUUM ANALYZE bench_queue")?;
    closed_loop(clients, ctx.timing, move |index, window| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.context("a baseline connection")?;
            let holder = format!("worker-{index}");
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                let mut tx = conn.begin().await.context("baseline BEGIN")?;
                let id: Option<i64> = sqlx::query_scalar(
                    "SELECT id FROM bench_queue
                     WHERE status = 'open' OR (status = 'claimed' AND lease_expires_at <= now())
                     ORDER BY id LIMIT 1
                     FOR UPDATE SKIP LOCKED",
                )
                .fetch_optional(&mut *tx)
                .await
                .context("baseline claim SELECT")?;
                let Some(id) = id else {
                    bail!("bench_queue ran dry ({depth} rows were queued for this window)");
                };
                sqlx::query(
                    "UPDATE bench_queue
                     SET status = 'claimed', holder = $2, lease_expires_at = now() + interval '900 s'
                     WHERE id = $1",
                )
                .bind(id)
                .bind(&holder)
                .execute(&mut *tx)
                .await
                .context("baseline claim UPDATE")?;
                tx.commit().await.context("baseline claim COMMIT")?;
                sqlx::query(
                    "UPDATE bench_queue
                     SET status = 'done', result = $3, holder = NULL, lease_expires_at = NULL
                     WHERE id = $1 AND holder = $2",
                )
                .bind(id)
                .bind(&holder)
                .bind("done by the benchmark")
                .execute(&mut *conn)
                .await
                .context("baseline complete UPDATE")?;
                rec.record(started);
            }
            Ok(rec.finish())
        }
    })
    .await
}
