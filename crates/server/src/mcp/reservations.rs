//! Path reservation tools: `reserve_paths`, `release_paths`,
//! `renew_reservations`, `list_reservations`, `check_paths`. All logic lives
//! in `store::messaging::reservations`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;

use super::answers::Read;
use super::{BusServer, caller};
use acs_store::store::messaging::reservations;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReservePathsArgs {
    /// Gitignore-style globs relative to the repository root (`src/api/**`,
    /// `README.md`, `*.sql`, `src/[ab]*.rs`), at most 100.
    pub paths: Vec<String>,
    /// True (default): no other window may hold an overlapping reservation.
    /// False: shared, beside other shared ones.
    #[schemars(extend("default" = true))]
    pub exclusive: Option<bool>,
    /// How long to hold them, 5..86400 seconds (default 1800). Reserve again
    /// or renew_reservations to extend.
    #[schemars(range(min = 5, max = 86400), extend("default" = 1800))]
    pub ttl_seconds: Option<i64>,
    /// One line saying what you are doing (at most 256 bytes), shown to others.
    pub reason: Option<String>,
    /// True: take the patterns that are free and answer the others under
    /// `refused`. False (default): all or nothing.
    #[serde(default)]
    pub partial: bool,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleasePathsArgs {
    /// The patterns to release, as reserved. Omit to release every
    /// reservation of this window.
    pub paths: Option<Vec<String>>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewReservationsArgs {
    /// The new time to live from now, 5..86400 seconds (default 1800).
    #[schemars(range(min = 5, max = 86400), extend("default" = 1800))]
    pub ttl_seconds: Option<i64>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListReservationsArgs {
    /// Only reservations whose pattern covers this repository path.
    pub path: Option<String>,
    /// Only reservations this agent holds (any of its windows).
    pub agent: Option<String>,
    /// The project to list (as `.acs.toml` or heartbeat `project` names
    /// it). Omit for this window's project.
    pub project: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckPathsArgs {
    /// Repository-relative file paths (not globs), at most 200.
    pub paths: Vec<String>,
    /// The project to check in (as `.acs.toml` or heartbeat `project` names
    /// it). Omit for this window's project.
    pub project: Option<String>,
}

#[tool_router(router = reservation_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Reserve the paths you are about to edit (gitignore-style globs relative to \
                       the repository root) in this window's project, exclusively (default) or \
                       shared, for ttl_seconds. Overlapping another window's exclusive \
                       reservation (or, when exclusive, any overlapping one) refuses the whole \
                       call naming each holder, its reason and expiry; partial: true takes what \
                       is free and lists the rest under `refused`. Reserving a pattern this \
                       window holds extends it. An empty `granted` (with partial) means nothing \
                       was free."
    )]
    async fn reserve_paths(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ReservePathsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "reserve_paths",
            args.request_id.as_deref(),
            |mut w| async move {
                let request = reservations::ReserveRequest {
                    paths: &args.paths,
                    exclusive: args.exclusive,
                    ttl_seconds: args.ttl_seconds,
                    reason: args.reason.as_deref(),
                    partial: args.partial,
                };
                let reserved = reservations::reserve(&mut w, me, request).await;
                (w, reserved)
            },
        )
        .await
    }

    #[tool(
        description = "Release this window's path reservations: all of them when `paths` is \
                       omitted, else the patterns named (as reserved). Answers `released` and \
                       `not_held`; both empty means this window held nothing."
    )]
    async fn release_paths(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ReleasePathsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "release_paths",
            args.request_id.as_deref(),
            |mut w| async move {
                let released = reservations::release(&mut w, me, args.paths.as_deref()).await;
                (w, released)
            },
        )
        .await
    }

    #[tool(
        description = "Move every live path reservation of this window to expire ttl_seconds \
                       from now, and list them. count 0 means this window holds none (expired \
                       ones are not revived: reserve them again)."
    )]
    async fn renew_reservations(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<RenewReservationsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "renew_reservations",
            args.request_id.as_deref(),
            |mut w| async move {
                let renewed = reservations::renew(&mut w, me, args.ttl_seconds).await;
                (w, renewed)
            },
        )
        .await
    }

    #[tool(
        description = "The live path reservations of this window's project (or `project`'s) (holder window, \
                       pattern, exclusive or shared, reason, expiry), optionally only those \
                       covering `path` or held by `agent`; at most 200, `more` when cut short. \
                       Empty means nobody in the project has reserved anything matching; an `agent` not in your team is refused.",
        annotations(read_only_hint = true)
    )]
    async fn list_reservations(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListReservationsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now(
            "reservations",
            "no live reservation in this project matches",
        )
        .reply(
            reservations::list(
                self.bus(),
                me,
                args.path.as_deref(),
                args.agent.as_deref(),
                args.project.as_deref(),
            )
            .await,
        )
    }

    #[tool(
        description = "Before editing files: which of these repository paths are reserved in \
                       this window's project (or `project`'s), by whom and how (`mine` marks this window's). \
                       `exclusive_elsewhere` lists the paths another window holds exclusively: \
                       do not edit those without asking the holder. Empty means you are free \
                       to edit, unless `unreadable` lists reservations whose stored pattern \
                       cannot be read (their reach is unknown: ask the holder).",
        annotations(read_only_hint = true)
    )]
    async fn check_paths(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<CheckPathsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(
            reservations::check_paths(self.bus(), me, &args.paths, args.project.as_deref()).await,
        )
    }
}
