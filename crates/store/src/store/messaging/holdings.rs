//! What a window holds: its claimed tasks, its locks and its path
//! reservations. Read in one bounded statement for `pending_for_me` (the
//! host's Stop hook blocks a stop on it), and released when the window ends:
//!
//! - it leaves (`heartbeat {offline: true}`: the `session_end` hook, its
//!   proxy exiting): its locks and reservations at once
//!   ([`release_on_leave`]); its claimed tasks only once it has stayed away
//!   for a grace ([`release_tasks_of_departed`], `workers/departures.rs`), so
//!   a conversation resumed in time (a heartbeat again, or a write on the
//!   task) keeps its work;
//! - it is revoked: its token revoked or its agent disabled, all of it at
//!   once, in that transaction ([`release_ended`]), since nothing it holds
//!   can be released by it any more; `revoke_session`, all of it once the
//!   window has stayed revoked for a few seconds
//!   ([`release_revoked_windows`], the departures pass): a proxy that
//!   restarts takes its window over by revoking it and registering the same
//!   label again at once, and keeps what the window holds;
//! - its presence expired without a word (the presence sweeper): its
//!   reservations ([`release_reservations_of_gone`]); its locks and leases
//!   run out on their own clocks.
//!
//! A task the bus releases gets the event `release_task` writes (`released`,
//! by the window that held it) with `released_by: "bus"`, `why` and a `note`
//! naming the window, so `get_task` says what happened. The events that wake
//! `wait_for_updates` are queued inside the transaction
//! ([`crate::events::notify_in`]), delivered at commit whichever process
//! committed (an operator's CLI revoking a token has no publisher): these
//! are rare writes, never a hot path.
//!
//! Not here: what a window may take (locks.rs, tasks/, the reservation tools).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Postgres};
use uuid::Uuid;

use crate::auth::Identity;
use crate::error::BusResult;
use crate::events::{self, BusEvent, EventKind};
use crate::store::messaging::messages::BoundedCount;

/// Each kind of holding shown (the count says how many there are).
const SHOWN: i64 = 10;
/// Holdings are counted up to this many of each kind.
const COUNTED_MAX: i64 = 1_000;

/// A claimed task of this window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeldTask {
    pub key: String,
    pub title: String,
    pub lease_expires_at: DateTime<Utc>,
    /// The lease ran out: anyone may claim it now, but until someone does it
    /// is still this window's to complete or release.
    pub lapsed: bool,
}

/// A live lock of this window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeldLock {
    pub name: String,
    pub expires_at: DateTime<Utc>,
}

/// A live path reservation of this window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeldReservation {
    pub pattern: String,
    pub exclusive: bool,
    pub project: String,
    pub expires_at: DateTime<Utc>,
}

/// One kind of holding: how many (counted up to a cap) and the first few.
#[derive(Clone, Debug, Serialize)]
pub struct Held<T> {
    #[serde(flatten)]
    pub count: BoundedCount,
    pub items: Vec<T>,
}

impl<T> Held<T> {
    fn of(counted: i64, items: Vec<T>) -> Self {
        Held {
            count: BoundedCount::of(counted, COUNTED_MAX),
            items,
        }
    }
}

/// What this window holds now.
#[derive(Clone, Debug, Serialize)]
pub struct Holdings {
    /// Tasks it claimed (oldest claim first), a lapsed lease included.
    pub claimed_tasks: Held<HeldTask>,
    /// Locks it holds (nearest expiry first).
    pub locks: Held<HeldLock>,
    /// Path reservations it holds (nearest expiry first).
    pub reservations: Held<HeldReservation>,
}

