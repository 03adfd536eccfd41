//! Inbox and receipt checks: every delivered receipt's reference was handed
//! out to its window, everything owed was handed out by the end, a repeated
//! confirmation changes nothing, references name real messages, and every
//! acknowledgement a client heard is recorded.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::Violation;
use super::data::Input;
use crate::history::OpKind;

fn uuid_of(value: &serde_json::Value) -> Option<Uuid> {
    value.as_str()?.parse().ok()
}

/// Receipts against hand-outs: a `delivered` receipt was handed out to that
/// window at least once; a stored message's receipt is delivered by the end
/// (the quiet period drains every inbox); every handed-out message
/// reference names the message at that seq.
pub fn handed_out(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "inbox references handed out";
    let mut violations = Vec::new();
    let messages: HashMap<Uuid, &super::data::StoredMessage> =
        input.db.messages.iter().map(|m| (m.id, m)).collect();
    let mut seen: HashSet<(Uuid, &str)> = HashSet::new();
    for op in input.ops.iter().filter(|op| op.kind == OpKind::Fetch) {
        let Some(r) = op.outcome.ok() else { continue };
        for d in r["deliveries"].as_array().into_iter().flatten() {
            if d["kind"] != "message" {
                continue;
            }
            let Some(id) = uuid_of(&d["message_id"]) else {
                continue;
            };
            seen.insert((id, op.window.as_str()));
            let ok = messages.get(&id).is_some_and(|m| {
                Some(m.conversation_id) == uuid_of(&d["conversation_id"])
                    && Some(m.seq) == d["seq"].as_i64()
            });
            if !ok {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "reference {d} names no such message at that seq: {}",
                        op.describe()
                    ),
                ));
            }
        }
    }
    for r in &input.db.receipts {
        let stored = messages
            .get(&r.message_id)
            .is_some_and(|m| m.state == "stored");
        let handed = seen.contains(&(r.message_id, r.window.as_str()));
        if r.delivered && !handed {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "message {} is delivered to {} but was never handed out to it",
                    r.message_id, r.window
                ),
            ));
        } else if stored && !r.delivered {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "message {} was stored but never delivered to {} (still owed after the quiet period)",
                    r.message_id, r.window
                ),
            ));
        }
    }
    (input.db.receipts.len(), violations)
}

/// A confirmation names only this window's references; the same ids
/// confirmed again confirm nothing new.
pub fn confirm_idempotent(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "confirmation idempotent";
    let mut violations = Vec::new();
    let mut checked = 0;
    for op in input.ops.iter().filter(|op| op.kind == OpKind::Confirm) {
        let Some(r) = op.outcome.ok() else { continue };
        checked += 1;
        let named = op.args["delivery_ids"].as_array().map_or(0, Vec::len) as u64;
        let unknown = r["unknown"].as_array().map_or(0, Vec::len);
        if unknown > 0 {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "{unknown} references handed out to this window are unknown to it: {}",
                    op.describe()
                ),
            ));
        }
        let confirmed = r["confirmed"].as_u64().unwrap_or(0);
        let already = r["already_confirmed"].as_u64().unwrap_or(0);
        if confirmed + already + unknown as u64 != named {
            violations.push(Violation::new(
                CHECK,
                format!("{confirmed} confirmed + {already} already + {unknown} unknown != {named} named: {}", op.describe()),
            ));
        }
        if op.args["repeat"] == true && (confirmed != 0 || already != named) {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "a repeated confirmation confirmed {confirmed} anew: {}",
                    op.describe()
                ),
            ));
        }
    }
    (checked, violations)
}

/// Every acknowledgement a client was told about is on the receipt.
pub fn acks(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "acknowledgements recorded";
    let receipts: HashMap<(Uuid, &str), bool> = input
        .db
        .receipts
        .iter()
        .map(|r| ((r.message_id, r.window.as_str()), r.acknowledged))
        .collect();
    let mut violations = Vec::new();
    let mut checked = 0;
    for op in input.ops.iter().filter(|op| op.kind == OpKind::Ack) {
        if op.outcome.ok().is_none() {
            continue;
        }
        checked += 1;
        let Some(id) = uuid_of(&op.args["message_id"]) else {
            continue;
        };
        if receipts.get(&(id, op.window.as_str())) != Some(&true) {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "acknowledged to the client but not on the receipt: {}",
                    op.describe()
                ),
            ));
        }
    }
    (checked, violations)
}
