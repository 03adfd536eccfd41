//! What `conversations migrate` shows: the plan, and with `--apply` a
//! progress bar (or plain lines) per move and a line (or, with `--json`, an
//! object) per conversation. The moving itself is `store::delivery::moves`.

use std::io::IsTerminal;

use acs_store::store::delivery::moves::{self, Direction, Moved, Plan, Progress};

pub(super) fn print_plans(plans: &[Plan], direction: Direction) {
    println!(
        "plan: move to {} (nothing written; add --apply to move)",
        direction.target()
    );
    for p in plans {
        let state = match (&p.blocked, p.resuming) {
            (Some(why), _) => format!("blocked: {why}"),
            (None, _) if !p.lost.is_empty() => format!(
                "{} bod(ies) lost by the broker (seqs {}): --apply refuses; restore the stream \
                 and run `team stream`, or add --tombstone-lost to tombstone them (audited) and \
                 move the rest",
                p.lost.len(),
                p.lost
                    .iter()
                    .map(|l| l.seq.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (None, true) => "resuming an open move".to_string(),
            (None, false) => "ready".to_string(),
        };
        println!(
            "{}  on {:<9} {} messages, {} bytes, {} already there, {} in flight, {} failed  {}  ({})",
            p.conversation_id,
            p.current_backend,
            p.messages,
            p.bytes,
            p.already_there,
            p.in_flight,
            p.failed,
            state,
            p.title
        );
    }
}

/// What `conversations migrate --apply` shows as its moves go: a progress
/// bar (or plain lines) per move, and a line per conversation when it is
/// done with (none with --json: the outcomes are printed at the end).
pub(super) struct MoveView {
    direction: Direction,
    tombstone_lost: bool,
    json: bool,
    /// The current move's progress.
    current: std::sync::Mutex<Option<ProgressView>>,
}

impl MoveView {
    pub(super) fn new(direction: Direction, tombstone_lost: bool, json: bool) -> MoveView {
        MoveView {
            direction,
            tombstone_lost,
            json,
            current: std::sync::Mutex::new(None),
        }
    }

    pub(super) fn show(&self, event: moves::Event<'_>) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            moves::Event::Starting(plan) => *current = Some(ProgressView::new(plan, self.json)),
            moves::Event::Progress(p) => {
                if let Some(bar) = &*current {
                    bar.show(p);
                }
            }
            moves::Event::Finished(plan, moved) => {
                if let Some(bar) = current.take() {
                    bar.finish();
                }
                if !self.json {
                    self.print_moved(plan, moved);
                }
            }
        }
    }

    fn print_moved(&self, plan: &Plan, moved: &Moved) {
        match moved {
            Moved::Skipped { reason } => {
                println!("{}: skipped ({reason})", plan.conversation_id);
            }
            Moved::CutOver(outcome) => {
                println!(
                    "{}: cut over to {} ({} copied, {} resumed, {} already there, \
                     {} bytes, writes paused {} ms){}",
                    outcome.conversation_id,
                    self.direction.target(),
                    outcome.copied,
                    outcome.resumed,
                    outcome.skipped,
                    outcome.bytes,
                    outcome.paused_ms,
                    if self.tombstone_lost && !plan.lost.is_empty() {
                        format!("; {} lost bod(ies) tombstoned (audited)", plan.lost.len())
                    } else {
                        String::new()
                    }
                );
            }
            Moved::Failed { error, paused } => {
                let reopened = if *paused {
                    "its writes are still paused; run the same command to resume"
                } else {
                    "nothing was cut over and the thread is open again"
                };
                println!("{}: failed: {error} ({reopened})", plan.conversation_id);
            }
        }
    }
}

/// One conversation's outcome in `conversations migrate --apply --json`.
pub(super) fn moved_json(plan: &Plan, moved: &Moved) -> serde_json::Value {
    match moved {
        Moved::Skipped { reason } => serde_json::json!({
            "conversation_id": plan.conversation_id, "state": "skipped", "reason": reason.to_string() }),
        Moved::CutOver(outcome) => serde_json::to_value(outcome).unwrap_or_default(),
        Moved::Failed { error, paused } => serde_json::json!({
            "conversation_id": plan.conversation_id, "state": "failed",
            "error": error.to_string(), "paused": paused }),
    }
}

/// A progress bar (messages and bytes) on a terminal; plain lines otherwise;
/// nothing with --json.
struct ProgressView {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    /// When the last plain line was printed, and in which phase.
    last_line: std::sync::Mutex<(std::time::Instant, &'static str)>,
}

impl ProgressView {
    fn new(plan: &Plan, json: bool) -> ProgressView {
        let terminal = std::io::stderr().is_terminal();
        let bar = (!json && terminal).then(|| {
            let bar = indicatif::ProgressBar::new(plan.messages.max(0) as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} messages {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_prefix(plan.conversation_id.to_string());
            bar
        });
        ProgressView {
            bar,
            plain: !json && !terminal,
            last_line: std::sync::Mutex::new((std::time::Instant::now(), "")),
        }
    }

    fn show(&self, p: &Progress) {
        if let Some(bar) = &self.bar {
            bar.set_length(p.messages_total.max(0) as u64);
            bar.set_position(p.messages_done.max(0) as u64);
            bar.set_message(format!(
                "{}/{} bytes, {}",
                p.bytes_done, p.bytes_total, p.phase
            ));
        } else if self.plain {
            // A line a second at most, and every phase change.
            let mut last = self.last_line.lock().unwrap_or_else(|e| e.into_inner());
            if last.0.elapsed() >= std::time::Duration::from_secs(1) || last.1 != p.phase {
                *last = (std::time::Instant::now(), p.phase);
                eprintln!(
                    "{}: {} {}/{} messages, {}/{} bytes",
                    p.conversation_id,
                    p.phase,
                    p.messages_done,
                    p.messages_total,
                    p.bytes_done,
                    p.bytes_total
                );
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
