//! Teams: the tenant. Everything else belongs to exactly one team.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::{Encode, PgConnection, PgExecutor, PgPool, Postgres, Transaction, Type};
use uuid::Uuid;

use crate::backend::BackendKind;
use crate::backend::jetstream::{Broker, StreamSizes, TeamStreams};
use crate::error::{BusError, BusResult};
use crate::store::identity::admin::{Authority, GlobalScope};
use crate::store::{Actor, check_display_name, identity::audit, normalize_team_slug};

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

/// A new team: a global operation.
pub async fn create(
    pool: &PgPool,
    global: &GlobalScope,
    slug: &str,
    name: &str,
) -> BusResult<Team> {
    let actor = global.actor();
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

/// The teams this authority may see: all, or a scoped credential's own.
pub async fn list(pool: &PgPool, authority: &Authority) -> BusResult<Vec<TeamSummary>> {
    let mut all: Vec<TeamSummary> = sqlx::query_as(
        "SELECT t.id, t.slug, t.name, t.created_at,
                (SELECT count(*) FROM agents a WHERE a.team_id = t.id) AS agents
         FROM teams t ORDER BY t.slug",
    )
    .fetch_all(pool)
    .await?;
    if let Some(own) = authority.confined_to() {
        all.retain(|t| t.id == own);
    }
    Ok(all)
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
    pub conversation_backend: BackendKind,
}

/// Commit `tx`, answering the team's switches as it leaves them.
async fn commit_capabilities(
    mut tx: Transaction<'_, Postgres>,
    team_id: Uuid,
) -> BusResult<Capabilities> {
    let caps = sqlx::query_as(
        "SELECT slug AS team, conversations_enabled AS conversations, conversation_backend
         FROM teams WHERE id = $1",
    )
    .bind(team_id)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(caps)
}

/// Set one of `team`'s switches: `update` ($1 the team, $2 the value)
/// changes the row only where it differs, and a change is audited as
/// `team.capability` with `detail`. Whether it changed.
async fn set_switch<T>(
    conn: &mut PgConnection,
    team: &Team,
    actor: &Actor,
    update: &'static str,
    value: T,
    detail: Value,
) -> BusResult<bool>
where
    T: for<'e> Encode<'e, Postgres> + Type<Postgres> + Send,
{
    let changed = sqlx::query(update)
        .bind(team.id)
        .bind(value)
        .execute(&mut *conn)
        .await?
        .rows_affected()
        > 0;
    if changed {
        audit::record(
            conn,
            Some(team.id),
            actor,
            "team.capability",
            &team.slug,
            detail,
        )
        .await?;
    }
    Ok(changed)
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
        let update = "UPDATE teams SET conversations_enabled = $2 WHERE id = $1 AND conversations_enabled <> $2";
        let detail = json!({ "conversations": on });
        if set_switch(&mut tx, &team, actor, update, on, detail).await? {
            // Servers cache the capability: they drop it at this commit.
            crate::events::notify_access_changed(&mut tx, team.id).await?;
        }
    }
    commit_capabilities(tx, team.id).await
}

/// What still sends bodies to, or reads bodies from, the team's JetStream
/// streams; `None` when nothing does and the streams may go.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct JetStreamRouting {
    /// New conversations of the team are created on jetstream.
    pub team_routed: bool,
    /// Conversations whose current backend is jetstream.
    pub conversations: i64,
    /// Messages whose authoritative body is on jetstream (any conversation,
    /// also one that moved back: its older bodies stay there).
    pub messages: i64,
}

impl JetStreamRouting {
    pub fn in_use(&self) -> bool {
        self.team_routed || self.conversations > 0 || self.messages > 0
    }
}

/// Whether the team routes anything to jetstream (see [`JetStreamRouting`]).
pub async fn jetstream_routing(
    db: impl PgExecutor<'_>,
    team_id: Uuid,
) -> BusResult<JetStreamRouting> {
    Ok(sqlx::query_as(
        "SELECT t.conversation_backend = 'jetstream' AS team_routed,
                (SELECT count(*) FROM conversations c
                  WHERE c.team_id = t.id AND c.backend = 'jetstream') AS conversations,
                (SELECT count(*) FROM conversation_messages m
                  WHERE m.team_id = t.id AND m.backend = 'jetstream') AS messages
           FROM teams t WHERE t.id = $1",
    )
    .bind(team_id)
    .fetch_one(db)
    .await?)
}

