//! `ai-crew-sync admin …`: `bootstrap` runs beside the database and mints the
//! first global admin credential; everything else speaks the `/admin` API of a
//! running server.
//!
//! Secrets never travel on the command line: `login` reads the credential
//! from a hidden prompt (or stdin when it is not a terminal) and keeps it in a
//! config file written atomically with mode 0600 (`BUS_CONFIG_DIR` moves it).
//! `BUS_ADMIN_URL` + `BUS_ADMIN_TOKEN` together bypass the file.

use std::io::{BufRead, IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::{Context as _, anyhow, bail};
use clap::Subcommand;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Context;
use super::args::{AgentArgs, TeamArgs};
use super::output;
use crate::store::{Actor, admin};

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Mint the first global admin credential (local: needs the database). Shown once.
    Bootstrap {
        #[arg(long)]
        label: Option<String>,
        /// Mint another even though a live global credential exists.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Store a server URL and admin credential (read from a hidden prompt or stdin).
    Login {
        /// The server's base URL, e.g. http://127.0.0.1:8787.
        #[arg(long)]
        url: String,
    },
    /// Forget the stored admin credential.
    Logout,
    /// Show which admin credential is in use and its scope.
    Whoami {
        #[arg(long)]
        json: bool,
    },
    /// Teams.
    #[command(subcommand)]
    Team(RemoteTeam),
    /// Agents of a team.
    #[command(subcommand)]
    Agent(RemoteAgent),
    /// Agent tokens.
    #[command(subcommand)]
    Token(RemoteToken),
    /// Grant a new admin credential: confined to --team, or global without it (global only).
    Grant {
        #[arg(long)]
        team: Option<String>,
        #[arg(long)]
        label: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Admin credentials (global only).
    #[command(subcommand)]
    Credential(RemoteCredential),
}

#[derive(Subcommand, Debug)]
pub enum RemoteTeam {
    Create {
        #[arg(long)]
        slug: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        json: bool,
    },
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum RemoteAgent {
    /// Add an agent; prints its first token once.
    Add(AgentArgs),
    List(TeamArgs),
    Disable(AgentArgs),
    Enable(AgentArgs),
}

#[derive(Subcommand, Debug)]
pub enum RemoteToken {
    /// Issue a token, verify it answers `whoami` as the requested agent and
    /// team (revoking it otherwise), and print it once.
    Issue {
        #[arg(long)]
        team: String,
        #[arg(long)]
        agent: String,
        #[arg(long)]
        label: Option<String>,
        #[arg(long)]
        json: bool,
    },
    List(TeamArgs),
    Revoke {
        #[arg(long)]
        team: String,
        #[arg(long)]
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum RemoteCredential {
    List {
        #[arg(long)]
        json: bool,
    },
    Revoke {
        #[arg(long)]
        id: String,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(ctx: &Context, command: AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::Bootstrap { label, force, json } => {
            let actor = Actor::local_operator();
            let issued = ctx
                .with_database(async |pool| {
                    Ok(admin::bootstrap(pool, label.as_deref(), force, &actor).await?)
                })
                .await?;
            if json {
                return output::json(&issued);
            }
            println!(
                "global admin credential (id {}), shown once; store it now:",
                issued.id
            );
            println!("  {}", issued.credential);
            println!(
                "next: ai-crew-sync admin login --url http://127.0.0.1:8787   (paste it at the prompt)"
            );
            Ok(())
        }
        AdminCommand::Login { url } => login(&url).await,
        AdminCommand::Logout => {
            let path = config_path()?;
            match std::fs::remove_file(&path) {
                Ok(()) => println!("logged out ({} removed)", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => println!("not logged in"),
                Err(e) => return Err(e).context(format!("removing {}", path.display())),
            }
            Ok(())
        }
        AdminCommand::Whoami { json } => {
            let me = Remote::load()?
                .call(Method::GET, "/admin/whoami", None)
                .await?;
            if json {
                return output::json(&me);
            }
            println!(
                "admin credential {}… (id {}), scope {}",
                me["display_prefix"].as_str().unwrap_or_default(),
                me["credential_id"].as_str().unwrap_or_default(),
                me["scope"].as_str().unwrap_or_default()
            );
            Ok(())
        }
        AdminCommand::Team(command) => team(command).await,
        AdminCommand::Agent(command) => agent(command).await,
        AdminCommand::Token(command) => token(command).await,
        AdminCommand::Grant { team, label, json } => {
            let body = json!({ "team": team, "label": label });
            let issued = Remote::load()?
                .call(Method::POST, "/admin/credentials", Some(body))
                .await?;
            if json {
                return output::json(&issued);
            }
            println!(
                "admin credential for scope {} (id {}), shown once; store it now:",
                issued["scope"].as_str().unwrap_or_default(),
                issued["id"].as_str().unwrap_or_default()
            );
            println!("  {}", issued["credential"].as_str().unwrap_or_default());
            Ok(())
        }
        AdminCommand::Credential(command) => credential(command).await,
    }
}

async fn team(command: RemoteTeam) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemoteTeam::Create { slug, name, json } => {
            let team = remote
                .call(
                    Method::POST,
                    "/admin/teams",
                    Some(json!({ "slug": slug, "name": name })),
                )
                .await?;
            print_or(json, &team, || {
                println!(
                    "team `{}` created",
                    team["slug"].as_str().unwrap_or_default()
                )
            })
        }
        RemoteTeam::List { json } => {
            let teams = remote.call(Method::GET, "/admin/teams", None).await?;
            print_or(json, &teams, || {
                output::table(
                    &["slug", "name", "agents", "id"],
                    rows(&teams, |t| {
                        vec![
                            s(&t["slug"]),
                            s(&t["name"]),
                            t["agents"].to_string(),
                            s(&t["id"]),
                        ]
                    }),
                )
            })
        }
    }
}

async fn agent(command: RemoteAgent) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemoteAgent::Add(AgentArgs { team, name, json }) => {
            let path = format!("/admin/teams/{}/agents", segment(&team));
            let issued = remote
                .call(Method::POST, &path, Some(json!({ "name": name })))
                .await?;
            print_or(json, &issued, || print_issued_token(&issued))
        }
        RemoteAgent::List(TeamArgs { team, json }) => {
            let agents = remote
                .call(
                    Method::GET,
                    &format!("/admin/teams/{}/agents", segment(&team)),
                    None,
                )
                .await?;
            print_or(json, &agents, || {
                output::table(
                    &["name", "disabled", "active tokens", "id"],
                    rows(&agents, |a| {
                        vec![
                            s(&a["name"]),
                            s(&a["disabled_at"]),
                            a["active_tokens"].to_string(),
                            s(&a["id"]),
                        ]
                    }),
                )
            })
        }
        RemoteAgent::Disable(AgentArgs { team, name, json }) => {
            set_disabled(&remote, &team, &name, true, json).await
        }
        RemoteAgent::Enable(AgentArgs { team, name, json }) => {
            set_disabled(&remote, &team, &name, false, json).await
        }
    }
}

async fn set_disabled(
    remote: &Remote,
    team: &str,
    name: &str,
    disable: bool,
    json: bool,
) -> anyhow::Result<()> {
    let verb = if disable { "disable" } else { "enable" };
    let path = format!(
        "/admin/teams/{}/agents/{}/{verb}",
        segment(team),
        segment(name)
    );
    let state = remote.call(Method::POST, &path, None).await?;
    print_or(json, &state, || {
        let done = if disable { "disabled" } else { "enabled" };
        if state["changed"] == true {
            println!("agent `{name}` of team `{team}` is now {done}");
        } else {
            println!("agent `{name}` of team `{team}` was already {done}; nothing changed");
        }
    })
}

async fn token(command: RemoteToken) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemoteToken::Issue {
            team,
            agent,
            label,
            json,
        } => {
            let path = format!("/admin/teams/{}/tokens", segment(&team));
            let issued = remote
                .call(
                    Method::POST,
                    &path,
                    Some(json!({ "agent": agent, "label": label })),
                )
                .await?;
            verify_issued_token(&remote, &issued).await?;
            print_or(json, &issued, || print_issued_token(&issued))
        }
        RemoteToken::List(TeamArgs { team, json }) => {
            let tokens = remote
                .call(
                    Method::GET,
                    &format!("/admin/teams/{}/tokens", segment(&team)),
                    None,
                )
                .await?;
            print_or(json, &tokens, || {
                output::table(
                    &["id", "agent", "prefix", "label", "revoked"],
                    rows(&tokens, |t| {
                        vec![
                            s(&t["id"]),
                            s(&t["agent"]),
                            s(&t["display_prefix"]),
                            s(&t["label"]),
                            s(&t["revoked_at"]),
                        ]
                    }),
                )
            })
        }
        RemoteToken::Revoke { team, id, json } => {
            let path = format!("/admin/teams/{}/tokens/{}", segment(&team), segment(&id));
            let revoked = remote.call(Method::DELETE, &path, None).await?;
            print_or(json, &revoked, || {
                if revoked["revoked_now"] == true {
                    println!("token {id} revoked");
                } else {
                    println!("token {id} was already revoked; nothing changed");
                }
            })
        }
    }
}

async fn credential(command: RemoteCredential) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemoteCredential::List { json } => {
            let list = remote.call(Method::GET, "/admin/credentials", None).await?;
            print_or(json, &list, || {
                output::table(
                    &["id", "scope", "prefix", "label", "revoked"],
                    rows(&list, |c| {
                        vec![
                            s(&c["id"]),
                            s(&c["scope"]),
                            s(&c["display_prefix"]),
                            s(&c["label"]),
                            s(&c["revoked_at"]),
                        ]
                    }),
                )
            })
        }
        RemoteCredential::Revoke { id, json } => {
            let revoked = remote
                .call(
                    Method::DELETE,
                    &format!("/admin/credentials/{}", segment(&id)),
                    None,
                )
                .await?;
            print_or(json, &revoked, || println!("admin credential {id} revoked"))
        }
    }
}

