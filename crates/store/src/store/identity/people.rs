//! People: members of a team who sign in to the dashboard, not agents.
//!
//! A person is a row of `agents` with `kind = 'person'` (migration 0045): the
//! same name namespace as agents, so a direct message or an `ask_agent` to
//! the name reaches the person. Their sign-in credential is an agent token
//! (`agent_tokens`, shown once) that `/mcp` refuses
//! ([`crate::store::identity::tokens::authenticate`]): a person works from
//! the dashboard only, so never holds a claim, a lease, a lock or a
//! reservation. Revoking a person revokes every live credential of theirs
//! and disables the row: the dashboard re-checks both on every request.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::{BusError, BusResult};
use crate::store::identity::admin::TeamScope;
use crate::store::identity::agents::{self, NewMember};
use crate::store::identity::tokens::IssuedToken;
use crate::store::{identity::audit, identity::sessions, identity::teams, normalize_agent_name};

/// A person as `person list` shows them. Never a secret.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct PersonSummary {
    pub id: Uuid,
    pub team: String,
    pub name: String,
    pub disabled_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// Live sign-in credentials (0 once revoked).
    pub active_credentials: i64,
    /// When the person last signed in to the dashboard, if ever (of the
    /// sign-ins still kept: 8 hours).
    pub last_signed_in_at: Option<DateTime<Utc>>,
}

/// What `person revoke` did.
#[derive(Clone, Debug, Serialize)]
pub struct PersonRevocation {
    pub person: PersonSummary,
    /// Credentials this call revoked (0 when there were none left).
    pub credentials_revoked: u64,
}

const PERSON: NewMember = NewMember {
    insert: "INSERT INTO agents (id, team_id, name, kind) VALUES ($1, $2, $3, 'person')
             ON CONFLICT (team_id, name) DO NOTHING",
    action: "person.add",
    id_key: "person_id",
    label: Some("dashboard sign-in"),
    taken: |name, team| {
        format!(
            "the name `{name}` is taken in team `{team}` (agents and people share one namespace, \
             so messages reach either by name). Nothing was added. Choose another name; \
             `ai-crew-sync person list --team {team}` and `agent list --team {team}` show the \
             names in use."
        )
    },
};

/// Make `name` a person of `team` and issue their sign-in credential, in one
/// transaction. The name must be free among the team's agents and people.
pub async fn add(pool: &PgPool, team: &TeamScope, name: &str) -> BusResult<IssuedToken> {
    agents::add_member(pool, team, name, &PERSON).await
}

/// The columns of a [`PersonSummary`] over `agents a` (`$2` is the slug).
macro_rules! summary {
    () => {
        "SELECT a.id, $2::text AS team, a.name, a.disabled_at, a.created_at,
        (SELECT count(*) FROM agent_tokens t
          WHERE t.team_id = a.team_id AND t.agent_id = a.id AND t.revoked_at IS NULL)
        AS active_credentials,
        (SELECT max(d.created_at) FROM dashboard_sessions d
          JOIN agent_tokens t ON t.id = d.principal_id
          WHERE d.principal = 'person' AND t.team_id = a.team_id AND t.agent_id = a.id)
        AS last_signed_in_at
   FROM agents a WHERE a.team_id = $1 AND a.kind = 'person'"
    };
}

/// Every person of the team, by name.
pub async fn list(pool: &PgPool, team: &TeamScope) -> BusResult<Vec<PersonSummary>> {
    let team = teams::find(pool, team.slug()).await?;
    Ok(sqlx::query_as(concat!(summary!(), " ORDER BY a.name"))
        .bind(team.id)
        .bind(&team.slug)
        .fetch_all(pool)
        .await?)
}

/// Revoke a person: every live credential of theirs, and the row disabled,
/// so each of their dashboard sign-ins ends at its next request. Audited
/// once per call that changed something.
pub async fn revoke(pool: &PgPool, team: &TeamScope, name: &str) -> BusResult<PersonRevocation> {
    let actor = team.actor();
    let name = normalize_agent_name(name)?;
    let mut tx = pool.begin().await?;
    let team = teams::find(&mut *tx, team.slug()).await?;
    let person: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM agents WHERE team_id = $1 AND name = $2 AND kind = 'person'",
    )
    .bind(team.id)
    .bind(&name)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(person_id) = person else {
        return Err(BusError::not_found(format!(
            "no person `{name}` in team `{}`. `ai-crew-sync person list --team {}` shows them \
             (an agent is revoked with `agent disable` or `token revoke`).",
            team.slug, team.slug
        )));
    };
    // The write fence's exclusive side first, as for agents: a write the
    // person has in flight commits before this, none after (and every
    // replica's credential cache hears of it at commit, migration 0024).
    sessions::lock_agent_credentials(&mut tx, person_id).await?;
    let revoked = sqlx::query(
        "UPDATE agent_tokens SET revoked_at = now()
          WHERE team_id = $1 AND agent_id = $2 AND revoked_at IS NULL",
    )
    .bind(team.id)
    .bind(person_id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let disabled =
        sqlx::query("UPDATE agents SET disabled_at = now() WHERE id = $1 AND disabled_at IS NULL")
            .bind(person_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    if revoked > 0 || disabled > 0 {
        audit::record(
            &mut tx,
            Some(team.id),
            actor,
            "person.revoke",
            &name,
            json!({ "person_id": person_id, "credentials_revoked": revoked }),
        )
        .await?;
    }
    let person: PersonSummary = sqlx::query_as(concat!(summary!(), " AND a.id = $3"))
        .bind(team.id)
        .bind(&team.slug)
        .bind(person_id)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(PersonRevocation {
        person,
        credentials_revoked: revoked,
    })
}
