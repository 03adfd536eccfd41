//! The process's Prometheus metrics: the one recorder, every metric name, and
//! the small `record_*` functions the instrumented sites call (one line
//! each), so a name and its labels are written down once, here.
//!
//! Two kinds of numbers, kept apart on purpose:
//!
//! - **Events of this process** (tool calls, HTTP responses, refusals,
//!   notifications heard, publish outcomes): counters, histograms and the
//!   open long polls gauge, held by the `metrics` recorder. The recorder is
//!   process-wide and installed once ([`install`]); every server built in
//!   this process renders the same totals.
//! - **State of the database** (outbox slots, inbox references owed, moves,
//!   the pool, the event listener): read at scrape time from the scraping
//!   server's own pool and hub (`acs_store::store::operations::scrape`), and rendered
//!   by `acs_server::http::metrics` after the recorder's text under the names
//!   declared here, so they are exact for that server and cost nothing
//!   between scrapes.
//!
//! This crate imports nothing of the bus: the instrumented sites pass plain
//! numbers and labels, and the refusal kinds of a tool result are read by the
//! MCP layer.
//!
//! Labels never carry a body, a token, an agent or window name: a tool's
//! name (only of tools that exist), an outcome or kind from a fixed list, a
//! route template, a status code, and on a few team-level gauges the team's
//! slug (bounded by the number of teams).
//!
//! What it deliberately does not do: serve HTTP. `http::metrics` answers
//! `GET /metrics`; the exporter's own listener is not compiled in.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

// Counters and histograms of this process.
pub const TOOL_CALLS: &str = "bus_mcp_tool_calls_total";
pub const TOOL_DURATION: &str = "bus_mcp_tool_call_duration_seconds";
pub const HTTP_RESPONSES: &str = "bus_http_responses_total";
pub const HTTP_REFUSALS: &str = "bus_http_refusals_total";
pub const LONG_POLLS_OPEN: &str = "bus_long_polls_open";
pub const DB_POOL_TIMEOUTS: &str = "bus_db_pool_acquire_timeouts_total";
pub const EVENT_NOTIFICATIONS: &str = "bus_event_notifications_received_total";
pub const EVENT_RECONNECTS: &str = "bus_event_listener_disconnects_total";
pub const OUTBOX_PUBLISH: &str = "bus_outbox_publish_outcomes_total";
pub const OUTBOX_RECONCILED: &str = "bus_outbox_reconciled_total";
pub const BODIES_SWEPT: &str = "bus_outbox_bodies_swept_total";
/// Emitted by the webhook dispatcher (`outcome` label); named here so the
/// list in docs/operations.md and the description stay in one place.
pub const WEBHOOK_DELIVERIES: &str = "bus_webhook_deliveries_total";

// Gauges read from the database and the hub at scrape time.
pub const DB_POOL_CONNECTIONS: &str = "bus_db_pool_connections";
pub const DB_POOL_IDLE: &str = "bus_db_pool_idle_connections";
pub const DB_POOL_MAX: &str = "bus_db_pool_max_connections";
pub const EVENT_LISTENER_STATE: &str = "bus_event_listener_state";
pub const OUTBOX_SLOTS: &str = "bus_outbox_slots";
pub const OUTBOX_OLDEST_PENDING: &str = "bus_outbox_oldest_pending_age_seconds";
pub const OUTBOX_PENDING_BYTES: &str = "bus_outbox_pending_bytes";
pub const OUTBOX_UNCERTAIN: &str = "bus_outbox_uncertain_messages";
pub const OUTBOX_TEAM_PENDING: &str = "bus_outbox_team_pending_slots";
pub const OUTBOX_TEAM_OLDEST_PENDING: &str = "bus_outbox_team_oldest_pending_age_seconds";
pub const INBOX_OWED: &str = "bus_inbox_references_owed";
pub const MOVES_RUNNING: &str = "bus_moves_running";
pub const MOVES_PAUSED: &str = "bus_moves_paused_conversations";

/// Upper bounds of the latency buckets, in seconds: a cached read (~1 ms) to
/// a long poll's full wait (minutes).
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// How often histogram samples are folded into their buckets when nobody
/// scrapes (they would otherwise pile up in memory).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Install the process's recorder (once; later calls return the same
/// handle). Until it is installed, every `record_*` call is a no-op, so
/// operator commands that never serve pay nothing.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets(DURATION_BUCKETS)
            .expect("the bucket list is not empty")
            .build_recorder();
        let handle = recorder.handle();
        if let Err(err) = metrics::set_global_recorder(recorder) {
            // Someone else's recorder: ours renders nothing, but /metrics
            // still answers with the database's numbers.
            tracing::warn!(error = %err, "a metrics recorder was already installed");
        }
        describe();
        let upkeep = handle.clone();
        std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                }
            })
            .expect("spawn the metrics upkeep thread");
        handle
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        TOOL_CALLS,
        "MCP tool calls answered, by tool and outcome (ok, a refusal kind, or error)."
    );
    describe_histogram!(
        TOOL_DURATION,
        metrics::Unit::Seconds,
        "Time to answer an MCP tool call, by tool (long polls included)."
    );
    describe_counter!(
        HTTP_RESPONSES,
        "HTTP responses, by route (/mcp, /health, /admin, /metrics, /dashboard, other) and status."
    );
    describe_counter!(
        HTTP_REFUSALS,
        "Requests refused by a load limit before any work, by kind."
    );
    describe_gauge!(
        LONG_POLLS_OPEN,
        "Long polls (wait_for_updates, ask_agent, wait_for_conversation_updates) waiting now."
    );
    describe_counter!(
        DB_POOL_TIMEOUTS,
        "Database calls that waited for a pool connection until the acquire timeout."
    );
    describe_counter!(
        EVENT_NOTIFICATIONS,
        "LISTEN/NOTIFY notifications heard by the event listener (pings included)."
    );
    describe_counter!(
        EVENT_RECONNECTS,
        "Times the event listener lost its database connection."
    );
    describe_counter!(
        OUTBOX_PUBLISH,
        "Outbox publication attempts settled by the drain, by outcome."
    );
    describe_counter!(
        OUTBOX_RECONCILED,
        "Uncertain publications the reconciler found stored."
    );
    describe_counter!(
        BODIES_SWEPT,
        "Local copies of broker-held bodies released (or recorded lost) by the body sweep."
    );
    describe_counter!(WEBHOOK_DELIVERIES, "Webhook deliveries, by outcome.");
}

