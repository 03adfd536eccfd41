//! Channel checks: every post a client heard about is stored once with its
//! body; a window's `only_new` reads of a channel go forward without
//! repeating or skipping a message (positions are commit-ordered, so what a
//! reader can see is a prefix).

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use super::Violation;
use super::data::{ChannelMessage, Input};
use crate::history::{OpKind, Outcome};

fn uuid_of(value: &serde_json::Value) -> Option<Uuid> {
    value.as_str()?.parse().ok()
}

fn by_id(input: &Input) -> HashMap<Uuid, &ChannelMessage> {
    input
        .db
        .channel_messages
        .iter()
        .map(|m| (m.id, m))
        .collect()
}

/// An acknowledged post is one row with the body's digest; no more rows
/// from a window than its posts that were acknowledged or whose outcome is
/// unknown.
pub fn posts(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "channel posts stored once";
    let rows = by_id(input);
    let mut violations = Vec::new();
    let mut checked = 0;
    let mut allowed: HashMap<&str, usize> = HashMap::new();
    for op in input.ops.iter().filter(|op| op.kind == OpKind::Post) {
        match &op.outcome {
            Outcome::Ok { result } => {
                checked += 1;
                *allowed.entry(op.window.as_str()).or_default() += 1;
                match uuid_of(&result["id"]).and_then(|id| rows.get(&id)) {
                    None => violations.push(Violation::new(
                        CHECK,
                        format!("acknowledged post not in the database: {}", op.describe()),
                    )),
                    Some(row) => {
                        if Some(row.sha256.as_str()) != op.args["sha256"].as_str()
                            || Some(row.channel.as_str()) != op.args["channel"].as_str()
                        {
                            violations.push(Violation::new(
                                CHECK,
                                format!(
                                    "post {} stored with another body or channel: {}",
                                    row.id,
                                    op.describe()
                                ),
                            ));
                        }
                    }
                }
            }
            // No answer, or a refusal saying the connection broke after
            // the statement was sent: it may have stored the post.
            Outcome::Failed { .. } | Outcome::Refused { .. } if op.outcome.unknown() => {
                *allowed.entry(op.window.as_str()).or_default() += 1
            }
            Outcome::Failed { .. } | Outcome::Refused { .. } => {}
        }
    }
    let mut stored: HashMap<&str, usize> = HashMap::new();
    for m in &input.db.channel_messages {
        *stored.entry(m.sender.as_str()).or_default() += 1;
    }
    for (window, count) in stored {
        let most = allowed.get(window).copied().unwrap_or(0);
        if count > most {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "{window} has {count} channel messages stored but made at most {most} posts"
                ),
            ));
        }
    }
    (checked, violations)
}

/// Per window and channel, consecutive answered `only_new` reads: each
/// returns, in position order, the next messages not from this window,
/// without repeating or skipping one. A read with an unknown outcome (no
/// answer, or refused because the connection broke after the statement was
/// sent) may have moved the cursor, so the chain restarts after it.
pub fn reads(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "channel reads skip nothing";
    let rows = by_id(input);
    let mut by_channel: HashMap<&str, Vec<&ChannelMessage>> = HashMap::new();
    for m in &input.db.channel_messages {
        by_channel.entry(m.channel.as_str()).or_default().push(m);
    }
    for list in by_channel.values_mut() {
        list.sort_by_key(|m| m.position);
    }
    let mut violations = Vec::new();
    let mut checked = 0;
    // (window, channel) → last position seen, None after an unknown outcome.
    let mut last: BTreeMap<(&str, &str), Option<i64>> = BTreeMap::new();
    for op in input.ops.iter().filter(|op| op.kind == OpKind::ReadChannel) {
        let channel = op.args["scope"].as_str().unwrap_or_default();
        let key = (op.window.as_str(), channel);
        let Some(r) = op.outcome.ok() else {
            if op.outcome.unknown() {
                last.insert(key, None);
            }
            continue;
        };
        checked += 1;
        let mut positions = Vec::new();
        for id in r["ids"].as_array().into_iter().flatten() {
            match uuid_of(id).and_then(|id| rows.get(&id)) {
                Some(m) if m.channel == channel => positions.push(m.position),
                _ => violations.push(Violation::new(
                    CHECK,
                    format!(
                        "read returned {id}, not a message of {channel}: {}",
                        op.describe()
                    ),
                )),
            }
        }
        let previous = last.get(&key).copied().flatten();
        if let (Some(from), Some(&first)) = (previous, positions.first()) {
            let expected = by_channel
                .get(channel)
                .into_iter()
                .flatten()
                .filter(|m| m.sender != op.window && m.position > from)
                .map(|m| m.position)
                .take(positions.len())
                .collect::<Vec<_>>();
            if positions != expected {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "after position {from} the read returned {positions:?}, the channel holds {expected:?} (first {first}): {}",
                        op.describe()
                    ),
                ));
            }
        } else if positions.windows(2).any(|w| w[0] >= w[1]) {
            violations.push(Violation::new(
                CHECK,
                format!("positions {positions:?} out of order: {}", op.describe()),
            ));
        }
        let next = positions.last().copied().or(previous);
        if last.contains_key(&key) || next.is_some() {
            last.insert(key, next);
        }
    }
    (checked, violations)
}
