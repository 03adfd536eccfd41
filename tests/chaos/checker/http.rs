//! What clients saw of the servers: no 5xx but the documented 503 while
//! PostgreSQL is out of reach (a restart, or the replica's partition from
//! it), judged from the faults as applied.

use super::Violation;
use super::data::Input;
use crate::history::Outcome;
use crate::model::FaultKind;

/// After a PostgreSQL outage ends, the pool takes a moment to reconnect.
const AFTER_OUTAGE_MS: u64 = 10_000;

pub fn server_errors(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "no 5xx but 503 in a PostgreSQL outage";
    let outages: Vec<(u64, u64)> = input
        .faults
        .iter()
        .filter(|f| {
            matches!(
                f.kind,
                FaultKind::RestartPostgres | FaultKind::PartitionReplicaPostgres
            )
        })
        .map(|f| {
            (
                f.started_ms.saturating_sub(1_000),
                f.ended_ms
                    .unwrap_or(u64::MAX)
                    .saturating_add(AFTER_OUTAGE_MS),
            )
        })
        .collect();
    let mut violations = Vec::new();
    for op in &input.ops {
        let Outcome::Failed {
            status: Some(status),
            message,
        } = &op.outcome
        else {
            continue;
        };
        if *status < 500 {
            continue;
        }
        let in_outage = outages
            .iter()
            .any(|(from, to)| op.completed_ms >= *from && op.invoked_ms <= *to);
        if *status != 503 || !in_outage {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "HTTP {status} {}: {message:.200}: {}",
                    if *status == 503 {
                        "outside any PostgreSQL outage"
                    } else {
                        ""
                    },
                    op.describe()
                ),
            ));
        }
    }
    (input.ops.len(), violations)
}
