//! `team …`: create and list teams, switch a team's conversations on or off
//! and choose their backend (`capability`), provision or remove its
//! JetStream streams (`stream`), and what it stores: counted (`usage`),
//! capped (`quota`) and trimmed (`prune`). One function per subcommand; the
//! logic is in `store::identity::teams`, `store::operations::usage`, `store::operations::retention` and
//! `store::delivery::broker_conditions`.

use clap::{Args, Subcommand};
use serde_json::json;

mod storage;

use crate::cli::Context;
use crate::cli::args::{NatsArgs, TeamCreateArgs};
use crate::cli::output::{self, time};
use acs_store::backend::BackendKind;
use acs_store::backend::jetstream::StreamSizes;
use acs_store::store::identity::admin::Authority;
use acs_store::store::{Actor, delivery::broker_conditions, identity::teams, operations::usage};

#[derive(Subcommand, Debug)]
pub enum TeamCommand {
    /// Create a team.
    Create(TeamCreateArgs),
    /// List teams.
    List,
    /// Show the team's capabilities, or switch conversations on or off.
    Capability(CapabilityArgs),
    /// Provision (or adopt) the team's JetStream streams and show them; or remove them. The
    /// NATS server needs a max_payload of at least 2MB, the credentials the right to manage
    /// streams (not the ones `serve` runs with).
    Stream(StreamArgs),
    /// Show the team's storage quota and usage, or set it with --bytes: it caps everything the
    /// team stores (messages, notes, tasks, attachments, conversation bodies, webhook deliveries);
    /// writes past it are refused, stored history is never dropped.
    Quota(QuotaArgs),
    /// Rows and bytes the team stores per kind (counts, never content), its quota, the outbox
    /// backlog, and warnings (quota above 80 %, outbox pending over 5 minutes).
    Usage {
        /// The team's slug.
        #[arg(long)]
        team: String,
    },
    /// Trim old history: channel and direct messages (and their attachments) older than
    /// --older-than-days that every live reader has read, note revisions other than the
    /// current one, events of finished tasks, delivered and failed webhook deliveries, audit rows
    /// older than --audit-older-than-days, and conversation messages past their conversation's
    /// retention (`conversations retention`) once acknowledged and delivered. Without --apply: what would go, nothing
    /// removed. With --apply: removed in batches of 1000 rows, audited; with --nats-url too,
    /// the bodies of released JetStream messages are dropped from the team's body stream
    /// (without it they wait for a later prune).
    Prune(PruneArgs),
}

#[derive(Args, Debug)]
pub struct PruneArgs {
    /// The team's slug.
    #[arg(long)]
    team: String,
    /// Messages, note revisions, task events and settled webhook deliveries older than this many
    /// days.
    #[arg(long)]
    older_than_days: i64,
    /// Also audit rows older than this many days, at least 30 (default: audit rows are kept).
    /// Only the local operator or a global admin credential may prune the audit trail.
    #[arg(long)]
    audit_older_than_days: Option<i64>,
    /// Remove (default: only show what would be removed).
    #[arg(long)]
    apply: bool,
    #[command(flatten)]
    nats: NatsArgs,
}

#[derive(Args, Debug)]
pub struct CapabilityArgs {
    /// The team's slug.
    #[arg(long)]
    team: String,
    /// Turn the conversation tools on or off for the team.
    #[arg(long, value_parser = ["on", "off"])]
    conversations: Option<String>,
    /// The backend NEW conversations are created on (existing ones stay).
    /// jetstream needs --nats-url and the team's streams there (`team stream`).
    #[arg(long, value_parser = BackendKind::ALL.map(BackendKind::as_str))]
    backend: Option<String>,
    #[command(flatten)]
    nats: NatsArgs,
}