/// The `WITH` items that read what this window holds, for `pending_for_me`'s
/// one statement: each kind, cut at `$counted` (a placeholder, bound to
/// [`COUNTED_BIND`]), through an index of the window's own (tasks,
/// reservations) or of the team's live locks. Binds $1 team, $2 agent, $3
/// window.
macro_rules! holdings_items {
    ($counted:literal) => {
        concat!(
            "mine_tasks AS (
                 SELECT key, title, lease_expires_at, lease_expires_at <= now() AS lapsed,
                        claimed_at
                 FROM tasks
                 WHERE team_id = $1 AND holder_agent_id = $2 AND holder_session = $3
                   AND status = 'claimed'
                 ORDER BY claimed_at LIMIT ",
            $counted,
            "),
             mine_locks AS (
                 SELECT name, expires_at FROM locks
                 WHERE team_id = $1 AND expires_at > now()
                   AND holder_agent_id = $2 AND holder_session = $3
                 ORDER BY expires_at LIMIT ",
            $counted,
            "),
             mine_reservations AS (
                 SELECT pattern, exclusive, project, expires_at FROM path_reservations
                 WHERE team_id = $1 AND holder_agent_id = $2 AND holder_session = $3
                   AND expires_at > now()
                 ORDER BY expires_at LIMIT ",
            $counted,
            ")"
        )
    };
}
pub(crate) use holdings_items;

/// The columns of [`HoldingsRow`] over [`holdings_items`]: each kind
/// counted, and its first `$shown` (a placeholder, bound to [`SHOWN_BIND`])
/// listed.
macro_rules! holdings_columns {
    ($shown:literal) => {
        concat!(
            $crate::store::messaging::holdings::counted_and_shown!(
                "mine_tasks",
                "claimed_at",
                $shown,
                "tasks"
            ),
            ", ",
            $crate::store::messaging::holdings::counted_and_shown!(
                "mine_locks",
                "expires_at",
                $shown,
                "locks"
            ),
            ", ",
            $crate::store::messaging::holdings::counted_and_shown!(
                "mine_reservations",
                "expires_at",
                $shown,
                "reservations"
            )
        )
    };
}
pub(crate) use holdings_columns;

/// One kind's two columns: `{$name}_counted`, the rows of `$item`, and
/// `$name`, its first `$shown` in `$order` as a JSON array.
macro_rules! counted_and_shown {
    ($item:literal, $order:literal, $shown:literal, $name:literal) => {
        concat!(
            "(SELECT count(*) FROM ",
            $item,
            ") AS ",
            $name,
            "_counted, ",
            "(SELECT coalesce(jsonb_agg(x ORDER BY x.",
            $order,
            "), '[]') ",
            "FROM (SELECT * FROM ",
            $item,
            " ORDER BY ",
            $order,
            " LIMIT ",
            $shown,
            ") x) AS ",
            $name
        )
    };
}
pub(crate) use counted_and_shown;

/// [`Holdings`] as [`holdings_columns`] reads them.
#[derive(sqlx::FromRow)]
pub(crate) struct HoldingsRow {
    tasks_counted: i64,
    tasks: Json<Vec<HeldTask>>,
    locks_counted: i64,
    locks: Json<Vec<HeldLock>>,
    reservations_counted: i64,
    reservations: Json<Vec<HeldReservation>>,
}

impl HoldingsRow {
    /// Each kind counted up to [`COUNTED_MAX`] and its first [`SHOWN`].
    pub(crate) fn holdings(self) -> Holdings {
        Holdings {
            claimed_tasks: Held::of(self.tasks_counted, self.tasks.0),
            locks: Held::of(self.locks_counted, self.locks.0),
            reservations: Held::of(self.reservations_counted, self.reservations.0),
        }
    }
}

/// How many of each kind [`holdings_items`] counts (binds as its
/// `$counted`), and how many [`holdings_columns`] lists (its `$shown`).
pub(crate) const COUNTED_BIND: i64 = COUNTED_MAX + 1;
pub(crate) const SHOWN_BIND: i64 = SHOWN;

/// How a window ended, as a released task's event says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// It left (`session_end`, its proxy exited) and did not come back
    /// within the grace (seconds).
    LeftFor(u64),
    /// `revoke_session`.
    SessionRevoked,
    /// The agent token its session came from was revoked.
    TokenRevoked,
    /// Its agent was disabled.
    AgentDisabled,
}

impl Ending {
    /// The `why` of the task event.
    fn word(self) -> &'static str {
        match self {
            Ending::LeftFor(_) => "session_end",
            Ending::SessionRevoked => "session_revoked",
            Ending::TokenRevoked => "token_revoked",
            Ending::AgentDisabled => "agent_disabled",
        }
    }

    /// What happened to the window, after its address in the note.
    fn phrase(self) -> String {
        match self {
            Ending::LeftFor(grace) => format!(
                "ended (its host conversation closed: session_end) and did not come back \
                 within {grace} s"
            ),
            Ending::SessionRevoked => "was revoked (revoke_session)".into(),
            Ending::TokenRevoked => "ended with its agent token, which was revoked".into(),
            Ending::AgentDisabled => "ended: its agent was disabled".into(),
        }
    }
}

