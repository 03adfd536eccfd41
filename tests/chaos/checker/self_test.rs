//! The checker's own test: a small made-up run that breaks no promise, then
//! at least one breakage per check; every check must pass the first and
//! catch each of its breakages. Plain `#[test]`s do not run in this
//! libtest-less target, so `main` calls [`self_test`] (e.g. behind a
//! `--self-test` flag).

use std::collections::HashMap;

use serde_json::{Value, json};
use uuid::Uuid;

use super::data::{
    ChannelMessage, Db, Input, Receipt, RequestRow, StoredMessage, StreamEntry, TaskEvent,
};
use super::run_checks;
use crate::history::{Op, OpKind, Outcome};
use crate::model::{AppliedFault, FaultKind};
use crate::workload::Mode;

const W0: &str = "a0/w0";
const W1: &str = "a1/w1";
const STREAM: &str = "ACS_T_test";

fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn op(kind: OpKind, window: &str, args: Value, at: u64, outcome: Outcome) -> Op {
    Op {
        id: 0,
        client: 0,
        replica: 0,
        window: window.to_string(),
        kind,
        phase: "load",
        args,
        invoked_ms: at,
        completed_ms: at + 5,
        outcome,
    }
}

fn ok(result: Value) -> Outcome {
    Outcome::Ok { result }
}

/// One outbox message sent, read, handed out, confirmed (twice),
/// acknowledged; one task claimed and completed in time; two channel posts
/// read in order.
fn base() -> Input {
    let (conversation, message, request) = (id(1), id(2), id(3));
    let (post1, post2) = (id(10), id(11));
    let ops: Vec<Op> = vec![
        op(
            OpKind::Send,
            W0,
            json!({"conversation_id": conversation, "request_id": request, "sha256": "d1"}),
            100,
            ok(json!({"message_id": message, "seq": 1})),
        ),
        op(
            OpKind::Read,
            W1,
            json!({"conversation_id": conversation, "after_seq": 0, "limit": 50}),
            200,
            ok(
                json!({"next_after_seq": 1, "messages": [{"seq": 1, "message_id": message, "sha256": "d1"}]}),
            ),
        ),
        op(
            OpKind::Fetch,
            W1,
            json!({"limit": 20}),
            300,
            ok(
                json!({"deliveries": [{"kind": "message", "message_id": message, "conversation_id": conversation, "seq": 1, "delivery_id": id(4)}]}),
            ),
        ),
        op(
            OpKind::Confirm,
            W1,
            json!({"delivery_ids": [id(4)], "repeat": false}),
            310,
            ok(json!({"confirmed": 1, "already_confirmed": 0, "unknown": []})),
        ),
        op(
            OpKind::Confirm,
            W1,
            json!({"delivery_ids": [id(4)], "repeat": true}),
            320,
            ok(json!({"confirmed": 0, "already_confirmed": 1, "unknown": []})),
        ),
        op(
            OpKind::Ack,
            W1,
            json!({"message_id": message}),
            330,
            ok(json!({})),
        ),
        op(
            OpKind::ClaimNext,
            W0,
            json!({"lease_seconds": 30, "request_id": id(30), "attempt": 0}),
            1_000,
            ok(
                json!({"claimed": true, "key": "t", "holder": W0, "claimed_ms": 1_000, "lease_expires_ms": 31_000}),
            ),
        ),
        op(
            OpKind::Complete,
            W0,
            json!({"key": "t", "request_id": id(31), "attempt": 0}),
            10_000,
            ok(json!({"key": "t"})),
        ),
        op(
            OpKind::Post,
            W0,
            json!({"channel": "ch", "sha256": "e1", "request_id": id(20)}),
            400,
            ok(json!({"id": post1})),
        ),
        op(
            OpKind::Post,
            W0,
            json!({"channel": "ch", "sha256": "e2", "request_id": id(21)}),
            410,
            ok(json!({"id": post2})),
        ),
        op(
            OpKind::ReadChannel,
            W1,
            json!({"scope": "ch"}),
            500,
            ok(json!({"ids": [post1]})),
        ),
        op(
            OpKind::ReadChannel,
            W1,
            json!({"scope": "ch"}),
            510,
            ok(json!({"ids": [post2]})),
        ),
    ]
    .into_iter()
    .chain(retried_ops(post1))
    .collect();
    let channel = |id, position, sha: &str, request: Uuid| ChannelMessage {
        id,
        channel: "ch".into(),
        position,
        sender: W0.into(),
        sha256: sha.into(),
        request_id: Some(request.to_string()),
    };
    let mut input = Input {
        ops,
        db: Db {
            messages: vec![StoredMessage {
                id: message,
                conversation_id: conversation,
                seq: 1,
                sender: W0.into(),
                request_id: request,
                sha256: "d1".into(),
                state: "stored".into(),
                locator: Some(format!("jetstream:{STREAM}:1")),
                slot_state: None,
                slot_error: None,
            }],
            last_seq: HashMap::from([(conversation, 1)]),
            receipts: vec![Receipt {
                message_id: message,
                window: W1.into(),
                delivered: true,
                acknowledged: true,
            }],
            task_events: vec![
                TaskEvent {
                    key: "t".into(),
                    at_us: 1_000_000,
                    kind: "claimed".into(),
                    window: W0.into(),
                    lease_seconds: Some(30),
                    request_id: None,
                },
                TaskEvent {
                    key: "t".into(),
                    at_us: 10_000_000,
                    kind: "completed".into(),
                    window: W0.into(),
                    lease_seconds: None,
                    request_id: None,
                },
            ],
            channel_messages: vec![
                channel(post1, 1, "e1", id(20)),
                channel(post2, 2, "e2", id(21)),
            ],
            requests: None,
        },
        stream: vec![StreamEntry {
            sequence: 1,
            message_id: Some(message.to_string()),
            publish_key: None,
            sha256: "d1".into(),
        }],
        stream_name: STREAM.into(),
        modes: HashMap::from([(conversation, Mode::Outbox)]),
        faults: vec![AppliedFault {
            kind: FaultKind::RestartPostgres,
            target: "postgres".into(),
            started_ms: 50_000,
            ended_ms: Some(55_000),
        }],
        epoch_at_zero: 0,
    };
    input.db.requests = Some(recorded(&input.ops));
    input
}

