//! `conversations …`: where conversation bodies live, what is still in
//! flight, moving conversations between backends (`migrate`, `cleanup`), and
//! an operator's switch of one conversation's publication or tombstone of one
//! message (`publication`, `tombstone`), declaring bodies the broker lost
//! (`declare-lost`), and how long a conversation keeps its messages
//! (`retention`, in `retention.rs`). Runs beside the database; the logic is in
//! `store::delivery::outbox`, `store::delivery::moves`, `store::conversations::operator` and
//! `store::delivery::lost_bodies`. What `migrate` shows (the plan, progress, each
//! conversation's outcome) is `show_moves.rs`.

mod retention;
mod show_moves;

use clap::{Args, Subcommand};
use uuid::Uuid;

use super::Context;
use super::args::NatsArgs;
use super::output;
use acs_store::backend::Backends;
use acs_store::store::Actor;
use acs_store::store::conversations::Publication;
use acs_store::store::conversations::operator;
use acs_store::store::delivery::moves::{self, Direction};
use acs_store::store::{
    delivery::broker_conditions, delivery::lost_bodies, delivery::outbox, identity::teams,
};
use show_moves::{MoveView, moved_json, print_plans};

#[derive(Subcommand, Debug)]
pub enum ConversationsCommand {
    /// The team's routing, its outbox (pending, leased, failed, uncertain, oldest, bytes) and
    /// every conversation off the plain synchronous path or with anything outstanding. With the
    /// broker named (--nats-url or BUS_NATS_URL): whether the team's streams are missing or full,
    /// why, and the command that fixes it.
    Status {
        /// The team's slug.
        #[arg(long)]
        team: String,
        #[command(flatten)]
        nats: NatsArgs,
    },
    /// Put `failed` messages whose body is still held (outbox slot or message row) back to
    /// pending with fresh attempts, once their cause is fixed. Without --apply: what would be
    /// retried, nothing written. Refused while a team stream is still missing or full (naming
    /// it and the fix). A message given up on after 8 publishes the broker never answered is
    /// asked for by its publish key first, so a body the broker kept is not stored twice.
    /// Messages on jetstream need --nats-url. Audited.
    Retry(SweepArgs),
    /// Switch one conversation between `sync` (the body commits with the send; postgres only)
    /// and `outbox` (a worker publishes it after the send). Back to sync is refused while any of
    /// its messages still awaits publication; refused while a move is open on it. Audited.
    Publication {
        /// The team's slug.
        #[arg(long)]
        team: String,
        /// The conversation's id.
        #[arg(long)]
        conversation: Uuid,
        /// sync or outbox.
        #[arg(long)]
        mode: String,
    },
    /// Tombstone one message deliberately: readers get `unavailable: tombstoned` with the reason
    /// instead of its body; the message, its seq, recipients and receipts stay, and a move skips
    /// it. Recorded once: a message already tombstoned is refused. Audited.
    Tombstone {
        /// The team's slug.
        #[arg(long)]
        team: String,
        /// The conversation's id.
        #[arg(long)]
        conversation: Uuid,
        /// The message's seq in the conversation.
        #[arg(long)]
        seq: i64,
        /// Why, in one line (at most 500 bytes); readers are shown it.
        #[arg(long)]
        reason: String,
    },
    /// Declare lost the bodies the broker cannot return and PostgreSQL holds no copy of (after a
    /// restore failed): readers then see `tombstoned` "the broker lost this body". Bodies the
    /// broker returns intact are left alone; a broker that does not answer stops it with nothing
    /// written. Without --apply: the count and seqs only. Audited.
    #[command(mut_arg("nats_url", |a| a.required(true)))]
    DeclareLost(SweepArgs),
    /// Move conversations' bodies to another backend. Without --apply: the plan only (messages,
    /// bytes, already there, blocked and why, resuming), nothing written. With --apply, per
    /// conversation: copy, pause writes to it, copy the tail, verify by SHA-256, cut over; a
    /// failed move cuts nothing over and reopens the thread; run the same command to resume.
    /// Exit code with --apply: 0 when every conversation asked for is on the target (moved
    /// now or already there); 1 when any was not moved, refused by its plan (a failed
    /// publication, a pause no move owns, ...) or failed.
    #[command(mut_arg("nats_url", |a| a.required(true)))]
    Migrate(MigrateArgs),
    /// Lift a write pause that no move owns (left by a crash or an older version), audited.
    /// Refused while a move of the conversation is open: run that move's command again instead.
    Unpause {
        /// The team's slug.
        #[arg(long)]
        team: String,
        /// The conversation's id.
        #[arg(long)]
        conversation: Uuid,
    },
    /// Drop the PostgreSQL copies of bodies moved to jetstream longer ago than the rollback
    /// window (report only without --apply).
    Cleanup {
        /// The team's slug.
        #[arg(long)]
        team: String,
        /// Hours a move must have been cut over before its source bodies may go.
        #[arg(long, default_value_t = 168, allow_negative_numbers = true)]
        rollback_window_hours: i64,
        /// Do it (default: report what would be dropped, write nothing).
        #[arg(long)]
        apply: bool,
    },
    /// How many days one conversation keeps its messages: `team prune` then releases older
    /// ones (tombstoned, body dropped) once every receipt is acknowledged. Audited.
    Retention(retention::RetentionArgs),
}

