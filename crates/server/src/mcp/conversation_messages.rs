//! Conversation message tools: `send_conversation_message`,
//! `read_conversation`, `get_conversation_message`, `ack_message`,
//! `get_message_receipts` and `wait_for_conversation_updates`; and
//! `list_owed` (`ack_message` also takes direct and channel messages:
//! `store::messaging::acks`). The logic is
//! in `store::conversations::messages` and `store::conversations::receipts`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::answers::Read;
use super::waits::ProgressTicker;
use super::{BusServer, caller, refusal, reply};
use acs_store::store::conversations::messages::{self, NewConversationMessage, ReadRequest};
use acs_store::store::{conversations::inbox, conversations::receipts};
use acs_store::store::{messaging::acks, messaging::waits};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendArgs {
    /// The conversation.
    pub conversation_id: Uuid,
    /// The message, 1 byte to 1 MiB.
    pub body: String,
    /// A UUID you generate per message; resend the same one (with the same
    /// body) to retry safely: you get the original back, nothing twice.
    pub request_id: String,
    /// A message of this conversation this one answers.
    pub reply_to: Option<Uuid>,
    /// A JSON object (or a string holding one), at most 16 KiB.
    pub metadata: Option<Value>,
}

impl From<SendArgs> for NewConversationMessage {
    fn from(args: SendArgs) -> Self {
        NewConversationMessage {
            conversation_id: args.conversation_id,
            body: args.body,
            request_id: args.request_id,
            reply_to: args.reply_to,
            metadata: args.metadata,
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The conversation.
    pub conversation_id: Uuid,
    /// Read messages after this seq (the next_after_seq of your last read); omit to
    /// read from the start of your history.
    pub after_seq: Option<i64>,
    /// 1..200, default 50.
    #[schemars(range(min = 1, max = 200), extend("default" = 50))]
    pub limit: Option<i64>,
}

impl From<ReadArgs> for ReadRequest {
    fn from(args: ReadArgs) -> Self {
        ReadRequest {
            conversation_id: args.conversation_id,
            after_seq: args.after_seq,
            limit: args.limit,
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageArgs {
    /// A conversation message id.
    pub message_id: Uuid,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AckArgs {
    /// The message to acknowledge: a conversation message, or a direct or channel message
    /// posted with ack_required.
    pub message_id: Uuid,
    /// Conversation messages only: also mark it resolved (resolved implies acknowledged).
    pub resolved: Option<bool>,
    /// A short note for the sender, at most 1024 bytes; kept only if the receipt has none yet.
    pub note: Option<String>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListOwedArgs {
    /// Only acknowledgements past their due time. Default false.
    #[serde(default)]
    pub overdue_only: bool,
    /// Per list, 1..100 (default 20).
    #[schemars(range(min = 1, max = 100), extend("default" = 20))]
    pub limit: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresentedArgs {
    /// The conversation messages just shown to the model, 1 to 100.
    pub message_ids: Vec<Uuid>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConversationWaitArgs {
    /// How long to wait, 1..300 s (default 50: under the ~60 s many clients allow a call).
    #[schemars(range(min = 1, max = 300), extend("default" = 50))]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxFetchArgs {
    /// 1..50, default 20.
    #[schemars(range(min = 1, max = 50), extend("default" = 20))]
    pub limit: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxConfirmArgs {
    /// delivery_id values from fetch_conversation_inbox (1..100).
    pub delivery_ids: Vec<Uuid>,
}

#[tool_router(router = conversation_message_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Send a message to a conversation you are an active member of. Gets the \
                          next gap-free seq; the recipients (the other active members) are frozen \
                          now, each with a receipt. Retry with the same request_id and body to get \
                          the original back; nothing is stored twice."
    )]
    async fn send_conversation_message(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<SendArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        reply(messages::send(self.bus(), me, args.into()).await)
    }

    #[tool(
        description = "Read a conversation in seq order from after_seq (your history boundary at \
                          the earliest). Each message has your receipt and, when its body cannot \
                          be shown, why. Pass next_after_seq back to read on. Writes no receipt: \
                          acknowledge with ack_message. Empty `messages` has a `note`: nothing after next_after_seq; an after_seq ahead of the newest seq is refused.",
        annotations(read_only_hint = true)
    )]
    async fn read_conversation(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ReadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now("messages", "nothing to read")
            .reply(messages::read(self.bus(), me, args.into()).await)
    }

    #[tool(
        description = "One conversation message by id, under the same access rules as \
                          read_conversation. A message you may not see is refused as not found, never answered empty; a body that cannot be shown says why.",
        annotations(read_only_hint = true)
    )]
    async fn get_conversation_message(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<MessageArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(messages::get(self.bus(), me, args.message_id).await)
    }

    #[tool(
        description = "Acknowledge a conversation message addressed to this window (resolved: \
                          true also resolves it), or a direct or channel message that asked you \
                          for an acknowledgement (post_message ack_required), with an optional \
                          short note. Each is recorded once; repeating keeps the first time and \
                          the first note. A message not asking, or not owed by you, is refused."
    )]
    async fn ack_message(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<AckArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "ack_message",
            args.request_id.as_deref(),
            |mut w| async move {
                let acked = acks::ack_on(
                    w.conn(),
                    me,
                    args.message_id,
                    args.resolved.unwrap_or(false),
                    args.note,
                )
                .await;
                (w, acked)
            },
        )
        .await
    }

