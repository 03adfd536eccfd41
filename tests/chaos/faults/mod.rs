//! The fault schedule drawn from a seed ([`Schedule::draw`]) and its
//! injection ([`inject`]).
//!
//! A schedule is a list of faults, each with its start, its target and how
//! long it lasts, drawn from a `StdRng` seeded with the run's seed: the same
//! seed and profile give the same table, so `--seed N` reproduces a run's
//! faults (not the exact interleaving of the clients, which the scheduler
//! decides). Every [`FaultKind`] appears at least once per profile; the long
//! profile repeats the set in rounds.
//!
//! Faults run in two lanes, each one fault at a time, with gaps between:
//!
//! - the replica lane: kill -9 of a replica, SIGSTOP of the replica holding
//!   outbox slots, a replica cut off from PostgreSQL or from NATS, a slow
//!   link. So at most one replica is down at any moment;
//! - the infrastructure lane: PostgreSQL immediate shutdown and restart,
//!   kill -9 of a NATS node, of the stream leader, and all NATS nodes
//!   restarted. So PostgreSQL and NATS are never down together, and two
//!   NATS faults never add up to a lost quorum by accident.
//!
//! The lanes overlap freely except that no infrastructure fault runs while a
//! killed replica is down or starting again: `serve` needs PostgreSQL and a
//! broker to start, and a replica that cannot come back is not the fault
//! drawn.
//!
//! Durations: PostgreSQL's outage always outlasts the task lease every
//! client claims with (`model::TASK_LEASE_SECS`, the server's 30 s
//! minimum), so every lease held when it starts lapses during it and its
//! holder meets the refusal afterwards; the pause always outlasts the outbox
//! drain's slot lease (`store::delivery::outbox::LEASE_SECS`), so other replicas take
//! the paused one's slots over and its late settlements meet the generation
//! fence, while requests it had accepted wait past their task leases. Every
//! other fault lasts at least [`SHORT_FAULT_MS`] and up to the profile's
//! `fault_spread_ms` more: in the long profile most of them outlast the task
//! lease as well.

mod inject;

use std::fmt;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::Profile;
use crate::cluster::{NATS_NODES, REPLICAS};
use crate::model::FaultKind;

pub use inject::inject;

/// No fault in the first seconds (clients set up) nor the last (they wind down).
const WARMUP_MS: u64 = 10_000;
const TAIL_MS: u64 = 5_000;
/// The shortest gap between two faults of one lane.
const MIN_GAP_MS: u64 = 1_000;
/// Room a killed replica needs after its fault ends to start again.
const RESTART_MARGIN_MS: u64 = 15_000;
/// How long the outbox drain holds a slot before another worker may take it.
const DRAIN_LEASE_MS: u64 = ai_crew_sync::store::delivery::outbox::LEASE_SECS as u64 * 1000;
/// The task lease every client claims and renews with.
const TASK_LEASE_MS: u64 = crate::model::TASK_LEASE_SECS * 1000;
/// The floor of the faults not tied to a lease.
const SHORT_FAULT_MS: u64 = 5_000;

const REPLICA_LANE: [FaultKind; 5] = [
    FaultKind::KillReplica,
    FaultKind::PauseDrainReplica,
    FaultKind::PartitionReplicaPostgres,
    FaultKind::PartitionReplicaNats,
    FaultKind::DelayReplicaLink,
];
const INFRA_LANE: [FaultKind; 4] = [
    FaultKind::RestartPostgres,
    FaultKind::KillNatsNode,
    FaultKind::KillStreamLeader,
    FaultKind::RestartAllNats,
];

/// Which link a [`FaultKind::DelayReplicaLink`] slows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Postgres,
    Nats,
}

/// One planned fault.
#[derive(Clone, Debug)]
pub struct Fault {
    /// When it starts, in ms after the clients start.
    pub at_ms: u64,
    pub kind: FaultKind,
    /// A replica or a NATS node index, depending on the kind: the node to
    /// kill for `KillNatsNode` (the next one if it leads the stream), the
    /// one to kill for `KillStreamLeader` when no leader can be found, the
    /// replica to pause for `PauseDrainReplica`; unused for PostgreSQL and
    /// all-NATS faults.
    pub target: usize,
    pub duration_ms: u64,
    /// For `DelayReplicaLink`: which link, and by how much per chunk.
    pub link: Link,
    pub delay_ms: u64,
}

impl Fault {
    pub fn end_ms(&self) -> u64 {
        self.at_ms + self.duration_ms
    }
}

pub struct Schedule {
    pub seed: u64,
    pub faults: Vec<Fault>,
}

