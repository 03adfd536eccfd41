//! What is outstanding: a team's (or the installation's) outbox counts, and
//! the per-team report `conversations status` shows.

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::backend::BackendKind;
use crate::error::BusResult;
use crate::store::conversations::Publication;
use crate::store::identity::teams;

/// What is outstanding for a team (O14).
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Status {
    pub pending: i64,
    pub leased: i64,
    pub failed: i64,
    /// Age of the oldest slot not failed.
    pub oldest_pending_seconds: Option<i64>,
    /// Bytes waiting for publication (failed slots excluded).
    pub pending_bytes: i64,
    /// Messages whose last attempt ended without an answer.
    pub uncertain: i64,
}

pub async fn status(pool: &PgPool, team_id: Uuid) -> BusResult<Status> {
    status_of(pool, Some(team_id)).await
}

/// [`status`] over every team: what `/health` reports.
pub async fn installation_status(pool: &PgPool) -> BusResult<Status> {
    status_of(pool, None).await
}

async fn status_of(pool: &PgPool, team_id: Option<Uuid>) -> BusResult<Status> {
    // extract(epoch …) is numeric; cast it rather than decode a numeric.
    let row: (i64, i64, i64, Option<i64>, Option<i64>, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE o.state = 'pending'),
                count(*) FILTER (WHERE o.state = 'leased'),
                count(*) FILTER (WHERE o.state = 'failed'),
                extract(epoch FROM now() - min(o.created_at) FILTER (WHERE o.state <> 'failed'))::bigint,
                sum(o.payload_bytes) FILTER (WHERE o.state <> 'failed')::bigint,
                (SELECT count(*) FROM conversation_messages m
                  WHERE ($1::uuid IS NULL OR m.team_id = $1) AND m.uncertain_at IS NOT NULL)
           FROM conversation_outbox o WHERE ($1::uuid IS NULL OR o.team_id = $1)",
    )
    .bind(team_id)
    .fetch_one(pool)
    .await?;
    Ok(Status {
        pending: row.0,
        leased: row.1,
        failed: row.2,
        oldest_pending_seconds: row.3,
        pending_bytes: row.4.unwrap_or(0),
        uncertain: row.5,
    })
}

/// One conversation's publication, as `conversations status` shows it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ConversationPublication {
    pub conversation_id: Uuid,
    pub title: String,
    pub backend: BackendKind,
    pub publication: Publication,
    /// Seconds writes have been paused for a backend move, if they are.
    pub paused_seconds: Option<i64>,
    pub pending: i64,
    pub failed: i64,
    pub uncertain: i64,
}

/// `conversations status --team T`: the team's routing, its outbox, and every
/// conversation that is not plain synchronous PostgreSQL or has anything
/// outstanding.
#[derive(Clone, Debug, Serialize)]
pub struct TeamPublication {
    pub team: String,
    /// Where new conversations go.
    pub conversation_backend: BackendKind,
    pub outbox: Status,
    pub conversations: Vec<ConversationPublication>,
}

pub async fn team_report(pool: &PgPool, team: &str) -> BusResult<TeamPublication> {
    let found = teams::find(pool, team).await?;
    let conversation_backend: BackendKind =
        sqlx::query_scalar("SELECT conversation_backend FROM teams WHERE id = $1")
            .bind(found.id)
            .fetch_one(pool)
            .await?;
    let outbox = status(pool, found.id).await?;
    let conversations: Vec<ConversationPublication> = sqlx::query_as(
        "SELECT c.id AS conversation_id, c.title, c.backend, c.publication,
                extract(epoch FROM now() - c.write_paused_at)::bigint AS paused_seconds,
                count(o.message_id) FILTER (WHERE o.state <> 'failed') AS pending,
                count(o.message_id) FILTER (WHERE o.state = 'failed') AS failed,
                (SELECT count(*) FROM conversation_messages m
                  WHERE m.team_id = c.team_id AND m.conversation_id = c.id
                    AND m.uncertain_at IS NOT NULL) AS uncertain
           FROM conversations c
           LEFT JOIN conversation_outbox o ON o.conversation_id = c.id
          WHERE c.team_id = $1
          GROUP BY c.id
         HAVING c.backend <> 'postgres' OR c.publication <> 'sync'
             OR c.write_paused_at IS NOT NULL OR count(o.message_id) > 0
          ORDER BY c.created_at",
    )
    .bind(found.id)
    .fetch_all(pool)
    .await?;
    Ok(TeamPublication {
        team: found.slug,
        conversation_backend,
        outbox,
        conversations,
    })
}

/// One team's outbox backlog, for the per-team gauges of `/metrics`.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TeamBacklog {
    pub team: String,
    /// Slots not failed (pending or leased).
    pub pending: i64,
    /// Age of its oldest slot not failed; 0 when none.
    pub oldest_pending_seconds: i64,
}

/// Every team's backlog (teams with none at 0): one row per team, each read
/// from the outbox's `(team_id, state)` index, so the cost follows the
/// number of teams and the backlog, never the history.
pub async fn backlog_by_team(pool: &PgPool) -> BusResult<Vec<TeamBacklog>> {
    let rows = sqlx::query_as(
        "SELECT t.slug AS team,
                count(o.message_id) AS pending,
                COALESCE(extract(epoch FROM now() - min(o.created_at))::bigint, 0)
                    AS oldest_pending_seconds
           FROM teams t
           LEFT JOIN conversation_outbox o
                  ON o.team_id = t.id AND o.state IN ('pending', 'leased')
          GROUP BY t.slug
          ORDER BY t.slug",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows)
}
