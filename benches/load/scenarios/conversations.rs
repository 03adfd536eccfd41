//! Conversation sends: `conversation_send` over MCP and
//! `conversation_send_store` through the library's store path, both against
//! `pg_message_receipts` (the same rows in raw SQL); and the seating of
//! benchmark conversations the other conversation scenarios share.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use sqlx::{Connection as _, PgPool};

use super::{Ctx, call_tool};
use crate::harness::{Run, closed_loop};

/// Recipients per conversation in `conversation_send`: with the sender, 4 members.
const CONVERSATION_RECIPIENTS: usize = 3;

/// Turn conversations on for team `bench` and give each client `i` its own
/// conversation of 4 active seats, all windows of agent `bench`: the sender
/// `sender-i` and the recipients `rcpt-i-0..2`. Returns the conversation ids.
async fn seat_conversations(pool: &PgPool, clients: usize) -> Result<Vec<uuid::Uuid>> {
    let (team_id, agent_id) = bench_team(pool).await?;
    seat_conversations_on(pool, team_id, agent_id, clients, "postgres", "sync").await
}

/// Turn conversations on for team `bench`: its id and agent `bench`'s.
pub(super) async fn bench_team(pool: &PgPool) -> Result<(uuid::Uuid, uuid::Uuid)> {
    sqlx::query_as(
        "UPDATE teams t SET conversations_enabled = true FROM agents a
         WHERE a.team_id = t.id AND t.slug = 'bench' AND a.name = 'bench'
         RETURNING t.id, a.id",
    )
    .fetch_one(pool)
    .await
    .context("turning conversations on for the bench team")
}

/// The seats of a conversation [`seat_conversations_on`] made: the
/// sender's id, and the recipients' ids and window labels.
pub(super) async fn seats(
    pool: &PgPool,
    team_id: uuid::Uuid,
    conversation: uuid::Uuid,
) -> Result<(uuid::Uuid, (Vec<uuid::Uuid>, Vec<String>))> {
    let members: Vec<(uuid::Uuid, String)> = sqlx::query_as(
        "SELECT id, session FROM conversation_members
         WHERE team_id = $1 AND conversation_id = $2 ORDER BY session",
    )
    .bind(team_id)
    .bind(conversation)
    .fetch_all(pool)
    .await?;
    let sender = members
        .iter()
        .find(|(_, session)| session.starts_with("sender-"))
        .context("the sender's seat")?
        .0;
    let recipients = members
        .into_iter()
        .filter(|(_, session)| session.starts_with("rcpt-"))
        .unzip();
    Ok((sender, recipients))
}

/// [`seat_conversations`] with a backend and publication mode of its own.
pub(super) async fn seat_conversations_on(
    pool: &PgPool,
    team_id: uuid::Uuid,
    agent_id: uuid::Uuid,
    clients: usize,
    backend: &str,
    publication: &str,
) -> Result<Vec<uuid::Uuid>> {
    let mut ids = Vec::new();
    for i in 0..clients {
        let id = uuid::Uuid::new_v4();
        sqlx::query(
            "INSERT INTO conversations
                 (id, team_id, title, visibility, created_by, created_session, backend, publication)
             VALUES ($1, $2, 'benchmark conversation', 'private', $3, '', $4, $5)",
        )
        .bind(id)
        .bind(team_id)
        .bind(agent_id)
        .bind(backend)
        .bind(publication)
        .execute(pool)
        .await
        .context("creating a benchmark conversation")?;
        let mut sessions = vec![format!("sender-{i}")];
        sessions.extend((0..CONVERSATION_RECIPIENTS).map(|k| format!("rcpt-{i}-{k}")));
        sqlx::query(
            "INSERT INTO conversation_members
                 (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq, joined_at)
             SELECT gen_random_uuid(), $1, $2, $3, s, 'participant', 'active', 1, now()
             FROM unnest($4::text[]) AS s",
        )
        .bind(team_id)
        .bind(id)
        .bind(agent_id)
        .bind(&sessions)
        .execute(pool)
        .await
        .context("seating a benchmark conversation")?;
        ids.push(id);
    }
    Ok(ids)
}

/// `send_conversation_message` over MCP, each client its own window (`sender-i`)
/// sending into its own conversation of 4 members: one operation is one
/// message with its gap-free seq and 3 receipt rows, committed.
pub(super) async fn conversation_send(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let conversations = seat_conversations(&ctx.pool, clients).await?;
    send_into(ctx, conversations).await
}

