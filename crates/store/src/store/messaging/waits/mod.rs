//! Waiting: `wait_for_updates` and `ask_agent`.
//!
//! The rule that makes a wait reliable: subscribe to the event hub first, then
//! check the database, then block. Unread direct messages (from before the
//! wait too) are found by the check; anything after arrives as an event.
//! Notifications can still be lost (a listener reconnecting, a failed
//! notify), so a blocked wait re-checks the database on a timer and at its
//! deadline for unread DMs and for every change since the wait began: a lost
//! notification delays a wake, it never loses one. That loop is `long_poll.rs`, shared
//! with `wait_for_conversation_updates`; this file says what wakes a window
//! and what it is told.
//!
//! What wakes a window: direct messages to it (or to its agent as a whole),
//! tasks, locks, notes and path reservations (team-wide), announcements, and channel messages in
//! its focused channel (all channels with `all_channels`). Never its own
//! actions, and never a DM addressed to a sibling window.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::types::Json;
use tokio::time::Instant;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind, Waiter};
use crate::store::fenced::BindCaller as _;
use crate::store::identity::sessions::Refusal;
use crate::store::long_poll::{OnEvent, Polled, Waited, answer_if_valid, long_poll};
use crate::store::{messaging::channels, messaging::messages};

mod ask;
pub use ask::{AskResult, ask};

pub const TIMEOUT_MIN_SECS: u64 = 1;
pub const TIMEOUT_MAX_SECS: u64 = 300;
/// Under the ~60 s at which common MCP clients cut a tool call.
pub const TIMEOUT_DEFAULT_SECS: u64 = 50;
/// `kinds` entries at most: one per kind there is.
pub const KINDS_MAX: usize = 5;
const SUMMARIES_MAX: usize = 50;
const PREVIEW_CHARS: usize = 200;

pub fn check_timeout(timeout_seconds: Option<u64>) -> BusResult<Duration> {
    let secs = crate::store::limits::within(
        "timeout_seconds",
        timeout_seconds.unwrap_or(TIMEOUT_DEFAULT_SECS),
        TIMEOUT_MIN_SECS..=TIMEOUT_MAX_SECS,
        "",
        &format!(
            "Many MCP clients cut a call near 60 s, so the default {TIMEOUT_DEFAULT_SECS} is \
             the safe choice; call again to keep waiting."
        ),
    )?;
    Ok(Duration::from_secs(secs))
}

/// One thing that happened, as a waiter sees it.
#[derive(Clone, Debug, Serialize)]
pub struct EventSummary {
    pub kind: EventKind,
    /// A message id, task key, lock name or note key.
    pub id: String,
    /// Who did it (an address), when known.
    pub by: Option<String>,
    /// Present (true) when `by` is a person of the team, not an agent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_person: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The first 200 characters of a message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
}

/// What `wait_for_updates` found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Events {
    pub events: Vec<EventSummary>,
}

/// `wait_for_updates`'s answer.
pub type WaitResult = Waited<Events>;

#[derive(Clone, Debug)]
pub struct WaitRequest {
    pub timeout: Duration,
    /// Which kinds wake this wait (None = all).
    pub kinds: Option<Vec<EventKind>>,
    pub all_channels: bool,
}

/// Parse `kinds`: each of message, task, lock, note, reservation.
pub fn parse_kinds(kinds: Option<Vec<String>>) -> BusResult<Option<Vec<EventKind>>> {
    let Some(kinds) = kinds else { return Ok(None) };
    // The raw length, before any per-entry work: duplicates count.
    if kinds.len() > KINDS_MAX {
        return Err(BusError::invalid(format!(
            "kinds holds {} entries; there are {KINDS_MAX} kinds (message, task, lock, note, reservation), so \
             give at most {KINDS_MAX}, each once (or omit `kinds` to wake on all of them).",
            kinds.len()
        )));
    }
    let mut parsed = Vec::with_capacity(kinds.len());
    for kind in kinds {
        parsed.push(match kind.trim().to_ascii_lowercase().as_str() {
            "message" | "messages" => EventKind::Message,
            "task" | "tasks" => EventKind::Task,
            "lock" | "locks" => EventKind::Lock,
            "note" | "notes" => EventKind::Note,
            "reservation" | "reservations" => EventKind::Reservation,
            other => {
                return Err(BusError::invalid(format!(
                    "unknown kind {}: kinds are message, task, lock, note and reservation \
                     (omit `kinds` to wake on all of them).",
                    crate::store::text::quote(other)
                )));
            }
        });
    }
    Ok(Some(parsed))
}

