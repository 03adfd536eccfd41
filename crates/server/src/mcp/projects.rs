//! Project tools: `create_project`, `list_projects`, `grant_project_access`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;

use super::answers::Read;
use super::sessions::NoArgs;
use super::{BusServer, caller};
use acs_store::store::conversations::projects;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProjectArgs {
    /// Project name: ASCII letters, digits and `-_.`, up to 64 bytes.
    pub project: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantArgs {
    /// The project.
    pub project: String,
    /// The agent to grant (or revoke) access.
    pub agent: String,
    /// true grants (default), false revokes. Nobody revokes their own grant.
    pub grant: Option<bool>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[tool_router(router = project_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Create a project (a group of conversations). You hold its first access \
                          grant; others need a grant from a holder."
    )]
    async fn create_project(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<CreateProjectArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "create_project",
            args.request_id.as_deref(),
            |mut w| async move {
                let done = projects::create(&mut w, me, &args.project).await;
                (w, done)
            },
        )
        .await
    }

    #[tool(
        description = "The team's projects, each with whether you hold an access grant. Empty means your team has no project yet.",
        annotations(read_only_hint = true)
    )]
    async fn list_projects(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now("projects", "your team has no project yet")
            .list(projects::list(self.bus(), me).await, None)
    }

    #[tool(
        description = "Grant (or with grant: false, revoke) an agent's access to a project. \
                          Only a holder of the project's grant can; revoking is immediate."
    )]
    async fn grant_project_access(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<GrantArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let grant = args.grant.unwrap_or(true);
        self.once(
            &parts,
            "grant_project_access",
            args.request_id.as_deref(),
            |mut w| async move {
                let done = projects::grant(&mut w, me, &args.project, &args.agent, grant).await;
                (w, done)
            },
        )
        .await
    }
}
