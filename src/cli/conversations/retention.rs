//! `conversations retention`: set (or clear) how long one conversation keeps
//! its messages; the logic is `store::operations::retention::set_retention`.

use clap::Args;
use uuid::Uuid;

use crate::cli::Context;
use crate::cli::output;
use acs_store::store::identity::admin::Authority;
use acs_store::store::operations::retention;

#[derive(Args, Debug)]
pub struct RetentionArgs {
    /// The team's slug.
    #[arg(long)]
    team: String,
    /// The conversation's id.
    #[arg(long)]
    conversation: Uuid,
    /// Keep messages this many days (1 to 36500).
    #[arg(long, conflicts_with = "forever", required_unless_present = "forever")]
    days: Option<i64>,
    /// Keep its messages for ever (clears the retention).
    #[arg(long)]
    forever: bool,
}

pub(super) async fn run(ctx: &Context, args: RetentionArgs, json: bool) -> anyhow::Result<()> {
    let RetentionArgs {
        team,
        conversation,
        days,
        forever: _,
    } = args;
    let scope = Authority::local().team(&team)?;
    let set = ctx
        .with_database(async |pool| {
            Ok(retention::set_retention(pool, &scope, conversation, days).await?)
        })
        .await?;
    if json {
        return output::json(&set);
    }
    match set.retention_days {
        Some(days) => println!(
            "conversation {} of team `{}` keeps its messages {days} day(s); `team prune --apply` \
             releases older ones once acknowledged",
            set.conversation_id, set.team
        ),
        None => println!(
            "conversation {} of team `{}` keeps its messages for ever",
            set.conversation_id, set.team
        ),
    }
    Ok(())
}