/// Whether `event` may concern this window: all that [`concerns`] asks but
/// the channel focus, which is read from the database only after the wait
/// has subscribed. The hub runs this for a blocked wait, so an event it
/// refuses (another window's DM, conversation traffic) wakes nothing.
fn may_concern(event: &BusEvent, me: &Identity, request: &WaitRequest) -> bool {
    if event.team_id != me.team_id {
        return false;
    }
    if event.actor == Some(me.agent_id)
        && event.actor_session.as_deref() == Some(me.window.as_str())
    {
        return false;
    }
    if let Some(kinds) = &request.kinds
        && !kinds.contains(&event.kind)
    {
        return false;
    }
    match event.kind {
        EventKind::Message => event.recipient.is_none_or(|recipient| {
            recipient == me.agent_id
                && event
                    .recipient_session
                    .as_deref()
                    .is_none_or(|s| s == me.window)
        }),
        EventKind::Task | EventKind::Lock | EventKind::Note | EventKind::Reservation => true,
        // Conversation traffic has its own wait (wait_for_conversation_updates).
        EventKind::Conversation | EventKind::Outbox => false,
    }
}

/// Whether `event` concerns this window.
fn concerns(event: &BusEvent, me: &Identity, focus: Option<Uuid>, request: &WaitRequest) -> bool {
    may_concern(event, me, request)
        && (event.kind != EventKind::Message
            || event.recipient.is_some()
            || event.announce
            || request.all_channels
            || (focus.is_some() && event.channel_id == focus))
}

/// `wait_for_updates`. What it found is handed out only if the caller's
/// credential still holds when it wakes: a wait blocked across a revocation
/// or a disable answers the refusal, never what arrived after it.
pub async fn wait_for_updates(
    bus: &Bus,
    me: &Identity,
    request: WaitRequest,
) -> BusResult<WaitResult> {
    // No answer for a credential taken away while the call waited: read in
    // the last look's statement when the wait ends on one (found, or timed
    // out), else on its own.
    answer_if_valid(bus, me, async {
        let mut events = {
            let (me, request) = (me.clone(), request.clone());
            bus.events.wait_for(
                me.team_id,
                Box::new(move |event| may_concern(event, &me, &request)),
            )
        };
        // Changes committed from `since` on are found by the database check
        // too, so a notification that never arrives delays a wake by one
        // re-check at most.
        let wants_messages = request
            .kinds
            .as_ref()
            .is_none_or(|k| k.contains(&EventKind::Message));
        let started = start(bus, me, wants_messages).await?;
        let (since, focus) = (started.since, started.focus);
        let unread_at_start = started.unread_direct;
        let deadline = Instant::now() + request.timeout;
        let request = &request;
        let mut first_look = true;
        // The credential as the latest look read it; none after a check that
        // did not read it.
        let last_read = std::sync::Mutex::new(None);
        let last_read = &last_read;
        let polled = long_poll(
            &mut events,
            bus,
            deadline,
            |event| {
                if concerns(&event, me, focus, request) {
                    OnEvent::End(event)
                } else {
                    OnEvent::Ignore
                }
            },
            move || {
                let first = std::mem::replace(&mut first_look, false);
                async move {
                    // The first look is `start`'s: unread direct messages (they
                    // may have arrived before we subscribed) seen in the
                    // snapshot `since` was read in. What was committed after
                    // it is an event this wait is subscribed to, and one whose
                    // notification was lost is found by the next look, as
                    // during the rest of the wait.
                    *last_read.lock().expect("not poisoned") = None;
                    if first {
                        return match unread_at_start {
                            true => pending_direct(bus, me).await,
                            false => Ok(None),
                        };
                    }
                    let (found, credential) = look(bus, me, since, focus, request).await?;
                    *last_read.lock().expect("not poisoned") = Some(credential);
                    Ok(found)
                }
            },
        )
        .await?;
        let last_read = last_read.lock().expect("not poisoned").take();
        Ok(match polled {
            Polled::Found(found) => (WaitResult::woke(Events { events: found }), last_read),
            Polled::Ended(event) => {
                let mut woken = vec![event];
                gather(&mut events, &mut woken, me, focus, request);
                let events = summarize(bus, me, &woken).await?;
                (WaitResult::woke(Events { events }), None)
            }
            Polled::TimedOut => (WaitResult::timed_out(), last_read),
            Polled::Stopping => (WaitResult::restarting("wait_for_updates"), None),
        })
    })
    .await
}

