//! A conversation's life: `create_conversation` (title, where it lives, the
//! owner seat and the first invitations), `list_conversations`, and
//! `archive_conversation`. Visibility is chosen once, at creation.

use uuid::Uuid;

use super::access::{not_found, open, refuse_borrowed_label, require_manager, visible};
use super::seats::{MEMBERS_MAX, invite_new_seat, lock_seats, parse_window, resolve_window};
use super::{ConversationView, Publication, SeatRole, Visibility, audit_own, view, view_select};
use crate::Bus;
use crate::auth::Identity;
use crate::backend::BackendKind;
use crate::error::{BusError, BusResult};
use crate::store::requests::Writer;
use crate::store::{
    conversations::projects, delivery::broker_conditions, identity::sessions, text,
};

pub const TITLE_MAX_BYTES: usize = 200;

/// Conversation titles: one line ([`text::one_line`]), 1..=200 bytes.
pub fn check_title(raw: &str) -> BusResult<String> {
    let title = text::one_line_else(
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

/// Where a new conversation lives: in one project (by name), or private. Its
/// [`Visibility`] follows, and never changes later.
#[derive(Clone, Debug)]
pub enum Placement {
    Project(String),
    Private,
}

impl Placement {
    /// Exactly one of `project` / `private: true`.
    pub fn from_args(project: Option<String>, private: Option<bool>) -> BusResult<Placement> {
        match (project, private.unwrap_or(false)) {
            (Some(project), false) => Ok(Placement::Project(project)),
            (None, true) => Ok(Placement::Private),
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

    pub fn visibility(&self) -> Visibility {
        match self {
            Placement::Project(_) => Visibility::Project,
            Placement::Private => Visibility::Private,
        }
    }
}

/// `create_conversation`: the creator's window gets the `owner` seat (active,
/// history from 1); each invitee an invited `participant` seat.
pub async fn create(
    bus: &Bus,
    w: &mut Writer,
    me: &Identity,
    title: &str,
    placement: Placement,
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
        if window.0 == me.agent && window.1 == me.window {
            return Err(BusError::invalid(format!(
                "`{raw}` is this window: you get the owner seat anyway. Leave it out of `invite`."
            )));
        }
        if seen.insert(window.clone()) {
            wanted.push(window);
        }
    }

    // Before the transaction: it asks the broker (no network I/O inside one).
    broker_conditions::refuse_if_streams_missing(bus, me.team_id, &me.team).await?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    refuse_borrowed_label(&mut tx, me).await?;
    let visibility = placement.visibility();
    let project_id = match &placement {
        Placement::Private => None,
        Placement::Project(name) => {
            let id = projects::find(&mut tx, me, name).await?;
            if !projects::holds_grant(&mut tx, me.team_id, id, me.agent_id).await? {
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
    let backend: BackendKind =
        sqlx::query_scalar("SELECT conversation_backend FROM teams WHERE id = $1")
            .bind(me.team_id)
            .fetch_one(&mut *tx)
            .await?;
    // A team routed to a broker this server cannot reach is an explicit
    // refusal, never a silent fallback to PostgreSQL.
    bus.backends.require(backend)?;
    // Bodies off PostgreSQL go through the outbox: accepted now, published later.
    let publication = Publication::for_backend(backend);
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO conversations
             (id, team_id, title, visibility, project_id, created_by, created_session, backend, publication)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(id)
    .bind(me.team_id)
    .bind(&title)
    .bind(visibility)
    .bind(project_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(backend)
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
    .bind(&me.window)
    .execute(&mut *tx)
    .await?;
    audit_own(
        &mut tx,
        me,
        id,
        "create",
        serde_json::json!({
            "visibility": visibility,
            "project_id": project_id,
            "backend": backend,
        }),
    )
    .await?;
    for invitee in &invitees {
        invite_new_seat(&mut tx, me, id, invitee, SeatRole::Participant, 1).await?;
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
    .bind(&me.window)
    .bind(include_archived)
    .fetch_all(&mut *conn)
    .await?)
}

/// `archive_conversation`: owners and moderators close it to new messages;
/// its history stays readable. Archiving twice changes nothing.
pub async fn archive(w: &mut Writer, me: &Identity, id: Uuid) -> BusResult<ConversationView> {
    let mut tx = w.begin().await?;
    let (conversation, grant) = open(&mut tx, me, id).await?;
    let seats = lock_seats(&mut tx, me, id, &[(me.agent_id, &me.window)]).await?;
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
        audit_own(
            &mut tx,
            me,
            id,
            "archive",
            serde_json::json!({ "last_seq": conversation.last_seq }),
        )
        .await?;
    }
    let view = view(&mut tx, me, id).await?;
    tx.commit().await?;
    Ok(view)
}
