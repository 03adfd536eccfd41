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
    /// The run's own `nats-server`, when a selected scenario needs one.
    pub nats_url: Option<String>,
    /// The rate of the own baseline measured right before the scenario now
    /// running: an open-loop scenario offers a load relative to it.
    pub own_baseline_ops: std::sync::Mutex<Option<f64>>,
}

pub type RunFn = fn(Arc<Ctx>, usize) -> BoxFuture<'static, Result<Run>>;

pub struct Scenario {
    pub name: &'static str,
    pub run: RunFn,
    /// A baseline of its own, run right before it at the same client count;
    /// `None` compares it with [`BASELINE`].
    pub baseline: Option<OwnBaseline>,
    /// Whether the runner must start a `nats-server` for it.
    pub needs_nats: bool,
    /// Measured once, at the first client count only (its `clients` do not
    /// mean concurrency).
    pub once: bool,
}

/// The same work as a scenario, done with nothing in between (raw SQL on the
/// same database, raw publishes to the same broker).
pub struct OwnBaseline {
    pub name: &'static str,
    pub run: RunFn,
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "whoami",
        run: |ctx, clients| Box::pin(whoami(ctx, clients)),
        baseline: None,
        needs_nats: false,
        once: false,
    },
    Scenario {
        name: "post_read",
        run: |ctx, clients| Box::pin(post_read(ctx, clients)),
        baseline: None,
        needs_nats: false,
        once: false,
    },
    Scenario {
        name: "wake_latency",
        run: |ctx, clients| Box::pin(wake_latency(ctx, clients)),
        baseline: None,
        needs_nats: false,
        once: false,
    },
    Scenario {
        name: "claim_complete",
        run: |ctx, clients| Box::pin(claim_complete(ctx, clients)),
        baseline: Some(OwnBaseline {
            name: "pg_claim_complete",
            run: |ctx, clients| Box::pin(pg_claim_complete(ctx, clients)),
        }),
        needs_nats: false,
        once: false,
    },
    Scenario {
        name: "conversation_send",
        run: |ctx, clients| Box::pin(conversation_send(ctx, clients)),
        baseline: Some(OwnBaseline {
            name: "pg_message_receipts",
            run: |ctx, clients| Box::pin(pg_message_receipts(ctx, clients)),
        }),
        needs_nats: false,
        once: false,
    },
    Scenario {
        name: "conversation_send_store",
        run: |ctx, clients| Box::pin(conversation_send_store(ctx, clients)),
        baseline: Some(OwnBaseline {
            name: "pg_message_receipts",
            run: |ctx, clients| Box::pin(pg_message_receipts(ctx, clients)),
        }),
        needs_nats: false,
        once: false,
    },
    Scenario {
        name: "outbox_drain_jetstream",
        run: |ctx, clients| Box::pin(outbox_drain_jetstream(ctx, clients, Some(TARGET_LOAD))),
        baseline: Some(OwnBaseline {
            name: JETSTREAM_BASELINE,
            run: |ctx, clients| Box::pin(jetstream_publish(ctx, clients)),
        }),
        needs_nats: true,
        once: false,
    },
    Scenario {
        name: "outbox_drain_jetstream_backlog",
        run: |ctx, clients| Box::pin(outbox_drain_jetstream(ctx, clients, None)),
        baseline: Some(OwnBaseline {
            name: JETSTREAM_BASELINE,
            run: |ctx, clients| Box::pin(jetstream_publish(ctx, clients)),
        }),
        needs_nats: true,
        once: false,
    },
    Scenario {
        name: "migrate_conversation",
        run: |ctx, _| Box::pin(migrate_conversation(ctx)),
        baseline: Some(OwnBaseline {
            name: JETSTREAM_BASELINE,
            run: |ctx, clients| Box::pin(jetstream_publish(ctx, clients)),
        }),
        needs_nats: true,
        once: true,
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
    seat_conversations_on(pool, team_id, agent_id, clients, "postgres", "sync").await
}

