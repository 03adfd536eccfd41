//! Presence tools: `heartbeat`, `list_agents`, `list_sessions`. All logic
//! lives in `store::messaging::presence`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;

use super::answers::Read;
use super::{BusServer, caller};
use acs_store::store::messaging::presence::{self, Beat, PresenceStatus, SessionFilter};

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatArgs {
    /// active, idle, busy or blocked. Omit to keep the current status (`active` on a first heartbeat).
    #[schemars(extend("enum" = PresenceStatus::ALL))]
    pub status: Option<String>,
    /// The repository you work in (<= 256 bytes). Omit to keep, "" to clear.
    pub repo: Option<String>,
    /// The branch you work on (<= 256 bytes). Omit to keep, "" to clear.
    pub branch: Option<String>,
    /// What you are doing now, one short line (<= 256 bytes). Omit to keep, "" to clear.
    pub activity: Option<String>,
    /// Discovery label: the project this window works on (<= 256 bytes); your default channel is named after it unless `channel` is set. Omit to keep, "" to clear.
    pub project: Option<String>,
    /// Discovery label: this window's role, e.g. `reviewer` (<= 256 bytes). Omit to keep, "" to clear.
    pub role: Option<String>,
    /// This window's default channel (post_message naming neither channel nor to, team_digest's focus), before the `project` label's and the window label's: a channel name, not `inbox` or `all`. Omit to keep, "" to clear.
    pub channel: Option<String>,
    /// Seconds this heartbeat keeps the window online, 30..86400 (600 on a window's first heartbeat; omit later to keep its current ttl: an `mcp proxy` window beats with 300).
    #[schemars(range(min = 30, max = 86400))]
    pub ttl_seconds: Option<i64>,
    /// true: this window is leaving (its conversation ended): it is offline at once instead of when its ttl runs out; send `status: "idle"` with it. A later heartbeat brings it back. Default false.
    pub offline: Option<bool>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

impl From<HeartbeatArgs> for Beat {
    fn from(args: HeartbeatArgs) -> Self {
        Beat {
            status: args.status,
            repo: args.repo,
            branch: args.branch,
            activity: args.activity,
            project: args.project,
            role: args.role,
            channel: args.channel,
            ttl_seconds: args.ttl_seconds,
            offline: args.offline.unwrap_or(false),
        }
    }
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListAgentsArgs {
    /// Only agents with a live window, and only their live windows (default false: every agent of the team, including those never seen).
    pub online_only: Option<bool>,
    /// Also list windows offline for more than a day (default false: they are only counted, in `older_windows`).
    pub all: Option<bool>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSessionsArgs {
    /// Only windows whose `project` label equals this (case-insensitive).
    pub project: Option<String>,
    /// Only windows whose `role` label equals this (case-insensitive).
    pub role: Option<String>,
    /// Only live windows (default false).
    pub online_only: Option<bool>,
    /// Also windows offline for more than a day (default false: hidden).
    pub all: Option<bool>,
    /// At most this many windows, 1..200 (default 50); live ones and the most recently seen first.
    #[schemars(range(min = 1, max = 200), extend("default" = 50))]
    pub limit: Option<i64>,
}

#[tool_router(router = presence_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Say you are here and what you are doing. Keeps this window (agent + \
                       X-Crew-Session) online for ttl_seconds: beat again before it runs out. \
                       Omitted fields keep their value (ttl_seconds too: 600 on a window's first \
                       heartbeat; an `mcp proxy` window beats with 300), \"\" clears one. The \
                       answer shows the window's ttl_seconds and expiry. When the window's \
                       conversation ends, beat once with `offline: true` and `status: \"idle\"`: \
                       it shows as offline at once."
    )]
    async fn heartbeat(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<HeartbeatArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let request_id = args.request_id.clone();
        self.once(
            &parts,
            "heartbeat",
            request_id.as_deref(),
            |mut w| async move {
                let beat = presence::heartbeat_in(&mut w, me, &args.into()).await;
                (w, beat)
            },
        )
        .await
    }

    #[tool(
        description = "The agents of your team, each with its windows and their `state` \
                       (online, idle or offline). `online_count` counts agents with a live \
                       window. Windows offline for more than a day are only counted \
                       (`older_windows`; `all: true` lists them); revoked windows are not \
                       listed. An agent's status and activity come from its summary window: a \
                       live one before a dead one, a named window before the shared one, then \
                       the most recent. A window holding path reservations shows them \
                       (`reservations`: count and the first 10, each pattern, exclusive, \
                       project, reason, expires_at). Empty (with a `note`) means no agent matches.",
        annotations(read_only_hint = true)
    )]
    async fn list_agents(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListAgentsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let (online_only, all) = (args.online_only.unwrap_or(false), args.all.unwrap_or(false));
        Read::now(
            "agents",
            "no agent matches (with online_only: none has a live window)",
        )
        .reply(presence::list_agents(self.bus(), me, online_only, all).await)
    }

    #[tool(
        description = "Find windows to talk to, by project and role labels. Each entry has an \
                       `address` (`agent` for an agent's shared window, `agent/window` \
                       otherwise), `exact`: true when that address reaches only that window, and \
                       `state`: online, idle or offline. Windows offline for more than a day are \
                       left out unless `all: true`; revoked windows are never listed. Empty (with a `note`) means no window matches the filters.",
        annotations(read_only_hint = true)
    )]
    async fn list_sessions(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListSessionsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now(
            "sessions",
            "no window matches these filters (labels are compared whole, ignoring case)",
        )
        .reply(
            presence::list_sessions(
                self.bus(),
                me,
                &SessionFilter {
                    project: args.project.as_deref(),
                    role: args.role.as_deref(),
                    online_only: args.online_only.unwrap_or(false),
                    all: args.all.unwrap_or(false),
                },
                args.limit,
            )
            .await,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_schema_names_the_statuses() {
        let schema = serde_json::to_value(schemars::schema_for!(HeartbeatArgs)).unwrap();
        assert_eq!(
            schema["properties"]["status"]["enum"],
            serde_json::json!(["active", "idle", "busy", "blocked"])
        );
        assert_eq!(schema["additionalProperties"], false);
    }
}