/// Ask the server's MCP endpoint who the new token is; revoke it unless the
/// answer is exactly the agent and team that were asked for.
async fn verify_issued_token(remote: &Remote, issued: &Value) -> anyhow::Result<()> {
    let token = issued["token"]
        .as_str()
        .ok_or_else(|| anyhow!("the server answered without a token"))?;
    let (team, agent) = (s(&issued["team"]), s(&issued["agent"]));
    let answer = crate::client::whoami(&format!("{}/mcp", remote.url), token, None).await;
    let mismatch = match &answer {
        Ok(me) if me["team"] == team.as_str() && me["agent"] == agent.as_str() => return Ok(()),
        Ok(me) => format!(
            "whoami answered agent {} of team {}",
            me["agent"], me["team"]
        ),
        Err(err) => format!("whoami failed: {err:#}"),
    };
    let path = format!(
        "/admin/teams/{}/tokens/{}",
        segment(&team),
        segment(&s(&issued["id"]))
    );
    let revoked = remote.call(Method::DELETE, &path, None).await;
    bail!(
        "the new token for agent `{agent}` of team `{team}` did not verify ({mismatch}); it was {}. \
         Check that --url reaches the server that issued it.",
        if revoked.is_ok() {
            "revoked"
        } else {
            "NOT revoked: revoke it by hand"
        }
    )
}

fn print_issued_token(issued: &Value) {
    println!(
        "token for `{}` in team `{}` (id {}), shown once; store it now:",
        s(&issued["agent"]),
        s(&issued["team"]),
        s(&issued["id"])
    );
    println!("  {}", s(&issued["token"]));
}

fn print_or(json: bool, value: &Value, text: impl FnOnce()) -> anyhow::Result<()> {
    if json {
        return output::json(value);
    }
    text();
    Ok(())
}

fn rows(list: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    list.as_array()
        .map(|items| items.iter().map(row).collect())
        .unwrap_or_default()
}

/// A JSON value as table text: strings bare, null as `-`.
fn s(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A path segment, percent-encoded.
fn segment(raw: &str) -> String {
    url::form_urlencoded::byte_serialize(raw.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[derive(Serialize, Deserialize)]
struct StoredLogin {
    url: String,
    credential: String,
}

/// A server to call, with the credential to call it with.
struct Remote {
    url: String,
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
    fn load() -> anyhow::Result<Remote> {
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
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
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

async fn login(url: &str) -> anyhow::Result<()> {
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
