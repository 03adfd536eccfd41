//! Load limits of one process: what keeps memory bounded and one caller from
//! starving the others, whatever arrives at once.
//!
//! - **Requests in flight** (global): a semaphore taken first on `/mcp`,
//!   `/admin` and the dashboard; when it is empty the answer is 503 at once,
//!   so a flood queues nowhere inside the server.
//! - **Request bytes buffered** (global): a semaphore counted in bytes. A body
//!   is reserved by its declared `Content-Length` before a byte is read (a
//!   chunked body chunk by chunk as it arrives) and released when the request
//!   has been answered; an empty budget is 503. Hundreds of 8 MiB uploads at
//!   once therefore cost at most the budget, not hundreds of bodies.
//! - **Per caller, at three levels** ([`Caller`]): the credential (a session
//!   credential, else the agent token), the agent (summed over all its
//!   windows and tokens) and the team (summed over its agents). At each level
//!   ordinary calls in flight and, separately, long polls (`wait_for_updates`,
//!   `ask_agent`, `wait_for_conversation_updates`, which block up to 300 s) in
//!   flight are capped, each 429 naming the level and its limit. An agent that
//!   registers many windows therefore cannot hold more than its agent's share,
//!   and one team never more than its team's share, so the global slots stay
//!   open to every other team. A call is counted as ordinary from before its
//!   body is read (so one caller cannot hold more than its share of the byte
//!   budget) and moves to the long-poll counts once its body shows it is one,
//!   so blocked waits never use up the slots of ordinary calls.
//! - **Failed authentication per client address**: a token bucket spent by
//!   each credential that proves unknown, revoked or malformed. It never
//!   refuses a credential that verifies: while an address is within its
//!   allowance its lookups run at once; past it they still run, but only a
//!   few at a time across all such addresses ([`Limits::lookup_turn`]), so a
//!   flood of made-up credentials costs a few database lookups at a time, not
//!   the pool, and the failures themselves are answered 429. A credential the
//!   cache already holds is never looked up, so agents already working from a
//!   throttled address are not even slowed. The client address is the peer's,
//!   or, from a configured proxy (`--trusted-proxies`), the nearest untrusted
//!   hop of `X-Forwarded-For` ([`TrustedProxies`]). IPv6 addresses count per
//!   /64, which one host usually holds whole.
//!
//! Everything here is atomics and semaphores, plus maps under mutexes that
//! are never held across an await. Per process, like the rate limit: N
//! replicas admit N times as much.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::config::{HttpSettings, TrustedProxies};
use acs_metrics::{Refusal, record_refusal};

/// The tools that block until something happens (up to 300 s).
pub const LONG_POLL_TOOLS: &[&str] = &[
    "wait_for_updates",
    "ask_agent",
    "wait_for_conversation_updates",
];

/// What the caller is told to wait when the server is full: the requests
/// ahead of it are short, so a second is enough to find room again.
pub const RETRY_AFTER_BUSY: Duration = Duration::from_secs(1);

pub struct Limits {
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    buffered: Arc<Semaphore>,
    max_buffered_bytes: usize,
    ordinary: Arc<CallerCounts>,
    long_polls: Arc<CallerCounts>,
    /// A body reserves its declared length of the budget before it is read,
    /// so one that declares 8 MiB and sends nothing would otherwise hold that
    /// share for as long as its connection stays open.
    body_read_timeout: Duration,
    addresses: AddressLimiter,
    /// Lookups of credentials from addresses past their allowance, a few at a
    /// time across all of them.
    throttled_lookups: Arc<Semaphore>,
    /// Lookups waiting or running per address past its allowance, so one
    /// address cannot hold the server's request slots in that queue.
    throttled_waiting: Arc<Mutex<HashMap<IpAddr, usize>>>,
    trusted_proxies: TrustedProxies,
}

/// Credential lookups at once for all addresses past their allowance of
/// failed authentications: enough that a valid credential waits little, few
/// enough that a flood of made-up ones leaves the pool to everyone else.
const THROTTLED_LOOKUPS: usize = 2;

/// Lookups one address past its allowance may have waiting or running at
/// once; more are refused at once (429), before they would hold a request
/// slot in the queue. A credential the server already knows never queues.
const THROTTLED_WAITING_PER_ADDRESS: usize = 4;

