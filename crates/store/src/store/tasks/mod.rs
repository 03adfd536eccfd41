//! Tasks: a team's shared work queue, with claims leased to one window.
//!
//! A task is created open, may wait on other tasks of the team (its
//! dependencies), is claimed by one window, the (agent, session label) pair,
//! for a lease, and is completed or released by that window only. Another
//! window of the same agent is a different holder: it cannot renew, release
//! or complete the claim. Its creator or the holding window may cancel it
//! instead (`cancel`), and its creator may re-point its dependencies
//! (`dependencies`): a cancelled task is never done, so a task waiting on one
//! says so in `blocked_by_cancelled` rather than becoming claimable.
//!
//! Leases are measured on the database's clock (`now()`), never the caller's.
//! Nothing sweeps lapsed leases: a claimed task whose lease has run out *reads*
//! as `open` everywhere (with its `lapsed_holder`) and the next claim simply
//! overwrites the holder. So a crashed agent's work comes back by itself, and
//! the lapsed holder can neither renew nor complete what it no longer holds.
//!
//! `claim_next_task` takes the ready task of the highest priority, the oldest
//! first within a priority (migration 0049), with `FOR NO KEY UPDATE SKIP
//! LOCKED`: concurrent claimers each lock a different row, and a row another
//! claimer just took fails the re-check and is passed over, so no task is ever
//! handed to two windows.
//!
//! Every change is one short transaction: the session guard, the row lock,
//! the change, its `task_events` row. The wake-up event is emitted after commit.
//! The hot ones (both claims, renew, release, complete) are one round trip
//! each: one call of a SQL function (migration 0032) that runs the write
//! fence, the quota, the locks, the decision and the writes, and answers a
//! refusal as a code the tool words. A task's columns are defined once, in
//! the view `task_rows`, which every reader and those functions read.
//! Not here: attachments.
//!
//! Layout: this file holds the limits and the types the tools answer with;
//! `checks` the argument checks (all before a transaction opens); `row` the
//! task row as read and locked, its event row and wake-up; `change` the
//! one-round-trip calls (`task_change`, `task_claim_next`); `transition` the
//! several-statement path of a change to an existing task (guard, lock,
//! check, update, event, commit, wake-up) that `cancel` takes; `lifecycle`
//! creating, renewing, releasing and completing; `claim` claiming one task or
//! the next ready one; `cancel` and `dependencies` cancelling and
//! re-pointing; `priority` the priority words, re-prioritising and the
//! rights (creator or overseer) a caller acts with; `queries` listing and
//! reading.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

mod cancel;
mod change;
mod checks;
mod claim;
mod dependencies;
mod lifecycle;
mod priority;
mod queries;
mod row;
mod transition;
pub use cancel::{CANCEL_REASON_MAX_BYTES, CancelledTask, cancel, cancel_with, cancel_with_in};
pub use checks::check_metadata;
pub use claim::{claim, claim_next, claim_next_in};
pub use dependencies::set_dependencies;
pub use lifecycle::{complete, complete_in, create, create_in, release, renew};
pub use priority::{Rights, TaskPriority, check_priority, set_priority, set_priority_in};
pub use queries::{get, list};

pub const KEY_MAX_BYTES: usize = 128;
pub const TITLE_MAX_BYTES: usize = 512;
pub const DESCRIPTION_MAX_BYTES: usize = 64 * 1024;
pub const RESULT_MAX_BYTES: usize = 64 * 1024;
pub const DEPENDENCIES_MAX: usize = 32;
pub const LEASE_MIN_SECS: i64 = 30;
pub const LEASE_MAX_SECS: i64 = 86_400;
pub const LEASE_DEFAULT_SECS: i64 = 900;
pub const PAGE_DEFAULT: i64 = 50;
pub const PAGE_MAX: i64 = 200;
/// `get_task` shows at most this many of the latest events (and the total).
pub const EVENTS_SHOWN_MAX: i64 = 200;

acs_wire::text_enum! {
    /// A task's status, stored as text in `tasks.status`. A claim whose lease
    /// ran out is stored `claimed` and reads `open` (`lapsed`).
    pub enum TaskStatus {
        /// Nobody holds it (or its holder's lease lapsed).
        Open = "open",
        /// A window holds it under a lease.
        Claimed = "claimed",
        /// Completed with a result: final.
        Done = "done",
        /// Ended without being done: final.
        Cancelled = "cancelled",
    }
}
crate::text_column!(TaskStatus);