#[derive(Args, Debug)]
#[command(mut_arg("nats_url", |a| a.required(true)))]
pub struct StreamArgs {
    /// The team's slug.
    #[arg(long)]
    team: String,
    #[command(flatten)]
    nats: NatsArgs,
    /// Body stream size limit in bytes [default: 2 GiB].
    #[arg(long)]
    max_bytes: Option<i64>,
    /// Body stream message limit [default: 100000].
    #[arg(long)]
    max_messages: Option<i64>,
    /// How long an undelivered inbox reference is kept [default: 168].
    #[arg(long)]
    inbox_max_age_hours: Option<u64>,
    /// Inbox stream size limit in bytes; when full it drops its oldest references
    /// (PostgreSQL still holds what is owed) [default: 256 MiB].
    #[arg(long)]
    inbox_max_bytes: Option<i64>,
    /// Inbox stream reference limit [default: 1000000].
    #[arg(long)]
    inbox_max_messages: Option<i64>,
    /// Copies of each stream the JetStream cluster keeps: 1, 3 or 5 [default: 1 for a new
    /// stream; an existing one keeps its own]. More than 1 needs a cluster of at least that
    /// many servers (name them in --nats-url); a count it cannot place is refused and
    /// nothing is changed. With --update-quotas it raises an existing stream's replicas;
    /// lowering is refused (do that with `nats stream edit`).
    #[arg(long)]
    replicas: Option<usize>,
    /// Apply the size flags (or the defaults) and --replicas to streams that already exist.
    /// Without it an existing stream is adopted as it is, and any flag that differs from it
    /// is reported as ignored.
    #[arg(long)]
    update_quotas: bool,
    /// Delete both streams and their contents; refused while the team routes to jetstream.
    #[arg(long, conflicts_with_all = ["max_bytes", "max_messages", "inbox_max_age_hours", "inbox_max_bytes", "inbox_max_messages", "replicas", "update_quotas"])]
    remove: bool,
}

#[derive(Args, Debug)]
pub struct QuotaArgs {
    /// The team's slug.
    #[arg(long)]
    team: String,
    /// New limit in bytes for everything the team stores (default for a new team: 1 GiB).
    #[arg(long)]
    bytes: Option<i64>,
}

pub async fn run(ctx: &Context, command: TeamCommand, json: bool) -> anyhow::Result<()> {
    let authority = Authority::local();
    let actor = authority.actor();
    match command {
        TeamCommand::Create(args) => create(ctx, &authority, args, json).await,
        TeamCommand::List => list(ctx, &authority, json).await,
        TeamCommand::Capability(args) => capability(ctx, &actor, args, json).await,
        TeamCommand::Stream(args) => stream(ctx, &actor, args, json).await,
        TeamCommand::Quota(args) => quota(ctx, &actor, args, json).await,
        TeamCommand::Usage { team } => storage::usage(ctx, &authority, &team, json).await,
        TeamCommand::Prune(args) => storage::prune(ctx, &authority, args, json).await,
    }
}

async fn create(
    ctx: &Context,
    authority: &Authority,
    args: TeamCreateArgs,
    json: bool,
) -> anyhow::Result<()> {
    let TeamCreateArgs { slug, name } = args;
    let team = ctx
        .with_database(async |pool| {
            let global = authority.global("create teams")?;
            Ok(teams::create(pool, &global, &slug, &name).await?)
        })
        .await?;
    if json {
        return output::json(&team);
    }
    println!("team `{}` created ({})", team.slug, team.id);
    println!(
        "next: ai-crew-sync agent add --team {} --name NAME",
        team.slug
    );
    Ok(())
}

async fn list(ctx: &Context, authority: &Authority, json: bool) -> anyhow::Result<()> {
    let list = ctx
        .with_database(async |pool| Ok(teams::list(pool, authority).await?))
        .await?;
    if json {
        return output::json(&list);
    }
    output::table(
        &["slug", "name", "agents", "created", "id"],
        list.iter()
            .map(|t| {
                vec![
                    t.slug.clone(),
                    t.name.clone(),
                    t.agents.to_string(),
                    time(&t.created_at),
                    t.id.to_string(),
                ]
            })
            .collect(),
    );
    Ok(())
}

async fn capability(
    ctx: &Context,
    actor: &Actor,
    args: CapabilityArgs,
    json: bool,
) -> anyhow::Result<()> {
    let CapabilityArgs {
        team,
        conversations,
        backend,
        nats,
    } = args;
    let on = conversations.map(|v| v == "on");
    let backend: Option<BackendKind> = backend.as_deref().map(str::parse).transpose()?;
    let broker = match backend {
        Some(BackendKind::Jetstream) => nats.connect().await.transpose()?,
        _ => None,
    };
    let caps = ctx
        .with_database(async |pool| {
            // The backend first: it is the one that can be refused,
            // and a refused command changes nothing.
            if let Some(backend) = backend {
                teams::set_conversation_backend(pool, &team, backend, broker.as_ref(), actor)
                    .await?;
            }
            Ok(teams::capability(pool, &team, on, actor).await?)
        })
        .await?;
    if json {
        return output::json(&caps);
    }
    println!(
        "team `{}`: conversations {}, new conversations on {}",
        caps.team,
        if caps.conversations { "on" } else { "off" },
        caps.conversation_backend
    );
    Ok(())
}

