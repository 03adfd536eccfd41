//! The proxy's MCP server, written by hand rather than with the tool macros:
//! its tools are whatever the bus lists (fetched at start), plus two local
//! ones. A bus tool is forwarded as it came; the answer goes back as the bus
//! gave it.
//!
//! Three session tools are the proxy's business and are not offered: it
//! registers, renews and rotates the window's credential itself, and a model
//! rotating it would cut the proxy off.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::{Proxy, instructions, local_tools, refusal};

/// Managed by the proxy; refused with an explanation when called.
const MANAGED: &[&str] = &["register_session", "resume_session", "renew_session"];

/// What the host sees: the proxy's state behind an `Arc`.
pub(super) struct ProxyServer(pub(super) Arc<Proxy>);

impl ServerHandler for ProxyServer {
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let _ = self.0.peer.set(context.peer.clone());
        let mut result = self.negotiate_initialize(&request)?;
        result.instructions = Some(instructions::build(&self.0).await);
        Ok(result)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.0.wait_settled().await;
        let mut tools = local_tools::definitions();
        match self.0.offered_bus_tools().await {
            Some(bus) => tools.extend(bus),
            None => {
                self.0.listed_without_bus.store(true, Ordering::SeqCst);
                // The one place a tools/list can say why the list is short.
                let trouble = self.0.trouble.lock().await.clone();
                if let Some(status) = tools.iter_mut().find(|t| t.name == "session_status") {
                    status.description = Some(
                        format!(
                            "The team's bus is not reachable yet ({}); its tools appear here when \
                             it answers. {}",
                            trouble.unwrap_or_else(|| "no answer yet".into()),
                            status.description.as_deref().unwrap_or_default()
                        )
                        .into(),
                    );
                }
            }
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // rmcp moves the request's `_meta` into the context.
        let meta = request.meta.as_deref().unwrap_or(&context.meta);
        if let Err(message) = self.0.follow_thread(meta).await {
            return Ok(refusal("unavailable", &message).into());
        }
        let name = request.name.as_ref();
        if let Some(result) = local_tools::call(&self.0, name, request.arguments.as_ref()).await {
            return Ok(result.into());
        }
        if MANAGED.contains(&name) {
            return Ok(refusal(
                "forbidden",
                &format!(
                    "{name} is handled by the ai-crew-sync proxy: it registers this window's \
                     session credential, renews it at half-life and never shows it. Nothing was \
                     done. session_status shows the window and its expiry; revoke_session still \
                     works for another window of yours."
                ),
            )
            .into());
        }
        // Forwarded as it came: a post naming neither channel nor recipient
        // goes where the bus decides (the window's default channel, which
        // the proxy told it in a heartbeat).
        Ok(self.0.forward(name, request.arguments.clone()).await.into())
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new(
            "ai-crew-sync-proxy",
            env!("CARGO_PKG_VERSION"),
        ))
    }
}

impl Proxy {
    /// The bus's tools the host is offered (all but [`MANAGED`]), once fetched:
    /// what `tools/list` shows and `session_status` counts.
    pub(super) async fn offered_bus_tools(&self) -> Option<Vec<rmcp::model::Tool>> {
        self.tools.read().await.as_ref().map(|bus| {
            bus.iter()
                .filter(|t| !MANAGED.contains(&t.name.as_ref()))
                .cloned()
                .collect()
        })
    }
}
