//! Conversation checks: every acknowledged send stored exactly once with its
//! digest; seqs 1..N; every outbox message settled; one stream entry per
//! stored outbox message; reader pages contiguous and never past a
//! committed message.

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use super::Violation;
use super::data::{Input, StoredMessage};
use crate::history::{Op, OpKind};
use crate::workload::Mode;

fn uuid_of(value: &serde_json::Value) -> Option<Uuid> {
    value.as_str()?.parse().ok()
}

/// Every send acknowledged to a client is one row, the message the answer
/// named, with the digest the client sent; every attempt of a request_id
/// maps to the same message, and a stored one's last answer is not a
/// refusal; no row without a send in the history.
pub fn stored_once(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "sends stored exactly once";
    let mut violations = Vec::new();
    let mut rows: HashMap<(String, Uuid), Vec<&StoredMessage>> = HashMap::new();
    for m in &input.db.messages {
        rows.entry((agent_of(&m.sender), m.request_id))
            .or_default()
            .push(m);
    }
    let mut sends: BTreeMap<(String, Uuid), Vec<&Op>> = BTreeMap::new();
    for op in input.ops.iter().filter(|op| op.kind == OpKind::Send) {
        if let Some(request) = uuid_of(&op.args["request_id"]) {
            sends
                .entry((agent_of(&op.window), request))
                .or_default()
                .push(op);
        }
    }
    for (key, attempts) in &sends {
        let found = rows.get(key).map(Vec::as_slice).unwrap_or_default();
        let oks: Vec<&&Op> = attempts
            .iter()
            .filter(|op| op.outcome.ok().is_some())
            .collect();
        let first = attempts[0];
        if found.len() > 1 {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "request_id {} is stored {} times: {}",
                    key.1,
                    found.len(),
                    first.describe()
                ),
            ));
            continue;
        }
        let row = found.first();
        for op in &oks {
            let result = op.outcome.ok().expect("an ok outcome");
            let Some(row) = row else {
                violations.push(Violation::new(
                    CHECK,
                    format!("acknowledged send not in the database: {}", op.describe()),
                ));
                break;
            };
            if uuid_of(&result["message_id"]) != Some(row.id)
                || result["seq"].as_i64() != Some(row.seq)
            {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "answer names message {} seq {} but the database holds {} seq {}: {}",
                        result["message_id"],
                        result["seq"],
                        row.id,
                        row.seq,
                        op.describe()
                    ),
                ));
            }
        }
        if let Some(row) = row {
            let digest = first.args["sha256"].as_str().unwrap_or_default();
            if row.sha256 != digest {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "stored body digest {} differs from the one sent {digest}: {}",
                        row.sha256,
                        first.describe()
                    ),
                ));
            }
            // A stored request_id's retry is answered with the original; a
            // final refusal leaves the client thinking it was not stored.
            if let Some(last) = attempts.iter().rev().find(|op| op.outcome.answered())
                && last.outcome.ok().is_none()
                && !last.outcome.retryable()
            {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "request_id {} is stored as {} but its last answer was a refusal, \
                         not the original: {}",
                        key.1,
                        row.id,
                        last.describe()
                    ),
                ));
            }
            // Only refusals that say nothing was changed, no attempt whose
            // outcome is unknown: nothing could have stored it.
            if !attempts.is_empty() && attempts.iter().all(|op| op.outcome.changed_nothing()) {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "a refused send was stored as {}: {}",
                        row.id,
                        first.describe()
                    ),
                ));
            }
        }
    }
    for (key, found) in &rows {
        if !sends.contains_key(key) {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "message {} (request_id {}, seq {}) has no send in the history",
                    found[0].id, key.1, found[0].seq
                ),
            ));
        }
    }
    (sends.len(), violations)
}

fn agent_of(address: &str) -> String {
    address.split('/').next().unwrap_or_default().to_string()
}