/// [`seat_conversations`] with a backend and publication mode of its own.
async fn seat_conversations_on(
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

/// The name of the raw JetStream baseline's lines.
const JETSTREAM_BASELINE: &str = "jetstream_publish_256";
/// Publishes the raw baseline keeps in flight, split over its clients: the
/// same window the drain keeps (`DrainSettings::in_flight`).
const BASELINE_IN_FLIGHT: usize = 256;
/// The offered load of `outbox_drain_jetstream`, as a fraction of the raw
/// baseline's rate: the target, so the line says whether the drain
/// carries it and at what latency.
const TARGET_LOAD: f64 = 0.5;
/// `outbox_drain_jetstream_backlog` accepts this many messages before the
/// drain starts, and times how fast the drain empties the outbox: its
/// capacity, with no feeder competing for PostgreSQL.
const BACKLOG: i64 = 20_000;
/// The feeder writes a batch of accepted messages this often, at most
/// [`FEED_MAX_BATCH`] per tick: a feeder that falls behind offers less
/// (`offered_per_s` says how much), it does not stretch the window.
const FEED_TICK: std::time::Duration = std::time::Duration::from_millis(5);
const FEED_MAX_BATCH: u64 = 1_000;
/// How long the drain may go on after the window to store what was accepted
/// in it; whatever is left then counts with its age at that moment.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);
/// The body every benchmark message carries (as in `conversation_send`).
const SHORT_BODY: &str = "a short message about the work at hand";

fn nats_url(ctx: &Ctx) -> Result<String> {
    ctx.nats_url
        .clone()
        .context("this scenario needs the run's nats-server, and none was started")
}

/// What the broker's own client can do with nothing in between: raw
/// async-nats JetStream publishes, [`BASELINE_IN_FLIGHT`] awaiting their
/// PubAck at any time (split over the clients, one connection), to a stream
/// laid out like a team's body stream (file storage, limits, discard new, the
/// same duplicate window, subjects `<prefix>.<team>.conv.<conversation>`),
/// each with a fresh `Nats-Msg-Id` and the bus's three `Acs-*` headers. One
/// operation is one PubAck; its latency is publish → PubAck.
pub async fn jetstream_publish(ctx: Arc<Ctx>, clients: usize) -> Result<Run> {
    use ai_crew_sync::backend::jetstream::DEFAULT_TIMEOUT;
    use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};

    let url = nats_url(&ctx)?;
    let client = async_nats::ConnectOptions::new()
        .name("bench-raw")
        .connect(&url)
        .await
        .context("connecting the raw baseline's NATS client")?;
    let js = async_nats::jetstream::ContextBuilder::new()
        .timeout(DEFAULT_TIMEOUT)
        .build(client);
    let team = uuid::Uuid::new_v4().simple().to_string();
    let name = "BENCH_RAW";
    // A fresh, empty stream every time, as the drain's is purged.
    let _ = js.delete_stream(name).await;
    js.create_stream(Config {
        name: name.into(),
        subjects: vec![format!("acsraw.{team}.conv.*")],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        discard: DiscardPolicy::New,
        max_bytes: 2 * 1024 * 1024 * 1024,
        max_messages: -1,
        max_message_size: 2 * 1024 * 1024,
        // As the body stream (provision.rs, DUPLICATE_WINDOW): the broker
        // remembers every Nats-Msg-Id this long, which costs the same here.
        duplicate_window: std::time::Duration::from_secs(15 * 60),
        allow_direct: true,
        num_replicas: 1,
        ..Default::default()
    })
    .await
    .context("creating the raw baseline's stream")?;
    let per_client = (BASELINE_IN_FLIGHT / clients).max(1);
    closed_loop(clients, ctx.timing, move |_, window| {
        let js = js.clone();
        let subject = format!("acsraw.{team}.conv.{}", uuid::Uuid::new_v4().simple());
        let (team_id, conversation_id) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        async move {
            let mut in_flight = futures::stream::FuturesUnordered::new();
            let mut rec = window.open().await;
            loop {
                while rec.is_open() && in_flight.len() < per_client {
                    let mut headers = async_nats::HeaderMap::new();
                    let key = uuid::Uuid::new_v4().to_string();
                    headers.insert(async_nats::header::NATS_MESSAGE_ID, key.as_str());
                    let message_id = uuid::Uuid::new_v4().to_string();
                    headers.insert("Acs-Message-Id", message_id.as_str());
                    headers.insert("Acs-Conversation-Id", conversation_id.to_string().as_str());
                    headers.insert("Acs-Team-Id", team_id.to_string().as_str());
                    let started = Instant::now();
                    let ack = js
                        .publish_with_headers(subject.clone(), headers, SHORT_BODY.into())
                        .await
                        .context("a raw JetStream publish")?;
                    in_flight.push(async move { ack.await.map(|_| started) });
                }
                match futures::StreamExt::next(&mut in_flight).await {
                    Some(acked) => rec.record(acked.context("a raw JetStream PubAck")?),
                    None => break,
                }
            }
            Ok(rec.finish())
        }
    })
    .await
}

