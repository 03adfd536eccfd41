//! The history benchmark: how the read tools' latency grows with a team's
//! history. Two teams in the same database: `hist-small` is seeded (1 000
//! messages, see `seed.rs`) and measured; then `hist-large` (1 000 000
//! messages, the rest in proportion) is seeded and measured the same way.
//! Every query is per team, so the small team measured before the large one
//! exists and the large one measured after are a fair pair.
//!
//! Each call in [`OPS`] is measured with 1 and 16 clients, every client on
//! its own kept-alive MCP session of agent `bench`: window `r<i>` for the
//! message, task, note and presence tools; window `desk` (the measured seat
//! of the team's one conversation) for the conversation tools; for the wake
//! a waiter `wait<i>` and a poster `post<i>`. Before measuring, every such
//! window has read everything (its `all`, `inbox` and channel cursors at the
//! newest message), as a working agent's has.
//!
//! One operation is one tool call, timed alone. What keeps a call
//! repeatable is done before or after it, untimed:
//! - `read_messages` with `only_new`: before each call the window's cursor
//!   for the scope is put back to the 51st-newest message of that scope, so
//!   every call reads (and marks read) the same newest page of up to 50.
//! - `fetch_conversation_inbox`: when a fetch hands out nothing (everything
//!   owed was handed out within the last minute), the window's hand-outs
//!   are forgotten (`handed_out_at` cleared), so the next fetch starts over.
//! - the wake: as `wake_latency`, the waiter's inbox is read after each wake.
//!
//! Lines: one per (call, client count, history), scenario `history` (or
//! `history_small`), with `op`, `history`, `seed_secs`, `p99_small_ms`,
//! `p99_large_ms`, and `ratio` = p99 large ÷ p99 small.

mod seed;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use super::Ctx;
use super::messaging::wake_once;
use crate::harness::{History, Run, closed_loop};
use crate::mcp_client::McpClient;
pub use seed::{LARGE, SMALL, Size};

/// The channel the channel scope reads (seeded `ch-01`..`ch-50`).
const CHANNEL: &str = "ch-07";
/// What a `read_messages` with `only_new` re-reads each time.
const NEW_PAGE: i64 = 50;

/// The window a call is made from.
#[derive(Clone, Copy)]
enum From {
    /// `r<i>`: one window per client.
    Reader,
    /// `desk`: the conversation's measured seat, shared by every client.
    Desk,
}

