//! `ai-crew-sync context …`: the client's side of identity on this machine.
//! Profiles (a bus URL, team, agent and token kept in a private file), the
//! per-repository `.acs.toml` (profile, project, default channel), and
//! `show` / `verify`, which say what applies here and whether it works.
//!
//! Thin like every command: the files and the order of precedence live in
//! `acs_agent::client::{profiles, project, context}`.

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use serde_json::json;

use super::output;
use super::secret::read_secret;
use acs_agent::client::context::{self, Requested, Resolved};
use acs_agent::client::hook::{self as host_hook, HookEvent};
use acs_agent::client::local_files;
use acs_agent::client::profiles::{Profile, Profiles};
use acs_agent::client::project::{self, ProjectFile};

/// How a command that talks to a bus as an agent is told which one:
/// a profile, or a token and URL as before profiles existed.
#[derive(Args, Debug, Clone, Default)]
pub struct BusArgs {
    /// The server's MCP endpoint [default: the profile's, else http://127.0.0.1:8787/mcp].
    #[arg(long, env = "BUS_URL", hide_env_values = true, global = true)]
    pub url: Option<String>,
    /// Agent token (acs_…) or session credential (acss_…): a profile, BUS_TOKEN or
    /// --token-file PATH. As a flag it is refused (other users see it in the process list).
    #[arg(long, env = "BUS_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// The local profile to use (see `context profile add`) [default: the one .acs.toml
    /// names, else the default profile].
    #[arg(long, env = "BUS_PROFILE", global = true)]
    pub profile: Option<String>,
}

impl BusArgs {
    /// What applies in the current directory.
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        let here = std::env::current_dir().context("reading the current directory")?;
        context::resolve(
            Requested {
                url: self.url.clone(),
                token: self.token.clone(),
                profile: self.profile.clone(),
            },
            &here,
        )
    }
}

