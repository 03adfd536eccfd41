//! Agent tokens: the credential that *is* one agent.
//!
//! Stored as SHA-256 with a 12-character display prefix; the plaintext exists
//! only in the answer to the call that minted it. At most
//! [`ACTIVE_TOKENS_PER_AGENT_MAX`] live tokens per agent, counted under the
//! agent's row lock so two concurrent issues cannot both take the last slot.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::auth::{self, Identity};
use crate::error::{BusError, BusResult};
use crate::store::identity::admin::{Reach, TeamScope};
use crate::store::messaging::holdings::{self, Ending};
use crate::store::{
    Actor, identity::audit, identity::sessions, identity::teams, normalize_agent_name,
};

pub const ACTIVE_TOKENS_PER_AGENT_MAX: i64 = 100;
pub const TOKEN_LABEL_MAX_BYTES: usize = 64;

/// A token just minted. `token` is the only copy of the secret there will ever be.
#[derive(Clone, Debug, Serialize)]
pub struct IssuedToken {
    pub id: Uuid,
    pub team: String,
    pub agent: String,
    pub token: String,
    pub display_prefix: String,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct TokenSummary {
    pub id: Uuid,
    pub team: String,
    pub agent: String,
    pub display_prefix: String,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Revocation {
    pub token: TokenSummary,
    /// True when this call made the transition; false when it was already revoked.
    pub revoked_now: bool,
}

/// Issue a token for `agent` of `team` (the agent must exist).
pub async fn issue(
    pool: &PgPool,
    team: &TeamScope,
    agent: &str,
    label: Option<&str>,
) -> BusResult<IssuedToken> {
    let actor = team.actor();
    let label = check_label(label)?;
    let agent_name = normalize_agent_name(agent)?;
    let mut tx = pool.begin().await?;
    let team = teams::find(&mut *tx, team.slug()).await?;
    let agent_id: Option<Uuid> =
        sqlx::query_scalar("SELECT id FROM agents WHERE team_id = $1 AND name = $2 FOR UPDATE")
            .bind(team.id)
            .bind(&agent_name)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(agent_id) = agent_id else {
        return Err(BusError::not_found(format!(
            "no agent `{agent_name}` in team `{}`. `ai-crew-sync agent list --team {}` shows them; \
             `ai-crew-sync agent add --team {} --name {agent_name}` creates it with a first token.",
            team.slug, team.slug, team.slug
        )));
    };
    let issued = issue_locked(
        &mut tx,
        team.id,
        &team.slug,
        agent_id,
        &agent_name,
        label,
        actor,
    )
    .await?;
    tx.commit().await?;
    Ok(issued)
}

/// Mint and record a token inside the caller's transaction, which must hold
/// the agent row locked (`FOR UPDATE`) so the limit below is exact.
pub(crate) async fn issue_locked(
    conn: &mut PgConnection,
    team_id: Uuid,
    team_slug: &str,
    agent_id: Uuid,
    agent_name: &str,
    label: Option<String>,
    actor: &Actor,
) -> BusResult<IssuedToken> {
    let active: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_tokens
         WHERE team_id = $1 AND agent_id = $2 AND revoked_at IS NULL",
    )
    .bind(team_id)
    .bind(agent_id)
    .fetch_one(&mut *conn)
    .await?;
    if active >= ACTIVE_TOKENS_PER_AGENT_MAX {
        return Err(BusError::conflict(format!(
            "agent `{agent_name}` already has {active} active tokens; the limit is \
             {ACTIVE_TOKENS_PER_AGENT_MAX}. Revoke unused ones first (`ai-crew-sync token list \
             --team {team_slug}`, then `ai-crew-sync token revoke --id ID`)."
        )));
    }
    let secret = auth::new_agent_token();
    let id = Uuid::new_v4();
    let created_at: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO agent_tokens (id, team_id, agent_id, token_sha256, display_prefix, label)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at",
    )
    .bind(id)
    .bind(team_id)
    .bind(agent_id)
    .bind(&secret.sha256[..])
    .bind(&secret.display_prefix)
    .bind(&label)
    .fetch_one(&mut *conn)
    .await?;
    audit::record(
        conn,
        Some(team_id),
        actor,
        "token.issue",
        agent_name,
        json!({ "token_id": id, "display_prefix": secret.display_prefix, "label": label }),
    )
    .await?;
    Ok(IssuedToken {
        id,
        team: team_slug.to_string(),
        agent: agent_name.to_string(),
        token: secret.plaintext,
        display_prefix: secret.display_prefix,
        label,
        created_at,
    })
}

