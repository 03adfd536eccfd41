//! One client: a window issuing a seeded mix of operations on random
//! replicas, recording each in the history with the answer's fields that
//! matter (see [`compact`]).

use std::collections::HashMap;
use std::time::Instant;

use ai_crew_sync::store::conversations::inbox;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};
use sha2::Digest as _;
use uuid::Uuid;

mod retried;

pub use retried::arguments_of;

use super::mcp::Window;
use super::{Fixture, Mode, pause};
use crate::history::{History, Op, OpKind, Outcome};
use crate::model::Target;

/// Attempts of one send (the first and its retries with the same
/// request_id) before the client moves on; settle finishes the rest.
const SEND_ATTEMPTS: usize = 4;
/// A conversation page.
const PAGE: i64 = 50;
/// How long after a lease ended its lapsed holder tries to complete it
/// (more than the checker's clock slack).
const LATE_MS: i64 = 300;
/// How often an answered send is sent again with its request_id.
const REPEAT_SEND: f64 = 0.05;
/// Inbox pages one inbox step fetches at most.
const INBOX_ROUNDS: usize = 4;

/// A task this window claimed.
struct Held {
    key: String,
    /// The lease's end as the server said (epoch ms).
    expires_ms: i64,
    /// Left to lapse: completed only after the lease ended (must be refused).
    abandoned: bool,
}

pub struct Client {
    pub index: usize,
    pub window: Window,
    pub address: String,
    history: History,
    fixture: Fixture,
    rng: StdRng,
    replicas: usize,
    phase: &'static str,
    cursors: HashMap<Uuid, i64>,
    to_ack: Vec<Uuid>,
    held: Vec<Held>,
    counter: u64,
    /// Locks and path reservations this window took, to release.
    locks: Vec<retried::Taken>,
    paths: Vec<retried::Taken>,
    /// Keys of tasks this window created, to claim by key (`claim_task`).
    created: Vec<String>,
}

impl Client {
    pub fn new(
        target: &Target,
        fixture: &Fixture,
        history: &History,
        index: usize,
        seed: u64,
        phase: &'static str,
    ) -> anyhow::Result<Client> {
        let seat = &fixture.seats[index];
        Ok(Client {
            index,
            window: Window::new(
                &target.replicas,
                &fixture.agents[seat.agent].token,
                &seat.label,
            )?,
            address: seat.address.clone(),
            history: history.clone(),
            fixture: fixture.clone(),
            rng: StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            replicas: target.replicas.len(),
            phase,
            cursors: HashMap::new(),
            to_ack: Vec::new(),
            held: Vec::new(),
            counter: 0,
            locks: Vec::new(),
            paths: Vec::new(),
            created: Vec::new(),
        })
    }

    /// Issue operations until `deadline`; how many.
    pub async fn run_until(mut self, deadline: Instant) -> usize {
        let mut issued = 0;
        while Instant::now() < deadline {
            issued += self.step().await;
        }
        issued
    }

    /// One operation (or a few that belong together); how many calls.
    async fn step(&mut self) -> usize {
        // A claim left to lapse is completed just after its lease ended,
        // before another window is likely to have claimed it: the server
        // must refuse (the lapse, not another holder, is what is tested).
        let now = chrono::Utc::now().timestamp_millis();
        if let Some(i) = self
            .held
            .iter()
            .position(|h| h.abandoned && now > h.expires_ms + LATE_MS)
        {
            let held = self.held.swap_remove(i);
            self.complete(&held.key, true).await;
            return 1;
        }
        let roll = self.rng.random_range(0..100);
        match roll {
            0..17 => self.send_into(Mode::Sync).await,
            17..34 => self.send_into(Mode::Outbox).await,
            34..47 => self.read().await,
            47..59 => self.inbox().await,
            59..65 => self.ack().await,
            65..73 => self.post().await,
            73..80 => self.read_channel().await,
            80..92 => self.task().await,
            92..96 => self.lock().await,
            _ => self.reservation().await,
        }
    }

    /// Call `tool` on a random replica and record it; `extra` is recorded
    /// beside the arguments (a digest, an attempt number).
    pub async fn call(&mut self, kind: OpKind, arguments: Value, extra: Value) -> Op {
        let replica = self.rng.random_range(0..self.replicas);
        let mut recorded = arguments.clone();
        if let (Some(map), Value::Object(extra)) = (recorded.as_object_mut(), extra) {
            map.extend(extra);
        }
        let mut op = self.history.invoke(kind, recorded);
        op.client = self.index;
        op.replica = replica;
        op.window = self.address.clone();
        op.phase = self.phase;
        let outcome = self.window.call(replica, kind.tool(), arguments).await;
        self.history.record(op, compact(kind, outcome))
    }