/// The `request_ids` rows a server keeps for `ops`: each write answered
/// under a request_id (other than a send), with its first answer.
fn recorded(ops: &[Op]) -> Vec<RequestRow> {
    let mut rows: Vec<RequestRow> = Vec::new();
    for op in ops {
        let (Some(result), Some(request)) = (op.outcome.ok(), op.args["request_id"].as_str())
        else {
            continue;
        };
        if op.kind == OpKind::Send
            || rows
                .iter()
                .any(|r| r.window == op.window && r.request_id == request)
        {
            continue;
        }
        rows.push(RequestRow {
            window: op.window.clone(),
            request_id: request.to_string(),
            tool: op.kind.tool().to_string(),
            answer: Some(result.clone()),
        });
    }
    rows
}

/// Writes with request_ids: the first post sent again and answered with
/// the original; a lock taken, released, taken by another window, and the
/// first acquire repeated (answered with the original, not taken back); a
/// pattern reserved, released and reserved by another window.
fn retried_ops(post1: Uuid) -> Vec<Op> {
    let lock = |window: &str, from: u64, replayed: bool| {
        json!({"name": "l", "holder": window, "extended": false, "acquired_ms": from,
               "expires_ms": from + 10_000, "replayed": replayed.then_some(true)})
    };
    let reserved = |window: &str, from: u64| {
        json!({"granted": [{"pattern": "p/**", "holder": window, "extended": false,
               "created_ms": from, "expires_ms": from + 10_000}], "refused": []})
    };
    vec![
        op(
            OpKind::Post,
            W0,
            json!({"channel": "ch", "sha256": "e1", "request_id": id(20), "repeat": true}),
            600,
            ok(json!({"id": post1, "replayed": true})),
        ),
        op(
            OpKind::AcquireLock,
            W0,
            json!({"name": "l", "request_id": id(40)}),
            2_000,
            ok(lock(W0, 2_000, false)),
        ),
        op(
            OpKind::ReleaseLock,
            W0,
            json!({"name": "l", "request_id": id(41)}),
            3_000,
            ok(json!({"name": "l", "released": true, "had_expired": false})),
        ),
        op(
            OpKind::AcquireLock,
            W1,
            json!({"name": "l", "request_id": id(42)}),
            4_000,
            ok(lock(W1, 4_000, false)),
        ),
        op(
            OpKind::AcquireLock,
            W0,
            json!({"name": "l", "request_id": id(40), "repeat": true}),
            5_000,
            ok(lock(W0, 2_000, true)),
        ),
        op(
            OpKind::ReservePaths,
            W0,
            json!({"paths": ["p/**"], "request_id": id(50)}),
            2_000,
            ok(reserved(W0, 2_000)),
        ),
        op(
            OpKind::ReleasePaths,
            W0,
            json!({"paths": ["p/**"], "request_id": id(51)}),
            3_000,
            ok(json!({"released": ["p/**"], "not_held": []})),
        ),
        op(
            OpKind::ReservePaths,
            W1,
            json!({"paths": ["p/**"], "request_id": id(52)}),
            4_000,
            ok(reserved(W1, 4_000)),
        ),
    ]
}