/// Each conversation's seqs are exactly 1..N, N its `last_seq`.
pub fn gap_free(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "seqs 1..N without gap";
    let mut violations = Vec::new();
    let mut seqs: HashMap<Uuid, Vec<i64>> = HashMap::new();
    for m in &input.db.messages {
        seqs.entry(m.conversation_id).or_default().push(m.seq);
    }
    for (conversation, last) in &input.db.last_seq {
        let mut found = seqs.remove(conversation).unwrap_or_default();
        found.sort_unstable();
        let expected: Vec<i64> = (1..=*last).collect();
        if found != expected {
            let missing: Vec<i64> = expected
                .iter()
                .filter(|s| found.binary_search(s).is_err())
                .copied()
                .take(10)
                .collect();
            violations.push(Violation::new(
                CHECK,
                format!(
                    "conversation {conversation}: last_seq {last}, {} rows, missing {missing:?}",
                    found.len()
                ),
            ));
        }
    }
    for conversation in seqs.keys() {
        violations.push(Violation::new(
            CHECK,
            format!("messages of conversation {conversation}, which has no row"),
        ));
    }
    (input.db.last_seq.len(), violations)
}

/// Every outbox message ended `stored` (with a locator) or `failed` (its
/// slot failed with a reason); none pending. Synchronous ones are stored.
pub fn outbox_settled(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "outbox settled";
    let mut violations = Vec::new();
    for m in &input.db.messages {
        let ok = match (input.modes.get(&m.conversation_id), m.state.as_str()) {
            (Some(Mode::Outbox), "stored") => m.locator.is_some() && m.slot_state.is_none(),
            (Some(Mode::Outbox), "failed") => {
                m.slot_state.as_deref() == Some("failed")
                    && m.slot_error
                        .as_deref()
                        .is_some_and(|e| !e.trim().is_empty())
            }
            (Some(Mode::Sync), "stored") => true,
            _ => false,
        };
        if !ok {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "message {} (conversation {} seq {}) is {} (locator {:?}, slot {:?}, error {:?})",
                    m.id, m.conversation_id, m.seq, m.state, m.locator, m.slot_state, m.slot_error
                ),
            ));
        }
    }
    (input.db.messages.len(), violations)
}

/// Each stored outbox message is exactly one stream entry, the one its
/// locator names, with its digest; no entry for a message the database
/// does not hold; no publish key (`Nats-Msg-Id`) on two entries.
pub fn stream_entries(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "one stream entry per outbox message";
    let mut violations = Vec::new();
    let mut entries: HashMap<&str, Vec<&super::data::StreamEntry>> = HashMap::new();
    for e in &input.stream {
        entries
            .entry(e.message_id.as_deref().unwrap_or(""))
            .or_default()
            .push(e);
    }
    let mut checked = 0;
    for m in &input.db.messages {
        if input.modes.get(&m.conversation_id) != Some(&Mode::Outbox) {
            continue;
        }
        let id = m.id.to_string();
        let found = entries.remove(id.as_str()).unwrap_or_default();
        if m.state != "stored" {
            if found.len() > 1 {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "{} message {} has {} stream entries",
                        m.state,
                        m.id,
                        found.len()
                    ),
                ));
            }
            continue;
        }
        checked += 1;
        if found.len() != 1 {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "stored message {} (conversation {} seq {}) has {} stream entries {:?}",
                    m.id,
                    m.conversation_id,
                    m.seq,
                    found.len(),
                    found.iter().map(|e| e.sequence).collect::<Vec<_>>()
                ),
            ));
            continue;
        }
        let entry = found[0];
        let locator = format!("jetstream:{}:{}", input.stream_name, entry.sequence);
        if m.locator.as_deref() != Some(locator.as_str()) {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "message {} has locator {:?}, its entry is {locator}",
                    m.id, m.locator
                ),
            ));
        }
        if entry.sha256 != m.sha256 {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "message {}: stream entry {} digest {} differs from the recorded {}",
                    m.id, entry.sequence, entry.sha256, m.sha256
                ),
            ));
        }
    }
    let mut keys: HashMap<&str, Vec<u64>> = HashMap::new();
    for e in &input.stream {
        if let Some(key) = e.publish_key.as_deref() {
            keys.entry(key).or_default().push(e.sequence);
        }
    }
    for (key, sequences) in keys {
        if sequences.len() > 1 {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "publish key {key} is on {} stream entries {sequences:?}",
                    sequences.len()
                ),
            ));
        }
    }
    for (id, found) in entries {
        violations.push(Violation::new(
            CHECK,
            format!(
                "{} stream entries {:?} name message {id:?}, which no outbox message is",
                found.len(),
                found.iter().map(|e| e.sequence).collect::<Vec<_>>()
            ),
        ));
    }
    (checked, violations)
}

