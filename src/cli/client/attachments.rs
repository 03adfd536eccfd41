//! `client attach` and `client download`: a file on a task (`attach_file`)
//! and one fetched back (`get_attachment`). The reading and writing of the
//! files themselves is in [`super::files`].

use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::Args;
use serde_json::{Value, json};

use super::{Print, Request, files, request, show};
use crate::cli::output;

#[derive(Args, Debug)]
pub(super) struct AttachArgs {
    /// The task's key.
    task: String,
    /// The file to attach.
    file: PathBuf,
    /// Media type [default: guessed from the extension].
    #[arg(long)]
    content_type: Option<String>,
}

#[derive(Args, Debug)]
pub(super) struct DownloadArgs {
    /// The attachment's id.
    id: String,
    /// Where to write it (a directory keeps the original name).
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Overwrite an existing file.
    #[arg(long)]
    force: bool,
}

/// How to show an attachment tool's answer.
pub(super) enum Show {
    Attached { path: PathBuf },
    Download { out: Option<PathBuf>, force: bool },
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Attachments(show))
}

pub(super) fn attach(args: AttachArgs) -> anyhow::Result<Request> {
    let AttachArgs {
        task,
        file,
        content_type,
    } = args;
    let (filename, data) = files::read_attachment(&file)?;
    let content_type = content_type.unwrap_or_else(|| files::guess_content_type(&file).into());
    Ok(shown(
        "attach_file",
        json!({
            "task": task, "filename": filename, "content_type": content_type,
            "data_base64": STANDARD.encode(data),
        }),
        Show::Attached { path: file },
    ))
}

pub(super) fn download(args: DownloadArgs) -> Request {
    let DownloadArgs { id, out, force } = args;
    shown(
        "get_attachment",
        json!({"id": id}),
        Show::Download { out, force },
    )
}

/// Before the call: a download checks its destination before fetching the bytes.
pub(super) fn before_call(show: &Show) -> anyhow::Result<()> {
    match show {
        Show::Download { out, force } => files::check_destination(out.as_deref(), *force),
        Show::Attached { .. } => Ok(()),
    }
}

/// Print an answer (its JSON with `--json`); a download writes the file first.
pub(super) fn print(show: Show, answer: &Value, json: bool) -> anyhow::Result<()> {
    match show {
        Show::Download { out, force } => {
            let (path, bytes) = files::save_attachment(answer, out, force)?;
            if json {
                let mut shown = answer.clone();
                if let Some(fields) = shown.as_object_mut() {
                    fields.remove("data_base64");
                    fields.insert("path".into(), json!(path.display().to_string()));
                }
                return output::json(&shown);
            }
            println!(
                "wrote {} ({} bytes, {}, from {})",
                path.display(),
                bytes,
                show::text(&answer["content_type"]),
                show::text(&answer["uploaded_by"]),
            );
        }
        Show::Attached { .. } if json => return output::json(answer),
        Show::Attached { path } => show::attached(answer, &path),
    }
    Ok(())
}
