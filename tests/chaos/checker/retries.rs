//! Retries that never double: every post, claim, completion, lock and
//! reservation call carries a request_id and is retried with it after an
//! unknown outcome (or sent again once answered). From the history beside
//! the database:
//! - a request_id answered once is answered the same way at every later
//!   attempt, marked `replayed: true`, never refused;
//! - a post's request_id (in its metadata) is at most one channel message,
//!   and exactly the one its answer named when it was acknowledged;
//! - a claim's request_id made at most one `claimed` task event: every
//!   event is the one an answer reported, or one a request_id never
//!   answered may have made;
//! - a task is completed at most once, an acknowledged completion is in
//!   the events, and a completion that happened under a request_id is not
//!   answered with a refusal at its retry.
//!
//! - every write acknowledged under a request_id is the one row the server
//!   keeps for it (`request_ids`), holding the answer the client saw.
//!
//! Locks and reservations: see [`super::holders`].

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::Violation;
use super::data::{Input, RequestRow};
use crate::history::{Op, OpKind};

/// The attempts of each request_id, per window, in the order they ended
/// (one client's attempts are sequential).
pub fn by_request(input: &Input) -> BTreeMap<(&str, &str), Vec<&Op>> {
    let mut groups: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for op in &input.ops {
        if !op.kind.carries_request_id() {
            continue;
        }
        if let Some(request) = op.args["request_id"].as_str() {
            groups
                .entry((op.window.as_str(), request))
                .or_default()
                .push(op);
        }
    }
    groups
}

/// An answer without the mark of a replay; a send's answer by what
/// identifies its message (its publication state may have moved on).
fn essence(op: &Op, result: &Value) -> Value {
    if op.kind == OpKind::Send {
        return serde_json::json!({"message_id": result["message_id"], "seq": result["seq"]});
    }
    let mut result = result.clone();
    if let Some(map) = result.as_object_mut() {
        map.remove("replayed");
    }
    result
}

/// Once a request_id is answered, every later attempt gets the same answer
/// with `replayed: true`, and none is refused.
pub fn replays(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "retries answered with the original";
    let mut violations = Vec::new();
    let mut checked = 0;
    for attempts in by_request(input).values() {
        let Some(at) = attempts.iter().position(|op| op.outcome.ok().is_some()) else {
            continue;
        };
        let first = attempts[at];
        let original = essence(first, first.outcome.ok().expect("an ok outcome"));
        for later in &attempts[at + 1..] {
            if let Some(result) = later.outcome.ok() {
                checked += 1;
                if essence(later, result) != original || result["replayed"] != true {
                    violations.push(Violation::new(
                        CHECK,
                        format!(
                            "answered {original} at first, then {result} (not the original \
                             marked replayed): {}",
                            later.describe()
                        ),
                    ));
                }
            } else if later.outcome.answered() && !later.outcome.retryable() {
                checked += 1;
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "refused although its request_id was answered {original} by op #{}: {}",
                        first.id,
                        later.describe()
                    ),
                ));
            }
        }
    }
    (checked, violations)
}

/// A post's request_id is at most one channel message; an acknowledged
/// post is exactly the message its answer named.
pub fn posts(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "posts once per request_id";
    let mut rows: HashMap<&str, Vec<&super::data::ChannelMessage>> = HashMap::new();
    for m in &input.db.channel_messages {
        if let Some(request) = m.request_id.as_deref() {
            rows.entry(request).or_default().push(m);
        }
    }
    let mut violations = Vec::new();
    for (request, found) in &rows {
        if found.len() > 1 {
            let ids: Vec<String> = found.iter().map(|m| m.id.to_string()).collect();
            violations.push(Violation::new(
                CHECK,
                format!(
                    "request_id {request} is {} channel messages: {}",
                    found.len(),
                    ids.join(", ")
                ),
            ));
        }
    }
    let mut checked = 0;
    for ((_, request), attempts) in by_request(input) {
        if attempts[0].kind != OpKind::Post {
            continue;
        }
        checked += 1;
        let Some(op) = attempts.iter().find(|op| op.outcome.ok().is_some()) else {
            continue;
        };
        let named = op.outcome.ok().expect("an ok outcome")["id"].as_str();
        let found = rows.get(request).map(Vec::as_slice).unwrap_or_default();
        if found.len() != 1 || named != Some(found[0].id.to_string().as_str()) {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "acknowledged post {} is {} channel messages under its request_id: {}",
                    named.unwrap_or("?"),
                    found.len(),
                    op.describe()
                ),
            ));
        }
    }
    (checked, violations)
}