/// The index of the first op of `kind` with `request_id` (and `repeat`).
fn find(i: &Input, kind: OpKind, request: Uuid, repeat: bool) -> usize {
    i.ops
        .iter()
        .position(|o| {
            o.kind == kind
                && o.args["request_id"] == json!(request)
                && (o.args["repeat"] == true) == repeat
        })
        .expect("the self-test's op")
}

type Breakage = fn(&mut Input);

/// Per check, one breakage it must report.
fn breakages() -> Vec<(&'static str, Breakage)> {
    let mut all: Vec<(&'static str, Breakage)> = vec![
        ("sends stored exactly once", |i| {
            let mut twin = i.db.messages[0].clone();
            twin.id = id(99);
            i.db.messages.push(twin);
        }),
        ("sends stored exactly once", |i| {
            // A retry of the stored send refused instead of answered with
            // the original.
            let mut retry = i.ops[0].clone();
            retry.invoked_ms = 20_000;
            retry.completed_ms = 20_005;
            retry.outcome = Outcome::Refused {
                kind: "conflict".into(),
                message: "this send could not be stored; nothing was changed.".into(),
            };
            i.ops.push(retry);
        }),
        ("seqs 1..N without gap", |i| {
            i.db.last_seq.insert(id(1), 2);
        }),
        ("outbox settled", |i| {
            i.db.messages[0].state = "pending_publication".into()
        }),
        ("one stream entry per outbox message", |i| {
            let mut twin = i.stream[0].clone();
            twin.sequence = 2;
            i.stream.push(twin);
        }),
        ("reader pages skip nothing", |i| {
            i.ops[1].outcome = ok(json!({"next_after_seq": 0, "messages": []}));
        }),
        ("one lease holder (task events)", |i| {
            i.db.task_events.insert(
                1,
                TaskEvent {
                    key: "t".into(),
                    at_us: 5_000_000,
                    kind: "claimed".into(),
                    window: W1.into(),
                    lease_seconds: Some(30),
                    request_id: None,
                },
            );
        }),
        ("one lease holder (client view)", |i| {
            i.ops[7].invoked_ms = 40_000;
            i.ops[7].completed_ms = 40_005;
        }),
        ("inbox references handed out", |i| {
            i.db.receipts.push(Receipt {
                message_id: id(2),
                window: "a2/w2".into(),
                delivered: true,
                acknowledged: false,
            });
        }),
        ("confirmation idempotent", |i| {
            i.ops[4].outcome = ok(json!({"confirmed": 1, "already_confirmed": 0, "unknown": []}));
        }),
        ("acknowledgements recorded", |i| {
            i.db.receipts[0].acknowledged = false
        }),
        ("channel posts stored once", |i| {
            i.db.channel_messages[0].sha256 = "other".into()
        }),
        ("channel reads skip nothing", |i| {
            i.ops[11].outcome = ok(json!({"ids": [id(10)]}));
        }),
        ("no 5xx but 503 in a PostgreSQL outage", |i| {
            i.ops.push(op(
                OpKind::Read,
                W1,
                json!({}),
                20_000,
                Outcome::Failed {
                    status: Some(503),
                    message: "database unavailable".into(),
                },
            ));
        }),
    ];
    all.extend(retry_breakages());
    all
}