/// How a wait begins, read in one round trip (a wait begins again after
/// every answer, so a fleet's waits begin by thousands): the database's
/// clock (its `since`), the window's focus (the id of its default channel)
/// and whether the window has an unread direct message (its first look,
/// asked only when the wait wants messages).
struct Started {
    since: DateTime<Utc>,
    focus: Option<Uuid>,
    unread_direct: bool,
}

/// The default channel is decided from the window's labels by
/// [`messages::default_channel_of`], after they are read; so the statement
/// that reads them also looks up the channels their names could mean (the
/// window label, and the `channel` and `project` labels trimmed, without
/// `#`, lower-cased) and says which names it looked for. When the decided
/// name is one of those, its answer stands (found or not); otherwise (a
/// label the rough SQL spelling does not match) the channel is looked up by
/// its exact name.
async fn start(bus: &Bus, me: &Identity, wants_messages: bool) -> BusResult<Started> {
    #[derive(serde::Deserialize)]
    struct Found {
        id: Uuid,
        name: String,
    }
    #[derive(sqlx::FromRow)]
    struct Row {
        since: DateTime<Utc>,
        #[sqlx(flatten)]
        labels: messages::ChannelLabels,
        unread_direct: bool,
        searched: Vec<String>,
        found: Json<Vec<Found>>,
    }
    static START: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{cursor} SELECT now() AS since, p.channel, p.project,
                    ($5 AND EXISTS ({unread})) AS unread_direct, names.searched,
                    (SELECT coalesce(json_agg(json_build_object('id', c.id, 'name', c.name)), '[]')
                     FROM channels c WHERE c.team_id = $1 AND c.name = ANY (names.searched)) AS found
             FROM (SELECT) AS one
             LEFT JOIN presence p ON p.team_id = $1 AND p.agent_id = $2 AND p.session = $3
             CROSS JOIN LATERAL (SELECT array_remove(ARRAY[$6::text,
                 lower(ltrim(btrim(p.channel), '#')), lower(ltrim(btrim(p.project), '#'))], NULL)
                 AS searched) names",
            cursor = messages::UNREAD_DM_CURSOR,
            unread = messages::UNREAD_DM_IDS,
        )
    });
    let window_channel = channels::normalize_name(&me.window).ok();
    let row: Row = sqlx::query_as(START.as_str())
        .bind_window(me)
        .bind(1_i64)
        .bind(wants_messages)
        .bind(window_channel)
        .fetch_one(&bus.pool)
        .await?;
    let focus = match messages::default_channel_of(&row.labels, me) {
        Some(default) if row.searched.contains(&default.name) => {
            let found = row.found.0.iter().find(|c| c.name == default.name);
            found.map(|c| c.id)
        }
        Some(default) => channels::find(bus, me, &default.name).await?.map(|c| c.id),
        None => None,
    };
    Ok(Started {
        since: row.since,
        focus,
        unread_direct: row.unread_direct,
    })
}

/// A look after the first: unread direct messages first (they wake at once),
/// else what changed since `since`. One round trip while nothing is there,
/// the case of almost every look; the messages themselves are read only
/// when there is one.
async fn look(
    bus: &Bus,
    me: &Identity,
    since: DateTime<Utc>,
    focus: Option<Uuid>,
    request: &WaitRequest,
) -> BusResult<(Option<Vec<EventSummary>>, Refusal)> {
    let (unread_direct, missed, credential) = changes_since(bus, me, since, focus, request).await?;
    if unread_direct {
        // None when another window read them in between: then what changed.
        if let Some(direct) = pending_direct(bus, me).await? {
            return Ok((Some(direct), credential));
        }
    }
    Ok(((!missed.is_empty()).then_some(missed), credential))
}