    fn uuid(&mut self) -> Uuid {
        uuid::Builder::from_random_bytes(self.rng.random()).into_uuid()
    }

    fn body(&mut self, what: &str) -> String {
        self.counter += 1;
        let filler: String = (0..self.rng.random_range(0..300))
            .map(|_| char::from(b'a' + self.rng.random_range(0..26u8)))
            .collect();
        format!("{what} from {} #{} {filler}", self.address, self.counter)
    }

    async fn send_into(&mut self, mode: Mode) -> usize {
        let choices: Vec<Uuid> = self
            .fixture
            .conversations
            .iter()
            .filter(|c| c.mode == mode)
            .map(|c| c.id)
            .collect();
        let conversation = choices[self.rng.random_range(0..choices.len())];
        let body = self.body("message");
        let request_id = self.uuid();
        let (mut calls, known) = self
            .send(conversation, request_id, &body, SEND_ATTEMPTS)
            .await;
        // Now and then the same send again, as a client does that lost the
        // answer: it must be answered with the original message.
        if known && self.rng.random_bool(REPEAT_SEND) {
            calls += self.send(conversation, request_id, &body, 1).await.0;
        }
        calls
    }

    /// Send, retrying with the same request_id while the outcome is
    /// unknown, at most `attempts` times; how many calls, and whether the
    /// outcome is known.
    pub async fn send(
        &mut self,
        conversation: Uuid,
        request_id: Uuid,
        body: &str,
        attempts: usize,
    ) -> (usize, bool) {
        let digest = hex::encode(sha2::Sha256::digest(body.as_bytes()));
        for attempt in 0..attempts {
            let op = self
                .call(
                    OpKind::Send,
                    json!({"conversation_id": conversation, "request_id": request_id, "body": body}),
                    json!({"sha256": digest, "attempt": attempt}),
                )
                .await;
            if !op.outcome.retryable() {
                return (attempt + 1, true);
            }
            pause(self.rng.random_range(100..500)).await;
        }
        (attempts, false)
    }

    async fn read(&mut self) -> usize {
        let conversation = self.fixture.conversations
            [self.rng.random_range(0..self.fixture.conversations.len())]
        .id;
        let cursor = *self.cursors.get(&conversation).unwrap_or(&0);
        // Now and then read again from a little earlier.
        let after = if self.rng.random_bool(0.05) {
            (cursor - self.rng.random_range(1..30)).max(0)
        } else {
            cursor
        };
        let next = self.read_page(conversation, after, PAGE).await;
        if let Some(next) = next {
            self.cursors.insert(conversation, next.max(cursor));
        }
        1
    }

    /// One page after `after`: the cursor it returned.
    pub async fn read_page(&mut self, conversation: Uuid, after: i64, limit: i64) -> Option<i64> {
        let op = self
            .call(
                OpKind::Read,
                json!({"conversation_id": conversation, "after_seq": after, "limit": limit}),
                json!({}),
            )
            .await;
        op.outcome.ok().and_then(|r| r["next_after_seq"].as_i64())
    }

    /// Fetch references owed to this window and confirm them (now and then
    /// twice); calls made, and whether anything was handed out.
    pub async fn inbox_round(&mut self, limit: i64) -> (usize, bool, bool) {
        let op = self
            .call(OpKind::Fetch, json!({"limit": limit}), json!({}))
            .await;
        let Some(result) = op.outcome.ok() else {
            return (1, false, true);
        };
        let more = result["more"].as_bool().unwrap_or(false);
        let deliveries = result["deliveries"].as_array().cloned().unwrap_or_default();
        if deliveries.is_empty() {
            return (1, false, more);
        }
        let ids: Vec<Value> = deliveries
            .iter()
            .map(|d| d["delivery_id"].clone())
            .collect();
        for d in &deliveries {
            if d["kind"] == "message"
                && let Some(id) = d["message_id"].as_str().and_then(|s| s.parse().ok())
                && self.to_ack.len() < 200
            {
                self.to_ack.push(id);
            }
        }
        let mut calls = 1;
        let repeat = self.rng.random_bool(0.25);
        // A confirmation whose answer was lost is retried (idempotent).
        for attempt in 0..3 {
            calls += 1;
            let op = self
                .call(
                    OpKind::Confirm,
                    json!({"delivery_ids": ids}),
                    json!({"attempt": attempt, "repeat": false}),
                )
                .await;
            if !op.outcome.retryable() {
                if repeat && op.outcome.ok().is_some() {
                    calls += 1;
                    self.call(
                        OpKind::Confirm,
                        json!({"delivery_ids": ids}),
                        json!({"attempt": 0, "repeat": true}),
                    )
                    .await;
                }
                break;
            }
            pause(self.rng.random_range(100..500)).await;
        }
        (calls, true, more)
    }

