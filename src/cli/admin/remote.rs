//! The server an `admin` command speaks to, and the credential it speaks
//! with: `BUS_ADMIN_URL` + `BUS_ADMIN_TOKEN`, else the login stored by
//! `admin login` (a config file written atomically with mode 0600, the
//! credential read from a prompt that does not echo); `admin logout` forgets
//! it. [`Remote::call`] is one `/admin` API call.

use std::io::{BufRead, IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{Context as _, anyhow, bail};
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::s;

#[derive(Serialize, Deserialize)]
struct StoredLogin {
    url: String,
    credential: String,
}

/// A server to call, with the credential to call it with.
pub(super) struct Remote {
    pub(super) url: String,
    credential: String,
    http: reqwest::Client,
}

impl Remote {
    fn new(url: &str, credential: String) -> Remote {
        Remote {
            url: url.trim_end_matches('/').to_string(),
            credential,
            http: reqwest::Client::new(),
        }
    }

    /// `BUS_ADMIN_URL` + `BUS_ADMIN_TOKEN`, else the stored login.
    pub(super) fn load() -> anyhow::Result<Remote> {
        let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        match (env("BUS_ADMIN_URL"), env("BUS_ADMIN_TOKEN")) {
            (Some(url), Some(token)) => return Ok(Remote::new(&url, token)),
            (Some(_), None) | (None, Some(_)) => {
                bail!(
                    "set both BUS_ADMIN_URL and BUS_ADMIN_TOKEN, or neither (then `admin login` is used)"
                )
            }
            (None, None) => {}
        }
        let path = config_path()?;
        let text = std::fs::read_to_string(&path).map_err(|_| {
            anyhow!(
                "not logged in: run `ai-crew-sync admin login --url URL` (or set BUS_ADMIN_URL and \
                 BUS_ADMIN_TOKEN). Looked for {}.",
                path.display()
            )
        })?;
        let stored: StoredLogin = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a login file", path.display()))?;
        Ok(Remote::new(&stored.url, stored.credential))
    }

    /// One API call; a refusal becomes an error carrying the server's message.
    pub(super) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.credential);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("could not reach {}", self.url))?;
        let status = response.status();
        let value: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let message = value["message"]
                .as_str()
                .unwrap_or("no explanation in the answer");
            bail!("{status}: {message}");
        }
        Ok(value)
    }
}

/// `$BUS_CONFIG_DIR/admin.json`, else `$XDG_CONFIG_HOME/ai-crew-sync/admin.json`,
/// else `~/.config/ai-crew-sync/admin.json`.
fn config_path() -> anyhow::Result<PathBuf> {
    let env = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = env("BUS_CONFIG_DIR")
        .or_else(|| env("XDG_CONFIG_HOME").map(|d| d.join("ai-crew-sync")))
        .or_else(|| env("HOME").map(|h| h.join(".config/ai-crew-sync")))
        .ok_or_else(|| {
            anyhow!("no HOME, XDG_CONFIG_HOME or BUS_CONFIG_DIR to keep the login in")
        })?;
    Ok(dir.join("admin.json"))
}

pub(super) async fn login(url: &str) -> anyhow::Result<()> {
    let credential = read_secret("admin credential (acsa_…): ")?;
    let remote = Remote::new(url, credential);
    let me = remote
        .call(Method::GET, "/admin/whoami", None)
        .await
        .context("the credential did not verify")?;
    let path = config_path()?;
    write_private(
        &path,
        &serde_json::to_vec_pretty(&StoredLogin {
            url: remote.url.clone(),
            credential: remote.credential.clone(),
        })?,
    )?;
    println!(
        "logged in to {} as admin credential {}… (scope {}); saved in {}",
        remote.url,
        s(&me["display_prefix"]),
        s(&me["scope"]),
        path.display()
    );
    Ok(())
}

/// Forget the stored login: remove the file (the credential is not revoked).
pub(super) fn logout() -> anyhow::Result<()> {
    let path = config_path()?;
    match std::fs::remove_file(&path) {
        Ok(()) => println!("logged out ({} removed)", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => println!("not logged in"),
        Err(e) => return Err(e).context(format!("removing {}", path.display())),
    }
    Ok(())
}

/// Write `bytes` to `path` atomically (temp file + rename), readable only by us.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".admin.json.{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// One line from a prompt that does not echo, or from stdin when it is not a terminal.
fn read_secret(prompt: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    let line = if stdin.is_terminal() {
        eprint!("{prompt}");
        std::io::stderr().flush()?;
        let _echo_off = EchoOff::new();
        let mut line = String::new();
        let read = stdin.lock().read_line(&mut line);
        // The typed newline was not echoed: end the prompt's line before
        // anything else (an `error:` line included) is printed.
        eprintln!();
        read?;
        line
    } else {
        let mut line = String::new();
        stdin.lock().read_line(&mut line)?;
        line
    };
    let secret = line.trim().to_string();
    if secret.is_empty() {
        bail!("no credential given (paste it at the prompt, or pipe it on stdin)");
    }
    Ok(secret)
}

/// Terminal echo off while alive; restored on drop, even on error.
struct EchoOff {
    saved: Option<libc::termios>,
}

impl EchoOff {
    fn new() -> EchoOff {
        // SAFETY: termios calls on fd 0 with a zeroed struct they fill in.
        unsafe {
            let mut term: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut term) != 0 {
                return EchoOff { saved: None };
            }
            let saved = term;
            term.c_lflag &= !libc::ECHO;
            libc::tcsetattr(0, libc::TCSANOW, &term);
            EchoOff { saved: Some(saved) }
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = self.saved {
            // SAFETY: restoring the settings read in `new`.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &saved) };
        }
    }
}
