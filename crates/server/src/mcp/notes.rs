//! Note tools (the team's shared memory): `set_note`, `get_note`,
//! `list_notes`, `search_notes`, `delete_note`. All logic lives in
//! `store::messaging::notes`.

use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData, schemars, tool, tool_router};
use serde::Deserialize;

use super::answers::Read;
use super::{BusServer, caller};
use acs_store::store::messaging::notes;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetNoteArgs {
    /// Namespace of the key: ASCII letters, digits and `._:/-`, <= 64 bytes, lower-cased (default `global`).
    pub scope: Option<String>,
    /// The note's name, <= 256 bytes, case-sensitive (e.g. `build/commands`). One-line text rule:
    /// trimmed, NFC-normalised; control, line-separator and bidi-formatting characters refused.
    pub key: String,
    /// The content, <= 1 MiB, kept exactly as given. Replaces the current value; the old one
    /// stays in the note's history.
    pub value: String,
    /// Up to 16 tags of <= 64 bytes each, lower-cased. Omit to keep the current tags, [] to clear them.
    pub tags: Option<Vec<String>>,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteKeyArgs {
    /// The note's scope (default `global`).
    pub scope: Option<String>,
    /// The note's key (case-sensitive; trimmed and NFC-normalised like set_note's).
    pub key: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteNoteArgs {
    /// The note's scope (default `global`).
    pub scope: Option<String>,
    /// The note's key (case-sensitive; trimmed and NFC-normalised like set_note's).
    pub key: String,
    /// Optional: a UUID you choose, new for each new call. Repeating the call with the same
    /// request_id from this window within 24 h returns the first answer (with `replayed: true`)
    /// and changes nothing; the same id with other arguments is refused.
    pub request_id: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListNotesArgs {
    /// Only notes of this scope (default: every scope).
    pub scope: Option<String>,
    /// Only notes carrying this tag.
    pub tag: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchNotesArgs {
    /// Words to find in keys, tags and values (<= 1024 bytes). Web-search syntax: "a phrase", `or`, `-word`. English stemming: `deploy` finds `deploying`. Emoji and other symbols match as written.
    pub query: String,
    /// Only notes of this scope (default: every scope).
    pub scope: Option<String>,
}

#[tool_router(router = note_router, vis = "pub(super)")]
impl BusServer {
    #[tool(
        description = "Write a note to the team's shared memory: create it or replace its value. \
                       Every change keeps a revision (value, tags, author, time); setting the same \
                       value and tags again changes nothing. Teammates waiting for updates are woken."
    )]
    async fn set_note(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<SetNoteArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "set_note",
            args.request_id.as_deref(),
            |mut w| async move {
                let set = notes::set(
                    &mut w,
                    me,
                    args.scope.as_deref(),
                    &args.key,
                    &args.value,
                    args.tags.as_deref(),
                )
                .await;
                (w, set)
            },
        )
        .await
    }

    #[tool(
        description = "Read a note with its value, tags, revision and authors. A missing note \
                       answers `found: false` (not an error).",
        annotations(read_only_hint = true)
    )]
    async fn get_note(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<NoteKeyArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::snapshot().reply(notes::get(self.bus(), me, args.scope.as_deref(), &args.key).await)
    }

    #[tool(
        description = "List notes, most recently updated first (at most 200): key, scope, tags, \
                       size and a 160-character preview, never whole values (use get_note). Empty (with a `note`) means no note matches the scope and tag.",
        annotations(read_only_hint = true)
    )]
    async fn list_notes(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<ListNotesArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now(
            "notes",
            "no note matches this scope and tag (compared whole; omit them to list every note)",
        )
        .reply(notes::list(self.bus(), me, args.scope.as_deref(), args.tag.as_deref()).await)
    }

    #[tool(
        description = "Full-text search of the team's notes (keys, tags and values), best match \
                       first, at most 50, each with the passages that matched. The best \
                       matches are ranked among the 500 most recently updated notes that \
                       match: add words or a scope to reach older ones. Emoji and other \
                       symbols (which full text ignores) match as written. Empty `results` (with a `note`) means no note matches.",
        annotations(read_only_hint = true)
    )]
    async fn search_notes(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<SearchNotesArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        Read::now("results", "no note matches this query")
            .reply(notes::search(self.bus(), me, &args.query, args.scope.as_deref()).await)
    }

    #[tool(
        description = "Delete a note. Idempotent: a missing note answers `deleted: false`. The \
                       deletion is kept in the note's history.",
        annotations(destructive_hint = true, idempotent_hint = true)
    )]
    async fn delete_note(
        &self,
        Extension(parts): Extension<http::request::Parts>,
        Parameters(args): Parameters<DeleteNoteArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let me = caller(&parts)?;
        self.once(
            &parts,
            "delete_note",
            args.request_id.as_deref(),
            |mut w| async move {
                let done = notes::delete(&mut w, me, args.scope.as_deref(), &args.key).await;
                (w, done)
            },
        )
        .await
    }
}
