//! The measured workloads. A scenario is a name and an async function that
//! drives `clients` concurrent workers against the running server and returns
//! what they measured; add one by writing the function and listing it in
//! [`SCENARIOS`]. The baseline is not a scenario: it always runs, because
//! every scenario's figure is a ratio to it.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use futures::future::BoxFuture;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use sqlx::{Connection as _, PgPool};

use crate::harness::{Run, Timing, closed_loop};

/// What a scenario may use.
pub struct Ctx {
    pub mcp_url: String,
    /// A bearer token of agent `bench` in team `bench`.
    pub token: String,
    /// The server's database, for setup, checks and raw-SQL baselines (never
    /// for a scenario's measured calls).
    pub pool: PgPool,
    pub timing: Timing,
}

pub type RunFn = fn(Arc<Ctx>, usize) -> BoxFuture<'static, Result<Run>>;

pub struct Scenario {
    pub name: &'static str,
    pub run: RunFn,
    /// A baseline of its own, run right before it at the same client count;
    /// `None` compares it with [`BASELINE`].
    pub baseline: Option<OwnBaseline>,
}

/// The same work as a scenario, done in raw SQL on the same database.
pub struct OwnBaseline {
    pub name: &'static str,
    pub run: RunFn,
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "whoami",
        run: |ctx, clients| Box::pin(whoami(ctx, clients)),
        baseline: None,
    },
    Scenario {
        name: "post_read",
        run: |ctx, clients| Box::pin(post_read(ctx, clients)),
        baseline: None,
    },
    Scenario {
        name: "wake_latency",
        run: |ctx, clients| Box::pin(wake_latency(ctx, clients)),
        baseline: None,
    },
    Scenario {
        name: "claim_complete",
        run: |ctx, clients| Box::pin(claim_complete(ctx, clients)),
        baseline: Some(OwnBaseline {
            name: "pg_claim_complete",
            run: |ctx, clients| Box::pin(pg_claim_complete(ctx, clients)),
        }),
    },
    Scenario {
        name: "conversation_send",
        run: |ctx, clients| Box::pin(conversation_send(ctx, clients)),
        baseline: Some(OwnBaseline {
            name: "pg_message_receipts",
            run: |ctx, clients| Box::pin(pg_message_receipts(ctx, clients)),
        }),
    },
    Scenario {
        name: "conversation_send_store",
        run: |ctx, clients| Box::pin(conversation_send_store(ctx, clients)),
        baseline: Some(OwnBaseline {
            name: "pg_message_receipts",
            run: |ctx, clients| Box::pin(pg_message_receipts(ctx, clients)),
        }),
    },
];

/// The name the baseline's lines carry.
pub const BASELINE: &str = "pg_insert_commit";

/// What the machine's PostgreSQL can commit at all: one single-row INSERT per
/// transaction (autocommit), each worker on its own connection. Every write
/// the bus makes costs at least this, so it is the yardstick.
pub async fn pg_insert_commit(pool: PgPool, timing: Timing, clients: usize) -> Result<Run> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_baseline (id bigserial PRIMARY KEY, payload text)",
    )
    .execute(&pool)
    .await
    .context("creating bench_baseline")?;
    closed_loop(clients, timing, move |_, window| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.context("a baseline connection")?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                sqlx::query("INSERT INTO bench_baseline (payload) VALUES ($1)")
                    .bind("a short payload, about the size of a small message body")
                    .execute(&mut *conn)
                    .await
                    .context("baseline INSERT")?;
                rec.record(started);
            }
            Ok(rec.finish())
        }
    })
    .await
}