/// (shortest, extra drawn up to) in ms for each kind, before the profile's
/// `fault_spread_ms`.
fn duration_range(kind: FaultKind) -> (u64, u64) {
    match kind {
        FaultKind::KillReplica => (2 * SHORT_FAULT_MS, 3_000),
        FaultKind::PauseDrainReplica => (DRAIN_LEASE_MS + 5_000, 3_000),
        FaultKind::PartitionReplicaPostgres | FaultKind::PartitionReplicaNats => {
            (SHORT_FAULT_MS + 2_000, 3_000)
        }
        FaultKind::DelayReplicaLink => (SHORT_FAULT_MS + 1_000, 3_000),
        FaultKind::RestartPostgres => (TASK_LEASE_MS + 1_000, 3_000),
        FaultKind::KillNatsNode | FaultKind::KillStreamLeader => (2 * SHORT_FAULT_MS, 5_000),
        // The cluster is down for this long; it also takes a while to elect.
        FaultKind::RestartAllNats => (3_000, 3_000),
    }
}

/// What a fault must last longer than: the lease it is there to outlast.
fn outlasts(kind: FaultKind) -> u64 {
    match kind {
        FaultKind::PauseDrainReplica => DRAIN_LEASE_MS,
        FaultKind::RestartPostgres => TASK_LEASE_MS,
        FaultKind::RestartAllNats => 0,
        _ => SHORT_FAULT_MS,
    }
}

impl Schedule {
    pub fn draw(seed: u64, profile: &Profile) -> Schedule {
        let mut rng = StdRng::seed_from_u64(seed);
        let window = (profile.load.as_millis() as u64).saturating_sub(WARMUP_MS + TAIL_MS);
        // A round of the replica lane takes about 100 s plus five times half
        // the spread; the lane keeps about half the window free of faults.
        let round_ms = 2 * (100_000 + 5 * profile.fault_spread_ms / 2);
        let rounds = (window / round_ms).max(1) as usize;

        let mut replica = drawn(&mut rng, &REPLICA_LANE, rounds, profile);
        spread(&mut rng, &mut replica, window);
        let down: Vec<(u64, u64)> = replica
            .iter()
            .filter(|f| f.kind == FaultKind::KillReplica)
            .map(|f| (f.at_ms, f.end_ms() + RESTART_MARGIN_MS))
            .collect();
        let mut infra = drawn(&mut rng, &INFRA_LANE, rounds, profile);
        spread_around(&mut rng, &mut infra, window, &down);
        let mut faults: Vec<Fault> = replica.into_iter().chain(infra).collect();
        for fault in &mut faults {
            fault.at_ms += WARMUP_MS;
        }
        faults.sort_by_key(|f| f.at_ms);
        let schedule = Schedule { seed, faults };
        let problems = schedule.problems(profile);
        assert!(
            problems.is_empty(),
            "the schedule drawn from seed {seed} breaks its own rules (a harness bug): {}\n{schedule}",
            problems.join("; ")
        );
        schedule
    }

    /// What breaks the rules in the module's comment: every kind at least
    /// once, one fault at a time per lane, within the load period, long
    /// enough, and no infrastructure fault while a killed replica is down.
    fn problems(&self, profile: &Profile) -> Vec<String> {
        let mut problems = Vec::new();
        let load_ms = profile.load.as_millis() as u64;
        for kind in REPLICA_LANE.iter().chain(&INFRA_LANE) {
            if !self.faults.iter().any(|f| f.kind == *kind) {
                problems.push(format!("no {}", kind_name(*kind)));
            }
        }
        for lane in [&REPLICA_LANE[..], &INFRA_LANE[..]] {
            let faults: Vec<&Fault> = self
                .faults
                .iter()
                .filter(|f| lane.contains(&f.kind))
                .collect();
            for pair in faults.windows(2) {
                if pair[0].end_ms() + MIN_GAP_MS > pair[1].at_ms {
                    problems.push(format!(
                        "{} at {} ms overlaps {} at {} ms",
                        kind_name(pair[0].kind),
                        pair[0].at_ms,
                        kind_name(pair[1].kind),
                        pair[1].at_ms
                    ));
                }
            }
        }
        for fault in &self.faults {
            let least = outlasts(fault.kind);
            if fault.duration_ms <= least {
                problems.push(format!(
                    "{} lasts {} ms, not past {least} ms",
                    kind_name(fault.kind),
                    fault.duration_ms
                ));
            }
            if fault.at_ms < WARMUP_MS || fault.end_ms() > load_ms.saturating_sub(TAIL_MS) {
                problems.push(format!(
                    "{} at {}..{} ms is outside the load period",
                    kind_name(fault.kind),
                    fault.at_ms,
                    fault.end_ms()
                ));
            }
        }
        for kill in self
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::KillReplica)
        {
            let down = (kill.at_ms, kill.end_ms() + RESTART_MARGIN_MS);
            for infra in self.faults.iter().filter(|f| INFRA_LANE.contains(&f.kind)) {
                if infra.end_ms() >= down.0 && infra.at_ms <= down.1 {
                    problems.push(format!(
                        "{} at {} ms while replica {} is down",
                        kind_name(infra.kind),
                        infra.at_ms,
                        kill.target
                    ));
                }
            }
        }
        problems
    }
}