fn check_label(label: Option<&str>) -> BusResult<Option<String>> {
    crate::store::text::optional_label(
        "token label",
        label,
        TOKEN_LABEL_MAX_BYTES,
        "Use a short note such as `laptop` or `ci`; nothing was issued.",
    )
}

/// The columns of a [`TokenSummary`]; a macro so queries can `concat!` a literal.
macro_rules! summary_select {
    () => {
        "SELECT t.id, tm.slug AS team, a.name AS agent, t.display_prefix, t.label,
            t.created_at, t.last_used_at, t.revoked_at
     FROM agent_tokens t
     JOIN agents a ON a.team_id = t.team_id AND a.id = t.agent_id
     JOIN teams tm ON tm.id = t.team_id"
    };
}

/// Every token of the team, live and revoked, newest first. Never a secret.
pub async fn list(pool: &PgPool, team: &TeamScope) -> BusResult<Vec<TokenSummary>> {
    let team = teams::find(pool, team.slug()).await?;
    Ok(sqlx::query_as(concat!(
        summary_select!(),
        " WHERE t.team_id = $1 ORDER BY a.name, t.created_at DESC"
    ))
    .bind(team.id)
    .fetch_all(pool)
    .await?)
}

/// Revoke one token, and every session derived from it, releasing what
/// those windows held (every window's, when the agent has no live token
/// left: `holdings::release_ended`). Within one team, a
/// token of another team is "not found" (and untouched). Concurrent
/// revocations make one transition and one audit row: the conditional UPDATE
/// lets exactly one of them change the row.
pub async fn revoke<'a>(
    pool: &PgPool,
    id: Uuid,
    within: impl Into<Reach<'a>>,
) -> BusResult<Revocation> {
    let within = within.into();
    let actor = within.actor();
    let mut tx = pool.begin().await?;
    let team_id = match within.team() {
        Some(slug) => Some(teams::find(&mut *tx, slug).await?.id),
        None => None,
    };
    // The write fence's exclusive side first (sessions::guard): writes in
    // flight with this token or its windows commit before the revocation, and
    // none commits after it.
    let agent_id: Option<Uuid> = sqlx::query_scalar(
        "SELECT agent_id FROM agent_tokens WHERE id = $1 AND ($2::uuid IS NULL OR team_id = $2)",
    )
    .bind(id)
    .bind(team_id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(agent_id) = agent_id {
        sessions::lock_agent_credentials(&mut tx, agent_id).await?;
    }
    let changed: Option<(Uuid, String)> = sqlx::query_as(
        "UPDATE agent_tokens SET revoked_at = now()
         WHERE id = $1 AND revoked_at IS NULL AND ($2::uuid IS NULL OR team_id = $2)
         RETURNING team_id, display_prefix",
    )
    .bind(id)
    .bind(team_id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((team_id, prefix)) = &changed {
        // Every window derived from the token dies with it, in this transaction.
        let labels: Vec<String> = sqlx::query_scalar(
            "UPDATE agent_sessions SET revoked_at = now(), updated_at = now()
             WHERE token_id = $1 AND revoked_at IS NULL
             RETURNING label",
        )
        .bind(id)
        .fetch_all(&mut *tx)
        .await?;
        let sessions = labels.len();
        if let Some(agent_id) = agent_id {
            // What those windows held is released; and when the agent has no
            // live token left, what any window of it held (one speaking with
            // the bare token too), since none of them can write any more.
            let token_left: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM agent_tokens
                                WHERE team_id = $1 AND agent_id = $2 AND revoked_at IS NULL)",
            )
            .bind(team_id)
            .bind(agent_id)
            .fetch_one(&mut *tx)
            .await?;
            holdings::release_ended(
                &mut tx,
                *team_id,
                agent_id,
                token_left.then_some(labels.as_slice()),
                Ending::TokenRevoked,
            )
            .await?;
        }
        audit::record(
            &mut tx,
            Some(*team_id),
            actor,
            "token.revoke",
            &id.to_string(),
            json!({ "display_prefix": prefix, "sessions_revoked": sessions }),
        )
        .await?;
    }
    let token: Option<TokenSummary> = sqlx::query_as(concat!(
        summary_select!(),
        " WHERE t.id = $1 AND ($2::uuid IS NULL OR t.team_id = $2)"
    ))
    .bind(id)
    .bind(team_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(token) = token else {
        return Err(BusError::not_found(format!(
            "no token with id {id}. `ai-crew-sync token list --team T` shows token ids."
        )));
    };
    tx.commit().await?;
    Ok(Revocation {
        token,
        revoked_now: changed.is_some(),
    })
}

/// Whether `token` is a live (not revoked) token of `agent` in team `team`
/// in this database: `quickstart` asks before it reuses a profile's token.
pub async fn is_live_for(pool: &PgPool, token: &str, team: &str, agent: &str) -> BusResult<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (
             SELECT 1 FROM agent_tokens t
             JOIN agents a ON a.team_id = t.team_id AND a.id = t.agent_id
             JOIN teams tm ON tm.id = t.team_id
             WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL
               AND tm.slug = $2 AND a.name = $3)",
    )
    .bind(&auth::digest(token)[..])
    .bind(team)
    .bind(agent)
    .fetch_one(pool)
    .await?)
}

