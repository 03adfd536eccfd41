//! Session tools: authenticated windows (`register_session`, `resume_session`,
//! `renew_session`, `revoke_session`). All logic lives in `store::identity::sessions`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;

use super::{BusServer, caller, reply};
use acs_store::store::identity::sessions;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterArgs {
    /// The window label: ASCII letters, digits and `-_.:`, at most 64 bytes (e.g. `frontend`).
    pub session: String,
    /// Lifetime in seconds, 60..86400 (default 86400 = 24 h).
    #[schemars(range(min = 60, max = 86400), extend("default" = 86400))]
    pub ttl_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewArgs {
    /// New lifetime from now, in seconds, 60..86400 (default 86400 = 24 h).
    #[schemars(range(min = 60, max = 86400), extend("default" = 86400))]
    pub ttl_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeArgs {
    /// Label of the window to revoke; omit to revoke the calling window (session credential only).
    pub session: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

#[tool_router(router = session_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Register an authenticated window: returns a session credential (acss_…, \
                          shown once) that calls every tool as this agent in window `session`. \
                          Call with your agent token. Refused while that label has a live session; \
                          a dead one is taken over with a higher epoch."
    )]
    async fn register_session(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<RegisterArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let max_live = self.bus().max_sessions_per_agent;
        reply(sessions::register(self.pool(), me, &args.session, args.ttl_seconds, max_live).await)
    }

    #[tool(
        description = "Rotate this window's session credential: a new secret and epoch + 1. The \
                          old secret and every connection at the old epoch stop working. Call with \
                          the session credential."
    )]
    async fn resume_session(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let result = sessions::resume(self.pool(), me).await;
        // This replica forgets at once; the others hear the commit's notification.
        self.bus().events.credentials_changed();
        reply(result)
    }

    #[tool(
        description = "Extend this window's session: expiry becomes now + ttl_seconds; secret \
                          and epoch stay. Call with the session credential."
    )]
    async fn renew_session(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<RenewArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let result = sessions::renew(self.pool(), me, args.ttl_seconds).await;
        // This replica forgets at once; the others hear the commit's notification.
        self.bus().events.credentials_changed();
        reply(result)
    }

    #[tool(
        description = "Revoke a window's session credential: this window (omit `session`, with \
                          a session credential) or another window of the same agent by label. The \
                          window goes offline and is no longer listed; the \
                          label can then be registered again."
    )]
    async fn revoke_session(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<RevokeArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let result = sessions::revoke(self.pool(), me, args.session.as_deref()).await;
        // This replica forgets at once; the others hear the commit's notification.
        self.bus().events.credentials_changed();
        reply(result)
    }
}