/// How far apart a claim's `claimed_at` and its event's time may be: both
/// are the claiming transaction's `now()`, each cut to milliseconds.
const CLAIM_SLACK_MS: i64 = 2;
/// How long before its first attempt and after its last a completion's
/// event may be (the database's clock beside the client's, one machine).
const EVENT_SLACK_MS: i64 = 1_000;

/// Every `claimed` event is the claim an answer reported (task, window,
/// time) or one a request_id never answered may have made, and a
/// request_id the server noted on its events made at most one.
pub fn claims(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "claims once per request_id";
    let mut violations = Vec::new();
    let mut noted: HashMap<&str, usize> = HashMap::new();
    // window → its claimed events (key, ms, whether an answer reported it).
    let mut events: HashMap<&str, Vec<(&str, i64, bool)>> = HashMap::new();
    for e in input.db.task_events.iter().filter(|e| e.kind == "claimed") {
        events
            .entry(e.window.as_str())
            .or_default()
            .push((e.key.as_str(), e.at_us / 1000, false));
        if let Some(request) = e.request_id.as_deref() {
            *noted.entry(request).or_default() += 1;
        }
    }
    for (request, n) in noted.iter().filter(|(_, n)| **n > 1) {
        violations.push(Violation::new(
            CHECK,
            format!("request_id {request} made {n} claimed task events"),
        ));
    }
    let mut unanswered: HashMap<&str, usize> = HashMap::new();
    let mut checked = 0;
    for ((window, _), attempts) in by_request(input) {
        if !matches!(attempts[0].kind, OpKind::ClaimNext | OpKind::Claim) {
            continue;
        }
        checked += 1;
        let Some(op) = attempts.iter().find(|op| op.outcome.ok().is_some()) else {
            if attempts.iter().any(|op| !op.outcome.changed_nothing()) {
                *unanswered.entry(window).or_default() += 1;
            }
            continue;
        };
        let r = op.outcome.ok().expect("an ok outcome");
        if r["claimed"] != true {
            continue;
        }
        let (key, at) = (
            r["key"].as_str().unwrap_or_default(),
            r["claimed_ms"].as_i64(),
        );
        // (Claiming a task the window holds extends it: that answer
        // reports the claim that took it, as the first did.)
        let mine = events.entry(window).or_default();
        let found = at.and_then(|at| {
            mine.iter()
                .position(|(k, ms, _)| *k == key && (ms - at).abs() <= CLAIM_SLACK_MS)
        });
        match found {
            Some(i) => mine[i].2 = true,
            None => violations.push(Violation::new(
                CHECK,
                format!(
                    "acknowledged claim of {key} has no claimed task event: {}",
                    op.describe()
                ),
            )),
        }
    }
    for (window, list) in &events {
        let left: Vec<(&str, i64)> = list
            .iter()
            .filter(|(_, _, reported)| !reported)
            .map(|(key, ms, _)| (*key, *ms))
            .collect();
        let most = unanswered.get(window).copied().unwrap_or(0);
        if left.len() > most {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "{window} has {} claimed task events no answer reported ({left:?}, \
                     task and database ms) but only {most} claims whose answer was lost: a \
                     claim happened twice",
                    left.len()
                ),
            ));
        }
    }
    (checked, violations)
}

