//! Agents: identities inside a team. One per coding tool per person.
//!
//! Disabling an agent refuses every token (and later every window) it holds at
//! once: authentication reads `disabled_at` on every request, nothing is cached;
//! and what its windows held (claimed tasks, locks, path reservations) is
//! released in the same transaction.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::{BusError, BusResult};
use crate::store::identity::admin::TeamScope;
use crate::store::identity::tokens::{self, IssuedToken};
use crate::store::messaging::holdings::{self, Ending};
use crate::store::{
    Actor, check_display_name, identity::audit, identity::sessions, identity::teams,
    normalize_agent_name, normalize_team_slug,
};

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct AgentSummary {
    pub id: Uuid,
    pub team: String,
    pub name: String,
    pub disabled_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub active_tokens: i64,
}

/// What adding a row of `agents` of one kind writes and says: an agent
/// here, a person in `people`.
pub(crate) struct NewMember {
    /// The row's insert ($1 id, $2 team, $3 name), which sets `agents.kind`.
    /// An agent's leaves the column to its default ('agent'), so `agent add`
    /// also writes a database migrated before people existed (0045), as the
    /// migration tests' fixtures do.
    pub(crate) insert: &'static str,
    /// The audit action, and the key of its detail that names the new id.
    pub(crate) action: &'static str,
    pub(crate) id_key: &'static str,
    /// The label of the first token.
    pub(crate) label: Option<&'static str>,
    /// The refusal when the name is taken, from the name and the team slug.
    pub(crate) taken: fn(&str, &str) -> String,
}

const AGENT: NewMember = NewMember {
    insert: "INSERT INTO agents (id, team_id, name) VALUES ($1, $2, $3)
             ON CONFLICT (team_id, name) DO NOTHING",
    action: "agent.add",
    id_key: "agent_id",
    label: None,
    taken: |name, team| {
        format!(
            "agent `{name}` already exists in team `{team}`. Issue it another token with \
             `ai-crew-sync token issue --team {team} --agent {name}`."
        )
    },
};

/// Create an agent and its first token in one transaction.
pub async fn add(pool: &PgPool, team: &TeamScope, name: &str) -> BusResult<IssuedToken> {
    add_member(pool, team, name, &AGENT).await
}

/// Create a row of `agents` of `new`'s kind named `name` and its first token in
/// one transaction (audited). The name must be free among the team's agents
/// and people.
pub(crate) async fn add_member(
    pool: &PgPool,
    team: &TeamScope,
    name: &str,
    new: &NewMember,
) -> BusResult<IssuedToken> {
    let actor = team.actor();
    let name = normalize_agent_name(name)?;
    let mut tx = pool.begin().await?;
    let team = teams::find(&mut *tx, team.slug()).await?;
    let id = Uuid::new_v4();
    let inserted = sqlx::query(new.insert)
        .bind(id)
        .bind(team.id)
        .bind(&name)
        .execute(&mut *tx)
        .await?;
    if inserted.rows_affected() == 0 {
        return Err(BusError::conflict((new.taken)(&name, &team.slug)));
    }
    audit::record(
        &mut tx,
        Some(team.id),
        actor,
        new.action,
        &name,
        json!({ new.id_key: id }),
    )
    .await?;
    // The new row is ours until commit: no other transaction can count its tokens.
    let label = new.label.map(String::from);
    let issued =
        tokens::issue_locked(&mut tx, team.id, &team.slug, id, &name, label, actor).await?;
    tx.commit().await?;
    Ok(issued)
}

pub async fn list(pool: &PgPool, team: &TeamScope) -> BusResult<Vec<AgentSummary>> {
    let team = teams::find(pool, team.slug()).await?;
    Ok(sqlx::query_as(
        "SELECT a.id, $2::text AS team, a.name, a.disabled_at, a.created_at,
                (SELECT count(*) FROM agent_tokens t
                 WHERE t.team_id = a.team_id AND t.agent_id = a.id AND t.revoked_at IS NULL)
                AS active_tokens
         FROM agents a WHERE a.team_id = $1 AND a.kind = 'agent' ORDER BY a.name",
    )
    .bind(team.id)
    .bind(&team.slug)
    .fetch_all(pool)
    .await?)
}

#[derive(Clone, Debug, Serialize)]
pub struct AgentState {
    pub agent: AgentSummary,
    /// True when this call changed the state; false when it already was so.
    pub changed: bool,
}

