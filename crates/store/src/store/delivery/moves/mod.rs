//! Moving one conversation's bodies between backends, under supervision
//! (`conversations migrate`, `conversations unpause` and `conversations
//! cleanup`). Not schema migrations: those are `db::migrator` and the
//! `migrate` command; a move is named a move here, and its rows are the
//! `conversation_migrations` tables.
//!
//! The order of the steps is the safety argument:
//!
//! 1. **Plan.** Check the target answers and is provisioned, count messages
//!    and bytes, say what is already on the target, what blocks a move (a
//!    message that failed publication, a pause no move owns) and which runs
//!    would be resumed. Nothing is written; this is all the command does
//!    without `--apply`.
//! 2. **Copy.** Every body not tombstoned is read from where it actually is,
//!    checksummed, written to the target under a key derived from the message
//!    (so a resumed run presents the same key and the broker recognises it),
//!    read back from the target and compared, and each step is recorded. The
//!    thread keeps working meanwhile: readers still use each message's
//!    recorded backend, which has not changed.
//! 3. **Pause and copy the tail.** Writes to this one conversation are
//!    refused (saying why and for how long) while the messages sent during
//!    the copy are moved. Nothing else on the bus is affected.
//! 4. **Cut over** in one transaction, the conversation row first: each
//!    verified message's backend and locator, the thread's routing and
//!    publication mode, the pause lifted, the run `cut_over`.
//!
//! A failure anywhere cuts nothing over and aborts in one transaction (the
//! run failed, unverified copies written back cleared, the pause lifted only
//! if no open run owns it). An abort that cannot finish leaves the run open
//! and paused; the same command resumes it. The pause is only ever taken for
//! a run still open, so a thread is never left paused with no move owning
//! it; one left so by a crash or an older version is lifted by `unpause`.
//!
//! What a move never does: invent a receipt, change an author, renumber a
//! message, or delete a source body. Source bodies stay until `cleanup`,
//! after a rollback window an operator states, because a rollback with
//! nothing to roll back to is not a rollback.
//!
//! Where each step lives: [`plan()`] in `plan.rs`; opening or resuming a
//! run, the pause, the cutover and [`abort`] in `mover.rs`; reading,
//! copying and verifying one message in `copy.rs`; lifting a pause no move
//! owns ([`unpause`]) and asking whether one is held ([`is_paused`]) in
//! `pause.rs`; dropping source bodies after the rollback window
//! ([`cleanup()`]) in `cleanup.rs`; moving every conversation of a plan in
//! turn ([`run_all`], what `--apply` does) in `driver.rs`. This file holds
//! the types they share, the conversation lock every step takes first, and
//! the two questions asked under it: which run of a conversation is open,
//! and whether this one still is.

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use crate::backend::BackendKind;
use crate::error::{BusError, BusResult};
use crate::store::delivery::lost_bodies::KnownLost;

/// How a plan and a move's summary count a conversation's bytes, one rule
/// for both: the size recorded at send (`body_bytes`, the body's UTF-8
/// octets) of every message not tombstoned. A body already released from
/// PostgreSQL counts the same as one still held, and a body already on the
/// target the same as one copied.
/// Over rows `m` of `conversation_messages`.
macro_rules! bytes_of_messages {
    () => {
        "COALESCE(sum(m.body_bytes) FILTER (WHERE m.tombstoned_at IS NULL), 0)::bigint"
    };
}

mod cleanup;
mod copy;
mod driver;
mod mover;
mod pause;
mod plan;

pub use cleanup::{Cleanup, cleanup};
pub use driver::{Event, Moved, run_all};
pub use mover::{abort, run};
pub use pause::{Unpaused, is_paused, open_counts, unpause};
pub use plan::plan;

/// Where a move is going, stored as `conversation_migrations.direction`
/// (`to_jetstream`, `to_postgres`). Its JSON spelling (`to_jet_stream`) is
/// the answer's, kept as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text")]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    #[sqlx(rename = "to_jetstream")]
    ToJetStream,
    #[sqlx(rename = "to_postgres")]
    ToPostgres,
}

