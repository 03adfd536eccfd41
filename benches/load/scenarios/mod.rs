//! The measured workloads. A scenario is a name and an async function that
//! drives `clients` concurrent workers against the running server and returns
//! what they measured; add one by writing the function in its area's file and
//! listing it in [`SCENARIOS`], the registry the runner lists and selects
//! from. The baseline is not a scenario: it always runs, because every
//! scenario's figure is a ratio to it.
//!
//! One file per area: `messaging` (MCP round trips), `long_polls` (1 000
//! or 10 000 blocked waits beside a measured pair), `teams` (one team's
//! posts against 16 teams'), `capacity` (a folder: agents as hosts run them,
//! raised in steps), `peer` (mcp_agent_mail_rust's workloads), `tasks`,
//! `reservations` (`check_paths` against 1 000 live reservations),
//! `history` (a folder: read tools against a seeded small and large
//! history, run by name only),
//! `conversations`, `outbox` (the drain to JetStream), `moves` (a
//! conversation moved between backends), and `baseline` (the yardsticks that
//! are not one area's). This file holds what they share: the run's [`Ctx`],
//! the registry, the MCP clients (the benchmark's kept-alive
//! [`McpClient`], and the library's rmcp `Connection` for `whoami_rmcp`) and
//! a few constants.

mod baseline;
mod capacity;
mod conversations;
mod history;
mod long_polls;
mod messaging;
mod moves;
mod outbox;
mod peer;
mod reservations;
mod tasks;
mod teams;

use std::sync::Arc;

use ai_crew_sync::client::Connection;
use anyhow::{Context as _, Result};
use futures::future::BoxFuture;
use serde_json::Value;
use sqlx::PgPool;

use crate::harness::{Run, Timing};
use crate::mcp_client::McpClient;

pub use baseline::pg_insert_commit;

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
    /// The server's process id, for a scenario that reads its memory per step.
    pub server_pid: u32,
    /// The rate of the own baseline measured right before the scenario now
    /// running: an open-loop scenario offers a load relative to it.
    pub own_baseline_ops: std::sync::Mutex<Option<f64>>,
}

pub type RunFn = fn(Arc<Ctx>, usize) -> BoxFuture<'static, Result<Run>>;

/// One entry of the registry: what the runner lists, selects by name and runs.
pub struct Scenario {
    pub name: &'static str,
    /// What one operation is, in a line (listed with the names).
    pub about: &'static str,
    pub run: RunFn,
    /// A baseline of its own, run right before it at the same client count;
    /// `None` compares it with [`BASELINE`].
    pub baseline: Option<OwnBaseline>,
    /// Whether the runner must start a `nats-server` for it.
    pub needs_nats: bool,
    /// Measured once, at the first client count only (its `clients` do not
    /// mean concurrency).
    pub once: bool,
    /// Left out of a run that names no scenario (it is long); run by name.
    pub by_name_only: bool,
}

/// The same work as a scenario, done with nothing in between (raw SQL on the
/// same database, raw publishes to the same broker).
pub struct OwnBaseline {
    pub name: &'static str,
    pub run: RunFn,
}

const PG_CLAIM_COMPLETE: OwnBaseline = OwnBaseline {
    name: "pg_claim_complete",
    run: |ctx, clients| Box::pin(tasks::pg_claim_complete(ctx, clients)),
};
const PG_MESSAGE_RECEIPTS: OwnBaseline = OwnBaseline {
    name: "pg_message_receipts",
    run: |ctx, clients| Box::pin(conversations::pg_message_receipts(ctx, clients)),
};
/// The drain's yardstick: how fast the same run's clients send into outbox
/// conversations over MCP.
const CONVERSATION_SEND_OUTBOX: OwnBaseline = OwnBaseline {
    name: "conversation_send_outbox",
    run: |ctx, clients| Box::pin(outbox::conversation_send_outbox(ctx, clients)),
};
/// `post_one_team`'s yardstick: the same posts from clients each in a team
/// of its own.
const POST_TEAMS: OwnBaseline = OwnBaseline {
    name: "post_teams",
    run: |ctx, clients| Box::pin(teams::post_teams(ctx, clients)),
};
const JETSTREAM_PUBLISH: OwnBaseline = OwnBaseline {
    name: baseline::JETSTREAM_BASELINE,
    run: |ctx, clients| Box::pin(baseline::jetstream_publish(ctx, clients)),
};