/// Who a call counts against: its credential, its agent and its team.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    /// The session credential, else the agent token.
    pub credential: Uuid,
    pub agent: Uuid,
    pub team: Uuid,
}

impl Caller {
    pub fn of(identity: &acs_store::auth::Identity) -> Caller {
        Caller {
            credential: identity
                .session_credential
                .map_or(identity.token_id, |w| w.session_id),
            agent: identity.agent_id,
            team: identity.team_id,
        }
    }
}

/// The level whose cap a call met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Credential,
    Agent,
    Team,
}

/// A call refused at the cap of one of its levels.
#[derive(Clone, Copy, Debug)]
pub struct AtCap {
    pub level: Level,
    pub cap: u32,
}

/// The caps of one kind of call (ordinary, or long polls) at each level;
/// 0 = no cap at that level.
#[derive(Clone, Copy, Debug)]
pub struct LevelCaps {
    pub credential: u32,
    pub agent: u32,
    pub team: u32,
}

impl Limits {
    pub fn new(settings: &HttpSettings) -> Limits {
        // A budget under one full body would refuse every large request for
        // good; `serve` refuses such settings, anything else builds is lifted.
        let max_buffered_bytes = settings
            .max_buffered_bytes
            .max(settings.max_request_bytes)
            .min(Semaphore::MAX_PERMITS);
        let max_in_flight = settings.max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
        Limits {
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            buffered: Arc::new(Semaphore::new(max_buffered_bytes)),
            max_buffered_bytes,
            ordinary: Arc::new(CallerCounts::new(LevelCaps {
                credential: settings.max_in_flight_per_credential,
                agent: settings.max_in_flight_per_agent,
                team: settings.max_in_flight_per_team,
            })),
            long_polls: Arc::new(CallerCounts::new(LevelCaps {
                credential: settings.max_long_polls_per_credential,
                agent: settings.max_long_polls_per_agent,
                team: settings.max_long_polls_per_team,
            })),
            addresses: AddressLimiter::new(settings.unauthenticated_per_minute),
            body_read_timeout: settings.body_read_timeout,
            throttled_lookups: Arc::new(Semaphore::new(THROTTLED_LOOKUPS)),
            throttled_waiting: Arc::default(),
            trusted_proxies: settings.trusted_proxies.clone(),
        }
    }

    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    pub fn max_buffered_bytes(&self) -> usize {
        self.max_buffered_bytes
    }

    pub fn unauthenticated_per_minute(&self) -> u32 {
        self.addresses.per_minute
    }

    /// One of the server's request slots, or `None` when all are taken.
    pub fn enter(&self) -> Option<OwnedSemaphorePermit> {
        let slot = self.in_flight.clone().try_acquire_owned().ok();
        slot.or_else(|| refused(Refusal::InFlight))
    }

    /// The address a request comes from: the peer's, or behind a trusted
    /// proxy the client `X-Forwarded-For` names ([`TrustedProxies::client`]).
    pub fn client_address(
        &self,
        peer: Option<IpAddr>,
        headers: &axum::http::HeaderMap,
    ) -> Option<IpAddr> {
        peer.map(|peer| self.trusted_proxies.client(peer, headers))
    }

    /// Wait for `address`'s turn to have a credential looked up. Within its
    /// allowance of failed authentications that is at once; past it, the
    /// lookup waits for one of a few places shared by every address past
    /// its allowance (held until the turn is dropped). A credential is
    /// never refused here: one that verifies is served, only later.
    pub async fn lookup_turn(&self, address: Option<IpAddr>) -> LookupTurn {
        let Some(address) = address else {
            return LookupTurn::default();
        };
        let Err(wait) = self.addresses.check(address_key(address)) else {
            return LookupTurn::default();
        };
        let key = address_key(address);
        let Some(waiting) = WaitingLookup::join(&self.throttled_waiting, key) else {
            return LookupTurn {
                throttled: Some(wait),
                crowded: true,
                ..LookupTurn::default()
            };
        };
        let permit = self.throttled_lookups.clone().acquire_owned().await.ok();
        LookupTurn {
            throttled: Some(wait),
            crowded: false,
            _permit: permit,
            _waiting: Some(waiting),
        }
    }

