//! Conversations: threads with explicit members per window, a gap-free
//! sequence, and per-recipient receipts.
//!
//! Size: past the ~600 lines DESIGN.md asks for (about 1 700): it holds
//! five concepts (model and access rules, lifecycle, membership, transfer,
//! recovery). Issue 18 splits it into a folder along those seams; it stays
//! whole until then so the fixes before that refactor land in one place.
//!
//! This file holds the conversation and membership model and the access rules
//! every conversation tool goes through:
//!
//! - A conversation the caller may not see answers "not found", the same
//!   answer a foreign team's id gets, so existence cannot be probed.
//! - `private`: only members see it. `project`: members, plus read access for
//!   agents holding the project grant.
//! - An invitation is not membership: reading (as a member) and sending need
//!   the seat `active`. A seat reads from its `history_from_seq`.
//! - A label registered as an authenticated window cannot be worn by the bare
//!   agent token for private conversation data: that window's data is reached
//!   with its session credential.
//!
//! Lock order for every writer: the conversation row first (`FOR UPDATE`, or
//! the send's update that allocates the sequence), then member rows, then messages and receipts.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::backend::PostgresBackend;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};

pub const TITLE_MAX_BYTES: usize = 200;
pub const MEMBERS_MAX: i64 = 200;

/// The conversation tools: hidden from `tools/list` and refused per call while
/// the team's `conversations` capability is off.
pub const TOOLS: &[&str] = &[
    "create_project",
    "list_projects",
    "grant_project_access",
    "create_conversation",
    "list_conversations",
    "invite_to_conversation",
    "join_conversation",
    "leave_conversation",
    "remove_conversation_member",
    "archive_conversation",
    "transfer_membership",
    "send_conversation_message",
    "read_conversation",
    "get_conversation_message",
    "ack_message",
    "get_message_receipts",
    "fetch_conversation_inbox",
    "confirm_inbox_delivery",
    "conversation_inbox_status",
    "wait_for_conversation_updates",
    "recover_conversation_history",
];

/// Whether the caller's team has conversations on.
pub async fn enabled(pool: &sqlx::PgPool, me: &Identity) -> BusResult<bool> {
    Ok(
        sqlx::query_scalar("SELECT conversations_enabled FROM teams WHERE id = $1")
            .bind(me.team_id)
            .fetch_one(pool)
            .await?,
    )
}

/// The refusal for a conversation tool while the capability is off.
pub fn disabled_error(me: &Identity) -> BusError {
    BusError::forbidden(format!(
        "conversations are off for team `{}`. An operator turns them on with `ai-crew-sync team \
         capability --team {} --conversations on`.",
        me.team, me.team
    ))
}

/// A conversation row as the access rules need it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Conversation {
    pub id: Uuid,
    pub title: String,
    /// `private` or `project`.
    pub visibility: String,
    pub project_id: Option<Uuid>,
    pub project: Option<String>,
    pub last_seq: i64,
    pub backend: String,
    /// `sync` or `outbox`.
    pub publication: String,
    pub write_paused_at: Option<DateTime<Utc>>,
    pub archived_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// One window's seat in a conversation.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Seat {
    pub id: Uuid,
    /// `owner`, `moderator`, `participant` or `observer`.
    pub role: String,
    /// `invited`, `active`, `left` or `removed`.
    pub state: String,
    pub history_from_seq: i64,
    pub transfer_to_session: Option<String>,
    pub superseded_by: Option<Uuid>,
}

impl Seat {
    pub fn is_active(&self) -> bool {
        self.state == "active"
    }
}

/// The columns of a [`Conversation`], over `conversations c`.
macro_rules! conversation_select {
    () => {
        "SELECT c.id, c.title, c.visibility, c.project_id, p.name AS project, c.last_seq, c.backend,
                c.publication, c.write_paused_at, c.archived_at, c.created_at
         FROM conversations c LEFT JOIN projects p ON p.team_id = c.team_id AND p.id = c.project_id"
    };
}
/// The conversation `id` of the caller's team, locked `FOR UPDATE` when
/// `for_update` (every writer takes this lock first). Not found otherwise.
pub(crate) async fn load(
    conn: &mut PgConnection,
    me: &Identity,
    id: Uuid,
    for_update: bool,
) -> BusResult<Conversation> {
    let sql = if for_update {
        concat!(
            conversation_select!(),
            " WHERE c.team_id = $1 AND c.id = $2 FOR UPDATE OF c"
        )
    } else {
        concat!(
            conversation_select!(),
            " WHERE c.team_id = $1 AND c.id = $2"
        )
    };
    sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| not_found(id))
}

/// The one "not found" every invisible conversation gets.
pub fn not_found(id: Uuid) -> BusError {
    BusError::not_found(format!(
        "no conversation {id} visible to this window. list_conversations shows yours."
    ))
}

/// This window's seat in the conversation, if it has one (in any state).
/// `FOR UPDATE` locks it when the caller will change it (after the
/// conversation row, per the lock order).
pub(crate) async fn seat(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
    for_update: bool,
) -> BusResult<Option<Seat>> {
    let sql = if for_update {
        "SELECT id, role, state, history_from_seq, transfer_to_session, superseded_by
         FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND agent_id = $3 AND session = $4 FOR UPDATE"
    } else {
        "SELECT id, role, state, history_from_seq, transfer_to_session, superseded_by
         FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND agent_id = $3 AND session = $4"
    };
    Ok(sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(conversation_id)
        .bind(me.agent_id)
        .bind(&me.session)
        .fetch_optional(&mut *conn)
        .await?)
}

/// Refuse the bare agent token wearing a label that belongs to a live
/// authenticated window: that window's private data needs its credential.
pub(crate) async fn refuse_borrowed_label(conn: &mut PgConnection, me: &Identity) -> BusResult<()> {
    if me.window.is_some() || me.session.is_empty() {
        return Ok(());
    }
    let registered: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM agent_sessions s
                        JOIN agent_tokens t ON t.team_id = s.team_id AND t.id = s.token_id
                        WHERE s.team_id = $1 AND s.agent_id = $2 AND s.label = $3
                          AND s.revoked_at IS NULL AND s.expires_at > now() AND t.revoked_at IS NULL)",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.session)
    .fetch_one(&mut *conn)
    .await?;
    if registered {
        return Err(borrowed_label(me));
    }
    Ok(())
}

fn borrowed_label(me: &Identity) -> BusError {
    BusError::forbidden(format!(
        "window `{}` is registered as an authenticated window; its conversations are reached \
         with its session credential (acss_…), not with the agent token and X-Crew-Session.",
        me.session
    ))
}

/// How the caller may read a conversation.
#[derive(Clone, Debug)]
pub enum ReadAccess {
    /// An active seat: reads from its history boundary, may send (unless observer).
    Member(Seat),
    /// No active seat, but the agent holds the project grant: reads everything.
    ProjectGrant,
}