/// Resolve a token digest to the agent it is, refusing revoked tokens (401)
/// and disabled agents (403). `session` is the already-validated window label.
/// A person's credential is refused (403): people work from the dashboard
/// ([`authenticate_member`]), never over `/mcp`.
pub async fn authenticate(
    pool: &PgPool,
    sha256: &[u8; 32],
    session: String,
) -> BusResult<Identity> {
    let (identity, person) = authenticate_member(pool, sha256, session).await?;
    if person {
        return Err(person_on_mcp(&identity.agent));
    }
    Ok(identity)
}

/// The refusal a person's credential meets on `/mcp`.
pub fn person_on_mcp(name: &str) -> BusError {
    BusError::forbidden(format!(
        "this credential belongs to `{name}`, a person of the team, not an agent: people sign in \
         to the dashboard (/dashboard on this server) and post, answer and manage tasks there; \
         they never call /mcp, so they hold no claims, leases, locks or reservations. Open \
         /dashboard and paste it there, or ask the operator for an agent token (`ai-crew-sync \
         agent add --team T --name N`) for a coding tool."
    ))
}

/// [`authenticate`] for an agent or a person, saying which (`true`: a person).
pub async fn authenticate_member(
    pool: &PgPool,
    sha256: &[u8; 32],
    session: String,
) -> BusResult<(Identity, bool)> {
    #[derive(sqlx::FromRow)]
    struct Row {
        token_id: Uuid,
        person: bool,
        last_used_stale: bool,
        agent_id: Uuid,
        agent: String,
        team_id: Uuid,
        team: String,
        #[sqlx(flatten)]
        refusal: sessions::Refusal,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT t.id AS token_id, a.kind = 'person' AS person,
                (t.last_used_at IS NULL OR t.last_used_at < now() - interval '60 seconds') AS last_used_stale,
                a.id AS agent_id, a.name AS agent, tm.id AS team_id, tm.slug AS team,
                r.refusal, r.session_epoch, r.refused_since
         FROM agent_tokens t
         JOIN agents a ON a.team_id = t.team_id AND a.id = t.agent_id
         JOIN teams tm ON tm.id = t.team_id
         CROSS JOIN LATERAL agent_credential_refusal(t.team_id, t.agent_id, t.id, NULL, NULL) r
         WHERE t.token_sha256 = $1",
    )
    .bind(&sha256[..])
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Err(BusError::unauthenticated(
            "unknown agent token: no agent has this token. Ask the operator for a token \
             (`ai-crew-sync token issue --team T --agent A`) and put it in your MCP client config.",
        ));
    };
    let identity = Identity {
        team_id: row.team_id,
        team: row.team,
        agent_id: row.agent_id,
        agent: row.agent,
        token_id: row.token_id,
        window: session,
        session_credential: None,
    };
    row.refusal.check(&identity)?;
    if row.last_used_stale {
        // At most one write per token per minute, so listings can say when a
        // token was last used without a write on every call.
        sqlx::query("UPDATE agent_tokens SET last_used_at = now() WHERE id = $1")
            .bind(row.token_id)
            .execute(pool)
            .await?;
    }
    Ok((identity, row.person))
}
