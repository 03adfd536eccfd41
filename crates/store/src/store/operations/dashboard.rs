//! What the read-only dashboard (`/dashboard`) shows, and who may see it.
//!
//! Two principals sign in: an agent (with its agent token) or an admin
//! credential confined to, or global over, the team it names. The cookie the
//! dashboard hands out only names the principal by id ([`Principal`]) and
//! the sign-in's row in `dashboard_sessions` ([`SignIn`], written by
//! [`begin`]), so [`recheck`] reads both back on every request: a revoked
//! token, a disabled agent or a revoked admin credential stops the cookie at
//! the next request, and so does signing out ([`end`] deletes the row), on
//! every replica, for every copy of the cookie.
//!
//! [`snapshot`] is a fixed handful of bounded queries (the newest N of each
//! kind), so the page costs the same on a team with a long history. What it
//! deliberately never returns: a direct message (channel messages only), a
//! conversation the signed-in agent holds no active seat in (a registered
//! window's seat does not count: its private data is for its session
//! credential, not the agent token), a body before the seat's
//! `history_from_seq`, and for an admin principal any conversation body at
//! all (metadata and receipt counts only).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::backend::Backends;
use crate::error::{BusError, BusResult};
use crate::events::{Events, ListenerState};
use crate::store::identity::admin::{self, Authority};
use crate::store::messaging::presence::{Liveness, PresenceStatus, listed};
use crate::store::tasks::TaskStatus;
use crate::store::{conversations, delivery::outbox, identity::teams, identity::tokens};

/// Newest agents (with their windows) shown.
pub const AGENTS_MAX: i64 = 200;
/// Windows shown across those agents.
pub const WINDOWS_MAX: i64 = 1_000;
/// Newest-updated tasks shown on the board.
pub const TASKS_MAX: i64 = 200;
/// Held locks shown, soonest to expire first.
pub const LOCKS_MAX: i64 = 100;
/// Newest channel messages (announcements included) shown.
pub const MESSAGES_MAX: i64 = 50;
/// Conversations shown, most recently written first.
pub const CONVERSATIONS_MAX: i64 = 20;
/// Newest messages shown per conversation.
pub const CONVERSATION_MESSAGES_MAX: i64 = 20;
/// Characters of a body shown; the rest is cut and marked.
pub const BODY_CHARS_MAX: i32 = 2_000;

/// Who a dashboard cookie stands for: ids only, re-read on every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Principal {
    /// An agent, by the agent token it signed in with.
    Agent { team_id: Uuid, token_id: Uuid },
    /// An admin credential, looking at one team.
    Admin { team_id: Uuid, credential_id: Uuid },
}

/// A principal as it is now: the team it looks at and the name to show.
#[derive(Clone, Debug, Serialize)]
pub struct Viewer {
    #[serde(skip)]
    pub principal: Principal,
    #[serde(skip)]
    pub agent_id: Option<Uuid>,
    pub team: String,
    /// `agent` or `admin`.
    pub kind: &'static str,
    /// The agent's name, or `admin:<credential prefix>`.
    pub name: String,
}

