//! The checker: reads the whole history beside the database and the team's
//! body stream once the run is quiet, runs every check, and reports a table
//! and a JSON summary line.
//!
//! Each check is a pure function over [`data::Input`] returning how many
//! things it looked at and its violations, so [`self_test`] can feed a
//! made-up run and see every check fail.

mod channels;
mod conversations;
mod data;
mod holders;
mod http;
mod inbox;
mod retries;
mod self_test;
mod tasks;

use std::collections::BTreeMap;

use serde_json::json;

use crate::Profile;
use crate::faults::Schedule;
use crate::history::{History, Outcome};
use crate::model::{AppliedFault, Target};
use crate::workload::Fixture;

pub use self_test::self_test;

/// One broken promise, naming what broke it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Violation {
    pub check: &'static str,
    pub what: String,
}

impl Violation {
    pub fn new(check: &'static str, what: String) -> Violation {
        Violation { check, what }
    }
}

/// One row of the table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CheckRow {
    pub name: &'static str,
    pub checked: usize,
    pub violations: usize,
}

pub struct Report {
    pub violations: Vec<Violation>,
    pub checks: Vec<CheckRow>,
    /// Operations in the history.
    pub operations: usize,
    /// Per tool: ok, refused, failed (unknown outcome).
    pub outcomes: BTreeMap<&'static str, [usize; 3]>,
    /// Refusals per `tool: kind` (an `unavailable` with no fault running
    /// is worth a look: the server could not complete a call).
    pub refusals: BTreeMap<String, usize>,
    /// Answers marked `replayed: true` per tool: retries and repeats the
    /// server answered with the original.
    pub replayed: BTreeMap<&'static str, usize>,
}

type Check = fn(&data::Input) -> (usize, Vec<Violation>);

/// Every check, in the order the table lists them.
const CHECKS: [(&str, Check); 19] = [
    ("sends stored exactly once", conversations::stored_once),
    ("seqs 1..N without gap", conversations::gap_free),
    ("outbox settled", conversations::outbox_settled),
    (
        "one stream entry per outbox message",
        conversations::stream_entries,
    ),
    ("reader pages skip nothing", conversations::pages),
    ("one lease holder (task events)", tasks::events),
    ("one lease holder (client view)", tasks::reported),
    ("inbox references handed out", inbox::handed_out),
    ("confirmation idempotent", inbox::confirm_idempotent),
    ("acknowledgements recorded", inbox::acks),
    ("channel posts stored once", channels::posts),
    ("channel reads skip nothing", channels::reads),
    ("retries answered with the original", retries::replays),
    ("posts once per request_id", retries::posts),
    ("claims once per request_id", retries::claims),
    ("completions once per request_id", retries::completions),
    ("acknowledged writes recorded once", retries::recorded),
    ("locks held by one window", holders::locks),
    ("reservations held by one window", holders::reservations),
];

/// The checks, plus the HTTP one, over one input.
fn run_checks(input: &data::Input) -> (Vec<CheckRow>, Vec<Violation>) {
    let mut rows = Vec::new();
    let mut violations = Vec::new();
    let all = CHECKS.iter().copied().chain([(
        "no 5xx but 503 in a PostgreSQL outage",
        http::server_errors as Check,
    )]);
    for (name, check) in all {
        let (checked, found) = check(input);
        rows.push(CheckRow {
            name,
            checked,
            violations: found.len(),
        });
        violations.extend(found);
    }
    (rows, violations)
}

pub async fn check(
    target: &Target,
    fixture: &Fixture,
    history: &History,
    applied: &[AppliedFault],
) -> anyhow::Result<Report> {
    // A checker that cannot fail proves nothing: each check first catches
    // its breakage of a made-up run (cheap, no I/O).
    self_test()?;
    let dump = target.scratch.join("history.jsonl");
    match history.dump(&dump) {
        Ok(()) => eprintln!("chaos: history written to {}", dump.display()),
        Err(e) => eprintln!("chaos: could not write the history: {e:#}"),
    }
    let ops = history.ops();
    let db = data::load_db(&target.database_url, fixture.team_id).await?;
    let stream = data::load_stream(&target.nats_urls, &fixture.stream_name()).await?;
    let input = data::Input {
        ops,
        db,
        stream,
        stream_name: fixture.stream_name(),
        modes: data::modes(fixture),
        faults: applied.to_vec(),
        epoch_at_zero: history.clock().epoch_ms_at(0),
    };
    let (checks, violations) = run_checks(&input);
    let mut outcomes: BTreeMap<&'static str, [usize; 3]> = BTreeMap::new();
    let mut refusals: BTreeMap<String, usize> = BTreeMap::new();
    let mut replayed: BTreeMap<&'static str, usize> = BTreeMap::new();
    for op in &input.ops {
        if op.outcome.ok().is_some_and(|r| r["replayed"] == true) {
            *replayed.entry(op.kind.tool()).or_default() += 1;
        }
        let slot = match &op.outcome {
            Outcome::Ok { .. } => 0,
            Outcome::Refused { kind, .. } => {
                *refusals
                    .entry(format!("{}: {kind}", op.kind.tool()))
                    .or_default() += 1;
                1
            }
            Outcome::Failed { .. } => 2,
        };
        outcomes.entry(op.kind.tool()).or_default()[slot] += 1;
    }
    Ok(Report {
        violations,
        checks,
        operations: input.ops.len(),
        outcomes,
        refusals,
        replayed,
    })
}