/// The outbox drain to JetStream. `clients` drain workers (`spawn_drain`
/// with `serve`'s settings, each like one replica) publish a 4-member
/// conversation's accepted messages to the run's nats-server and settle them,
/// on a JetStream team with `publication = outbox`.
///
/// `Some(load)`, open loop: a feeder accepts messages at a fixed rate,
/// `load` × the raw baseline's rate measured just before, for the window. One
/// operation is one message becoming `stored` inside the window; the latency
/// is acceptance → stored (the message's `created_at` to the `stored_at` its
/// confirmation wrote, both on the database's clock) of every message
/// accepted inside the window, waited for up to [`SETTLE_LIMIT`] after it.
///
/// `None`, capacity: [`BACKLOG`] messages are accepted first, then the drain
/// starts and one operation is one message stored until the outbox is empty
/// (no latency: every message waited from the start).
///
/// Accepting is raw SQL (the message, its 3 receipts and its outbox slot, as
/// `send` writes them, in batches, one wake-up event per batch): the send
/// path is measured by `conversation_send_store`, not here.
async fn outbox_drain_jetstream(ctx: Arc<Ctx>, clients: usize, load: Option<f64>) -> Result<Run> {
    use ai_crew_sync::backend::Backends;
    use ai_crew_sync::backend::jetstream::{Broker, StreamSizes, body_stream_name};
    use ai_crew_sync::workers::publication::{DrainSettings, spawn_drain};

    let baseline = ctx
        .own_baseline_ops
        .lock()
        .expect("not poisoned")
        .take()
        .context("the raw JetStream baseline did not run before this scenario")?;
    let pool = ctx.pool.clone();
    let broker = Broker::connect(&nats_url(&ctx)?, None).await?;
    let (team_id, agent_id): (uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "UPDATE teams t SET conversations_enabled = true FROM agents a
         WHERE a.team_id = t.id AND t.slug = 'bench' AND a.name = 'bench'
         RETURNING t.id, a.id",
    )
    .fetch_one(&pool)
    .await
    .context("finding the bench team")?;
    // The default 100 000 bodies would fill up within a run.
    let sizes = StreamSizes {
        max_messages: 100_000_000,
        ..StreamSizes::default()
    };
    broker.provision_team(team_id, &sizes, true).await?;
    broker
        .js()
        .get_stream(body_stream_name(team_id))
        .await
        .context("opening the team's body stream")?
        .purge()
        .await
        .context("purging the team's body stream")?;
    let conversation =
        seat_conversations_on(&pool, team_id, agent_id, 1, "jetstream", "outbox").await?[0];
    let feeder = Feeder::new(&pool, team_id, agent_id, conversation).await?;

    let shutdown = tokio_util::sync::CancellationToken::new();
    let bus = ai_crew_sync::Bus::start(
        pool.clone(),
        std::time::Duration::from_secs(30),
        shutdown.clone(),
    )
    .with_backends(Backends::with_broker(pool.clone(), broker));
    // `serve`'s settings; BENCH_DRAIN_LANES overrides the lanes, to compare.
    let mut settings = DrainSettings::default();
    if let Ok(lanes) = std::env::var("BENCH_DRAIN_LANES") {
        settings.lanes = lanes
            .parse()
            .context("BENCH_DRAIN_LANES must be a whole number")?;
    }
    let spawn_workers = || -> Vec<_> {
        (0..clients)
            .map(|_| spawn_drain(bus.clone(), settings.clone(), shutdown.clone()))
            .collect()
    };
    let mut workers = Vec::new();
    let outcome = async {
        let Some(load) = load else {
            let mut accepted = 0;
            while accepted < BACKLOG {
                let n = (BACKLOG - accepted).min(FEED_MAX_BATCH as i64);
                feeder.accept(&pool, n).await?;
                accepted += n;
            }
            let from = db_now(&pool).await?;
            workers = spawn_workers();
            let to = feeder.settled(&pool, SETTLE_LIMIT * 4).await?;
            let stored = feeder.stored_between(&pool, from, to).await?;
            let mut run = Run::open_loop(stored as usize, db_secs(from, to)?, Vec::new());
            run.backlog = Some(BACKLOG);
            return Ok(run);
        };
        let rate = (baseline * load).max(1.0);
        workers = spawn_workers();
        let started = Instant::now();
        let measure_from = started + ctx.timing.warmup;
        let deadline = measure_from + ctx.timing.measure;
        let mut window_from = None;
        let mut ticker = tokio::time::interval(FEED_TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut fed = 0u64;
        loop {
            ticker.tick().await;
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if window_from.is_none() && now >= measure_from {
                window_from = Some((db_now(&pool).await?, fed));
            }
            let due = ((now - started).as_secs_f64() * rate) as u64;
            if due > fed {
                let n = (due - fed).min(FEED_MAX_BATCH);
                feeder.accept(&pool, n as i64).await?;
                bus.events.emit(feeder.event());
                // Behind schedule, the feeder offers less rather than bursting.
                fed = if n < due - fed { due } else { fed + n };
            }
        }
        let window_to = db_now(&pool).await?;
        let (window_from, _) = window_from.context("the window never opened")?;
        let (offered, backlog) = feeder
            .offered_and_backlog(&pool, window_from, window_to)
            .await?;
        let until = feeder.settled(&pool, SETTLE_LIMIT).await;
        let stored = feeder.stored_between(&pool, window_from, window_to).await?;
        let latencies = feeder.latencies(&pool, window_from, window_to).await?;
        until?;
        let secs = db_secs(window_from, window_to)?;
        let mut run = Run::open_loop(stored as usize, secs, latencies);
        run.offered_per_s = Some(offered as f64 / secs.as_secs_f64());
        run.backlog = Some(backlog);
        Ok(run)
    }
    .await;
    shutdown.cancel();
    for worker in workers {
        let _ = worker.await;
    }
    // Whatever is left must not be drained into the next run's figures.
    sqlx::query("DELETE FROM conversation_outbox WHERE conversation_id = $1")
        .bind(conversation)
        .execute(&pool)
        .await?;
    outcome
}

async fn db_now(pool: &PgPool) -> Result<chrono::DateTime<chrono::Utc>> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .context("reading the database clock")
}