#[derive(Subcommand, Debug)]
pub enum ContextCommand {
    /// Say which profile, team, agent, project and channel apply here, and why (never a secret).
    Show {
        #[command(flatten)]
        bus: BusArgs,
    },
    /// Call whoami with what applies here, and check it is the team and agent expected.
    Verify {
        #[command(flatten)]
        bus: BusArgs,
    },
    /// Answer a host's hook: read its JSON on stdin, print what the host takes (Claude Code's
    /// format). Speaks as the `mcp proxy` window of that host conversation (stdin's
    /// session_id, else CLAUDE_CODE_SESSION_ID, must be the proxy's host conversation);
    /// without one it prints nothing. Never fails the host: any problem prints nothing and
    /// exits 0 within a few seconds (pre_tool_use: within 1.5 s, and it denies an edit whose
    /// input it cannot read or whose check the bus refused; see docs/agents.md). --explain says on stderr which window it found and why,
    /// or why none.
    Hook {
        /// Which hook of the host this is (what to answer: see docs/agents.md).
        #[arg(long, value_enum)]
        event: HookEvent,
        /// Also say on stderr which stdin fields were read, which window was found and why,
        /// or which windows this machine has and why none matched. Stdout stays the same.
        /// ACS_HOOK_DEBUG: any value but empty, 0, false, no or off turns it on (a value
        /// never fails the hook).
        #[arg(long, env = "ACS_HOOK_DEBUG", value_parser = clap::builder::FalseyValueParser::new())]
        explain: bool,
    },
    /// Local profiles: add, list, default, remove.
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// Write .acs.toml (at the top of this git work tree, else here): the profile, project
    /// and default channel for work in this directory tree. It holds no secret.
    SetProject {
        /// The profile this tree works with (each person keeps one of that name).
        #[arg(long)]
        profile: String,
        /// The project this tree is (heartbeats and session listings show it).
        #[arg(long)]
        project: Option<String>,
        /// The channel set for windows working here: their default channel (posts naming none
        /// go there), before the project's and the window label's. The proxy and the console
        /// tell the bus.
        #[arg(long)]
        channel: Option<String>,
        /// The role windows working here say they have (e.g. reviewer).
        #[arg(long)]
        role: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ProfileCommand {
    /// Add (or replace) a profile. The token is read from a prompt that does not echo, or
    /// from stdin when it is not a terminal; it is checked with the server (whoami: refused
    /// when the server does not know it or it is another agent's) and kept in profiles.toml
    /// (mode 0600).
    Add {
        /// The profile's name (`--profile NAME`, .acs.toml and `proxy-config` refer to it).
        #[arg(long)]
        name: String,
        /// The server's MCP endpoint, e.g. http://127.0.0.1:8787/mcp.
        #[arg(long)]
        url: String,
        /// The team (slug) the token belongs to; `context verify` checks it.
        #[arg(long)]
        team: String,
        /// The agent the token speaks for; `context verify` checks it.
        #[arg(long)]
        agent: String,
        /// Make it the default profile (the first profile always is).
        #[arg(long)]
        default: bool,
    },
    /// List the profiles (never their tokens).
    List,
    /// Make a profile the default.
    Default {
        /// The profile's name.
        name: String,
    },
    /// Remove a profile (its token is forgotten here, not revoked on the server).
    Remove {
        /// The profile's name.
        name: String,
    },
}

pub async fn run(command: ContextCommand, json: bool) -> anyhow::Result<()> {
    match command {
        ContextCommand::Show { bus } => show(&bus.resolve()?, json),
        ContextCommand::Verify { bus } => verify(&bus.resolve()?, json).await,
        ContextCommand::Hook { event, explain } => {
            hook(event, explain).await;
            // Exit here: a stdin read cut off by the deadline would hold the
            // runtime's shutdown until the host closed the pipe.
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
            std::process::exit(0)
        }
        ContextCommand::Profile(command) => profile(command, json).await,
        ContextCommand::SetProject {
            profile,
            project,
            channel,
            role,
        } => set_project(profile, project, channel, role),
    }
}

/// Run one hook within its deadline ([`HookEvent::deadline`]); whatever goes
/// wrong is one line on stderr, and the host carries on (an edit a
/// `pre_tool_use` could not check because the bus is down, silent or
/// refused the credential is allowed, the line saying which). With
/// `explain`, how the window was found (or why none was) follows on stderr.
async fn hook(event: HookEvent, explain: bool) {
    use tokio::io::AsyncReadExt as _;
    let mut trail = Vec::new();
    let max = event.input_max();
    let read = std::cell::Cell::new(false);
    let work = async {
        let mut input = Vec::new();
        tokio::io::stdin()
            .take(max + 1)
            .read_to_end(&mut input)
            .await
            .context("reading the hook input")?;
        read.set(true);
        if input.len() as u64 > max {
            return host_hook::input_too_large(event);
        }
        let dir = local_files::config_dir()?;
        let session = std::env::var("CLAUDE_CODE_SESSION_ID").ok();
        host_hook::answer(event, &input, &dir, session, &mut trail).await
    };
    let outcome = tokio::time::timeout(event.deadline(), work).await;
    match outcome {
        Ok(Ok(Some(out))) => println!("{out}"),
        Ok(Ok(None)) => {}
        Ok(Err(err)) if event == HookEvent::PreToolUse => eprintln!(
            "ai-crew-sync hook: {}; {}",
            output::clean(&format!("{err:#}")).replace('\n', " "),
            event.without_an_answer()
        ),
        Ok(Err(err)) => eprintln!("ai-crew-sync hook: {}", output::clean(&format!("{err:#}"))),
        Err(_) if read.get() => eprintln!(
            "ai-crew-sync hook: no answer within {} s (the bus is silent); {}",
            event.deadline().as_secs_f32(),
            event.without_an_answer()
        ),
        Err(_) => eprintln!(
            "ai-crew-sync hook: the host's input was not all read within {} s (stdin not \
             closed); {}",
            event.deadline().as_secs_f32(),
            event.without_an_answer()
        ),
    }
    if explain {
        for line in trail {
            eprintln!("ai-crew-sync hook --explain: {}", output::clean(&line));
        }
    }
}

fn show(resolved: &Resolved, json: bool) -> anyhow::Result<()> {
    if json {
        return output::json(resolved);
    }
    let line = |what: &str, setting: &Option<context::Setting>| match setting {
        Some(s) => println!("{what:<9}{}  ({})", s.value, s.from),
        None => println!("{what:<9}-"),
    };
    println!(
        "{:<9}{}  ({})",
        "url", resolved.url.value, resolved.url.from
    );
    line("profile", &resolved.profile);
    line("team", &resolved.team);
    line("agent", &resolved.agent);
    line("project", &resolved.project);
    line("channel", &resolved.channel);
    line("role", &resolved.role);
    match &resolved.credential {
        Some(from) => println!("{:<9}{from}", "token"),
        None => println!("{:<9}none: {}", "token", no_credential_hint()),
    }
    if let Some(path) = &resolved.project_file {
        println!("{:<9}{}", "file", path.display());
    }
    if let Some(path) = &resolved.profiles_file {
        println!("{:<9}{}", "profiles", path.display());
    }
    Ok(())
}

fn no_credential_hint() -> &'static str {
    "add one with `context profile add`, or set BUS_TOKEN"
}

async fn verify(resolved: &Resolved, json: bool) -> anyhow::Result<()> {
    let token = resolved.token()?;
    let me = acs_agent::client::whoami(&resolved.url.value, token, None)
        .await
        .with_context(|| format!("verifying against {}", resolved.url.value))?;
    let got_team = me["team"].as_str().unwrap_or_default();
    let got_agent = me["agent"].as_str().unwrap_or_default();
    // A profile that names another agent than its token speaks for would
    // file every heartbeat and claim under the wrong name in people's heads.
    for (what, expected, got) in [
        ("team", &resolved.team, got_team),
        ("agent", &resolved.agent, got_agent),
    ] {
        if let Some(expected) = expected
            && expected.value != got
        {
            bail!(
                "the token answers as {what} {got:?}, but {} says {:?}: fix the profile \
                 (`context profile add --name … ` again with the right --{what}) or its token",
                expected.from,
                expected.value
            );
        }
    }
    if json {
        return output::json(&json!({"ok": true, "url": resolved.url.value, "whoami": me}));
    }
    println!(
        "ok: {} answers as agent {got_agent} of team {got_team}",
        resolved.url.value
    );
    Ok(())
}

/// Ask the profile's server who its token is (`whoami`) before keeping it:
/// a token that server does not know, or that is another agent's, is refused
/// with what to do; nothing is written.
async fn check_with_server(profile: &Profile) -> anyhow::Result<()> {
    let me = match acs_agent::client::whoami(&profile.url, &profile.token, None).await {
        Ok(me) => me,
        Err(err) if err.is::<acs_agent::client::Unauthenticated>() => bail!(
            "{} does not know that token (401), so the profile was not added: the token may be \
             revoked or of another installation (a server on another data directory or \
             DATABASE_URL). Check --url names the server the token was minted for (its log says \
             `listening on …`), or mint one for this server with `ai-crew-sync quickstart` beside \
             its database.",
            profile.url
        ),
        Err(err) => {
            return Err(err.context(format!(
                "could not check the token with {}, so the profile was not added; start the \
                 server (or fix --url) and add it again",
                profile.url
            )));
        }
    };
    for (what, expected, got) in [
        (
            "team",
            &profile.team,
            me["team"].as_str().unwrap_or_default(),
        ),
        (
            "agent",
            &profile.agent,
            me["agent"].as_str().unwrap_or_default(),
        ),
    ] {
        if expected != got {
            bail!(
                "{} says the token is {what} {got:?}, not {expected:?}; the profile was not \
                 added. Add it with --{what} {got}, or use that {what}'s token.",
                profile.url
            );
        }
    }
    Ok(())
}

async fn profile(command: ProfileCommand, json: bool) -> anyhow::Result<()> {
    let mut profiles = Profiles::load()?;
    match command {
        ProfileCommand::Add {
            name,
            url,
            team,
            agent,
            default,
        } => {
            let token = read_secret(&format!("token for {agent} of {team} (acs_…): "))?;
            let replaced = profiles.profiles.contains_key(&name);
            let profile = Profile {
                url,
                team,
                agent,
                token,
            };
            Profiles::check(&name, &profile)?;
            check_with_server(&profile).await?;
            profiles.put(&name, profile, default)?;
            profiles.save()?;
            let verb = if replaced { "replaced" } else { "added" };
            let is_default = profiles.default.as_deref() == Some(name.as_str());
            println!(
                "{verb} profile {name}{} in {}; check it with `ai-crew-sync context verify \
                 --profile {name}`",
                if is_default { " (the default)" } else { "" },
                profiles.file().display()
            );
        }
        ProfileCommand::List => {
            let rows: Vec<_> = profiles
                .profiles
                .iter()
                .map(|(name, p)| {
                    json!({
                        "name": name, "url": p.url, "team": p.team, "agent": p.agent,
                        "default": profiles.default.as_deref() == Some(name.as_str()),
                    })
                })
                .collect();
            if json {
                return output::json(&rows);
            }
            if rows.is_empty() {
                println!("no profiles yet: add one with `ai-crew-sync context profile add`");
                return Ok(());
            }
            let table = profiles
                .profiles
                .iter()
                .map(|(name, p)| {
                    let mark = if profiles.default.as_deref() == Some(name.as_str()) {
                        "*"
                    } else {
                        ""
                    };
                    vec![
                        format!("{name}{mark}"),
                        p.team.clone(),
                        p.agent.clone(),
                        p.url.clone(),
                    ]
                })
                .collect();
            output::table(&["PROFILE", "TEAM", "AGENT", "URL"], table);
        }
        ProfileCommand::Default { name } => {
            profiles.set_default(&name)?;
            profiles.save()?;
            println!("{name} is the default profile");
        }
        ProfileCommand::Remove { name } => {
            profiles.remove(&name)?;
            profiles.save()?;
            println!(
                "removed profile {name} (its token is forgotten here, not revoked: an operator \
                 revokes it with `token revoke`)"
            );
        }
    }
    Ok(())
}

fn set_project(
    profile: String,
    project: Option<String>,
    channel: Option<String>,
    role: Option<String>,
) -> anyhow::Result<()> {
    // A name only this machine lacks would break every command here at once.
    Profiles::load()?.get(&profile)?;
    let here = std::env::current_dir().context("reading the current directory")?;
    let path = project::home_for(&here);
    // Keep what the file says and was not given again.
    let mut file = match project::find(&here)? {
        Some((found, file)) if found == path => file,
        _ => ProjectFile::default(),
    };
    file.profile = Some(profile);
    if project.is_some() {
        file.project = project;
    }
    if channel.is_some() {
        file.channel = channel;
    }
    if role.is_some() {
        file.role = role;
    }
    project::write(&path, &file)?;
    println!("wrote {}", path.display());
    Ok(())
}
