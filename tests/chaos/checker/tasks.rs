//! Task lease checks: no two windows hold a task with overlapping unexpired
//! leases, and nobody completes a task on a lease that has lapsed. Judged
//! twice: from the database's `task_events` (every change that committed,
//! on the database's clock, whether or not its client heard the answer) and
//! from the leases the server reported to clients.

use std::collections::{BTreeMap, HashMap};

use super::Violation;
use super::data::Input;
use crate::history::{Op, OpKind};

/// From `task_events`: replay each task's changes; a claim while another
/// window's lease is live, a renewal or completion by a window not holding
/// a live lease, is a violation.
pub fn events(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "one lease holder (task events)";
    let mut violations = Vec::new();
    // key → (holder, lease end µs)
    let mut holders: HashMap<&str, (String, i64)> = HashMap::new();
    // Database times as run milliseconds, to read beside the history.
    let run_ms = |us: i64| us / 1000 - input.epoch_at_zero;
    for e in &input.db.task_events {
        let lease_end = e.at_us + e.lease_seconds.unwrap_or(0) * 1_000_000;
        let current = holders.get(e.key.as_str()).cloned();
        let live = |holder: &Option<(String, i64)>| {
            holder.as_ref().filter(|(_, end)| *end > e.at_us).cloned()
        };
        match e.kind.as_str() {
            "claimed" => {
                if let Some((other, end)) = live(&current)
                    && other != e.window
                {
                    violations.push(Violation::new(
                        CHECK,
                        format!(
                            "task {}: {} claimed it at {} ms while {other}'s lease ran to {} ms (run time)",
                            e.key,
                            e.window,
                            run_ms(e.at_us),
                            run_ms(end)
                        ),
                    ));
                }
                holders.insert(&e.key, (e.window.clone(), lease_end));
            }
            "renewed" | "completed" | "released" => {
                match live(&current) {
                    Some((holder, _)) if holder == e.window => {}
                    _ if e.kind == "released" => {}
                    _ => violations.push(Violation::new(
                        CHECK,
                        format!(
                            "task {}: {} {} it at {} ms (run time) without a live lease ({})",
                            e.key,
                            e.window,
                            e.kind,
                            run_ms(e.at_us),
                            match &current {
                                Some((w, end)) =>
                                    format!("{w}'s lease ended at {} ms", run_ms(*end)),
                                None => "nobody held it".into(),
                            }
                        ),
                    )),
                }
                if e.kind == "renewed" {
                    holders.insert(&e.key, (e.window.clone(), lease_end));
                } else {
                    holders.remove(e.key.as_str());
                }
            }
            _ => {}
        }
    }
    (input.db.task_events.len(), violations)
}

/// The wall clock the client reads against the database's (one machine).
const CLOCK_SLACK_MS: i64 = 100;

/// From the history: the leases the server reported (claim and renew
/// answers) of different windows never overlap, and a completion the
/// server accepted was not invoked after the window's last known lease
/// ended (unless a claim or renew of that window had an unknown outcome).
pub fn reported(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "one lease holder (client view)";
    let mut violations = Vec::new();
    let mut leases: BTreeMap<String, Vec<(i64, i64, &Op)>> = BTreeMap::new();
    let lease_ms = |op: &Op| op.args["lease_seconds"].as_i64().unwrap_or(0) * 1000;
    let mut checked = 0;
    for op in &input.ops {
        if !matches!(op.kind, OpKind::ClaimNext | OpKind::Claim | OpKind::Renew) {
            continue;
        }
        let Some(r) = op.outcome.ok() else { continue };
        if matches!(op.kind, OpKind::ClaimNext | OpKind::Claim) && r["claimed"] != true {
            continue;
        }
        let (Some(key), Some(end)) = (r["key"].as_str(), r["lease_expires_ms"].as_i64()) else {
            continue;
        };
        checked += 1;
        if r["holder"].as_str() != Some(op.window.as_str()) {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "the answer names holder {} for the calling window: {}",
                    r["holder"],
                    op.describe()
                ),
            ));
        }
        leases
            .entry(key.to_string())
            .or_default()
            .push((end - lease_ms(op), end, op));
    }
    for (key, list) in &mut leases {
        list.sort_by_key(|(start, _, _)| *start);
        for (i, (_, end_a, a)) in list.iter().enumerate() {
            for (start_b, _, b) in &list[i + 1..] {
                // Millisecond rounding of the reported times: 1 ms slack.
                if *start_b + 1 >= *end_a {
                    break;
                }
                if a.window != b.window {
                    violations.push(Violation::new(
                        CHECK,
                        format!(
                            "task {key}: leases overlap, {} until {end_a} and {} from {start_b}: {} / {}",
                            a.window,
                            b.window,
                            a.describe(),
                            b.describe()
                        ),
                    ));
                }
            }
        }
    }
    // Each window's claims and renewals, so a completion looks at its own.
    let mut by_window: HashMap<&str, Vec<&Op>> = HashMap::new();
    for o in &input.ops {
        if matches!(o.kind, OpKind::ClaimNext | OpKind::Claim | OpKind::Renew) {
            by_window.entry(o.window.as_str()).or_default().push(o);
        }
    }
    // A completion retried with its request_id took effect at one of its
    // attempts: a replay answering later is judged from its first attempt.
    // An answer that is not a replay took effect at its own attempt (the
    // request_ids row commits with the write, so no earlier attempt did):
    // judged from that attempt, which may come under a later claim.
    let mut first_invoked: HashMap<&str, u64> = HashMap::new();
    for o in input.ops.iter().filter(|o| o.kind == OpKind::Complete) {
        if let Some(request) = o.args["request_id"].as_str() {
            first_invoked.entry(request).or_insert(o.invoked_ms);
        }
    }
    for op in input.ops.iter().filter(|op| op.kind == OpKind::Complete) {
        if op.outcome.ok().is_none() {
            continue;
        }
        checked += 1;
        let replayed = op.outcome.ok().is_some_and(|r| r["replayed"] == true);
        let invoked_ms = op.args["request_id"]
            .as_str()
            .filter(|_| replayed)
            .and_then(|r| first_invoked.get(r).copied())
            .unwrap_or(op.invoked_ms);
        let key = op.args["key"].as_str().unwrap_or_default();
        let mine = || {
            by_window
                .get(op.window.as_str())
                .into_iter()
                .flatten()
                .filter(move |o| o.completed_ms <= invoked_ms)
        };
        let unknown = mine()
            .any(|o| o.outcome.unknown() && (o.kind == OpKind::ClaimNext || o.args["key"] == key));
        if unknown {
            continue;
        }
        let last_end = leases
            .get(key)
            .into_iter()
            .flatten()
            .filter(|(_, _, o)| o.window == op.window && o.completed_ms <= invoked_ms)
            .map(|(_, end, _)| *end)
            .max();
        // The invocation time on the wall clock, with slack for the two
        // clocks' offset (the same machine).
        let invoked = input.epoch_ms(invoked_ms);
        match last_end {
            Some(end) if invoked <= end + CLOCK_SLACK_MS => {}
            _ => violations.push(Violation::new(
                CHECK,
                format!(
                    "completion accepted although the window's last lease ended at {:?} ms (run time): {}",
                    last_end.map(|end| end - input.epoch_at_zero),
                    op.describe()
                ),
            )),
        }
    }
    (checked, violations)
}