    /// Pages of the largest size while the inbox says there is more, up to
    /// [`INBOX_ROUNDS`]: a window keeps up with what it is sent (each send
    /// owes most windows a reference), so what is owed when the load stops
    /// is a short backlog the quiet period drains. (With one page of 20 per
    /// inbox step, a 25-minute run left each window ~14 000 references
    /// behind, more than the quiet period can hand out.)
    async fn inbox(&mut self) -> usize {
        let mut calls = 0;
        for _ in 0..INBOX_ROUNDS {
            let (made, handed_out, more) = self.inbox_round(inbox::FETCH_MAX).await;
            calls += made;
            if !handed_out || !more {
                break;
            }
        }
        calls
    }

    async fn ack(&mut self) -> usize {
        if self.to_ack.is_empty() {
            return self.inbox().await;
        }
        let message = self
            .to_ack
            .swap_remove(self.rng.random_range(0..self.to_ack.len()));
        let resolved = self.rng.random_bool(0.2);
        self.call(
            OpKind::Ack,
            json!({"message_id": message, "resolved": resolved}),
            json!({}),
        )
        .await;
        1
    }

    /// A post with a fresh request_id, also in its metadata
    /// (`chaos_request_id`) so the checker finds its rows; retried with the
    /// same id while the outcome is unknown.
    async fn post(&mut self) -> usize {
        let channel =
            self.fixture.channels[self.rng.random_range(0..self.fixture.channels.len())].clone();
        let body = self.body("post");
        let digest = hex::encode(sha2::Sha256::digest(body.as_bytes()));
        let request_id = self.uuid();
        self.write(
            OpKind::Post,
            json!({"channel": channel, "body": body,
                   "metadata": {"chaos_request_id": request_id}, "request_id": request_id}),
            json!({"sha256": digest}),
        )
        .await
    }

    pub async fn read_channel_named(&mut self, channel: &str) -> Option<usize> {
        let op = self
            .call(
                OpKind::ReadChannel,
                json!({"scope": channel, "only_new": true, "limit": PAGE}),
                json!({}),
            )
            .await;
        op.outcome
            .ok()
            .map(|r| r["ids"].as_array().map_or(0, Vec::len))
    }

    async fn read_channel(&mut self) -> usize {
        let channel =
            self.fixture.channels[self.rng.random_range(0..self.fixture.channels.len())].clone();
        self.read_channel_named(&channel).await;
        1
    }

    async fn task(&mut self) -> usize {
        let now = chrono::Utc::now().timestamp_millis();
        if let Some(i) = self.held.iter().position(|h| !h.abandoned) {
            if now > self.held[i].expires_ms - 3_000 {
                // Too close to its end to act on safely: let it lapse.
                self.held[i].abandoned = true;
                return 0;
            }
            let key = self.held[i].key.clone();
            if self.rng.random_bool(0.5) {
                let op = self
                    .call(
                        OpKind::Renew,
                        json!({"key": key, "lease_seconds": self.fixture.lease_secs}),
                        json!({}),
                    )
                    .await;
                if let Some(expires) = op.outcome.ok().and_then(|r| r["lease_expires_ms"].as_i64())
                {
                    self.held[i].expires_ms = expires;
                }
            } else {
                self.held.swap_remove(i);
                self.complete(&key, false).await;
            }
            return 1;
        }
        if self.rng.random_bool(0.4) {
            let key = format!("t{}-{}", self.index, self.counter);
            self.counter += 1;
            let op = self
                .call(
                    OpKind::CreateTask,
                    json!({"key": key, "title": format!("chaos task {key}")}),
                    json!({}),
                )
                .await;
            if op.outcome.ok().is_some() && self.created.len() < 50 {
                self.created.push(key);
            }
            return 1;
        }
        let request_id = self.uuid();
        // Now and then a task of its own by key (it may be taken already:
        // then refused), else the next one ready.
        // (Not one it holds: claiming it again would only extend it.)
        self.created
            .retain(|k| !self.held.iter().any(|h| h.key == *k));
        let (calls, op) = if !self.created.is_empty() && self.rng.random_bool(0.3) {
            let key = self
                .created
                .swap_remove(self.rng.random_range(0..self.created.len()));
            self.retried(
                OpKind::Claim,
                json!({"key": key, "lease_seconds": self.fixture.lease_secs,
                       "request_id": request_id}),
                json!({}),
            )
            .await
        } else {
            self.retried(
                OpKind::ClaimNext,
                json!({"lease_seconds": self.fixture.lease_secs, "request_id": request_id}),
                json!({}),
            )
            .await
        };
        if let Some(result) = op.outcome.ok()
            && result["claimed"] == true
            && let (Some(key), Some(expires_ms)) =
                (result["key"].as_str(), result["lease_expires_ms"].as_i64())
        {
            let abandoned = self.rng.random_bool(0.15);
            self.held.push(Held {
                key: key.to_string(),
                expires_ms,
                abandoned,
            });
        }
        calls
    }