/// What is done, untimed, to keep the call repeatable.
#[derive(Clone, Copy)]
enum Keep {
    Nothing,
    /// Put the cursor of this scope (`all`, `inbox`, `#ch-07`) back before the call.
    Cursor(&'static str),
    /// Forget this window's hand-outs when a fetch hands out nothing.
    InboxHandouts,
    /// The measured op is a wake (`wake_once`), not `tool`.
    Wake,
}

struct Op {
    name: &'static str,
    tool: &'static str,
    from: From,
    args: fn(&seed::Team) -> Value,
    keep: Keep,
}

const fn op(
    name: &'static str,
    tool: &'static str,
    from: From,
    args: fn(&seed::Team) -> Value,
    keep: Keep,
) -> Op {
    Op {
        name,
        tool,
        from,
        args,
        keep,
    }
}

/// Every measured call, in order (the wake last: it posts new messages).
const OPS: &[Op] = &[
    op(
        "whoami",
        "whoami",
        From::Reader,
        |_| json!({}),
        Keep::Nothing,
    ),
    op(
        "list_channels",
        "list_channels",
        From::Reader,
        |_| json!({}),
        Keep::Nothing,
    ),
    op(
        "read_messages(all,only_new)",
        "read_messages",
        From::Reader,
        |_| json!({"scope": "all", "only_new": true, "limit": NEW_PAGE}),
        Keep::Cursor("all"),
    ),
    op(
        "read_messages(all)",
        "read_messages",
        From::Reader,
        |_| json!({"scope": "all", "only_new": false}),
        Keep::Nothing,
    ),
    op(
        "read_messages(inbox,only_new)",
        "read_messages",
        From::Reader,
        |_| json!({"scope": "inbox", "only_new": true, "limit": NEW_PAGE}),
        Keep::Cursor("inbox"),
    ),
    op(
        "read_messages(inbox)",
        "read_messages",
        From::Reader,
        |_| json!({"scope": "inbox", "only_new": false}),
        Keep::Nothing,
    ),
    op(
        "read_messages(channel,only_new)",
        "read_messages",
        From::Reader,
        |_| json!({"scope": CHANNEL, "only_new": true, "limit": NEW_PAGE}),
        Keep::Cursor("#ch-07"),
    ),
    op(
        "read_messages(channel)",
        "read_messages",
        From::Reader,
        |_| json!({"scope": CHANNEL, "only_new": false}),
        Keep::Nothing,
    ),
    op(
        "search_messages(rare)",
        "search_messages",
        From::Reader,
        |_| json!({"query": seed::RARE_WORD}),
        Keep::Nothing,
    ),
    op(
        "search_messages(common)",
        "search_messages",
        From::Reader,
        |_| json!({"query": seed::COMMON_WORD}),
        Keep::Nothing,
    ),
    op(
        "team_digest",
        "team_digest",
        From::Reader,
        |_| json!({"all_channels": true}),
        Keep::Nothing,
    ),
    op(
        "list_agents",
        "list_agents",
        From::Reader,
        |_| json!({}),
        Keep::Nothing,
    ),
    op(
        "list_sessions",
        "list_sessions",
        From::Reader,
        |_| json!({}),
        Keep::Nothing,
    ),
    op(
        "list_tasks",
        "list_tasks",
        From::Reader,
        |_| json!({}),
        Keep::Nothing,
    ),
    op(
        "get_task",
        "get_task",
        From::Reader,
        |team| json!({"key": team.task_key}),
        Keep::Nothing,
    ),
    op(
        "list_notes",
        "list_notes",
        From::Reader,
        |_| json!({}),
        Keep::Nothing,
    ),
    op(
        "search_notes",
        "search_notes",
        From::Reader,
        |_| json!({"query": seed::RARE_NOTE_WORD}),
        Keep::Nothing,
    ),
    op(
        "list_conversations",
        "list_conversations",
        From::Desk,
        |_| json!({}),
        Keep::Nothing,
    ),
    op(
        "read_conversation(first)",
        "read_conversation",
        From::Desk,
        |team| json!({"conversation_id": team.conversation_id, "after_seq": 0}),
        Keep::Nothing,
    ),
    op(
        "read_conversation(deep)",
        "read_conversation",
        From::Desk,
        |team| json!({"conversation_id": team.conversation_id, "after_seq": team.deep_after_seq}),
        Keep::Nothing,
    ),
    op(
        "get_message_receipts",
        "get_message_receipts",
        From::Desk,
        |team| json!({"message_id": team.receipts_message_id}),
        Keep::Nothing,
    ),
    op(
        "fetch_conversation_inbox",
        "fetch_conversation_inbox",
        From::Desk,
        |_| json!({}),
        Keep::InboxHandouts,
    ),
    op(
        "conversation_inbox_status",
        "conversation_inbox_status",
        From::Desk,
        |_| json!({}),
        Keep::Nothing,
    ),
    op(
        "wait_for_updates(wake)",
        "wait_for_updates",
        From::Reader,
        |_| json!({}),
        Keep::Wake,
    ),
];

/// The scenarios: every size in `sizes` seeded and measured in turn.
pub async fn history(ctx: Arc<Ctx>, sizes: &'static [Size]) -> Result<Run> {
    // BENCH_HISTORY_OPS=a,b: only these calls (by their line's `op`), in
    // the order of OPS; to measure a few calls at long windows.
    let chosen: Option<std::collections::HashSet<String>> = std::env::var("BENCH_HISTORY_OPS")
        .ok()
        .map(|list| list.split(',').map(|op| op.trim().to_string()).collect());
    if let Some(chosen) = &chosen {
        let unknown: Vec<&String> = chosen
            .iter()
            .filter(|c| !OPS.iter().any(|op| op.name == c.as_str()))
            .collect();
        anyhow::ensure!(
            unknown.is_empty(),
            "BENCH_HISTORY_OPS names calls the history benchmark does not measure: {unknown:?}; \
             known: {:?}",
            OPS.iter().map(|op| op.name).collect::<Vec<_>>()
        );
    }
    // (op, clients) → the small history's p99, for the ratio.
    let mut lines: Vec<Run> = Vec::new();
    let mut small_p99: HashMap<(&str, usize), Option<f64>> = HashMap::new();
    for &size in sizes {
        eprintln!("bench: history: seeding the {} history", size.name);
        let started = Instant::now();
        let team = Arc::new(seed::seed(&ctx.pool, size).await?);
        let seed_secs = started.elapsed().as_secs_f64();
        eprintln!("bench: history: {} seeded in {seed_secs:.1} s", size.name);
        let points = Arc::new(prepare_windows(&ctx.pool, &team).await?);
        for op in OPS
            .iter()
            .filter(|op| chosen.as_ref().is_none_or(|c| c.contains(op.name)))
        {
            for &clients in crate::CLIENT_COUNTS {
                eprintln!(
                    "bench: history ({}): {} with {clients} client(s)",
                    size.name, op.name
                );
                let mut run = measure(&ctx, &team, &points, op, clients)
                    .await
                    .with_context(|| format!("history {}: {}", size.name, op.name))?;
                let p99 = run.percentile_ms(99.0);
                let (p99_small_ms, p99_large_ms) = if size.name == SMALL.name {
                    small_p99.insert((op.name, clients), p99);
                    (p99, None)
                } else {
                    (small_p99.get(&(op.name, clients)).copied().flatten(), p99)
                };
                run.history = Some(History {
                    op: op.name,
                    clients,
                    history: size.name,
                    seed_secs,
                    p99_small_ms,
                    p99_large_ms,
                });
                lines.push(run);
            }
        }
    }
    // The small lines learn the large p99 too, so every line has its ratio.
    let large: HashMap<(&str, usize), Option<f64>> = lines
        .iter()
        .filter_map(|run| run.history.as_ref())
        .filter(|h| h.history != SMALL.name)
        .map(|h| ((h.op, h.clients), h.p99_large_ms))
        .collect();
    for run in &mut lines {
        if let Some(h) = run.history.as_mut()
            && h.history == SMALL.name
        {
            h.p99_large_ms = large.get(&(h.op, h.clients)).copied().flatten();
        }
    }
    // One chain of lines, in measured order.
    let mut chain: Option<Run> = None;
    for mut run in lines.into_iter().rev() {
        run.then = chain.map(Box::new);
        chain = Some(run);
    }
    chain.context("no history was measured")
}

/// The cursor each only_new read is put back to, per scope.
type Points = HashMap<&'static str, i64>;

/// Every measuring window has read everything; returns, per scope, the
/// position just before the newest page of [`NEW_PAGE`] messages.
async fn prepare_windows(pool: &sqlx::PgPool, team: &seed::Team) -> Result<Points> {
    let max = crate::CLIENT_COUNTS.iter().copied().max().unwrap_or(1);
    let mut windows = vec!["desk".to_string()];
    for i in 0..max {
        windows.extend([format!("r{i}"), format!("wait{i}"), format!("post{i}")]);
    }
    let scopes = ["all", "inbox", "#ch-07"];
    sqlx::query(
        "INSERT INTO read_cursors (team_id, agent_id, session, scope, last_position)
         SELECT $1, $2, w, s, m.position
         FROM unnest($3::text[]) AS w CROSS JOIN unnest($4::text[]) AS s
         CROSS JOIN (SELECT position FROM messages WHERE team_id = $1
                     ORDER BY position DESC LIMIT 1) m
         ON CONFLICT (team_id, agent_id, session, scope)
         DO UPDATE SET last_position = EXCLUDED.last_position",
    )
    .bind(team.id)
    .bind(team.agent_id)
    .bind(&windows)
    .bind(&scopes[..])
    .execute(pool)
    .await
    .context("moving the measuring windows' cursors to the newest message")?;
    let mut points = Points::new();
    for (scope, filter) in [
        ("all", "(m.channel_id IS NOT NULL OR m.recipient_id = $2)"),
        ("inbox", "m.recipient_id = $2"),
        (
            "#ch-07",
            "m.channel_id = (SELECT id FROM channels WHERE team_id = $1 AND name = 'ch-07')",
        ),
    ] {
        let point: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT m.position FROM messages m WHERE m.team_id = $1 AND {filter}
             ORDER BY m.position DESC OFFSET $3 LIMIT 1"
        )))
        .bind(team.id)
        .bind(team.agent_id)
        .bind(NEW_PAGE)
        .fetch_optional(pool)
        .await
        .with_context(|| format!("the newest page of {scope}"))?;
        // Fewer than a page in the scope: every call reads them all.
        points.insert(scope, point.unwrap_or(0));
    }
    Ok(points)
}

