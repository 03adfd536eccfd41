//! Admin credentials (`acsa_…`): global, or confined to one team.
//!
//! They manage teams, agents, tokens and credentials over `/admin`; they never
//! post, read or claim. A team credential stays inside its team: another
//! team's slug is refused (403) whether that team exists or not, so a scoped
//! credential cannot even learn which teams exist. Only a global credential
//! creates teams or grants credentials. `bootstrap` (local, beside the
//! database) mints the first global one.
//!
//! The check lives in the store functions' signatures, not in each route: the
//! functions that manage teams, agents, tokens and credentials take a
//! [`TeamScope`] or a [`GlobalScope`], and the only way to make one is to check
//! an [`Authority`] (the local operator, or a remote credential) against the
//! team or the operation. A new route or command cannot forget the check; the
//! actor the audit log names comes from the same authority.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::auth::{self, ADMIN_CREDENTIAL_PREFIX};
use crate::error::{BusError, BusResult};
use crate::store::{Actor, Source, identity::audit, identity::teams, normalize_team_slug};

/// The caller of one `/admin` request.
#[derive(Clone, Debug)]
pub struct AdminIdentity {
    pub credential_id: Uuid,
    pub display_prefix: String,
    pub label: Option<String>,
    /// `None` for a global credential.
    pub team_id: Option<Uuid>,
    pub team: Option<String>,
}

impl AdminIdentity {
    pub fn actor(&self) -> Actor {
        Actor {
            name: format!("admin:{}", self.display_prefix),
            source: Source::Http,
            admin_credential: Some(self.credential_id),
        }
    }

    pub fn is_global(&self) -> bool {
        self.team_id.is_none()
    }

    /// Refuse a team credential acting on any team but its own. Answers the
    /// same for a team that exists and one that does not.
    fn authorize_team(&self, slug: &str) -> BusResult<()> {
        match &self.team {
            None => Ok(()),
            Some(own) if slug.trim().eq_ignore_ascii_case(own) => Ok(()),
            Some(own) => Err(BusError::forbidden(format!(
                "this admin credential is confined to team `{own}` and cannot act on another team. \
                 Use a global admin credential, or one granted for that team."
            ))),
        }
    }

    fn require_global(&self, what: &str) -> BusResult<()> {
        match &self.team {
            None => Ok(()),
            Some(own) => Err(BusError::forbidden(format!(
                "only a global admin credential can {what}; this one is confined to team `{own}`."
            ))),
        }
    }
}

/// On whose authority teams, agents, tokens and credentials are managed.
#[derive(Clone, Debug)]
pub enum Authority {
    /// The operator on the machine, beside the database: every team and
    /// every operation.
    Local(Actor),
    /// A remote admin credential over `/admin`: global, or confined to one team.
    Admin(AdminIdentity),
}

impl Authority {
    /// The operator at this terminal ([`Actor::local_operator`]).
    pub fn local() -> Authority {
        Authority::Local(Actor::local_operator())
    }

    /// Who the audit log names for a change made on this authority.
    pub fn actor(&self) -> Actor {
        match self {
            Authority::Local(actor) => actor.clone(),
            Authority::Admin(me) => me.actor(),
        }
    }

    /// The one team a scoped credential is confined to; `None` for every team.
    pub fn confined_to(&self) -> Option<Uuid> {
        match self {
            Authority::Local(_) => None,
            Authority::Admin(me) => me.team_id,
        }
    }

    /// Permission to act on team `slug`, or the refusal (403) a credential
    /// confined to another team gets. A credential's slug comes back
    /// normalised, after the scope check (scope first: a scoped credential
    /// learns nothing, not even whether the slug is well-formed); the local
    /// operator's comes back as given, and the store function normalises it
    /// where it always has.
    pub fn team(&self, slug: &str) -> BusResult<TeamScope> {
        let slug = match self {
            Authority::Local(_) => slug.to_owned(),
            Authority::Admin(me) => {
                me.authorize_team(slug)?;
                normalize_team_slug(slug)?
            }
        };
        Ok(TeamScope {
            slug,
            actor: self.actor(),
            authority: self.clone(),
        })
    }

    /// Permission for an operation only a global authority has (create
    /// teams, manage credentials); `what` completes the refusal's
    /// "only a global admin credential can …".
    pub fn global(&self, what: &str) -> BusResult<GlobalScope> {
        if let Authority::Admin(me) = self {
            me.require_global(what)?;
        }
        Ok(GlobalScope {
            actor: self.actor(),
        })
    }
}

/// Permission to act on one team, made only by [`Authority::team`].
#[derive(Clone, Debug)]
pub struct TeamScope {
    slug: String,
    actor: Actor,
    /// Who gave the permission, for an operation on the team that only a
    /// global authority may do ([`TeamScope::global`]).
    authority: Authority,
}