/// What one release let go of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub tasks: Vec<String>,
    pub locks: Vec<String>,
    pub reservations: u64,
}

/// Which windows of one agent: these labels, or every one (`None`).
type Labels<'a> = Option<&'a [String]>;

/// Delete the live locks of `agent`'s windows `labels` (the team's live
/// locks are all this reads), for [`release`].
const RELEASE_LOCKS: &str = "DELETE FROM locks
     WHERE team_id = $1 AND expires_at > now()
       AND holder_agent_id = $2 AND ($3::text[] IS NULL OR holder_session = ANY($3))
     RETURNING name, holder_session";

/// Delete the reservations (live or not) of `agent`'s windows `labels`,
/// for [`release`].
const RELEASE_RESERVATIONS: &str = "DELETE FROM path_reservations
     WHERE team_id = $1 AND holder_agent_id = $2
       AND ($3::text[] IS NULL OR holder_session = ANY($3))
     RETURNING pattern, holder_session";

/// Delete the locks and the reservations of `agent`'s windows `labels`,
/// queueing their events: the locks' names, and how many reservations.
async fn release_locks_and_reservations(
    conn: &mut PgConnection,
    team: Uuid,
    agent: Uuid,
    labels: Labels<'_>,
    wake: &mut Vec<BusEvent>,
) -> BusResult<(Vec<String>, u64)> {
    let locks = release(
        conn,
        RELEASE_LOCKS,
        EventKind::Lock,
        team,
        agent,
        labels,
        wake,
    )
    .await?;
    let reservations = release(
        conn,
        RELEASE_RESERVATIONS,
        EventKind::Reservation,
        team,
        agent,
        labels,
        wake,
    )
    .await?;
    Ok((locks, reservations.len() as u64))
}

/// Run the release `sql` (bound as [`of_windows`] binds it) and queue a
/// `kind` event for each row it let go; the names.
async fn release(
    conn: &mut PgConnection,
    sql: &'static str,
    kind: EventKind,
    team: Uuid,
    agent: Uuid,
    labels: Labels<'_>,
    wake: &mut Vec<BusEvent>,
) -> BusResult<Vec<String>> {
    let rows = of_windows(sql, team, agent, labels)
        .fetch_all(&mut *conn)
        .await?;
    Ok(queued(rows, team, agent, kind, wake))
}

/// A release of `agent`'s windows `labels`: `sql` with the team ($1), the
/// agent ($2) and the labels ($3, `NULL` for every window) bound, answering
/// the name and the window of each row it let go.
fn of_windows<'q>(
    sql: &'static str,
    team: Uuid,
    agent: Uuid,
    labels: Labels<'q>,
) -> QueryAs<'q, Postgres, (String, String), PgArguments> {
    sqlx::query_as(sql).bind(team).bind(agent).bind(labels)
}

/// Queue a `kind` event for each (name, window) row a release let go; the
/// names.
fn queued(
    rows: Vec<(String, String)>,
    team: Uuid,
    agent: Uuid,
    kind: EventKind,
    wake: &mut Vec<BusEvent>,
) -> Vec<String> {
    wake.extend(
        rows.iter()
            .map(|(name, session)| event(team, kind, name, agent, session)),
    );
    rows.into_iter().map(|(name, _)| name).collect()
}

