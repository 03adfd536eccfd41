//! Every operation a client issued and how it ended: an append-only record
//! the clients share (one short lock per completed operation), read whole by
//! the checker after the run and dumped as JSON lines for post-mortems.
//!
//! An operation keeps what the checks need and nothing more: who (client,
//! window, replica), what (the tool and the arguments that matter: ids,
//! request_id, the body's SHA-256, the cursor, the lease asked for), when
//! (invocation and completion on the run's [`Clock`]) and how it ended
//! ([`Outcome`]): the answer's fields that matter, the tool's refusal, or a
//! failure whose effect is unknown (transport error, HTTP status).

use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::Clock;

/// The operations a client issues; each is one tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// `send_conversation_message`.
    Send,
    /// `read_conversation`.
    Read,
    /// `ack_message`.
    Ack,
    /// `fetch_conversation_inbox`.
    Fetch,
    /// `confirm_inbox_delivery`.
    Confirm,
    /// `post_message` into a channel.
    Post,
    /// `read_messages {scope: channel, only_new: true}`.
    ReadChannel,
    /// `create_task`.
    CreateTask,
    /// `claim_next_task`.
    ClaimNext,
    /// `claim_task` by key.
    Claim,
    /// `renew_task_lease`.
    Renew,
    /// `complete_task`.
    Complete,
    /// `acquire_lock`.
    AcquireLock,
    /// `release_lock`.
    ReleaseLock,
    /// `reserve_paths`.
    ReservePaths,
    /// `release_paths`.
    ReleasePaths,
}

impl OpKind {
    /// Every kind, to find one by its tool.
    const ALL: [OpKind; 16] = [
        OpKind::Send,
        OpKind::Read,
        OpKind::Ack,
        OpKind::Fetch,
        OpKind::Confirm,
        OpKind::Post,
        OpKind::ReadChannel,
        OpKind::CreateTask,
        OpKind::ClaimNext,
        OpKind::Renew,
        OpKind::Complete,
        OpKind::Claim,
        OpKind::AcquireLock,
        OpKind::ReleaseLock,
        OpKind::ReservePaths,
        OpKind::ReleasePaths,
    ];

    /// The kind of a call of `tool`.
    pub fn of_tool(tool: &str) -> Option<OpKind> {
        OpKind::ALL.into_iter().find(|k| k.tool() == tool)
    }

    pub fn tool(self) -> &'static str {
        match self {
            OpKind::Send => "send_conversation_message",
            OpKind::Read => "read_conversation",
            OpKind::Ack => "ack_message",
            OpKind::Fetch => "fetch_conversation_inbox",
            OpKind::Confirm => "confirm_inbox_delivery",
            OpKind::Post => "post_message",
            OpKind::ReadChannel => "read_messages",
            OpKind::CreateTask => "create_task",
            OpKind::ClaimNext => "claim_next_task",
            OpKind::Renew => "renew_task_lease",
            OpKind::Complete => "complete_task",
            OpKind::Claim => "claim_task",
            OpKind::AcquireLock => "acquire_lock",
            OpKind::ReleaseLock => "release_lock",
            OpKind::ReservePaths => "reserve_paths",
            OpKind::ReleasePaths => "release_paths",
        }
    }

    /// Writes a client retries with their request_id after an unknown
    /// outcome (conversation sends have their own loop, and are listed
    /// too: every attempt of these carries `request_id` in its args).
    pub fn carries_request_id(self) -> bool {
        matches!(
            self,
            OpKind::Send
                | OpKind::Post
                | OpKind::ClaimNext
                | OpKind::Claim
                | OpKind::Complete
                | OpKind::AcquireLock
                | OpKind::ReleaseLock
                | OpKind::ReservePaths
                | OpKind::ReleasePaths
        )
    }
}

/// How an operation ended.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    /// The tool answered; the fields of its answer that matter (per kind,
    /// see `workload::client`).
    Ok { result: Value },
    /// The tool said no (`isError`): nothing was done. `kind` is the
    /// refusal's `error` (serialized so, beside the operation's own kind).
    Refused {
        #[serde(rename = "error")]
        kind: String,
        message: String,
    },
    /// No answer from the tool: a transport error, an HTTP error (with its
    /// status), a JSON-RPC error. Whether it took effect is unknown.
    Failed {
        status: Option<u16>,
        message: String,
    },
}

