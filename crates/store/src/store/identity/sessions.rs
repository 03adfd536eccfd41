//! Session credentials: authenticated windows (`acss_…`).
//!
//! One row per (agent, label). A label with a live row cannot be registered
//! again; a dead row (revoked, expired, parent token revoked) is taken over
//! with its epoch bumped. `resume` rotates the secret and bumps the epoch,
//! fenced on the epoch the caller holds; `renew` only moves the expiry.
//!
//! The fence that makes revocation mean something is [`guard`]: every mutation
//! calls it first inside its own transaction, with a session credential or a
//! bare agent token alike. It is the SQL function `agent_write_refusal`
//! (migration 0016): a shared advisory lock on the agent, then a fresh read of
//! agent, token and window. Every change that takes a credential away (agent
//! disable, token revoke, revoke/resume/renew of a window) takes that lock
//! exclusively first, so it either committed before the read, and the mutation
//! is refused, or waits until the mutation has committed. A mutation can never
//! commit after the revocation that should have stopped it.
//!
//! A conversation send is one call of `store_conversation_message`, and the
//! hot task writes one call of `task_change` / `task_claim_next` (migration
//! 0032), and the write tools of migration 0033 (locks, heartbeat, notes,
//! acks, receipts, inbox confirmation) one call each of their functions
//! (`store/fenced.rs`); each calls the same `agent_write_refusal` first: the
//! rule lives once, in SQL, and only its words ([`Refusal::check`]) live here.
//!
//! Not here: presence of windows (heartbeats; a revoke only ends the
//! window's presence) and the shared session `""`, which needs no credential.

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::auth::{self, Identity, SESSION_CREDENTIAL_PREFIX, SessionCredential};
use crate::error::{BusError, BusResult};
use crate::store::{Actor, Source, address, fenced, identity::audit};

pub const TTL_MIN_SECS: i64 = 60;
pub const TTL_MAX_SECS: i64 = 86_400;
pub const TTL_DEFAULT_SECS: i64 = 86_400;

/// A credential just minted (register or resume): the only copy of the secret.
#[derive(Clone, Debug, Serialize)]
pub struct IssuedSession {
    pub session_id: Uuid,
    pub session: String,
    pub address: String,
    pub credential: String,
    pub epoch: i64,
    pub expires_at: DateTime<Utc>,
    /// What to do with it, for the model that receives it.
    pub usage: String,
}