/// Per check of writes retried with their request_id, what it must report.
fn retry_breakages() -> Vec<(&'static str, Breakage)> {
    vec![
        ("retries answered with the original", |i| {
            // The repeated acquire took the lock afresh instead of
            // answering the original.
            let k = find(i, OpKind::AcquireLock, id(40), true);
            i.ops[k].outcome = ok(
                json!({"name": "l", "holder": W0, "extended": false, "acquired_ms": 5_000,
                       "expires_ms": 15_000, "replayed": null}),
            );
        }),
        ("retries answered with the original", |i| {
            // The repeated post refused instead of answered.
            let k = find(i, OpKind::Post, id(20), true);
            i.ops[k].outcome = Outcome::Refused {
                kind: "conflict".into(),
                message: "already posted".into(),
            };
        }),
        ("posts once per request_id", |i| {
            // A retried post stored twice.
            let mut twin = i.db.channel_messages[0].clone();
            twin.id = id(12);
            twin.position = 3;
            i.db.channel_messages.push(twin);
        }),
        ("claims once per request_id", |i| {
            // The claim's lost first attempt claimed task u, its retry
            // claimed t afresh.
            i.db.task_events.insert(
                0,
                TaskEvent {
                    key: "u".into(),
                    at_us: 900_000,
                    kind: "claimed".into(),
                    window: W0.into(),
                    lease_seconds: Some(30),
                    request_id: None,
                },
            );
        }),
        ("completions once per request_id", |i| {
            let mut twin = i.db.task_events[1].clone();
            twin.at_us += 500_000;
            i.db.task_events.push(twin);
        }),
        ("completions once per request_id", |i| {
            // The completion's answer was lost, and its retry refused.
            let k = find(i, OpKind::Complete, id(31), false);
            let mut retry = i.ops[k].clone();
            i.ops[k].outcome = Outcome::Failed {
                status: None,
                message: "connection reset".into(),
            };
            retry.invoked_ms += 100;
            retry.completed_ms += 100;
            retry.outcome = Outcome::Refused {
                kind: "not_held".into(),
                message: "task t is done".into(),
            };
            i.ops.insert(k + 1, retry);
        }),
        ("acknowledged writes recorded once", |i| {
            // An acknowledged post the server kept no request_id for.
            let rows = i.db.requests.as_mut().expect("rows");
            rows.retain(|r| r.request_id != id(20).to_string());
        }),
        ("acknowledged writes recorded once", |i| {
            // The lock's request_id recorded with another answer than the
            // one the client saw.
            let rows = i.db.requests.as_mut().expect("rows");
            for r in rows
                .iter_mut()
                .filter(|r| r.request_id == id(40).to_string())
            {
                r.answer = Some(json!({"name": "l", "holder": W0, "acquired_ms": 9_999}));
            }
        }),
        ("locks held by one window", |i| {
            let k = find(i, OpKind::ReleaseLock, id(41), false);
            i.ops[k].outcome = ok(json!({"name": "l", "released": false, "had_expired": false}));
        }),
        ("reservations held by one window", |i| {
            let k = find(i, OpKind::ReleasePaths, id(51), false);
            i.ops[k].outcome = ok(json!({"released": [], "not_held": ["p/**"]}));
        }),
    ]
}

