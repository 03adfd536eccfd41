//! What one dashboard render shows: a fixed handful of bounded queries
//! (see the module overview for what it never returns).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::{
    AGENTS_MAX, BODY_CHARS_MAX, CONVERSATION_MESSAGES_MAX, CONVERSATIONS_MAX, LOCKS_MAX,
    MESSAGES_MAX, RESERVATIONS_MAX, TASKS_MAX, Viewer, WINDOWS_MAX,
};
use crate::backend::Backends;
use crate::error::BusResult;
use crate::events::{Events, ListenerState};
use crate::store::messaging::acks::overdue::{self, OverdueAck};
use crate::store::messaging::presence::{Liveness, PresenceStatus, listed};
use crate::store::tasks::TaskStatus;
use crate::store::{conversations, delivery::outbox};

/// Everything one dashboard render shows.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub viewer: Viewer,
    pub generated_at: DateTime<Utc>,
    pub agents: Vec<AgentView>,
    /// The team's people (they sign in here; never on /mcp).
    pub people: Vec<PersonView>,
    /// For a person signed in: the `ask_agent` questions waiting for them,
    /// oldest first (absent for an agent or an admin).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub questions: Option<Vec<super::person::QuestionView>>,
    /// For a person signed in: the newest direct messages to them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_messages: Option<Vec<super::person::DirectView>>,
    /// For a person signed in: the conversations inviting them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invitations: Option<Vec<super::person::InvitationView>>,
    /// For a person signed in: the direct and channel messages that ask
    /// them for an acknowledgement they have not given, oldest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owed: Option<crate::store::messaging::acks::owed::PendingAcks>,
    pub tasks: Vec<TaskView>,
    pub locks: Vec<LockView>,
    pub reservations: Vec<ReservationView>,
    pub messages: Vec<ChannelMessageView>,
    pub conversations: Conversations,
    /// Acknowledgements past their due time, one per (message, debtor),
    /// the longest overdue first: never a body.
    pub overdue_acks: Vec<OverdueAck>,
    pub health: Health,
    /// The caps each list was read under.
    pub limits: Limits,
}

/// Overdue acknowledgements shown.
pub const OVERDUE_ACKS_MAX: i64 = 50;

#[derive(Clone, Debug, Serialize)]
pub struct Limits {
    pub agents: i64,
    pub tasks: i64,
    pub locks: i64,
    pub reservations: i64,
    pub messages: i64,
    pub conversations: i64,
    pub conversation_messages: i64,
    pub overdue_acks: i64,
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

/// A person of the team.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct PersonView {
    pub name: String,
    pub disabled: bool,
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

/// A live path reservation (issue 37).
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ReservationView {
    /// The glob as normalised (`acs_wire::globs`).
    pub pattern: String,
    /// `agent` or `agent/window`.
    pub holder: String,
    pub exclusive: bool,
    /// The project it was taken in (`""`: the window named none).
    pub project: String,
    pub reason: Option<String>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ChannelMessageView {
    pub channel: String,
    pub from: String,
    /// True when a person of the team wrote it (from this page).
    pub from_person: bool,
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
    /// The message's id (a person acknowledges it by this id).
    pub id: Uuid,
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
    let people = sqlx::query_as(
        "SELECT name, disabled_at IS NOT NULL AS disabled FROM agents
          WHERE team_id = $1 AND kind = 'person' ORDER BY name LIMIT $2",
    )
    .bind(team_id)
    .bind(AGENTS_MAX)
    .fetch_all(pool)
    .await?;
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
    let reservations = sqlx::query_as(
        "SELECT r.pattern,
                CASE WHEN r.holder_session = '' THEN a.name
                     ELSE a.name || '/' || r.holder_session END AS holder,
                r.exclusive, r.project, r.reason, r.expires_at
           FROM path_reservations r
           JOIN agents a ON a.team_id = r.team_id AND a.id = r.holder_agent_id
          WHERE r.team_id = $1 AND r.expires_at > now()
          ORDER BY r.expires_at, r.project, r.pattern LIMIT $2",
    )
    .bind(team_id)
    .bind(RESERVATIONS_MAX)
    .fetch_all(pool)
    .await?;
    // Channel messages only: a direct message never reaches the dashboard.
    let messages = sqlx::query_as(
        "SELECT c.name AS channel, a.name AS from, a.kind = 'person' AS from_person,
                left(m.body, $3) AS body,
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
    let overdue_acks = overdue::overdue_in_team(pool, team_id, OVERDUE_ACKS_MAX).await?;
    let (questions, direct_messages, invitations, owed) = match viewer.person() {
        Some(me) => (
            Some(super::person::questions(pool, &me).await?),
            Some(super::person::direct_messages(pool, &me).await?),
            Some(super::person::invitations(pool, &me).await?),
            Some(crate::store::messaging::acks::owed::pending(pool, &me).await?),
        ),
        None => (None, None, None, None),
    };
    let health = health(pool, backends, events, team_id, &viewer.team).await?;
    Ok(Snapshot {
        viewer,
        generated_at: Utc::now(),
        agents,
        people,
        questions,
        direct_messages,
        invitations,
        owed,
        tasks,
        locks,
        reservations,
        messages,
        conversations,
        overdue_acks,
        health,
        limits: Limits {
            agents: AGENTS_MAX,
            tasks: TASKS_MAX,
            locks: LOCKS_MAX,
            reservations: RESERVATIONS_MAX,
            messages: MESSAGES_MAX,
            conversations: CONVERSATIONS_MAX,
            conversation_messages: CONVERSATION_MESSAGES_MAX,
            overdue_acks: OVERDUE_ACKS_MAX,
        },
    })
}

/// The team's agents (enabled first, by name) with their listed windows.
async fn agents(pool: &PgPool, team_id: Uuid) -> BusResult<Vec<AgentView>> {
    let rows: Vec<(Uuid, String, bool)> = sqlx::query_as(
        "SELECT id, name, disabled_at IS NOT NULL FROM agents
          WHERE team_id = $1 AND kind = 'agent' ORDER BY disabled_at IS NOT NULL, name LIMIT $2",
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
        "SELECT m.conversation_id, m.id, m.seq, CASE WHEN m.sender_session = '' THEN a.name
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