/// A session's state, without its secret.
#[derive(Clone, Debug, Serialize)]
pub struct SessionState {
    pub session_id: Uuid,
    pub session: String,
    pub address: String,
    pub epoch: i64,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

fn check_ttl(ttl_seconds: Option<i64>) -> BusResult<Duration> {
    crate::store::limits::seconds_to_a_day(
        "ttl_seconds",
        ttl_seconds,
        TTL_DEFAULT_SECS,
        TTL_MIN_SECS..=TTL_MAX_SECS,
        "Omit it for 24 h, and call renew_session before it runs out.",
    )
}

fn usage(credential: &str, label: &str, epoch: i64) -> String {
    format!(
        "Use `Authorization: Bearer {}…` for this window from now on (optionally with \
         `X-Crew-Session: {label}` and `X-Crew-Epoch: {epoch}`). It expires unless renewed with \
         renew_session; resume_session rotates it.",
        &credential[..auth::DISPLAY_PREFIX_LEN]
    )
}

/// The re-check every mutation makes first, inside its own transaction.
///
/// It calls `agent_write_refusal` (migration 0016), the one definition of
/// "may this credential write now" that the send function calls too: a shared
/// advisory lock on the agent, which every revocation takes exclusively (see
/// [`lock_agent_credentials`]), then a read of the agent, the token and (with a
/// session credential) the window and its epoch in a statement whose snapshot
/// is taken after the lock. So a disable or a revocation either committed
/// before this read, and the mutation is refused, or waits until the mutation
/// has committed. Call it before any other statement of the transaction.
pub async fn guard(conn: &mut PgConnection, me: &Identity) -> BusResult<()> {
    guard_locking(conn, me, false).await
}

/// [`guard`] for a mutation of the session row itself (renew, resume, revoke):
/// the fence is taken exclusively, so the window's writes in flight finish
/// first and none starts until this has committed.
async fn guard_for_update(conn: &mut PgConnection, me: &Identity) -> BusResult<()> {
    guard_locking(conn, me, true).await
}

async fn guard_locking(conn: &mut PgConnection, me: &Identity, exclusive: bool) -> BusResult<()> {
    let refusal: Refusal = fenced::with_credential(
        "SELECT refusal, session_epoch, refused_since FROM agent_write_refusal($1, $2, $3, $4, $5, $6)",
        me,
    )
    .bind(exclusive)
    .fetch_one(&mut *conn)
    .await?;
    refusal.check(me)
}

/// Take away nothing yet, but make room for it: the exclusive side of the
/// write fence. Agent disable and token revocation call it before their
/// update, so they wait for the agent's writes in flight and every later
/// write's [`guard`] waits for them and then sees the change.
pub(crate) async fn lock_agent_credentials(
    conn: &mut PgConnection,
    agent_id: Uuid,
) -> BusResult<()> {
    sqlx::query("SELECT lock_agent_credentials($1, true)")
        .bind(agent_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Whether the caller's credential still holds, without the fence's lock: for
/// a read that is about to answer (a long poll waking up), so an answer is
/// never handed out after its credential was taken away.
pub async fn still_valid(pool: &PgPool, me: &Identity) -> BusResult<()> {
    let refusal: Refusal = fenced::with_credential(
        "SELECT refusal, session_epoch, refused_since FROM agent_credential_refusal($1, $2, $3, $4, $5)",
        me,
    )
    .fetch_one(pool)
    .await?;
    refusal.check(me)
}

/// What `agent_credential_refusal` (migration 0016) answers: a code, or none
/// when the credential may act. The words are here; the rule is in SQL.
#[derive(sqlx::FromRow)]
pub(crate) struct Refusal {
    refusal: Option<String>,
    session_epoch: Option<i64>,
    refused_since: Option<DateTime<Utc>>,
}

impl Refusal {
    /// The refusal in words, for a caller identified as `me`; with a session
    /// credential, `me.window.epoch` is the epoch it holds.
    pub(crate) fn check(&self, me: &Identity) -> BusResult<()> {
        let Some(code) = self.refusal.as_deref() else {
            return Ok(());
        };
        let label = &me.window;
        let since = self
            .refused_since
            .map(|at| format!(" at {}", at.to_rfc3339()))
            .unwrap_or_default();
        Err(match code {
            "agent_disabled" => disabled(me),
            "token_unknown" => BusError::unauthenticated(
                "this agent token no longer exists; nothing was written. Ask the operator for a \
                 new token.",
            ),
            "token_revoked" => BusError::unauthenticated(format!(
                "this agent token was revoked{since}; nothing was written. Ask the operator for a \
                 new one (`ai-crew-sync token issue --team {} --agent {}`).",
                me.team, me.agent
            )),
            "session_unknown" => BusError::unauthenticated(
                "this session no longer exists; nothing was written. Register the window again \
                 with your agent token.",
            ),
            "session_token_revoked" => BusError::unauthenticated(format!(
                "session `{label}` is revoked: the agent token it was registered with was revoked. \
                 Nothing was written. Register the window again with a live agent token."
            )),
            "session_revoked" => BusError::unauthenticated(format!(
                "session `{label}` was revoked{since}; nothing was written. Register the window \
                 again (register_session with your agent token) to get a new credential."
            )),
            "session_expired" => BusError::unauthenticated(format!(
                "session `{label}` has expired; nothing was written. Register the window again \
                 (register_session with your agent token), and renew_session before expiry next time."
            )),
            "stale_epoch" => BusError::conflict(format!(
                "this connection is stale: it holds epoch {} of session `{label}`, which is now at \
                 epoch {} (it was resumed or taken over elsewhere). Nothing was written. Use the \
                 credential and epoch the latest resume_session or register_session returned.",
                me.session_credential.map(|w| w.epoch).unwrap_or_default(),
                self.session_epoch.unwrap_or_default()
            )),
            other => BusError::unauthenticated(format!(
                "this credential may not act ({other}); nothing was written."
            )),
        })
    }
}

fn disabled(me: &Identity) -> BusError {
    BusError::forbidden(format!(
        "agent `{}` of team `{}` is disabled; every token and window of it is refused. An operator \
         can re-enable it with `ai-crew-sync agent enable --team {} --name {}`.",
        me.agent, me.team, me.team, me.agent
    ))
}

/// Resolve a session credential to its window. `header_label` is a validated
/// `X-Crew-Session` (it must agree); `epoch` a validated `X-Crew-Epoch`.
pub async fn authenticate(
    pool: &PgPool,
    sha256: &[u8; 32],
    header_label: Option<&str>,
    epoch: Option<i64>,
) -> BusResult<Identity> {
    Ok(authenticate_until(pool, sha256, header_label, epoch)
        .await?
        .0)
}

/// [`authenticate`], and when the credential expires (for a cache that must
/// not serve it past then).
pub async fn authenticate_until(
    pool: &PgPool,
    sha256: &[u8; 32],
    header_label: Option<&str>,
    epoch: Option<i64>,
) -> BusResult<(Identity, DateTime<Utc>)> {
    #[derive(sqlx::FromRow)]
    struct Row {
        session_id: Uuid,
        label: String,
        token_id: Uuid,
        epoch: i64,
        expires_at: DateTime<Utc>,
        agent_id: Uuid,
        agent: String,
        team_id: Uuid,
        team: String,
        #[sqlx(flatten)]
        refusal: Refusal,
    }
    // The epoch fence is asked for only when the caller presented one.
    let row: Option<Row> = sqlx::query_as(
        "SELECT s.id AS session_id, s.label, s.token_id, s.epoch, s.expires_at,
                a.id AS agent_id, a.name AS agent,
                tm.id AS team_id, tm.slug AS team, r.refusal, r.session_epoch, r.refused_since
         FROM agent_sessions s
         JOIN agents a ON a.team_id = s.team_id AND a.id = s.agent_id
         JOIN teams tm ON tm.id = s.team_id
         CROSS JOIN LATERAL agent_credential_refusal(s.team_id, s.agent_id, s.token_id, s.id, $2) r
         WHERE s.secret_sha256 = $1",
    )
    .bind(&sha256[..])
    .bind(epoch)
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Err(BusError::unauthenticated(
            "unknown session credential: it was never issued, or was rotated by resume_session \
             (only the newest secret works). Register the window again with your agent token.",
        ));
    };
    if let Some(header) = header_label
        && header != row.label
    {
        return Err(BusError::unauthenticated(format!(
            "this session credential belongs to window `{}`, but X-Crew-Session says `{header}`. \
             Drop the header or make it match the credential's window.",
            row.label
        )));
    }
    let identity = Identity {
        team_id: row.team_id,
        team: row.team,
        agent_id: row.agent_id,
        agent: row.agent,
        token_id: row.token_id,
        window: row.label,
        session_credential: Some(SessionCredential {
            session_id: row.session_id,
            // The epoch presented, when one was: a stale one is refused below.
            epoch: epoch.unwrap_or(row.epoch),
        }),
    };
    row.refusal.check(&identity)?;
    Ok((identity, row.expires_at))
}

fn actor_of(me: &Identity) -> Actor {
    Actor {
        name: format!("agent:{}", me.address()),
        source: Source::Mcp,
        admin_credential: None,
    }
}

/// Second key of the advisory lock that orders an agent's registrations
/// (ASCII 'ACSs'; the first is a hash of the agent), so two at once cannot
/// both count one place left under [`register`]'s cap.
const REGISTRATION_LOCK: i32 = 1_094_931_315;

/// `register_session`: a credential for window `label`, derived from the
/// caller's agent token. Refused while the label has a live session, and
/// when the agent already has `max_live` live sessions in other windows
/// (0 = no cap): each window is a row, a credential and a share of the
/// agent's calls, so an agent cannot mint them without end.
pub async fn register(
    pool: &PgPool,
    me: &Identity,
    label: &str,
    ttl_seconds: Option<i64>,
    max_live: u32,
) -> BusResult<IssuedSession> {
    if me.session_credential.is_some() {
        return Err(BusError::forbidden(
            "a session credential cannot mint credentials. Call register_session with the agent \
             token (acs_…) instead.",
        ));
    }
    let label = auth::normalize_session_label(label)?;
    if label.is_empty() {
        return Err(BusError::invalid(
            "register_session needs a non-empty `session` label naming the window (for example \
             `frontend`); the unnamed shared session needs no credential.",
        ));
    }
    let ttl = check_ttl(ttl_seconds)?;
    let secret = auth::new_secret(SESSION_CREDENTIAL_PREFIX);
    let mut tx = pool.begin().await?;
    guard(&mut tx, me).await?;
    if max_live > 0 {
        refuse_past_live_cap(&mut tx, me, &label, max_live).await?;
    }
    let inserted: Option<(Uuid, i64, DateTime<Utc>)> = sqlx::query_as(
        "INSERT INTO agent_sessions (id, team_id, agent_id, token_id, label, secret_sha256, display_prefix, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8)
         ON CONFLICT (team_id, agent_id, label) DO NOTHING
         RETURNING id, epoch, expires_at",
    )
    .bind(Uuid::new_v4())
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(me.token_id)
    .bind(&label)
    .bind(&secret.sha256[..])
    .bind(&secret.display_prefix)
    .bind(ttl)
    .fetch_optional(&mut *tx)
    .await?;
    let (session_id, epoch, expires_at, took_over) = match inserted {
        Some((id, epoch, expires_at)) => (id, epoch, expires_at, false),
        None => {
            // The label has a row: take it over only if it is dead. The row lock
            // orders this against a concurrent registration of the same label;
            // the token is read by a subquery, evaluated again against the row
            // a concurrent takeover left (a joined token row would be the old
            // token's, and the row would drop out).
            let existing: (Uuid, bool, DateTime<Utc>) = sqlx::query_as(
                "SELECT s.id,
                        s.revoked_at IS NULL AND s.expires_at > now()
                          AND EXISTS (SELECT 1 FROM agent_tokens t
                                       WHERE t.team_id = s.team_id AND t.agent_id = s.agent_id
                                         AND t.id = s.token_id AND t.revoked_at IS NULL) AS live,
                        s.expires_at
                 FROM agent_sessions s
                 WHERE s.team_id = $1 AND s.agent_id = $2 AND s.label = $3
                 FOR UPDATE OF s",
            )
            .bind(me.team_id)
            .bind(me.agent_id)
            .bind(&label)
            .fetch_one(&mut *tx)
            .await?;
            if existing.1 {
                return Err(BusError::conflict(format!(
                    "window `{label}` already has a live session (until {}). Pick another label, \
                     resume_session with that window's credential, or revoke_session {{\"session\": \
                     \"{label}\"}} first.",
                    existing.2.to_rfc3339()
                )));
            }
            let (epoch, expires_at): (i64, DateTime<Utc>) = sqlx::query_as(
                "UPDATE agent_sessions
                 SET token_id = $2, secret_sha256 = $3, display_prefix = $4, epoch = epoch + 1,
                     expires_at = now() + $5, revoked_at = NULL, updated_at = now()
                 WHERE id = $1
                 RETURNING epoch, expires_at",
            )
            .bind(existing.0)
            .bind(me.token_id)
            .bind(&secret.sha256[..])
            .bind(&secret.display_prefix)
            .bind(ttl)
            .fetch_one(&mut *tx)
            .await?;
            (existing.0, epoch, expires_at, true)
        }
    };
    audit::record(
        &mut tx,
        Some(me.team_id),
        &actor_of(me),
        "session.register",
        &address(&me.agent, &label),
        json!({ "session_id": session_id, "epoch": epoch, "took_over": took_over,
                "display_prefix": secret.display_prefix }),
    )
    .await?;
    tx.commit().await?;
    Ok(IssuedSession {
        session_id,
        address: address(&me.agent, &label),
        usage: usage(&secret.plaintext, &label, epoch),
        session: label,
        credential: secret.plaintext,
        epoch,
        expires_at,
    })
}

/// Refuse a registration of `label` when the agent's other windows already
/// hold `max_live` live sessions. Taken under the agent's registration lock
/// (after the write fence), held to the commit, so the count cannot go stale
/// before the insert.
async fn refuse_past_live_cap(
    conn: &mut PgConnection,
    me: &Identity,
    label: &str,
    max_live: u32,
) -> BusResult<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2::text))")
        .bind(REGISTRATION_LOCK)
        .bind(me.agent_id)
        .execute(&mut *conn)
        .await?;
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_sessions s
         WHERE s.team_id = $1 AND s.agent_id = $2 AND s.label <> $3
           AND s.revoked_at IS NULL AND s.expires_at > now()
           AND EXISTS (SELECT 1 FROM agent_tokens t
                        WHERE t.team_id = s.team_id AND t.agent_id = s.agent_id
                          AND t.id = s.token_id AND t.revoked_at IS NULL)",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(label)
    .fetch_one(&mut *conn)
    .await?;
    if live >= i64::from(max_live) {
        return Err(BusError::conflict(format!(
            "agent `{}` already has {live} live sessions (windows with a session credential); \
             the limit is {max_live} per agent on this server. Nothing was registered. End \
             windows you no longer use with revoke_session {{\"session\": \"LABEL\"}} (or let \
             them expire), or reuse one of them with its credential, then register again.",
            me.agent
        )));
    }
    Ok(())
}

