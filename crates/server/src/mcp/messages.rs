//! Messaging tools: channels, direct messages, reading with per-window
//! cursors, search. All logic lives in `store::messaging::messages` and `store::messaging::channels`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::answers::Read;
use super::sessions::NoArgs;
use super::{BusServer, caller, refusal, reply};
use acs_store::store::messaging::{acks, attachments, channels, messages};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostArgs {
    /// Channel to post in (e.g. `backend`; created on first post, but never as `inbox` or `all`).
    /// Give `channel` or `to`, not both; with neither, the window's default channel (whoami's `default_channel`) is used.
    pub channel: Option<String>,
    /// Address for a direct message: `agent` (every window) or `agent/window` (exactly one).
    pub to: Option<String>,
    /// The text, up to 1 MiB, kept exactly as given (lines, spacing, any script).
    pub body: String,
    /// Channels only: reach every window whatever channel it is focused on.
    #[serde(default)]
    pub announce: bool,
    /// Id of the message this answers (any message of your team).
    pub reply_to: Option<Uuid>,
    /// A JSON object (or a string holding one), up to 16 KiB.
    pub metadata: Option<Value>,
    /// Files to attach: up to 8, each up to 256 KiB.
    #[serde(default)]
    pub attachments: Vec<FileArg>,
    /// Ask for an acknowledgement (ack_message): a DM's agent owes it once, a channel message
    /// every other agent of the team. list_owed shows who still owes it.
    #[serde(default)]
    pub ack_required: bool,
    /// With ack_required: due within this many seconds, 10..604800 (7 days); past it the ack is
    /// overdue (pending_for_me, the dashboard, the `ack.overdue` webhook). Omit for no due time.
    #[schemars(range(min = 10, max = 604800))]
    pub ack_within_seconds: Option<i64>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileArg {
    /// The file's name, e.g. `trace.log`.
    pub filename: String,
    /// Its media type, e.g. `text/plain`.
    pub content_type: String,
    /// Its bytes in standard base64.
    pub data_base64: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// `all` (channels + your DMs), `inbox` (your DMs), or a channel name. Default `all`. A
    /// channel named `inbox` or `all` (made before those names were reserved) is read as `#inbox`.
    pub scope: Option<String>,
    /// Only what this window has not read yet (and mark it read; a DM to your whole agent is then
    /// read for all its windows). Default true; false returns the latest page without moving the
    /// cursor.
    pub only_new: Option<bool>,
    /// Page size, 1..200 (default 50).
    #[schemars(range(min = 1, max = 200), extend("default" = 50))]
    pub limit: Option<i64>,
    /// Also include DMs addressed to your agent's other windows.
    #[serde(default)]
    pub all_sessions: bool,
    /// Read what comes after this position (a `read_up_to` of an earlier read) instead of
    /// from your cursor, oldest first, moving no cursor. Refused when it is ahead of the
    /// newest position or behind what retention pruned (the refusal says where to start).
    pub after: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// Words to look for (web-search syntax: "quoted phrase", OR, -word). Emoji and other symbols
    /// match as written (a leading `-` excludes).
    pub query: String,
    /// At most this many results, 1..200 (default 50).
    #[schemars(range(min = 1, max = 200), extend("default" = 50))]
    pub limit: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateChannelArgs {
    /// Channel name: ASCII letters, digits and `-_.`, up to 64 bytes (a leading `#` is dropped).
    /// `inbox` and `all` are reserved: they are read_messages scopes.
    pub name: String,
    /// One line about the channel, up to 256 bytes (one-line text rule). Replaces the current
    /// topic when given.
    pub topic: Option<String>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachArgs {
    /// Key of the task to attach the file to.
    pub task: String,
    /// The file's name, e.g. `failing-test.log`.
    pub filename: String,
    /// Its media type, e.g. `text/plain`.
    pub content_type: String,
    /// Its bytes in standard base64 (at most 256 KiB decoded).
    pub data_base64: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetAttachmentArgs {
    /// The attachment's id, as listed on its message or task.
    pub id: Uuid,
}

#[tool_router(router = messaging_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Post a message to a channel or a direct message to an address \
                          (`agent` = every window, `agent/window` = exactly one; a window not open \
                          yet still receives it). Returns the message and delivered_to. \
                          ack_required asks the recipient(s) to acknowledge it (ack_message)."
    )]
    async fn post_message(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<PostArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        // The count before any decoding: a long list costs nothing.
        if let Err(err) = attachments::check_count(args.attachments.len()) {
            return Ok(refusal(&err));
        }
        let uploads: Result<Vec<_>, _> = args
            .attachments
            .iter()
            .map(|f| attachments::decode(&f.filename, &f.content_type, &f.data_base64))
            .collect();
        let uploads = match uploads {
            Ok(uploads) => uploads,
            Err(err) => return Ok(refusal(&err)),
        };
        let ack = match acks::check_request(args.ack_required, args.ack_within_seconds) {
            Ok(ack) => ack,
            Err(err) => return Ok(refusal(&err)),
        };
        let new = messages::NewMessage {
            channel: args.channel,
            to: args.to,
            body: args.body,
            announce: args.announce,
            reply_to: args.reply_to,
            metadata: args.metadata,
            question: false,
            attachments: uploads,
            ack,
        };
        self.once(
            &parts,
            "post_message",
            args.request_id.as_deref(),
            |mut w| async move {
                let posted = messages::post_in(&mut w, me, new).await;
                (w, posted)
            },
        )
        .await
    }

    #[tool(
        description = "Read messages. By default returns what this window has not read yet in \
                          `scope` (oldest first) and marks it read; `more: true` means read again. \
                          Cursors are per window and per scope, but a DM to your agent as a \
                          whole is read once: after any window of your agent read it, no window \
                          gets it as new or unread again. A message committed late by \
                          another writer is returned by a later read, never skipped. Every \
                          answer has `read_up_to` (the position reached; pass it as `after` \
                          to resume there); an empty one has a `note`: nothing new after that \
                          position. A channel that does not exist is refused."
    )]
    async fn read_messages(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ReadArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let request = messages::ReadRequest {
            scope: args.scope.unwrap_or_else(|| "all".into()),
            only_new: args.only_new.unwrap_or(true),
            limit: args.limit,
            all_sessions: args.all_sessions,
            after: args.after,
        };
        reply(messages::read(self.bus(), me, request).await)
    }

    #[tool(
        description = "Full-text search over channel messages and your direct messages, best \
                          match first among the newest 1000 matches (a rare word finds old \
                          messages; for a common one, add words to narrow it). Emoji and other symbols (which full text ignores) match \
                          as written; a query of symbols alone lists the newest messages holding them. Empty `messages` (with a `note`) means nothing you may read matches.",
        annotations(read_only_hint = true)
    )]
    async fn search_messages(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<SearchArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now("messages", "no message you may read matches this query").list(
            messages::search(self.bus(), me, &args.query, args.limit).await,
            Some(args.limit.unwrap_or(messages::PAGE_DEFAULT)),
        )
    }

    #[tool(
        description = "The team's channels with their topics, message counts, last message \
                          time, and what this window has not read in each: `unread`, counted up \
                          to 100 (`unread_at_least: true` means 100 or more). Empty means your team has no channel yet.",
        annotations(read_only_hint = true)
    )]
    async fn list_channels(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(_): Parameters<NoArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now("channels", "your team has no channel yet")
            .list(channels::list(self.bus(), me).await, None)
    }

    #[tool(
        description = "Create a channel (idempotent: an existing one is returned, its topic \
                          replaced when you give one)."
    )]
    async fn create_channel(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<CreateChannelArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "create_channel",
            args.request_id.as_deref(),
            |mut w| async move {
                let created = channels::create(&mut w, me, &args.name, args.topic.as_deref()).await;
                (w, created)
            },
        )
        .await
    }

    #[tool(
        description = "Attach a file (up to 256 KiB, 8 per task) to a task. Counts against the \
                          team's attachment quota."
    )]
    async fn attach_file(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<AttachArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        let upload =
            match attachments::decode(&args.filename, &args.content_type, &args.data_base64) {
                Ok(upload) => upload,
                Err(err) => return Ok(refusal(&err)),
            };
        self.once(
            &parts,
            "attach_file",
            args.request_id.as_deref(),
            |mut w| async move {
                let attached = attachments::attach_to_task(&mut w, me, &args.task, upload).await;
                (w, attached)
            },
        )
        .await
    }

    #[tool(
        description = "Download an attachment of a message or task you may read: its bytes as \
                       data_base64, with filename, content_type, sha256 and uploaded_by. An unknown id is refused, never answered empty.",
        annotations(read_only_hint = true)
    )]
    async fn get_attachment(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<GetAttachmentArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(attachments::get(self.bus(), me, args.id).await)
    }
}
