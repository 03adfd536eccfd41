//! `guard install`, `guard uninstall` and `guard check`: the git pre-commit
//! hook that refuses a commit touching paths another window holds
//! exclusively. Thin: the hook file and the check are
//! `acs_agent::client::guard`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::context::BusArgs;
use super::output;
use acs_agent::client::context::Requested;
use acs_agent::client::guard::{self, Outcome, install};
use acs_agent::client::local_files;

#[derive(Subcommand, Debug)]
pub enum GuardCommand {
    /// Write the repository's pre-commit hook (where git runs it: `core.hooksPath` and linked
    /// worktrees respected) so each commit runs `guard check`. A shell-script pre-commit
    /// already there gets the guard's lines after its `#!` line and keeps its name; any other
    /// hook is kept beside it and runs first; installing twice changes nothing. Refused under
    /// husky 9 (`.husky/_`): add `ai-crew-sync guard check` to .husky/pre-commit instead.
    Install(RepoArgs),
    /// Take the guard out of the pre-commit hook: its lines out of a shell script (the file
    /// is back byte for byte), or the hook it kept put back.
    Uninstall(RepoArgs),
    /// What the hook runs: send the staged paths to the bus's check_paths and exit 1, naming
    /// each path, its holder, the reservation, its reason and expiry, when another window
    /// holds one exclusively. As this Claude Code conversation's window when its `mcp proxy`
    /// recorded one (CLAUDE_CODE_SESSION_ID), else as the agent's shared window of the
    /// profile that applies (`context show`). ACS_GUARD=off skips it; no credential or a bus
    /// that does not answer within a few seconds lets the commit through with one line on
    /// stderr.
    Check(CheckArgs),
}

#[derive(Args, Debug)]
pub struct RepoArgs {
    /// A directory inside the git work tree [default: the current directory].
    #[arg(long, value_name = "DIR")]
    repo: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    repo: RepoArgs,
    #[command(flatten)]
    bus: BusArgs,
}

fn repo_dir(args: &RepoArgs) -> anyhow::Result<PathBuf> {
    match &args.repo {
        Some(dir) => Ok(dir.clone()),
        None => std::env::current_dir().context("reading the current directory"),
    }
}

pub async fn run(command: GuardCommand) -> anyhow::Result<()> {
    match command {
        GuardCommand::Install(args) => {
            let exe = std::env::current_exe().context("finding this binary's path")?;
            println!("{}", install::install(&repo_dir(&args)?, &exe)?);
            Ok(())
        }
        GuardCommand::Uninstall(args) => {
            println!("{}", install::uninstall(&repo_dir(&args)?)?);
            Ok(())
        }
        GuardCommand::Check(args) => {
            let code = check(args).await;
            std::process::exit(code)
        }
    }
}

/// Run the check; the exit status git reads (1 refuses the commit).
async fn check(args: CheckArgs) -> i32 {
    let switch = std::env::var("ACS_GUARD").ok();
    if guard::bypassed(switch.as_deref()) {
        eprintln!(
            "ai-crew-sync guard: ACS_GUARD={}, this commit was not checked against path \
             reservations",
            output::clean(switch.as_deref().unwrap_or_default().trim())
        );
        return 0;
    }
    let outcome = match (repo_dir(&args.repo), local_files::config_dir()) {
        (Ok(repo), Ok(config)) => {
            let requested = Requested {
                url: args.bus.url,
                token: args.bus.token,
                profile: args.bus.profile,
            };
            let host = std::env::var("CLAUDE_CODE_SESSION_ID").ok();
            guard::check(&repo, requested, &config, host).await
        }
        (Err(err), _) | (_, Err(err)) => Outcome::Unchecked(format!("{err:#}")),
    };
    match outcome {
        Outcome::Clear => 0,
        Outcome::Refused(text) => {
            // The holders' reasons are other agents' words.
            eprintln!("{}", output::clean(&text));
            1
        }
        Outcome::Unchecked(why) => {
            eprintln!(
                "ai-crew-sync guard: this commit was not checked against path reservations: {}",
                output::clean(&why).replace('\n', " ")
            );
            0
        }
    }
}