/// Sign in with an agent token (its digest): the token must be live and its
/// agent enabled, the same refusal `/mcp` gives otherwise.
pub async fn sign_in_agent(pool: &PgPool, digest: &[u8; 32]) -> BusResult<Viewer> {
    let me = tokens::authenticate(pool, digest, String::new()).await?;
    Ok(Viewer {
        principal: Principal::Agent {
            team_id: me.team_id,
            token_id: me.token_id,
        },
        agent_id: Some(me.agent_id),
        team: me.team,
        kind: "agent",
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
    fn team_id(&self) -> Uuid {
        match *self {
            Principal::Agent { team_id, .. } | Principal::Admin { team_id, .. } => team_id,
        }
    }

    /// The agent token's or the admin credential's id.
    fn id(&self) -> Uuid {
        match *self {
            Principal::Agent { token_id, .. } => token_id,
            Principal::Admin { credential_id, .. } => credential_id,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Principal::Agent { .. } => "agent",
            Principal::Admin { .. } => "admin",
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
        Principal::Agent { team_id, token_id } => {
            static SQL: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "SELECT a.id, a.name, tm.slug, r.refusal, {LIVE}
                       FROM agent_tokens t
                       JOIN agents a ON a.team_id = t.team_id AND a.id = t.agent_id
                       JOIN teams tm ON tm.id = t.team_id
                       CROSS JOIN LATERAL agent_credential_refusal(t.team_id, t.agent_id, t.id, NULL, NULL) r
                      WHERE t.team_id = $1 AND t.id = $2"
                )
            });
            let row: Option<(Uuid, String, String, Option<String>, bool)> =
                sqlx::query_as(SQL.as_str())
                    .bind(team_id)
                    .bind(token_id)
                    .bind(session_id)
                    .fetch_optional(pool)
                    .await?;
            match row {
                Some((agent_id, name, team, None, live)) => (
                    Viewer {
                        principal,
                        agent_id: Some(agent_id),
                        team,
                        kind: "agent",
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

/// Everything one dashboard render shows.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub viewer: Viewer,
    pub generated_at: DateTime<Utc>,
    pub agents: Vec<AgentView>,
    pub tasks: Vec<TaskView>,
    pub locks: Vec<LockView>,
    pub messages: Vec<ChannelMessageView>,
    pub conversations: Conversations,
    pub health: Health,
    /// The caps each list was read under.
    pub limits: Limits,
}

#[derive(Clone, Debug, Serialize)]
pub struct Limits {
    pub agents: i64,
    pub tasks: i64,
    pub locks: i64,
    pub messages: i64,
    pub conversations: i64,
    pub conversation_messages: i64,
}

#[derive(Clone, Debug, Serialize)]
pub struct AgentView {
    pub name: String,
    pub disabled: bool,
    /// Live ones first, then the most recently seen; not those revoked, nor
    /// those offline for more than a day (`presence::listed!`).
    pub windows: Vec<WindowView>,
    /// Windows offline for more than a day, left out of `windows`.
    pub older_windows: i64,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct WindowView {
    /// The window label; empty for the agent's shared session.
    pub session: String,
    pub online: bool,
    /// online, idle or offline ([`Liveness::of`] `online` and `status`).
    #[sqlx(skip)]
    pub state: Liveness,
    pub status: PresenceStatus,
    pub activity: Option<String>,
    pub project: Option<String>,
    pub role: Option<String>,
    pub last_seen_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct TaskView {
    pub key: String,
    pub title: String,
    pub status: TaskStatus,
    /// `agent` or `agent/window` holding the claim.
    pub holder: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct LockView {
    pub name: String,
    pub holder: String,
    pub purpose: Option<String>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ChannelMessageView {
    pub channel: String,
    pub from: String,
    pub body: String,
    /// True when the body was cut at [`BODY_CHARS_MAX`] characters.
    pub truncated: bool,
    pub announce: bool,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Conversations {
    /// False for an admin principal: metadata and receipt counts only.
    pub bodies_shown: bool,
    /// What this list holds and leaves out, in words.
    pub note: String,
    pub items: Vec<ConversationView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ConversationView {
    pub id: Uuid,
    pub title: String,
    pub visibility: String,
    pub archived: bool,
    pub messages: Vec<ConversationMessageView>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ConversationMessageView {
    #[serde(skip)]
    pub conversation_id: Uuid,
    pub seq: i64,
    pub from: String,
    /// None when not shown: see `body_note`.
    pub body: Option<String>,
    pub body_note: Option<String>,
    pub publication_state: conversations::PublicationState,
    pub created_at: DateTime<Utc>,
    pub recipients: i64,
    pub stored: i64,
    pub delivered: i64,
    pub acknowledged: i64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Health {
    /// The team's outbox: pending, leased, failed, oldest pending, bytes.
    pub outbox: outbox::Status,
    /// `not_configured`, `unreachable` or `configured`, as `/health` says
    /// without `?broker=check`.
    pub broker: &'static str,
    /// The event listener (`live`, `silent`, `detached`).
    pub events: ListenerState,
    /// This team's JetStream streams that need an operator, in fixed words.
    pub broker_conditions: Vec<String>,
}

/// What `viewer` may see of its team now.
pub async fn snapshot(
    pool: &PgPool,
    backends: &Backends,
    events: &Events,
    viewer: Viewer,
) -> BusResult<Snapshot> {
    let team_id = viewer.principal.team_id();
    let agents = agents(pool, team_id).await?;
    let tasks = sqlx::query_as(
        "SELECT t.key, t.title, t.status,
                CASE WHEN h.id IS NULL THEN NULL
                     WHEN t.holder_session = '' THEN h.name
                     ELSE h.name || '/' || t.holder_session END AS holder,
                t.lease_expires_at, t.updated_at
           FROM (SELECT * FROM tasks WHERE team_id = $1 ORDER BY updated_at DESC LIMIT $2) t
           LEFT JOIN agents h ON h.team_id = t.team_id AND h.id = t.holder_agent_id
          ORDER BY t.updated_at DESC",
    )
    .bind(team_id)
    .bind(TASKS_MAX)
    .fetch_all(pool)
    .await?;
    let locks = sqlx::query_as(
        "SELECT l.name,
                CASE WHEN l.holder_session = '' THEN a.name
                     ELSE a.name || '/' || l.holder_session END AS holder,
                l.purpose, l.expires_at
           FROM locks l JOIN agents a ON a.team_id = l.team_id AND a.id = l.holder_agent_id
          WHERE l.team_id = $1 AND l.expires_at > now()
          ORDER BY l.expires_at LIMIT $2",
    )
    .bind(team_id)
    .bind(LOCKS_MAX)
    .fetch_all(pool)
    .await?;
    // Channel messages only: a direct message never reaches the dashboard.
    let messages = sqlx::query_as(
        "SELECT c.name AS channel, a.name AS from, left(m.body, $3) AS body,
                char_length(m.body) > $3 AS truncated, m.announce, m.created_at
           FROM (SELECT * FROM messages
                  WHERE team_id = $1 AND channel_id IS NOT NULL
                  ORDER BY position DESC LIMIT $2) m
           JOIN channels c ON c.team_id = m.team_id AND c.id = m.channel_id
           JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
          ORDER BY m.position DESC",
    )
    .bind(team_id)
    .bind(MESSAGES_MAX)
    .bind(BODY_CHARS_MAX)
    .fetch_all(pool)
    .await?;
    let conversations = conversations(pool, team_id, viewer.agent_id).await?;
    let health = health(pool, backends, events, team_id, &viewer.team).await?;
    Ok(Snapshot {
        viewer,
        generated_at: Utc::now(),
        agents,
        tasks,
        locks,
        messages,
        conversations,
        health,
        limits: Limits {
            agents: AGENTS_MAX,
            tasks: TASKS_MAX,
            locks: LOCKS_MAX,
            messages: MESSAGES_MAX,
            conversations: CONVERSATIONS_MAX,
            conversation_messages: CONVERSATION_MESSAGES_MAX,
        },
    })
}

/// The team's agents (enabled first, by name) with their listed windows.
async fn agents(pool: &PgPool, team_id: Uuid) -> BusResult<Vec<AgentView>> {
    let rows: Vec<(Uuid, String, bool)> = sqlx::query_as(
        "SELECT id, name, disabled_at IS NOT NULL FROM agents WHERE team_id = $1
          ORDER BY disabled_at IS NOT NULL, name LIMIT $2",
    )
    .bind(team_id)
    .bind(AGENTS_MAX)
    .fetch_all(pool)
    .await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
    let windows: Vec<WindowRow> = sqlx::query_as(concat!(
        "SELECT p.agent_id, p.session, p.expires_at > now() AS online, p.status, p.activity,
                p.project, p.role, p.last_seen_at
           FROM presence p WHERE p.team_id = $1 AND p.agent_id = ANY($2) AND ",
        listed!("false"),
        " ORDER BY p.agent_id, p.expires_at > now() DESC, p.last_seen_at DESC, p.session
          LIMIT $3"
    ))
    .bind(team_id)
    .bind(&ids)
    .bind(WINDOWS_MAX)
    .fetch_all(pool)
    .await?;
    let older: Vec<(Uuid, i64)> = sqlx::query_as(concat!(
        "SELECT p.agent_id, count(*) FROM presence p
          WHERE p.team_id = $1 AND p.agent_id = ANY($2) AND NOT (",
        listed!("false"),
        ") AND ",
        listed!("true"),
        " GROUP BY p.agent_id"
    ))
    .bind(team_id)
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, name, disabled)| AgentView {
            name,
            disabled,
            windows: windows
                .iter()
                .filter(|w| w.agent_id == id)
                .map(|w| WindowView {
                    state: Liveness::of(w.window.online, w.window.status),
                    ..w.window.clone()
                })
                .collect(),
            older_windows: older.iter().find(|o| o.0 == id).map_or(0, |o| o.1),
        })
        .collect())
}

#[derive(sqlx::FromRow)]
struct WindowRow {
    agent_id: Uuid,
    #[sqlx(flatten)]
    window: WindowView,
}

/// For an agent: the conversations where one of its windows holds an active
/// seat, with bodies from the earliest seq such a seat may read; a seat of a
/// registered window (one with a live session credential) is that window's
/// private data and never counts, as on `/mcp` for the bare agent token the
/// dashboard signed in with. For an admin (no agent): every conversation of
/// the team, without bodies.
async fn conversations(
    pool: &PgPool,
    team_id: Uuid,
    agent_id: Option<Uuid>,
) -> BusResult<Conversations> {
    // The seats the agent token reads through: active, and not a registered
    // window's (the bare token is refused those on /mcp, by the same rule).
    static LISTED: LazyLock<String> = LazyLock::new(|| {
        let seat = format!(
            "s.team_id = c.team_id AND s.conversation_id = c.id AND s.agent_id = $2
             AND s.state = 'active' AND NOT {}",
            conversations::registered_window("s.team_id", "s.agent_id", "s.session")
        );
        format!(
            "SELECT c.id, c.title, c.visibility, c.archived_at IS NOT NULL,
                    (SELECT min(s.history_from_seq) FROM conversation_members s
                      WHERE {seat}) AS readable_from
               FROM conversations c
              WHERE c.team_id = $1
                AND ($2::uuid IS NULL OR EXISTS (
                     SELECT 1 FROM conversation_members s WHERE {seat}))
              ORDER BY c.archived_at IS NOT NULL, c.last_seq DESC, c.created_at DESC
              LIMIT $3"
        )
    });
    // (id, title, visibility, archived, first seq whose body may be shown)
    let listed: Vec<(Uuid, String, String, bool, Option<i64>)> = sqlx::query_as(LISTED.as_str())
        .bind(team_id)
        .bind(agent_id)
        .bind(CONVERSATIONS_MAX)
        .fetch_all(pool)
        .await?;
    let ids: Vec<Uuid> = listed.iter().map(|c| c.0).collect();
    // The first readable seq per conversation; an admin has no seat, and
    // i64::MAX is past every seq, so the query itself shows it no body.
    let readable: Vec<i64> = listed.iter().map(|c| c.4.unwrap_or(i64::MAX)).collect();
    let messages: Vec<ConversationMessageView> = sqlx::query_as(
        "SELECT m.conversation_id, m.seq, CASE WHEN m.sender_session = '' THEN a.name
                     ELSE a.name || '/' || m.sender_session END AS from,
                CASE WHEN m.seq >= v.readable_from AND m.tombstoned_at IS NULL AND m.body <> ''
                     THEN left(m.body, $3) END AS body,
                CASE WHEN m.seq < v.readable_from THEN 'not shown: before your seat''s history'
                     WHEN m.tombstoned_at IS NOT NULL THEN 'removed by an operator'
                     WHEN m.body = '' THEN 'held by the broker only; read it with read_conversation'
                     WHEN char_length(m.body) > $3 THEN 'cut to the first ' || $3 || ' characters'
                END AS body_note,
                m.publication_state, m.created_at,
                r.recipients, r.stored, r.delivered, r.acknowledged
           FROM unnest($2::uuid[], $4::bigint[]) AS v(conversation_id, readable_from)
           CROSS JOIN LATERAL (
                SELECT * FROM conversation_messages cm
                 WHERE cm.team_id = $1 AND cm.conversation_id = v.conversation_id
                 ORDER BY cm.seq DESC LIMIT $5) m
           JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
           CROSS JOIN LATERAL (
                SELECT count(*) AS recipients,
                       count(*) FILTER (WHERE rc.stored_at IS NOT NULL) AS stored,
                       count(*) FILTER (WHERE rc.delivered_at IS NOT NULL) AS delivered,
                       count(*) FILTER (WHERE rc.acknowledged_at IS NOT NULL) AS acknowledged
                  FROM message_receipts rc
                 WHERE rc.team_id = m.team_id AND rc.message_id = m.id) r
          ORDER BY m.seq DESC",
    )
    .bind(team_id)
    .bind(&ids)
    .bind(BODY_CHARS_MAX)
    .bind(&readable)
    .bind(CONVERSATION_MESSAGES_MAX)
    .fetch_all(pool)
    .await?;
    let bodies_shown = agent_id.is_some();
    let note = if bodies_shown {
        "conversations where one of your windows holds an active seat (not a registered \
         window's: those are read with the window's session credential); bodies from where \
         your seat's history starts"
    } else {
        "signed in with an admin credential: every conversation of the team with its receipt \
         counts, and no message bodies"
    };
    Ok(Conversations {
        bodies_shown,
        note: note.to_string(),
        items: listed
            .into_iter()
            .map(|(id, title, visibility, archived, _)| ConversationView {
                id,
                title,
                visibility,
                archived,
                messages: messages
                    .iter()
                    .filter(|m| m.conversation_id == id)
                    .map(|m| ConversationMessageView {
                        body: m.body.clone().filter(|_| bodies_shown),
                        body_note: if bodies_shown {
                            m.body_note.clone()
                        } else {
                            Some("admin view: bodies are not shown".to_string())
                        },
                        ..m.clone()
                    })
                    .collect(),
            })
            .collect(),
    })
}

async fn health(
    pool: &PgPool,
    backends: &Backends,
    events: &Events,
    team_id: Uuid,
    team: &str,
) -> BusResult<Health> {
    let outbox = outbox::status(pool, team_id).await?;
    let broker = match (backends.broker_configured(), backends.broker().is_some()) {
        (false, _) => "not_configured",
        (true, false) => "unreachable",
        (true, true) => "configured",
    };
    let broker_conditions =
        crate::store::delivery::broker_conditions::installation(pool, backends, false)
            .await?
            .into_iter()
            .filter(|c| c.team == team)
            .map(|c| format!("{}: {} ({})", c.stream, c.why, c.fix))
            .collect();
    Ok(Health {
        outbox,
        broker,
        events: events.state(),
        broker_conditions,
    })
}
