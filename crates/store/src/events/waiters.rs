//! The long polls' subscriptions to the hub: each blocked wait registers,
//! under its team, a filter that the listener runs on every event of that
//! team; only an event that passes is queued for the wait and wakes it.
//!
//! Why not the broadcast channel the hub also keeps: every event woke every
//! receiver blocked on it, so with 10 000 waits on one server each post made
//! 10 000 tasks run only to ignore it, and the one wait it was for woke
//! behind them (wake p99 34 ms). Here an event costs one call of each filter
//! of its team (tens of nanoseconds each) and wakes only the waits it passes.
//!
//! A filter may pass more than its wait wants (the wait still looks at what
//! it receives), never less. A wait that falls [`QUEUE_MAX`] events behind
//! is told it lagged and re-checks the database, as a lagged broadcast
//! receiver was.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use uuid::Uuid;

use super::BusEvent;

/// Events queued for one wait at most before it is told it lagged.
const QUEUE_MAX: usize = 1_024;

/// Which events a wait receives; run by the listener, so it must be cheap.
pub type Filter = Box<dyn Fn(&BusEvent) -> bool + Send + Sync>;

/// Every registered wait of the process, by team.
#[derive(Default)]
pub(super) struct Waiters {
    next_id: AtomicU64,
    by_team: Mutex<HashMap<Uuid, HashMap<u64, Arc<Slot>>>>,
}

struct Slot {
    filter: Filter,
    queue: Mutex<Queue>,
    notify: Notify,
}

#[derive(Default)]
struct Queue {
    events: VecDeque<Arc<BusEvent>>,
    lagged: bool,
}

impl Waiters {
    fn teams(&self) -> MutexGuard<'_, HashMap<Uuid, HashMap<u64, Arc<Slot>>>> {
        self.by_team.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Receive from now on every event of `team` that `filter` passes.
    pub(super) fn register(self: &Arc<Self>, team: Uuid, filter: Filter) -> Waiter {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            filter,
            queue: Mutex::default(),
            notify: Notify::new(),
        });
        self.teams()
            .entry(team)
            .or_default()
            .insert(id, slot.clone());
        Waiter {
            waiters: self.clone(),
            team,
            id,
            slot,
        }
    }

    /// Queue `event` for every wait of its team whose filter passes it.
    pub(super) fn deliver(&self, event: &Arc<BusEvent>) {
        let teams = self.teams();
        let Some(slots) = teams.get(&event.team_id) else {
            return;
        };
        for slot in slots.values() {
            if !(slot.filter)(event) {
                continue;
            }
            let mut queue = slot.queue.lock().unwrap_or_else(|p| p.into_inner());
            if queue.events.len() >= QUEUE_MAX {
                queue.events.clear();
                queue.lagged = true;
            } else {
                queue.events.push_back(event.clone());
            }
            drop(queue);
            slot.notify.notify_one();
        }
    }

    /// How many waits are registered.
    pub(super) fn count(&self) -> usize {
        self.teams().values().map(HashMap::len).sum()
    }
}

/// One wait's subscription; dropping it unregisters the wait.
pub struct Waiter {
    waiters: Arc<Waiters>,
    team: Uuid,
    id: u64,
    slot: Arc<Slot>,
}

/// Events for this wait were dropped: it fell too far behind.
#[derive(Debug, PartialEq, Eq)]
pub struct Lagged;

impl Waiter {
    /// The next event this wait's filter passed, waiting for one.
    pub async fn recv(&mut self) -> Result<Arc<BusEvent>, Lagged> {
        loop {
            if let Some(received) = self.try_recv() {
                return received;
            }
            // A notification given since the look above is kept as a
            // permit, so nothing queued in between is slept through.
            self.slot.notify.notified().await;
        }
    }

    /// The next event already queued, if any.
    pub fn try_recv(&mut self) -> Option<Result<Arc<BusEvent>, Lagged>> {
        let mut queue = self.slot.queue.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::take(&mut queue.lagged) {
            return Some(Err(Lagged));
        }
        queue.events.pop_front().map(Ok)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut teams = self.waiters.teams();
        if let Some(slots) = teams.get_mut(&self.team) {
            slots.remove(&self.id);
            if slots.is_empty() {
                teams.remove(&self.team);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventKind;

    fn event(team: Uuid, id: &str) -> Arc<BusEvent> {
        Arc::new(BusEvent::new(team, EventKind::Task, id))
    }

    #[tokio::test]
    async fn a_wait_receives_only_what_its_filter_passes_in_its_team() {
        let waiters = Arc::new(Waiters::default());
        let (team, other) = (Uuid::new_v4(), Uuid::new_v4());
        let mut wait = waiters.register(team, Box::new(|e: &BusEvent| e.id != "skip"));
        waiters.deliver(&event(other, "elsewhere"));
        waiters.deliver(&event(team, "skip"));
        assert!(wait.try_recv().is_none(), "nothing it wants yet");
        waiters.deliver(&event(team, "T-1"));
        waiters.deliver(&event(team, "T-2"));
        assert_eq!(wait.recv().await.unwrap().id, "T-1");
        assert_eq!(wait.recv().await.unwrap().id, "T-2");
        assert!(wait.try_recv().is_none());
    }

    #[tokio::test]
    async fn a_blocked_wait_wakes_for_an_event_delivered_later() {
        let waiters = Arc::new(Waiters::default());
        let team = Uuid::new_v4();
        let mut wait = waiters.register(team, Box::new(|_: &BusEvent| true));
        let blocked = tokio::spawn(async move { wait.recv().await.map(|e| e.id.clone()) });
        tokio::task::yield_now().await;
        waiters.deliver(&event(team, "T-1"));
        assert_eq!(blocked.await.unwrap(), Ok("T-1".to_string()));
    }

    #[test]
    fn a_wait_too_far_behind_is_told_it_lagged_then_receives_again() {
        let waiters = Arc::new(Waiters::default());
        let team = Uuid::new_v4();
        let mut wait = waiters.register(team, Box::new(|_: &BusEvent| true));
        for i in 0..=QUEUE_MAX {
            waiters.deliver(&event(team, &format!("T-{i}")));
        }
        assert_eq!(wait.try_recv().map(|r| r.err()), Some(Some(Lagged)));
        waiters.deliver(&event(team, "after"));
        assert_eq!(wait.try_recv().unwrap().unwrap().id, "after");
    }

    #[test]
    fn a_dropped_wait_is_unregistered() {
        let waiters = Arc::new(Waiters::default());
        let team = Uuid::new_v4();
        let first = waiters.register(team, Box::new(|_: &BusEvent| true));
        let second = waiters.register(team, Box::new(|_: &BusEvent| true));
        assert_eq!(waiters.count(), 2);
        drop(first);
        assert_eq!(waiters.count(), 1);
        drop(second);
        assert_eq!(waiters.count(), 0);
        assert!(waiters.teams().is_empty(), "no empty team left behind");
    }
}
