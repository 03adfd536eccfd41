//! The long poll under `wait_for_updates`, `ask_agent` and
//! `wait_for_conversation_updates`, written once.
//!
//! The rule that makes a wait reliable: subscribe to the event hub first, then
//! check the database, then block. What happened before the subscription is
//! found by the check; anything after arrives as an event. Notifications can
//! still be lost (a listener reconnecting, a failed notify, a receiver that
//! lagged), so a blocked wait re-checks the database on a timer: a lost
//! notification delays a wake, it never loses one. The timer is slow while
//! the listener hears the publisher's pings (a lost notification is then
//! rare: a failed notify) and fast otherwise, so a thousand blocked waits
//! cost a few re-checks a second, not hundreds.
//!
//! The caller subscribes (before whatever it must do first, such as sending
//! the question it waits on) with a filter the hub runs for it, so an event
//! no filter passes wakes no wait ([`crate::events::Events::wait_for`]);
//! then it hands the subscription over with its
//! deadline, what each event means to it ([`OnEvent`]) and its database
//! check; it shapes the answer from how the wait ended ([`Polled`]). The bus
//! stopping ends every wait at once, so the caller can say
//! `server_restarting` instead of holding the shutdown.

use serde::Serialize;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::Bus;
use crate::auth::Identity;
use crate::error::BusResult;
use crate::events::{BusEvent, Lagged, ListenerState, Waiter};
use crate::store::identity::sessions::Refusal;

/// How often, at the least, a blocked wait re-checks the database
/// regardless of events, while the event listener is live, and while it is
/// not. Each re-check is drawn from this to half as long again
/// ([`recheck_after`]), and one that would fall in the last half interval
/// before the deadline is left to the deadline's look: a default 50 s wait
/// looks at its start, between 30 and 35 s for a third of them, and at its
/// end; a lost notification delays a wake by at most 60 s (10 s while the
/// listener is unsure).
const RECHECK_LIVE: Duration = Duration::from_secs(30);
const RECHECK_UNSURE: Duration = Duration::from_secs(5);

/// When a blocked wait looks again: `every` stretched by a random share up
/// to a half (`draw` in [0, 1)), so the waits of agents that connected in
/// the same few seconds (a fleet starting, or reconnecting after a restart)
/// do not re-check in the same second. Unspread, the looks of 1 000 agents
/// that joined together queued every call of the server for the database's
/// 32 connections for 1-2 s, 30 s after they began (issue 34's `capacity`).
fn recheck_after(every: Duration, draw: f64) -> Duration {
    every.mul_f64(1.0 + draw.clamp(0.0, 1.0) / 2.0)
}

/// What one event means to a wait.
pub(crate) enum OnEvent<E> {
    /// Not for this wait.
    Ignore,
    /// Worth a look: check the database again now.
    Recheck,
    /// Ends the wait with this (the caller builds its answer from it).
    End(E),
}

/// How a long poll answers its tool: woke with what it found, timed out,
/// or cut short by a stopping server (with the way to continue). `T` holds
/// what was found under the tool's own field name (`events`,
/// `conversations`).
#[derive(Clone, Debug, Serialize)]
pub struct Waited<T> {
    pub woke: bool,
    pub timed_out: bool,
    #[serde(flatten)]
    pub found: T,
    /// Present (true) only when the wait ended because the server is stopping.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub server_restarting: bool,
    /// What to do next, when there is something to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
}

impl<T: Default> Waited<T> {
    pub(crate) fn woke(found: T) -> Waited<T> {
        Waited {
            woke: true,
            timed_out: false,
            found,
            server_restarting: false,
            suggestion: None,
        }
    }

    pub(crate) fn timed_out() -> Waited<T> {
        Waited {
            woke: false,
            timed_out: true,
            found: T::default(),
            server_restarting: false,
            suggestion: None,
        }
    }

    /// The server is stopping: `tool` called again continues the wait.
    pub(crate) fn restarting(tool: &str) -> Waited<T> {
        Waited {
            woke: false,
            timed_out: false,
            found: T::default(),
            server_restarting: true,
            suggestion: Some(restarting_suggestion(tool)),
        }
    }
}

/// A long poll's answer, given only while the caller's credential still
/// holds: a wait blocked across a revocation answers the refusal, never the
/// news.
pub(crate) async fn answer_if_still_valid<T>(
    bus: &Bus,
    me: &Identity,
    wait: impl std::future::Future<Output = BusResult<T>>,
) -> BusResult<T> {
    answer_if_valid(bus, me, async { Ok((wait.await?, None)) }).await
}

/// [`answer_if_still_valid`] for a wait whose last look may have read the
/// credential in its own statement (`Some`, when nothing was read after
/// it): that reading decides, and no second round trip is made. A fleet's
/// waits time out by thousands, each after such a look.
pub(crate) async fn answer_if_valid<T>(
    bus: &Bus,
    me: &Identity,
    wait: impl std::future::Future<Output = BusResult<(T, Option<Refusal>)>>,
) -> BusResult<T> {
    let (answer, checked) = wait.await?;
    match checked {
        Some(refusal) => refusal.check(me)?,
        None => crate::store::identity::sessions::still_valid(&bus.pool, me).await?,
    }
    Ok(answer)
}

