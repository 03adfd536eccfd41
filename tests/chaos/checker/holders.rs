//! Locks and path reservations under retries: the holdings the server
//! reported (an `acquire_lock` answer, a `reserve_paths` grant) of
//! different windows never overlap unless the earlier holder let go first
//! (a release answered as released, or one whose outcome is unknown,
//! invoked before the later holding began). A retry or repeat of a taking
//! call with its request_id is answered with the original holding (checked
//! by [`super::retries::replays`]), so a window that let go cannot take the
//! lock or pattern back from whoever holds it now by retrying.

use serde_json::Value;

use super::Violation;
use super::data::Input;
use crate::history::{Op, OpKind};

/// The two clocks (server answers, client invocations) are one machine's.
const SLACK_MS: i64 = 100;

/// One holding as an answer reported it (epoch ms).
struct Holding<'a> {
    name: String,
    from: i64,
    to: i64,
    op: &'a Op,
}

/// One release that may have let `name` go, invoked at epoch ms `at`.
struct Release<'a> {
    name: String,
    at: i64,
    op: &'a Op,
}

fn overlaps(
    check: &'static str,
    input: &Input,
    holdings: &[Holding],
    releases: &[Release],
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for a in holdings {
        for b in holdings {
            if a.op.window == b.op.window
                || a.name != b.name
                || b.from < a.from
                || b.from + SLACK_MS >= a.to
            {
                continue;
            }
            // a's window let go between taking it and b's take. The time an
            // answer reports is its transaction's start (PostgreSQL's
            // `now()`): with a request_id the write runs in a transaction of
            // its own that may begin well before the statement that takes the
            // lock, so b's take happened at the latest when its answer came.
            let taken_by = b.from.max(input.epoch_ms(b.op.completed_ms));
            let let_go = releases.iter().any(|r| {
                r.name == a.name
                    && r.op.window == a.op.window
                    && r.at + SLACK_MS >= a.from
                    && r.at <= taken_by + SLACK_MS
            });
            if !let_go {
                violations.push(Violation::new(
                    check,
                    format!(
                        "{} held by {} until {} and by {} from {} (run ms), no release between: \
                         {} / {}",
                        a.name,
                        a.op.window,
                        a.to - input.epoch_at_zero,
                        b.op.window,
                        b.from - input.epoch_at_zero,
                        a.op.describe(),
                        b.op.describe()
                    ),
                ));
            }
        }
    }
    violations
}

/// A release whose answer says it released (`released` reads it), or
/// whose outcome is unknown.
fn may_release(op: &Op, released: impl Fn(&Value) -> bool) -> bool {
    match op.outcome.ok() {
        Some(r) => released(r),
        None => !op.outcome.changed_nothing(),
    }
}

pub fn locks(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "locks held by one window";
    let mut holdings = Vec::new();
    let mut releases = Vec::new();
    for op in &input.ops {
        match op.kind {
            OpKind::AcquireLock => {
                // A replay repeats a holding already counted.
                let Some(r) = op.outcome.ok().filter(|r| r["replayed"] != true) else {
                    continue;
                };
                if let (Some(name), Some(from), Some(to)) = (
                    r["name"].as_str(),
                    r["acquired_ms"].as_i64(),
                    r["expires_ms"].as_i64(),
                ) {
                    holdings.push(Holding {
                        name: name.to_string(),
                        from,
                        to,
                        op,
                    });
                }
            }
            OpKind::ReleaseLock if may_release(op, |r| r["released"] == true) => {
                releases.push(Release {
                    name: op.args["name"].as_str().unwrap_or_default().to_string(),
                    at: input.epoch_ms(op.invoked_ms),
                    op,
                });
            }
            _ => {}
        }
    }
    let violations = overlaps(CHECK, input, &holdings, &releases);
    (holdings.len(), violations)
}

pub fn reservations(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "reservations held by one window";
    let mut holdings = Vec::new();
    let mut releases = Vec::new();
    for op in &input.ops {
        match op.kind {
            OpKind::ReservePaths => {
                let Some(r) = op.outcome.ok().filter(|r| r["replayed"] != true) else {
                    continue;
                };
                for g in r["granted"].as_array().into_iter().flatten() {
                    if let (Some(name), Some(from), Some(to)) = (
                        g["pattern"].as_str(),
                        g["created_ms"].as_i64(),
                        g["expires_ms"].as_i64(),
                    ) {
                        holdings.push(Holding {
                            name: name.to_string(),
                            from,
                            to,
                            op,
                        });
                    }
                }
            }
            OpKind::ReleasePaths => {
                for name in op.args["paths"].as_array().into_iter().flatten() {
                    let released =
                        |r: &Value| r["released"].as_array().is_some_and(|l| l.contains(name));
                    if may_release(op, released) {
                        releases.push(Release {
                            name: name.as_str().unwrap_or_default().to_string(),
                            at: input.epoch_ms(op.invoked_ms),
                            op,
                        });
                    }
                }
            }
            _ => {}
        }
    }
    let violations = overlaps(CHECK, input, &holdings, &releases);
    (holdings.len(), violations)
}
