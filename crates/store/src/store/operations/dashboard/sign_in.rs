//! Who may see the dashboard: the principals, their sign-ins (a row per
//! cookie) and the recheck every request makes (see the module overview).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::identity::admin::{self, Authority};
use crate::store::{identity::teams, identity::tokens};

/// Who a dashboard cookie stands for: ids only, re-read on every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Principal {
    /// An agent, by the agent token it signed in with.
    Agent { team_id: Uuid, token_id: Uuid },
    /// An admin credential, looking at one team.
    Admin { team_id: Uuid, credential_id: Uuid },
    /// A person of the team, by their sign-in credential (an agent token of
    /// a `person` row, migration 0045): the one principal that may write.
    Person { team_id: Uuid, token_id: Uuid },
}

/// A principal as it is now: the team it looks at and the name to show.
#[derive(Clone, Debug, Serialize)]
pub struct Viewer {
    #[serde(skip)]
    pub principal: Principal,
    #[serde(skip)]
    pub agent_id: Option<Uuid>,
    pub team: String,
    /// `agent`, `admin` or `person`.
    pub kind: &'static str,
    /// The agent's or person's name, or `admin:<credential prefix>`.
    pub name: String,
}

impl Viewer {
    /// The person signed in, as the caller of the store's writes: their own
    /// row and credential, in the shared window `""` (a person has no
    /// windows). `None` for an agent or an admin: they only look.
    pub fn person(&self) -> Option<Identity> {
        match (self.principal, self.agent_id) {
            (Principal::Person { team_id, token_id }, Some(agent_id)) => Some(Identity {
                team_id,
                team: self.team.clone(),
                agent_id,
                agent: self.name.clone(),
                token_id,
                window: String::new(),
                session_credential: None,
            }),
            _ => None,
        }
    }
}

/// Sign in with an agent token (its digest), an agent's or a person's: the
/// token must be live and its row enabled, the same refusal `/mcp` gives
/// otherwise.
pub async fn sign_in_agent(pool: &PgPool, digest: &[u8; 32]) -> BusResult<Viewer> {
    let (me, person) = tokens::authenticate_member(pool, digest, String::new()).await?;
    let principal = if person {
        Principal::Person {
            team_id: me.team_id,
            token_id: me.token_id,
        }
    } else {
        Principal::Agent {
            team_id: me.team_id,
            token_id: me.token_id,
        }
    };
    Ok(Viewer {
        principal,
        agent_id: Some(me.agent_id),
        team: me.team,
        kind: principal.kind(),
        name: me.agent,
    })
}

/// Sign in with an admin credential (its digest) for team `slug`: a global
/// credential, or one confined to that team.
pub async fn sign_in_admin(pool: &PgPool, digest: &[u8; 32], slug: &str) -> BusResult<Viewer> {
    let me = admin::authenticate(pool, digest).await?;
    if slug.trim().is_empty() {
        return Err(BusError::invalid(match &me.team {
            Some(own) => format!(
                "an admin credential looks at one team: fill in the team field (this credential \
                 is confined to `{own}`)."
            ),
            None => "an admin credential looks at one team: fill in the team field with the \
                     team's slug."
                .to_string(),
        }));
    }
    let scope = Authority::Admin(me.clone()).team(slug)?;
    let team = teams::find(pool, scope.slug()).await?;
    Ok(Viewer {
        principal: Principal::Admin {
            team_id: team.id,
            credential_id: me.credential_id,
        },
        agent_id: None,
        team: team.slug,
        kind: "admin",
        name: format!("admin:{}", me.display_prefix),
    })
}

impl Principal {
    pub(super) fn team_id(&self) -> Uuid {
        match *self {
            Principal::Agent { team_id, .. }
            | Principal::Admin { team_id, .. }
            | Principal::Person { team_id, .. } => team_id,
        }
    }

    /// The agent token's or the admin credential's id.
    fn id(&self) -> Uuid {
        match *self {
            Principal::Agent { token_id, .. } | Principal::Person { token_id, .. } => token_id,
            Principal::Admin { credential_id, .. } => credential_id,
        }
    }

    /// `agent`, `admin` or `person`: what the sign-in row and the cookie say.
    pub fn kind(&self) -> &'static str {
        match self {
            Principal::Agent { .. } => "agent",
            Principal::Admin { .. } => "admin",
            Principal::Person { .. } => "person",
        }
    }

    /// The key the dashboard's per-principal rate limit counts under.
    pub fn rate_key(&self) -> Uuid {
        self.id()
    }
}

/// A dashboard sign-in as its cookie names it: who, and the server-side
/// row ([`begin`]) that signing out deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignIn {
    pub principal: Principal,
    pub session_id: Uuid,
}

/// Live sign-ins one principal keeps; its next one ends the oldest.
pub const SIGN_INS_PER_PRINCIPAL: i64 = 16;
/// Expired sign-in rows each new sign-in deletes (of any principal).
const EXPIRED_DELETED_PER_SIGN_IN: i64 = 100;