/// `op` with `clients` workers against `team`.
async fn measure(
    ctx: &Arc<Ctx>,
    team: &Arc<seed::Team>,
    points: &Arc<Points>,
    op: &'static Op,
    clients: usize,
) -> Result<Run> {
    let (ctx, team, points) = (ctx.clone(), team.clone(), points.clone());
    closed_loop(clients, ctx.timing, move |i, window| {
        let (ctx, team, points) = (ctx.clone(), team.clone(), points.clone());
        async move {
            let open = |label: String| {
                let (url, token) = (ctx.mcp_url.clone(), team.token.clone());
                async move { McpClient::open(&url, &token, Some(&label)).await }
            };
            if let Keep::Wake = op.keep {
                let waiter = Arc::new(open(format!("wait{i}")).await?);
                let poster = open(format!("post{i}")).await?;
                let post = json!({"to": format!("bench/wait{i}"), "body": "wake up"});
                let mut rec = window.open().await;
                while rec.is_open() {
                    wake_once(&mut rec, &waiter, &poster, &post).await?;
                }
                return Ok(rec.finish());
            }
            let label = match op.from {
                From::Reader => format!("r{i}"),
                From::Desk => "desk".to_string(),
            };
            let client = open(label.clone()).await?;
            let args = (op.args)(&team);
            let mut rec = window.open().await;
            // A call slower than the window is still measured once.
            while rec.wants_more(1) {
                if let Keep::Cursor(scope) = op.keep {
                    put_cursor_back(&ctx.pool, &team, &label, scope, points[scope]).await?;
                }
                let started = Instant::now();
                let answer = client.call(op.tool, args.clone()).await?;
                rec.record(started);
                if let Keep::InboxHandouts = op.keep
                    && answer["deliveries"].as_array().is_some_and(Vec::is_empty)
                {
                    forget_handouts(&ctx.pool, &team, &label).await?;
                }
            }
            Ok(rec.finish())
        }
    })
    .await
}

