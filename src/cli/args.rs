//! Flags declared once for a local operator command and its remote `admin`
//! twin (`agent add` and `admin agent add`, `token list` and `admin token
//! list`, …), so the two take the same flags. Only what both declare alike
//! lives here: where a twin's flags or help differ (`team create`, `token
//! issue`, `token revoke`) each keeps its own.
//!
//! The structs carry no doc comment on purpose: clap would take one as the
//! command's description where the variant has none.

use clap::Args;

// One agent of a team (`agent add|disable|enable`).
#[derive(Args, Debug)]
pub struct AgentArgs {
    #[arg(long)]
    pub team: String,
    #[arg(long)]
    pub name: String,
    #[arg(long)]
    pub json: bool,
}

// A team's agents or tokens (`agent list`, `token list`).
#[derive(Args, Debug)]
pub struct TeamArgs {
    #[arg(long)]
    pub team: String,
    #[arg(long)]
    pub json: bool,
}
