//! `conversations …`: the operator's view of where conversation bodies live
//! and what is still in flight. Runs beside the database.

use clap::Subcommand;

use super::Context;
use super::output;
use crate::store::outbox;

#[derive(Subcommand, Debug)]
pub enum ConversationsCommand {
    /// The team's routing, its outbox (pending, leased, failed, uncertain, oldest, bytes) and
    /// every conversation off the plain synchronous path or with anything outstanding.
    Status {
        #[arg(long)]
        team: String,
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(ctx: &Context, command: ConversationsCommand) -> anyhow::Result<()> {
    match command {
        ConversationsCommand::Status { team, json } => {
            let report = ctx
                .with_database(async |pool| Ok(outbox::team_report(pool, &team).await?))
                .await?;
            if json {
                return output::json(&report);
            }
            let o = &report.outbox;
            println!(
                "team `{}`: new conversations on {}",
                report.team, report.conversation_backend
            );
            println!(
                "outbox: {} pending, {} leased, {} failed, {} uncertain, {} bytes waiting, oldest {}",
                o.pending,
                o.leased,
                o.failed,
                o.uncertain,
                o.pending_bytes,
                o.oldest_pending_seconds
                    .map_or("-".to_string(), |s| format!("{s} s"))
            );
            if report.conversations.is_empty() {
                println!("every conversation is synchronous on postgres with nothing outstanding");
            }
            for c in &report.conversations {
                let paused = c
                    .paused_seconds
                    .map_or(String::new(), |s| format!(", writes paused {s} s"));
                println!(
                    "{}  {:<9} {:<6} {} pending, {} failed, {} uncertain{}  {}",
                    c.conversation_id,
                    c.backend,
                    c.publication,
                    c.pending,
                    c.failed,
                    c.uncertain,
                    paused,
                    c.title
                );
            }
        }
    }
    Ok(())
}
