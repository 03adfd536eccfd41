//! What the parts of a chaos run share: the run's clock, the servers a
//! workload talks to ([`Target`]), and the faults that were injected
//! ([`AppliedFault`]), so the checker can read the history beside them.
//!
//! Every time in a run is milliseconds since the run started ([`Clock`]), on
//! one machine: a client's invocation and completion times, a fault's start
//! and end, all comparable.

use std::path::PathBuf;
use std::time::Instant;

/// Milliseconds since the run started.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The wall-clock time (UTC, milliseconds since the epoch) the run
    /// started, to compare with times the server returns.
    pub fn epoch_ms_at(&self, run_ms: u64) -> i64 {
        let now_epoch = chrono::Utc::now().timestamp_millis();
        now_epoch - self.now_ms() as i64 + run_ms as i64
    }
}

/// The team the workload creates its agents and conversations in; the
/// faults find the team's stream (and its leader) by it.
pub const TEAM: &str = "chaos";

/// The servers a workload and the checker talk to.
#[derive(Clone, Debug)]
pub struct Target {
    /// Each replica's MCP endpoint (`http://127.0.0.1:PORT/mcp`).
    pub replicas: Vec<String>,
    /// The bus's database, directly (never through a fault relay), as a
    /// superuser: the checker reads it, setup writes operator state with it.
    pub database_url: String,
    /// Each NATS node, directly (never through a fault relay).
    pub nats_urls: Vec<String>,
    /// The `ai-crew-sync` binary (operator commands during setup).
    pub binary: PathBuf,
    /// A directory that lives as long as the run (logs, scratch files).
    pub scratch: PathBuf,
}

/// The kinds of fault a schedule draws from; each must be injected at least
/// once in every profile (the summary counts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// `kill -9` of a replica, restarted after a while.
    KillReplica,
    /// `SIGSTOP` of the replica running the outbox drain for longer than its
    /// lease, then `SIGCONT`.
    PauseDrainReplica,
    /// PostgreSQL immediate shutdown, then restart.
    RestartPostgres,
    /// `kill -9` of one NATS node that is not the stream leader, restarted.
    KillNatsNode,
    /// `kill -9` of the stream leader's node, restarted.
    KillStreamLeader,
    /// Every NATS node restarted: stopped at once as an operator restarting
    /// the cluster does (`SIGTERM`), then started again. Not `kill -9` of
    /// every node: a JetStream cluster whose every replica crashes at once
    /// loses acknowledged entries it had not flushed, and its replicas can
    /// diverge (nats-server 2.9 here has no `sync_interval: always`; Jepsen
    /// found the same in 2.12.1 with the default). A long run (seed 20261204)
    /// saw it: one body entry lost, and the ~300 entries published after it
    /// found one sequence below where the broker had acknowledged them.
    /// That is the broker's durability, which the bus can report but not
    /// restore; the faults here test the bus.
    RestartAllNats,
    /// A replica cut off from PostgreSQL (its relay black-holes), then healed.
    PartitionReplicaPostgres,
    /// A replica cut off from NATS, then healed.
    PartitionReplicaNats,
    /// Latency between a replica and PostgreSQL or NATS, then removed.
    DelayReplicaLink,
}

/// One fault as it happened.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AppliedFault {
    pub kind: FaultKind,
    /// What it hit: "replica 2", "nats node 1", "postgres", "replica 0 ↔ nats".
    pub target: String,
    pub started_ms: u64,
    /// When it was healed (None: never, which the run reports).
    pub ended_ms: Option<u64>,
}

/// Every claim and renewal asks for the server's shortest task lease
/// (`claim_task`'s `lease_seconds` 30..), so faults can outlast it.
pub const TASK_LEASE_SECS: u64 = ai_crew_sync::store::tasks::LEASE_MIN_SECS as u64;
