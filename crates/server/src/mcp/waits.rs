//! Waiting tools: `wait_for_updates` and `ask_agent`. The logic is in
//! `store::messaging::waits`; this file adds MCP progress notifications while a call
//! blocks, when the client asked for progress, and [`park`]: the HTTP gate's way
//! to run a `wait_for_updates` before rmcp builds anything for the request.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, schemars, tool, tool_router};
use serde::Deserialize;
use uuid::Uuid;

use super::{BusServer, caller, refusal, reply};
use acs_store::Bus;
use acs_store::auth::Identity;
use acs_store::error::{BusError, BusResult};
use acs_store::store::messaging::waits;

/// Often enough that clients which extend a call's deadline on progress keep it alive.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// How long to wait, 1..300 s (default 50: under the ~60 s many clients allow a call).
    #[schemars(range(min = 1, max = 300), extend("default" = 50))]
    pub timeout_seconds: Option<u64>,
    /// Wake only for these: message, task, lock, note, reservation (default all).
    pub kinds: Option<Vec<String>>,
    /// Wake for chatter in every channel, not only this window's focused channel.
    #[serde(default)]
    pub all_channels: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskArgs {
    /// Who to ask: `agent` or `agent/window`.
    pub to: String,
    /// The question (a direct message flagged as a question).
    pub question: String,
    /// How long to wait for the answer, 1..300 s (default 50).
    #[schemars(range(min = 1, max = 300), extend("default" = 50))]
    pub timeout_seconds: Option<u64>,
    /// Keep waiting for an earlier question (its question_message_id) instead of asking again.
    pub resume_message_id: Option<Uuid>,
    /// Optional: a UUID you choose, new for each new question. Repeating the call with the same
    /// request_id from this window within 24 h asks nothing again: it waits for the answer to
    /// the first question (like resume_message_id); the same id with other arguments is refused.
    pub request_id: Option<String>,
}

/// A `wait_for_updates` that already ran, parked in the request's extensions
/// for the tool to answer with. A blocked wait is most of a large fleet's
/// requests, and rmcp's service for a stateless request (its tasks and
/// channels, ~60 KB) lives as long as the handler runs: waited for here,
/// before the request reaches rmcp, a blocked wait holds only the HTTP
/// request and the wait itself. rmcp then handles the call as any other
/// (protocol checks, the argument struct, the answer's JSON-RPC shape); the
/// tool finds the outcome here instead of waiting. A client that goes away
/// drops the request, and the wait with it, as rmcp's cancellation would.
#[derive(Clone)]
pub struct Parked {
    started: Instant,
    outcome: Arc<Mutex<Option<BusResult<waits::WaitResult>>>>,
}

impl Parked {
    /// When the wait began, for the call's duration in the metrics.
    pub(super) fn started(&self) -> Instant {
        self.started
    }

    /// The outcome, once: a request is answered once.
    fn take(&self) -> Option<BusResult<waits::WaitResult>> {
        self.outcome.lock().ok()?.take()
    }
}

/// The tool [`park`] runs.
pub const PARKED_TOOL: &str = "wait_for_updates";

/// Run the `wait_for_updates` call `body` holds, for `me`, when nothing about
/// it needs rmcp while it waits: arguments that deserialise and pass the
/// checks (anything else goes on to the tool, which refuses it as always),
/// and no progress to send. Progress goes out through rmcp's peer, and it is
/// sent only where it keeps a call alive: a wait longer than the default
/// ([`waits::TIMEOUT_DEFAULT_SECS`], under the ~60 s clients allow a call)
/// whose client asked for it (rmcp's client asks on every call). `None`
/// leaves the call to the tool.
pub async fn park(bus: &Bus, me: &Identity, body: &[u8]) -> Option<Parked> {
    #[derive(Deserialize)]
    struct Message {
        params: Params,
    }
    #[derive(Deserialize)]
    struct Params {
        #[serde(default)]
        arguments: Option<serde_json::Value>,
        #[serde(rename = "_meta", default)]
        meta: Option<serde_json::Map<String, serde_json::Value>>,
    }
    let params = serde_json::from_slice::<Message>(body).ok()?.params;
    let arguments = params
        .arguments
        .unwrap_or_else(|| serde_json::Value::Object(Default::default()));
    let args = serde_json::from_value::<WaitArgs>(arguments).ok()?;
    let request = waits::WaitRequest {
        timeout: waits::check_timeout(args.timeout_seconds).ok()?,
        kinds: waits::parse_kinds(args.kinds).ok()?,
        all_channels: args.all_channels,
    };
    let asks_progress = params
        .meta
        .is_some_and(|meta| meta.contains_key("progressToken"));
    if asks_progress && request.timeout > Duration::from_secs(waits::TIMEOUT_DEFAULT_SECS) {
        return None;
    }
    let started = Instant::now();
    let outcome = waits::wait_for_updates(bus, me, request).await;
    Some(Parked {
        started,
        outcome: Arc::new(Mutex::new(Some(outcome))),
    })
}

