//! Presence tools: `heartbeat`, `list_agents`, `list_sessions`. All logic
//! lives in `store::messaging::presence`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;

use super::{BusServer, caller, reply};
use acs_store::store::messaging::presence::{self, Beat, PresenceStatus};

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
    /// Discovery label: the project this window works on (<= 256 bytes); your default channel is named after it. Omit to keep, "" to clear.
    pub project: Option<String>,
    /// Discovery label: this window's role, e.g. `reviewer` (<= 256 bytes). Omit to keep, "" to clear.
    pub role: Option<String>,
    /// Seconds this heartbeat keeps the window online, 30..86400 (600 on a window's first heartbeat; omit later to keep its current ttl: an `mcp proxy` window beats with 300).
    #[schemars(range(min = 30, max = 86400))]
    pub ttl_seconds: Option<i64>,
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
            ttl_seconds: args.ttl_seconds,
        }
    }
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListAgentsArgs {
    /// Only agents with a live window, and only their live windows (default false: every agent of the team, including those never seen).
    pub online_only: Option<bool>,
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
                       answer shows the window's ttl_seconds and expiry."
    )]
    async fn heartbeat(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<HeartbeatArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        reply(presence::heartbeat(self.bus(), me, &args.into()).await)
    }

    #[tool(
        description = "The agents of your team, each with its windows. `online_count` counts \
                       agents with a live window. An agent's status and activity come from its \
                       summary window: a live one before a dead one, a named window before the \
                       shared one, then the most recent.",
        annotations(read_only_hint = true)
    )]
    async fn list_agents(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListAgentsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        reply(presence::list_agents(self.bus(), me, args.online_only.unwrap_or(false)).await)
    }

    #[tool(
        description = "Find windows to talk to, by project and role labels. Each entry has an \
                       `address` (`agent` for an agent's shared window, `agent/window` \
                       otherwise) and `exact`: true when that address reaches only that window.",
        annotations(read_only_hint = true)
    )]
    async fn list_sessions(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListSessionsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        reply(
            presence::list_sessions(
                self.bus(),
                me,
                args.project.as_deref(),
                args.role.as_deref(),
                args.online_only.unwrap_or(false),
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