/// The task event columns of a release by the bus, for the `released` CTE's
/// rows `r` (id, session, lapsed) joined with their agent `a`; $why and
/// $phrase are the ending's word and phrase. Returns the events, for
/// `released_and_hooked!`.
macro_rules! released_by_bus {
    ($why:literal, $phrase:literal) => {
        concat!(
            "INSERT INTO task_events (team_id, task_id, kind, agent_id, session, detail)
             SELECT r.team_id, r.id, 'released', r.agent_id, r.session,
                    jsonb_build_object(
                        'released_by', 'bus', 'why', ",
            $why,
            "::text,
                        'window', task_window_address(a.name, r.session),
                        'lease_had_lapsed', r.lapsed,
                        'note', format('released by the bus: window %s %s, so the task is open \
                                        again for anyone to claim',
                                       task_window_address(a.name, r.session), ",
            $phrase,
            "::text))
             FROM released r JOIN agents a ON a.team_id = r.team_id AND a.id = r.agent_id
             RETURNING team_id, task_id, kind, agent_id, session, detail"
        )
    };
}

/// The `released` rows `r` with their events `n` (the `noted` CTE), each
/// event's webhook queued when the team has a hook (`task_event_webhook`,
/// migration 0050; the task is open again, as `released` left it).
macro_rules! released_and_hooked {
    () => {
        " FROM released r JOIN noted n ON n.task_id = r.id
          CROSS JOIN LATERAL task_event_webhook(n.team_id, n.task_id, r.key, r.title, 'open',
                                                n.kind, n.agent_id, n.session, n.detail) AS hook"
    };
}

/// The `released` CTE: the tasks of `held` (id, agent_id, session, lapsed)
/// open again, answering the rows `released_by_bus!` reads.
macro_rules! reopen_held {
    () => {
        "released AS (
             UPDATE tasks t
                SET status = 'open', holder_agent_id = NULL, holder_session = NULL,
                    lease_expires_at = NULL, claimed_at = NULL, updated_at = now()
               FROM held
              WHERE t.id = held.id
             RETURNING t.team_id, t.id, t.key, t.title, held.agent_id, held.session, held.lapsed),"
    };
}

/// Release every task `agent`'s windows `labels` hold, each with its event.
async fn release_tasks(
    conn: &mut PgConnection,
    team: Uuid,
    agent: Uuid,
    labels: Labels<'_>,
    ending: Ending,
    wake: &mut Vec<BusEvent>,
) -> BusResult<Vec<String>> {
    let rows = of_windows(
        concat!(
            "WITH held AS (
                 SELECT id, holder_agent_id AS agent_id, holder_session AS session,
                        lease_expires_at <= now() AS lapsed
                 FROM tasks
                 WHERE team_id = $1 AND holder_agent_id = $2
                   AND ($3::text[] IS NULL OR holder_session = ANY($3)) AND status = 'claimed'
                 FOR NO KEY UPDATE),
             ",
            reopen_held!(),
            "
             noted AS (",
            released_by_bus!("$4", "$5"),
            ")
             SELECT r.key, r.session",
            released_and_hooked!()
        ),
        team,
        agent,
        labels,
    )
    .bind(ending.word())
    .bind(ending.phrase())
    .fetch_all(&mut *conn)
    .await?;
    Ok(queued(rows, team, agent, EventKind::Task, wake))
}

/// The window `me` leaves (`heartbeat {offline: true}`): inside the
/// heartbeat's transaction, delete its locks and reservations and queue
/// their events. Its claimed tasks wait for the grace
/// ([`release_tasks_of_departed`]).
pub(crate) async fn release_on_leave(
    conn: &mut PgConnection,
    me: &Identity,
) -> BusResult<Released> {
    let labels = [me.window.clone()];
    let mut wake = Vec::new();
    let (locks, reservations) =
        release_locks_and_reservations(conn, me.team_id, me.agent_id, Some(&labels), &mut wake)
            .await?;
    events::notify_in(conn, &wake).await?;
    Ok(Released {
        tasks: Vec::new(),
        locks,
        reservations,
    })
}

/// Windows `labels` of `agent` (every window with `None`) ended for good
/// (revoked, their token revoked, their agent disabled): inside the caller's
/// transaction, which locked the agent's credentials or the window's
/// session row first, release their tasks, locks and reservations and queue
/// the events.
pub(crate) async fn release_ended(
    conn: &mut PgConnection,
    team: Uuid,
    agent: Uuid,
    labels: Labels<'_>,
    ending: Ending,
) -> BusResult<Released> {
    let mut wake = Vec::new();
    let tasks = release_tasks(conn, team, agent, labels, ending, &mut wake).await?;
    let (locks, reservations) =
        release_locks_and_reservations(conn, team, agent, labels, &mut wake).await?;
    events::notify_in(conn, &wake).await?;
    Ok(Released {
        tasks,
        locks,
        reservations,
    })
}

/// One batch: release up to `batch` claimed tasks of windows that left
/// (`heartbeat {offline: true}`) at least `grace` ago and have not come back
/// since. Returns the keys released.
///
/// "Left and not back" is read off the window's presence row: leaving
/// brings its expiry down to the moment of the beat, which is also its
/// `last_seen_at` (one transaction, one `now()`); any later heartbeat moves
/// `last_seen_at` and the expiry past it (a ttl is at least 30 s), and an
/// expiry that merely ran out lies a whole ttl after `last_seen_at`. A
/// write on the task by the window after it left (a renewal) also counts as
/// coming back. Rows being changed now are skipped, never waited on.
pub async fn release_tasks_of_departed(
    pool: &PgPool,
    grace: Duration,
    batch: i64,
) -> BusResult<Vec<String>> {
    let mut tx = pool.begin().await?;
    let rows: Vec<(Uuid, String, Uuid, String)> = sqlx::query_as(concat!(
        "WITH held AS (
             SELECT t.id, t.holder_agent_id AS agent_id, p.session,
                    t.lease_expires_at <= now() AS lapsed
             FROM tasks t
             JOIN presence p ON p.team_id = t.team_id AND p.agent_id = t.holder_agent_id
                            AND p.session = t.holder_session
             WHERE t.status = 'claimed'
               AND p.expires_at <= p.last_seen_at
               AND p.expires_at <= now() - make_interval(secs => $1)
               AND NOT EXISTS (SELECT 1 FROM task_events e
                               WHERE e.team_id = t.team_id AND e.task_id = t.id
                                 AND e.agent_id = t.holder_agent_id
                                 AND e.session = t.holder_session AND e.at > p.expires_at)
             ORDER BY p.expires_at LIMIT $2
             FOR NO KEY UPDATE OF t SKIP LOCKED),
         ",
        reopen_held!(),
        "
         noted AS (",
        released_by_bus!("$3", "$4"),
        ")
         SELECT r.team_id, r.key, r.agent_id, r.session",
        released_and_hooked!()
    ))
    .bind(grace.as_secs_f64())
    .bind(batch)
    .bind(Ending::LeftFor(grace.as_secs()).word())
    .bind(Ending::LeftFor(grace.as_secs()).phrase())
    .fetch_all(&mut *tx)
    .await?;
    let wake: Vec<BusEvent> = rows
        .iter()
        .map(|(team, key, agent, session)| event(*team, EventKind::Task, key, *agent, session))
        .collect();
    events::notify_in(&mut tx, &wake).await?;
    tx.commit().await?;
    Ok(rows.into_iter().map(|(_, key, _, _)| key).collect())
}

/// One batch: release what up to `batch` windows hold whose session was
/// revoked (`revoke_session`) at least `settle` ago and not registered again
/// since. Each window in a transaction of its own that locks its session
/// row first and reads it again, so a registration of the label (which
/// takes that row) either committed before, and the window keeps what it
/// holds, or waits until the release committed. Candidates are found from
/// the holdings (claimed tasks, the live locks, reservations), not from the
/// history of sessions. Returns how many windows were looked at (`batch`
/// means there may be more) and what was released.
pub async fn release_revoked_windows(
    pool: &PgPool,
    settle: Duration,
    batch: i64,
) -> BusResult<(usize, Released)> {
    let windows: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
        "WITH held AS (
             SELECT team_id, holder_agent_id AS agent_id, holder_session AS label FROM tasks
             WHERE holder_agent_id IS NOT NULL
             UNION
             SELECT team_id, holder_agent_id, holder_session FROM locks
             WHERE expires_at > now()
             UNION
             SELECT team_id, holder_agent_id, holder_session FROM path_reservations)
         SELECT h.team_id, h.agent_id, h.label FROM held h
         JOIN agent_sessions s ON s.team_id = h.team_id AND s.agent_id = h.agent_id
                              AND s.label = h.label
         WHERE s.revoked_at <= now() - make_interval(secs => $1)
         LIMIT $2",
    )
    .bind(settle.as_secs_f64())
    .bind(batch)
    .fetch_all(pool)
    .await?;
    let looked_at = windows.len();
    let mut released = Released::default();
    for (team, agent, label) in windows {
        let mut tx = pool.begin().await?;
        let still_revoked: Option<bool> = sqlx::query_scalar(
            "SELECT revoked_at <= now() - make_interval(secs => $4) FROM agent_sessions
             WHERE team_id = $1 AND agent_id = $2 AND label = $3
             FOR UPDATE",
        )
        .bind(team)
        .bind(agent)
        .bind(&label)
        .bind(settle.as_secs_f64())
        .fetch_optional(&mut *tx)
        .await?;
        if still_revoked != Some(true) {
            continue;
        }
        let labels = [label];
        let one =
            release_ended(&mut tx, team, agent, Some(&labels), Ending::SessionRevoked).await?;
        tx.commit().await?;
        released.tasks.extend(one.tasks);
        released.locks.extend(one.locks);
        released.reservations += one.reservations;
    }
    Ok((looked_at, released))
}

