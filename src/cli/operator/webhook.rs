//! `webhook add|list|pause|resume|remove`: a team's outgoing webhooks, beside
//! the database. Thin: parse, call one function of `store::operations::webhooks`, print. The
//! checks (URL, addresses, events, channels) and the audit row are there, so
//! `/admin/teams/{team}/webhooks` behaves the same.

use clap::{Args, Subcommand};
use uuid::Uuid;

use crate::cli::Context;
use crate::cli::args::TeamArgs;
use crate::cli::output::{self, time};
use acs_store::store::identity::admin::Authority;
use acs_store::store::operations::webhooks::{
    self, NewWebhook, PrivateTargets, WebhookKind, WebhookSummary,
};

#[derive(Subcommand, Debug)]
pub enum WebhookCommand {
    /// Add a webhook to a team and print its signing secret (shown once).
    Add(AddArgs),
    /// List a team's webhooks (active or paused) with delivery counts by state and the last
    /// errors of failed ones.
    List(TeamArgs),
    /// Pause a webhook by id: events are not queued for it while it is paused, and the
    /// deliveries queued before wait for `webhook resume`.
    Pause {
        /// The webhook's id (see `webhook list`).
        #[arg(long)]
        id: Uuid,
    },
    /// Resume a paused webhook: the deliveries queued before the pause go out, oldest
    /// first, and new events are queued again.
    Resume {
        /// The webhook's id (see `webhook list`).
        #[arg(long)]
        id: Uuid,
    },
    /// Remove a webhook by id; its pending deliveries are dropped.
    Remove {
        /// The webhook's id (see `webhook list`).
        #[arg(long)]
        id: Uuid,
    },
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// The team's slug.
    #[arg(long)]
    team: String,
    /// Where to POST: an http or https URL (no user:password in it).
    #[arg(long)]
    url: String,
    /// generic: signed JSON envelope; slack / discord: a short text for an incoming webhook.
    #[arg(long, value_parser = WebhookKind::ALL.map(WebhookKind::as_str), default_value = "generic")]
    kind: String,
    /// Event families, comma-separated: message, announcement, task, lock, note,
    /// conversation [default: all]. Never direct messages or conversation bodies.
    #[arg(long, value_delimiter = ',')]
    events: Vec<String>,
    /// Only messages and announcements of this channel (name or id); repeat for several
    /// [default: every channel].
    #[arg(long = "channel")]
    channels: Vec<String>,
    /// Allow a private, loopback, link-local or other non-public address (a receiver on
    /// this network). Only this local command or a global admin credential may; a
    /// credential confined to a team is refused.
    #[arg(long)]
    allow_private: bool,
}

pub async fn run(ctx: &Context, command: WebhookCommand, json: bool) -> anyhow::Result<()> {
    let authority = Authority::local();
    match command {
        WebhookCommand::Add(args) => add(ctx, &authority, args, json).await,
        WebhookCommand::List(TeamArgs { team }) => list(ctx, &authority, &team, json).await,
        WebhookCommand::Pause { id } => set_paused(ctx, &authority, id, true, json).await,
        WebhookCommand::Resume { id } => set_paused(ctx, &authority, id, false, json).await,
        WebhookCommand::Remove { id } => remove(ctx, &authority, id, json).await,
    }
}

async fn add(
    ctx: &Context,
    authority: &Authority,
    args: AddArgs,
    json: bool,
) -> anyhow::Result<()> {
    let new = NewWebhook {
        url: args.url,
        kind: WebhookKind::parse(&args.kind)?,
        events: args.events,
        channels: args.channels,
        allow_private: args
            .allow_private
            .then(|| PrivateTargets::grant(authority))
            .transpose()?,
    };
    let created = ctx
        .with_database(async |pool| {
            Ok(webhooks::add(pool, &authority.team(&args.team)?, new).await?)
        })
        .await?;
    if json {
        return output::json(&created);
    }
    let hook = &created.webhook;
    println!(
        "webhook {} added to team `{}`: {} {} for {}",
        hook.id,
        hook.team,
        hook.kind.as_str(),
        hook.url,
        describe_filter(hook)
    );
    println!(
        "signing secret (X-Bus-Signature: sha256=HMAC-SHA256 of \"<X-Bus-Timestamp>.<body>\"), \
         shown once:"
    );
    println!("  {}", created.secret);
    Ok(())
}