fn db_secs(
    from: chrono::DateTime<chrono::Utc>,
    to: chrono::DateTime<chrono::Utc>,
) -> Result<std::time::Duration> {
    (to - from)
        .to_std()
        .context("the database clock went backwards")
}

/// Accepts messages into one outbox conversation as `send` would, and reads
/// back what became of them.
struct Feeder {
    team_id: uuid::Uuid,
    agent_id: uuid::Uuid,
    conversation: uuid::Uuid,
    sender: uuid::Uuid,
    recipients: (Vec<uuid::Uuid>, Vec<String>),
    digest: Vec<u8>,
}

/// The `stored_at` a message `m`'s confirmation wrote (on each receipt).
macro_rules! stored_at {
    () => {
        "(SELECT r.stored_at FROM message_receipts r
          WHERE r.team_id = m.team_id AND r.message_id = m.id LIMIT 1)"
    };
}

impl Feeder {
    async fn new(
        pool: &PgPool,
        team_id: uuid::Uuid,
        agent_id: uuid::Uuid,
        conversation: uuid::Uuid,
    ) -> Result<Feeder> {
        use sha2::Digest as _;
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
        Ok(Feeder {
            team_id,
            agent_id,
            conversation,
            sender,
            recipients,
            digest: sha2::Sha256::digest(SHORT_BODY.as_bytes()).to_vec(),
        })
    }

