//! `person add|list|revoke`: people of a team, who sign in to the dashboard
//! (never /mcp) and write from it. They run beside the database, like
//! `agent …`.

use clap::Subcommand;

use super::super::Context;
use super::super::args::{AgentArgs, TeamArgs};
use super::super::output::{self, opt_time, time};
use acs_store::store::identity::admin::Authority;
use acs_store::store::identity::people;

#[derive(Subcommand, Debug)]
pub enum PersonCommand {
    /// Make someone a person of a team and print their dashboard sign-in credential (shown
    /// once). A person signs in to /dashboard, posts, answers questions and manages tasks
    /// there; the credential is refused on /mcp.
    Add(AgentArgs),
    /// List the people of a team (never a credential).
    List(TeamArgs),
    /// Revoke a person: every credential of theirs, and each of their dashboard sign-ins ends
    /// at its next request.
    Revoke(AgentArgs),
}

pub async fn run(ctx: &Context, command: PersonCommand, json: bool) -> anyhow::Result<()> {
    let authority = Authority::local();
    match command {
        PersonCommand::Add(AgentArgs { team, name }) => {
            let issued = ctx
                .with_database(async |pool| {
                    Ok(people::add(pool, &authority.team(&team)?, &name).await?)
                })
                .await?;
            if json {
                return output::json(&issued);
            }
            println!(
                "person `{}` added to team `{}`; they sign in at /dashboard on the server with \
                 this credential (refused on /mcp)",
                issued.agent, issued.team
            );
            super::print_token(&issued);
        }
        PersonCommand::List(TeamArgs { team }) => {
            let list = ctx
                .with_database(async |pool| Ok(people::list(pool, &authority.team(&team)?).await?))
                .await?;
            if json {
                return output::json(&list);
            }
            output::table(
                &["name", "state", "credentials", "last sign-in", "created"],
                list.iter()
                    .map(|p| {
                        let state = match &p.disabled_at {
                            Some(at) => format!("revoked {}", time(at)),
                            None => "active".into(),
                        };
                        vec![
                            p.name.clone(),
                            state,
                            p.active_credentials.to_string(),
                            opt_time(&p.last_signed_in_at),
                            time(&p.created_at),
                        ]
                    })
                    .collect(),
            );
        }
        PersonCommand::Revoke(AgentArgs { team, name }) => {
            let revoked = ctx
                .with_database(async |pool| {
                    Ok(people::revoke(pool, &authority.team(&team)?, &name).await?)
                })
                .await?;
            if json {
                return output::json(&revoked);
            }
            println!(
                "person `{}` of team `{}` is revoked ({} credential(s) revoked now); their \
                 dashboard sign-ins end at their next request",
                revoked.person.name, revoked.person.team, revoked.credentials_revoked
            );
        }
    }
    Ok(())
}