// A sweep over a team's conversations (`retry`, `declare-lost`): all of
// them or one, a report unless --apply, and the broker holding their bodies.
#[derive(Args, Debug)]
pub struct SweepArgs {
    /// The team's slug.
    #[arg(long)]
    team: String,
    /// Only this conversation; default: every conversation of the team.
    #[arg(long)]
    conversation: Option<Uuid>,
    /// Do it (default: report what would be done, write nothing).
    #[arg(long)]
    apply: bool,
    #[command(flatten)]
    nats: NatsArgs,
}

// `conversations migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The team's slug.
    #[arg(long)]
    team: String,
    /// Target backend: jetstream or postgres.
    #[arg(long)]
    to: String,
    /// Only these conversations (repeatable); default: every conversation of the team.
    #[arg(long = "conversation")]
    conversations: Vec<Uuid>,
    /// Do it (default: plan only).
    #[arg(long)]
    apply: bool,
    /// With --apply: tombstone the messages whose bodies the broker lost (the plan names
    /// them) with "the broker lost this body", audited, and move the rest. Without it a
    /// move over lost bodies is refused.
    #[arg(long)]
    tombstone_lost: bool,
    #[command(flatten)]
    nats: NatsArgs,
}

pub async fn run(ctx: &Context, command: ConversationsCommand, json: bool) -> anyhow::Result<()> {
    match command {
        ConversationsCommand::Retention(args) => retention::run(ctx, args, json).await,
        ConversationsCommand::Status { team, nats } => status(ctx, &team, &nats, json).await,
        ConversationsCommand::Publication {
            team,
            conversation,
            mode,
        } => set_publication(ctx, &team, conversation, &mode, json).await,
        ConversationsCommand::Retry(args) => retry(ctx, args, json).await,
        ConversationsCommand::Tombstone {
            team,
            conversation,
            seq,
            reason,
        } => tombstone(ctx, &team, conversation, seq, &reason, json).await,
        ConversationsCommand::DeclareLost(args) => declare_lost(ctx, args, json).await,
        ConversationsCommand::Migrate(args) => migrate(ctx, args, json).await,
        ConversationsCommand::Unpause { team, conversation } => {
            unpause(ctx, &team, conversation, json).await
        }
        ConversationsCommand::Cleanup {
            team,
            rollback_window_hours,
            apply,
        } => cleanup(ctx, &team, rollback_window_hours, apply, json).await,
    }
}

/// What `conversations status` reads of the team's streams: their
/// conditions, why they could not be read, or nothing without a broker.
type StreamConditions = Option<Result<Vec<broker_conditions::Reported>, String>>;

async fn status(ctx: &Context, team: &str, nats: &NatsArgs, json: bool) -> anyhow::Result<()> {
    // A broker that cannot be reached is reported, never a reason
    // to withhold what PostgreSQL says.
    let broker = nats.connect().await;
    let (report, conditions) = ctx
        .with_database(async |pool| {
            let report = outbox::team_report(pool, team).await?;
            let conditions: StreamConditions = match &broker {
                Some(Ok(broker)) => {
                    let found = teams::find(pool, team).await?;
                    Some(
                        broker_conditions::of_team(broker, found.id, &found.slug)
                            .await
                            .map_err(|e| e.to_string()),
                    )
                }
                Some(Err(e)) => Some(Err(e.to_string())),
                None => None,
            };
            Ok((report, conditions))
        })
        .await?;
    if json {
        let mut value = serde_json::to_value(&report)?;
        value["broker_conditions"] = match &conditions {
            Some(Ok(list)) => serde_json::to_value(list)?,
            Some(Err(e)) => serde_json::json!({ "unknown": e }),
            None => serde_json::Value::Null,
        };
        return output::json(&value);
    }
    print_status(&report, &conditions);
    Ok(())
}