/// Sends a progress notification every few seconds while alive, if the
/// client sent a progress token. Stops when dropped.
pub(super) struct ProgressTicker(Option<tokio::task::JoinHandle<()>>);

impl ProgressTicker {
    pub(super) fn start(
        ctx: &RequestContext<RoleServer>,
        total: Duration,
        what: &'static str,
    ) -> ProgressTicker {
        let Some(token) = ctx.meta.get_progress_token() else {
            return ProgressTicker(None);
        };
        let peer = ctx.peer.clone();
        ProgressTicker(Some(tokio::spawn(async move {
            let mut elapsed = Duration::ZERO;
            loop {
                tokio::time::sleep(PROGRESS_EVERY).await;
                elapsed += PROGRESS_EVERY;
                let param = ProgressNotificationParam::new(token.clone(), elapsed.as_secs_f64())
                    .with_total(total.as_secs_f64())
                    .with_message(format!(
                        "{what} ({} s of {} s)",
                        elapsed.as_secs(),
                        total.as_secs()
                    ));
                if peer.notify_progress(param).await.is_err() {
                    return;
                }
            }
        })))
    }
}

impl Drop for ProgressTicker {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}

/// Run a blocking call until it ends or its client goes away (rmcp cancels
/// the request's token when the connection closes): a wait nobody will read
/// must not keep running, and keep re-querying, for minutes.
pub(super) async fn unless_abandoned<T>(
    ctx: &RequestContext<RoleServer>,
    call: impl Future<Output = BusResult<T>>,
) -> BusResult<T> {
    tokio::select! {
        result = call => result,
        () = ctx.ct.cancelled() => Err(BusError::unavailable(
            "the client cancelled this call or went away; the wait was ended. Call again to keep \
             waiting.",
        )),
    }
}

#[tool_router(router = waiting_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Block until something this window should see happens: a DM to it, a \
                          task, lock or note change, an announcement, or a message in its focused \
                          channel (all channels with all_channels). Returns woke, timed_out and \
                          event summaries; unread DMs wake it at once. Call again to keep waiting. `woke: false` with no events means nothing happened before the timeout."
    )]
    async fn wait_for_updates(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<WaitArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Some(outcome) = parts.extensions.get::<Parked>().and_then(Parked::take) {
            return reply(outcome);
        }
        let me = caller(&parts)?;
        let request = match (
            waits::check_timeout(args.timeout_seconds),
            waits::parse_kinds(args.kinds),
        ) {
            (Ok(timeout), Ok(kinds)) => waits::WaitRequest {
                timeout,
                kinds,
                all_channels: args.all_channels,
            },
            (Err(err), _) | (_, Err(err)) => return Ok(refusal(&err)),
        };
        let _progress = ProgressTicker::start(&ctx, request.timeout, "waiting for updates");
        reply(unless_abandoned(&ctx, waits::wait_for_updates(self.bus(), me, request)).await)
    }

    #[tool(
        description = "Ask another agent a question (a DM flagged as a question) and wait for \
                          the reply addressed back to this window. Only a reply from the agent \
                          you asked (any of its windows) answers it; replies to the question \
                          from anyone else stay ordinary messages in your inbox (read_messages). \
                          The answer it returns is read: it is not an unread DM afterwards. \
                          On timeout returns answered: false and the question_message_id to \
                          resume waiting with."
    )]
    async fn ask_agent(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<AskArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let timeout = match waits::check_timeout(args.timeout_seconds) {
            Ok(timeout) => timeout,
            Err(err) => return Ok(refusal(&err)),
        };
        let request = match super::request_of(&parts, "ask_agent", args.request_id.as_deref())? {
            Ok(request) => request,
            Err(err) => return Ok(refusal(&err)),
        };
        let _progress = ProgressTicker::start(&ctx, timeout, "waiting for an answer");
        let ask = waits::ask(
            self.bus(),
            me,
            &args.to,
            &args.question,
            timeout,
            args.resume_message_id,
            request.as_ref(),
        );
        reply(unless_abandoned(&ctx, ask).await)
    }
}
