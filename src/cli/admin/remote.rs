//! The server an `admin` command speaks to, and the credential it speaks
//! with: `BUS_ADMIN_URL` + `BUS_ADMIN_TOKEN`, else the login stored by
//! `admin login` (a config file written atomically with mode 0600, the
//! credential read from a prompt that does not echo); `admin logout` forgets
//! it. [`Remote::call`] is one `/admin` API call.

use std::path::PathBuf;

use anyhow::{Context as _, anyhow, bail};
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::s;
use crate::cli::secret::read_secret;
use acs_agent::client::local_files::{self, write_private};

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
        let text = local_files::read_private(&path)?.ok_or_else(|| {
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

/// `admin.json` in the client's config directory ([`local_files::config_dir`]).
fn config_path() -> anyhow::Result<PathBuf> {
    Ok(local_files::config_dir()?.join("admin.json"))
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
