//! Path reservations: `check_paths` of 50 paths against 1 000 live
//! reservations of one project (issue 37's cost promise: a check is bounded
//! by the project's live reservations, < 5 ms at p99).
//!
//! The reservations are written in SQL beforehand, held by 100 windows of
//! agent `bench` in the project the checkers name none of (`''`): 900 anchored
//! patterns over 100 directories (files, directories, `**`, classes) and 100
//! unanchored ones (`**/*.gen17`: no literal prefix, so every path is
//! matched against them). Each checker is a window of its own asking about
//! 50 paths, a tenth of them covered.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use sqlx::PgPool;

use super::{Ctx, call_tool};
use crate::harness::{Run, closed_loop};

const RESERVATIONS: i64 = 1_000;
const PATHS_PER_CHECK: usize = 50;

/// One op = one `check_paths` of 50 paths.
pub(super) async fn check_paths(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    seed(&ctx.pool).await?;
    closed_loop(clients, ctx.timing, move |index, window| {
        let ctx = ctx.clone();
        async move {
            let session = format!("checker-{index}");
            let client = ctx.connect(Some(&session)).await?;
            let paths: Vec<String> = (0..PATHS_PER_CHECK)
                .map(|i| {
                    let dir = (i * 7 + index) % 100;
                    if i % 10 == 0 {
                        format!("src/area{dir}/file3.rs")
                    } else {
                        format!("src/area{dir}/free/file{i}.txt")
                    }
                })
                .collect();
            let args = json!({ "paths": paths });
            let first = call_tool(&client, "check_paths", args.clone()).await?;
            if first["paths"].as_array().map(Vec::len) != Some(PATHS_PER_CHECK) {
                bail!("check_paths answered another number of paths: {first}");
            }
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                call_tool(&client, "check_paths", args.clone()).await?;
                rec.record(started);
            }
            client.close().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// 1 000 live reservations in project `''` of team `bench`, replacing an
/// earlier run's.
async fn seed(pool: &PgPool) -> Result<()> {
    let (team_id, agent_id): (uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "SELECT t.id, a.id FROM teams t JOIN agents a ON a.team_id = t.id
         WHERE t.slug = 'bench' AND a.name = 'bench'",
    )
    .fetch_one(pool)
    .await
    .context("finding the bench team and agent")?;
    sqlx::query("DELETE FROM path_reservations WHERE team_id = $1")
        .bind(team_id)
        .execute(pool)
        .await
        .context("clearing an earlier run's reservations")?;
    // Nine shapes over 100 directories, then 100 unanchored patterns.
    sqlx::query(
        "INSERT INTO path_reservations
             (team_id, project, holder_agent_id, holder_session, pattern, exclusive, reason,
              expires_at)
         SELECT $1, '', $2, 'holder-' || (g % 100),
                CASE WHEN g > 900 THEN '**/*.gen' || g
                     ELSE 'src/area' || (g % 100) || (ARRAY[
                       '/file3.rs', '/mod' || g || '.rs', '/sub' || g || '/**',
                       '/[ab]' || g || '.rs', '/t' || g || '/*.rs', '/**/x' || g || '.rs',
                       '/doc' || g, '/?' || g || '.md', '/cfg' || g || '/**/*.toml'
                     ])[1 + g % 9]
                END,
                g % 3 = 0, 'benchmark reservation', now() + interval '1 day'
         FROM generate_series(1, $3) AS g",
    )
    .bind(team_id)
    .bind(agent_id)
    .bind(RESERVATIONS)
    .execute(pool)
    .await
    .context("seeding the reservations")?;
    sqlx::query("VACUUM ANALYZE path_reservations")
        .execute(pool)
        .await
        .context("VACUUM ANALYZE path_reservations")?;
    Ok(())
}
