//! After a move: dropping the PostgreSQL copies of bodies moved to
//! jetstream, once the rollback window an operator states has passed
//! (`conversations cleanup`).

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::{BusError, BusResult};

/// The messages `cleanup` may release; `$1` team, `$2` window in seconds.
macro_rules! cleanable {
    () => {
        "m.team_id = $1 AND m.backend = 'jetstream' AND m.body <> ''
         AND m.canonical_locator IS NOT NULL AND m.publication_state = 'stored'
         AND (SELECT g.direction = 'to_jetstream'
                     AND g.cut_over_at < now() - make_interval(secs => $2)
                FROM conversation_migrations g
               WHERE g.conversation_id = m.conversation_id AND g.state = 'cut_over'
               ORDER BY g.cut_over_at DESC LIMIT 1)
         -- Never under an open move: a move back writes bodies into these
         -- rows before its cutover makes them the record.
         AND NOT EXISTS (SELECT 1 FROM conversation_migrations o
                          WHERE o.conversation_id = m.conversation_id
                            AND o.state IN ('planned', 'copying', 'verified'))"
    };
}

/// What `conversations cleanup` found (and, with `--apply`, released).
#[derive(Clone, Debug, Serialize)]
pub struct Cleanup {
    pub rollback_window_hours: i64,
    pub messages: i64,
    pub bytes: i64,
    pub applied: bool,
}

/// Drop source bodies a finished move no longer needs (M14): only messages
/// on jetstream with a locator, of conversations whose latest cut-over move
/// went to jetstream and finished longer ago than the rollback window.
/// Deliberately explicit and late.
pub async fn cleanup(
    pool: &PgPool,
    team_id: Uuid,
    rollback_window_hours: i64,
    apply: bool,
) -> BusResult<Cleanup> {
    if rollback_window_hours < 0 {
        return Err(BusError::invalid(format!(
            "--rollback-window-hours {rollback_window_hours} is negative: the window is how long \
             a finished move must have been cut over before its source bodies may be dropped. \
             Use 0 or more (default 168)."
        )));
    }
    let window_secs = (rollback_window_hours.saturating_mul(3600)) as f64;
    let (messages, bytes): (i64, i64) = sqlx::query_as(concat!(
        "SELECT count(*), COALESCE(sum(octet_length(m.body)), 0)::bigint
           FROM conversation_messages m
          WHERE ",
        cleanable!()
    ))
    .bind(team_id)
    .bind(window_secs)
    .fetch_one(pool)
    .await?;
    if apply && messages > 0 {
        sqlx::query(concat!(
            "UPDATE conversation_messages m SET body = '' WHERE ",
            cleanable!()
        ))
        .bind(team_id)
        .bind(window_secs)
        .execute(pool)
        .await?;
    }
    Ok(Cleanup {
        rollback_window_hours,
        messages,
        bytes,
        applied: apply,
    })
}