async fn stream(ctx: &Context, actor: &Actor, args: StreamArgs, json: bool) -> anyhow::Result<()> {
    let StreamArgs {
        team,
        nats,
        max_bytes,
        max_messages,
        inbox_max_age_hours,
        inbox_max_bytes,
        inbox_max_messages,
        replicas,
        update_quotas,
        remove,
    } = args;
    let broker = nats.connect_required().await?;
    let nats_url = nats.required_url()?;
    if remove {
        let removed = ctx
            .with_database(async |pool| {
                Ok(teams::remove_streams(pool, &team, &broker, actor).await?)
            })
            .await?;
        if json {
            return output::json(&json!({ "team": team, "removed": removed }));
        }
        if removed.is_empty() {
            println!("team `{team}` had no streams on {nats_url}; nothing removed");
        } else {
            println!("removed from {nats_url}: {}", removed.join(", "));
        }
        return Ok(());
    }
    let defaults = StreamSizes::default();
    let sizes = StreamSizes {
        max_bytes: max_bytes.unwrap_or(defaults.max_bytes),
        max_messages: max_messages.unwrap_or(defaults.max_messages),
        inbox_max_age: inbox_max_age_hours
            .map(|h| std::time::Duration::from_secs(h.saturating_mul(3600)))
            .unwrap_or(defaults.inbox_max_age),
        inbox_max_bytes: inbox_max_bytes.unwrap_or(defaults.inbox_max_bytes),
        inbox_max_messages: inbox_max_messages.unwrap_or(defaults.inbox_max_messages),
        replicas,
    };
    let size_flags_given = replicas.is_some()
        || max_bytes.is_some()
        || max_messages.is_some()
        || inbox_max_age_hours.is_some()
        || inbox_max_bytes.is_some()
        || inbox_max_messages.is_some();
    let (streams, stale) = ctx
        .with_database(async |pool| {
            let before = broker_conditions::locators_on_body_stream(pool, &team).await?;
            let streams =
                teams::provision_streams(pool, &team, &broker, &sizes, update_quotas, actor)
                    .await?;
            let stale = broker_conditions::stale_locators(pool, &broker, &streams, before).await?;
            Ok((streams, stale))
        })
        .await?;
    if json {
        let mut value = serde_json::to_value(&streams)?;
        value["stale_locators"] = serde_json::to_value(&stale)?;
        return output::json(&value);
    }
    println!("team `{team}` on {nats_url}:");
    output::table(
        &[
            "stream", "state", "subjects", "replicas", "messages", "bytes", "limits",
        ],
        [&streams.body, &streams.inbox]
            .iter()
            .map(|s| {
                vec![
                    s.name.clone(),
                    s.state.to_owned(),
                    s.subjects.join(","),
                    s.replicas.to_string(),
                    s.messages.to_string(),
                    s.bytes.to_string(),
                    format!(
                        "{} retention, max {} bytes / {} msgs, max age {} s",
                        s.retention, s.max_bytes, s.max_messages, s.max_age_seconds
                    ),
                ]
            })
            .collect(),
    );
    for stream in [&streams.body, &streams.inbox] {
        if stream.quotas_not_applied.is_empty() {
            continue;
        }
        let differences = stream.quotas_not_applied.join("; ");
        if size_flags_given {
            println!(
                "ignored the size flags for {} (it exists; {differences}). Rerun with \
                 --update-quotas to apply them.",
                stream.name
            );
        } else {
            println!(
                "{} exists with limits other than the defaults ({differences}); kept. \
                 --update-quotas would set the defaults or the size flags given.",
                stream.name
            );
        }
    }
    if stale.messages > 0 {
        println!(
            "{} message(s) name stream {} at a sequence it does not hold ({}): the \
             stream no longer holds those bodies (restoring the broker's store brings \
             them back).",
            stale.messages, stale.stream, stale.reason
        );
    }
    println!(
        "next: ai-crew-sync team capability --team {team} --backend jetstream --nats-url {nats_url}"
    );
    Ok(())
}

async fn quota(ctx: &Context, actor: &Actor, args: QuotaArgs, json: bool) -> anyhow::Result<()> {
    let QuotaArgs { team, bytes } = args;
    let quota = ctx
        .with_database(async |pool| Ok(usage::quota(pool, &team, bytes, actor).await?))
        .await?;
    if json {
        return output::json(&quota);
    }
    println!(
        "team `{}`: stores {} of {} bytes ({:.1} %); attachments {} bytes",
        quota.team,
        quota.storage_bytes_used,
        quota.storage_bytes_limit,
        quota.percent_used,
        quota.attachment_bytes_used
    );
    Ok(())
}
