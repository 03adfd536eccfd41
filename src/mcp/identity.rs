//! `whoami`: who the token is, and which window is calling.

use rmcp::handler::server::tool::Extension;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, tool, tool_router};
use serde::Serialize;
use uuid::Uuid;

use super::{BusServer, caller, reply};

#[derive(Serialize)]
struct WhoAmI {
    agent: String,
    agent_id: Uuid,
    team: String,
    team_id: Uuid,
    /// The window label; empty for the agent's shared session.
    session: String,
    /// How other agents reach exactly this caller: `agent` or `agent/session`.
    address: String,
    /// `agent_token`, or `session` for a session credential.
    credential: &'static str,
    /// The session credential's epoch (absent for an agent token).
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<i64>,
}

#[tool_router(router = identity_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Who you are on the bus: your agent, team and window (session). Identity \
                       comes from your token; the window from the X-Crew-Session header.",
        annotations(read_only_hint = true)
    )]
    async fn whoami(
        &self,
        Extension(parts): Extension<http::request::Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        reply(Ok(WhoAmI {
            agent: me.agent.clone(),
            agent_id: me.agent_id,
            team: me.team.clone(),
            team_id: me.team_id,
            session: me.session.clone(),
            address: me.address(),
            credential: if me.window.is_some() {
                "session"
            } else {
                "agent_token"
            },
            epoch: me.window.map(|w| w.epoch),
        }))
    }
}