    /// Accept `n` messages in one transaction.
    async fn accept(&self, pool: &PgPool, n: i64) -> Result<()> {
        let mut tx = pool.begin().await?;
        let first: i64 = sqlx::query_scalar(
            "UPDATE conversations SET last_seq = last_seq + $3
             WHERE team_id = $1 AND id = $2 RETURNING last_seq - $3 + 1",
        )
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(n)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "WITH msgs AS (
                 INSERT INTO conversation_messages
                     (id, team_id, conversation_id, seq, sender_member_id, sender_id,
                      sender_session, request_id, body, body_sha256, body_bytes, backend,
                      publication_state)
                 SELECT gen_random_uuid(), $1, $2, $3 + g - 1, $4, $5, 'sender-0',
                        gen_random_uuid(), $6, $7, octet_length($6), 'jetstream',
                        'pending_publication'
                 FROM generate_series(1, $8::bigint) AS g
                 RETURNING id),
             receipts AS (
                 INSERT INTO message_receipts
                     (team_id, message_id, member_id, recipient_id, recipient_session)
                 SELECT $1, msgs.id, s.member_id, $5, s.session
                 FROM msgs, unnest($9::uuid[], $10::text[]) AS s(member_id, session))
             INSERT INTO conversation_outbox
                 (message_id, conversation_id, team_id, backend, payload, payload_bytes,
                  publish_key)
             SELECT id, $2, $1, 'jetstream', $6, octet_length($6), gen_random_uuid()
             FROM msgs",
        )
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(first)
        .bind(self.sender)
        .bind(self.agent_id)
        .bind(SHORT_BODY)
        .bind(&self.digest)
        .bind(n)
        .bind(&self.recipients.0)
        .bind(&self.recipients.1)
        .execute(&mut *tx)
        .await
        .context("accepting a batch of messages")?;
        tx.commit().await?;
        Ok(())
    }

    /// What a send into an outbox emits to wake an idle drain.
    fn event(&self) -> ai_crew_sync::events::BusEvent {
        use ai_crew_sync::events::{BusEvent, EventKind};
        let mut event = BusEvent::new(
            self.team_id,
            EventKind::Outbox,
            self.conversation.to_string(),
        );
        event.channel_id = Some(self.conversation);
        event
    }

    /// Wait until the conversation's outbox is empty, at most `limit`;
    /// returns the database's clock then.
    async fn settled(
        &self,
        pool: &PgPool,
        limit: std::time::Duration,
    ) -> Result<chrono::DateTime<chrono::Utc>> {
        let give_up = Instant::now() + limit;
        loop {
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM conversation_outbox WHERE conversation_id = $1",
            )
            .bind(self.conversation)
            .fetch_one(pool)
            .await?;
            if left == 0 {
                return db_now(pool).await;
            }
            if Instant::now() > give_up {
                bail!(
                    "{left} message(s) were still in the outbox {}s on",
                    limit.as_secs()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Messages accepted in the window, and slots still queued at its end.
    async fn offered_and_backlog(
        &self,
        pool: &PgPool,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
    ) -> Result<(i64, i64)> {
        Ok(sqlx::query_as(
            "SELECT (SELECT count(*) FROM conversation_messages m
                     WHERE m.team_id = $1 AND m.conversation_id = $2
                       AND m.created_at >= $3 AND m.created_at < $4),
                    (SELECT count(*) FROM conversation_outbox WHERE conversation_id = $2)",
        )
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(from)
        .bind(to)
        .fetch_one(pool)
        .await?)
    }

    /// Messages whose confirmation was written in [from, to).
    async fn stored_between(
        &self,
        pool: &PgPool,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
    ) -> Result<i64> {
        let failed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_messages
             WHERE team_id = $1 AND conversation_id = $2 AND publication_state = 'failed'",
        )
        .bind(self.team_id)
        .bind(self.conversation)
        .fetch_one(pool)
        .await?;
        if failed > 0 {
            bail!("{failed} message(s) failed to publish");
        }
        Ok(sqlx::query_scalar(concat!(
            "SELECT count(*) FROM conversation_messages m
             WHERE m.team_id = $1 AND m.conversation_id = $2 AND ",
            stored_at!(),
            " >= $3 AND ",
            stored_at!(),
            " < $4"
        ))
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(from)
        .bind(to)
        .fetch_one(pool)
        .await?)
    }

    /// Acceptance → stored of each message accepted in [from, to); one not
    /// stored yet counts with its age now.
    async fn latencies(
        &self,
        pool: &PgPool,
        from: chrono::DateTime<chrono::Utc>,
        to: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<std::time::Duration>> {
        let secs: Vec<f64> = sqlx::query_scalar(concat!(
            "SELECT extract(epoch FROM COALESCE(",
            stored_at!(),
            ", clock_timestamp()) - m.created_at)::float8
             FROM conversation_messages m
             WHERE m.team_id = $1 AND m.conversation_id = $2
               AND m.created_at >= $3 AND m.created_at < $4"
        ))
        .bind(self.team_id)
        .bind(self.conversation)
        .bind(from)
        .bind(to)
        .fetch_all(pool)
        .await?;
        Ok(secs
            .into_iter()
            .map(|s| std::time::Duration::from_secs_f64(s.max(0.0)))
            .collect())
    }
}

/// Messages in the conversation `migrate_conversation` moves (the figure).
const MIGRATED_MESSAGES: i64 = 10_000;
/// Stored messages are written in batches of this many.
const MIGRATE_BATCH: i64 = 1_000;

/// A conversation move (`conversations migrate --apply`, the library's
/// `moves::run`): a fresh 4-member conversation of [`MIGRATED_MESSAGES`]
/// stored synchronous PostgreSQL messages (each [`SHORT_BODY`] with its
/// SHA-256 and size, 3 receipts, written in raw SQL in batches) on the bench
/// team, its streams provisioned on the run's nats-server, is moved to
/// JetStream and then back to PostgreSQL. Two lines, `direction`
/// `to_jetstream` and `to_postgres`: one operation is one message copied and
/// verified; the time is the whole move (plan, copy, pause, tail, cut over);
/// the latency is the time between successive progress reports (one per
/// message copied; a page read of 200 lands on the next message); `paused_ms`
/// is how long writes to the thread were refused. Measured once, not per
/// client count: a move is one operator's command.
async fn migrate_conversation(ctx: Arc<Ctx>) -> Result<Run> {
    use ai_crew_sync::backend::Backends;
    use ai_crew_sync::backend::jetstream::{Broker, StreamSizes};
    use ai_crew_sync::store::moves::{self, Direction, Progress};

    // The raw publish baseline ran right before; its rate is on its own line.
    let _ = ctx.own_baseline_ops.lock().expect("not poisoned").take();
    let pool = ctx.pool.clone();
    let broker = Broker::connect(&nats_url(&ctx)?, None).await?;
    let (team_id, agent_id): (uuid::Uuid, uuid::Uuid) = sqlx::query_as(
        "UPDATE teams t SET conversations_enabled = true FROM agents a
         WHERE a.team_id = t.id AND t.slug = 'bench' AND a.name = 'bench'
         RETURNING t.id, a.id",
    )
    .fetch_one(&pool)
    .await
    .context("finding the bench team")?;
    // The same sizes as the drain scenarios, which may have provisioned first.
    let sizes = StreamSizes {
        max_messages: 100_000_000,
        ..StreamSizes::default()
    };
    broker.provision_team(team_id, &sizes, true).await?;
    let conversation =
        seat_conversations_on(&pool, team_id, agent_id, 1, "postgres", "sync").await?[0];
    store_messages(&pool, team_id, agent_id, conversation, MIGRATED_MESSAGES).await?;
    let backends = Backends::with_broker(pool.clone(), broker);

    let mut runs = Vec::new();
    for direction in [Direction::ToJetStream, Direction::ToPostgres] {
        let reports = std::sync::Mutex::new(Vec::with_capacity(MIGRATED_MESSAGES as usize));
        let record = |_: &Progress| reports.lock().expect("not poisoned").push(Instant::now());
        let started = Instant::now();
        let outcome = moves::run(
            &pool,
            &backends,
            team_id,
            conversation,
            direction,
            "bench",
            None,
            &record,
        )
        .await
        .with_context(|| format!("moving the conversation {}", direction.column()))?;
        let elapsed = started.elapsed();
        let reports = reports.into_inner().expect("not poisoned");
        let latencies = std::iter::once(started)
            .chain(reports.iter().copied())
            .zip(reports.iter().copied())
            .map(|(before, after)| after - before)
            .collect();
        let mut run = Run::open_loop(outcome.copied as usize, elapsed, latencies);
        run.migration = Some(crate::harness::Migration {
            direction: direction.column(),
            messages: outcome.copied,
            bytes: outcome.bytes,
            paused_ms: outcome.paused_ms,
        });
        if outcome.copied != MIGRATED_MESSAGES {
            bail!(
                "the move {} copied {} of {MIGRATED_MESSAGES} messages",
                direction.column(),
                outcome.copied
            );
        }
        runs.push(run);
    }
    let back = runs.pop().context("the move back")?;
    let mut there = runs.pop().context("the move there")?;
    there.then = Some(Box::new(back));
    Ok(there)
}

/// Write `n` stored messages into a synchronous PostgreSQL conversation as a
/// send would leave them (gap-free seqs, body with its SHA-256 and size, one
/// stored receipt per recipient seat), in batches of [`MIGRATE_BATCH`].
async fn store_messages(
    pool: &PgPool,
    team_id: uuid::Uuid,
    agent_id: uuid::Uuid,
    conversation: uuid::Uuid,
    n: i64,
) -> Result<()> {
    use sha2::Digest as _;
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
    let (rcpt_ids, rcpt_sessions): (Vec<uuid::Uuid>, Vec<String>) = members
        .into_iter()
        .filter(|(_, session)| session.starts_with("rcpt-"))
        .unzip();
    let digest = sha2::Sha256::digest(SHORT_BODY.as_bytes()).to_vec();
    let mut written = 0;
    while written < n {
        let batch = (n - written).min(MIGRATE_BATCH);
        let mut tx = pool.begin().await?;
        let first: i64 = sqlx::query_scalar(
            "UPDATE conversations SET last_seq = last_seq + $3
             WHERE team_id = $1 AND id = $2 RETURNING last_seq - $3 + 1",
        )
        .bind(team_id)
        .bind(conversation)
        .bind(batch)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "WITH msgs AS (
                 INSERT INTO conversation_messages
                     (id, team_id, conversation_id, seq, sender_member_id, sender_id,
                      sender_session, request_id, body, body_sha256, body_bytes, backend,
                      publication_state)
                 SELECT gen_random_uuid(), $1, $2, $3 + g - 1, $4, $5, 'sender-0',
                        gen_random_uuid(), $6, $7, octet_length($6), 'postgres', 'stored'
                 FROM generate_series(1, $8::bigint) AS g
                 RETURNING id)
             INSERT INTO message_receipts
                 (team_id, message_id, member_id, recipient_id, recipient_session, stored_at)
             SELECT $1, msgs.id, s.member_id, $5, s.session, now()
             FROM msgs, unnest($9::uuid[], $10::text[]) AS s(member_id, session)",
        )
        .bind(team_id)
        .bind(conversation)
        .bind(first)
        .bind(sender)
        .bind(agent_id)
        .bind(SHORT_BODY)
        .bind(&digest)
        .bind(batch)
        .bind(&rcpt_ids)
        .bind(&rcpt_sessions)
        .execute(&mut *tx)
        .await
        .context("storing a batch of messages")?;
        tx.commit().await?;
        written += batch;
    }
    Ok(())
}
