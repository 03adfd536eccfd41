//! Lock tools: `acquire_lock`, `release_lock`, `list_locks`. All logic lives
//! in `store::messaging::locks`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;

use super::answers::Read;
use super::{BusServer, caller};
use acs_store::store::messaging::locks;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireLockArgs {
    /// Team-wide lock name, lower-cased, at most 256 bytes (e.g. `deploy:prod`, `src/schema.sql`).
    pub name: String,
    /// How long to hold it, 5..86400 seconds (default 300). Acquire again to extend.
    #[schemars(range(min = 5, max = 86400), extend("default" = 300))]
    pub ttl_seconds: Option<i64>,
    /// One line saying why you hold it (at most 256 bytes), shown to others.
    pub purpose: Option<String>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseLockArgs {
    /// The lock's name.
    pub name: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListLocksArgs {}

#[tool_router(router = lock_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Take a team-wide advisory lock for ttl_seconds. Succeeds if the lock is \
                       free or expired, or extends it if this window already holds it; otherwise \
                       refused naming the holder's window and when it expires."
    )]
    async fn acquire_lock(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<AcquireLockArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "acquire_lock",
            args.request_id.as_deref(),
            |mut w| async move {
                let acquired = locks::acquire_in(
                    &mut w,
                    me,
                    &args.name,
                    args.ttl_seconds,
                    args.purpose.as_deref(),
                )
                .await;
                (w, acquired)
            },
        )
        .await
    }

    #[tool(
        description = "Release a lock. Only the window that holds it (another window of the same \
                       agent is refused)."
    )]
    async fn release_lock(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ReleaseLockArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "release_lock",
            args.request_id.as_deref(),
            |mut w| async move {
                let done = locks::release(&mut w, me, &args.name).await;
                (w, done)
            },
        )
        .await
    }

    #[tool(
        description = "The team's locks that have not expired: holder window, purpose, expiry. Empty means no lock is held.",
        annotations(read_only_hint = true)
    )]
    async fn list_locks(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(_): Parameters<ListLocksArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now("locks", "no lock is held in your team").reply(locks::list(self.bus(), me).await)
    }
}
