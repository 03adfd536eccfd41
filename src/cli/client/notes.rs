//! `client note …`: the team's shared notes (`get_note`, `set_note`,
//! `delete_note`, `search_notes`).

use anyhow::bail;
use clap::Subcommand;
use serde_json::{Value, json};

use super::files::read_stdin;
use super::{Print, Request, request, show};

#[derive(Subcommand, Debug)]
pub(super) enum NoteCommand {
    /// Print a note's value (get_note). A missing note exits 1.
    Get {
        /// The note's key (case-sensitive, e.g. `build/commands`).
        key: String,
        /// The note's scope (default `global`).
        #[arg(long)]
        scope: Option<String>,
    },
    /// Write a note (set_note).
    Set {
        /// The note's key (case-sensitive, e.g. `build/commands`).
        key: String,
        /// The value; `-` reads it from stdin.
        value: String,
        /// The note's namespace (default `global`).
        #[arg(long)]
        scope: Option<String>,
        /// A tag (repeat for several); without any, the current tags stay.
        #[arg(long = "tag")]
        tags: Vec<String>,
    },
    /// Delete a note (delete_note).
    Rm {
        /// The note's key (case-sensitive, e.g. `build/commands`).
        key: String,
        /// The note's namespace (default `global`).
        #[arg(long)]
        scope: Option<String>,
    },
    /// Full-text search of the notes (search_notes).
    Search {
        /// Words to look for ("a phrase", or, -word).
        query: String,
        /// Only notes of this namespace (default: every namespace).
        #[arg(long)]
        scope: Option<String>,
    },
}

/// How to show a note tool's answer.
pub(super) enum Show {
    Note,
    NoteSet,
    NoteDeleted,
    NoteHits,
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Notes(show))
}

pub(super) fn prepare(command: NoteCommand) -> anyhow::Result<Request> {
    use NoteCommand as N;
    Ok(match command {
        N::Get { key, scope } => shown("get_note", json!({"key": key, "scope": scope}), Show::Note),
        N::Set {
            key,
            value,
            scope,
            tags,
        } => {
            let value = if value == "-" { read_stdin()? } else { value };
            shown(
                "set_note",
                json!({
                    "key": key, "value": value, "scope": scope,
                    "tags": (!tags.is_empty()).then_some(tags),
                }),
                Show::NoteSet,
            )
        }
        N::Rm { key, scope } => shown(
            "delete_note",
            json!({"key": key, "scope": scope}),
            Show::NoteDeleted,
        ),
        N::Search { query, scope } => shown(
            "search_notes",
            json!({"query": query, "scope": scope}),
            Show::NoteHits,
        ),
    })
}

/// Print an answer as text (`--json` is handled by the caller). A missing
/// note fails, so scripts can test the exit code.
pub(super) fn print(show: Show, answer: &Value) -> anyhow::Result<()> {
    match show {
        Show::Note if answer["found"] == true => {
            let value = answer["value"].as_str().unwrap_or_default();
            if value.ends_with('\n') {
                print!("{value}");
            } else {
                println!("{value}");
            }
        }
        Show::Note => bail!(
            "no note `{}` in scope `{}`",
            show::text(&answer["key"]),
            show::text(&answer["scope"])
        ),
        Show::NoteSet => show::note_set(answer),
        Show::NoteDeleted => show::note_deleted(answer),
        Show::NoteHits => show::note_hits(answer),
    }
    Ok(())
}