    /// A credential from `address` was unknown, revoked or malformed.
    pub fn failed_authentication(&self, address: Option<IpAddr>) {
        if let Some(address) = address {
            self.addresses.spend(address_key(address));
        }
    }

    /// An ordinary call slot of `caller`, or the level at its cap.
    pub fn ordinary_slot(&self, caller: Caller) -> Result<CallerSlot, AtCap> {
        CallerCounts::take(&self.ordinary, caller).inspect_err(|at| {
            record_refusal(match at.level {
                Level::Credential => Refusal::CredentialCalls,
                Level::Agent => Refusal::AgentCalls,
                Level::Team => Refusal::TeamCalls,
            })
        })
    }

    /// A long-poll slot of `caller`, or the level at its cap.
    pub fn long_poll_slot(&self, caller: Caller) -> Result<CallerSlot, AtCap> {
        CallerCounts::take(&self.long_polls, caller).inspect_err(|at| {
            record_refusal(match at.level {
                Level::Credential => Refusal::CredentialLongPolls,
                Level::Agent => Refusal::AgentLongPolls,
                Level::Team => Refusal::TeamLongPolls,
            })
        })
    }

    /// Read `body` whole, at most `limit` bytes, every byte counted against
    /// the budget: `declared` (the `Content-Length`) is reserved before the
    /// first byte is read, anything beyond it as it arrives. The permit
    /// holds the bytes' share of the budget until it is dropped.
    pub async fn read_body(
        &self,
        body: Body,
        declared: Option<u64>,
        limit: usize,
    ) -> Result<(Bytes, OwnedSemaphorePermit), BodyRefusal> {
        let declared = declared.map_or(0, |d| usize::try_from(d).unwrap_or(usize::MAX));
        if declared > limit {
            return Err(BodyRefusal::TooLarge);
        }
        let mut permit = self.reserve(declared)?;
        let mut reserved = declared;
        let mut buffer: Vec<u8> = Vec::with_capacity(declared);
        let mut body = body;
        let deadline = tokio::time::Instant::now() + self.body_read_timeout;
        loop {
            let Ok(frame) = tokio::time::timeout_at(deadline, body.frame()).await else {
                return Err(BodyRefusal::TimedOut);
            };
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| BodyRefusal::Unreadable(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let total = buffer.len() + data.len();
            if total > limit {
                return Err(BodyRefusal::TooLarge);
            }
            if total > reserved {
                permit.merge(self.reserve(total - reserved)?);
                reserved = total;
            }
            buffer.extend_from_slice(&data);
        }
        Ok((Bytes::from(buffer), permit))
    }

    fn reserve(&self, bytes: usize) -> Result<OwnedSemaphorePermit, BodyRefusal> {
        let Ok(bytes) = u32::try_from(bytes) else {
            return Err(BodyRefusal::TooLarge);
        };
        self.buffered
            .clone()
            .try_acquire_many_owned(bytes)
            .map_err(|_| {
                record_refusal(Refusal::BufferedBytes);
                BodyRefusal::BudgetExhausted
            })
    }
}

/// Count a refusal and answer "no slot".
fn refused<T>(kind: Refusal) -> Option<T> {
    record_refusal(kind);
    None
}

/// Why a body was not read.
#[derive(Debug)]
pub enum BodyRefusal {
    /// Over the per-request limit (413).
    TooLarge,
    /// The server's buffered-bytes budget is spent by other requests (503).
    BudgetExhausted,
    /// The connection failed or ended early (400).
    Unreadable(String),
    /// Not all there within the body read timeout (408).
    TimedOut,
}

/// Calls in flight per credential, per agent and per team, each level at
/// most its cap. One mutex over the three maps: a call takes its three
/// counts together or none of them.
struct CallerCounts {
    caps: LevelCaps,
    // Only keys with a call in flight have an entry, so the maps are bounded
    // by the global in-flight cap.
    counts: Mutex<[HashMap<Uuid, u32>; 3]>,
}

impl CallerCounts {
    fn new(caps: LevelCaps) -> Self {
        CallerCounts {
            caps,
            counts: Mutex::new(Default::default()),
        }
    }

