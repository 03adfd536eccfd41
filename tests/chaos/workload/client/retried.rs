//! Writes retried with their request_id: posts, claims, completions, locks
//! and path reservations carry a fresh UUID; while a call's outcome is
//! unknown (no answer, an HTTP error, `unavailable`) the client sends the
//! same call with the same id again, backing off so the retries span a
//! fault, and every attempt is recorded with its number (`attempt`). Now
//! and then an answered write is sent once more with its id, as a client
//! does that lost the answer, even after the state moved on (a lock
//! released, a reservation given back): it must be answered with the
//! original (`replayed: true`) and change nothing. The quiet period
//! finishes what is still unknown ([`arguments_of`] rebuilds the call).

use rand::Rng as _;
use serde_json::{Value, json};

use super::Client;
use crate::history::{Op, OpKind};
use crate::workload::pause;

/// Attempts of one write before the client moves on; the quiet period
/// retries what is still unknown.
const ATTEMPTS: usize = 4;
/// The first retry's pause; each next one doubles it (jittered), so four
/// attempts span ~6 s, most of a quick profile's fault.
const BACKOFF_MS: u64 = 200;
/// How often an answered write is sent again with its request_id.
const REPEAT: f64 = 0.08;
/// Locks and reservation patterns the windows contend for.
const LOCKS: [&str; 2] = ["chaos-lock-0", "chaos-lock-1"];
const PATTERNS: [&str; 2] = ["chaos/a/**", "chaos/b/**"];
/// Short, so a lock or pattern changes hands during the run, and a repeat
/// of its acquire comes after another window may hold it.
const TTL_SECS: i64 = 10;

/// What the client recorded beside a call's arguments (not sent again).
const EXTRA: [&str; 4] = ["attempt", "sha256", "late", "repeat"];

/// A lock or reservation this window took: the call that took it.
pub struct Taken {
    pub name: String,
    pub arguments: Value,
}

/// The arguments an attempt was sent with (its record without what the
/// client noted beside them).
pub fn arguments_of(op: &Op) -> Value {
    let mut args = op.args.clone();
    if let Some(map) = args.as_object_mut() {
        for key in EXTRA {
            map.remove(key);
        }
    }
    args
}

impl Client {
    /// Call `kind` with `arguments` (carrying its `request_id`) until the
    /// outcome is known, at most [`ATTEMPTS`] times: calls made and the last
    /// attempt.
    pub async fn retried(&mut self, kind: OpKind, arguments: Value, extra: Value) -> (usize, Op) {
        let mut attempt = 0;
        loop {
            let mut noted = json!({"attempt": attempt});
            if let (Some(map), Value::Object(extra)) = (noted.as_object_mut(), extra.clone()) {
                map.extend(extra);
            }
            let op = self.call(kind, arguments.clone(), noted).await;
            attempt += 1;
            if !op.outcome.retryable() || attempt == ATTEMPTS {
                return (attempt, op);
            }
            let base = BACKOFF_MS << (attempt - 1);
            pause(self.rng.random_range(base..2 * base)).await;
        }
    }

    /// [`Client::retried`], then now and then the same call once more
    /// (`repeat: true`) once answered: calls made.
    pub async fn write(&mut self, kind: OpKind, arguments: Value, extra: Value) -> usize {
        let (calls, op) = self.retried(kind, arguments.clone(), extra.clone()).await;
        if op.outcome.ok().is_some() && self.rng.random_bool(REPEAT) {
            return calls + self.repeat(kind, arguments, extra).await;
        }
        calls
    }

    /// Send an answered call again with its request_id: calls made.
    async fn repeat(&mut self, kind: OpKind, arguments: Value, extra: Value) -> usize {
        let mut extra = extra;
        if let Some(map) = extra.as_object_mut() {
            map.insert("repeat".into(), json!(true));
        }
        self.retried(kind, arguments, extra).await.0
    }

    /// Release a lock this window holds (then maybe repeat the acquire that
    /// took it, which must not take it again), or acquire one.
    pub(super) async fn lock(&mut self) -> usize {
        if let Some(taken) = self.locks.pop() {
            let request_id = self.uuid();
            let mut calls = self
                .write(
                    OpKind::ReleaseLock,
                    json!({"name": taken.name, "request_id": request_id}),
                    json!({}),
                )
                .await;
            if self.rng.random_bool(REPEAT * 2.0) {
                calls += self
                    .repeat(OpKind::AcquireLock, taken.arguments, json!({}))
                    .await;
            }
            return calls;
        }
        let name = LOCKS[self.rng.random_range(0..LOCKS.len())].to_string();
        let request_id = self.uuid();
        let arguments = json!({"name": name, "ttl_seconds": TTL_SECS,
                               "purpose": format!("chaos {}", self.address),
                               "request_id": request_id});
        let (calls, op) = self
            .retried(OpKind::AcquireLock, arguments.clone(), json!({}))
            .await;
        if op.outcome.ok().is_some() {
            self.locks.push(Taken { name, arguments });
        }
        calls
    }

    /// Release a pattern this window reserved (then maybe repeat the
    /// reservation), or reserve one exclusively.
    pub(super) async fn reservation(&mut self) -> usize {
        if let Some(taken) = self.paths.pop() {
            let request_id = self.uuid();
            let mut calls = self
                .write(
                    OpKind::ReleasePaths,
                    json!({"paths": [taken.name], "request_id": request_id}),
                    json!({}),
                )
                .await;
            if self.rng.random_bool(REPEAT * 2.0) {
                calls += self
                    .repeat(OpKind::ReservePaths, taken.arguments, json!({}))
                    .await;
            }
            return calls;
        }
        let pattern = PATTERNS[self.rng.random_range(0..PATTERNS.len())].to_string();
        let request_id = self.uuid();
        let arguments = json!({"paths": [pattern], "exclusive": true, "ttl_seconds": TTL_SECS,
                               "reason": format!("chaos {}", self.address),
                               "request_id": request_id});
        let (calls, op) = self
            .retried(OpKind::ReservePaths, arguments.clone(), json!({}))
            .await;
        if op.outcome.ok().is_some() {
            self.paths.push(Taken {
                name: pattern,
                arguments,
            });
        }
        calls
    }
}

/// The fields of a lock or reservation answer the checks need (times as
/// epoch ms).
pub fn compact_holding(kind: OpKind, r: &Value) -> Value {
    match kind {
        OpKind::AcquireLock => json!({
            "name": r["name"], "holder": r["holder"], "extended": r["extended"],
            "acquired_ms": super::epoch_ms(&r["acquired_at"]), "expires_ms": super::epoch_ms(&r["expires_at"]),
        }),
        OpKind::ReleaseLock => json!({
            "name": r["name"], "released": r["released"], "had_expired": r["had_expired"],
        }),
        OpKind::ReservePaths => {
            let granted: Vec<Value> = r["granted"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| {
                    json!({
                        "pattern": g["pattern"], "holder": g["holder"], "extended": g["extended"],
                        "created_ms": super::epoch_ms(&g["created_at"]),
                        "expires_ms": super::epoch_ms(&g["expires_at"]),
                    })
                })
                .collect();
            let refused: Vec<Value> = r["refused"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| p["pattern"].clone())
                .collect();
            json!({"granted": granted, "refused": refused})
        }
        OpKind::ReleasePaths => json!({"released": r["released"], "not_held": r["not_held"]}),
        _ => r.clone(),
    }
}
