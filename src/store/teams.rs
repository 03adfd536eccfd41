//! Teams: the tenant. Everything else belongs to exactly one team.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use super::{Actor, audit, check_display_name, normalize_team_slug};
use crate::error::{BusError, BusResult};

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Team {
    pub id: Uuid,
    pub slug: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct TeamSummary {
    pub id: Uuid,
    pub slug: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub agents: i64,
}

pub async fn create(pool: &PgPool, slug: &str, name: &str, actor: &Actor) -> BusResult<Team> {
    let slug = normalize_team_slug(slug)?;
    let name = check_display_name("team name", name)?;
    let mut tx = pool.begin().await?;
    let team: Option<Team> = sqlx::query_as(
        "INSERT INTO teams (id, slug, name) VALUES ($1, $2, $3)
         ON CONFLICT (slug) DO NOTHING
         RETURNING id, slug, name, created_at",
    )
    .bind(Uuid::new_v4())
    .bind(&slug)
    .bind(&name)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(team) = team else {
        return Err(BusError::conflict(format!(
            "team `{slug}` already exists. Pick another slug, or add agents to it with \
             `ai-crew-sync agent add --team {slug} --name NAME`."
        )));
    };
    audit::record(
        &mut tx,
        Some(team.id),
        actor,
        "team.create",
        &team.slug,
        json!({ "name": team.name }),
    )
    .await?;
    tx.commit().await?;
    Ok(team)
}

pub async fn list(pool: &PgPool) -> BusResult<Vec<TeamSummary>> {
    Ok(sqlx::query_as(
        "SELECT t.id, t.slug, t.name, t.created_at,
                (SELECT count(*) FROM agents a WHERE a.team_id = t.id) AS agents
         FROM teams t ORDER BY t.slug",
    )
    .fetch_all(pool)
    .await?)
}

/// How many teams exist (`serve` says how to make the first one).
pub async fn count(pool: &PgPool) -> BusResult<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM teams")
        .fetch_one(pool)
        .await?)
}

/// The team with this slug, or a not-found that says how to see the real ones.
pub async fn find(db: impl PgExecutor<'_>, slug: &str) -> BusResult<Team> {
    let slug = normalize_team_slug(slug)?;
    sqlx::query_as("SELECT id, slug, name, created_at FROM teams WHERE slug = $1")
        .bind(&slug)
        .fetch_optional(db)
        .await?
        .ok_or_else(|| {
            BusError::not_found(format!(
                "no team `{slug}`. `ai-crew-sync team list` shows the teams; \
                 `ai-crew-sync team create --slug {slug} --name NAME` creates it."
            ))
        })
}

/// A team's switches, as `team capability` shows them.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Capabilities {
    pub team: String,
    pub conversations: bool,
    /// The backend new conversations are created on.
    pub conversation_backend: String,
}

/// `team capability --team T [--conversations on|off]`: show, or switch the
/// conversation tools on or off (audited when it changes).
pub async fn capability(
    pool: &PgPool,
    slug: &str,
    conversations: Option<bool>,
    actor: &Actor,
) -> BusResult<Capabilities> {
    let mut tx = pool.begin().await?;
    let team = find(&mut *tx, slug).await?;
    if let Some(on) = conversations {
        let changed = sqlx::query(
            "UPDATE teams SET conversations_enabled = $2 WHERE id = $1 AND conversations_enabled <> $2",
        )
        .bind(team.id)
        .bind(on)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed > 0 {
            audit::record(
                &mut tx,
                Some(team.id),
                actor,
                "team.capability",
                &team.slug,
                json!({ "conversations": on }),
            )
            .await?;
        }
    }
    let caps = sqlx::query_as(
        "SELECT slug AS team, conversations_enabled AS conversations, conversation_backend
         FROM teams WHERE id = $1",
    )
    .bind(team.id)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(caps)
}