    /// The levels of `caller` that have a cap, with the index of their map:
    /// a level without one (0) is never counted, as nothing would read it.
    fn levels(&self, caller: Caller) -> impl Iterator<Item = (usize, Level, Uuid, u32)> {
        [
            (Level::Credential, caller.credential, self.caps.credential),
            (Level::Agent, caller.agent, self.caps.agent),
            (Level::Team, caller.team, self.caps.team),
        ]
        .into_iter()
        .enumerate()
        .filter(|(_, (_, _, cap))| *cap != 0)
        .map(|(i, (level, key, cap))| (i, level, key, cap))
    }

    fn take(this: &Arc<Self>, caller: Caller) -> Result<CallerSlot, AtCap> {
        if this.levels(caller).next().is_some() {
            let mut counts = this.counts.lock().unwrap_or_else(|p| p.into_inner());
            for (i, level, key, cap) in this.levels(caller) {
                if counts[i].get(&key).copied().unwrap_or(0) >= cap {
                    return Err(AtCap { level, cap });
                }
            }
            for (i, _, key, _) in this.levels(caller) {
                *counts[i].entry(key).or_insert(0) += 1;
            }
        }
        Ok(CallerSlot {
            counts: Arc::clone(this),
            caller,
        })
    }
}

/// One call of a caller in flight; released when dropped.
pub struct CallerSlot {
    counts: Arc<CallerCounts>,
    caller: Caller,
}

impl Drop for CallerSlot {
    fn drop(&mut self) {
        if self.counts.levels(self.caller).next().is_none() {
            return;
        }
        let mut counts = self.counts.counts.lock().unwrap_or_else(|p| p.into_inner());
        for (i, _, key, _) in self.counts.levels(self.caller) {
            if let Some(count) = counts[i].get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    counts[i].remove(&key);
                }
            }
        }
    }
}

/// A place among the credential lookups (see [`Limits::lookup_turn`]).
#[derive(Default)]
pub struct LookupTurn {
    /// Set when the address was past its allowance: how long until it has
    /// one attempt again.
    throttled: Option<Duration>,
    /// Set when the address already had its most lookups waiting: no turn,
    /// the request is to be refused without looking its credential up.
    crowded: bool,
    _permit: Option<OwnedSemaphorePermit>,
    _waiting: Option<WaitingLookup>,
}

impl LookupTurn {
    /// Whether the address was past its allowance, and for how long yet.
    pub fn throttled(&self) -> Option<Duration> {
        self.throttled
    }

    /// Whether no turn was given: the address, past its allowance, already
    /// has [`THROTTLED_WAITING_PER_ADDRESS`] lookups waiting or running.
    pub fn crowded(&self) -> bool {
        self.crowded
    }
}

/// One throttled lookup of an address, counted until dropped.
struct WaitingLookup {
    waiting: Arc<Mutex<HashMap<IpAddr, usize>>>,
    key: IpAddr,
}

impl WaitingLookup {
    fn join(waiting: &Arc<Mutex<HashMap<IpAddr, usize>>>, key: IpAddr) -> Option<WaitingLookup> {
        let mut counts = waiting.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(key).or_insert(0);
        if *count >= THROTTLED_WAITING_PER_ADDRESS {
            return None;
        }
        *count += 1;
        Some(WaitingLookup {
            waiting: Arc::clone(waiting),
            key,
        })
    }
}