async fn list(ctx: &Context, authority: &Authority, team: &str, json: bool) -> anyhow::Result<()> {
    let list = ctx
        .with_database(async |pool| Ok(webhooks::list(pool, &authority.team(team)?).await?))
        .await?;
    if json {
        return output::json(&list);
    }
    output::table(
        &[
            "id",
            "kind",
            "url",
            "events",
            "state",
            "pending",
            "delivered",
            "failed",
            "created",
        ],
        list.iter()
            .map(|h| {
                vec![
                    h.id.to_string(),
                    h.kind.as_str().to_owned(),
                    output::clean(&h.url).into_owned(),
                    describe_filter(h),
                    if h.paused_at.is_some() {
                        "paused"
                    } else {
                        "active"
                    }
                    .to_owned(),
                    (h.deliveries.pending + h.deliveries.delivering).to_string(),
                    h.deliveries.delivered.to_string(),
                    h.deliveries.failed.to_string(),
                    time(&h.created_at),
                ]
            })
            .collect(),
    );
    for hook in list.iter().filter(|h| !h.failures.is_empty()) {
        println!();
        println!("failed deliveries of {} (newest first):", hook.id);
        for f in &hook.failures {
            println!(
                "  {} {} after {} attempt(s): {}",
                time(&f.created_at),
                f.event,
                f.attempts,
                output::clean(f.last_error.as_deref().unwrap_or("-"))
            );
        }
    }
    Ok(())
}

/// `webhook pause` (`paused`) and `webhook resume`.
async fn set_paused(
    ctx: &Context,
    authority: &Authority,
    id: Uuid,
    paused: bool,
    json: bool,
) -> anyhow::Result<()> {
    let change = ctx
        .with_database(async |pool| {
            let global = authority.global("pause or resume webhooks by id alone")?;
            Ok(webhooks::set_paused(pool, id, &global, paused).await?)
        })
        .await?;
    if json {
        return output::json(&change);
    }
    let hook = &change.webhook;
    let waiting = hook.deliveries.pending + hook.deliveries.delivering;
    match (paused, change.changed) {
        (true, true) => println!(
            "webhook {} of team `{}` paused: nothing is queued for it until `webhook \
             resume --id {}`; {waiting} delivery(ies) queued before wait",
            hook.id, hook.team, hook.id
        ),
        (true, false) => println!(
            "webhook {} of team `{}` was already paused; nothing changed",
            hook.id, hook.team
        ),
        (false, true) => println!(
            "webhook {} of team `{}` resumed; {waiting} delivery(ies) queued before the \
             pause go out now",
            hook.id, hook.team
        ),
        (false, false) => println!(
            "webhook {} of team `{}` was not paused; nothing changed",
            hook.id, hook.team
        ),
    }
    Ok(())
}

async fn remove(ctx: &Context, authority: &Authority, id: Uuid, json: bool) -> anyhow::Result<()> {
    let removed = ctx
        .with_database(async |pool| {
            let global = authority.global("remove webhooks by id alone")?;
            Ok(webhooks::remove(pool, id, &global).await?)
        })
        .await?;
    if json {
        return output::json(&removed);
    }
    println!(
        "webhook {} of team `{}` removed ({} delivered, {} failed, {} not yet sent dropped)",
        removed.id,
        removed.team,
        removed.deliveries.delivered,
        removed.deliveries.failed,
        removed.deliveries.pending + removed.deliveries.delivering
    );
    Ok(())
}

/// `task,lock` or `message in #general,#ops`.
fn describe_filter(hook: &WebhookSummary) -> String {
    let events = hook.events.join(",");
    match &hook.channels {
        Some(channels) => format!(
            "{events} (messages in {})",
            channels
                .iter()
                .map(|c| format!("#{c}"))
                .collect::<Vec<_>>()
                .join(",")
        ),
        None => events,
    }
}