/// The cheapest authenticated MCP round trip: HTTP, token check, one tool.
async fn whoami(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |_, window| {
        let ctx = ctx.clone();
        async move {
            let client = connect_mcp(&ctx.mcp_url, &ctx.token).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                call_tool(&client, "whoami", Value::Null).await?;
                rec.record(started);
            }
            let _ = client.cancel().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// The most operations per second the queue scenarios provision tasks for:
/// more than this machine does (claim + complete is two commits; raw commits
/// top out near 20k/s on 8 connections), so the queue cannot run dry
/// inside a window. If it does anyway, the run fails and says so.
const RAW_QUEUE_CEILING: f64 = 15_000.0;
const MCP_QUEUE_CEILING: f64 = 4_000.0;

/// How many queued tasks a window of `timing` needs at `ceiling` ops/s
/// (warm-up, window, and a second for the last operations to finish).
fn queue_depth(timing: Timing, ceiling: f64) -> i64 {
    let secs = (timing.warmup + timing.measure).as_secs_f64() + 1.0;
    (secs * ceiling).ceil() as i64
}

/// `claim_next_task` then `complete_task` over MCP, each contender its own
/// window (agent `bench`, session `contender-N`), on tasks queued beforehand.
/// One operation is one task claimed and completed.
async fn claim_complete(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let depth = queue_depth(ctx.timing, MCP_QUEUE_CEILING);
    queue_tasks(&ctx.pool, depth).await?;
    closed_loop(clients, ctx.timing, move |index, window| {
        let ctx = ctx.clone();
        async move {
            let session = format!("contender-{index}");
            let client = connect_mcp_as(&ctx.mcp_url, &ctx.token, Some(&session)).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                let next = call_tool(&client, "claim_next_task", json!({})).await?;
                let Some(key) = next["task"]["key"].as_str() else {
                    bail!(
                        "the queue ran dry ({depth} tasks were queued for this window): {}",
                        next["message"]
                    );
                };
                call_tool(
                    &client,
                    "complete_task",
                    json!({ "key": key, "result": "done by the benchmark" }),
                )
                .await?;
                rec.record(started);
            }
            let _ = client.cancel().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// Queue `depth` fresh open tasks for team `bench`, after setting aside
/// whatever an earlier run left open, so every run starts from the same queue.
async fn queue_tasks(pool: &PgPool, depth: i64) -> Result<()> {
    let (team_id, agent_id): (uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "SELECT t.id, a.id FROM teams t JOIN agents a ON a.team_id = t.id
         WHERE t.slug = 'bench' AND a.name = 'bench'",
    )
    .fetch_one(pool)
    .await
    .context("finding the bench team and agent")?;
    sqlx::query(
        "UPDATE tasks SET status = 'cancelled', holder_agent_id = NULL, holder_session = NULL,
                          lease_expires_at = NULL, claimed_at = NULL, updated_at = now()
         WHERE team_id = $1 AND status IN ('open', 'claimed')",
    )
    .bind(team_id)
    .execute(pool)
    .await
    .context("setting aside an earlier run's tasks")?;
    let prefix = format!("bench-{}", uuid::Uuid::new_v4().simple());
    sqlx::query(
        "INSERT INTO tasks (id, team_id, key, title, created_by, created_session)
         SELECT gen_random_uuid(), $1, $2 || '-' || g, 'benchmark task ' || g, $3, ''
         FROM generate_series(1, $4) AS g",
    )
    .bind(team_id)
    .bind(&prefix)
    .bind(agent_id)
    .bind(depth)
    .execute(pool)
    .await
    .context("queueing the benchmark's tasks")?;
    // Fresh statistics, so the claim query plans as it would on a settled table.
    sqlx::query("VACUUM ANALYZE tasks")
        .execute(pool)
        .await
        .context("VACUUM ANALYZE tasks")?;
    Ok(())
}

/// What PostgreSQL can do for the same queue with nothing in between: each
/// worker on its own connection claims the oldest open row (`FOR UPDATE SKIP
/// LOCKED` + UPDATE, one transaction) and completes it (one UPDATE). One
/// operation is one row claimed and completed, as in `claim_complete`.
pub async fn pg_claim_complete(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let pool = ctx.pool.clone();
    for statement in [
        "CREATE TABLE IF NOT EXISTS bench_queue (
             id bigserial PRIMARY KEY,
             status text NOT NULL DEFAULT 'open',
             holder text,
             lease_expires_at timestamptz,
             result text)",
        "CREATE INDEX IF NOT EXISTS bench_queue_claimable ON bench_queue (id)
             WHERE status IN ('open', 'claimed')",
        "TRUNCATE bench_queue",
    ] {
        sqlx::query(statement)
            .execute(&pool)
            .await
            .context("preparing bench_queue")?;
    }
    let depth = queue_depth(ctx.timing, RAW_QUEUE_CEILING);
    sqlx::query("INSERT INTO bench_queue (status) SELECT 'open' FROM generate_series(1, $1)")
        .bind(depth)
        .execute(&pool)
        .await
        .context("filling bench_queue")?;
    sqlx::query("VACUUM ANALYZE bench_queue")
        .execute(&pool)
        .await
        .context("VACUUM ANALYZE bench_queue")?;
    closed_loop(clients, ctx.timing, move |index, window| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.context("a baseline connection")?;
            let holder = format!("worker-{index}");
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                let mut tx = conn.begin().await.context("baseline BEGIN")?;
                let id: Option<i64> = sqlx::query_scalar(
                    "SELECT id FROM bench_queue
                     WHERE status = 'open' OR (status = 'claimed' AND lease_expires_at <= now())
                     ORDER BY id LIMIT 1
                     FOR UPDATE SKIP LOCKED",
                )
                .fetch_optional(&mut *tx)
                .await
                .context("baseline claim SELECT")?;
                let Some(id) = id else {
                    bail!("bench_queue ran dry ({depth} rows were queued for this window)");
                };
                sqlx::query(
                    "UPDATE bench_queue
                     SET status = 'claimed', holder = $2, lease_expires_at = now() + interval '900 s'
                     WHERE id = $1",
                )
                .bind(id)
                .bind(&holder)
                .execute(&mut *tx)
                .await
                .context("baseline claim UPDATE")?;
                tx.commit().await.context("baseline claim COMMIT")?;
                sqlx::query(
                    "UPDATE bench_queue
                     SET status = 'done', result = $3, holder = NULL, lease_expires_at = NULL
                     WHERE id = $1 AND holder = $2",
                )
                .bind(id)
                .bind(&holder)
                .bind("done by the benchmark")
                .execute(&mut *conn)
                .await
                .context("baseline complete UPDATE")?;
                rec.record(started);
            }
            Ok(rec.finish())
        }
    })
    .await
}

/// A connected MCP client (initialize done), as agents use: rmcp's Streamable
/// HTTP client with a bearer token.
pub async fn connect_mcp(url: &str, token: &str) -> Result<RunningService<RoleClient, ()>> {
    connect_mcp_as(url, token, None).await
}

/// [`connect_mcp`] as window `session` (the `X-Crew-Session` header).
pub async fn connect_mcp_as(
    url: &str,
    token: &str,
    session: Option<&str>,
) -> Result<RunningService<RoleClient, ()>> {
    // The same settings as rmcp's default client (it keeps no idle
    // connections, to dodge delayed-ACK stalls, so each call opens one), so
    // the figures are what an rmcp agent sees; plus no proxy, so traffic
    // cannot leave 127.0.0.1.
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("building the MCP client's HTTP client")?;
    let mut headers = std::collections::HashMap::new();
    if let Some(session) = session {
        headers.insert(
            http::HeaderName::from_static("x-crew-session"),
            session.parse().context("a window label")?,
        );
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url)
        .auth_header(token)
        .custom_headers(headers);
    let transport = StreamableHttpClientTransport::with_client(http, config);
    ().serve(transport).await.context("MCP initialize")
}

/// Call `tool`, failing on a transport error or a refusal: a benchmark that
/// counts refusals as work measures nothing.
pub async fn call_tool(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    args: Value,
) -> Result<Value> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    let result = client
        .call_tool(params)
        .await
        .with_context(|| format!("tools/call {tool}"))?;
    let value = result.structured_content.unwrap_or(Value::Null);
    if result.is_error == Some(true) {
        bail!("tools/call {tool} was refused: {value}");
    }
    Ok(value)
}