impl TaskStatus {
    /// Done or cancelled: nothing changes the task any more.
    pub fn is_finished(self) -> bool {
        match self {
            TaskStatus::Done | TaskStatus::Cancelled => true,
            TaskStatus::Open | TaskStatus::Claimed => false,
        }
    }
}

/// A task as `create_task`, `claim_task`, `get_task` and friends return it:
/// its [`TaskSummary`] and what a listing leaves out.
#[derive(Clone, Debug, Serialize)]
pub struct Task {
    #[serde(flatten)]
    pub summary: TaskSummary,
    pub description: Option<String>,
    pub metadata: Value,
    pub depends_on: Vec<String>,
    pub result: Option<String>,
    /// Why the task was cancelled (by `cancelled_by`, at `cancelled_at`).
    pub cancel_reason: Option<String>,
}

/// A task in a listing: no description, metadata, dependencies or result.
#[derive(Clone, Debug, Serialize)]
pub struct TaskSummary {
    pub key: String,
    pub title: String,
    /// A lapsed lease reads `open`.
    pub status: TaskStatus,
    /// `low`, `normal`, `high` or `urgent`: claim_next_task takes the highest first.
    pub priority: TaskPriority,
    /// The window holding a live claim.
    pub holder: Option<Holder>,
    /// The window whose lease ran out; the task is open to anyone.
    pub lapsed_holder: Option<Holder>,
    /// The dependencies not yet done; the task cannot be claimed until empty.
    pub blocked_by: Vec<String>,
    /// The entries of `blocked_by` that were cancelled: they will never be
    /// done, so this task waits until its creator re-points or cancels it.
    pub blocked_by_cancelled: Vec<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub completed_by: Option<String>,
    pub completed_at: Option<DateTime<Utc>>,
    /// The window that cancelled the task, and when.
    pub cancelled_by: Option<String>,
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// The window holding (or, lapsed, last holding) a claim.
#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    pub agent: String,
    /// The window label; `""` is the agent's shared session.
    pub session: String,
    /// `agent` or `agent/session`.
    pub address: String,
    pub claimed_at: Option<DateTime<Utc>>,
    pub lease_expires_at: DateTime<Utc>,
    /// Whole seconds until the lease ends; 0 once lapsed.
    pub lease_seconds_left: i64,
}

/// What `create_task` takes.
#[derive(Clone, Debug, Default)]
pub struct NewTask {
    pub key: String,
    pub title: String,
    pub description: Option<String>,
    /// A JSON object, or a string holding one.
    pub metadata: Option<Value>,
    pub depends_on: Vec<String>,
    /// `low`, `normal`, `high` or `urgent`; `None` is `normal`.
    pub priority: Option<String>,
}

/// `claim_next_task`'s answer: a task, or why there is none.
#[derive(Clone, Debug, Serialize)]
pub struct NextTask {
    pub claimed: bool,
    pub task: Option<Task>,
    pub message: String,
}

/// What `list_tasks` filters on: one status, or `any`. A lapsed lease
/// counts as `open`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusFilter {
    Any,
    Is(TaskStatus),
}

impl StatusFilter {
    pub fn as_str(self) -> &'static str {
        match self {
            StatusFilter::Any => "any",
            StatusFilter::Is(status) => status.as_str(),
        }
    }
}

impl Serialize for StatusFilter {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TaskList {
    pub status: StatusFilter,
    pub mine_only: bool,
    pub count: usize,
    /// More tasks match than `limit` allowed.
    pub more: bool,
    pub tasks: Vec<TaskSummary>,
}

/// `get_task`: the task and its history, oldest event first.
#[derive(Clone, Debug, Serialize)]
pub struct TaskDetail {
    #[serde(flatten)]
    pub task: Task,
    pub events: Vec<TaskEvent>,
    /// All events of the task; `events` holds the latest [`EVENTS_SHOWN_MAX`].
    pub events_total: i64,
}

acs_wire::text_enum! {
    /// What a `task_events` row records, stored as text in `task_events.kind`.
    /// The one-round-trip writes (migration 0032) write `claimed`, `renewed`,
    /// `released` and `completed` themselves.
    pub enum TaskEventKind {
        Created = "created",
        Claimed = "claimed",
        Renewed = "renewed",
        Released = "released",
        Completed = "completed",
        Cancelled = "cancelled",
        DependenciesChanged = "dependencies_changed",
        PriorityChanged = "priority_changed",
    }
}
crate::text_column!(TaskEventKind);

#[derive(Clone, Debug, Serialize)]
pub struct TaskEvent {
    pub at: DateTime<Utc>,
    pub kind: TaskEventKind,
    /// The address of the window that made the change.
    pub by: String,
    pub detail: Value,
}