/// Record a sign-in of `principal` until `expires_at`, so that signing out
/// ([`end`]) ends it on every replica. Keeps the table small on the way:
/// a batch of expired rows goes, and the principal keeps its newest
/// [`SIGN_INS_PER_PRINCIPAL`].
pub async fn begin(
    pool: &PgPool,
    principal: Principal,
    expires_at: DateTime<Utc>,
) -> BusResult<SignIn> {
    let session_id = Uuid::new_v4();
    let mut tx = pool.begin().await?;
    sqlx::query(
        "DELETE FROM dashboard_sessions WHERE id IN (
             SELECT id FROM dashboard_sessions WHERE expires_at <= now()
              ORDER BY expires_at LIMIT $1)",
    )
    .bind(EXPIRED_DELETED_PER_SIGN_IN)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO dashboard_sessions (id, team_id, principal, principal_id, expires_at)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(session_id)
    .bind(principal.team_id())
    .bind(principal.kind())
    .bind(principal.id())
    .bind(expires_at)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "DELETE FROM dashboard_sessions WHERE principal_id = $1 AND id NOT IN (
             SELECT id FROM dashboard_sessions WHERE principal_id = $1
              ORDER BY created_at DESC, id LIMIT $2)",
    )
    .bind(principal.id())
    .bind(SIGN_INS_PER_PRINCIPAL)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(SignIn {
        principal,
        session_id,
    })
}

/// Sign out: the sign-in's row goes, and with it every copy of its cookie.
pub async fn end(pool: &PgPool, session_id: Uuid) -> BusResult<()> {
    sqlx::query("DELETE FROM dashboard_sessions WHERE id = $1")
        .bind(session_id)
        .execute(pool)
        .await?;
    Ok(())
}

/// The viewer a cookie's sign-in stands for now, or why it no longer signs
/// in: its credential revoked (or agent disabled), or the sign-in ended.
pub async fn recheck(pool: &PgPool, sign_in: SignIn) -> BusResult<Viewer> {
    let revoked = || {
        BusError::unauthenticated(
            "the credential this dashboard session was opened with was revoked, or its agent \
             disabled. Sign in again with a live credential.",
        )
    };
    let signed_out = || {
        BusError::unauthenticated(
            "this dashboard sign-in has ended: it was signed out (here or in another browser \
             holding the same cookie), or a newer sign-in with the same credential replaced it. \
             Sign in again.",
        )
    };
    let SignIn {
        principal,
        session_id,
    } = sign_in;
    // Whether the sign-in's row is still there, in the same round trip.
    const LIVE: &str = "EXISTS (SELECT 1 FROM dashboard_sessions d
                                 WHERE d.id = $3 AND d.team_id = $1 AND d.principal_id = $2
                                   AND d.expires_at > now())";
    let viewer = match principal {
        Principal::Agent { team_id, token_id } | Principal::Person { team_id, token_id } => {
            // The row's kind must still be the principal's: a cookie never
            // turns an agent's sign-in into a person's.
            static SQL: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT a.id, a.name, tm.slug, r.refusal, {LIVE}, a.kind
                       FROM agent_tokens t
                       JOIN agents a ON a.team_id = t.team_id AND a.id = t.agent_id
                       JOIN teams tm ON tm.id = t.team_id
                       CROSS JOIN LATERAL agent_credential_refusal(t.team_id, t.agent_id, t.id, NULL, NULL) r
                      WHERE t.team_id = $1 AND t.id = $2"
                )
            });
            let row: Option<(Uuid, String, String, Option<String>, bool, String)> =
                sqlx::query_as(SQL.as_str())
                    .bind(team_id)
                    .bind(token_id)
                    .bind(session_id)
                    .fetch_optional(pool)
                    .await?;
            match row {
                Some((agent_id, name, team, None, live, kind)) if kind == principal.kind() => (
                    Viewer {
                        principal,
                        agent_id: Some(agent_id),
                        team,
                        kind: principal.kind(),
                        name,
                    },
                    live,
                ),
                _ => return Err(revoked()),
            }
        }
        Principal::Admin {
            team_id,
            credential_id,
        } => {
            static SQL: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT c.display_prefix, tm.slug, {LIVE}
                       FROM admin_credentials c JOIN teams tm ON tm.id = $1
                      WHERE c.id = $2 AND c.revoked_at IS NULL
                        AND (c.team_id IS NULL OR c.team_id = $1)"
                )
            });
            let row: Option<(String, String, bool)> = sqlx::query_as(SQL.as_str())
                .bind(team_id)
                .bind(credential_id)
                .bind(session_id)
                .fetch_optional(pool)
                .await?;
            let (prefix, team, live) = row.ok_or_else(revoked)?;
            (
                Viewer {
                    principal,
                    agent_id: None,
                    team,
                    kind: "admin",
                    name: format!("admin:{prefix}"),
                },
                live,
            )
        }
    };
    match viewer {
        (viewer, true) => Ok(viewer),
        (_, false) => Err(signed_out()),
    }
}