/// `--to jetstream` or `--to postgres` (M1): a backend's name, parsed as
/// [`BackendKind`] parses it, refused in the words of the flag.
impl std::str::FromStr for Direction {
    type Err = BusError;

    fn from_str(raw: &str) -> BusResult<Direction> {
        raw.parse().map(Direction::to).map_err(|_| {
            BusError::invalid(format!(
                "unknown backend {}: --to takes `jetstream` or `postgres`.",
                crate::store::text::quote(raw.trim())
            ))
        })
    }
}

impl Direction {
    /// The move to `target`.
    pub fn to(target: BackendKind) -> Direction {
        match target {
            BackendKind::Jetstream => Direction::ToJetStream,
            BackendKind::Postgres => Direction::ToPostgres,
        }
    }

    pub fn target(self) -> BackendKind {
        match self {
            Direction::ToJetStream => BackendKind::Jetstream,
            Direction::ToPostgres => BackendKind::Postgres,
        }
    }

    /// The value of `conversation_migrations.direction`.
    pub fn column(self) -> &'static str {
        match self {
            Direction::ToJetStream => "to_jetstream",
            Direction::ToPostgres => "to_postgres",
        }
    }

    /// `to jetstream` or `to postgres`, as a sentence names it.
    pub fn in_words(self) -> &'static str {
        match self {
            Direction::ToJetStream => "to jetstream",
            Direction::ToPostgres => "to postgres",
        }
    }
}

/// What moving one conversation would take, and whether it can be moved.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Plan {
    pub conversation_id: Uuid,
    pub title: String,
    pub current_backend: BackendKind,
    /// Every message that is not tombstoned, whatever its publication state:
    /// each one moves or the move is refused (a tombstone has no body left).
    pub messages: i64,
    /// Their bytes (a body already released from PostgreSQL counts with the
    /// size recorded at send).
    pub bytes: i64,
    /// Of those, stored on the target already.
    pub already_there: i64,
    /// Messages still awaiting publication: the move waits for them, under
    /// the pause, before it copies the tail, and is refused if any is left.
    pub in_flight: i64,
    /// Messages whose publication failed for good: they block the move.
    pub failed: i64,
    /// Why this conversation is not moved now.
    pub blocked: Option<Blocked>,
    /// A run of this direction is open: the command continues it.
    pub resuming: bool,
    /// Messages whose bodies cannot be read from where they are (the broker
    /// lost them: released from PostgreSQL, written to a stream since
    /// re-created; `store::delivery::lost_bodies`). `--apply` refuses naming them
    /// unless told to tombstone them ([`run`]'s `tombstone_lost`).
    pub lost: Vec<KnownLost>,
}

/// Why a plan moves nothing. Shown (and serialized) as its sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Every message is on the target already and no run is open: the
    /// conversation is where it was asked to be, so nothing is left undone.
    AlreadyThere(BackendKind),
    /// Something stops the move (a failed publication, a pause no move owns,
    /// a move the other way); the sentence says what and what to do. The
    /// conversation stays where it was: a caller that asked for the move
    /// did not get it.
    Refused(String),
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocked::AlreadyThere(backend) => write!(f, "already on {backend}"),
            Blocked::Refused(why) => f.write_str(why),
        }
    }
}

impl Serialize for Blocked {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// How a move is going, for a progress bar or a line of output.
#[derive(Clone, Debug, Serialize)]
pub struct Progress {
    pub conversation_id: Uuid,
    /// `copying`, `paused` (copying the tail), `cut_over`.
    pub phase: &'static str,
    pub messages_done: i64,
    pub messages_total: i64,
    pub bytes_done: i64,
    pub bytes_total: i64,
}

/// What a finished move did.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub migration_id: Uuid,
    pub conversation_id: Uuid,
    pub direction: Direction,
    /// Bodies written to the target and verified by this run.
    pub copied: i64,
    /// Messages verified in an earlier, interrupted pass of the same run.
    pub resumed: i64,
    /// Messages already on the target.
    pub skipped: i64,
    /// The conversation's bytes now on the target, counted as the plan
    /// counts them (`bytes_of_messages!`): a summary and its plan agree for
    /// the same bodies, whether this run copied them, an earlier pass did,
    /// or they were there already.
    pub bytes: i64,
    /// Of those, the bytes this run copied or found copied (progress).
    pub bytes_copied: i64,
    /// How long writes to the thread were refused.
    pub paused_ms: i64,
    pub state: MoveState,
}