fn needs_session_credential(tool: &str) -> BusError {
    BusError::invalid(format!(
        "{tool} works on the window whose session credential (acss_…) makes the call; this call \
         used the agent token. Call it with the window's credential, or register_session first."
    ))
}

/// `resume_session`: rotate the secret and bump the epoch, fenced on the
/// epoch this connection holds. The old secret stops working at commit.
pub async fn resume(pool: &PgPool, me: &Identity) -> BusResult<IssuedSession> {
    let window = me
        .session_credential
        .ok_or_else(|| needs_session_credential("resume_session"))?;
    let secret = auth::new_secret(SESSION_CREDENTIAL_PREFIX);
    let mut tx = pool.begin().await?;
    guard_for_update(&mut tx, me).await?;
    let (epoch, expires_at): (i64, DateTime<Utc>) = sqlx::query_as(
        "UPDATE agent_sessions
         SET secret_sha256 = $3, display_prefix = $4, epoch = epoch + 1, updated_at = now()
         WHERE team_id = $1 AND id = $2
         RETURNING epoch, expires_at",
    )
    .bind(me.team_id)
    .bind(window.session_id)
    .bind(&secret.sha256[..])
    .bind(&secret.display_prefix)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        Some(me.team_id),
        &actor_of(me),
        "session.resume",
        &me.address(),
        json!({ "session_id": window.session_id, "epoch": epoch, "display_prefix": secret.display_prefix }),
    )
    .await?;
    tx.commit().await?;
    Ok(IssuedSession {
        session_id: window.session_id,
        address: me.address(),
        usage: usage(&secret.plaintext, &me.window, epoch),
        session: me.window.clone(),
        credential: secret.plaintext,
        epoch,
        expires_at,
    })
}

