//! `ai-crew-sync quickstart`: from nothing to an agent this machine can
//! speak as, in one command. Beside the database (as every local operator
//! command), it makes sure the team and the agent exist, mints a token, and
//! keeps it in a local profile (`profiles.toml`, the store `context profile
//! add` writes) pointing at the server that runs on this database (where the
//! last `serve` recorded it listens, [`super::super::reach`]). The token is
//! not printed unless asked (`--show-token`), and goes into no host config:
//! the next steps are `proxy-config` (a block with no credential) and
//! `context verify`.
//!
//! Run again, it says what exists and changes nothing, unless asked for a new
//! token (`--new-token`); a profile whose token this database does not know
//! is refused rather than silently replaced.

use anyhow::bail;
use clap::Args;
use serde_json::json;

use super::super::{Context, output, reach};
use acs_agent::client::profiles::{Profile, Profiles};
use acs_store::store::identity::{agents, tokens};
use acs_store::store::{Actor, normalize_agent_name, normalize_team_slug};

/// Where a profile points when no server ever recorded its address here.
const DEFAULT_MCP_URL: &str = "http://127.0.0.1:8787/mcp";

#[derive(Args, Debug)]
pub struct QuickstartArgs {
    /// Team slug to create or reuse.
    #[arg(long, default_value = "my-team")]
    team: String,
    /// Agent name to create or reuse.
    #[arg(long, default_value = "my-agent")]
    agent: String,
    /// The local profile that keeps the agent's token (profiles.toml, as `context profile add`)
    /// [default: the agent's name].
    #[arg(long)]
    profile: Option<String>,
    /// The server's MCP endpoint the profile points at [default: where the `serve` running on
    /// this database listens (it records its address), else http://127.0.0.1:8787/mcp].
    #[arg(long, env = "BUS_URL", hide_env_values = true)]
    url: Option<String>,
    /// Mint a new token and put it in the profile, although the profile holds a live one (the
    /// old one stays valid until `token revoke`). Without it a re-run changes nothing.
    #[arg(long)]
    new_token: bool,
    /// Also print the token (by default it goes only into the profile, never on screen).
    #[arg(long)]
    show_token: bool,
}

/// What the database said, and what was done there.
struct Outcome {
    ensured: agents::Ensured,
    /// The address the last `serve` on this database recorded.
    recorded: Option<String>,
}

/// How the profile was left.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ProfileChange {
    Written,
    Replaced,
    UrlUpdated,
    Unchanged,
}

pub async fn run(ctx: &Context, args: QuickstartArgs, json: bool) -> anyhow::Result<()> {
    let name = args.profile.clone().unwrap_or_else(|| args.agent.clone());
    Profiles::check_name(&name)?;
    let team = normalize_team_slug(&args.team)?;
    let agent = normalize_agent_name(&args.agent)?;
    // Loaded first: a config directory others may write in is refused before
    // anything is created.
    let mut profiles = Profiles::load()?;
    let existing = profiles.profiles.get(&name).cloned();
    if let Some(p) = &existing
        && (p.team != team || p.agent != agent)
    {
        bail!(
            "profile {name:?} already speaks as agent {:?} of team {:?} (in {}); nothing changed. \
             Give this one another name with --profile NAME, or remove that profile first \
             (`ai-crew-sync context profile remove {name}`).",
            p.agent,
            p.team,
            profiles.file().display()
        );
    }
    let outcome = ctx
        .with_database(async |pool| {
            if let Some(p) = &existing
                && !args.new_token
                && !tokens::is_live_for(pool, &p.token, &team, &agent).await?
            {
                bail!(
                    "profile {name:?} holds a token this database does not know as a live token \
                     of agent {agent:?} of team {team:?} (revoked, or from another installation: \
                     another data directory or DATABASE_URL); nothing changed. Run quickstart \
                     against the database of the server the profile points at ({}), or add \
                     --new-token to mint a token here and replace the profile's.",
                    p.url
                );
            }
            let mint = existing.is_none() || args.new_token;
            let ensured =
                agents::ensure(pool, &team, &agent, &Actor::local_operator(), mint).await?;
            let recorded = reach::recorded_mcp_url(pool).await?;
            Ok(Outcome { ensured, recorded })
        })
        .await?;
    let (url, url_from) = match (&args.url, &outcome.recorded) {
        (Some(url), _) => (url.clone(), "--url"),
        (None, Some(recorded)) => (recorded.clone(), "recorded by the server on this database"),
        (None, None) => match &existing {
            Some(p) => (p.url.clone(), "the profile's"),
            None => (DEFAULT_MCP_URL.to_owned(), "the default"),
        },
    };
    let change = keep_profile(&mut profiles, &name, &url, &outcome, existing.as_ref())?;
    let mut answer = reach::answers(&url).await;
    if answer.is_ok() {
        answer = knows_the_token(&profiles, &name, &url).await;
    }
    if json {
        let issued = outcome.ensured.issued.as_ref();
        let mut value = json!({
            "team": outcome.ensured.team,
            "agent": outcome.ensured.agent,
            "team_created": outcome.ensured.team_created,
            "agent_created": outcome.ensured.agent_created,
            "profile": name,
            "profiles_file": profiles.file(),
            "url": url,
            "url_from": url_from,
            "server_answers": answer.is_ok(),
            "token_minted": issued.is_some(),
            "token_id": issued.map(|t| t.id),
        });
        if args.show_token {
            value["token"] = json!(issued.map(|t| &t.token));
        }
        return output::json(&value);
    }
    report(
        &name,
        &profiles,
        &outcome,
        change,
        (&url, url_from),
        &answer,
    );
    if args.show_token
        && let Some(issued) = &outcome.ensured.issued
    {
        super::print_token(issued);
    }
    Ok(())
}