impl Drop for WaitingLookup {
    fn drop(&mut self) {
        let mut counts = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// IPv4 addresses as they are; IPv6 by their /64.
pub(crate) fn address_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

/// A token bucket per address holding a minute's allowance of failed
/// authentications; 0 = off.
struct AddressLimiter {
    per_minute: u32,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
    /// When the map was last pruned (taken only under `buckets`): a prune is
    /// a pass over every bucket, so it runs at most once a second, however
    /// many addresses are failing at once.
    pruned_at: Mutex<Instant>,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Forget full buckets once the map grows past this many addresses.
const PRUNE_ABOVE: usize = 10_000;

impl AddressLimiter {
    fn new(per_minute: u32) -> Self {
        AddressLimiter {
            per_minute,
            buckets: Mutex::new(HashMap::new()),
            pruned_at: Mutex::new(Instant::now()),
        }
    }

    /// The bucket of `key` refilled to now; `None` when it would be full
    /// (an address never seen, or long quiet).
    fn refill<'a>(
        &self,
        buckets: &'a mut HashMap<IpAddr, Bucket>,
        key: IpAddr,
        now: Instant,
    ) -> Option<&'a mut Bucket> {
        let capacity = f64::from(self.per_minute);
        let per_second = capacity / 60.0;
        let bucket = buckets.get_mut(&key)?;
        bucket.tokens = (bucket.tokens
            + now.duration_since(bucket.updated).as_secs_f64() * per_second)
            .min(capacity);
        bucket.updated = now;
        Some(bucket)
    }

    fn check(&self, key: IpAddr) -> Result<(), Duration> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let per_second = f64::from(self.per_minute) / 60.0;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        match self.refill(&mut buckets, key, Instant::now()) {
            Some(bucket) if bucket.tokens < 1.0 => {
                Err(Duration::from_secs_f64((1.0 - bucket.tokens) / per_second))
            }
            _ => Ok(()),
        }
    }

    fn spend(&self, key: IpAddr) {
        if self.per_minute == 0 {
            return;
        }
        let capacity = f64::from(self.per_minute);
        let per_second = capacity / 60.0;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut pruned_at = self.pruned_at.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() > PRUNE_ABOVE && now.duration_since(*pruned_at) >= Duration::from_secs(1) {
            // A bucket that has refilled completely holds no information.
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.updated).as_secs_f64() * per_second < capacity
            });
            *pruned_at = now;
        }
        drop(pruned_at);
        if self.refill(&mut buckets, key, now).is_none() {
            buckets.insert(
                key,
                Bucket {
                    tokens: capacity,
                    updated: now,
                },
            );
        }
        if let Some(bucket) = buckets.get_mut(&key) {
            bucket.tokens = (bucket.tokens - 1.0).max(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_addresses_share_their_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(address_key(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_credential_at_its_cap_leaves_others_alone() {
        let counts = Arc::new(CallerCounts::new(LevelCaps {
            credential: 2,
            agent: 0,
            team: 0,
        }));
        let caller = |credential| Caller {
            credential,
            agent: Uuid::nil(),
            team: Uuid::nil(),
        };
        let (a, b) = (caller(Uuid::new_v4()), caller(Uuid::new_v4()));
        let first = CallerCounts::take(&counts, a).unwrap();
        let _second = CallerCounts::take(&counts, a).unwrap();
        assert!(CallerCounts::take(&counts, a).is_err());
        assert!(CallerCounts::take(&counts, b).is_ok());
        drop(first);
        assert!(
            CallerCounts::take(&counts, a).is_ok(),
            "a finished call frees its slot"
        );
    }

    #[test]
    fn an_agents_windows_share_its_cap_and_a_teams_agents_share_the_teams() {
        let counts = Arc::new(CallerCounts::new(LevelCaps {
            credential: 2,
            agent: 3,
            team: 4,
        }));
        let team = Uuid::new_v4();
        let (alice, bob) = (Uuid::new_v4(), Uuid::new_v4());
        let window = |agent| Caller {
            credential: Uuid::new_v4(),
            agent,
            team,
        };
        let held: Vec<_> = (0..3)
            .map(|_| CallerCounts::take(&counts, window(alice)).unwrap())
            .collect();
        let refused = CallerCounts::take(&counts, window(alice)).err().unwrap();
        assert_eq!((refused.level, refused.cap), (Level::Agent, 3));
        let _bobs = CallerCounts::take(&counts, window(bob)).unwrap();
        let refused = CallerCounts::take(&counts, window(bob)).err().unwrap();
        assert_eq!((refused.level, refused.cap), (Level::Team, 4));
        let other_team = Caller {
            team: Uuid::new_v4(),
            ..window(Uuid::new_v4())
        };
        assert!(CallerCounts::take(&counts, other_team).is_ok());
        drop(held);
        assert!(CallerCounts::take(&counts, window(alice)).is_ok());
    }
}
