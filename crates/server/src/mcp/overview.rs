//! `whoami`, `pending_for_me` and `team_digest`: who you are, what needs you
//! now, and what the team has been doing.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;

use super::answers::Read;
use super::sessions::NoArgs;
use super::{BusServer, caller};
use acs_store::store::{messaging::overview, messaging::pending};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DigestArgs {
    /// How far back to look, 1..336 hours (default 24).
    #[schemars(range(min = 1, max = 336), extend("default" = 24))]
    pub hours: Option<i32>,
    /// Every channel's activity, not only this window's focused channel (announcements are always in).
    #[serde(default)]
    pub all_channels: bool,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PendingArgs {
    /// When you last looked (RFC 3339, at most 7 days back): announcements after it are listed.
    /// Omit for none.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// List your tasks whose lease lapses within this many seconds, 1..86400 (default 300).
    #[schemars(range(min = 1, max = 86400), extend("default" = 300))]
    pub lease_within_seconds: Option<i64>,
}

#[tool_router(router = identity_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Who you are on the bus (agent, team, window, address) and your pending work: \
                       unread direct messages (to this window, and to your agent as a whole \
                       that none of its windows has read; counted up to 1000; \
                       `unread_direct_messages_at_least: true` means 1000 or more) and tasks you \
                       hold, and your default channel (where post_message naming neither channel \
                       nor to goes, and team_digest's focus): the channel set for this window \
                       (heartbeat `channel`), else your `project` label's, else your window \
                       label's; `default_channel_from` says which. Identity comes from your token; \
                       the window from the X-Crew-Session header or your session credential. Zero counts and empty lists mean nothing is pending as of `as_of`.",
        annotations(read_only_hint = true)
    )]
    async fn whoami(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(overview::whoami(self.bus(), me).await)
    }

    #[tool(
        description = "What needs this window now, in one call that marks nothing read: unread \
                       direct messages (count and the oldest 5; as whoami counts them), \
                       questions asked of you \
                       (ask_agent) not yet answered, conversations owing your acknowledgement, \
                       your tasks whose lease lapses within lease_within_seconds, \
                       announcements since `since`, and what this window holds (claimed \
                       tasks, locks, path reservations: each counted, the first 10 listed). \
                       Each list is short; read the rest with read_messages, \
                       read_conversation, list_tasks, list_locks and list_reservations. Empty lists mean nothing of that kind needs you as of `as_of`.",
        annotations(read_only_hint = true)
    )]
    async fn pending_for_me(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<PendingArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(
            pending::pending_for_me(self.bus(), me, args.since, args.lease_within_seconds).await,
        )
    }

    #[tool(
        description = "What the team did in the last `hours`: per channel a count that stops \
                       at 10 (`messages_at_least: true` means 10 or more; read_messages or \
                       list_channels for more) and \
                       the latest messages (your focused channel, the default channel whoami \
                       names, unless all_channels; \
                       announcements always; at most 3 a channel and 20 in all, the newest: a \
                       channel past them lists its count and no message), \
                       tasks that moved (the 50 that moved last), notes updated, agents seen, \
                       and the windows holding path reservations now (`reservations`: holder, \
                       count, the first 10). Never DMs. Empty lists mean nothing of that kind happened in the period (`as_of` says when it was read).",
        annotations(read_only_hint = true)
    )]
    async fn team_digest(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<DigestArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot()
            .reply(overview::team_digest(self.bus(), me, args.hours, args.all_channels).await)
    }
}
