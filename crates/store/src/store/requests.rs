//! Retries that never double: a write called with a `request_id` (migration
//! 0046).
//!
//! Every write tool runs its write through [`once`] on a [`Writer`]: a
//! connection, and the events to emit once what it wrote is visible.
//!
//! - Without a request id the write runs as it always did: on a connection
//!   of the pool, with no transaction of ours around it (a one-statement
//!   write is still one round trip), its events emitted after it.
//! - With one, one transaction holds the id's row and the write: `INSERT`
//!   the row (a concurrent call with the same id waits on the primary key
//!   until the first commits, then finds it), the write on the same
//!   connection (its own `BEGIN` becomes a savepoint), the answer stored,
//!   `COMMIT`, then the events. An id already recorded by this window within
//!   24 h with the same tool and arguments answers what the first call
//!   answered, with `"replayed": true`, and writes nothing; with another tool
//!   or other arguments it is refused, naming the first call.
//! - A write that is refused or fails rolls back with its id's row: nothing
//!   is recorded, and a retry with the same id runs again.
//! - Ids are kept 24 h ([`KEPT`]): [`prune`] deletes older rows in batches
//!   (the server's `request_ids` worker), and a call over a row older than
//!   that, not yet pruned, takes its place: a retry after 24 h runs anew.

use std::future::Future;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres, Transaction};
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::BusEvent;
use crate::store::at;

/// How long a request id is kept and answers retries.
pub const KEPT: chrono::Duration = chrono::Duration::hours(24);

/// Tools whose write refuses the agent token borrowing a registered
/// window's label (`conversations::refuse_borrowed_label`): a replay of one
/// is refused to that caller the same way.
const WINDOW_PRIVATE: &[&str] = &[
    "create_conversation",
    "invite_to_conversation",
    "join_conversation",
    "leave_conversation",
    "remove_conversation_member",
    "archive_conversation",
    "transfer_membership",
    "mark_presented",
];

/// Rows the pruner deletes per statement.
const PRUNE_BATCH: i64 = 1000;

/// What a write works on: its connection (inside the request's transaction
/// when it carries an id) and the events it emits after commit.
pub struct Writer {
    conn: Conn,
    after: Vec<BusEvent>,
}

enum Conn {
    Plain(PoolConnection<Postgres>),
    Tx(Transaction<'static, Postgres>),
}

impl Writer {
    /// The connection to write on. A write that needs a transaction of its
    /// own opens one on it (`begin`): inside a request's transaction, a
    /// savepoint.
    pub fn conn(&mut self) -> &mut PgConnection {
        match &mut self.conn {
            Conn::Plain(conn) => conn,
            Conn::Tx(tx) => tx,
        }
    }

    /// A transaction of the write's own on its connection: `BEGIN`, or
    /// inside a request's transaction a savepoint (its commit releases it,
    /// and only the request's commit makes it visible).
    pub async fn begin(&mut self) -> BusResult<Transaction<'_, Postgres>> {
        Ok(sqlx::Connection::begin(self.conn()).await?)
    }

    /// Emit `event` once the write is committed (never before: a waiter
    /// woken early would re-read and miss it).
    pub fn emit(&mut self, event: BusEvent) {
        self.after.push(event);
    }

    fn flush(self, bus: &Bus) {
        emit_all(bus, self.after);
    }
}

fn emit_all(bus: &Bus, events: Vec<BusEvent>) {
    for event in events {
        bus.events.emit(event);
    }
}

/// A request id as a write tool was given it: the id, the tool and the
/// digest of the call's arguments ([`digest`]).
#[derive(Clone, Debug)]
pub struct Request {
    pub id: Uuid,
    pub tool: String,
    pub digest: String,
}

impl Request {
    /// The request `raw` names for a call of `tool` with `arguments` (the
    /// call's arguments as sent; `request_id` among them is left out of the
    /// digest). A `raw` that is not a UUID is refused.
    pub fn parse(raw: &str, tool: &str, arguments: &Map<String, Value>) -> BusResult<Request> {
        let id = Uuid::parse_str(raw.trim()).map_err(|_| {
            let shown: String = raw.chars().take(64).collect();
            BusError::invalid(format!(
                "request_id `{shown}` is not a UUID (e.g. 0b6f7c1e-8d4a-4f5e-9a37-2c1d5e6f7a80). \
                 Nothing was done. Give a UUID of your own, new for each new call and the same \
                 on its retries, or leave request_id out."
            ))
        })?;
        Ok(Request {
            id,
            tool: tool.to_string(),
            digest: digest(tool, arguments),
        })
    }
}