    async fn complete(&mut self, key: &str, late: bool) {
        let request_id = self.uuid();
        self.write(
            OpKind::Complete,
            json!({"key": key, "result": "done by chaos", "request_id": request_id}),
            json!({"late": late}),
        )
        .await;
    }
}

/// An RFC 3339 time as epoch milliseconds.
fn epoch_ms(value: &Value) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(value.as_str()?)
        .ok()
        .map(|t| t.timestamp_millis())
}

fn sha256_hex(text: &str) -> String {
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// The fields of an answer the checks need (bodies become digests).
pub fn compact(kind: OpKind, outcome: Outcome) -> Outcome {
    let Outcome::Ok { result: r } = outcome else {
        return outcome;
    };
    let task = |t: &Value| {
        json!({
            "key": t["key"],
            "status": t["status"],
            "holder": t["holder"]["address"],
            "claimed_ms": epoch_ms(&t["holder"]["claimed_at"]),
            "lease_expires_ms": epoch_ms(&t["holder"]["lease_expires_at"]),
        })
    };
    let result = match kind {
        OpKind::Send => json!({
            "message_id": r["message_id"], "seq": r["seq"], "stored": r["stored"],
            "replayed": r["replayed"], "publication": r["publication"],
        }),
        OpKind::Read => {
            let messages: Vec<Value> = r["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    json!({
                        "seq": m["seq"], "message_id": m["message_id"],
                        "sha256": m["body"].as_str().map(sha256_hex),
                        "unavailable": m["unavailable"]["reason"],
                    })
                })
                .collect();
            json!({"next_after_seq": r["next_after_seq"], "messages": messages})
        }
        OpKind::Fetch => {
            let deliveries: Vec<Value> = r["deliveries"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| {
                    json!({
                        "delivery_id": d["delivery_id"], "kind": d["kind"],
                        "message_id": d["message_id"], "conversation_id": d["conversation_id"],
                        "seq": d["seq"],
                    })
                })
                .collect();
            json!({"deliveries": deliveries, "more": r["more"]})
        }
        OpKind::Confirm => json!({
            "confirmed": r["confirmed"], "already_confirmed": r["already_confirmed"],
            "unknown": r["unknown"],
        }),
        OpKind::Post => json!({"id": r["id"].as_str().or(r["message"]["id"].as_str())}),
        OpKind::ReadChannel => {
            let ids: Vec<Value> = r["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| m["id"].clone())
                .collect();
            json!({"ids": ids})
        }
        OpKind::ClaimNext => {
            let mut t = task(&r["task"]);
            t["claimed"] = r["claimed"].clone();
            t
        }
        OpKind::Claim => {
            let mut t = task(if r["task"].is_object() {
                &r["task"]
            } else {
                &r
            });
            t["claimed"] = json!(true);
            t
        }
        OpKind::AcquireLock | OpKind::ReleaseLock | OpKind::ReservePaths | OpKind::ReleasePaths => {
            retried::compact_holding(kind, &r)
        }
        OpKind::Renew | OpKind::Complete | OpKind::CreateTask => task(if r["task"].is_object() {
            &r["task"]
        } else {
            &r
        }),
        OpKind::Ack => r.clone(),
    };
    let mut result = result;
    // The mark of an answer given again for a request_id (kept on every
    // kind that carries one; `null` on a first answer).
    if kind.carries_request_id()
        && let Some(map) = result.as_object_mut()
    {
        map.insert("replayed".into(), r["replayed"].clone());
    }
    Outcome::Ok { result }
}