/// A move run's state, stored as `conversation_migrations.state`. Open while
/// planned, copying or verified (one open run per conversation); cut over
/// and failed are final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum MoveState {
    Planned,
    Copying,
    Verified,
    CutOver,
    Failed,
}

/// One message's state in a move, stored as
/// `conversation_migration_items.state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum ItemState {
    Planned,
    /// Written to the target, not yet read back.
    Copied,
    /// Read back from the target and matching its digest.
    Verified,
    Failed,
}

/// How long, at most, a move waits under its pause for the messages still
/// in flight through the outbox.
pub const SETTLE_WAIT: Duration = Duration::from_secs(30);

async fn lock_conversation(
    conn: &mut sqlx::PgConnection,
    team_id: Uuid,
    conversation_id: Uuid,
) -> BusResult<()> {
    let found: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM conversations WHERE team_id = $1 AND id = $2 FOR UPDATE",
    )
    .bind(team_id)
    .bind(conversation_id)
    .fetch_optional(conn)
    .await?;
    found.map(|_| ()).ok_or_else(|| {
        BusError::not_found(format!("no conversation {conversation_id} in this team."))
    })
}

/// The open run of a conversation (there is at most one, M3): its id and
/// direction column. The caller holds the conversation's lock.
async fn open_run_of(
    conn: &mut sqlx::PgConnection,
    conversation_id: Uuid,
) -> BusResult<Option<(Uuid, Direction)>> {
    Ok(sqlx::query_as(
        "SELECT id, direction FROM conversation_migrations
          WHERE conversation_id = $1 AND state IN ('planned', 'copying', 'verified')",
    )
    .bind(conversation_id)
    .fetch_optional(conn)
    .await?)
}

/// Whether this run is still open (not failed or cut over by another
/// process meanwhile). The caller holds the conversation's lock.
async fn run_is_open(conn: &mut sqlx::PgConnection, migration_id: Uuid) -> BusResult<bool> {
    let open: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM conversation_migrations
          WHERE id = $1 AND state IN ('planned', 'copying', 'verified')",
    )
    .bind(migration_id)
    .fetch_optional(conn)
    .await?;
    Ok(open.is_some())
}

#[cfg(test)]
mod tests {
    use super::{Direction, MoveState};

    /// A move's answer spells its state as stored, and its direction as it
    /// always has (the stored `to_jetstream` is the column's, not the JSON's).
    #[test]
    fn answers_spell_as_before() {
        assert_eq!(
            serde_json::to_value(MoveState::CutOver).unwrap(),
            "cut_over"
        );
        assert_eq!(
            serde_json::to_value(Direction::ToJetStream).unwrap(),
            "to_jet_stream"
        );
        assert_eq!(Direction::ToPostgres.in_words(), "to postgres");
    }

    /// `--to` reads a backend's name as every other flag does (trimmed, any
    /// case), and refuses anything else in the flag's words.
    #[test]
    fn a_direction_is_a_backend_name() {
        assert_eq!(
            " JetStream ".parse::<Direction>().unwrap(),
            Direction::ToJetStream
        );
        assert_eq!(
            "postgres".parse::<Direction>().unwrap(),
            Direction::ToPostgres
        );
        assert_eq!(
            "s3".parse::<Direction>().unwrap_err().to_string(),
            "unknown backend \"s3\": --to takes `jetstream` or `postgres`."
        );
        assert_eq!(
            "s3".parse::<crate::backend::BackendKind>()
                .unwrap_err()
                .to_string(),
            "unknown backend \"s3\": use `jetstream` or `postgres`."
        );
    }
}