/// Client `i` sends over MCP as window `sender-i` into `conversations[i]`
/// (seated by [`seat_conversations_on`]), closed loop, one client per
/// conversation.
pub(super) async fn send_into(ctx: Arc<Ctx>, conversations: Vec<uuid::Uuid>) -> Result<Run> {
    let clients = conversations.len();
    let conversations = Arc::new(conversations);
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        let conversation = conversations[i];
        async move {
            let session = format!("sender-{i}");
            let client = ctx.connect(Some(&session)).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                let sent = call_tool(
                    &client,
                    "send_conversation_message",
                    json!({
                        "conversation_id": conversation,
                        "body": "a short message about the work at hand",
                        "request_id": uuid::Uuid::new_v4().to_string(),
                    }),
                )
                .await?;
                if sent["recipients"].as_array().map(Vec::len) != Some(CONVERSATION_RECIPIENTS) {
                    bail!("a send did not freeze {CONVERSATION_RECIPIENTS} recipients: {sent}");
                }
                rec.record(started);
            }
            client.close().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// What PostgreSQL can do for the same write with nothing in between: each
/// worker on its own connection inserts one message row and 3 receipt rows in
/// one transaction. One operation is one such commit, as in `conversation_send`.
pub(super) async fn pg_message_receipts(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let pool = ctx.pool.clone();
    for statement in [
        "CREATE TABLE IF NOT EXISTS bench_conv_messages (
             id bigserial PRIMARY KEY,
             conversation integer NOT NULL,
             body text NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now())",
        "CREATE TABLE IF NOT EXISTS bench_conv_receipts (
             message_id bigint NOT NULL REFERENCES bench_conv_messages (id),
             member integer NOT NULL,
             stored_at timestamptz,
             PRIMARY KEY (message_id, member))",
        "TRUNCATE bench_conv_receipts, bench_conv_messages",
    ] {
        sqlx::query(statement)
            .execute(&pool)
            .await
            .context("preparing the message and receipt tables")?;
    }
    closed_loop(clients, ctx.timing, move |index, window| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.context("a baseline connection")?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                let mut tx = conn.begin().await.context("baseline BEGIN")?;
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO bench_conv_messages (conversation, body) VALUES ($1, $2)
                     RETURNING id",
                )
                .bind(index as i32)
                .bind("a short message about the work at hand")
                .fetch_one(&mut *tx)
                .await
                .context("baseline message INSERT")?;
                sqlx::query(
                    "INSERT INTO bench_conv_receipts (message_id, member, stored_at)
                     SELECT $1, m, now() FROM generate_series(1, $2) AS m",
                )
                .bind(id)
                .bind(CONVERSATION_RECIPIENTS as i32)
                .execute(&mut *tx)
                .await
                .context("baseline receipts INSERT")?;
                tx.commit().await.context("baseline COMMIT")?;
                rec.record(started);
            }
            Ok(rec.finish())
        }
    })
    .await
}

/// The store path of `conversation_send` with no MCP or HTTP in between: each
/// client calls the library's send directly as its own window. This is the
/// figure the target (75 % of `pg_message_receipts` at 16 clients)
/// is about. Its line also says what PostgreSQL did per send, over every send
/// of the run (the warm-up's too): `xacts_per_op`, transactions committed in
/// the bench database (1 while a send is one call), and `wal_bytes_per_op`,
/// WAL written by the cluster. A send that takes another round trip, or
/// writes another row or index entry, shows there whatever the machine's noise.
pub(super) async fn conversation_send_store(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    use ai_crew_sync::auth::{self, AgentCredential};
    use ai_crew_sync::store::{conversations::messages, identity::tokens};

    let conversations = Arc::new(seat_conversations(&ctx.pool, clients).await?);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let bus = ai_crew_sync::Bus::start(
        ctx.pool.clone(),
        std::time::Duration::from_secs(30),
        shutdown.clone(),
    );
    let AgentCredential::Token(digest) = auth::parse_agent_credential(&ctx.token)? else {
        bail!("the bench token is not an agent token");
    };
    let sends = Arc::new(AtomicUsize::new(0));
    // No figures (rather than no run) on a PostgreSQL older than 15.
    let before = pg_counters(&ctx.pool).await.ok();
    let counted = sends.clone();
    let run = closed_loop(clients, ctx.timing, move |i, window| {
        let (bus, conversation, sends) = (bus.clone(), conversations[i], counted.clone());
        async move {
            let me = tokens::authenticate(&bus.pool, &digest, format!("sender-{i}")).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                let new = messages::NewConversationMessage {
                    conversation_id: conversation,
                    body: "a short message about the work at hand".into(),
                    request_id: uuid::Uuid::new_v4().to_string(),
                    reply_to: None,
                    metadata: None,
                };
                let sent = messages::send(&bus, &me, new).await?;
                if sent.recipients.len() != CONVERSATION_RECIPIENTS {
                    bail!("a send did not freeze {CONVERSATION_RECIPIENTS} recipients");
                }
                sends.fetch_add(1, Ordering::Relaxed);
                rec.record(started);
            }
            Ok(rec.finish())
        }
    })
    .await;
    shutdown.cancel();
    let mut run = run?;
    let (Some(before), Ok(after)) = (before, pg_counters(&ctx.pool).await) else {
        return Ok(run);
    };
    let sends = sends.load(Ordering::Relaxed).max(1) as f64;
    // The reading of `before` committed once, and `after`'s flushes each once.
    let xacts = after.xacts - before.xacts - 1 - after.flushes;
    let per_send = |n: i64| (n as f64 / sends * 100.0).round() / 100.0;
    let mut extra = serde_json::Map::new();
    extra.insert("xacts_per_op".into(), json!(per_send(xacts)));
    extra.insert(
        "wal_bytes_per_op".into(),
        json!(per_send(after.wal - before.wal).round()),
    );
    run.extra = Some(extra);
    Ok(run)
}

/// The bench database's committed transactions and the cluster's WAL position.
struct Counters {
    xacts: i64,
    wal: i64,
    /// Transactions this reading made before it read (its flushes).
    flushes: i64,
}

/// [`Counters`] now. PostgreSQL sends a connection's counts to the
/// statistics at most once a second, so every idle connection of the pool
/// first flushes what it holds back (`pg_stat_force_next_flush`, PostgreSQL
/// 15): the count then holds every commit made through the pool.
async fn pg_counters(pool: &PgPool) -> Result<Counters> {
    let mut idle = Vec::new();
    while let Some(conn) = pool.try_acquire() {
        idle.push(conn);
    }
    for conn in &mut idle {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&mut **conn)
            .await
            .context("flushing a connection's statistics")?;
    }
    let flushes = idle.len() as i64;
    drop(idle);
    let (xacts, wal): (i64, i64) = sqlx::query_as(
        "SELECT xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
         FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .context("reading the commit count and the WAL position")?;
    Ok(Counters {
        xacts,
        wal,
        flushes,
    })
}
