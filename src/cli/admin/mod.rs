//! `ai-crew-sync admin …`: `bootstrap` runs beside the database and mints the
//! first global admin credential; everything else speaks the `/admin` API of a
//! running server.
//!
//! Secrets never travel on the command line: `login` reads the credential
//! from a hidden prompt (or stdin when it is not a terminal) and keeps it in a
//! config file written atomically with mode 0600 (`BUS_CONFIG_DIR` moves it).
//! `BUS_ADMIN_URL` + `BUS_ADMIN_TOKEN` together bypass the file.
//!
//! The commands and what they print are here; the stored login, the prompt
//! and the HTTP calls are in [`remote`].

mod remote;

use anyhow::{anyhow, bail};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{Value, json};

use self::remote::Remote;
use super::Context;
use super::args::{AgentArgs, TeamArgs, TeamCreateArgs, TokenIssueArgs};
use super::output;
use acs_store::store::{Actor, identity::admin};

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Mint the first global admin credential (local: needs the database). Shown once.
    Bootstrap {
        /// A note to tell admin credentials apart in listings (e.g. `ops-laptop`).
        #[arg(long)]
        label: Option<String>,
        /// Mint another even though a live global credential exists.
        #[arg(long)]
        force: bool,
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
    Whoami,
    /// Teams.
    #[command(subcommand)]
    Team(RemoteTeam),
    /// Agents of a team.
    #[command(subcommand)]
    Agent(RemoteAgent),
    /// People of a team: they sign in to the dashboard (not /mcp) and write from it.
    #[command(subcommand)]
    Person(RemotePerson),
    /// Agent tokens.
    #[command(subcommand)]
    Token(RemoteToken),
    /// Grant a new admin credential: confined to --team, or global without it (global only).
    Grant {
        /// Confine the new credential to this team (its slug); without it, the credential is global.
        #[arg(long)]
        team: Option<String>,
        /// A note to tell admin credentials apart in listings (e.g. `ci`).
        #[arg(long)]
        label: Option<String>,
    },
    /// Admin credentials (global only).
    #[command(subcommand)]
    Credential(RemoteCredential),
}

#[derive(Subcommand, Debug)]
pub enum RemoteTeam {
    /// Create a team.
    Create(TeamCreateArgs),
    /// List the teams this credential may see.
    List,
}

#[derive(Subcommand, Debug)]
pub enum RemoteAgent {
    /// Add an agent; prints its first token once.
    Add(AgentArgs),
    /// List a team's agents.
    List(TeamArgs),
    /// Disable an agent: every token it holds is refused at once.
    Disable(AgentArgs),
    /// Enable a disabled agent again.
    Enable(AgentArgs),
}

#[derive(Subcommand, Debug)]
pub enum RemotePerson {
    /// Make someone a person of a team; prints their dashboard sign-in credential once.
    Add(AgentArgs),
    /// List a team's people (never a credential).
    List(TeamArgs),
    /// Revoke a person: every credential of theirs; their dashboard sign-ins end at their next
    /// request.
    Revoke(AgentArgs),
}

#[derive(Subcommand, Debug)]
pub enum RemoteToken {
    /// Issue a token, verify it answers `whoami` as the requested agent and
    /// team (revoking it otherwise), and print it once.
    Issue(TokenIssueArgs),
    /// List a team's agent tokens (never the secrets).
    List(TeamArgs),
    /// Revoke an agent token.
    Revoke {
        /// The team's slug.
        #[arg(long)]
        team: String,
        /// The token's id (see `admin token list`).
        #[arg(long)]
        id: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum RemoteCredential {
    /// List the admin credentials.
    List,
    /// Revoke an admin credential.
    Revoke {
        /// The credential's id (see `admin credential list`).
        #[arg(long)]
        id: String,
    },
}

pub async fn run(ctx: &Context, command: AdminCommand, json: bool) -> anyhow::Result<()> {
    match command {
        AdminCommand::Bootstrap { label, force } => {
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
        AdminCommand::Login { url } => remote::login(&url).await,
        AdminCommand::Logout => remote::logout(),
        AdminCommand::Whoami => {
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
        AdminCommand::Team(command) => team(command, json).await,
        AdminCommand::Agent(command) => agent(command, json).await,
        AdminCommand::Person(command) => person(command, json).await,
        AdminCommand::Token(command) => token(command, json).await,
        AdminCommand::Grant { team, label } => {
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
        AdminCommand::Credential(command) => credential(command, json).await,
    }
}

async fn team(command: RemoteTeam, json: bool) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemoteTeam::Create(TeamCreateArgs { slug, name }) => {
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
        RemoteTeam::List => {
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

async fn agent(command: RemoteAgent, json: bool) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemoteAgent::Add(AgentArgs { team, name }) => {
            let path = format!("/admin/teams/{}/agents", segment(&team));
            let issued = remote
                .call(Method::POST, &path, Some(json!({ "name": name })))
                .await?;
            print_or(json, &issued, || print_issued_token(&issued))
        }
        RemoteAgent::List(TeamArgs { team }) => {
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
        RemoteAgent::Disable(AgentArgs { team, name }) => {
            set_disabled(&remote, &team, &name, true, json).await
        }
        RemoteAgent::Enable(AgentArgs { team, name }) => {
            set_disabled(&remote, &team, &name, false, json).await
        }
    }
}

async fn person(command: RemotePerson, json: bool) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemotePerson::Add(AgentArgs { team, name }) => {
            let path = format!("/admin/teams/{}/people", segment(&team));
            let issued = remote
                .call(Method::POST, &path, Some(json!({ "name": name })))
                .await?;
            print_or(json, &issued, || {
                println!(
                    "person `{}` added to team `{}`; they sign in at /dashboard with this \
                     credential (refused on /mcp)",
                    s(&issued["agent"]),
                    s(&issued["team"])
                );
                print_issued_token(&issued)
            })
        }
        RemotePerson::List(TeamArgs { team }) => {
            let path = format!("/admin/teams/{}/people", segment(&team));
            let people = remote.call(Method::GET, &path, None).await?;
            print_or(json, &people, || {
                output::table(
                    &["name", "revoked", "credentials", "last sign-in"],
                    rows(&people, |p| {
                        vec![
                            s(&p["name"]),
                            s(&p["disabled_at"]),
                            p["active_credentials"].to_string(),
                            s(&p["last_signed_in_at"]),
                        ]
                    }),
                )
            })
        }
        RemotePerson::Revoke(AgentArgs { team, name }) => {
            let path = format!(
                "/admin/teams/{}/people/{}/revoke",
                segment(&team),
                segment(&name)
            );
            let revoked = remote.call(Method::POST, &path, None).await?;
            print_or(json, &revoked, || {
                println!(
                    "person `{}` of team `{}` is revoked ({} credential(s) revoked now)",
                    s(&revoked["person"]["name"]),
                    s(&revoked["person"]["team"]),
                    revoked["credentials_revoked"]
                )
            })
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

async fn token(command: RemoteToken, json: bool) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemoteToken::Issue(TokenIssueArgs { team, agent, label }) => {
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
        RemoteToken::List(TeamArgs { team }) => {
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
        RemoteToken::Revoke { team, id } => {
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

async fn credential(command: RemoteCredential, json: bool) -> anyhow::Result<()> {
    let remote = Remote::load()?;
    match command {
        RemoteCredential::List => {
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
        RemoteCredential::Revoke { id } => {
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
    let answer = acs_agent::client::whoami(&format!("{}/mcp", remote.url), token, None).await;
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