/// What changed since `since` that concerns this window, read from the
/// database: the safety net under lost notifications. Tasks (their events),
/// notes, lock acquisitions, new reservations, and channel messages in the
/// focus (or every channel) and announcements; never this window's own
/// changes. In the same statement, whether the window has an unread direct
/// message (when the wait wants messages): the first of the answer's values;
/// and whether the caller's credential still holds (as
/// `sessions::still_valid` reads it), the last.
async fn changes_since(
    bus: &Bus,
    me: &Identity,
    since: DateTime<Utc>,
    focus: Option<Uuid>,
    request: &WaitRequest,
) -> BusResult<(bool, Vec<EventSummary>, Refusal)> {
    let wants = |kind| request.kinds.as_ref().is_none_or(|k| k.contains(&kind));
    #[derive(serde::Deserialize)]
    struct Change {
        kind: String,
        id: String,
        by: String,
        by_person: bool,
        channel: Option<String>,
        preview: Option<String>,
    }
    #[derive(sqlx::FromRow)]
    struct Row {
        unread_direct: bool,
        changes: Json<Vec<Change>>,
        #[sqlx(flatten)]
        credential: Refusal,
    }
    // Binds: $1 team, $2 agent, $3 window and $4 (1) as the unread-DM
    // cursors read them; then $5 since, $6-$9 and $13 the kinds wanted, $10
    // all channels, $11 the focus, $12 how many; $14-$16 the credential.
    static CHANGES: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{cursor}, missed AS (
             SELECT changes.kind, changes.id, changes.channel, changes.preview, changes.at,
                    a.kind = 'person' AS by_person,
                    CASE WHEN changes.by_session = '' THEN a.name ELSE a.name || '/' || changes.by_session END AS by
             FROM (
                 SELECT 'task' AS kind, t.key AS id, e.agent_id AS by_agent, e.session AS by_session,
                        NULL::text AS channel, NULL::text AS preview, e.at
                 FROM task_events e JOIN tasks t ON t.team_id = e.team_id AND t.id = e.task_id
                 WHERE e.team_id = $1 AND e.at > $5 AND $6
                 UNION ALL
                 SELECT 'note', n.key, n.updated_by_agent_id, n.updated_by_session, NULL, NULL, n.updated_at
                 FROM notes n WHERE n.team_id = $1 AND n.updated_at > $5 AND $7
                 UNION ALL
                 SELECT 'lock', l.name, l.holder_agent_id, l.holder_session, NULL, NULL, l.acquired_at
                 FROM locks l WHERE l.team_id = $1 AND l.acquired_at > $5 AND $8
                 UNION ALL
                 SELECT 'reservation', r.pattern, r.holder_agent_id, r.holder_session, NULL, NULL, r.created_at
                 FROM path_reservations r WHERE r.team_id = $1 AND r.created_at > $5 AND $13
                 UNION ALL
                 SELECT 'message', m.id::text, m.sender_id, m.sender_session, c.name, left(m.body, 200), m.created_at
                 FROM messages m JOIN channels c ON c.team_id = m.team_id AND c.id = m.channel_id
                 WHERE m.team_id = $1 AND m.created_at > $5 AND $9
                   AND (m.announce OR $10 OR m.channel_id = $11)
             ) changes
             JOIN agents a ON a.team_id = $1 AND a.id = changes.by_agent
             WHERE NOT (changes.by_agent = $2 AND changes.by_session = $3)
             ORDER BY changes.at LIMIT $12)
             SELECT ($9 AND EXISTS ({unread})) AS unread_direct,
                    (SELECT coalesce(json_agg(missed ORDER BY missed.at), '[]') FROM missed) AS changes,
                    credential.refusal, credential.session_epoch, credential.refused_since
             FROM agent_credential_refusal($1, $2, $14, $15, $16) AS credential",
            cursor = messages::UNREAD_DM_CURSOR,
            unread = messages::UNREAD_DM_IDS,
        )
    });
    let row: Row = sqlx::query_as(CHANGES.as_str())
        .bind_window(me)
        .bind(1_i64)
        .bind(since)
        .bind(wants(EventKind::Task))
        .bind(wants(EventKind::Note))
        .bind(wants(EventKind::Lock))
        .bind(wants(EventKind::Message))
        .bind(request.all_channels)
        .bind(focus)
        .bind(SUMMARIES_MAX as i64)
        .bind(wants(EventKind::Reservation))
        .bind_credential(me)
        .fetch_one(&bus.pool)
        .await?;
    let changes = row
        .changes
        .0
        .into_iter()
        .filter_map(|row| {
            let kind = match row.kind.as_str() {
                "task" => EventKind::Task,
                "note" => EventKind::Note,
                "lock" => EventKind::Lock,
                "reservation" => EventKind::Reservation,
                "message" => EventKind::Message,
                _ => return None,
            };
            Some(EventSummary {
                kind,
                id: row.id,
                by: Some(row.by),
                by_person: row.by_person,
                channel: row.channel,
                to: None,
                preview: row.preview,
            })
        })
        .collect();
    Ok((row.unread_direct, changes, row.credential))
}