/// Whether and how this window may read `conversation`. An invited seat is
/// told to join first; anyone else without access gets "not found".
pub(crate) async fn read_access(
    conn: &mut PgConnection,
    me: &Identity,
    conversation: &Conversation,
) -> BusResult<ReadAccess> {
    let seat = seat_unless_borrowed(conn, me, conversation.id).await?;
    access_from(conn, me, conversation, seat).await
}

/// Read access from this window's seat (if any) and, failing that, the
/// agent's project grant.
async fn access_from(
    conn: &mut PgConnection,
    me: &Identity,
    conversation: &Conversation,
    seat: Option<Seat>,
) -> BusResult<ReadAccess> {
    if let Some(seat) = &seat
        && seat.is_active()
    {
        return Ok(ReadAccess::Member(seat.clone()));
    }
    if let Some(project_id) = conversation.project_id
        && super::projects::holds_grant(conn, me.team_id, project_id, me.agent_id).await?
    {
        return Ok(ReadAccess::ProjectGrant);
    }
    match seat {
        Some(seat) if seat.state == "invited" => Err(BusError::forbidden(format!(
            "you are invited to conversation {} but have not joined: call join_conversation \
             first. An invitation is not membership.",
            conversation.id
        ))),
        _ => Err(not_found(conversation.id)),
    }
}

/// [`refuse_borrowed_label`] and [`seat`] in one round trip: the read and
/// send paths run on every call.
async fn seat_unless_borrowed(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
) -> BusResult<Option<Seat>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        borrowed: bool,
        id: Option<Uuid>,
        role: Option<String>,
        state: Option<String>,
        history_from_seq: Option<i64>,
        transfer_to_session: Option<String>,
        superseded_by: Option<Uuid>,
    }
    let row: Row = sqlx::query_as(
        "SELECT ($5 AND EXISTS (
                    SELECT 1 FROM agent_sessions s
                    JOIN agent_tokens t ON t.team_id = s.team_id AND t.id = s.token_id
                    WHERE s.team_id = $1 AND s.agent_id = $3 AND s.label = $4
                      AND s.revoked_at IS NULL AND s.expires_at > now() AND t.revoked_at IS NULL))
                    AS borrowed,
                m.id, m.role, m.state, m.history_from_seq, m.transfer_to_session, m.superseded_by
         FROM (SELECT 1) AS one
         LEFT JOIN conversation_members m
                ON m.team_id = $1 AND m.conversation_id = $2 AND m.agent_id = $3 AND m.session = $4",
    )
    .bind(me.team_id)
    .bind(conversation_id)
    .bind(me.agent_id)
    .bind(&me.session)
    .bind(me.window.is_none() && !me.session.is_empty())
    .fetch_one(&mut *conn)
    .await?;
    if row.borrowed {
        return Err(borrowed_label(me));
    }
    Ok(match (row.id, row.role, row.state, row.history_from_seq) {
        (Some(id), Some(role), Some(state), Some(history_from_seq)) => Some(Seat {
            id,
            role,
            state,
            history_from_seq,
            transfer_to_session: row.transfer_to_session,
            superseded_by: row.superseded_by,
        }),
        _ => None,
    })
}

/// One row of the conversation audit log, in the caller's transaction. Never a body.
pub(crate) async fn audit(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Option<Uuid>,
    action: &str,
    subject: &str,
    detail: Value,
) -> BusResult<()> {
    sqlx::query(
        "INSERT INTO conversation_audit (team_id, conversation_id, actor_id, actor_session, action, subject, detail)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(me.team_id)
    .bind(conversation_id)
    .bind(me.agent_id)
    .bind(&me.session)
    .bind(action)
    .bind(subject)
    .bind(detail)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Membership: create, list, invite (and role changes), join, leave, remove,
// archive, transfer, and read-only recovery.
//
// Every change here is one transaction that takes the conversation row
// `FOR UPDATE` first, then the seats it touches in id order, validates, writes,
// and records its `conversation_audit` row before committing. Because every
// writer queues on the conversation row, concurrent invites, removals and role
// changes serialise instead of deadlocking, and the member cap is counted under
// that lock.
//
// Visibility is the same rule as reading: a window sees a conversation when it
// holds an invited or active seat in it, or (project conversations) when its
// agent holds the project grant. Anything else answers [`not_found`], exactly
// like a foreign team's id.
// ---------------------------------------------------------------------------

/// The roles `invite_to_conversation` hands out. `owner` is only ever the
/// creator's seat (or a seat transferred from one).
pub const INVITE_ROLES: &[&str] = &["moderator", "participant", "observer"];
pub const RECOVER_LIMIT_MAX: i64 = 200;
pub const RECOVER_LIMIT_DEFAULT: i64 = 50;

/// A conversation as one window sees it, with that window's seat.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct ConversationView {
    pub id: Uuid,
    pub title: String,
    /// `private` or `project`.
    pub visibility: String,
    pub project: Option<String>,
    pub last_seq: i64,
    pub backend: String,
    pub publication: String,
    pub write_paused_at: Option<DateTime<Utc>>,
    pub archived_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// `member` (active seat), `invited` (join first), or `project_grant`
    /// (no seat; reads through the agent's project grant).
    pub access: String,
    /// This window's seat, when it has one.
    pub role: Option<String>,
    pub state: Option<String>,
    pub history_from_seq: Option<i64>,
    /// A proposed transfer of this seat, waiting for that window to join.
    pub transfer_to_session: Option<String>,
    /// Invited plus active seats (the member cap counts these).
    pub members: i64,
}

/// The columns of a [`ConversationView`] for window ($2 agent, $3 session) of
/// team $1, restricted to what that window may see.
macro_rules! view_select {
    () => {
        "SELECT c.id, c.title, c.visibility, p.name AS project, c.last_seq, c.backend,
                c.publication, c.write_paused_at, c.archived_at, c.created_at,
                CASE m.state WHEN 'active' THEN 'member' WHEN 'invited' THEN 'invited'
                             ELSE 'project_grant' END AS access,
                m.role, m.state, m.history_from_seq, m.transfer_to_session,
                (SELECT count(*) FROM conversation_members x
                 WHERE x.team_id = c.team_id AND x.conversation_id = c.id
                   AND x.state IN ('invited', 'active')) AS members
         FROM conversations c
         LEFT JOIN projects p ON p.team_id = c.team_id AND p.id = c.project_id
         LEFT JOIN conversation_members m
                ON m.team_id = c.team_id AND m.conversation_id = c.id AND m.agent_id = $2
               AND m.session = $3 AND m.state IN ('invited', 'active')
         WHERE c.team_id = $1
           AND (m.id IS NOT NULL
                OR EXISTS (SELECT 1 FROM project_grants g
                           WHERE g.team_id = c.team_id AND g.project_id = c.project_id
                             AND g.agent_id = $2))"
    };
}

/// What a membership call did to one seat.
#[derive(Clone, Debug, Serialize)]
pub struct Membership {
    pub conversation_id: Uuid,
    /// The seat's window: `agent` or `agent/window`.
    pub address: String,
    pub role: String,
    pub state: String,
    pub history_from_seq: i64,
    /// `invited`, `reinvited`, `readmitted`, `role_changed`, `joined`,
    /// `transferred`, `transfer_proposed`, `left`, `declined`, `removed` or
    /// `unchanged`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A seat as a membership change needs it (locked).
#[derive(Clone, Debug, sqlx::FromRow)]
struct SeatRow {
    id: Uuid,
    agent_id: Uuid,
    session: String,
    role: String,
    state: String,
    history_from_seq: i64,
    transfer_to_session: Option<String>,
}

impl SeatRow {
    fn is(&self, agent_id: Uuid, session: &str) -> bool {
        self.agent_id == agent_id && self.session == session
    }

    fn holds(&self) -> bool {
        matches!(self.state.as_str(), "invited" | "active")
    }

    fn manages(&self) -> bool {
        self.state == "active" && matches!(self.role.as_str(), "owner" | "moderator")
    }
}

/// A window named by an address, resolved in the caller's team.
#[derive(Clone, Debug)]
struct Window {
    agent_id: Uuid,
    agent: String,
    session: String,
}

impl Window {
    fn address(&self) -> String {
        super::address(&self.agent, &self.session)
    }
}

/// Validate an address (`agent` or `agent/window`) without touching the database.
fn parse_window(raw: &str) -> BusResult<(String, String)> {
    let (agent, window) = super::messages::parse_address(raw)?;
    Ok((agent, window.unwrap_or_default()))
}

async fn resolve_window(
    conn: &mut PgConnection,
    me: &Identity,
    (agent, session): &(String, String),
) -> BusResult<Window> {
    let agent_id: Uuid =
        sqlx::query_scalar("SELECT id FROM agents WHERE team_id = $1 AND name = $2")
            .bind(me.team_id)
            .bind(agent)
            .fetch_optional(&mut *conn)
            .await?
            .ok_or_else(|| {
                BusError::not_found(format!(
                    "no agent `{agent}` in your team. list_agents shows them; an address is \
                     `agent` (its shared window) or `agent/window`."
                ))
            })?;
    Ok(Window {
        agent_id,
        agent: agent.clone(),
        session: session.clone(),
    })
}

/// Lock the existing seats of `windows` in id order (after the conversation row).
async fn lock_seats(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
    windows: &[(Uuid, &str)],
) -> BusResult<Vec<SeatRow>> {
    let agents: Vec<Uuid> = windows.iter().map(|w| w.0).collect();
    let sessions: Vec<String> = windows.iter().map(|w| w.1.to_string()).collect();
    Ok(sqlx::query_as(
        "SELECT m.id, m.agent_id, m.session, m.role, m.state, m.history_from_seq, m.transfer_to_session
         FROM conversation_members m
         JOIN unnest($3::uuid[], $4::text[]) AS w(agent_id, session)
           ON w.agent_id = m.agent_id AND w.session = m.session
         WHERE m.team_id = $1 AND m.conversation_id = $2
         ORDER BY m.id
         FOR UPDATE OF m",
    )
    .bind(me.team_id)
    .bind(conversation_id)
    .bind(&agents)
    .bind(&sessions)
    .fetch_all(&mut *conn)
    .await?)
}

/// Invited plus active seats: what the member cap counts.
async fn seats_taken(
    conn: &mut PgConnection,
    me: &Identity,
    conversation_id: Uuid,
) -> BusResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND state IN ('invited', 'active')",
    )
    .bind(me.team_id)
    .bind(conversation_id)
    .fetch_one(&mut *conn)
    .await?)
}