/// The registry: every scenario, in the order a full run measures them.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "whoami",
        about: "an authenticated MCP round trip",
        run: |ctx, clients| Box::pin(messaging::whoami(ctx, clients)),
        baseline: None,
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "whoami_rmcp",
        about: "whoami through the library's rmcp client (a connection per call), for reference",
        run: |ctx, clients| Box::pin(messaging::whoami_rmcp(ctx, clients)),
        baseline: None,
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "post_read",
        about: "post_message (a DM to the next window) + read_messages of the own inbox",
        run: |ctx, clients| Box::pin(messaging::post_read(ctx, clients)),
        baseline: None,
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "wake_latency",
        about: "a post_message until the recipient's blocked wait_for_updates returns",
        run: |ctx, clients| Box::pin(messaging::wake_latency(ctx, clients)),
        baseline: None,
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "long_polls",
        about: "wake_latency of one pair while 1 000 other windows are blocked in wait_for_updates",
        run: |ctx, clients| Box::pin(long_polls::long_polls(ctx, clients, long_polls::BLOCKED)),
        baseline: None,
        needs_nats: false,
        once: true,
        by_name_only: false,
    },
    Scenario {
        name: "long_polls_10k",
        about: "the same with 10 000 windows blocked: the memory of a large fleet's waits",
        run: |ctx, clients| {
            Box::pin(long_polls::long_polls(
                ctx,
                clients,
                long_polls::BLOCKED_10K,
            ))
        },
        baseline: None,
        needs_nats: false,
        once: true,
        by_name_only: false,
    },
    Scenario {
        name: "post_one_team",
        about: "post_message to #general of one team, every client an agent of it in its own window",
        run: |ctx, clients| Box::pin(teams::post_one_team(ctx, clients)),
        baseline: Some(POST_TEAMS),
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "capacity",
        about: "agents as hosts run them (a blocked wait each, a call every 10 s) in 100 teams, raised in steps",
        run: |ctx, _| Box::pin(capacity::capacity(ctx)),
        baseline: None,
        needs_nats: false,
        once: true,
        by_name_only: false,
    },
    Scenario {
        name: "peer_burst",
        about: "mcp_agent_mail_rust's burst: 30 agents x 5 DMs at once, then each fetches its inbox",
        run: |ctx, _| Box::pin(peer::peer_burst(ctx)),
        baseline: None,
        needs_nats: false,
        once: true,
        by_name_only: false,
    },
    Scenario {
        name: "peer_mixed",
        about: "mcp_agent_mail_rust's mix: 30 s of sends, reads, searches, lock and task calls from 30 agents",
        run: |ctx, _| Box::pin(peer::peer_mixed(ctx)),
        baseline: None,
        needs_nats: false,
        once: true,
        by_name_only: false,
    },
    Scenario {
        name: "claim_complete",
        about: "claim_next_task + complete_task, each client its own window",
        run: |ctx, clients| Box::pin(tasks::claim_complete(ctx, clients)),
        baseline: Some(PG_CLAIM_COMPLETE),
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "check_paths",
        about: "check_paths of 50 paths against 1 000 live reservations of one project",
        run: |ctx, clients| Box::pin(reservations::check_paths(ctx, clients)),
        baseline: None,
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "conversation_send",
        about: "send_conversation_message into a conversation of 4 members, over MCP",
        run: |ctx, clients| Box::pin(conversations::conversation_send(ctx, clients)),
        baseline: Some(PG_MESSAGE_RECEIPTS),
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "conversation_send_store",
        about: "the same send through the library's store path, no MCP or HTTP",
        run: |ctx, clients| Box::pin(conversations::conversation_send_store(ctx, clients)),
        baseline: Some(PG_MESSAGE_RECEIPTS),
        needs_nats: false,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "outbox_drain_jetstream_backlog",
        about: "an accepted outbox message stored on JetStream, draining a backlog: the drain's capacity",
        run: |ctx, clients| Box::pin(outbox::outbox_drain_jetstream(ctx, clients, None)),
        baseline: Some(CONVERSATION_SEND_OUTBOX),
        needs_nats: true,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "outbox_drain_jetstream",
        about: "the same at a quarter of that capacity, offered steadily: acceptance to stored",
        run: |ctx, clients| {
            Box::pin(outbox::outbox_drain_jetstream(
                ctx,
                clients,
                Some(outbox::TARGET_LOAD),
            ))
        },
        baseline: Some(JETSTREAM_PUBLISH),
        needs_nats: true,
        once: false,
        by_name_only: false,
    },
    Scenario {
        name: "migrate_conversation",
        about: "a message of a 10 000-message conversation moved to JetStream and back",
        run: |ctx, _| Box::pin(moves::migrate_conversation(ctx)),
        baseline: Some(JETSTREAM_PUBLISH),
        needs_nats: true,
        once: true,
        by_name_only: false,
    },
    Scenario {
        name: "history_small",
        about: "read tools against a seeded small history only (1 000 messages; ~2 min)",
        run: |ctx, _| Box::pin(history::history(ctx, &[history::SMALL])),
        baseline: None,
        needs_nats: false,
        once: true,
        by_name_only: true,
    },
    Scenario {
        name: "history",
        about: "read tools against a small, then a large seeded history (1 000 000 messages)",
        run: |ctx, _| Box::pin(history::history(ctx, &[history::SMALL, history::LARGE])),
        baseline: None,
        needs_nats: false,
        once: true,
        by_name_only: true,
    },
];

/// The name the baseline's lines carry.
pub const BASELINE: &str = "pg_insert_commit";

impl Ctx {
    /// An MCP session of agent `bench` as window `session` (None: its shared
    /// window), initialize done, on a kept-alive HTTP/1.1 connection of its
    /// own (see `mcp_client`): what an agent on an official SDK sees.
    pub async fn connect(&self, session: Option<&str>) -> Result<McpClient> {
        McpClient::open(&self.mcp_url, &self.token, session).await
    }

    /// The same session through the library's rmcp client, the one the
    /// console client speaks with. Its HTTP client keeps no idle connections
    /// (to dodge delayed-ACK stalls), so each call opens one: `whoami_rmcp`
    /// keeps that figure for reference. `main` turns proxies off, so traffic
    /// cannot leave 127.0.0.1.
    pub async fn connect_rmcp(&self, session: Option<&str>) -> Result<Connection> {
        Connection::open(&self.mcp_url, &self.token, session).await
    }
}

/// Call `tool` with a JSON object of arguments, failing on a transport error
/// or a refusal: a benchmark that counts refusals as work measures nothing.
pub async fn call_tool(client: &McpClient, tool: &str, args: Value) -> Result<Value> {
    client.call(tool, args).await
}

/// The body every benchmark message carries (as in `conversation_send`).
const SHORT_BODY: &str = "a short message about the work at hand";

fn nats_url(ctx: &Ctx) -> Result<String> {
    ctx.nats_url
        .clone()
        .context("this scenario needs the run's nats-server, and none was started")
}
