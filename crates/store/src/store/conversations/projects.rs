//! Projects group conversations; access to one is an explicit grant per agent
//! (not a role, not a path). Only a holder extends a grant; revoking is
//! immediate; nobody revokes their own.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::requests::Writer;
use crate::store::{conversations, identity::sessions, messaging::channels, normalize_agent_name};

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Project {
    pub id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// Whether the calling agent holds a grant.
    pub granted: bool,
    /// Agents holding a grant.
    pub grants: i64,
    pub conversations: i64,
}

/// The columns of a [`Project`] for the caller ($1 team, $2 agent).
macro_rules! project_select {
    () => {
        "SELECT p.id, p.name, p.created_at,
                EXISTS (SELECT 1 FROM project_grants g
                        WHERE g.team_id = p.team_id AND g.project_id = p.id AND g.agent_id = $2) AS granted,
                (SELECT count(*) FROM project_grants g
                 WHERE g.team_id = p.team_id AND g.project_id = p.id) AS grants,
                (SELECT count(*) FROM conversations c
                 WHERE c.team_id = p.team_id AND c.project_id = p.id) AS conversations
         FROM projects p"
    };
}

/// Project names follow channel names: ASCII letters, digits, `-_.`, <= 64 bytes.
pub fn normalize_name(raw: &str) -> BusResult<String> {
    channels::normalize_name(raw).map_err(|_| {
        BusError::invalid(format!(
            "project name {} is not valid: use 1-64 ASCII letters, digits and `-_.`, starting \
             with a letter or digit (for example `checkout-v2`).",
            crate::store::text::quote(raw)
        ))
    })
}

/// The id of the project called `name` in the caller's team, or not found.
pub(crate) async fn find(conn: &mut PgConnection, me: &Identity, name: &str) -> BusResult<Uuid> {
    let name = normalize_name(name)?;
    sqlx::query_scalar("SELECT id FROM projects WHERE team_id = $1 AND name = $2")
        .bind(me.team_id)
        .bind(&name)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| {
            BusError::not_found(format!(
                "no project `{name}` in your team. list_projects shows them."
            ))
        })
}

/// Whether `agent_id` holds a grant on `project_id`.
pub(crate) async fn holds_grant(
    conn: &mut PgConnection,
    team_id: Uuid,
    project_id: Uuid,
    agent_id: Uuid,
) -> BusResult<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM project_grants
                        WHERE team_id = $1 AND project_id = $2 AND agent_id = $3)",
    )
    .bind(team_id)
    .bind(project_id)
    .bind(agent_id)
    .fetch_one(&mut *conn)
    .await?)
}

/// `create_project`: the creator holds the first grant.
pub async fn create(w: &mut Writer, me: &Identity, name: &str) -> BusResult<Project> {
    let name = normalize_name(name)?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let id = Uuid::new_v4();
    let inserted = sqlx::query(
        "INSERT INTO projects (id, team_id, name, created_by) VALUES ($1, $2, $3, $4)
         ON CONFLICT (team_id, name) DO NOTHING",
    )
    .bind(id)
    .bind(me.team_id)
    .bind(&name)
    .bind(me.agent_id)
    .execute(&mut *tx)
    .await?;
    if inserted.rows_affected() == 0 {
        return Err(BusError::conflict(format!(
            "project `{name}` already exists. Ask an agent holding its grant to grant_project_access \
             to you, or pick another name."
        )));
    }
    sqlx::query(
        "INSERT INTO project_grants (team_id, project_id, agent_id, granted_by) VALUES ($1, $2, $3, $3)",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .execute(&mut *tx)
    .await?;
    conversations::audit(
        &mut tx,
        me,
        None,
        "project_create",
        &name,
        json!({ "project_id": id }),
    )
    .await?;
    let project = one(&mut tx, me, id).await?;
    tx.commit().await?;
    Ok(project)
}

async fn one(conn: &mut PgConnection, me: &Identity, id: Uuid) -> BusResult<Project> {
    Ok(sqlx::query_as(concat!(
        project_select!(),
        " WHERE p.team_id = $1 AND p.id = $3"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(id)
    .fetch_one(&mut *conn)
    .await?)
}

/// `list_projects`: the team's projects, each saying whether you hold a grant.
pub async fn list(bus: &Bus, me: &Identity) -> BusResult<Vec<Project>> {
    Ok(sqlx::query_as(concat!(
        project_select!(),
        " WHERE p.team_id = $1 ORDER BY p.name"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .fetch_all(&bus.pool)
    .await?)
}

#[derive(Clone, Debug, Serialize)]
pub struct GrantChange {
    pub project: String,
    pub agent: String,
    pub granted: bool,
    /// False when the grant already was as asked.
    pub changed: bool,
}

/// `grant_project_access {project, agent, grant}`: only a holder grants or
/// revokes; nobody revokes their own grant.
pub async fn grant(
    w: &mut Writer,
    me: &Identity,
    project: &str,
    agent: &str,
    grant: bool,
) -> BusResult<GrantChange> {
    let agent = normalize_agent_name(agent)?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let project_id = find(&mut tx, me, project).await?;
    let project = normalize_name(project)?;
    // The project row first: grant changes of one project run one at a time,
    // and the holder check below (a later statement, so a fresh snapshot)
    // sees every change committed before. Without it, two holders revoking
    // each other at once would both pass the check and leave no holder.
    sqlx::query("SELECT 1 FROM projects WHERE team_id = $1 AND id = $2 FOR NO KEY UPDATE")
        .bind(me.team_id)
        .bind(project_id)
        .execute(&mut *tx)
        .await?;
    if !holds_grant(&mut tx, me.team_id, project_id, me.agent_id).await? {
        return Err(BusError::forbidden(format!(
            "only an agent holding a grant on project `{project}` can grant or revoke access, and \
             you hold none. Ask a holder (list_projects shows how many there are)."
        )));
    }
    let target: Uuid = sqlx::query_scalar("SELECT id FROM agents WHERE team_id = $1 AND name = $2")
        .bind(me.team_id)
        .bind(&agent)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| {
            BusError::not_found(format!(
                "no agent `{agent}` in your team. list_agents shows them."
            ))
        })?;
    if !grant && target == me.agent_id {
        return Err(BusError::invalid(format!(
            "you cannot revoke your own grant on `{project}`; another holder can."
        )));
    }
    let changed = if grant {
        sqlx::query(
            "INSERT INTO project_grants (team_id, project_id, agent_id, granted_by) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
        )
        .bind(me.team_id)
        .bind(project_id)
        .bind(target)
        .bind(me.agent_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    } else {
        sqlx::query(
            "DELETE FROM project_grants WHERE team_id = $1 AND project_id = $2 AND agent_id = $3",
        )
        .bind(me.team_id)
        .bind(project_id)
        .bind(target)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    } > 0;
    if changed {
        let action = if grant {
            "project_grant"
        } else {
            "project_revoke"
        };
        conversations::audit(
            &mut tx,
            me,
            None,
            action,
            &agent,
            json!({ "project": project }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(GrantChange {
        project,
        agent,
        granted: grant,
        changed,
    })
}
