//! Flags declared once: those of a local operator command and its remote
//! `admin` twin (`team create` and `admin team create`, `agent add` and
//! `admin agent add`, `token issue` and `admin token issue`, …), so the two
//! take the same flags, and the NATS server every command that reaches
//! JetStream names ([`NatsArgs`]). Where the twins' flags differ (`token
//! revoke`: by id alone locally, by team and id over `/admin`) each keeps its
//! own.
//!
//! The structs carry no doc comment on purpose: clap would take one as the
//! command's description where the variant has none.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use acs_store::BusResult;
use acs_store::backend::jetstream::Broker;

// A new team (`team create`).
#[derive(Args, Debug)]
pub struct TeamCreateArgs {
    /// Short name used everywhere: lower-case letters, digits and `-`.
    #[arg(long)]
    pub slug: String,
    /// Display name.
    #[arg(long)]
    pub name: String,
}

// One agent or person of a team (`agent add|disable|enable`, `person add|revoke`).
#[derive(Args, Debug)]
pub struct AgentArgs {
    /// The team's slug.
    #[arg(long)]
    pub team: String,
    /// The name: lower-case letters and digits, then also `.`, `_` and `-`; at most 64.
    #[arg(long)]
    pub name: String,
}

// A team's agents or tokens (`agent list`, `token list`).
#[derive(Args, Debug)]
pub struct TeamArgs {
    /// The team's slug.
    #[arg(long)]
    pub team: String,
}

// Another token for an agent (`token issue`).
#[derive(Args, Debug)]
pub struct TokenIssueArgs {
    /// The team's slug.
    #[arg(long)]
    pub team: String,
    /// The agent the token speaks for.
    #[arg(long)]
    pub agent: String,
    /// A note to tell tokens apart in listings (e.g. `laptop`).
    #[arg(long)]
    pub label: Option<String>,
}

// The NATS server holding the teams' JetStream streams, and its credentials:
// `serve`, `doctor`, `team capability|stream|prune`, `conversations
// status|retry|declare-lost|migrate`. What a command does with the server is
// in that command's help. A command that cannot work without the server says
// so with `#[command(mut_arg("nats_url", |a| a.required(true)))]`; `serve`
// and `doctor` refuse credentials without a server
// (`mut_arg("nats_credentials", |a| a.requires("nats_url"))`).
#[derive(Args, Debug, Clone)]
pub struct NatsArgs {
    /// The NATS server with JetStream that holds the conversation bodies of teams routed to
    /// `jetstream`; for a cluster, several of its servers comma-separated
    /// (nats://a:4222,nats://b:4222), of which any that answers is used. A URL with a user,
    /// password or token goes in BUS_NATS_URL or --nats-url-file PATH (as a flag it is
    /// refused), or use --nats-credentials.
    #[arg(long, env = "BUS_NATS_URL", hide_env_values = true)]
    pub nats_url: Option<String>,
    /// NATS credentials file (.creds) for --nats-url.
    #[arg(long, env = "BUS_NATS_CREDENTIALS", hide_env_values = true)]
    pub nats_credentials: Option<PathBuf>,
}

impl NatsArgs {
    /// The server named, where the command requires it (clap refuses the
    /// command without it, so the error here only guards a slip).
    pub fn required_url(&self) -> anyhow::Result<&str> {
        self.nats_url
            .as_deref()
            .context("--nats-url (or BUS_NATS_URL) is required")
    }

    /// Connect to the server named; `None` when none is.
    pub async fn connect(&self) -> Option<BusResult<Broker>> {
        let url = self.nats_url.as_deref()?;
        Some(Broker::connect(url, self.nats_credentials.as_deref()).await)
    }

    /// Connect to the server the command requires.
    pub async fn connect_required(&self) -> anyhow::Result<Broker> {
        let url = self.required_url()?;
        Ok(Broker::connect(url, self.nats_credentials.as_deref()).await?)
    }
}