/// `renew_session`: push the expiry to now + ttl; secret and epoch stay.
pub async fn renew(
    pool: &PgPool,
    me: &Identity,
    ttl_seconds: Option<i64>,
) -> BusResult<SessionState> {
    let window = me
        .session_credential
        .ok_or_else(|| needs_session_credential("renew_session"))?;
    let ttl = check_ttl(ttl_seconds)?;
    let mut tx = pool.begin().await?;
    guard_for_update(&mut tx, me).await?;
    let (epoch, expires_at): (i64, DateTime<Utc>) = sqlx::query_as(
        "UPDATE agent_sessions SET expires_at = now() + $3, updated_at = now()
         WHERE team_id = $1 AND id = $2
         RETURNING epoch, expires_at",
    )
    .bind(me.team_id)
    .bind(window.session_id)
    .bind(ttl)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(SessionState {
        session_id: window.session_id,
        session: me.window.clone(),
        address: me.address(),
        epoch,
        expires_at,
        revoked_at: None,
    })
}

/// `revoke_session`: end this window's session, or (by `label`) another
/// window of the same agent; its presence goes offline with it. What the
/// window still holds (claimed tasks, locks, path reservations) is released
/// by the departures pass once it has stayed revoked for a few seconds
/// (`holdings::release_revoked_windows`): a proxy taking its window over
/// revokes it and registers the same label again at once, and keeps it.
/// Revoking a dead session changes nothing else.
pub async fn revoke(pool: &PgPool, me: &Identity, label: Option<&str>) -> BusResult<SessionState> {
    let label = match label.map(auth::normalize_session_label).transpose()? {
        Some(label) if !label.is_empty() => label,
        _ if me.session_credential.is_some() => me.window.clone(),
        _ => {
            return Err(BusError::invalid(
                "revoke_session with the agent token needs `session`: the label of the window to \
                 revoke (with a session credential, omit it to revoke the calling window).",
            ));
        }
    };
    let mut tx = pool.begin().await?;
    // Like any mutation: a stale or revoked connection cannot revoke anything,
    // including the session that replaced it.
    guard_for_update(&mut tx, me).await?;
    #[derive(sqlx::FromRow)]
    struct Revoked {
        id: Uuid,
        epoch: i64,
        expires_at: DateTime<Utc>,
        revoked_at: Option<DateTime<Utc>>,
        was_live: bool,
    }
    let row: Option<Revoked> = sqlx::query_as(
        "WITH target AS (
             SELECT id, revoked_at IS NULL AS was_live FROM agent_sessions
             WHERE team_id = $1 AND agent_id = $2 AND label = $3 FOR UPDATE
         )
         UPDATE agent_sessions s SET revoked_at = coalesce(s.revoked_at, now()), updated_at = now()
         FROM target WHERE s.id = target.id
         RETURNING s.id, s.epoch, s.expires_at, s.revoked_at, target.was_live",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&label)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(Revoked {
        id: session_id,
        epoch,
        expires_at,
        revoked_at,
        was_live,
    }) = row
    else {
        return Err(BusError::not_found(format!(
            "agent `{}` has no registered window `{label}`; nothing to revoke.",
            me.agent
        )));
    };
    // The window is gone: offline now, not at the end of its last beat's ttl
    // (and no longer listed: `presence::listed!`).
    sqlx::query(
        "UPDATE presence SET expires_at = least(expires_at, now())
         WHERE team_id = $1 AND agent_id = $2 AND session = $3",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&label)
    .execute(&mut *tx)
    .await?;
    if was_live {
        audit::record(
            &mut tx,
            Some(me.team_id),
            &actor_of(me),
            "session.revoke",
            &address(&me.agent, &label),
            json!({ "session_id": session_id, "epoch": epoch }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(SessionState {
        session_id,
        address: address(&me.agent, &label),
        session: label,
        epoch,
        expires_at,
        revoked_at,
    })
}
