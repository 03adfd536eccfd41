//! Local operator commands: teams, agents, tokens, quickstart, mcp-config.
//! They run beside the database (DATABASE_URL or the embedded cluster).
//!
//! `team …` is in [`team`], `webhook …` in [`webhook`], `quickstart` in [`quickstart`],
//! `person …` in [`person`];
//! agents, tokens and mcp-config are here.

pub mod person;
pub mod quickstart;
pub mod team;
pub mod webhook;

use clap::{Args, Subcommand};
use serde_json::json;
use uuid::Uuid;

use super::Context;
use super::args::{AgentArgs, TeamArgs, TokenIssueArgs};
use super::output::{self, opt_time, time};
use acs_store::store::identity::admin::Authority;
use acs_store::store::{identity::agents, identity::tokens};

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Add an agent to a team and print its first token (shown once).
    Add(AgentArgs),
    /// List the agents of a team.
    List(TeamArgs),
    /// Disable an agent: every token it holds is refused at once.
    Disable(AgentArgs),
    /// Enable a disabled agent again.
    Enable(AgentArgs),
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Issue another token for an agent (shown once).
    Issue(TokenIssueArgs),
    /// List the tokens of a team (never the secrets).
    List(TeamArgs),
    /// Revoke a token by id; it is refused from the next request on.
    Revoke {
        /// The token's id (see `token list`).
        #[arg(long)]
        id: Uuid,
    },
}

#[derive(Args, Debug)]
pub struct McpConfigArgs {
    /// The server's MCP endpoint.
    #[arg(
        long,
        env = "BUS_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8787/mcp"
    )]
    pub url: String,
    /// The agent token (acs_…): BUS_TOKEN or --token-file PATH; as a flag it is refused
    /// (other users see it in the process list).
    #[arg(long, env = "BUS_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Window label to send as X-Crew-Session.
    #[arg(long, env = "BUS_SESSION")]
    pub session: Option<String>,
}

pub async fn agent(ctx: &Context, command: AgentCommand, json: bool) -> anyhow::Result<()> {
    let authority = Authority::local();
    match command {
        AgentCommand::Add(AgentArgs { team, name }) => {
            let issued = ctx
                .with_database(async |pool| {
                    Ok(agents::add(pool, &authority.team(&team)?, &name).await?)
                })
                .await?;
            if json {
                return output::json(&issued);
            }
            println!("agent `{}` added to team `{}`", issued.agent, issued.team);
            print_token(&issued);
        }
        AgentCommand::List(TeamArgs { team }) => {
            let list = ctx
                .with_database(async |pool| Ok(agents::list(pool, &authority.team(&team)?).await?))
                .await?;
            if json {
                return output::json(&list);
            }
            output::table(
                &["name", "state", "active tokens", "created", "id"],
                list.iter()
                    .map(|a| {
                        let state = match &a.disabled_at {
                            Some(at) => format!("disabled {}", time(at)),
                            None => "enabled".into(),
                        };
                        vec![
                            a.name.clone(),
                            state,
                            a.active_tokens.to_string(),
                            time(&a.created_at),
                            a.id.to_string(),
                        ]
                    })
                    .collect(),
            );
        }
        AgentCommand::Disable(AgentArgs { team, name }) => {
            set_disabled(ctx, &authority, &team, &name, true, json).await?
        }
        AgentCommand::Enable(AgentArgs { team, name }) => {
            set_disabled(ctx, &authority, &team, &name, false, json).await?
        }
    }
    Ok(())
}

async fn set_disabled(
    ctx: &Context,
    authority: &Authority,
    team: &str,
    name: &str,
    disabled: bool,
    json: bool,
) -> anyhow::Result<()> {
    let state = ctx
        .with_database(async |pool| {
            Ok(agents::set_disabled(pool, &authority.team(team)?, name, disabled).await?)
        })
        .await?;
    if json {
        return output::json(&state);
    }
    let word = if disabled { "disabled" } else { "enabled" };
    if state.changed {
        println!(
            "agent `{}` of team `{}` is now {word}",
            state.agent.name, state.agent.team
        );
    } else {
        println!(
            "agent `{}` of team `{}` was already {word}; nothing changed",
            state.agent.name, state.agent.team
        );
    }
    Ok(())
}

pub async fn token(ctx: &Context, command: TokenCommand, json: bool) -> anyhow::Result<()> {
    let authority = Authority::local();
    match command {
        TokenCommand::Issue(TokenIssueArgs { team, agent, label }) => {
            let issued = ctx
                .with_database(async |pool| {
                    let team = authority.team(&team)?;
                    Ok(tokens::issue(pool, &team, &agent, label.as_deref()).await?)
                })
                .await?;
            if json {
                return output::json(&issued);
            }
            print_token(&issued);
        }
        TokenCommand::List(TeamArgs { team }) => {
            let list = ctx
                .with_database(async |pool| Ok(tokens::list(pool, &authority.team(&team)?).await?))
                .await?;
            if json {
                return output::json(&list);
            }
            output::table(
                &[
                    "id",
                    "agent",
                    "prefix",
                    "label",
                    "created",
                    "last used",
                    "revoked",
                ],
                list.iter()
                    .map(|t| {
                        vec![
                            t.id.to_string(),
                            t.agent.clone(),
                            format!("{}…", t.display_prefix),
                            t.label.clone().unwrap_or_else(|| "-".into()),
                            time(&t.created_at),
                            opt_time(&t.last_used_at),
                            opt_time(&t.revoked_at),
                        ]
                    })
                    .collect(),
            );
        }
        TokenCommand::Revoke { id } => {
            let revocation = ctx
                .with_database(async |pool| {
                    let global = authority.global("revoke tokens by id alone")?;
                    Ok(tokens::revoke(pool, id, &global).await?)
                })
                .await?;
            if json {
                return output::json(&revocation);
            }
            let t = &revocation.token;
            if revocation.revoked_now {
                println!(
                    "token {} ({}…) of agent `{}` in team `{}` revoked",
                    t.id, t.display_prefix, t.agent, t.team
                );
            } else {
                println!(
                    "token {} was already revoked at {}; nothing changed",
                    t.id,
                    opt_time(&t.revoked_at)
                );
            }
        }
    }
    Ok(())
}

pub(super) fn print_token(issued: &tokens::IssuedToken) {
    println!(
        "token for `{}` in team `{}` (id {}), shown once; store it now:",
        issued.agent, issued.team, issued.id
    );
    println!("  {}", issued.token);
}

/// The MCP client config block (the `mcpServers` shape Claude Code, Cursor and others read).
pub fn mcp_config(url: &str, token: &str, session: Option<&str>) -> serde_json::Value {
    let mut headers = json!({ "Authorization": format!("Bearer {token}") });
    if let Some(session) = session.filter(|s| !s.is_empty()) {
        headers["X-Crew-Session"] = json!(session);
    }
    json!({ "mcpServers": { "ai-crew-sync": { "type": "http", "url": url, "headers": headers } } })
}

pub fn print_mcp_config(url: &str, token: &str, session: Option<&str>) {
    let block = mcp_config(url, token, session);
    println!(
        "{}",
        serde_json::to_string_pretty(&block).expect("a JSON value serialises")
    );
}