/// `kinds` × `rounds` in a random order, each with its target and duration
/// drawn; not yet placed in time.
fn drawn(rng: &mut StdRng, kinds: &[FaultKind], rounds: usize, profile: &Profile) -> Vec<Fault> {
    let mut order: Vec<FaultKind> = (0..rounds).flat_map(|_| kinds.iter().copied()).collect();
    order.shuffle(rng);
    order
        .into_iter()
        .map(|kind| {
            let (least, mut extra) = duration_range(kind);
            if kind != FaultKind::RestartAllNats {
                extra += profile.fault_spread_ms;
            }
            let target_count = match kind {
                FaultKind::KillNatsNode | FaultKind::KillStreamLeader => NATS_NODES,
                _ => REPLICAS,
            };
            Fault {
                at_ms: 0,
                kind,
                target: rng.random_range(0..target_count),
                duration_ms: least + rng.random_range(0..=extra),
                link: if rng.random_bool(0.5) {
                    Link::Postgres
                } else {
                    Link::Nats
                },
                delay_ms: rng.random_range(100..=500),
            }
        })
        .collect()
}

/// One after the other within `window` ms: the slack is cut at random
/// points into one gap before each fault (and what is left after the last).
fn spread(rng: &mut StdRng, faults: &mut [Fault], window: u64) {
    let busy: u64 = faults.iter().map(|f| f.duration_ms).sum();
    let slack = window.saturating_sub(busy + MIN_GAP_MS * faults.len() as u64);
    let mut cuts: Vec<u64> = (0..faults.len())
        .map(|_| rng.random_range(0..=slack))
        .collect();
    cuts.sort_unstable();
    let mut at = 0;
    let mut previous_cut = 0;
    for (fault, cut) in faults.iter_mut().zip(cuts) {
        at += MIN_GAP_MS + (cut - previous_cut);
        previous_cut = cut;
        fault.at_ms = at;
        at += fault.duration_ms;
    }
}

/// One after the other within `window` ms, with random gaps, each fault
/// moved past any `down` interval it would overlap.
fn spread_around(rng: &mut StdRng, faults: &mut [Fault], window: u64, down: &[(u64, u64)]) {
    let busy: u64 = faults.iter().map(|f| f.duration_ms).sum();
    let blocked: u64 = down.iter().map(|(s, e)| e - s).sum();
    // Gaps average the free time per fault, so the lane spans the window;
    // a draw that overruns it is redrawn with narrower gaps.
    let mut widest = 2 * window.saturating_sub(busy + blocked) / faults.len().max(1) as u64;
    loop {
        let mut at = 0;
        for fault in faults.iter_mut() {
            let mut start = at + MIN_GAP_MS + rng.random_range(0..=widest);
            while let Some(&(_, end)) = down
                .iter()
                .find(|&&(s, e)| start + fault.duration_ms >= s && start <= e)
            {
                start = end + MIN_GAP_MS;
            }
            fault.at_ms = start;
            at = fault.end_ms();
        }
        if at <= window || widest == 0 {
            return;
        }
        widest = widest * 4 / 5;
    }
}

/// `kill_replica` and so on: the name the summary counts by.
pub fn kind_name(kind: FaultKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{kind:?}"))
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:>7}  {:>7}  {:<28}  target", "at s", "for s", "fault")?;
        for fault in &self.faults {
            let target = match fault.kind {
                FaultKind::KillReplica
                | FaultKind::PartitionReplicaPostgres
                | FaultKind::PartitionReplicaNats => format!("replica {}", fault.target),
                FaultKind::PauseDrainReplica => {
                    format!("replica {} (after it holds outbox slots)", fault.target)
                }
                FaultKind::DelayReplicaLink => format!(
                    "replica {} ↔ {}, +{} ms",
                    fault.target,
                    match fault.link {
                        Link::Postgres => "postgres",
                        Link::Nats => "nats",
                    },
                    fault.delay_ms
                ),
                FaultKind::RestartPostgres => "postgres".into(),
                FaultKind::KillNatsNode => {
                    format!("nats node {} (the next if it leads)", fault.target)
                }
                FaultKind::KillStreamLeader => "the stream leader's node".into(),
                FaultKind::RestartAllNats => "every nats node".into(),
            };
            writeln!(
                f,
                "{:>7.1}  {:>7.1}  {:<28}  {target}",
                fault.at_ms as f64 / 1000.0,
                fault.duration_ms as f64 / 1000.0,
                kind_name(fault.kind),
            )?;
        }
        write!(
            f,
            "(seed {}: --seed {} draws this table again)",
            self.seed, self.seed
        )
    }
}