/// One op = `post_message` (a DM to the next worker's window) + that worker's
/// own `read_messages` of its inbox: the write path with a commit, the event
/// emit and the cursor-advancing read.
async fn post_read(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        async move {
            let me = format!("w{i}");
            let next = format!("bench/w{}", (i + 1) % clients);
            let client = connect_mcp_as(&ctx.mcp_url, &ctx.token, Some(&me)).await?;
            let post =
                serde_json::json!({"to": next, "body": "a short message about the work at hand"});
            let read = serde_json::json!({"scope": "inbox", "limit": 50});
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                call_tool(&client, "post_message", post.clone()).await?;
                call_tool(&client, "read_messages", read.clone()).await?;
                rec.record(started);
            }
            let _ = client.cancel().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// Latency from the start of a `post_message` to the moment a
/// `wait_for_updates` blocked in the recipient's window returns with it. It
/// includes the posting call's own round trip (the commit happens inside it).
/// Each worker is one waiter/poster pair; ops/s is pairs completed.
async fn wake_latency(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        async move {
            let waiter_window = format!("wait{i}");
            let waiter =
                Arc::new(connect_mcp_as(&ctx.mcp_url, &ctx.token, Some(&waiter_window)).await?);
            let poster =
                connect_mcp_as(&ctx.mcp_url, &ctx.token, Some(&format!("post{i}"))).await?;
            let post =
                serde_json::json!({"to": format!("bench/{waiter_window}"), "body": "wake up"});
            let mut rec = window.open().await;
            while rec.is_open() {
                let waiting = {
                    let waiter = waiter.clone();
                    tokio::spawn(async move {
                        call_tool(
                            &waiter,
                            "wait_for_updates",
                            serde_json::json!({"timeout_seconds": 10, "kinds": ["message"]}),
                        )
                        .await
                    })
                };
                // Let the wait subscribe first; not part of the measured latency.
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let started = Instant::now();
                call_tool(&poster, "post_message", post.clone()).await?;
                let woke = waiting.await.context("the waiting task")??;
                if woke["woke"] != true {
                    bail!("wait_for_updates did not wake for a DM: {woke}");
                }
                rec.record(started);
                // Consume the DM so the next wait blocks again.
                call_tool(
                    &waiter,
                    "read_messages",
                    serde_json::json!({"scope": "inbox"}),
                )
                .await?;
            }
            let _ = poster.cancel().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// Recipients per conversation in `conversation_send`: with the sender, 4 members.
const CONVERSATION_RECIPIENTS: usize = 3;

/// Turn conversations on for team `bench` and give each client `i` its own
/// conversation of 4 active seats, all windows of agent `bench`: the sender
/// `sender-i` and the recipients `rcpt-i-0..2`. Returns the conversation ids.
async fn seat_conversations(pool: &PgPool, clients: usize) -> Result<Vec<uuid::Uuid>> {
    let (team_id, agent_id): (uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "UPDATE teams t SET conversations_enabled = true FROM agents a
         WHERE a.team_id = t.id AND t.slug = 'bench' AND a.name = 'bench'
         RETURNING t.id, a.id",
    )
    .fetch_one(pool)
    .await
    .context("turning conversations on for the bench team")?;
    let mut ids = Vec::new();
    for i in 0..clients {
        let id = uuid::Uuid::new_v4();
        sqlx::query(
            "INSERT INTO conversations (id, team_id, title, visibility, created_by, created_session)
             VALUES ($1, $2, 'benchmark conversation', 'private', $3, '')",
        )
        .bind(id)
        .bind(team_id)
        .bind(agent_id)
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
async fn conversation_send(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    let conversations = Arc::new(seat_conversations(&ctx.pool, clients).await?);
    closed_loop(clients, ctx.timing, move |i, window| {
        let ctx = ctx.clone();
        let conversation = conversations[i];
        async move {
            let session = format!("sender-{i}");
            let client = connect_mcp_as(&ctx.mcp_url, &ctx.token, Some(&session)).await?;
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
            let _ = client.cancel().await;
            Ok(rec.finish())
        }
    })
    .await
}

/// What PostgreSQL can do for the same write with nothing in between: each
/// worker on its own connection inserts one message row and 3 receipt rows in
/// one transaction. One operation is one such commit, as in `conversation_send`.
pub async fn pg_message_receipts(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
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
/// figure the target (60 % of `pg_message_receipts` at 16 clients)
/// is about.
async fn conversation_send_store(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    use ai_crew_sync::auth::{self, AgentCredential};
    use ai_crew_sync::store::{conversation_messages, tokens};

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
    let run = closed_loop(clients, ctx.timing, move |i, window| {
        let (bus, conversation) = (bus.clone(), conversations[i]);
        async move {
            let me = tokens::authenticate(&bus.pool, &digest, format!("sender-{i}")).await?;
            let mut rec = window.open().await;
            while rec.is_open() {
                let started = Instant::now();
                let new = conversation_messages::NewConversationMessage {
                    conversation_id: conversation,
                    body: "a short message about the work at hand".into(),
                    request_id: uuid::Uuid::new_v4().to_string(),
                    reply_to: None,
                    metadata: None,
                };
                let sent = conversation_messages::send(&bus, &me, new).await?;
                if sent.recipients.len() != CONVERSATION_RECIPIENTS {
                    bail!("a send did not freeze {CONVERSATION_RECIPIENTS} recipients");
                }
                rec.record(started);
            }
            Ok(rec.finish())
        }
    })
    .await;
    shutdown.cancel();
    run
}