/// Write the minted token into the profile, or point an unchanged one at
/// the server named now.
fn keep_profile(
    profiles: &mut Profiles,
    name: &str,
    url: &str,
    outcome: &Outcome,
    existing: Option<&Profile>,
) -> anyhow::Result<ProfileChange> {
    let ensured = &outcome.ensured;
    let token = match (&ensured.issued, existing) {
        (Some(issued), _) => issued.token.clone(),
        (None, Some(p)) if p.url == url => return Ok(ProfileChange::Unchanged),
        (None, Some(p)) => p.token.clone(),
        (None, None) => unreachable!("a token is minted when there is no profile"),
    };
    let change = match (&ensured.issued, existing) {
        (Some(_), None) => ProfileChange::Written,
        (Some(_), Some(_)) => ProfileChange::Replaced,
        (None, _) => ProfileChange::UrlUpdated,
    };
    let profile = Profile {
        url: url.to_owned(),
        team: ensured.team.clone(),
        agent: ensured.agent.clone(),
        token,
    };
    profiles.put(name, profile, false)?;
    profiles.save()?;
    Ok(change)
}

/// A server that answers but does not know the profile's token runs on
/// another database: the second installation the issue is about, said now
/// rather than at the first 401.
async fn knows_the_token(profiles: &Profiles, name: &str, url: &str) -> Result<(), String> {
    let Some(profile) = profiles.profiles.get(name) else {
        return Ok(());
    };
    match acs_agent::client::whoami(url, &profile.token, None).await {
        Err(err) if err.is::<acs_agent::client::Unauthenticated>() => Err(
            "it answers, but does not know this token (401): that server runs on another \
             database than this command used (its log's first `database:` line names it); run \
             quickstart with that server's --data-dir or DATABASE_URL"
                .to_owned(),
        ),
        _ => Ok(()),
    }
}

fn report(
    name: &str,
    profiles: &Profiles,
    outcome: &Outcome,
    change: ProfileChange,
    (url, url_from): (&str, &str),
    answer: &Result<(), String>,
) {
    let ensured = &outcome.ensured;
    let verb = |created: bool| if created { "created" } else { "exists" };
    println!(
        "team `{}` {}; agent `{}` {}.",
        ensured.team,
        verb(ensured.team_created),
        ensured.agent,
        verb(ensured.agent_created)
    );
    let file = profiles.file().display();
    match (change, &ensured.issued) {
        (ProfileChange::Unchanged, _) => println!(
            "profile `{name}` exists in {file} with a live token of this agent; no token \
             minted (--new-token mints one and replaces it)."
        ),
        (ProfileChange::UrlUpdated, _) => println!(
            "profile `{name}` exists in {file} with a live token of this agent; no token \
             minted; its URL is now {url}."
        ),
        (_, Some(issued)) => println!(
            "minted token {} ({}…) and {} profile `{name}` in {file} (mode 0600); the token is \
             not shown (--show-token prints it) and belongs in no host config.",
            issued.id,
            issued.display_prefix,
            if change == ProfileChange::Replaced {
                "replaced it in"
            } else {
                "kept it in"
            }
        ),
        (_, None) => {}
    }
    println!("server: {url} ({url_from})");
    match answer {
        Ok(()) => println!("  it answers."),
        Err(why) => println!(
            "  {why}.\n  Start it with `ai-crew-sync serve` on this database{}, or point the \
             profile elsewhere with `quickstart --url URL`.",
            if outcome.recorded.is_none() {
                " (no server has run on it yet)"
            } else {
                ""
            }
        ),
    }
    let profile_flag = if profiles.default.as_deref() == Some(name) {
        String::new()
    } else {
        format!(" --profile {name}")
    };
    println!();
    println!("Next:");
    println!(
        "  ai-crew-sync proxy-config{profile_flag}     # the block for Claude Code, Codex, Cursor \
         (runs `mcp proxy`; no credential in it)"
    );
    println!("  ai-crew-sync context verify{profile_flag}   # asks the server who this token is");
}