/// One batch: delete up to `batch` reservations whose window's presence
/// expired (it stopped beating, or left) or whose own time ran out. A
/// window that never beat keeps its reservations until they expire.
pub async fn release_reservations_of_gone(pool: &PgPool, batch: i64) -> BusResult<u64> {
    let mut tx = pool.begin().await?;
    let rows: Vec<(Uuid, String, Uuid, String, bool)> = sqlx::query_as(
        "DELETE FROM path_reservations r
         WHERE r.id IN (
             SELECT r.id FROM path_reservations r
             LEFT JOIN presence p ON p.team_id = r.team_id AND p.agent_id = r.holder_agent_id
                                 AND p.session = r.holder_session
             WHERE r.expires_at <= now() OR p.expires_at <= now()
             LIMIT $1
             FOR UPDATE OF r SKIP LOCKED)
         RETURNING r.team_id, r.pattern, r.holder_agent_id, r.holder_session,
                   r.expires_at > now() AS live",
    )
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    // Only a live reservation's end is news to anyone waiting.
    let wake: Vec<BusEvent> = rows
        .iter()
        .filter(|row| row.4)
        .map(|(team, pattern, agent, session, _)| {
            reservation_event(*team, pattern, *agent, session)
        })
        .collect();
    events::notify_in(&mut tx, &wake).await?;
    tx.commit().await?;
    Ok(rows.len() as u64)
}

/// An event of `kind` about `id`, made by window `session` of `agent` (so
/// it does not wake that window itself).
fn event(team: Uuid, kind: EventKind, id: &str, agent: Uuid, session: &str) -> BusEvent {
    let mut event = BusEvent::new(team, kind, id);
    event.actor = Some(agent);
    event.actor_session = Some(session.to_string());
    event
}

/// The event a reservation's end wakes waits with.
fn reservation_event(team: Uuid, pattern: &str, agent: Uuid, session: &str) -> BusEvent {
    event(team, EventKind::Reservation, pattern, agent, session)
}