/// Take whatever else concerning us has already arrived, without waiting: a
/// burst comes back in one answer, and the first event is never delayed.
fn gather(
    events: &mut Waiter,
    woken: &mut Vec<Arc<BusEvent>>,
    me: &Identity,
    focus: Option<Uuid>,
    request: &WaitRequest,
) {
    while woken.len() < SUMMARIES_MAX {
        match events.try_recv() {
            Some(Ok(event)) if concerns(&event, me, focus, request) => woken.push(event),
            Some(_) => {}
            None => return,
        }
    }
}

/// Unread direct messages to this window, as summaries (`None`: there are
/// none); the cursors are not moved (read_messages does that).
async fn pending_direct(bus: &Bus, me: &Identity) -> BusResult<Option<Vec<EventSummary>>> {
    let unread = messages::unread_direct_messages(bus, me, SUMMARIES_MAX as i64).await?;
    Ok((!unread.is_empty()).then(|| unread.into_iter().map(message_summary).collect()))
}

fn message_summary(m: messages::MessageView) -> EventSummary {
    EventSummary {
        kind: EventKind::Message,
        id: m.id.to_string(),
        by: Some(m.from),
        by_person: m.from_person,
        channel: m.channel,
        to: m.to,
        preview: Some(m.body.chars().take(PREVIEW_CHARS).collect()),
    }
}

/// Events as summaries: messages re-read from the database (only what this
/// window may see), everything else named with who did it.
async fn summarize(
    bus: &Bus,
    me: &Identity,
    woken: &[Arc<BusEvent>],
) -> BusResult<Vec<EventSummary>> {
    // Each read only when there is something to read: a wake by a direct
    // message (the common one) reads the message alone.
    let message_ids: Vec<Uuid> = woken
        .iter()
        .filter(|e| e.kind == EventKind::Message)
        .filter_map(|e| e.id.parse().ok())
        .collect();
    let mut by_id: HashMap<String, messages::MessageView> = if message_ids.is_empty() {
        HashMap::new()
    } else {
        messages::visible(bus, me, &message_ids)
            .await?
            .into_iter()
            .map(|m| (m.id.to_string(), m))
            .collect()
    };
    let actors: Vec<Uuid> = woken
        .iter()
        .filter(|e| e.kind != EventKind::Message)
        .filter_map(|e| e.actor)
        .collect();
    let names: HashMap<Uuid, (String, bool)> = if actors.is_empty() {
        HashMap::new()
    } else {
        sqlx::query_as::<_, (Uuid, String, bool)>(
            "SELECT id, name, kind = 'person' FROM agents WHERE team_id = $1 AND id = ANY($2)",
        )
        .bind(me.team_id)
        .bind(&actors)
        .fetch_all(&bus.pool)
        .await?
        .into_iter()
        .map(|(id, name, person)| (id, (name, person)))
        .collect()
    };
    let mut out = Vec::new();
    for event in woken {
        if event.kind == EventKind::Message {
            if let Some(message) = by_id.remove(&event.id) {
                out.push(message_summary(message));
            }
            continue;
        }
        let actor = event.actor.and_then(|id| names.get(&id));
        let by = actor.map(|(name, _)| {
            crate::store::address(name, event.actor_session.as_deref().unwrap_or_default())
        });
        out.push(EventSummary {
            kind: event.kind,
            id: event.id.clone(),
            by,
            by_person: actor.is_some_and(|(_, person)| *person),
            channel: None,
            to: None,
            preview: None,
        });
    }
    Ok(out)
}