/// One MCP tool call answered. `tool` is `unknown` for a name the server
/// does not have (a caller's free text never becomes a label).
pub fn record_tool_call(tool: &str, outcome: &'static str, took: Duration) {
    metrics::counter!(TOOL_CALLS, "tool" => tool.to_string(), "outcome" => outcome).increment(1);
    metrics::histogram!(TOOL_DURATION, "tool" => tool.to_string()).record(took.as_secs_f64());
}

/// The route template of a path: the label of [`HTTP_RESPONSES`].
pub fn route_of(path: &str) -> &'static str {
    const ROUTES: &[&str] = &["/mcp", "/health", "/admin", "/metrics", "/dashboard"];
    ROUTES
        .iter()
        .find(|r| {
            path.strip_prefix(**r)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
        .copied()
        .unwrap_or("other")
}

/// One HTTP response sent (its head; an event stream may still flow).
pub fn record_response(route: &'static str, status: u16) {
    metrics::counter!(HTTP_RESPONSES, "route" => route, "status" => status.to_string())
        .increment(1);
}

/// Why a request was refused before any work (the `kind` of [`HTTP_REFUSALS`]).
#[derive(Clone, Copy, Debug)]
pub enum Refusal {
    /// A credential's requests per minute (429).
    RateLimit,
    /// An address's failed authentications per minute (429).
    UnauthenticatedAddress,
    /// The server's requests in flight (503).
    InFlight,
    /// A credential's ordinary calls in flight (429).
    CredentialCalls,
    /// A credential's long polls in flight (429).
    CredentialLongPolls,
    /// An agent's ordinary calls in flight, over its windows (429).
    AgentCalls,
    /// An agent's long polls in flight, over its windows (429).
    AgentLongPolls,
    /// A team's ordinary calls in flight (429).
    TeamCalls,
    /// A team's long polls in flight (429).
    TeamLongPolls,
    /// The buffered request bytes budget (503).
    BufferedBytes,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Refusal::RateLimit => "rate_limit",
            Refusal::UnauthenticatedAddress => "unauthenticated_address",
            Refusal::InFlight => "in_flight",
            Refusal::CredentialCalls => "credential_calls",
            Refusal::CredentialLongPolls => "credential_long_polls",
            Refusal::AgentCalls => "agent_calls",
            Refusal::AgentLongPolls => "agent_long_polls",
            Refusal::TeamCalls => "team_calls",
            Refusal::TeamLongPolls => "team_long_polls",
            Refusal::BufferedBytes => "buffered_bytes",
        }
    }
}

pub fn record_refusal(kind: Refusal) {
    metrics::counter!(HTTP_REFUSALS, "kind" => kind.label()).increment(1);
}

/// Counts one open long poll for as long as it lives.
pub struct LongPollOpen(());

impl LongPollOpen {
    pub fn enter() -> LongPollOpen {
        metrics::gauge!(LONG_POLLS_OPEN).increment(1.0);
        LongPollOpen(())
    }
}

impl Drop for LongPollOpen {
    fn drop(&mut self) {
        metrics::gauge!(LONG_POLLS_OPEN).decrement(1.0);
    }
}

/// A call that waited for a pool connection until the acquire timeout
/// (counted where the refusal is answered, not where the error is made).
pub fn record_pool_timeout() {
    metrics::counter!(DB_POOL_TIMEOUTS).increment(1);
}

pub fn record_notification() {
    metrics::counter!(EVENT_NOTIFICATIONS).increment(1);
}

pub fn record_listener_lost() {
    metrics::counter!(EVENT_RECONNECTS).increment(1);
}

/// What one drain pass settled, by outcome (`stored`, `retrying`,
/// `failed`, `waiting`, `fenced`).
pub fn record_drain_pass(outcomes: [(&'static str, usize); 5]) {
    for (outcome, n) in outcomes {
        if n > 0 {
            metrics::counter!(OUTBOX_PUBLISH, "outcome" => outcome).increment(n as u64);
        }
    }
}

pub fn record_reconciled(stored: usize) {
    metrics::counter!(OUTBOX_RECONCILED).increment(stored as u64);
}

pub fn record_bodies_swept(released: u64) {
    metrics::counter!(BODIES_SWEPT).increment(released);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_templates_never_paths() {
        assert_eq!(route_of("/mcp"), "/mcp");
        assert_eq!(route_of("/mcp/"), "/mcp");
        assert_eq!(route_of("/admin/teams/secret-team/tokens"), "/admin");
        assert_eq!(route_of("/mcpx"), "other");
        assert_eq!(route_of("/acst_abc"), "other");
    }
}
