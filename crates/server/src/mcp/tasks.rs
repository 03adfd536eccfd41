//! Task tools: `create_task`, `claim_task`, `claim_next_task`,
//! `renew_task_lease`, `release_task`, `complete_task`, `cancel_task`,
//! `set_task_dependencies`, `set_task_priority`, `list_tasks`, `get_task`. All logic lives in
//! `store::tasks`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::Value;

use super::answers::Read;
use super::{BusServer, caller};
use acs_store::store::tasks::{self, NewTask};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTaskArgs {
    /// Identifier unique in the team, at most 128 bytes (e.g. `api-auth-refactor`); one-line
    /// text rule (trimmed, NFC-normalised, no control, line-separator or bidi-formatting characters).
    pub key: String,
    /// One line saying what is to be done, at most 512 bytes (a line break is refused: put the
    /// rest in `description`).
    pub title: String,
    /// The details, at most 64 KiB, kept exactly as given.
    pub description: Option<String>,
    /// A JSON object of small facts (or a string holding one), at most 16 KiB.
    pub metadata: Option<Value>,
    /// Keys of existing tasks that must be done before this one can be claimed (at most 32).
    pub depends_on: Option<Vec<String>>,
    /// `low`, `normal` (default), `high` or `urgent`: claim_next_task takes the highest first,
    /// the oldest first within one priority.
    pub priority: Option<String>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

impl From<CreateTaskArgs> for NewTask {
    fn from(args: CreateTaskArgs) -> Self {
        NewTask {
            key: args.key,
            title: args.title,
            description: args.description,
            metadata: args.metadata,
            depends_on: args.depends_on.unwrap_or_default(),
            priority: args.priority,
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimTaskArgs {
    /// The task's key.
    pub key: String,
    /// Lease length in seconds, 30..86400 (default 900). Renew before it lapses.
    #[schemars(range(min = 30, max = 86400), extend("default" = 900))]
    pub lease_seconds: Option<i64>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimNextArgs {
    /// Lease length in seconds, 30..86400 (default 900). Renew before it lapses.
    #[schemars(range(min = 30, max = 86400), extend("default" = 900))]
    pub lease_seconds: Option<i64>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewLeaseArgs {
    /// The task's key.
    pub key: String,
    /// New lease length from now, in seconds, 30..86400 (default 900).
    #[schemars(range(min = 30, max = 86400), extend("default" = 900))]
    pub lease_seconds: Option<i64>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskKeyArgs {
    /// The task's key.
    pub key: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseTaskArgs {
    /// The task's key.
    pub key: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteTaskArgs {
    /// The task's key.
    pub key: String,
    /// What was done: the outcome another agent needs, at most 64 KiB.
    pub result: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelTaskArgs {
    /// The task's key.
    pub key: String,
    /// Why it is cancelled, at most 4 KiB; kept on the task and in its history.
    pub reason: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetDependenciesArgs {
    /// The task's key.
    pub key: String,
    /// The complete new list: keys of existing, not cancelled tasks that must be done first (at
    /// most 32). `[]` removes every dependency.
    pub depends_on: Vec<String>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetPriorityArgs {
    /// The task's key.
    pub key: String,
    /// `low`, `normal`, `high` or `urgent`.
    pub priority: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasksArgs {
    /// `open`, `claimed`, `done`, `cancelled` or `any` (default). A lapsed lease counts as open.
    pub status: Option<String>,
    /// Only tasks this window holds (or held, lapsed) or completed. Default false.
    pub mine_only: Option<bool>,
    /// At most this many tasks, 1..200 (default 50).
    #[schemars(range(min = 1, max = 200), extend("default" = 50))]
    pub limit: Option<i64>,
}

#[tool_router(router = task_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Create a task in the team's shared queue. `key` is unique in the team; \
                       `depends_on` names existing tasks (not cancelled ones) that must be done \
                       first (the task cannot be claimed until then). `priority`: low, \
                       normal (default), high or urgent. The task starts open."
    )]
    async fn create_task(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<CreateTaskArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let request_id = args.request_id.clone();
        self.once(
            &parts,
            "create_task",
            request_id.as_deref(),
            |mut w| async move {
                let task = tasks::create_in(&mut w, me, args.into()).await;
                (w, task)
            },
        )
        .await
    }

    #[tool(
        description = "Claim a task by key for this window, for `lease_seconds`. Claiming a task \
                       this window already holds extends the lease. Refused while another \
                       window's lease is live (naming it and the expiry) or while a dependency \
                       is unfinished. A lapsed lease may be taken over by anyone."
    )]
    async fn claim_task(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ClaimTaskArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "claim_task",
            args.request_id.as_deref(),
            |mut w| async move {
                let task = tasks::claim(&mut w, me, &args.key, args.lease_seconds).await;
                (w, task)
            },
        )
        .await
    }

    #[tool(
        description = "Claim the open task of the highest priority (urgent, high, normal, \
                       low), the oldest first within one, whose dependencies are all done (a \
                       lapsed lease counts as open). Safe with many agents at once: no two get the \
                       same task. Answers `claimed: false` with the reason when nothing is ready."
    )]
    async fn claim_next_task(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ClaimNextArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "claim_next_task",
            args.request_id.as_deref(),
            |mut w| async move {
                let next = tasks::claim_next_in(&mut w, me, args.lease_seconds).await;
                (w, next)
            },
        )
        .await
    }

    #[tool(
        description = "Extend this window's lease on a task to now + lease_seconds. Only the \
                       holding window; refused once the lease has lapsed (claim it again)."
    )]
    async fn renew_task_lease(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<RenewLeaseArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "renew_task_lease",
            args.request_id.as_deref(),
            |mut w| async move {
                let task = tasks::renew(&mut w, me, &args.key, args.lease_seconds).await;
                (w, task)
            },
        )
        .await
    }

    #[tool(
        description = "Hand a task back: it becomes open for anyone. Only the window holding it."
    )]
    async fn release_task(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ReleaseTaskArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "release_task",
            args.request_id.as_deref(),
            |mut w| async move {
                let task = tasks::release(&mut w, me, &args.key).await;
                (w, task)
            },
        )
        .await
    }

    #[tool(
        description = "Mark a task done with a result (at most 64 KiB). Only the window holding \
                       a live claim; tasks that depend on it become claimable."
    )]
    async fn complete_task(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<CompleteTaskArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "complete_task",
            args.request_id.as_deref(),
            |mut w| async move {
                let task = tasks::complete_in(&mut w, me, &args.key, &args.result).await;
                (w, task)
            },
        )
        .await
    }

    #[tool(
        description = "Cancel a task: it will never be claimed or completed. Allowed for the \
                       agent that created it (any window) or the window holding its live lease; \
                       refused for anyone else and for a task already done or cancelled. Any \
                       lease ends. Tasks that depend on it stay blocked and list it in \
                       blocked_by_cancelled; the answer names them so their creators can \
                       re-point them (set_task_dependencies) or cancel them too."
    )]
    async fn cancel_task(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<CancelTaskArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "cancel_task",
            args.request_id.as_deref(),
            |mut w| async move {
                let task = tasks::cancel(&mut w, me, &args.key, &args.reason).await;
                (w, task)
            },
        )
        .await
    }

    #[tool(
        description = "Replace what a task waits for with a new depends_on list (`[]` for \
                       nothing), e.g. to re-point it from a cancelled task to its replacement. \
                       Only the agent that created the task (any window); refused for a task \
                       done, cancelled or held by a live lease, for a cancelled or missing \
                       dependency, and for a list that would make a cycle."
    )]
    async fn set_task_dependencies(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<SetDependenciesArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "set_task_dependencies",
            args.request_id.as_deref(),
            |mut w| async move {
                let task = tasks::set_dependencies(&mut w, me, &args.key, &args.depends_on).await;
                (w, task)
            },
        )
        .await
    }

    #[tool(
        description = "Set a task's priority: low, normal, high or urgent (claim_next_task takes \
                       the highest first, the oldest first within one). Only the agent that \
                       created the task (any window), for a task open or claimed; refused for \
                       a task done or cancelled. Records a priority_changed event; the same \
                       priority again changes nothing."
    )]
    async fn set_task_priority(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<SetPriorityArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let rights = tasks::Rights::Creator;
        self.once(
            &parts,
            "set_task_priority",
            args.request_id.as_deref(),
            |mut w| async move {
                let task =
                    tasks::set_priority_in(&mut w, me, &args.key, &args.priority, rights).await;
                (w, task)
            },
        )
        .await
    }

    #[tool(
        description = "List the team's tasks, filtered by status (open, claimed, done, \
                       cancelled, any). open and claimed come in queue order (highest priority \
                       first, then oldest first); the others most recently changed first. `more` says when limit cut it short. Empty (with a `note`) means no task matches the filter.",
        annotations(read_only_hint = true)
    )]
    async fn list_tasks(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListTasksArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now(
            "tasks",
            "no task has this status (or, with mine_only, is yours)",
        )
        .reply(
            tasks::list(
                self.bus(),
                me,
                args.status.as_deref(),
                args.mine_only.unwrap_or(false),
                args.limit,
            )
            .await,
        )
    }

    #[tool(
        description = "One task with its description, metadata, dependencies, holder (or \
                       lapsed_holder), result and event history. An unknown key is refused, never answered empty.",
        annotations(read_only_hint = true)
    )]
    async fn get_task(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<TaskKeyArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(tasks::get(self.bus(), me, &args.key).await)
    }
}