/// A page after cursor c holds c+1, c+2, … in order, at most the limit, each
/// the message the database holds at that seq with its digest; its cursor
/// stops before anything pending; and a short page reaches every message
/// whose send was acknowledged before the read began.
pub fn pages(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "reader pages skip nothing";
    let mut violations = Vec::new();
    let by_seq: HashMap<(Uuid, i64), &StoredMessage> = input
        .db
        .messages
        .iter()
        .map(|m| ((m.conversation_id, m.seq), m))
        .collect();
    // Per conversation: (completed_ms, seq) of acknowledged sends, and the
    // running maximum, to ask "what was committed before t".
    let mut acked: HashMap<Uuid, Vec<(u64, i64)>> = HashMap::new();
    for op in input.ops.iter().filter(|op| op.kind == OpKind::Send) {
        if let (Some(r), Some(c)) = (op.outcome.ok(), uuid_of(&op.args["conversation_id"]))
            && let Some(seq) = r["seq"].as_i64()
        {
            acked.entry(c).or_default().push((op.completed_ms, seq));
        }
    }
    for list in acked.values_mut() {
        list.sort_unstable();
        let mut max = 0;
        for entry in list.iter_mut() {
            max = max.max(entry.1);
            entry.1 = max;
        }
    }
    let mut checked = 0;
    for op in input.ops.iter().filter(|op| op.kind == OpKind::Read) {
        let (Some(r), Some(c)) = (op.outcome.ok(), uuid_of(&op.args["conversation_id"])) else {
            continue;
        };
        checked += 1;
        let after = op.args["after_seq"].as_i64().unwrap_or(0);
        let limit = op.args["limit"].as_i64().unwrap_or(50);
        let messages = r["messages"].as_array().cloned().unwrap_or_default();
        let seqs: Vec<i64> = messages.iter().filter_map(|m| m["seq"].as_i64()).collect();
        let expected: Vec<i64> = (after + 1..after + 1 + seqs.len() as i64).collect();
        let mut bad = Vec::new();
        if seqs != expected {
            bad.push(format!("seqs {seqs:?} are not {}..", after + 1));
        }
        if seqs.len() as i64 > limit {
            bad.push(format!("{} messages past the limit {limit}", seqs.len()));
        }
        let next = r["next_after_seq"].as_i64().unwrap_or(after);
        if next < after || next > seqs.last().copied().unwrap_or(after) {
            bad.push(format!("next_after_seq {next} outside {after}..last"));
        }
        for m in &messages {
            let seq = m["seq"].as_i64().unwrap_or(0);
            if m["unavailable"] == "pending_publication" && seq <= next {
                bad.push(format!("cursor {next} passes seq {seq}, still pending"));
            }
            match by_seq.get(&(c, seq)) {
                None => bad.push(format!("seq {seq} is not in the database")),
                Some(row) => {
                    if uuid_of(&m["message_id"]) != Some(row.id) {
                        bad.push(format!(
                            "seq {seq} is message {}, not {}",
                            row.id, m["message_id"]
                        ));
                    }
                    if let Some(digest) = m["sha256"].as_str()
                        && digest != row.sha256
                    {
                        bad.push(format!(
                            "seq {seq}'s body digest differs from the stored one"
                        ));
                    }
                }
            }
        }
        if (seqs.len() as i64) < limit
            && let Some(list) = acked.get(&c)
        {
            let before = list.partition_point(|(done, _)| *done < op.invoked_ms);
            if before > 0 {
                let committed = list[before - 1].1;
                if committed > after && seqs.last().copied().unwrap_or(after) < committed {
                    bad.push(format!(
                        "a short page ends before seq {committed}, acknowledged before the read began"
                    ));
                }
            }
        }
        if !bad.is_empty() {
            violations.push(Violation::new(
                CHECK,
                format!("{}: {}", bad.join("; "), op.describe()),
            ));
        }
    }
    (checked, violations)
}
