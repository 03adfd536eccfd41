//! Local operator commands: teams, agents, tokens, quickstart, mcp-config.
//! They run beside the database (DATABASE_URL or the embedded cluster).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;
use uuid::Uuid;

use super::Context;
use super::output::{self, opt_time, time};
use crate::backend::jetstream::{Broker, StreamSizes};
use crate::store::{Actor, agents, attachments, broker_conditions, teams, tokens};

#[derive(Subcommand, Debug)]
pub enum TeamCommand {
    /// Create a team.
    Create {
        /// Short name used everywhere: lower-case letters, digits and `-`.
        #[arg(long)]
        slug: String,
        /// Display name.
        #[arg(long)]
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List teams.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show the team's capabilities, or switch conversations on or off.
    Capability {
        #[arg(long)]
        team: String,
        /// Turn the conversation tools on or off for the team.
        #[arg(long, value_parser = ["on", "off"])]
        conversations: Option<String>,
        /// The backend NEW conversations are created on (existing ones stay).
        /// jetstream needs --nats-url and the team's streams there (`team stream`).
        #[arg(long, value_parser = ["jetstream", "postgres"])]
        backend: Option<String>,
        /// The NATS server holding the team's streams (checked for --backend jetstream).
        #[arg(long, env = "BUS_NATS_URL", hide_env_values = true)]
        nats_url: Option<String>,
        /// A NATS .creds file for that server.
        #[arg(long, env = "BUS_NATS_CREDENTIALS", hide_env_values = true)]
        nats_credentials: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Provision (or adopt) the team's JetStream streams and show them; or remove them.
    Stream {
        #[arg(long)]
        team: String,
        /// The NATS server (JetStream on, max_payload of at least 2MB).
        #[arg(long, env = "BUS_NATS_URL", hide_env_values = true)]
        nats_url: String,
        /// A NATS .creds file with rights to manage streams (provisioning
        /// credentials, separate from the ones `serve` runs with).
        #[arg(long, env = "BUS_NATS_CREDENTIALS", hide_env_values = true)]
        nats_credentials: Option<PathBuf>,
        /// Body stream size limit in bytes [default: 2 GiB].
        #[arg(long)]
        max_bytes: Option<i64>,
        /// Body stream message limit [default: 100000].
        #[arg(long)]
        max_messages: Option<i64>,
        /// How long an undelivered inbox reference is kept [default: 168].
        #[arg(long)]
        inbox_max_age_hours: Option<u64>,
        /// Inbox stream size limit in bytes; when full it drops its oldest references
        /// (PostgreSQL still holds what is owed) [default: 256 MiB].
        #[arg(long)]
        inbox_max_bytes: Option<i64>,
        /// Inbox stream reference limit [default: 1000000].
        #[arg(long)]
        inbox_max_messages: Option<i64>,
        /// Apply the size flags (or the defaults) to streams that already exist. Without it
        /// an existing stream is adopted as it is, and any size flag that differs from it is
        /// reported as ignored.
        #[arg(long)]
        update_quotas: bool,
        /// Delete both streams and their contents; refused while the team routes to jetstream.
        #[arg(long, conflicts_with_all = ["max_bytes", "max_messages", "inbox_max_age_hours", "inbox_max_bytes", "inbox_max_messages", "update_quotas"])]
        remove: bool,
        #[arg(long)]
        json: bool,
    },
    /// Show the team's attachment quota, or set it with --bytes (new uploads beyond it are refused).
    Quota {
        #[arg(long)]
        team: String,
        /// New limit in bytes (default for a new team: 1 GiB).
        #[arg(long)]
        bytes: Option<i64>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Add an agent to a team and print its first token (shown once).
    Add {
        #[arg(long)]
        team: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List the agents of a team.
    List {
        #[arg(long)]
        team: String,
        #[arg(long)]
        json: bool,
    },
    /// Disable an agent: every token it holds is refused at once.
    Disable {
        #[arg(long)]
        team: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Enable a disabled agent again.
    Enable {
        #[arg(long)]
        team: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Issue another token for an agent (shown once).
    Issue {
        #[arg(long)]
        team: String,
        #[arg(long)]
        agent: String,
        /// A note to tell tokens apart in listings (e.g. `laptop`).
        #[arg(long)]
        label: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List the tokens of a team (never the secrets).
    List {
        #[arg(long)]
        team: String,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id; it is refused from the next request on.
    Revoke {
        #[arg(long)]
        id: Uuid,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct QuickstartArgs {
    /// Team slug to create or reuse.
    #[arg(long, default_value = "my-team")]
    team: String,
    /// Agent name to create or reuse.
    #[arg(long, default_value = "my-agent")]
    agent: String,
    /// The MCP URL clients will use, for the printed config.
    #[arg(
        long,
        env = "BUS_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8787/mcp"
    )]
    url: String,
    #[arg(long)]
    json: bool,
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
    /// The agent token (acs_…).
    #[arg(long, env = "BUS_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Window label to send as X-Crew-Session.
    #[arg(long, env = "BUS_SESSION")]
    pub session: Option<String>,
}

pub async fn team(ctx: &Context, command: TeamCommand) -> anyhow::Result<()> {
    let actor = Actor::local_operator();
    match command {
        TeamCommand::Capability {
            team,
            conversations,
            backend,
            nats_url,
            nats_credentials,
            json,
        } => {
            let on = conversations.map(|v| v == "on");
            let broker = match (&backend, &nats_url) {
                (Some(b), Some(url)) if b == "jetstream" => {
                    Some(Broker::connect(url, nats_credentials.as_deref()).await?)
                }
                _ => None,
            };
            let caps = ctx
                .with_database(async |pool| {
                    // The backend first: it is the one that can be refused,
                    // and a refused command changes nothing.
                    if let Some(backend) = &backend {
                        teams::set_conversation_backend(
                            pool,
                            &team,
                            backend,
                            broker.as_ref(),
                            &actor,
                        )
                        .await?;
                    }
                    Ok(teams::capability(pool, &team, on, &actor).await?)
                })
                .await?;
            if json {
                return output::json(&caps);
            }
            println!(
                "team `{}`: conversations {}, new conversations on {}",
                caps.team,
                if caps.conversations { "on" } else { "off" },
                caps.conversation_backend
            );
        }
        TeamCommand::Stream {
            team,
            nats_url,
            nats_credentials,
            max_bytes,
            max_messages,
            inbox_max_age_hours,
            inbox_max_bytes,
            inbox_max_messages,
            update_quotas,
            remove,
            json,
        } => {
            let broker = Broker::connect(&nats_url, nats_credentials.as_deref()).await?;
            if remove {
                let removed = ctx
                    .with_database(async |pool| {
                        Ok(teams::remove_streams(pool, &team, &broker, &actor).await?)
                    })
                    .await?;
                if json {
                    return output::json(&json!({ "team": team, "removed": removed }));
                }
                if removed.is_empty() {
                    println!("team `{team}` had no streams on {nats_url}; nothing removed");
                } else {
                    println!("removed from {nats_url}: {}", removed.join(", "));
                }
                return Ok(());
            }
            let defaults = StreamSizes::default();
            let sizes = StreamSizes {
                max_bytes: max_bytes.unwrap_or(defaults.max_bytes),
                max_messages: max_messages.unwrap_or(defaults.max_messages),
                inbox_max_age: inbox_max_age_hours
                    .map(|h| std::time::Duration::from_secs(h.saturating_mul(3600)))
                    .unwrap_or(defaults.inbox_max_age),
                inbox_max_bytes: inbox_max_bytes.unwrap_or(defaults.inbox_max_bytes),
                inbox_max_messages: inbox_max_messages.unwrap_or(defaults.inbox_max_messages),
            };
            let size_flags_given = max_bytes.is_some()
                || max_messages.is_some()
                || inbox_max_age_hours.is_some()
                || inbox_max_bytes.is_some()
                || inbox_max_messages.is_some();
            let (streams, stale) = ctx
                .with_database(async |pool| {
                    let before = broker_conditions::locators_on_body_stream(pool, &team).await?;
                    let streams = teams::provision_streams(
                        pool,
                        &team,
                        &broker,
                        &sizes,
                        update_quotas,
                        &actor,
                    )
                    .await?;
                    let stale =
                        broker_conditions::stale_locators(pool, &broker, &streams, before).await?;
                    Ok((streams, stale))
                })
                .await?;
            if json {
                let mut value = serde_json::to_value(&streams)?;
                value["stale_locators"] = serde_json::to_value(&stale)?;
                return output::json(&value);
            }
            println!("team `{team}` on {nats_url}:");
            output::table(
                &[
                    "stream", "state", "subjects", "replicas", "messages", "bytes", "limits",
                ],
                [&streams.body, &streams.inbox]
                    .iter()
                    .map(|s| {
                        vec![
                            s.name.clone(),
                            s.state.to_owned(),
                            s.subjects.join(","),
                            s.replicas.to_string(),
                            s.messages.to_string(),
                            s.bytes.to_string(),
                            format!(
                                "{} retention, max {} bytes / {} msgs, max age {} s",
                                s.retention, s.max_bytes, s.max_messages, s.max_age_seconds
                            ),
                        ]
                    })
                    .collect(),
            );
            for stream in [&streams.body, &streams.inbox] {
                if stream.quotas_not_applied.is_empty() {
                    continue;
                }
                let differences = stream.quotas_not_applied.join("; ");
                if size_flags_given {
                    println!(
                        "ignored the size flags for {} (it exists; {differences}). Rerun with \
                         --update-quotas to apply them.",
                        stream.name
                    );
                } else {
                    println!(
                        "{} exists with limits other than the defaults ({differences}); kept. \
                         --update-quotas would set the defaults or the size flags given.",
                        stream.name
                    );
                }
            }
            if stale.messages > 0 {
                println!(
                    "{} message(s) name stream {} at a sequence it does not hold ({}): the \
                     stream no longer holds those bodies (restoring the broker's store brings \
                     them back).",
                    stale.messages, stale.stream, stale.reason
                );
            }
            println!(
                "next: ai-crew-sync team capability --team {team} --backend jetstream --nats-url {nats_url}"
            );
        }
        TeamCommand::Quota { team, bytes, json } => {
            let quota = ctx
                .with_database(async |pool| {
                    Ok(attachments::quota(pool, &team, bytes, &actor).await?)
                })
                .await?;
            if json {
                return output::json(&quota);
            }
            println!(
                "team `{}`: attachments use {} of {} bytes",
                quota.team, quota.attachment_bytes_used, quota.attachment_bytes_limit
            );
        }
        TeamCommand::Create { slug, name, json } => {
            let team = ctx
                .with_database(async |pool| Ok(teams::create(pool, &slug, &name, &actor).await?))
                .await?;
            if json {
                return output::json(&team);
            }
            println!("team `{}` created ({})", team.slug, team.id);
            println!(
                "next: ai-crew-sync agent add --team {} --name NAME",
                team.slug
            );
        }
        TeamCommand::List { json } => {
            let list = ctx
                .with_database(async |pool| Ok(teams::list(pool).await?))
                .await?;
            if json {
                return output::json(&list);
            }
            output::table(
                &["slug", "name", "agents", "created", "id"],
                list.iter()
                    .map(|t| {
                        vec![
                            t.slug.clone(),
                            t.name.clone(),
                            t.agents.to_string(),
                            time(&t.created_at),
                            t.id.to_string(),
                        ]
                    })
                    .collect(),
            );
        }
    }
    Ok(())
}

pub async fn agent(ctx: &Context, command: AgentCommand) -> anyhow::Result<()> {
    let actor = Actor::local_operator();
    match command {
        AgentCommand::Add { team, name, json } => {
            let issued = ctx
                .with_database(async |pool| Ok(agents::add(pool, &team, &name, &actor).await?))
                .await?;
            if json {
                return output::json(&issued);
            }
            println!("agent `{}` added to team `{}`", issued.agent, issued.team);
            print_token(&issued);
        }
        AgentCommand::List { team, json } => {
            let list = ctx
                .with_database(async |pool| Ok(agents::list(pool, &team).await?))
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
        AgentCommand::Disable { team, name, json } => {
            set_disabled(ctx, &actor, &team, &name, true, json).await?
        }
        AgentCommand::Enable { team, name, json } => {
            set_disabled(ctx, &actor, &team, &name, false, json).await?
        }
    }
    Ok(())
}

async fn set_disabled(
    ctx: &Context,
    actor: &Actor,
    team: &str,
    name: &str,
    disabled: bool,
    json: bool,
) -> anyhow::Result<()> {
    let state = ctx
        .with_database(async |pool| {
            Ok(agents::set_disabled(pool, team, name, disabled, actor).await?)
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

pub async fn token(ctx: &Context, command: TokenCommand) -> anyhow::Result<()> {
    let actor = Actor::local_operator();
    match command {
        TokenCommand::Issue {
            team,
            agent,
            label,
            json,
        } => {
            let issued = ctx
                .with_database(async |pool| {
                    Ok(tokens::issue(pool, &team, &agent, label.as_deref(), &actor).await?)
                })
                .await?;
            if json {
                return output::json(&issued);
            }
            print_token(&issued);
        }
        TokenCommand::List { team, json } => {
            let list = ctx
                .with_database(async |pool| Ok(tokens::list(pool, &team).await?))
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
        TokenCommand::Revoke { id, json } => {
            let revocation = ctx
                .with_database(async |pool| Ok(tokens::revoke(pool, id, None, &actor).await?))
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

pub async fn quickstart(ctx: &Context, args: QuickstartArgs) -> anyhow::Result<()> {
    let actor = Actor::local_operator();
    let result = ctx
        .with_database(async |pool| {
            Ok(agents::quickstart(pool, &args.team, &args.agent, &actor).await?)
        })
        .await?;
    let issued = &result.issued;
    if args.json {
        return output::json(&json!({
            "team": issued.team,
            "agent": issued.agent,
            "team_created": result.team_created,
            "agent_created": result.agent_created,
            "token": issued.token,
            "token_id": issued.id,
            "url": args.url,
            "mcp_config": mcp_config(&args.url, &issued.token, None),
        }));
    }
    let verb = |created: bool| if created { "created" } else { "reused" };
    println!(
        "team `{}` {}; agent `{}` {}.",
        issued.team,
        verb(result.team_created),
        issued.agent,
        verb(result.agent_created)
    );
    print_token(issued);
    println!();
    println!("Start the server (if it is not running):  ai-crew-sync serve");
    println!("Then add this to your MCP client config (e.g. .mcp.json for Claude Code):");
    println!();
    print_mcp_config(&args.url, &issued.token, None);
    Ok(())
}

fn print_token(issued: &tokens::IssuedToken) {
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