    #[tool(
        description = "Acknowledgements owed, oldest first: `i_owe` (direct and channel \
                          messages asking your agent for an ack, conversation messages to this \
                          window) and `owed_to_me` (messages this window sent, with who still \
                          owes). Each entry has sent_at, due_at and overdue. `*_more: true`: more \
                          owed than listed. Both empty: nothing owed as of `as_of` (`note` says \
                          so).",
        annotations(read_only_hint = true)
    )]
    async fn list_owed(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListOwedArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        reply(acks::owed::list_owed(self.bus(), me, args.overdue_only, args.limit).await)
    }

    #[tool(
        description = "Record that these conversation messages addressed to this window were \
                          put in front of the model (the `presented` receipt; only the client \
                          knows, so only this call writes it). Call it after showing them, e.g. \
                          in instructions or hook context. Each is recorded once; all or nothing."
    )]
    async fn mark_presented(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<PresentedArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "mark_presented",
            args.request_id.as_deref(),
            |mut w| async move {
                let presented = receipts::present(&mut w, me, &args.message_ids).await;
                (w, presented)
            },
        )
        .await
    }

    #[tool(
        description = "Receipts of a conversation message (for its sender or a member): total = \
                          the recipients frozen at send, counts of stored, delivered, presented, \
                          acknowledged and resolved, and one row per recipient. A message you may not see is refused, never answered empty.",
        annotations(read_only_hint = true)
    )]
    async fn get_message_receipts(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<MessageArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(receipts::receipts(self.bus(), me, args.message_id).await)
    }

    #[tool(
        description = "Hand out references owed to this window, oldest first: messages addressed \
                          to it (conversation, seq, sender; read the body with \
                          get_conversation_message) and receipts of its own messages. Confirm \
                          each with confirm_inbox_delivery; unconfirmed ones come back after 60 s. \
                          `more: true` means more are owed: fetch again. Empty `deliveries` (with a `note`) means nothing is owed now."
    )]
    async fn fetch_conversation_inbox(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<InboxFetchArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let limit = match inbox::check_fetch_limit(args.limit) {
            Ok(limit) => limit,
            Err(err) => return Ok(refusal(&err)),
        };
        Read::now("deliveries", "nothing is owed to this window now")
            .reply(inbox::fetch_inbox(self.bus(), me, limit).await)
    }

    #[tool(
        description = "Confirm that references from fetch_conversation_inbox reached you: records \
                          `delivered` on your receipts. Repeating is harmless."
    )]
    async fn confirm_inbox_delivery(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<InboxConfirmArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        reply(inbox::confirm_delivery(self.bus(), me, &args.delivery_ids).await)
    }

    #[tool(
        description = "How many references are owed to this window and handed out, and the state \
                          of its broker consumer (on a team whose conversations use JetStream). \
                          Counting stops at 50 (one full fetch page): `owed_at_least: true` means at least \
                          `owed`; fetch and confirm to bring it down. `owed: 0` means nothing is owed now (`as_of`).",
        annotations(read_only_hint = true)
    )]
    async fn conversation_inbox_status(
        &self,
        Extension(parts): Extension<http::request::Parts>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(inbox::status(self.bus(), me).await)
    }

    #[tool(
        description = "Block until a conversation where this window is an active member has \
                          messages addressed to it that it has not acknowledged (returns at once \
                          if some are waiting). Returns woke, timed_out and per conversation the \
                          unacknowledged count and latest seq. Call again to keep waiting. `timed_out` with nothing listed means nothing arrived; empty never hides an error."
    )]
    async fn wait_for_conversation_updates(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ConversationWaitArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let timeout = match waits::check_timeout(args.timeout_seconds) {
            Ok(timeout) => timeout,
            Err(err) => return Ok(refusal(&err)),
        };
        let _progress = ProgressTicker::start(&ctx, timeout, "waiting for conversation messages");
        let wait = receipts::wait_for_conversation_updates(self.bus(), me, timeout);
        reply(super::waits::unless_abandoned(&ctx, wait).await)
    }
}