fn cap_reached(conversation_id: Uuid, taken: i64) -> BusError {
    BusError::conflict(format!(
        "conversation {conversation_id} already has {taken} members (invited or active); the limit \
         is {MEMBERS_MAX}. Remove a member (remove_conversation_member) or start another \
         conversation, then invite again."
    ))
}

/// The conversation row locked, whether the agent holds its project grant, and
/// the refusal for a window that may not see it.
async fn open(conn: &mut PgConnection, me: &Identity, id: Uuid) -> BusResult<(Conversation, bool)> {
    super::sessions::guard(conn, me).await?;
    refuse_borrowed_label(conn, me).await?;
    let conversation = load(conn, me, id, true).await?;
    let grant = match conversation.project_id {
        Some(project_id) => {
            super::projects::holds_grant(conn, me.team_id, project_id, me.agent_id).await?
        }
        None => false,
    };
    Ok((conversation, grant))
}

fn visible(mine: Option<&SeatRow>, grant: bool) -> bool {
    grant || mine.is_some_and(SeatRow::holds)
}

/// How a refusal describes the caller's standing.
fn standing(mine: Option<&SeatRow>) -> String {
    match mine {
        Some(seat) if seat.state == "active" => format!("an active {}", seat.role),
        Some(seat) => format!("a {} whose seat is {}", seat.role, seat.state),
        None => "not a member (you read it through the project grant)".to_string(),
    }
}

fn require_manager<'a>(id: Uuid, mine: Option<&'a SeatRow>, what: &str) -> BusResult<&'a SeatRow> {
    match mine {
        Some(seat) if seat.manages() => Ok(seat),
        other => Err(BusError::forbidden(format!(
            "only an active owner or moderator of conversation {id} can {what}; this window is {}. \
             Ask one of its owners or moderators.",
            standing(other)
        ))),
    }
}

/// Conversation titles: one line ([`super::text::one_line`]), 1..=200 bytes.
pub fn check_title(raw: &str) -> BusResult<String> {
    let title = super::text::one_line_else(
        "conversation title",
        raw,
        "details belong in the first message",
    )?;
    if title.is_empty() || title.len() > TITLE_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "a conversation title must be 1-{TITLE_MAX_BYTES} bytes of one-line text (got {} \
             bytes). Shorten it; details belong in the first message.",
            title.len(),
        )));
    }
    Ok(title)
}

fn check_invite_role(role: &str) -> BusResult<String> {
    let role = role.trim().to_ascii_lowercase();
    if !INVITE_ROLES.contains(&role.as_str()) {
        return Err(BusError::invalid(format!(
            "role {} cannot be handed out: use moderator, participant or observer. The owner \
             seat is the creator's (transfer_membership moves it to another window of yours).",
            super::text::quote(&role)
        )));
    }
    Ok(role)
}

/// One conversation as this window sees it (not found when it may not).
async fn view(conn: &mut PgConnection, me: &Identity, id: Uuid) -> BusResult<ConversationView> {
    sqlx::query_as(concat!(view_select!(), " AND c.id = $4"))
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.session)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| not_found(id))
}

/// Where a new conversation is visible: one project, or private.
#[derive(Clone, Debug)]
pub enum Visibility {
    Project(String),
    Private,
}