impl TeamScope {
    /// Permission for an operation on this team that a credential confined to
    /// it may not do (pruning its audit trail: the record of what its own
    /// admins did); refused as [`Authority::global`] refuses.
    pub fn global(&self, what: &str) -> BusResult<GlobalScope> {
        self.authority.global(what)
    }

    /// The team's slug (see [`Authority::team`] for when it is normalised).
    pub fn slug(&self) -> &str {
        &self.slug
    }

    pub fn actor(&self) -> &Actor {
        &self.actor
    }
}

/// Permission for a global operation, made only by [`Authority::global`].
#[derive(Clone, Debug)]
pub struct GlobalScope {
    actor: Actor,
}

impl GlobalScope {
    pub fn actor(&self) -> &Actor {
        &self.actor
    }
}

/// What a change by id may reach: one team's rows, or any team's.
#[derive(Clone, Copy, Debug)]
pub enum Reach<'a> {
    Team(&'a TeamScope),
    AnyTeam(&'a GlobalScope),
}

impl Reach<'_> {
    /// The team the change must stay inside, if any.
    pub fn team(&self) -> Option<&str> {
        match self {
            Reach::Team(scope) => Some(scope.slug()),
            Reach::AnyTeam(_) => None,
        }
    }

    pub fn actor(&self) -> &Actor {
        match self {
            Reach::Team(scope) => scope.actor(),
            Reach::AnyTeam(scope) => scope.actor(),
        }
    }
}

impl<'a> From<&'a TeamScope> for Reach<'a> {
    fn from(scope: &'a TeamScope) -> Self {
        Reach::Team(scope)
    }
}

impl<'a> From<&'a GlobalScope> for Reach<'a> {
    fn from(scope: &'a GlobalScope) -> Self {
        Reach::AnyTeam(scope)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct IssuedAdminCredential {
    pub id: Uuid,
    /// `global`, or the team slug the credential is confined to.
    pub scope: String,
    pub credential: String,
    pub display_prefix: String,
    pub label: Option<String>,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct AdminCredentialSummary {
    pub id: Uuid,
    pub scope: String,
    pub display_prefix: String,
    pub label: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct AdminRevocation {
    pub credential: AdminCredentialSummary,
    pub revoked_now: bool,
}

/// Resolve an admin credential digest; revoked or unknown is 401.
pub async fn authenticate(pool: &PgPool, sha256: &[u8; 32]) -> BusResult<AdminIdentity> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: Uuid,
        display_prefix: String,
        label: Option<String>,
        team_id: Option<Uuid>,
        team: Option<String>,
        revoked_at: Option<DateTime<Utc>>,
        last_used_stale: bool,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT c.id, c.display_prefix, c.label, c.team_id, t.slug AS team, c.revoked_at,
                (c.last_used_at IS NULL OR c.last_used_at < now() - interval '60 seconds') AS last_used_stale
         FROM admin_credentials c LEFT JOIN teams t ON t.id = c.team_id
         WHERE c.secret_sha256 = $1",
    )
    .bind(&sha256[..])
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Err(BusError::unauthenticated(
            "unknown admin credential. `ai-crew-sync admin bootstrap` (beside the database) mints \
             the first one; a global admin grants more with `ai-crew-sync admin grant`.",
        ));
    };
    if let Some(at) = row.revoked_at {
        return Err(BusError::unauthenticated(format!(
            "this admin credential was revoked at {}. Ask a global admin for a new one.",
            at.to_rfc3339()
        )));
    }
    if row.last_used_stale {
        sqlx::query("UPDATE admin_credentials SET last_used_at = now() WHERE id = $1")
            .bind(row.id)
            .execute(pool)
            .await?;
    }
    Ok(AdminIdentity {
        credential_id: row.id,
        display_prefix: row.display_prefix,
        label: row.label,
        team_id: row.team_id,
        team: row.team,
    })
}

/// Bytes of an admin credential's label, at most.
pub const CREDENTIAL_LABEL_MAX_BYTES: usize = 64;

fn check_label(label: Option<&str>) -> BusResult<Option<String>> {
    crate::store::text::optional_label(
        "credential label",
        label,
        CREDENTIAL_LABEL_MAX_BYTES,
        "Use a short note such as `ci` or `alice-laptop`; nothing was created.",
    )
}

/// The first global credential, minted locally. Refused while a live global
/// credential exists unless `force` (the operator lost it, say).
pub async fn bootstrap(
    pool: &PgPool,
    label: Option<&str>,
    force: bool,
    actor: &Actor,
) -> BusResult<IssuedAdminCredential> {
    let label = check_label(label)?.or_else(|| Some("bootstrap".into()));
    let mut tx = pool.begin().await?;
    // Serialises concurrent bootstraps so only one of them sees "none yet".
    sqlx::query("LOCK TABLE admin_credentials IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM admin_credentials WHERE team_id IS NULL AND revoked_at IS NULL",
    )
    .fetch_one(&mut *tx)
    .await?;
    if live > 0 && !force {
        return Err(BusError::conflict(format!(
            "{live} live global admin credential(s) already exist. Use one of them \
             (`ai-crew-sync admin login`), or pass --force to mint another."
        )));
    }
    let issued = insert_credential(&mut tx, None, None, label, actor).await?;
    tx.commit().await?;
    Ok(issued)
}