fn print_status(report: &outbox::TeamPublication, conditions: &StreamConditions) {
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
    match conditions {
        Some(Ok(list)) if list.is_empty() => {
            println!("broker: the team's streams are fine")
        }
        Some(Ok(list)) => {
            for c in list {
                println!(
                    "broker: {} {}: {}\n  fix: {}",
                    c.stream,
                    c.condition.as_str(),
                    c.why,
                    c.fix
                );
            }
        }
        Some(Err(e)) => println!("broker: could not be checked ({e})"),
        None => println!(
            "broker: not checked (name it with --nats-url to see whether the team's \
             streams are missing or full)"
        ),
    }
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

async fn retry(ctx: &Context, args: SweepArgs, json: bool) -> anyhow::Result<()> {
    let SweepArgs {
        team,
        conversation,
        apply,
        nats,
    } = args;
    let broker = nats.connect().await.transpose()?;
    let report = as_operator(ctx, async |pool, actor| {
        Ok(broker_conditions::retry_failed(
            pool,
            broker.as_ref(),
            &team,
            conversation,
            apply,
            actor,
        )
        .await?)
    })
    .await?;
    if json {
        return output::json(&report);
    }
    let verb = if report.applied {
        "put back to pending with fresh attempts (audited)"
    } else {
        "would be put back to pending (run with --apply)"
    };
    println!(
        "team `{}`: {} failed message(s) {verb}",
        report.team,
        report.retried.len()
    );
    for m in &report.retried {
        println!(
            "  {} seq {} ({}): {}",
            m.conversation_id,
            m.seq,
            m.message_id,
            m.last_error.as_deref().unwrap_or("-")
        );
    }
    if !report.not_recoverable.is_empty() {
        println!(
            "{} failed message(s) have no body held anywhere and cannot be retried; \
             `conversations tombstone` explains the gap to readers",
            report.not_recoverable.len()
        );
    }
    Ok(())
}

async fn declare_lost(ctx: &Context, args: SweepArgs, json: bool) -> anyhow::Result<()> {
    let SweepArgs {
        team,
        conversation,
        apply,
        nats,
    } = args;
    let broker = nats.connect_required().await?;
    let found = as_operator(ctx, async |pool, actor| {
        Ok(lost_bodies::declare_lost(pool, &broker, &team, conversation, apply, actor).await?)
    })
    .await?;
    print_declared_lost(&found, json)
}

async fn migrate(ctx: &Context, args: MigrateArgs, json: bool) -> anyhow::Result<()> {
    let MigrateArgs {
        team,
        to,
        conversations,
        apply,
        tombstone_lost,
        nats,
    } = args;
    let direction: Direction = to.parse()?;
    let broker = nats.connect_required().await?;
    as_operator(ctx, async |pool, actor| {
        let team = teams::find(pool, &team).await?;
        let backends = Backends::with_broker(pool.clone(), broker);
        let plans = moves::plan(pool, &backends, team.id, direction, &conversations).await?;
        if !apply {
            if json {
                output::json(&plans)?;
            } else {
                print_plans(&plans, direction);
            }
            return Ok(());
        }
        let view = MoveView::new(direction, tombstone_lost, json);
        let moved = moves::run_all(
            pool,
            &backends,
            team.id,
            direction,
            &plans,
            actor,
            tombstone_lost,
            &|event| view.show(event),
        )
        .await;
        if json {
            let outcomes: Vec<serde_json::Value> = plans
                .iter()
                .zip(&moved)
                .map(|(plan, moved)| moved_json(plan, moved))
                .collect();
            output::json(&outcomes)?;
        }
        let left = moved.iter().filter(|m| m.left_behind()).count();
        if left > 0 {
            anyhow::bail!(
                "{left} of the {} conversation(s) asked for were not moved to {} \
                 (refused or failed; each is named above with why)",
                moved.len(),
                direction.target()
            );
        }
        Ok(())
    })
    .await
}

async fn unpause(ctx: &Context, team: &str, conversation: Uuid, json: bool) -> anyhow::Result<()> {
    let unpaused = as_operator(ctx, async |pool, actor| {
        let team = teams::find(pool, team).await?;
        Ok(moves::unpause(pool, team.id, conversation, actor).await?)
    })
    .await?;
    if json {
        return output::json(&unpaused);
    }
    match unpaused.paused_seconds {
        Some(s) => println!(
            "{conversation}: writes were paused {s} s with no move owning the pause; \
             lifted (audited)"
        ),
        None => println!("{conversation}: writes were not paused; nothing changed"),
    }
    Ok(())
}

async fn cleanup(
    ctx: &Context,
    team: &str,
    rollback_window_hours: i64,
    apply: bool,
    json: bool,
) -> anyhow::Result<()> {
    let report = ctx
        .with_database(async |pool| {
            let team = teams::find(pool, team).await?;
            Ok(moves::cleanup(pool, team.id, rollback_window_hours, apply).await?)
        })
        .await?;
    if json {
        return output::json(&report);
    }
    let verb = if report.applied {
        "released"
    } else {
        "would release (run with --apply)"
    };
    println!(
        "{verb}: {} PostgreSQL copies of bodies moved to jetstream more than {} h ago, {} bytes",
        report.messages, report.rollback_window_hours, report.bytes
    );
    Ok(())
}

async fn set_publication(
    ctx: &Context,
    team: &str,
    conversation: Uuid,
    mode: &str,
    json: bool,
) -> anyhow::Result<()> {
    let mode = Publication::parse(mode)?;
    let switched = as_operator(ctx, async |pool, actor| {
        Ok(operator::set_publication(pool, team, conversation, mode, actor).await?)
    })
    .await?;
    if json {
        return output::json(&switched);
    }
    if switched.changed {
        println!(
            "{}: publication {} -> {} (audited)",
            switched.conversation_id, switched.before, switched.after
        );
    } else {
        println!(
            "{}: publication is already {}; nothing changed",
            switched.conversation_id, switched.after
        );
    }
    Ok(())
}

async fn tombstone(
    ctx: &Context,
    team: &str,
    conversation: Uuid,
    seq: i64,
    reason: &str,
    json: bool,
) -> anyhow::Result<()> {
    let done = as_operator(ctx, async |pool, actor| {
        Ok(operator::tombstone_message(pool, team, conversation, seq, reason, actor).await?)
    })
    .await?;
    if json {
        return output::json(&done);
    }
    println!(
        "{}: message seq {} ({}) tombstoned at {}; readers see \"{}\" (audited)",
        done.conversation_id,
        done.seq,
        done.message_id,
        done.tombstoned_at.to_rfc3339(),
        done.reason
    );
    Ok(())
}

/// Run `work` on the database as the local operator, the actor its audited
/// changes record.
async fn as_operator<T>(
    ctx: &Context,
    work: impl AsyncFnOnce(&sqlx::PgPool, &Actor) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    ctx.with_database(async |pool| work(pool, &Actor::local_operator()).await)
        .await
}

fn print_declared_lost(found: &lost_bodies::DeclaredLost, json: bool) -> anyhow::Result<()> {
    if json {
        return output::json(found);
    }
    if !found.stream_present {
        println!("the team's body stream does not exist on this broker");
    }
    for c in &found.conversations {
        let seqs: Vec<String> = c.seqs.iter().map(i64::to_string).collect();
        println!(
            "{}: {} bodies {}: seq {}",
            c.conversation_id,
            c.seqs.len(),
            if found.applied {
                "tombstoned"
            } else {
                "cannot be fetched"
            },
            seqs.join(", ")
        );
    }
    if found.applied {
        println!(
            "team `{}`: {} bodies declared lost (readers see \"{}\"; audited), {} readable left alone",
            found.team, found.lost, found.reason, found.readable
        );
    } else {
        println!(
            "team `{}`: {} bodies cannot be fetched and have no local copy, {} readable; nothing \
             written. Add --apply to tombstone them as \"{}\".",
            found.team, found.lost, found.readable, found.reason
        );
    }
    Ok(())
}