/// Disable or enable an agent. Only a real transition is audited.
pub async fn set_disabled(
    pool: &PgPool,
    team: &TeamScope,
    name: &str,
    disabled: bool,
) -> BusResult<AgentState> {
    let actor = team.actor();
    let name = normalize_agent_name(name)?;
    let mut tx = pool.begin().await?;
    let team = teams::find(&mut *tx, team.slug()).await?;
    // The write fence's exclusive side first (sessions::guard): the agent's
    // writes in flight commit before this does, and every later one waits for
    // this commit and then sees the agent disabled.
    let agent_id: Option<Uuid> =
        sqlx::query_scalar("SELECT id FROM agents WHERE team_id = $1 AND name = $2")
            .bind(team.id)
            .bind(&name)
            .fetch_optional(&mut *tx)
            .await?;
    if let Some(agent_id) = agent_id {
        sessions::lock_agent_credentials(&mut tx, agent_id).await?;
    }
    let changed: Option<Uuid> = sqlx::query_scalar(
        "UPDATE agents SET disabled_at = CASE WHEN $3 THEN now() ELSE NULL END
         WHERE team_id = $1 AND name = $2 AND (disabled_at IS NOT NULL) <> $3
         RETURNING id",
    )
    .bind(team.id)
    .bind(&name)
    .bind(disabled)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(id) = changed.filter(|_| disabled) {
        // None of its windows can write any more: what they held is released.
        holdings::release_ended(&mut tx, team.id, id, None, Ending::AgentDisabled).await?;
    }
    if let Some(id) = changed {
        let action = if disabled {
            "agent.disable"
        } else {
            "agent.enable"
        };
        audit::record(
            &mut tx,
            Some(team.id),
            actor,
            action,
            &name,
            json!({ "agent_id": id }),
        )
        .await?;
    }
    let agent: Option<AgentSummary> = sqlx::query_as(
        "SELECT a.id, $3::text AS team, a.name, a.disabled_at, a.created_at,
                (SELECT count(*) FROM agent_tokens t
                 WHERE t.team_id = a.team_id AND t.agent_id = a.id AND t.revoked_at IS NULL)
                AS active_tokens
         FROM agents a WHERE a.team_id = $1 AND a.name = $2",
    )
    .bind(team.id)
    .bind(&name)
    .bind(&team.slug)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(agent) = agent else {
        return Err(BusError::not_found(format!(
            "no agent `{name}` in team `{}`. `ai-crew-sync agent list --team {}` shows them.",
            team.slug, team.slug
        )));
    };
    tx.commit().await?;
    Ok(AgentState {
        agent,
        changed: changed.is_some(),
    })
}

#[derive(Clone, Debug, Serialize)]
pub struct Quickstart {
    pub team_created: bool,
    pub agent_created: bool,
    pub issued: IssuedToken,
}

/// Make sure `team` and `agent` exist, then issue a token for the agent.
/// Safe to run again: an existing team or agent is reused, never duplicated.
pub async fn quickstart(
    pool: &PgPool,
    team: &str,
    agent: &str,
    actor: &Actor,
) -> BusResult<Quickstart> {
    let made = ensure(pool, team, agent, actor, true).await?;
    Ok(Quickstart {
        team_created: made.team_created,
        agent_created: made.agent_created,
        issued: made.issued.expect("asked to mint a token"),
    })
}

/// What [`ensure`] found or made.
#[derive(Clone, Debug, Serialize)]
pub struct Ensured {
    pub team: String,
    pub agent: String,
    pub team_created: bool,
    pub agent_created: bool,
    /// The token minted, when one was asked for.
    pub issued: Option<IssuedToken>,
}

/// Make sure `team` and `agent` exist (reusing existing ones), and issue a
/// token for the agent only when `mint` says so: the CLI's `quickstart`,
/// which mints again only when asked (`--new-token`).
pub async fn ensure(
    pool: &PgPool,
    team: &str,
    agent: &str,
    actor: &Actor,
    mint: bool,
) -> BusResult<Ensured> {
    let slug = normalize_team_slug(team)?;
    let name = normalize_agent_name(agent)?;
    let team_name = check_display_name("team name", &slug)?;
    let mut tx = pool.begin().await?;
    let team_id: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO teams (id, slug, name) VALUES ($1, $2, $3)
         ON CONFLICT (slug) DO NOTHING RETURNING id",
    )
    .bind(Uuid::new_v4())
    .bind(&slug)
    .bind(&team_name)
    .fetch_optional(&mut *tx)
    .await?;
    let team_created = team_id.is_some();
    let team_id = match team_id {
        Some(id) => {
            audit::record(
                &mut tx,
                Some(id),
                actor,
                "team.create",
                &slug,
                json!({ "name": team_name }),
            )
            .await?;
            id
        }
        None => teams::find(&mut *tx, &slug).await?.id,
    };
    let agent_id: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO agents (id, team_id, name) VALUES ($1, $2, $3)
         ON CONFLICT (team_id, name) DO NOTHING RETURNING id",
    )
    .bind(Uuid::new_v4())
    .bind(team_id)
    .bind(&name)
    .fetch_optional(&mut *tx)
    .await?;
    let agent_created = agent_id.is_some();
    let agent_id = match agent_id {
        Some(id) => {
            audit::record(
                &mut tx,
                Some(team_id),
                actor,
                "agent.add",
                &name,
                json!({ "agent_id": id }),
            )
            .await?;
            id
        }
        None => {
            let (id, kind): (Uuid, String) = sqlx::query_as(
                "SELECT id, kind FROM agents WHERE team_id = $1 AND name = $2 FOR UPDATE",
            )
            .bind(team_id)
            .bind(&name)
            .fetch_one(&mut *tx)
            .await?;
            if kind == "person" {
                return Err(BusError::conflict(format!(
                    "`{name}` is a person of team `{slug}`, not an agent: a person signs in to \
                     the dashboard and their credential is refused on /mcp. Nothing was \
                     changed. Choose another name for the agent."
                )));
            }
            id
        }
    };
    let issued = if mint {
        Some(
            tokens::issue_locked(
                &mut tx,
                team_id,
                &slug,
                agent_id,
                &name,
                Some("quickstart".into()),
                actor,
            )
            .await?,
        )
    } else {
        None
    };
    tx.commit().await?;
    Ok(Ensured {
        team: slug,
        agent: name,
        team_created,
        agent_created,
        issued,
    })
}
