//! `mcp proxy` (a stdio MCP server per host conversation) and `proxy-config`
//! (the block a host needs to start it). Thin: the proxy is `acs_agent::proxy`,
//! the blocks are `acs_agent::proxy::host_config`.

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand, ValueEnum};

use super::context::BusArgs;
use acs_agent::client::context::Requested;
use acs_agent::client::profiles::Profiles;
use acs_agent::proxy::{self, ProxyOptions, host_config};

#[derive(Subcommand, Debug)]
pub enum McpCommand {
    /// A stdio MCP server for one host conversation (Claude Code, Codex, Cursor): every bus
    /// tool, as this agent in a window of its own. Stdout is MCP only; logs go to stderr.
    Proxy(ProxyArgs),
}

#[derive(Args, Debug)]
pub struct ProxyArgs {
    #[command(flatten)]
    bus: BusArgs,
    /// The host conversation's id; the same id gives the same window after a restart
    /// [default: CLAUDE_CODE_SESSION_ID, else the id the first tool call names in its _meta
    /// (threadId, thread_id, sessionID, sessionId, session_id, conversationId,
    /// conversation_id, vscode.conversationId, openai/session), else a random id].
    #[arg(long)]
    host_session: Option<String>,
    /// This window's role label in heartbeats (e.g. reviewer) [default: the role .acs.toml
    /// names]; configure_session changes it.
    #[arg(long)]
    role: Option<String>,
    /// Lifetime of the window's session credential in seconds, 60..86400; renewed at half-life.
    #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(i64).range(60..=86_400))]
    session_ttl_seconds: i64,
    /// Seconds between fetches of the window's conversation inbox into the local spool
    /// (each reference is on disk before its delivery is confirmed).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    inbox_poll_secs: u64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Format {
    /// JSON (`.mcp.json` for Claude Code, or Cursor's with --host cursor).
    Json,
    /// TOML (Codex's config.toml).
    Toml,
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum Host {
    ClaudeCode,
    Cursor,
    Codex,
}

#[derive(Args, Debug)]
pub struct ProxyConfigArgs {
    /// Print one block in this format only (json: Claude Code unless --host cursor; toml: Codex).
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Print the block for this host only.
    #[arg(long, value_enum)]
    host: Option<Host>,
    /// The local profile the proxy uses (its name only; the token stays in your profiles
    /// file) [default: the one .acs.toml names, else the default profile].
    #[arg(long)]
    profile: Option<String>,
    /// The command the host runs.
    #[arg(long, default_value = "ai-crew-sync")]
    command: String,
}

pub async fn run(command: McpCommand) -> anyhow::Result<()> {
    match command {
        McpCommand::Proxy(args) => {
            let dir = std::env::current_dir().context("reading the current directory")?;
            proxy::run(ProxyOptions {
                bus: Requested {
                    url: args.bus.url,
                    token: args.bus.token,
                    profile: args.bus.profile,
                },
                host_session: args.host_session,
                role: args.role,
                session_ttl_seconds: args.session_ttl_seconds,
                inbox_poll: std::time::Duration::from_secs(args.inbox_poll_secs),
                dir,
            })
            .await
        }
    }
}

pub fn config(args: ProxyConfigArgs) -> anyhow::Result<()> {
    let host = match (args.format, args.host) {
        (Some(Format::Toml), None | Some(Host::Codex)) => Some(Host::Codex),
        (Some(Format::Toml), Some(other)) => {
            bail!("--format toml is Codex's config.toml; {other:?} reads JSON: use --format json")
        }
        (Some(Format::Json), Some(Host::Codex)) => {
            bail!("Codex reads TOML (config.toml): use --format toml, or --host claude-code|cursor")
        }
        (Some(Format::Json), None) => Some(Host::ClaudeCode),
        (_, host) => host,
    };
    if let Some(name) = &args.profile {
        // A block naming a profile this machine lacks fails at the host's
        // start; say so now (another machine may still have it).
        if let Err(err) = Profiles::load().and_then(|p| p.get(name).map(|_| ())) {
            eprintln!("warning: {err:#}");
        }
    }
    let profile = args.profile.as_deref();
    let json =
        |value: serde_json::Value| serde_json::to_string_pretty(&value).expect("JSON encodes");
    match host {
        Some(Host::ClaudeCode) => {
            println!("{}", json(host_config::claude_code(&args.command, profile)))
        }
        Some(Host::Cursor) => println!("{}", json(host_config::cursor(&args.command, profile))),
        Some(Host::Codex) => print!("{}", host_config::codex(&args.command, profile)),
        None => {
            println!("# Claude Code: .mcp.json at the project root (no credential in it)");
            println!("{}", json(host_config::claude_code(&args.command, profile)));
            println!(
                "\n# Codex: ~/.codex/config.toml (or .codex/config.toml in a trusted project)"
            );
            print!("{}", host_config::codex(&args.command, profile));
            println!("\n# Cursor: .cursor/mcp.json (or ~/.cursor/mcp.json)");
            println!("{}", json(host_config::cursor(&args.command, profile)));
        }
    }
    Ok(())
}
