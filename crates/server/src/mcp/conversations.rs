//! Conversation membership tools: `create_conversation`, `list_conversations`,
//! `invite_to_conversation`, `join_conversation`, `leave_conversation`,
//! `remove_conversation_member`, `archive_conversation`,
//! `transfer_membership`, `recover_conversation_history`.
//!
//! Thin: parse, call `store::conversations`, shape the answer. The rules
//! (visibility, roles, the member cap, lock order, audit) live there.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::answers::Read;
use super::{BusServer, caller, reply};
use acs_store::auth::Identity;
use acs_store::error::BusResult;
use acs_store::store::conversations::{self, Placement};
use acs_store::store::requests::Writer;

// The capability gate in `mod.rs` reaches these through this module.
pub(super) use acs_store::store::conversations::{TOOLS, disabled_error, enabled};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateConversationArgs {
    /// Title: 1-200 bytes, one line (trimmed, NFC-normalised; control, line-separator and
    /// bidi-formatting characters refused).
    pub title: String,
    /// The project it belongs to (visible to agents holding that project's
    /// grant). Give this or `private: true`, not both.
    pub project: Option<String>,
    /// true: members only. Give this or `project`. Visibility never changes.
    pub private: Option<bool>,
    /// Addresses to invite as participants: `agent` (its shared window) or
    /// `agent/window`. They join with join_conversation.
    pub invite: Option<Vec<String>>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListConversationsArgs {
    /// Include archived conversations (default false).
    pub include_archived: Option<bool>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConversationIdArgs {
    pub conversation_id: Uuid,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InviteArgs {
    pub conversation_id: Uuid,
    /// `agent` (its shared window) or `agent/window`.
    pub address: String,
    /// moderator, participant or observer.
    pub role: String,
    /// New invitations only: let the invitee read from the first message
    /// (default: from now). A removed seat always comes back from now.
    pub history_from_start: Option<bool>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RemoveArgs {
    pub conversation_id: Uuid,
    /// `agent` (its shared window) or `agent/window`.
    pub address: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransferArgs {
    pub conversation_id: Uuid,
    /// Another window of your own agent: a label such as `w2`, `""` for your
    /// shared window, or the address `agent/w2`.
    pub to: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecoverArgs {
    pub conversation_id: Uuid,
    /// Return messages after this seq (default 0).
    #[schemars(extend("default" = 0))]
    pub after_seq: Option<i64>,
    /// 1..=200, default 50.
    #[schemars(range(min = 1, max = 200), extend("default" = 50))]
    pub limit: Option<i64>,
}

#[tool_router(router = conversation_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Start a conversation: in a project (`project`, you need its grant) or \
                          private (`private: true`). You get the owner seat for this window; \
                          `invite` addresses get participant invitations."
    )]
    async fn create_conversation(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<CreateConversationArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let placement = match Placement::from_args(args.project, args.private) {
            Ok(placement) => placement,
            Err(err) => return reply::<()>(Err(err)),
        };
        let invite = args.invite.unwrap_or_default();
        let bus = self.bus();
        self.once(
            &parts,
            "create_conversation",
            args.request_id.as_deref(),
            |mut w| async move {
                let created =
                    conversations::create(bus, &mut w, me, &args.title, placement, &invite).await;
                (w, created)
            },
        )
        .await
    }

    #[tool(
        description = "Conversations this window holds a seat in (with its role and state) and \
                          project conversations you read through a project grant. Empty (with a `note`) means no seat and no project conversation you may read.",
        annotations(read_only_hint = true)
    )]
    async fn list_conversations(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListConversationsArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let archived = args.include_archived.unwrap_or(false);
        Read::now(
            "conversations",
            "this window has no seat in a conversation and no project grant shows one",
        )
        .list(conversations::list(self.bus(), me, archived).await, None)
    }

    #[tool(
        description = "Owners and moderators: invite a window (`agent` or `agent/window`) as \
                          moderator, participant or observer; re-admit a removed one (from now); \
                          or, for an active member, change its role (only an owner changes an \
                          owner). The invitee joins with join_conversation."
    )]
    async fn invite_to_conversation(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<InviteArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let from_start = args.history_from_start.unwrap_or(false);
        self.once_in(
            &parts,
            "invite_to_conversation",
            args.conversation_id,
            args.request_id.as_deref(),
            async move |w, me, id| {
                conversations::invite(w, me, id, &args.address, &args.role, from_start).await
            },
        )
        .await
    }

    #[tool(
        description = "Accept this window's invitation (the seat becomes active: you can read and \
                          send), or complete a transfer_membership proposed to this window."
    )]
    async fn join_conversation(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ConversationIdArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.once_on(&parts, "join_conversation", args, conversations::join)
            .await
    }

    #[tool(
        description = "Leave a conversation with this window (or decline its invitation). \
                          Coming back needs a new invitation."
    )]
    async fn leave_conversation(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ConversationIdArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.once_on(&parts, "leave_conversation", args, conversations::leave)
            .await
    }

    #[tool(
        description = "Owners and moderators: remove a member's seat (`agent` or \
                          `agent/window`). Only an owner removes an owner. Re-admitting later \
                          starts from now."
    )]
    async fn remove_conversation_member(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<RemoveArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.once_in(
            &parts,
            "remove_conversation_member",
            args.conversation_id,
            args.request_id.as_deref(),
            async move |w, me, id| conversations::remove(w, me, id, &args.address).await,
        )
        .await
    }

    #[tool(
        description = "Owners and moderators: archive a conversation. Closed to new messages; \
                          its history stays readable."
    )]
    async fn archive_conversation(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ConversationIdArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.once_on(&parts, "archive_conversation", args, conversations::archive)
            .await
    }

    #[tool(
        description = "Propose moving this window's active seat (role, history, receipts) to \
                          another window of your agent (`to`). It moves when that window calls \
                          join_conversation; nothing is re-timestamped."
    )]
    async fn transfer_membership(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<TransferArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        self.once_in(
            &parts,
            "transfer_membership",
            args.conversation_id,
            args.request_id.as_deref(),
            async move |w, me, id| conversations::transfer(w, me, id, &args.to).await,
        )
        .await
    }

    #[tool(
        description = "With the agent token, once every session of your agent is dead: read \
                          (audited, read-only) the history of a conversation one of your windows \
                          was in, limited to the seq ranges (`entitled`) during which one of its \
                          seats was active. Refused while any session is live; never posts or \
                          acknowledges.",
        annotations(read_only_hint = true)
    )]
    async fn recover_conversation_history(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<RecoverArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        reply(
            conversations::recover(
                self.bus(),
                me,
                args.conversation_id,
                args.after_seq,
                args.limit,
            )
            .await,
        )
    }
}

impl BusServer {
    /// A membership tool's write on conversation `id`: the store's `change`
    /// with the caller, once per request id.
    async fn once_in<T: Serialize>(
        &self,
        parts: &http::request::Parts,
        tool: &str,
        id: Uuid,
        request_id: Option<&str>,
        change: impl AsyncFnOnce(&mut Writer, &Identity, Uuid) -> BusResult<T>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(parts)?;
        self.once(parts, tool, request_id, |mut w| async move {
            let done = change(&mut w, me, id).await;
            (w, done)
        })
        .await
    }

    /// [`Self::once_in`] for a tool whose only arguments are the
    /// conversation and the request id.
    async fn once_on<T: Serialize>(
        &self,
        parts: &http::request::Parts,
        tool: &str,
        args: ConversationIdArgs,
        change: impl AsyncFnOnce(&mut Writer, &Identity, Uuid) -> BusResult<T>,
    ) -> Result<CallToolResult, ErrorData> {
        let request_id = args.request_id.as_deref();
        self.once_in(parts, tool, args.conversation_id, request_id, change)
            .await
    }
}