/// What a long poll says when it ends because the server is stopping (a
/// restart, a deploy): the same call continues the wait elsewhere.
fn restarting_suggestion(tool: &str) -> String {
    format!(
        "The server is restarting, so this wait ended before anything woke it. Call {tool} \
         again: it reaches another replica, or this server once it is back (retry for a few \
         seconds if the connection is refused)."
    )
}

/// How a long poll ended.
pub(crate) enum Polled<T, E> {
    /// The database check found this.
    Found(T),
    /// An event ended it ([`OnEvent::End`]).
    Ended(E),
    /// The deadline passed after a wait with nothing found; the caller may
    /// look once more before saying so.
    TimedOut,
    /// The server is stopping.
    Stopping,
}

/// Check, then block until an event asks for a look, the re-check timer or
/// the deadline; again until something is found, an event ends the wait,
/// the deadline has passed (after one last check), or the server stops.
pub(crate) async fn long_poll<T, E, Fut>(
    events: &mut Waiter,
    bus: &Bus,
    deadline: Instant,
    mut on_event: impl FnMut(Arc<BusEvent>) -> OnEvent<E>,
    mut check: impl FnMut() -> Fut,
) -> BusResult<Polled<T, E>>
where
    Fut: Future<Output = BusResult<Option<T>>>,
{
    let _open = acs_metrics::LongPollOpen::enter();
    loop {
        if let Some(found) = check().await? {
            return Ok(Polled::Found(found));
        }
        // Checked once more at the deadline: a change whose notification was
        // lost is found by the end of the wait at the latest.
        if Instant::now() >= deadline {
            return Ok(Polled::TimedOut);
        }
        let every = match bus.events.state() {
            ListenerState::Live => RECHECK_LIVE,
            ListenerState::Silent | ListenerState::Detached => RECHECK_UNSURE,
        };
        // A look that would come less than half an interval before the
        // deadline's own look is left to that one.
        let recheck_at = Instant::now() + recheck_after(every, rand::random());
        let recheck_at = match recheck_at + every / 2 >= deadline {
            true => deadline,
            false => recheck_at,
        };
        loop {
            let received = tokio::select! {
                received = events.recv() => received,
                _ = tokio::time::sleep_until(recheck_at) => break,
                () = bus.stopping.cancelled() => return Ok(Polled::Stopping),
            };
            match received {
                Ok(event) => match on_event(event) {
                    OnEvent::Ignore => {}
                    OnEvent::Recheck => break,
                    OnEvent::End(ended) => return Ok(Polled::Ended(ended)),
                },
                // Missed some: the database check at the top finds what matters.
                Err(Lagged) => break,
            }
        }
    }
}

/// How a wait that only re-checks ([`recheck_until`]) ended.
pub(crate) enum Rechecked<T> {
    /// The check found this, at a wake or at the deadline's last look.
    Found(T),
    /// Nothing, by the deadline.
    TimedOut,
    /// The server is stopping.
    Stopping,
}

/// [`long_poll`] for a wait whose every event is worth a look and none ends
/// it (its filter already chose them): the check runs once more when the
/// deadline has passed, before the wait says it timed out.
pub(crate) async fn recheck_until<T, Fut>(
    events: &mut Waiter,
    bus: &Bus,
    deadline: Instant,
    mut check: impl FnMut() -> Fut,
) -> BusResult<Rechecked<T>>
where
    Fut: Future<Output = BusResult<Option<T>>>,
{
    let polled = long_poll(
        events,
        bus,
        deadline,
        |_| OnEvent::<Infallible>::Recheck,
        &mut check,
    )
    .await?;
    Ok(match polled {
        Polled::Found(found) => Rechecked::Found(found),
        Polled::Ended(never) => match never {},
        Polled::Stopping => Rechecked::Stopping,
        Polled::TimedOut => match check().await? {
            Some(found) => Rechecked::Found(found),
            None => Rechecked::TimedOut,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cohort_of_waits_re_checks_spread_over_half_the_interval() {
        // The bounds: never sooner than `every`, never later than 1.5 x.
        assert_eq!(recheck_after(RECHECK_LIVE, 0.0), RECHECK_LIVE);
        assert!(recheck_after(RECHECK_LIVE, 0.999_999) < RECHECK_LIVE.mul_f64(1.5));
        assert_eq!(
            recheck_after(RECHECK_UNSURE, 7.0),
            RECHECK_UNSURE.mul_f64(1.5)
        );
        // A thousand waits begun in the same instant: their looks fall in
        // every second of the 15 s from 30 s on, none in one second more
        // than a fifth of them.
        let mut per_second = [0usize; 15];
        for _ in 0..1_000 {
            let after = recheck_after(RECHECK_LIVE, rand::random());
            assert!(after >= RECHECK_LIVE && after < RECHECK_LIVE.mul_f64(1.5));
            per_second[(after - RECHECK_LIVE).as_secs() as usize] += 1;
        }
        assert!(
            per_second.iter().all(|&n| n > 0 && n < 200),
            "{per_second:?}"
        );
    }
}