/// A new credential: confined to `team`, or global when `team` is None.
/// Only a global credential (or a local operator) may call this.
pub async fn grant(
    pool: &PgPool,
    global: &GlobalScope,
    team: Option<&str>,
    label: Option<&str>,
) -> BusResult<IssuedAdminCredential> {
    let actor = global.actor();
    let label = check_label(label)?;
    let mut tx = pool.begin().await?;
    let team = match team {
        Some(slug) => Some(teams::find(&mut *tx, slug).await?),
        None => None,
    };
    let issued = insert_credential(
        &mut tx,
        team.as_ref().map(|t| t.id),
        team.as_ref().map(|t| t.slug.as_str()),
        label,
        actor,
    )
    .await?;
    tx.commit().await?;
    Ok(issued)
}

async fn insert_credential(
    conn: &mut sqlx::PgConnection,
    team_id: Option<Uuid>,
    team_slug: Option<&str>,
    label: Option<String>,
    actor: &Actor,
) -> BusResult<IssuedAdminCredential> {
    let secret = auth::new_secret(ADMIN_CREDENTIAL_PREFIX);
    let id = Uuid::new_v4();
    let created_at: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO admin_credentials (id, team_id, secret_sha256, display_prefix, label, created_by)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING created_at",
    )
    .bind(id)
    .bind(team_id)
    .bind(&secret.sha256[..])
    .bind(&secret.display_prefix)
    .bind(&label)
    .bind(&actor.name)
    .fetch_one(&mut *conn)
    .await?;
    let scope = team_slug.unwrap_or("global").to_string();
    audit::record(
        conn,
        team_id,
        actor,
        "admin_credential.grant",
        &id.to_string(),
        json!({ "scope": scope, "display_prefix": secret.display_prefix, "label": label }),
    )
    .await?;
    Ok(IssuedAdminCredential {
        id,
        scope,
        credential: secret.plaintext,
        display_prefix: secret.display_prefix,
        label,
        created_at,
    })
}

macro_rules! credential_select {
    () => {
        "SELECT c.id, coalesce(t.slug, 'global') AS scope, c.display_prefix, c.label, c.created_by,
                c.created_at, c.last_used_at, c.revoked_at
         FROM admin_credentials c LEFT JOIN teams t ON t.id = c.team_id"
    };
}

pub async fn list(pool: &PgPool, _global: &GlobalScope) -> BusResult<Vec<AdminCredentialSummary>> {
    Ok(
        sqlx::query_as(concat!(credential_select!(), " ORDER BY c.created_at"))
            .fetch_all(pool)
            .await?,
    )
}

/// Revoke an admin credential. One transition and one audit row however many
/// callers race.
pub async fn revoke(pool: &PgPool, global: &GlobalScope, id: Uuid) -> BusResult<AdminRevocation> {
    let actor = global.actor();
    let mut tx = pool.begin().await?;
    // Two admins revoking each other would each hold the other's lock and wait
    // for their own: take the actor's (shared, as audit::record will) first
    // when its id sorts first, so the two locks are always taken in id order.
    if let Some(own) = actor.admin_credential
        && own < id
    {
        sqlx::query("SELECT lock_admin_credential($1, false)")
            .bind(own)
            .execute(&mut *tx)
            .await?;
    }
    // The fence's exclusive side (audit::record takes it shared): changes in
    // flight with this credential commit first, and none commits after.
    sqlx::query("SELECT lock_admin_credential($1, true)")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let live: Option<(Option<Uuid>, String)> = sqlx::query_as(
        "SELECT team_id, display_prefix FROM admin_credentials WHERE id = $1 AND revoked_at IS NULL",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some((team_id, prefix)) = &live {
        // Recorded (and the actor's own credential re-checked) before the
        // update, so a credential can still revoke itself.
        audit::record(
            &mut tx,
            *team_id,
            actor,
            "admin_credential.revoke",
            &id.to_string(),
            json!({ "display_prefix": prefix }),
        )
        .await?;
        sqlx::query("UPDATE admin_credentials SET revoked_at = now() WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    let credential: Option<AdminCredentialSummary> =
        sqlx::query_as(concat!(credential_select!(), " WHERE c.id = $1"))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let credential = credential.ok_or_else(|| {
        BusError::not_found(format!(
            "no admin credential with id {id}. `ai-crew-sync admin credential list` shows them."
        ))
    })?;
    tx.commit().await?;
    Ok(AdminRevocation {
        credential,
        revoked_now: live.is_some(),
    })
}
