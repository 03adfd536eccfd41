//! Moving every conversation of a plan, one after another: what
//! `conversations migrate --apply` does. A conversation the plan blocks is
//! skipped, saying why; a failed move does not stop the next one, and says
//! whether its thread is still paused. The caller is told of each step as it
//! happens ([`Event`]: a progress bar, a line of output) and gets every
//! conversation's [`Moved`] back, in the plan's order.

use sqlx::PgPool;
use uuid::Uuid;

use super::{Blocked, Direction, Outcome, Plan, Progress, is_paused, run};
use crate::backend::Backends;
use crate::error::BusError;
use crate::store::Actor;

/// What became of one conversation of the plan.
#[derive(Debug)]
pub enum Moved {
    /// The plan blocked it (its `blocked`); nothing was done.
    Skipped { reason: Blocked },
    /// Moved and cut over.
    CutOver(Outcome),
    /// The move failed and cut nothing over. `paused`: its writes are still
    /// paused (an abort that could not finish; the same command resumes
    /// it), or that could not be told; otherwise the thread is open again.
    Failed { error: BusError, paused: bool },
}

impl Moved {
    /// The conversation is not where the caller asked it to be: refused by
    /// its plan or failed. One already there is not left behind. A script
    /// running `conversations migrate --apply` learns this from the exit code.
    pub fn left_behind(&self) -> bool {
        match self {
            Moved::CutOver(_) => false,
            Moved::Skipped {
                reason: Blocked::AlreadyThere(_),
            } => false,
            Moved::Skipped {
                reason: Blocked::Refused(_),
            }
            | Moved::Failed { .. } => true,
        }
    }
}

/// What the driver tells its caller as it goes.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// A move of this conversation begins (never for one the plan blocks).
    Starting(&'a Plan),
    /// How the current move is going.
    Progress(&'a Progress),
    /// This conversation is done with: skipped, cut over or failed.
    Finished(&'a Plan, &'a Moved),
}

/// Move each conversation of `plans` to `direction`'s backend in turn, as
/// `actor` (who starts the runs; with `tombstone_lost`, who tombstones the
/// bodies the broker lost, audited). One [`Moved`] per plan, in its order.
#[allow(clippy::too_many_arguments)]
pub async fn run_all(
    pool: &PgPool,
    backends: &Backends,
    team_id: Uuid,
    direction: Direction,
    plans: &[Plan],
    actor: &Actor,
    tombstone_lost: bool,
    on_event: &(dyn Fn(Event<'_>) + Sync),
) -> Vec<Moved> {
    let mut all = Vec::with_capacity(plans.len());
    for plan in plans {
        let moved = match &plan.blocked {
            Some(why) => Moved::Skipped {
                reason: why.clone(),
            },
            None => {
                on_event(Event::Starting(plan));
                let moved = run(
                    pool,
                    backends,
                    team_id,
                    plan.conversation_id,
                    direction,
                    &actor.name,
                    tombstone_lost.then_some(actor),
                    &|p: &Progress| on_event(Event::Progress(p)),
                )
                .await;
                match moved {
                    Ok(outcome) => Moved::CutOver(outcome),
                    Err(error) => Moved::Failed {
                        error,
                        paused: is_paused(pool, plan.conversation_id).await.unwrap_or(true),
                    },
                }
            }
        };
        on_event(Event::Finished(plan, &moved));
        all.push(moved);
    }
    all
}
