//! The console client's local input and output: stdin, a file to attach
//! (read and checked before connecting, so a typo costs no round trip) and
//! a downloaded attachment written to disk. Nothing here speaks to the bus.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The server's per-file limit, checked here too: a bigger file would be
/// refused anyway, after travelling (or as an opaque 413 past 8 MiB).
const ATTACHMENT_MAX_BYTES: u64 =
    acs_store::store::messaging::attachments::ATTACHMENT_MAX_BYTES as u64;

/// All of stdin, without the one trailing newline `echo` and heredocs add.
pub(super) fn read_stdin() -> anyhow::Result<String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("could not read stdin")?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

pub(super) fn read_attachment(file: &Path) -> anyhow::Result<(String, Vec<u8>)> {
    let size = std::fs::metadata(file)
        .with_context(|| format!("could not read {}", file.display()))?
        .len();
    if size > ATTACHMENT_MAX_BYTES {
        bail!(
            "{} is {size} bytes; attachments are at most {ATTACHMENT_MAX_BYTES} (256 KiB). \
             Attach an excerpt, or split it across files.",
            file.display()
        );
    }
    let data = std::fs::read(file).with_context(|| format!("could not read {}", file.display()))?;
    let filename = file
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("{} has no usable file name", file.display()))?;
    Ok((filename.to_string(), data))
}

/// A small table of common types; `--content-type` covers the rest.
pub(super) fn guess_content_type(file: &Path) -> &'static str {
    let extension = file
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    match extension.as_str() {
        "txt" | "log" | "rs" | "py" | "go" | "sh" | "c" | "h" | "java" | "sql" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "js" | "mjs" => "text/javascript",
        "diff" | "patch" => "text/x-diff",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "webp" => "image/webp",
        _ => "application/octet-stream",
    }
}

/// Refuse a download whose destination is an existing file, before the
/// bytes are fetched (`force` overwrites; a directory keeps the file's own name).
pub(super) fn check_destination(out: Option<&Path>, force: bool) -> anyhow::Result<()> {
    if let Some(out) = out
        && !force
        && out.exists()
        && !out.is_dir()
    {
        bail!(refuse_overwrite(out));
    }
    Ok(())
}

/// Write a fetched attachment: to `out`, into `out` when it is a directory,
/// or under its own name in the current directory. Never overwrites without
/// `force`; the bytes are checked against the server's SHA-256 first.
/// Returns where it wrote and how many bytes.
pub(super) fn save_attachment(
    answer: &Value,
    out: Option<PathBuf>,
    force: bool,
) -> anyhow::Result<(PathBuf, usize)> {
    let filename = answer["filename"].as_str().unwrap_or_default();
    let data = STANDARD
        .decode(answer["data_base64"].as_str().unwrap_or_default())
        .context("the server sent an attachment that is not base64")?;
    let digest = hex::encode(Sha256::digest(&data));
    if let Some(expected) = answer["sha256"].as_str()
        && !expected.eq_ignore_ascii_case(&digest)
    {
        bail!(
            "the downloaded bytes do not match the attachment's SHA-256 ({expected}); nothing written"
        );
    }
    let path = match out {
        Some(dir) if dir.is_dir() => dir.join(safe_file_name(filename)?),
        Some(path) => path,
        None => PathBuf::from(safe_file_name(filename)?),
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let mut file = match options.open(&path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            bail!(refuse_overwrite(&path))
        }
        Err(err) => return Err(err).with_context(|| format!("could not write {}", path.display())),
    };
    file.write_all(&data)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("could not write {}", path.display()))?;
    Ok((path, data.len()))
}

fn refuse_overwrite(path: &Path) -> String {
    format!(
        "{} already exists; pass --force to overwrite it, or --out to choose another path",
        path.display()
    )
}

/// The uploader chose the name: keep only a plain file name, never a path.
fn safe_file_name(filename: &str) -> anyhow::Result<&str> {
    match Path::new(filename).file_name().and_then(|n| n.to_str()) {
        Some(name) if name == filename && !name.is_empty() => Ok(name),
        _ => bail!(
            "the attachment's name {filename:?} is not a plain file name; choose one with --out"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_come_from_the_extension() {
        assert_eq!(guess_content_type(Path::new("a/trace.LOG")), "text/plain");
        assert_eq!(guess_content_type(Path::new("x.json")), "application/json");
        assert_eq!(
            guess_content_type(Path::new("noext")),
            "application/octet-stream"
        );
    }

    #[test]
    fn an_uploaded_name_never_becomes_a_path() {
        assert_eq!(safe_file_name("report.txt").unwrap(), "report.txt");
        assert!(safe_file_name("..").is_err());
        assert!(safe_file_name("../x").is_err());
        assert!(safe_file_name("").is_err());
    }
}