impl Visibility {
    /// Exactly one of `project` / `private: true`.
    pub fn from_args(project: Option<String>, private: Option<bool>) -> BusResult<Visibility> {
        match (project, private.unwrap_or(false)) {
            (Some(project), false) => Ok(Visibility::Project(project)),
            (None, true) => Ok(Visibility::Private),
            (Some(_), true) => Err(BusError::invalid(
                "give either `project` (visible to agents holding its grant) or `private: true` \
                 (members only), not both. Visibility never changes later.",
            )),
            (None, false) => Err(BusError::invalid(
                "say where the conversation lives: `project: \"name\"` (visible to agents holding \
                 that project's grant; list_projects shows them) or `private: true` (members only). \
                 Visibility never changes later.",
            )),
        }
    }
}

/// `create_conversation`: the creator's window gets the `owner` seat (active,
/// history from 1); each invitee an invited `participant` seat.
pub async fn create(
    bus: &Bus,
    me: &Identity,
    title: &str,
    visibility: Visibility,
    invite: &[String],
) -> BusResult<ConversationView> {
    let title = check_title(title)?;
    // The raw length, before any parsing: duplicates count.
    if invite.len() as i64 + 1 > MEMBERS_MAX {
        return Err(BusError::invalid(format!(
            "invite holds {} addresses; with you that exceeds the member limit of {MEMBERS_MAX} \
             (duplicates count), so at most {} may be invited at creation. Nothing was written. \
             Name each window once and invite fewer.",
            invite.len(),
            MEMBERS_MAX - 1
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(invite.len());
    let mut wanted = Vec::with_capacity(invite.len());
    for raw in invite {
        let window = parse_window(raw)?;
        if window.0 == me.agent && window.1 == me.session {
            return Err(BusError::invalid(format!(
                "`{raw}` is this window: you get the owner seat anyway. Leave it out of `invite`."
            )));
        }
        if seen.insert(window.clone()) {
            wanted.push(window);
        }
    }

    // Before the transaction: it asks the broker (no network I/O inside one).
    super::broker_conditions::refuse_if_streams_missing(bus, me.team_id, &me.team).await?;
    let mut tx = bus.pool.begin().await?;
    super::sessions::guard(&mut tx, me).await?;
    refuse_borrowed_label(&mut tx, me).await?;
    let project_id = match &visibility {
        Visibility::Private => None,
        Visibility::Project(name) => {
            let id = super::projects::find(&mut tx, me, name).await?;
            if !super::projects::holds_grant(&mut tx, me.team_id, id, me.agent_id).await? {
                return Err(BusError::forbidden(format!(
                    "you hold no grant on project `{}`, so you cannot start a conversation in it. \
                     Ask an agent holding its grant to grant_project_access to you, or create a \
                     private one.",
                    name.trim()
                )));
            }
            Some(id)
        }
    };
    let mut invitees = Vec::with_capacity(wanted.len());
    for window in &wanted {
        invitees.push(resolve_window(&mut tx, me, window).await?);
    }
    let backend: String =
        sqlx::query_scalar("SELECT conversation_backend FROM teams WHERE id = $1")
            .bind(me.team_id)
            .fetch_one(&mut *tx)
            .await?;
    // A team routed to a broker this server cannot reach is an explicit
    // refusal, never a silent fallback to PostgreSQL.
    bus.backends.require(&backend)?;
    // Bodies off PostgreSQL go through the outbox: accepted now, published later.
    let publication = if backend == PostgresBackend::NAME {
        "sync"
    } else {
        "outbox"
    };
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO conversations
             (id, team_id, title, visibility, project_id, created_by, created_session, backend, publication)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(id)
    .bind(me.team_id)
    .bind(&title)
    .bind(if project_id.is_some() { "project" } else { "private" })
    .bind(project_id)
    .bind(me.agent_id)
    .bind(&me.session)
    .bind(&backend)
    .bind(publication)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO conversation_members
             (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq, joined_at)
         VALUES ($1, $2, $3, $4, $5, 'owner', 'active', 1, now())",
    )
    .bind(Uuid::new_v4())
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .bind(&me.session)
    .execute(&mut *tx)
    .await?;
    audit(
        &mut tx,
        me,
        Some(id),
        "create",
        &me.address(),
        serde_json::json!({
            "visibility": if project_id.is_some() { "project" } else { "private" },
            "project_id": project_id,
            "backend": backend,
        }),
    )
    .await?;
    for invitee in &invitees {
        sqlx::query(
            "INSERT INTO conversation_members
                 (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq, invited_by)
             VALUES ($1, $2, $3, $4, $5, 'participant', 'invited', 1, $6)",
        )
        .bind(Uuid::new_v4())
        .bind(me.team_id)
        .bind(id)
        .bind(invitee.agent_id)
        .bind(&invitee.session)
        .bind(me.agent_id)
        .execute(&mut *tx)
        .await?;
        audit(
            &mut tx,
            me,
            Some(id),
            "invite",
            &invitee.address(),
            serde_json::json!({ "role": "participant", "history_from_seq": 1 }),
        )
        .await?;
    }
    let view = view(&mut tx, me, id).await?;
    tx.commit().await?;
    Ok(view)
}

/// `list_conversations`: where this window holds a seat (invited or active),
/// plus project conversations its agent reads through a grant. Never others.
pub async fn list(
    bus: &Bus,
    me: &Identity,
    include_archived: bool,
) -> BusResult<Vec<ConversationView>> {
    let mut conn = bus.pool.acquire().await?;
    refuse_borrowed_label(&mut conn, me).await?;
    Ok(sqlx::query_as(concat!(
        view_select!(),
        " AND ($4 OR c.archived_at IS NULL) ORDER BY c.created_at, c.id"
    ))
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.session)
    .bind(include_archived)
    .fetch_all(&mut *conn)
    .await?)
}

/// `invite_to_conversation`: owners and moderators invite a window (or invite
/// it again after it left), re-admit a removed one (from now, audited as
/// `readmit`), or change the role of an active seat (audited as `role`; only
/// an owner changes an owner).
/// What a manager's change to another window's seat starts from.
struct Managed {
    conversation: Conversation,
    target: Window,
    /// The caller's and the target's seats (those that exist), locked.
    seats: Vec<SeatRow>,
    /// The caller's seat: an active owner or moderator.
    manager: SeatRow,
}

/// The common start of invite and remove: the conversation row locked,
/// visibility checked before anything about the target is looked up (so an
/// invisible conversation answers "not found" whatever the address), the
/// target resolved, both seats locked in id order, the caller confirmed as
/// an owner or moderator.
async fn manage(
    tx: &mut PgConnection,
    me: &Identity,
    id: Uuid,
    target: &(String, String),
    what: &str,
) -> BusResult<Managed> {
    let (conversation, grant) = open(tx, me, id).await?;
    if !visible_unlocked(tx, me, &conversation, grant).await? {
        return Err(not_found(id));
    }
    let target = resolve_window(tx, me, target).await?;
    let seats = lock_seats(
        tx,
        me,
        id,
        &[
            (me.agent_id, &me.session),
            (target.agent_id, &target.session),
        ],
    )
    .await?;
    let mine = seats.iter().find(|s| s.is(me.agent_id, &me.session));
    if !visible(mine, grant) {
        return Err(not_found(id));
    }
    let manager = require_manager(id, mine, what)?.clone();
    Ok(Managed {
        conversation,
        target,
        seats,
        manager,
    })
}

pub async fn invite(
    bus: &Bus,
    me: &Identity,
    id: Uuid,
    address: &str,
    role: &str,
    history_from_start: bool,
) -> BusResult<Membership> {
    let target = parse_window(address)?;
    let role = check_invite_role(role)?;
    let mut tx = bus.pool.begin().await?;
    let Managed {
        conversation,
        target,
        seats,
        manager,
    } = manage(&mut tx, me, id, &target, "invite members or change roles").await?;
    let existing = seats
        .iter()
        .find(|s| s.is(target.agent_id, &target.session))
        .cloned();
    let from_now = conversation.last_seq + 1;
    let history = if history_from_start { 1 } else { from_now };
    let address = target.address();

    let membership = |role: &str, state: &str, history: i64, outcome, note| Membership {
        conversation_id: id,
        address: address.clone(),
        role: role.to_string(),
        state: state.to_string(),
        history_from_seq: history,
        outcome,
        note,
    };

    let result = match existing {
        None => {
            let taken = seats_taken(&mut tx, me, id).await?;
            if taken >= MEMBERS_MAX {
                return Err(cap_reached(id, taken));
            }
            sqlx::query(
                "INSERT INTO conversation_members
                     (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq, invited_by)
                 VALUES ($1, $2, $3, $4, $5, $6, 'invited', $7, $8)",
            )
            .bind(Uuid::new_v4())
            .bind(me.team_id)
            .bind(id)
            .bind(target.agent_id)
            .bind(&target.session)
            .bind(&role)
            .bind(history)
            .bind(me.agent_id)
            .execute(&mut *tx)
            .await?;
            audit(
                &mut tx,
                me,
                Some(id),
                "invite",
                &address,
                serde_json::json!({ "role": role, "history_from_seq": history }),
            )
            .await?;
            membership(&role, "invited", history, "invited", None)
        }
        Some(seat) if seat.state == "active" => {
            if seat.id == manager.id {
                return Err(BusError::invalid(
                    "you cannot change your own role. Another owner or moderator can; to step \
                     away, use leave_conversation.",
                ));
            }
            if seat.role == "owner" && manager.role != "owner" {
                return Err(BusError::forbidden(format!(
                    "{address} is an owner of conversation {id}; only an owner changes an owner's \
                     role, and you are a {}. Ask an owner.",
                    manager.role
                )));
            }
            if seat.role == role {
                membership(&role, "active", seat.history_from_seq, "unchanged", None)
            } else {
                sqlx::query(
                    "UPDATE conversation_members SET role = $2, updated_at = now() WHERE id = $1",
                )
                .bind(seat.id)
                .bind(&role)
                .execute(&mut *tx)
                .await?;
                audit(
                    &mut tx,
                    me,
                    Some(id),
                    "role",
                    &address,
                    serde_json::json!({ "from": seat.role, "to": role }),
                )
                .await?;
                let note = history_from_start.then(|| {
                    "history_from_start applies to invitations only; this active seat keeps \
                     its history boundary."
                        .to_string()
                });
                membership(&role, "active", seat.history_from_seq, "role_changed", note)
            }
        }
        Some(seat) => {
            if seat.state == "invited" && seat.role == "owner" && manager.role != "owner" {
                return Err(BusError::forbidden(format!(
                    "{address} holds an owner seat; only an owner changes it. Ask an owner."
                )));
            }
            if seat.state != "invited" {
                let taken = seats_taken(&mut tx, me, id).await?;
                if taken >= MEMBERS_MAX {
                    return Err(cap_reached(id, taken));
                }
            }
            // A removed seat comes back only from now: whatever was said while
            // it was out stays out of its reach.
            let (action, outcome, history, note) = match seat.state.as_str() {
                "removed" => (
                    "readmit",
                    "readmitted",
                    from_now,
                    history_from_start.then(|| {
                        "a removed seat is re-admitted from now; history_from_start does not \
                         apply to it."
                            .to_string()
                    }),
                ),
                _ => ("invite", "reinvited", history, None),
            };
            sqlx::query(
                "UPDATE conversation_members
                 SET role = $2, state = 'invited', history_from_seq = $3, invited_by = $4,
                     transfer_to_session = NULL, superseded_by = NULL, updated_at = now()
                 WHERE id = $1",
            )
            .bind(seat.id)
            .bind(&role)
            .bind(history)
            .bind(me.agent_id)
            .execute(&mut *tx)
            .await?;
            audit(
                &mut tx,
                me,
                Some(id),
                action,
                &address,
                serde_json::json!({
                    "role": role, "history_from_seq": history, "previous_state": seat.state,
                }),
            )
            .await?;
            membership(&role, "invited", history, outcome, note)
        }
    };
    tx.commit().await?;
    Ok(result)
}

/// Whether the caller may see `conversation`, before its seats are locked (the
/// conversation row is already locked, so no seat changes underneath).
async fn visible_unlocked(
    conn: &mut PgConnection,
    me: &Identity,
    conversation: &Conversation,
    grant: bool,
) -> BusResult<bool> {
    if grant {
        return Ok(true);
    }
    Ok(seat(conn, me, conversation.id, false)
        .await?
        .is_some_and(|s| matches!(s.state.as_str(), "invited" | "active")))
}

/// `join_conversation`: this window's invitation becomes an active seat, or a
/// transfer proposed to this window completes.
pub async fn join(bus: &Bus, me: &Identity, id: Uuid) -> BusResult<Membership> {
    let mut tx = bus.pool.begin().await?;
    let (conversation, grant) = open(&mut tx, me, id).await?;
    // A seat of another window of this agent that proposes moving here.
    let source: Option<String> = sqlx::query_scalar(
        "SELECT session FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND agent_id = $3
           AND transfer_to_session = $4 AND state = 'active'
         ORDER BY id LIMIT 1",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .bind(&me.session)
    .fetch_optional(&mut *tx)
    .await?;
    let mut windows = vec![(me.agent_id, me.session.as_str())];
    if let Some(source) = &source {
        windows.push((me.agent_id, source.as_str()));
    }
    let seats = lock_seats(&mut tx, me, id, &windows).await?;
    let mine = seats
        .iter()
        .find(|s| s.is(me.agent_id, &me.session))
        .cloned();
    let source =
        source.and_then(|session| seats.iter().find(|s| s.is(me.agent_id, &session)).cloned());
    let address = me.address();

    let result = if let Some(source) = source {
        transfer_complete(&mut tx, me, &conversation, &source, mine.as_ref()).await?
    } else {
        match mine {
            Some(seat) if seat.state == "invited" => {
                sqlx::query(
                    "UPDATE conversation_members
                     SET state = 'active', joined_at = now(), updated_at = now() WHERE id = $1",
                )
                .bind(seat.id)
                .execute(&mut *tx)
                .await?;
                audit(
                    &mut tx,
                    me,
                    Some(id),
                    "join",
                    &address,
                    serde_json::json!({ "role": seat.role, "history_from_seq": seat.history_from_seq }),
                )
                .await?;
                Membership {
                    conversation_id: id,
                    address,
                    role: seat.role,
                    state: "active".into(),
                    history_from_seq: seat.history_from_seq,
                    outcome: "joined",
                    note: None,
                }
            }
            Some(seat) if seat.state == "active" => Membership {
                conversation_id: id,
                address,
                role: seat.role,
                state: seat.state,
                history_from_seq: seat.history_from_seq,
                outcome: "unchanged",
                note: Some("this window is already an active member.".into()),
            },
            other if grant => {
                return Err(BusError::forbidden(format!(
                    "this window has no invitation to conversation {id}{}. Your project grant lets \
                     you read it without joining; to become a member, ask an owner or moderator \
                     to invite_to_conversation {address}.",
                    match other {
                        Some(seat) => format!(" (its seat is {})", seat.state),
                        None => String::new(),
                    }
                )));
            }
            _ => return Err(not_found(id)),
        }
    };
    tx.commit().await?;
    Ok(result)
}

/// The second half of `transfer_membership`, run by the target window's join.
///
/// The new seat takes over the old seat's role and history boundary; the old
/// seat is superseded (state `left`, `superseded_by` = the new seat). Its
/// receipts move to the new seat by changing `member_id` only: every
/// timestamp (stored, delivered, presented, acknowledged, resolved) and
/// `recipient_session` (the window the message was addressed to at send) stay
/// exactly as observed, so nothing is forged or re-timestamped. Messages the
/// old seat sent keep their author. A receipt the new seat already holds for
/// the same message (it was a recipient itself) is kept, and the old seat's
/// duplicate stays with the old seat rather than being merged into it.
async fn transfer_complete(
    conn: &mut PgConnection,
    me: &Identity,
    conversation: &Conversation,
    source: &SeatRow,
    mine: Option<&SeatRow>,
) -> BusResult<Membership> {
    let id = conversation.id;
    let new_id = match mine {
        Some(seat) if seat.state == "active" || seat.state == "removed" => {
            return Err(BusError::conflict(format!(
                "window `{}` proposes moving its seat here, but this window's own seat is {}; a \
                 transfer can land only on a window without an active or removed seat. {}",
                source.session,
                seat.state,
                if seat.state == "active" {
                    "Leave with this window first, then join again."
                } else {
                    "An owner or moderator must re-admit this window first."
                }
            )));
        }
        Some(seat) => {
            sqlx::query(
                "UPDATE conversation_members
                 SET role = $2, state = 'active', history_from_seq = $3, joined_at = now(),
                     transfer_to_session = NULL, superseded_by = NULL, updated_at = now()
                 WHERE id = $1",
            )
            .bind(seat.id)
            .bind(&source.role)
            .bind(source.history_from_seq)
            .execute(&mut *conn)
            .await?;
            seat.id
        }
        None => {
            let new_id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO conversation_members
                     (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq,
                      invited_by, joined_at)
                 VALUES ($1, $2, $3, $4, $5, $6, 'active', $7, $4, now())",
            )
            .bind(new_id)
            .bind(me.team_id)
            .bind(id)
            .bind(me.agent_id)
            .bind(&me.session)
            .bind(&source.role)
            .bind(source.history_from_seq)
            .execute(&mut *conn)
            .await?;
            new_id
        }
    };
    sqlx::query(
        "UPDATE conversation_members
         SET state = 'left', left_at = now(), superseded_by = $2, transfer_to_session = NULL,
             updated_at = now()
         WHERE id = $1",
    )
    .bind(source.id)
    .bind(new_id)
    .execute(&mut *conn)
    .await?;
    let moved = sqlx::query(
        "UPDATE message_receipts r SET member_id = $3
         WHERE r.team_id = $1 AND r.member_id = $2
           AND NOT EXISTS (SELECT 1 FROM message_receipts n
                           WHERE n.team_id = r.team_id AND n.message_id = r.message_id
                             AND n.member_id = $3)",
    )
    .bind(me.team_id)
    .bind(source.id)
    .bind(new_id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    let from = super::address(&me.agent, &source.session);
    audit(
        conn,
        me,
        Some(id),
        "transfer",
        &me.address(),
        serde_json::json!({
            "phase": "completed", "from": from, "role": source.role,
            "history_from_seq": source.history_from_seq, "receipts_moved": moved,
        }),
    )
    .await?;
    Ok(Membership {
        conversation_id: id,
        address: me.address(),
        role: source.role.clone(),
        state: "active".into(),
        history_from_seq: source.history_from_seq,
        outcome: "transferred",
        note: Some(format!(
            "this window took over the seat of {from} ({moved} receipts moved with it, timestamps \
             unchanged); that seat is superseded."
        )),
    })
}

/// `leave_conversation`: an active seat leaves; an invited one declines.
pub async fn leave(bus: &Bus, me: &Identity, id: Uuid) -> BusResult<Membership> {
    let mut tx = bus.pool.begin().await?;
    let (_, grant) = open(&mut tx, me, id).await?;
    let seats = lock_seats(&mut tx, me, id, &[(me.agent_id, &me.session)]).await?;
    let mine = seats.into_iter().next();
    let seat = match mine {
        Some(seat) if seat.holds() => seat,
        _ if grant => {
            return Err(BusError::invalid(format!(
                "this window holds no seat in conversation {id} (it reads through the project \
                 grant), so there is nothing to leave."
            )));
        }
        _ => return Err(not_found(id)),
    };
    let declined = seat.state == "invited";
    sqlx::query(
        "UPDATE conversation_members
         SET state = 'left', left_at = now(), transfer_to_session = NULL, updated_at = now()
         WHERE id = $1",
    )
    .bind(seat.id)
    .execute(&mut *tx)
    .await?;
    audit(
        &mut tx,
        me,
        Some(id),
        "leave",
        &me.address(),
        serde_json::json!({ "role": seat.role, "declined": declined }),
    )
    .await?;
    tx.commit().await?;
    Ok(Membership {
        conversation_id: id,
        address: me.address(),
        role: seat.role,
        state: "left".into(),
        history_from_seq: seat.history_from_seq,
        outcome: if declined { "declined" } else { "left" },
        note: None,
    })
}

/// `remove_conversation_member`: owners and moderators remove an invited or
/// active seat; only an owner removes an owner.
pub async fn remove(bus: &Bus, me: &Identity, id: Uuid, address: &str) -> BusResult<Membership> {
    let target = parse_window(address)?;
    let mut tx = bus.pool.begin().await?;
    let Managed {
        conversation: _,
        target,
        seats,
        manager,
    } = manage(&mut tx, me, id, &target, "remove members").await?;
    let address = target.address();
    let seat = match seats
        .iter()
        .find(|s| s.is(target.agent_id, &target.session))
    {
        Some(seat) if seat.holds() => seat.clone(),
        _ => {
            return Err(BusError::not_found(format!(
                "{address} holds no invited or active seat in conversation {id}; nothing to \
                 remove. list_conversations shows your conversations; addresses are `agent` \
                 (shared window) or `agent/window`."
            )));
        }
    };
    if seat.id == manager.id {
        return Err(BusError::invalid(
            "you cannot remove your own seat; use leave_conversation.",
        ));
    }
    if seat.role == "owner" && manager.role != "owner" {
        return Err(BusError::forbidden(format!(
            "{address} is an owner of conversation {id}; only an owner removes an owner, and you \
             are a {}. Ask an owner.",
            manager.role
        )));
    }
    sqlx::query(
        "UPDATE conversation_members
         SET state = 'removed', removed_at = now(), transfer_to_session = NULL, updated_at = now()
         WHERE id = $1",
    )
    .bind(seat.id)
    .execute(&mut *tx)
    .await?;
    audit(
        &mut tx,
        me,
        Some(id),
        "remove",
        &address,
        serde_json::json!({ "role": seat.role, "previous_state": seat.state }),
    )
    .await?;
    tx.commit().await?;
    Ok(Membership {
        conversation_id: id,
        address,
        role: seat.role,
        state: "removed".into(),
        history_from_seq: seat.history_from_seq,
        outcome: "removed",
        note: None,
    })
}

/// `archive_conversation`: owners and moderators close it to new messages;
/// its history stays readable. Archiving twice changes nothing.
pub async fn archive(bus: &Bus, me: &Identity, id: Uuid) -> BusResult<ConversationView> {
    let mut tx = bus.pool.begin().await?;
    let (conversation, grant) = open(&mut tx, me, id).await?;
    let seats = lock_seats(&mut tx, me, id, &[(me.agent_id, &me.session)]).await?;
    let mine = seats.first();
    if !visible(mine, grant) {
        return Err(not_found(id));
    }
    require_manager(id, mine, "archive it")?;
    if conversation.archived_at.is_none() {
        sqlx::query(
            "UPDATE conversations SET archived_at = now(), archived_by = $3
             WHERE team_id = $1 AND id = $2",
        )
        .bind(me.team_id)
        .bind(id)
        .bind(me.agent_id)
        .execute(&mut *tx)
        .await?;
        audit(
            &mut tx,
            me,
            Some(id),
            "archive",
            &me.address(),
            serde_json::json!({ "last_seq": conversation.last_seq }),
        )
        .await?;
    }
    let view = view(&mut tx, me, id).await?;
    tx.commit().await?;
    Ok(view)
}

/// Where `transfer_membership` may send a seat: a window label of the
/// caller's own agent (`""` = its shared window), or an address of it.
fn parse_transfer_target(me: &Identity, raw: &str) -> BusResult<String> {
    if raw.contains('/') {
        let (agent, session) = parse_window(raw)?;
        if agent != me.agent {
            return Err(BusError::invalid(format!(
                "a seat moves only between windows of the same agent; `{raw}` belongs to `{agent}`, \
                 you are `{}`. To bring another agent in, use invite_to_conversation.",
                me.agent
            )));
        }
        return Ok(session);
    }
    crate::auth::normalize_session_label(raw)
}

/// `transfer_membership`: the window holding an active seat proposes moving
/// it to another window of the same agent; that window's
/// `join_conversation` completes the move. A later proposal replaces an
/// earlier one; leaving or being removed cancels it.
pub async fn transfer(bus: &Bus, me: &Identity, id: Uuid, to: &str) -> BusResult<Membership> {
    let to = parse_transfer_target(me, to)?;
    if to == me.session {
        return Err(BusError::invalid(
            "`to` is this window itself. Name another window of yours (a label such as `w2`, or \
             `\"\"` for your shared window).",
        ));
    }
    let mut tx = bus.pool.begin().await?;
    let (_, grant) = open(&mut tx, me, id).await?;
    let seats = lock_seats(
        &mut tx,
        me,
        id,
        &[(me.agent_id, &me.session), (me.agent_id, &to)],
    )
    .await?;
    let mine = seats
        .iter()
        .find(|s| s.is(me.agent_id, &me.session))
        .cloned();
    if !visible(mine.as_ref(), grant) {
        return Err(not_found(id));
    }
    let seat = match mine {
        Some(seat) if seat.state == "active" => seat,
        other => {
            return Err(BusError::forbidden(format!(
                "only an active seat can be transferred, and this window is {}. Join first \
                 (join_conversation) if you are invited.",
                standing(other.as_ref())
            )));
        }
    };
    let target_address = super::address(&me.agent, &to);
    if let Some(existing) = seats.iter().find(|s| s.is(me.agent_id, &to))
        && matches!(existing.state.as_str(), "active" | "removed")
    {
        return Err(BusError::conflict(format!(
            "{target_address} already has a{} seat in conversation {id}; a seat moves only to a \
             window without an active or removed one.",
            if existing.state == "active" {
                "n active"
            } else {
                " removed"
            }
        )));
    }
    let competing: Option<String> = sqlx::query_scalar(
        "SELECT session FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 AND agent_id = $3
           AND transfer_to_session = $4 AND state = 'active' AND id <> $5",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .bind(&to)
    .bind(seat.id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(other) = competing {
        return Err(BusError::conflict(format!(
            "window `{other}` already proposes moving its seat to {target_address}; one window \
             receives one seat. Let that transfer complete (join_conversation from \
             {target_address}) or pick another window."
        )));
    }
    sqlx::query(
        "UPDATE conversation_members SET transfer_to_session = $2, updated_at = now() WHERE id = $1",
    )
    .bind(seat.id)
    .bind(&to)
    .execute(&mut *tx)
    .await?;
    audit(
        &mut tx,
        me,
        Some(id),
        "transfer",
        &me.address(),
        serde_json::json!({
            "phase": "proposed", "to": target_address, "replaces": seat.transfer_to_session,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(Membership {
        conversation_id: id,
        address: me.address(),
        role: seat.role,
        state: seat.state,
        history_from_seq: seat.history_from_seq,
        outcome: "transfer_proposed",
        note: Some(format!(
            "the seat moves when {target_address} calls join_conversation; until then this \
             window keeps it."
        )),
    })
}

/// One message as recovery returns it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct RecoveredMessage {
    pub message_id: Uuid,
    pub seq: i64,
    /// The sender's address.
    pub from: String,
    /// None when the body cannot be shown (`unavailable` says why).
    pub body: Option<String>,
    pub reply_to: Option<Uuid>,
    pub metadata: Option<Value>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Recovery {
    pub conversation_id: Uuid,
    /// The earliest seq any seat of this agent could read.
    pub history_from_seq: i64,
    /// The seq ranges a seat of this agent was active for, the only ones
    /// recovery returns (`to_seq` null: a seat is still active). Messages
    /// between them were sent while no seat of the agent was in.
    pub entitled: Vec<EntitledRange>,
    /// Pass as `after_seq` for the next page.
    pub next_after_seq: i64,
    pub messages: Vec<RecoveredMessage>,
    /// Always true: recovery reads, it never posts or acknowledges.
    pub read_only: bool,
}

/// `recover_conversation_history`: with the agent token, once every session
/// of the agent is dead (revoked, expired, or its parent token revoked), read
/// the history of a conversation any window of the agent held a seat in, only
/// the seq ranges during which one of those seats was active.
/// Read-only: the only write is its audit row; no seat, receipt or message
/// changes, and nothing here lets the caller post or acknowledge.
pub async fn recover(
    bus: &Bus,
    me: &Identity,
    id: Uuid,
    after_seq: Option<i64>,
    limit: Option<i64>,
) -> BusResult<Recovery> {
    let after_seq = after_seq.unwrap_or(0);
    if after_seq < 0 {
        return Err(BusError::invalid(format!(
            "after_seq must be 0 or more (got {after_seq}); use the next_after_seq of the \
             previous page."
        )));
    }
    let limit = limit.unwrap_or(RECOVER_LIMIT_DEFAULT);
    if !(1..=RECOVER_LIMIT_MAX).contains(&limit) {
        return Err(BusError::invalid(format!(
            "limit must be 1..={RECOVER_LIMIT_MAX} (got {limit}); page with next_after_seq."
        )));
    }
    if me.window.is_some() {
        return Err(BusError::forbidden(
            "recover_conversation_history takes the agent token (acs_…), not a session \
             credential: it is for when every window of the agent is gone. A live window reads \
             with read_conversation.",
        ));
    }
    let mut tx = bus.pool.begin().await?;
    super::sessions::guard(&mut tx, me).await?;
    let live: Vec<String> = sqlx::query_scalar(
        "SELECT s.label FROM agent_sessions s
         JOIN agent_tokens t ON t.team_id = s.team_id AND t.id = s.token_id
         WHERE s.team_id = $1 AND s.agent_id = $2
           AND s.revoked_at IS NULL AND s.expires_at > now() AND t.revoked_at IS NULL
         ORDER BY s.label",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .fetch_all(&mut *tx)
    .await?;
    if !live.is_empty() {
        return Err(BusError::forbidden(format!(
            "recovery is only for when every session of agent `{}` is dead, and {} still live \
             ({}). Read through that window's credential with read_conversation, or revoke it \
             (revoke_session) if it is truly lost, then recover.",
            me.agent,
            if live.len() == 1 {
                "1 session is".to_string()
            } else {
                format!("{} sessions are", live.len())
            },
            live.join(", ")
        )));
    }
    let conversation = load(&mut tx, me, id, false).await?;
    // The agent is entitled to what one of its seats could read while it was
    // active: the union of those activations (migration 0017 records them
    // with every seat state change). Nothing sent while every seat was out
    // (left, removed, not yet re-admitted) is returned.
    let (activations, first_boundary): (i64, Option<i64>) = sqlx::query_as(
        "SELECT count(*), min(a.from_seq) FROM conversation_seat_activity a
         JOIN conversation_members s ON s.team_id = a.team_id AND s.id = a.member_id
         WHERE a.team_id = $1 AND a.conversation_id = $2 AND s.agent_id = $3",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .fetch_one(&mut *tx)
    .await?;
    if activations == 0 {
        return Err(not_found(id));
    }
    recover_entitled(tx, me, &conversation, after_seq, limit, first_boundary).await
}

/// One range of seq an agent may recover: a seat of it was active from
/// `from_seq` through `to_seq` (None: still active).
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct EntitledRange {
    pub from_seq: i64,
    pub to_seq: Option<i64>,
}

/// The page of [`recover`] for an agent that held an active seat at some point.
async fn recover_entitled(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    me: &Identity,
    conversation: &Conversation,
    after_seq: i64,
    limit: i64,
    first_boundary: Option<i64>,
) -> BusResult<Recovery> {
    let id = conversation.id;
    // Overlapping activations (a seat that left and was invited back with
    // history from the start, or a transferred seat beside its successor)
    // merge into disjoint ranges, so a message is returned once.
    let entitled: Vec<EntitledRange> = sqlx::query_as(
        "SELECT lower(r) AS from_seq, upper(r) - 1 AS to_seq
         FROM unnest((SELECT range_agg(int8range(a.from_seq, a.to_seq + 1))
                      FROM conversation_seat_activity a
                      JOIN conversation_members s ON s.team_id = a.team_id AND s.id = a.member_id
                      WHERE a.team_id = $1 AND a.conversation_id = $2 AND s.agent_id = $3)) r
         ORDER BY 1",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .fetch_all(&mut *tx)
    .await?;
    let from: Vec<i64> = entitled.iter().map(|r| r.from_seq).collect();
    let to: Vec<i64> = entitled
        .iter()
        .map(|r| r.to_seq.unwrap_or(i64::MAX))
        .collect();
    // Each range is read in seq order up to `limit` on the index, so a long
    // stretch the agent was out of costs nothing.
    let messages: Vec<RecoveredMessage> = sqlx::query_as(
        "SELECT x.* FROM unnest($3::bigint[], $4::bigint[]) AS r(from_seq, to_seq)
         CROSS JOIN LATERAL (
           SELECT m.id AS message_id, m.seq,
                  CASE WHEN m.sender_session = '' THEN a.name ELSE a.name || '/' || m.sender_session END AS \"from\",
                  CASE WHEN m.tombstoned_at IS NULL AND m.publication_state = 'stored' AND m.body <> ''
                       THEN m.body END AS body,
                  m.reply_to, m.metadata, m.created_at,
                  CASE WHEN m.tombstoned_at IS NOT NULL THEN 'tombstoned: ' || m.tombstone_reason
                       WHEN m.publication_state <> 'stored' THEN m.publication_state
                       WHEN m.body = '' THEN 'unreachable' END AS unavailable
           FROM conversation_messages m
           JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
           WHERE m.team_id = $1 AND m.conversation_id = $2
             AND m.seq > $5 AND m.seq >= r.from_seq AND m.seq <= r.to_seq
           ORDER BY m.seq
           LIMIT $6) x
         ORDER BY x.seq
         LIMIT $6",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(&from)
    .bind(&to)
    .bind(after_seq)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    let next_after_seq = messages.last().map_or(after_seq, |m| m.seq);
    audit(
        &mut tx,
        me,
        Some(conversation.id),
        "recover",
        &me.address(),
        serde_json::json!({
            "after_seq": after_seq, "returned": messages.len(), "next_after_seq": next_after_seq,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(Recovery {
        conversation_id: id,
        history_from_seq: first_boundary.unwrap_or(1),
        entitled,
        next_after_seq,
        messages,
        read_only: true,
    })
}