/// A task is completed once; an acknowledged completion is in the events;
/// a completion made under a request_id is not answered with a refusal at
/// its retry.
pub fn completions(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "completions once per request_id";
    let mut violations = Vec::new();
    // key → (window, ms) of each completed event.
    let mut done: HashMap<&str, Vec<(&str, i64)>> = HashMap::new();
    for e in input
        .db
        .task_events
        .iter()
        .filter(|e| e.kind == "completed")
    {
        done.entry(e.key.as_str())
            .or_default()
            .push((e.window.as_str(), e.at_us / 1000));
    }
    for (key, list) in done.iter().filter(|(_, l)| l.len() > 1) {
        violations.push(Violation::new(
            CHECK,
            format!("task {key} completed {} times: {list:?}", list.len()),
        ));
    }
    let requests = by_request(input);
    // Completions answered ok, by task and window: a completed event they
    // explain is theirs, not an unknown attempt's under another id.
    let acknowledged: HashMap<(&str, &str), Vec<&str>> = requests
        .iter()
        .filter(|(_, attempts)| attempts[0].kind == OpKind::Complete)
        .filter(|(_, attempts)| attempts.iter().any(|op| op.outcome.ok().is_some()))
        .fold(HashMap::new(), |mut map, ((window, request), attempts)| {
            let key = attempts[0].args["key"].as_str().unwrap_or_default();
            map.entry((key, *window)).or_default().push(*request);
            map
        });
    let mut checked = 0;
    for ((window, request), attempts) in requests.iter().map(|(k, v)| (*k, v)) {
        if attempts[0].kind != OpKind::Complete {
            continue;
        }
        checked += 1;
        let key = attempts[0].args["key"].as_str().unwrap_or_default();
        let mine = done
            .get(key)
            .into_iter()
            .flatten()
            .any(|(w, _)| *w == window);
        if let Some(op) = attempts.iter().find(|op| op.outcome.ok().is_some()) {
            if !mine {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "acknowledged completion of {key} has no completed event by {window}: {}",
                        op.describe()
                    ),
                ));
            }
            continue;
        }
        // Refused at last after an unknown attempt, while the task was
        // completed by this window during the attempts, and no other
        // acknowledged completion of this window explains that event (a
        // task is completed once, checked above): the retry should have
        // been answered with the completion. Where the server keeps the
        // request ids, its row says whether this id's write took effect.
        let other_acknowledged = acknowledged
            .get(&(key, window))
            .is_some_and(|ids| ids.iter().any(|id| *id != request));
        let recorded = input.db.requests.as_ref().map(|rows| {
            rows.iter()
                .any(|r| r.window == window && r.request_id == request)
        });
        let from = input.epoch_ms(attempts[0].invoked_ms) - EVENT_SLACK_MS;
        let to = input.epoch_ms(attempts[attempts.len() - 1].completed_ms) + EVENT_SLACK_MS;
        let during = done
            .get(key)
            .into_iter()
            .flatten()
            .any(|(w, ms)| *w == window && (from..=to).contains(ms));
        let last = attempts[attempts.len() - 1];
        let refused = last.outcome.answered() && !last.outcome.retryable();
        let took_effect = recorded.unwrap_or(during && !other_acknowledged);
        if took_effect && refused && attempts.iter().any(|op| !op.outcome.answered()) {
            violations.push(Violation::new(
                CHECK,
                format!(
                    "{key} was completed by {window} under request_id {request}, but its retry \
                     was refused: {}",
                    last.describe()
                ),
            ));
        }
    }
    (checked, violations)
}

/// Every write acknowledged under a request_id is one `request_ids` row
/// (the window's, of that tool) holding the answer the client saw first;
/// no id is recorded whose every attempt was refused with nothing changed.
/// Judged only against a server that keeps the table.
pub fn recorded(input: &Input) -> (usize, Vec<Violation>) {
    const CHECK: &str = "acknowledged writes recorded once";
    let Some(rows) = &input.db.requests else {
        return (0, Vec::new());
    };
    let rows: HashMap<(&str, &str), &RequestRow> = rows
        .iter()
        .map(|r| ((r.window.as_str(), r.request_id.as_str()), r))
        .collect();
    let mut violations = Vec::new();
    let mut checked = 0;
    for ((window, request), attempts) in by_request(input) {
        // Conversation sends keep their request_id on the message.
        if attempts[0].kind == OpKind::Send {
            continue;
        }
        checked += 1;
        let row = rows.get(&(window, request));
        let Some(op) = attempts.iter().find(|op| op.outcome.ok().is_some()) else {
            if row.is_some() && attempts.iter().all(|op| op.outcome.changed_nothing()) {
                violations.push(Violation::new(
                    CHECK,
                    format!(
                        "request_id {request} is recorded although every attempt was refused \
                         with nothing changed: {}",
                        attempts[0].describe()
                    ),
                ));
            }
            continue;
        };
        let seen = essence(op, op.outcome.ok().expect("an ok outcome"));
        let stored = row.and_then(|r| r.answer.as_ref().map(|a| (r, essence(op, a))));
        match stored {
            Some((row, answer)) if row.tool == op.kind.tool() && answer == seen => {}
            _ => violations.push(Violation::new(
                CHECK,
                format!(
                    "acknowledged {seen} but the server recorded {}: {}",
                    row.map_or("nothing".to_string(), |r| format!(
                        "{} answering {}",
                        r.tool,
                        r.answer.clone().unwrap_or_default()
                    )),
                    op.describe()
                ),
            )),
        }
    }
    (checked, violations)
}