/// Violations listed per check in the table; the JSON line keeps the
/// first hundred.
const LISTED: usize = 20;

impl Report {
    /// The JSON summary line.
    pub fn summary(
        &self,
        seed: u64,
        profile: &Profile,
        applied: &[AppliedFault],
    ) -> serde_json::Value {
        let mut faults: BTreeMap<String, usize> = BTreeMap::new();
        for f in applied {
            let kind = serde_json::to_value(f.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{:?}", f.kind));
            *faults.entry(kind).or_default() += 1;
        }
        let checks: BTreeMap<&str, serde_json::Value> = self
            .checks
            .iter()
            .map(|c| {
                (
                    c.name,
                    json!({"checked": c.checked, "violations": c.violations}),
                )
            })
            .collect();
        let outcomes: BTreeMap<&str, serde_json::Value> = self
            .outcomes
            .iter()
            .map(|(tool, [ok, refused, failed])| {
                (
                    *tool,
                    json!({"ok": ok, "refused": refused, "failed": failed}),
                )
            })
            .collect();
        json!({
            "seed": seed,
            "profile": profile.name,
            "operations": self.operations,
            "faults": faults,
            "violations": self.violations.iter().take(100).collect::<Vec<_>>(),
            "violation_count": self.violations.len(),
            "checks": checks,
            "outcomes": outcomes,
            "refusals": self.refusals,
            "replayed": self.replayed,
        })
    }

    /// The table on stderr, each violation naming its operation, the JSON
    /// line on stdout, and on violations the schedule that reproduces them.
    pub fn print(
        &self,
        seed: u64,
        profile: &Profile,
        schedule: &Schedule,
        applied: &[AppliedFault],
    ) {
        eprintln!("\nchaos: {} operations", self.operations);
        eprintln!(
            "  {:<40} {:>8} {:>5} {:>7}",
            "tool", "ok", "refused", "unknown"
        );
        for (tool, [ok, refused, failed]) in &self.outcomes {
            eprintln!("  {tool:<40} {ok:>8} {refused:>5} {failed:>7}");
        }
        if !self.refusals.is_empty() {
            let list: Vec<String> = self
                .refusals
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            eprintln!("  refusals: {}", list.join(", "));
        }
        if !self.replayed.is_empty() {
            let list: Vec<String> = self
                .replayed
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            eprintln!("  answered as replayed: {}", list.join(", "));
        }
        eprintln!("\n  {:<40} {:>8} {:>10}", "check", "checked", "violations");
        for row in &self.checks {
            eprintln!(
                "  {:<40} {:>8} {:>10}",
                row.name, row.checked, row.violations
            );
        }
        for row in self.checks.iter().filter(|r| r.violations > 0) {
            eprintln!("\n  {} ({}):", row.name, row.violations);
            for v in self
                .violations
                .iter()
                .filter(|v| v.check == row.name)
                .take(LISTED)
            {
                eprintln!("    - {}", v.what);
            }
            if row.violations > LISTED {
                eprintln!(
                    "    … and {} more (history.jsonl in the run's scratch dir)",
                    row.violations - LISTED
                );
            }
        }
        if !self.violations.is_empty() {
            eprintln!("\nchaos: the fault schedule of seed {seed}:\n{schedule}");
            for f in applied {
                eprintln!(
                    "  applied {:?} on {} at {} ms, healed at {:?} ms",
                    f.kind, f.target, f.started_ms, f.ended_ms
                );
            }
        }
        println!("{}", self.summary(seed, profile, applied));
    }
}