async fn put_cursor_back(
    pool: &sqlx::PgPool,
    team: &seed::Team,
    window: &str,
    scope: &str,
    position: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE read_cursors SET last_position = $5
         WHERE team_id = $1 AND agent_id = $2 AND session = $3 AND scope = $4",
    )
    .bind(team.id)
    .bind(team.agent_id)
    .bind(window)
    .bind(scope)
    .bind(position)
    .execute(pool)
    .await
    .context("putting a cursor back")?;
    Ok(())
}

async fn forget_handouts(pool: &sqlx::PgPool, team: &seed::Team, window: &str) -> Result<()> {
    let key = ai_crew_sync::store::conversations::inbox::recipient_key(team.agent_id, window);
    // Rows a fetch in flight holds are skipped, not waited for: waiting
    // deadlocked with a fetch whose top-up insert waited on a row this
    // update had just rewritten (one run of 2026-12-05). The fetch hands
    // those rows out anyway.
    sqlx::query(
        "UPDATE inbox_references SET handed_out_at = NULL
         WHERE id IN (SELECT id FROM inbox_references
                      WHERE team_id = $1 AND recipient_key = $2 AND delivered_at IS NULL
                      FOR UPDATE SKIP LOCKED)",
    )
    .bind(team.id)
    .bind(key)
    .execute(pool)
    .await
    .context("forgetting the inbox's hand-outs")?;
    Ok(())
}