/// SHA-256 (hex) of the tool's name and its arguments without `request_id`,
/// as JSON with every object's keys sorted: the same call gives the same
/// digest however its keys were ordered.
pub fn digest(tool: &str, arguments: &Map<String, Value>) -> String {
    let mut canonical = String::new();
    let without: Map<String, Value> = arguments
        .iter()
        .filter(|(key, _)| key.as_str() != "request_id")
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    write_sorted(&Value::Object(without), &mut canonical);
    let mut hash = Sha256::new();
    hash.update(tool.as_bytes());
    hash.update([0]);
    hash.update(canonical.as_bytes());
    hex::encode(hash.finalize())
}

fn write_sorted(value: &Value, out: &mut String) {
    match value {
        Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_sorted(&fields[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_sorted(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Run `write` without a request id: on a connection of the pool, its events
/// emitted when it succeeded. For callers that are not a tool with an id
/// (another store function, an operator command).
pub async fn plain<T, F, Fut>(bus: &Bus, write: F) -> BusResult<T>
where
    F: FnOnce(Writer) -> Fut,
    Fut: Future<Output = (Writer, BusResult<T>)>,
{
    let writer = Writer {
        conn: Conn::Plain(bus.pool.acquire().await?),
        after: Vec::new(),
    };
    let (writer, result) = write(writer).await;
    if result.is_ok() {
        writer.flush(bus);
    }
    result
}

/// Run `write` in one transaction of its own, without a request id: what it
/// writes (an audit row beside the write, say) commits together or not at
/// all, and its events are emitted after the commit.
pub async fn atomic<T, F, Fut>(bus: &Bus, write: F) -> BusResult<T>
where
    F: FnOnce(Writer) -> Fut,
    Fut: Future<Output = (Writer, BusResult<T>)>,
{
    let writer = Writer {
        conn: Conn::Tx(bus.pool.begin().await?),
        after: Vec::new(),
    };
    let (writer, result) = write(writer).await;
    let Writer { conn, after } = writer;
    let Conn::Tx(tx) = conn else {
        unreachable!("an atomic writer holds its transaction")
    };
    // Refused or failed: the transaction rolls back when dropped.
    let value = result?;
    tx.commit().await?;
    emit_all(bus, after);
    Ok(value)
}

/// Run `write`, once per `request` when there is one (see the module
/// overview), and answer its result as JSON: what it answered, or on a
/// retry what the first call answered with `"replayed": true`.
pub async fn once<T, F, Fut>(
    bus: &Bus,
    me: &Identity,
    request: Option<&Request>,
    write: F,
) -> BusResult<Value>
where
    T: Serialize,
    F: FnOnce(Writer) -> Fut,
    Fut: Future<Output = (Writer, BusResult<T>)>,
{
    let Some(request) = request else {
        let answer = plain(bus, write).await?;
        return to_answer(&answer);
    };
    let mut tx = bus.pool.begin().await?;
    // A row older than KEPT is taken over (a retry after 24 h runs anew); a
    // live one, committed or not, answers no row: the call is a retry.
    let fresh: Option<bool> = sqlx::query_scalar(
        "INSERT INTO request_ids (team_id, agent_id, window_label, request_id, tool, digest)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (team_id, agent_id, window_label, request_id) DO UPDATE
            SET tool = EXCLUDED.tool, digest = EXCLUDED.digest, answer = NULL,
                created_at = now()
            WHERE request_ids.created_at < now() - make_interval(secs => $7)
         RETURNING true",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(request.id)
    .bind(&request.tool)
    .bind(&request.digest)
    .bind(KEPT.num_seconds() as f64)
    .fetch_optional(&mut *tx)
    .await?;
    if fresh.is_none() {
        // A registered window's seats are its session credential's: the
        // agent token borrowing its label is refused their answers too.
        if WINDOW_PRIVATE.contains(&request.tool.as_str()) {
            crate::store::conversations::refuse_borrowed_label(&mut tx, me).await?;
        }
        let first = first_call(&mut tx, me, request).await;
        tx.rollback().await?;
        return first?.replay(request);
    }
    let writer = Writer {
        conn: Conn::Tx(tx),
        after: Vec::new(),
    };
    let (writer, result) = write(writer).await;
    let Writer { conn, after } = writer;
    let Conn::Tx(mut tx) = conn else {
        unreachable!("a request's writer holds its transaction")
    };
    // Refused or failed: the transaction (the id's row with it) rolls back
    // when dropped, so a retry runs again.
    let answer = to_answer(&result?)?;
    sqlx::query(
        "UPDATE request_ids SET answer = $5
         WHERE team_id = $1 AND agent_id = $2 AND window_label = $3 AND request_id = $4",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(request.id)
    .bind(&answer)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    emit_all(bus, after);
    Ok(answer)
}

fn to_answer<T: Serialize>(answer: &T) -> BusResult<Value> {
    serde_json::to_value(answer).map_err(|err| {
        BusError::Db(sqlx::Error::Protocol(format!(
            "could not encode a write's answer: {err}"
        )))
    })
}

/// The call that first used a request id.
#[derive(sqlx::FromRow)]
struct FirstCall {
    tool: String,
    digest: String,
    answer: Option<Value>,
    created_at: DateTime<Utc>,
}

async fn first_call(
    conn: &mut PgConnection,
    me: &Identity,
    request: &Request,
) -> BusResult<FirstCall> {
    Ok(sqlx::query_as(
        "SELECT tool, digest, answer, created_at FROM request_ids
         WHERE team_id = $1 AND agent_id = $2 AND window_label = $3 AND request_id = $4",
    )
    .bind(me.team_id)
    .bind(me.agent_id)
    .bind(&me.window)
    .bind(request.id)
    .fetch_one(conn)
    .await?)
}

impl FirstCall {
    /// The first call's answer, marked replayed; or, for another call under
    /// the same id, the refusal naming the first.
    fn replay(self, request: &Request) -> BusResult<Value> {
        let first = format!(
            "request_id {} was first used by this window at {} for {}",
            request.id,
            at(self.created_at),
            self.tool
        );
        if self.tool != request.tool || self.digest != request.digest {
            let what = if self.tool != request.tool {
                format!("this is a call of {}", request.tool)
            } else {
                "with other arguments".to_string()
            };
            return Err(BusError::conflict(format!(
                "{first}, {what}: a request_id names one call, and a retry repeats it exactly. \
                 Nothing was done. Use a new request_id for a new call (or repeat the first \
                 call's arguments to get its answer again)."
            )));
        }
        let Some(Value::Object(mut answer)) = self.answer else {
            return Err(BusError::Db(sqlx::Error::Protocol(format!(
                "{first}, but its answer was not stored"
            ))));
        };
        answer.insert("replayed".into(), Value::Bool(true));
        Ok(Value::Object(answer))
    }
}

/// Delete the request ids older than [`KEPT`], in batches; how many went.
pub async fn prune(pool: &sqlx::PgPool) -> BusResult<u64> {
    let mut total = 0;
    loop {
        let deleted = sqlx::query(
            "DELETE FROM request_ids WHERE ctid = ANY (ARRAY(
                SELECT ctid FROM request_ids
                WHERE created_at < now() - make_interval(secs => $1)
                ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
        )
        .bind(KEPT.num_seconds() as f64)
        .bind(PRUNE_BATCH)
        .execute(pool)
        .await?
        .rows_affected();
        total += deleted;
        if deleted < PRUNE_BATCH as u64 {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn the_digest_ignores_key_order_and_the_request_id() {
        let a = digest(
            "post_message",
            &args(json!({"body": "hi", "metadata": {"b": 1, "a": [2, {"y": 1, "x": 2}]}})),
        );
        let b = digest(
            "post_message",
            &args(
                json!({"request_id": "x", "metadata": {"a": [2, {"x": 2, "y": 1}], "b": 1},
                         "body": "hi"}),
            ),
        );
        assert_eq!(a, b);
        assert_ne!(a, digest("post_message", &args(json!({"body": "hi!"}))));
        assert_ne!(
            digest("set_note", &args(json!({}))),
            digest("delete_note", &args(json!({})))
        );
    }

    #[test]
    fn a_request_id_that_is_not_a_uuid_is_refused() {
        let err = Request::parse("retry-1", "post_message", &Map::new()).unwrap_err();
        assert!(err.to_string().contains("not a UUID"), "{err}");
    }
}
