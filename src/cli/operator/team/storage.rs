//! `team usage` and `team prune`: print what `store::operations::usage` counted and what
//! `store::operations::retention` would remove (or removed), with a progress bar on a
//! terminal (plain lines otherwise, nothing with --json) while `--apply` runs.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::PruneArgs;
use crate::cli::Context;
use crate::cli::output;
use acs_store::backend::Backends;
use acs_store::store::identity::admin::Authority;
use acs_store::store::operations::retention::{self, Progress, PruneRequest};
use acs_store::store::operations::usage;

pub(super) async fn usage(
    ctx: &Context,
    authority: &Authority,
    team: &str,
    json: bool,
) -> anyhow::Result<()> {
    let scope = authority.team(team)?;
    let usage = ctx
        .with_database(async |pool| Ok(usage::usage(pool, &scope).await?))
        .await?;
    if json {
        return output::json(&usage);
    }
    println!(
        "team `{}`: {} of {} bytes used ({:.1} %), counted {}",
        usage.team,
        usage.used_bytes,
        usage.quota_bytes,
        usage.percent_used,
        output::time(&usage.counted_at)
    );
    output::table(
        &["kind", "rows", "bytes", "in quota"],
        usage
            .kinds
            .iter()
            .map(|k| {
                vec![
                    k.kind.to_owned(),
                    k.rows.to_string(),
                    k.bytes.to_string(),
                    if k.in_quota { "yes" } else { "no" }.to_owned(),
                ]
            })
            .collect(),
    );
    println!(
        "inbox references owed: {}; outbox: {} pending, {} leased, {} failed, {} bytes waiting, \
         {} bytes failed",
        usage.inbox_owed,
        usage.outbox.pending,
        usage.outbox.leased,
        usage.outbox.failed,
        usage.outbox.pending_bytes,
        usage.outbox_failed_bytes
    );
    for warning in &usage.warnings {
        println!("warning: {warning}");
    }
    Ok(())
}

pub(super) async fn prune(
    ctx: &Context,
    authority: &Authority,
    args: PruneArgs,
    json: bool,
) -> anyhow::Result<()> {
    let PruneArgs {
        team,
        older_than_days,
        audit_older_than_days,
        apply,
        nats,
    } = args;
    let scope = authority.team(&team)?;
    let broker = if apply {
        nats.connect().await.transpose()?
    } else {
        None
    };
    let request = PruneRequest {
        older_than_days,
        audit_older_than_days,
        apply,
    };
    let view = ProgressView::new(json);
    let pruned = ctx
        .with_database(async |pool| {
            let backends = match &broker {
                Some(broker) => Backends::with_broker(pool.clone(), broker.clone()),
                None => Backends::postgres_only(pool.clone()),
            };
            Ok(retention::prune(pool, &backends, &scope, &request, &|p| view.show(p)).await?)
        })
        .await;
    view.finish();
    let pruned = pruned?;
    if json {
        return output::json(&pruned);
    }
    let audit = match pruned.audit_older_than_days {
        Some(days) => format!("audit rows older than {days} days"),
        None => "audit rows kept (--audit-older-than-days not given)".to_owned(),
    };
    if pruned.applied {
        println!(
            "team `{}`: removed history older than {} days ({}; {audit}):",
            pruned.team,
            pruned.older_than_days,
            output::time(&pruned.cutoff)
        );
    } else {
        println!(
            "team `{}`: dry run, nothing removed. --apply would remove history older than {} \
             days ({}; {audit}):",
            pruned.team,
            pruned.older_than_days,
            output::time(&pruned.cutoff)
        );
    }
    output::table(
        &["kind", "rows", "bytes"],
        pruned
            .kinds
            .iter()
            .map(|k| vec![k.kind.to_owned(), k.rows.to_string(), k.bytes.to_string()])
            .collect(),
    );
    println!(
        "total: {} rows, {} bytes",
        pruned.total_rows, pruned.total_bytes
    );
    if let Some(broker) = &pruned.broker {
        if broker.dropped > 0 {
            println!("dropped {} released bodies from the broker", broker.dropped);
        }
        if broker.waiting > 0 {
            println!(
                "{} released bodies are still on the broker ({}); run the prune again with \
                 --nats-url to drop them",
                broker.waiting,
                broker.why.as_deref().unwrap_or("no broker")
            );
        }
    }
    if let Some(used) = pruned.used_bytes_after {
        println!("the team now stores {used} bytes (counted after the prune)");
    }
    Ok(())
}

/// A progress bar on a terminal; a line a second (and one per kind)
/// otherwise; nothing with --json.
struct ProgressView {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    last_line: Mutex<(Instant, &'static str)>,
}

impl ProgressView {
    fn new(json: bool) -> ProgressView {
        let terminal = std::io::stderr().is_terminal();
        let bar = (!json && terminal).then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} rows")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        ProgressView {
            bar,
            plain: !json && !terminal,
            last_line: Mutex::new((Instant::now(), "")),
        }
    }

    fn show(&self, p: &Progress) {
        if let Some(bar) = &self.bar {
            bar.set_prefix(p.kind);
            bar.set_length(p.total.max(p.done).max(0) as u64);
            bar.set_position(p.done.max(0) as u64);
        } else if self.plain {
            let mut last = self.last_line.lock().unwrap_or_else(|e| e.into_inner());
            if last.0.elapsed() >= Duration::from_secs(1) || last.1 != p.kind {
                *last = (Instant::now(), p.kind);
                eprintln!("{}: {}/{} rows removed", p.kind, p.done, p.total);
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