/// Ok when the made-up run passes every check and each breakage is caught
/// by its check; otherwise says which check missed what.
/// Runs that break no promise although they look odd: each must pass.
fn clean_variants() -> Vec<(&'static str, Breakage)> {
    vec![
        (
            "a post refused because the connection broke was stored",
            |i| {
                let stored = ChannelMessage {
                    id: id(13),
                    position: 3,
                    sender: W1.into(),
                    request_id: None,
                    ..i.db.channel_messages[0].clone()
                };
                i.db.channel_messages.push(stored);
                i.ops.push(op(
                    OpKind::Post,
                    W1,
                    json!({"channel": "ch", "sha256": "e1"}),
                    700,
                    Outcome::Refused {
                        kind: "unavailable".into(),
                        message: "the database connection broke during this request: if it \
                                  was a change, it may or may not have been made"
                            .into(),
                    },
                ));
            },
        ),
        (
            "a completion whose attempts were lost runs at a retry under the window's next claim",
            |i| {
                // The completion's first attempt comes after the lease ended
                // and is lost; W0 claims t again; the retry completes it.
                let k = find(i, OpKind::Complete, id(31), false);
                i.ops[k].invoked_ms = 35_000;
                i.ops[k].completed_ms = 35_005;
                let mut retry = i.ops[k].clone();
                i.ops[k].outcome = Outcome::Failed {
                    status: None,
                    message: "connection reset".into(),
                };
                retry.args["attempt"] = json!(1);
                retry.invoked_ms = 45_000;
                retry.completed_ms = 45_005;
                let mut claim = i.ops[find(i, OpKind::ClaimNext, id(30), false)].clone();
                claim.args["request_id"] = json!(id(32));
                claim.invoked_ms = 40_000;
                claim.completed_ms = 40_005;
                claim.outcome = ok(json!({"claimed": true, "key": "t", "holder": W0,
                    "claimed_ms": 40_000, "lease_expires_ms": 70_000}));
                i.ops.insert(k + 1, claim);
                i.ops.insert(k + 2, retry);
                let events = &mut i.db.task_events;
                events[1].at_us = 45_000_000;
                let mut again = events[0].clone();
                again.at_us = 40_000_000;
                events.insert(1, again);
                i.db.requests = Some(recorded(&i.ops));
            },
        ),
        (
            "a lock's answer dates its take at its transaction's start, before the release it waited for",
            |i| {
                // W1's acquire began (its transaction's now()) before W0's
                // release was invoked and answered after it.
                let k = find(i, OpKind::AcquireLock, id(42), false);
                let release = find(i, OpKind::ReleaseLock, id(41), false);
                let released_at = i.ops[release].invoked_ms;
                i.ops[k].invoked_ms = released_at - 500;
                i.ops[k].completed_ms = released_at + 300;
                i.ops[k].outcome = ok(json!({"name": "l", "holder": W1, "extended": false,
                    "acquired_ms": released_at - 400, "expires_ms": released_at + 9_600}));
                i.db.requests = Some(recorded(&i.ops));
            },
        ),
        (
            "a channel read refused because the connection broke moved the cursor",
            |i| {
                // Its statement committed and the answer was lost: the next read
                // starts after what it handed out (a third post at position 3).
                let post3 = id(12);
                i.db.channel_messages.push(ChannelMessage {
                    id: post3,
                    position: 3,
                    request_id: None,
                    ..i.db.channel_messages[1].clone()
                });
                i.ops[11].outcome = Outcome::Refused {
                    kind: "unavailable".into(),
                    message: "the database connection broke during this request: if it was a \
                          change, it may or may not have been made"
                        .into(),
                };
                let mut next = i.ops[11].clone();
                next.invoked_ms += 10;
                next.completed_ms += 10;
                next.outcome = ok(json!({"ids": [post3]}));
                i.ops.insert(12, next);
            },
        ),
    ]
}

pub fn self_test() -> anyhow::Result<()> {
    let mut problems = Vec::new();
    let (_, clean) = run_checks(&base());
    for v in &clean {
        problems.push(format!("the clean run fails {}: {}", v.check, v.what));
    }
    for (name, variant) in clean_variants() {
        let mut input = base();
        variant(&mut input);
        for v in run_checks(&input).1 {
            problems.push(format!("{name}: {} flags {}", v.check, v.what));
        }
    }
    let (rows, _) = run_checks(&base());
    for (name, breakage) in breakages() {
        if !rows.iter().any(|r| r.name == name) {
            problems.push(format!("no check is named {name:?}"));
            continue;
        }
        let mut input = base();
        breakage(&mut input);
        let (rows, _) = run_checks(&input);
        if rows
            .iter()
            .find(|r| r.name == name)
            .is_none_or(|r| r.violations == 0)
        {
            problems.push(format!("{name} did not catch its breakage"));
        }
    }
    for row in &rows {
        if !breakages().iter().any(|(name, _)| *name == row.name) {
            problems.push(format!("{} has no breakage", row.name));
        }
    }
    if problems.is_empty() {
        eprintln!(
            "chaos: checker self-test passed ({} checks caught all {} breakages)",
            rows.len(),
            breakages().len()
        );
        Ok(())
    } else {
        anyhow::bail!(
            "the checker's self-test failed:\n  {}",
            problems.join("\n  ")
        )
    }
}