impl Outcome {
    pub fn ok(&self) -> Option<&Value> {
        match self {
            Outcome::Ok { result } => Some(result),
            _ => None,
        }
    }

    /// Answered (done or refused): the server said something. Not the same
    /// as a known effect: see [`Outcome::unknown`].
    pub fn answered(&self) -> bool {
        !matches!(self, Outcome::Failed { .. })
    }

    /// Whether it took effect is unknown: no answer, or a refusal saying the
    /// database connection broke after the statement was sent (its commit
    /// may have happened: a partition between a replica and PostgreSQL
    /// drops the answer of a committed statement).
    pub fn unknown(&self) -> bool {
        self.ok().is_none() && !self.changed_nothing()
    }

    /// A refusal that promises nothing was done. A database connection that
    /// broke mid-request is refused as `unavailable` saying the change "may or
    /// may not have been made" (the commit may have happened before the answer
    /// was lost): that one is an unknown outcome, like a transport error.
    pub fn changed_nothing(&self) -> bool {
        match self {
            Outcome::Refused { message, .. } => !message.contains("may or may not"),
            _ => false,
        }
    }

    /// Worth another try: no answer, or a refusal saying the server could
    /// not complete it now (`unavailable`: "nothing was changed, try again").
    pub fn retryable(&self) -> bool {
        match self {
            Outcome::Ok { .. } => false,
            Outcome::Refused { kind, .. } => kind == "unavailable",
            Outcome::Failed { .. } => true,
        }
    }
}

/// One operation as it happened.
#[derive(Clone, Debug, Serialize)]
pub struct Op {
    /// Order of completion in this run.
    pub id: usize,
    /// The client (window index) that issued it.
    pub client: usize,
    /// The replica it was sent to.
    pub replica: usize,
    /// The window's address, `agent/label`.
    pub window: String,
    pub kind: OpKind,
    /// `load` or `settle`.
    pub phase: &'static str,
    pub args: Value,
    pub invoked_ms: u64,
    pub completed_ms: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl Op {
    /// How a violation names it.
    pub fn describe(&self) -> String {
        let outcome = match &self.outcome {
            Outcome::Ok { .. } => "ok".to_string(),
            Outcome::Refused { kind, .. } => format!("refused ({kind})"),
            Outcome::Failed {
                status: Some(s), ..
            } => format!("failed (HTTP {s})"),
            Outcome::Failed { .. } => "failed".to_string(),
        };
        let mut args = self.args.clone();
        if let Some(map) = args.as_object_mut() {
            map.remove("body");
        }
        format!(
            "op #{} {} by client {} ({}) on replica {} at {}..{} ms, {}, args {}",
            self.id,
            self.kind.tool(),
            self.client,
            self.window,
            self.replica,
            self.invoked_ms,
            self.completed_ms,
            outcome,
            args
        )
    }
}

/// The run's history, shared by every client (cheap to clone).
#[derive(Clone)]
pub struct History {
    clock: Clock,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl History {
    pub fn new(clock: Clock) -> History {
        History {
            clock,
            ops: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Start an operation now: the caller fills in who and what, then
    /// hands it to [`History::record`] with its outcome.
    pub fn invoke(&self, kind: OpKind, args: Value) -> Op {
        Op {
            id: 0,
            client: 0,
            replica: 0,
            window: String::new(),
            kind,
            phase: "load",
            args,
            invoked_ms: self.clock.now_ms(),
            completed_ms: 0,
            outcome: Outcome::Failed {
                status: None,
                message: "in flight".into(),
            },
        }
    }

    /// Append a completed operation (completion time: now).
    pub fn record(&self, mut op: Op, outcome: Outcome) -> Op {
        op.completed_ms = self.clock.now_ms();
        op.outcome = outcome;
        let mut ops = self.ops.lock().expect("the history lock");
        op.id = ops.len();
        ops.push(op.clone());
        op
    }

    /// Every operation so far, in completion order.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().expect("the history lock").clone()
    }

    /// Write every operation as one JSON line to `path`.
    pub fn dump(&self, path: &Path) -> anyhow::Result<()> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        for op in self.ops() {
            serde_json::to_writer(&mut out, &op)?;
            out.write_all(b"\n")?;
        }
        out.flush()
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }
}