/// `team capability --team T --backend jetstream|postgres`: the backend new
/// conversations of the team are created on (existing ones stay where they
/// are; moving them is `conversations migrate`). Naming jetstream needs the
/// broker and the team's streams on it, checked before anything is written:
/// a team routed to streams that do not exist would have every body refused.
pub async fn set_conversation_backend(
    pool: &PgPool,
    slug: &str,
    backend: BackendKind,
    broker: Option<&Broker>,
    actor: &Actor,
) -> BusResult<Capabilities> {
    let team = find(pool, slug).await?;
    if backend == BackendKind::Jetstream {
        let Some(broker) = broker else {
            return Err(BusError::invalid(format!(
                "naming jetstream needs the NATS server the team's streams are on: add \
                 `--nats-url nats://HOST:4222` (and `--nats-credentials FILE` if it needs \
                 them). Team `{}` stays on its current backend.",
                team.slug
            )));
        };
        // Network I/O before the transaction, never inside it (B7).
        if !broker.team_streams_exist(team.id).await? {
            return Err(BusError::conflict(format!(
                "team `{}` has no streams on the NATS server at {}, so nothing could be \
                 stored there. Run `ai-crew-sync team stream --team {} --nats-url {}` first, \
                 then name jetstream again. The team stays on its current backend.",
                team.slug,
                broker.url(),
                team.slug,
                broker.url()
            )));
        }
    }
    let mut tx = pool.begin().await?;
    let update =
        "UPDATE teams SET conversation_backend = $2 WHERE id = $1 AND conversation_backend <> $2";
    let detail = json!({ "conversation_backend": backend });
    set_switch(&mut tx, &team, actor, update, backend, detail).await?;
    commit_capabilities(tx, team.id).await
}

/// `team stream --team T --nats-url …`: create or adopt the team's body and
/// inbox streams (audited).
pub async fn provision_streams(
    pool: &PgPool,
    slug: &str,
    broker: &Broker,
    sizes: &StreamSizes,
    update_quotas: bool,
    actor: &Actor,
) -> BusResult<TeamStreams> {
    let team = find(pool, slug).await?;
    let streams = broker.provision_team(team.id, sizes, update_quotas).await?;
    let mut tx = pool.begin().await?;
    // From here on, a locator written under an older identity of these
    // streams names a body the broker lost (see `lost_bodies`).
    let replaced =
        crate::store::delivery::lost_bodies::record_stream_identities(&mut tx, team.id, &streams)
            .await?;
    audit::record(
        &mut tx,
        Some(team.id),
        actor,
        "team.stream",
        &team.slug,
        json!({
            "broker": broker.url(),
            "body": { "name": streams.body.name, "state": streams.body.state },
            "inbox": { "name": streams.inbox.name, "state": streams.inbox.state },
            "update_quotas": update_quotas,
            "replaced": replaced,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(streams)
}

/// `team stream --remove`: delete the team's streams, refused while anything
/// routes there (their bodies would be unreadable, their sends refused).
/// Returns the streams that existed and were removed.
pub async fn remove_streams(
    pool: &PgPool,
    slug: &str,
    broker: &Broker,
    actor: &Actor,
) -> BusResult<Vec<String>> {
    let team = find(pool, slug).await?;
    let routing = jetstream_routing(pool, team.id).await?;
    if routing.in_use() {
        let mut why = Vec::new();
        if routing.team_routed {
            why.push("new conversations are created on jetstream".to_owned());
        }
        if routing.conversations > 0 {
            why.push(format!(
                "{} conversation(s) are on jetstream",
                routing.conversations
            ));
        }
        if routing.messages > 0 {
            why.push(format!(
                "{} message bodies are on jetstream",
                routing.messages
            ));
        }
        return Err(BusError::conflict(format!(
            "team `{}` still routes to jetstream ({}); removing its streams would lose those \
             bodies. Switch new conversations back with `ai-crew-sync team capability --team \
             {} --backend postgres` and move existing ones with `ai-crew-sync conversations \
             migrate --team {} --to postgres --apply`, then remove.",
            team.slug,
            why.join("; "),
            team.slug,
            team.slug
        )));
    }
    // The check and the deletion are not atomic: a team switched to
    // jetstream in between would be refused at its next send (no stream),
    // never silently served by another store.
    let removed = broker.remove_team_streams(team.id).await?;
    let mut tx = pool.begin().await?;
    audit::record(
        &mut tx,
        Some(team.id),
        actor,
        "team.stream.remove",
        &team.slug,
        json!({ "broker": broker.url(), "removed": removed }),
    )
    .await?;
    tx.commit().await?;
    Ok(removed)
}
