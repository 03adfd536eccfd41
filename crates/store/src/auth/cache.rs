//! Credentials a server has looked up, kept so an ordinary call costs no
//! credential query.
//!
//! What makes that safe:
//! - every write still re-checks its credential in its own transaction
//!   (`store::identity::sessions::guard`): a cached entry only ever lets a *read* run
//!   on a credential revoked an instant earlier, never a write;
//! - an entry is good only under the generation it was looked up under
//!   ([`crate::events::Events::credentials_generation`]), which changes the
//!   moment any replica's revocation commits (a notification queued in the
//!   revoking transaction, migration 0024), when this process revokes
//!   something itself, and when the event listener loses or regains its
//!   connection; while the listener is detached nothing is cached or served;
//! - a session credential is served only before its `expires_at` and only
//!   with its own window label and epoch (anything else is looked up, so the
//!   refusal is the database's);
//! - entries live at most [`TTL`], so a token's `last_used_at` still moves
//!   about once a minute, and at most [`CAPACITY`] are kept. Each credential
//!   lives between three quarters of it and all of it, set by its digest
//!   ([`ttl_of`]): a fleet that authenticated in the same second (hosts
//!   reconnecting after a restart) is looked up again spread over 15 s, not
//!   all at once every minute. A full cache drops its stale entries first and
//!   starts over only when most are live.
//!
//! Only credentials that were accepted are kept; a refused one is looked up
//! every time (and counts against its address's allowance).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use uuid::Uuid;

use super::Identity;

/// How long an entry is served at most, whatever the notifications say.
pub const TTL: Duration = Duration::from_secs(60);
/// How many credentials (and teams) are kept: more than a server's agents
/// (10 000 blocked waits fit in its memory), ~250 bytes each.
pub const CAPACITY: usize = 50_000;

/// How long the entry of the credential with `digest` is served: from 3/4
/// of [`TTL`] to all of it, spread evenly over credentials (a digest is
/// uniform), the same for one credential every time.
pub fn ttl_of(digest: &[u8; 32]) -> Duration {
    TTL - TTL / 4 * u32::from(digest[0]) / 256
}

/// One accepted credential: the identity it resolved to (for an agent token,
/// with the shared window `""`; the caller sets the window from its header),
/// and for a session credential the end of its life.
#[derive(Clone)]
struct Entry {
    identity: Identity,
    expires_at: Option<DateTime<Utc>>,
    generation: u64,
    stored: Instant,
}

/// A team's `conversations_enabled`, which gates the conversation tools on
/// every call; switching it notifies like a revocation does.
struct TeamFlag {
    conversations: bool,
    generation: u64,
    stored: Instant,
}

#[derive(Default)]
pub struct CredentialCache {
    entries: Mutex<HashMap<[u8; 32], Entry>>,
    teams: Mutex<HashMap<Uuid, TeamFlag>>,
}

impl CredentialCache {
    /// The identity cached for `digest` under `generation`, if it is still
    /// good: same generation, younger than [`TTL`], not past its expiry.
    pub fn get(&self, digest: &[u8; 32], generation: u64) -> Option<Identity> {
        let mut entries = self.entries.lock().expect("credential cache lock");
        let entry = entries.get(digest)?;
        let good = entry.generation == generation
            && entry.stored.elapsed() < ttl_of(digest)
            && entry.expires_at.is_none_or(|at| at > Utc::now());
        if good {
            Some(entry.identity.clone())
        } else {
            entries.remove(digest);
            None
        }
    }

    /// Keep `identity` for `digest`, looked up under `generation` (read
    /// before the lookup began).
    pub fn put(
        &self,
        digest: [u8; 32],
        generation: u64,
        identity: Identity,
        expires_at: Option<DateTime<Utc>>,
    ) {
        insert_bounded(
            &self.entries,
            digest,
            Entry {
                identity,
                expires_at,
                generation,
                stored: Instant::now(),
            },
            |entry| entry.stored.elapsed() < TTL,
        );
    }

    /// Whether the team has conversations on, as cached under `generation`.
    pub fn conversations_enabled(&self, team: Uuid, generation: u64) -> Option<bool> {
        let teams = self.teams.lock().expect("credential cache lock");
        teams
            .get(&team)
            .filter(|flag| flag.generation == generation && flag.stored.elapsed() < TTL)
            .map(|flag| flag.conversations)
    }

    /// Keep the team's flag, read under `generation`.
    pub fn remember_conversations_enabled(&self, team: Uuid, generation: u64, on: bool) {
        insert_bounded(
            &self.teams,
            team,
            TeamFlag {
                conversations: on,
                generation,
                stored: Instant::now(),
            },
            |flag| flag.stored.elapsed() < TTL,
        );
    }
}

/// Insert into a map of at most [`CAPACITY`]: a full one first drops what
/// `live` says is stale, and starts over when that leaves it more than three
/// quarters full (so a cache of live entries is not swept on every insert).
fn insert_bounded<K: std::hash::Hash + Eq, V>(
    map: &Mutex<HashMap<K, V>>,
    key: K,
    value: V,
    live: impl Fn(&V) -> bool,
) {
    let mut map = map.lock().expect("credential cache lock");
    if map.len() >= CAPACITY {
        map.retain(|_, v| live(v));
        if map.len() > CAPACITY / 4 * 3 {
            map.clear();
        }
    }
    map.insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            team_id: Uuid::new_v4(),
            team: "t".into(),
            agent_id: Uuid::new_v4(),
            agent: "a".into(),
            token_id: Uuid::new_v4(),
            window: String::new(),
            session_credential: None,
        }
    }

    #[test]
    fn an_entry_is_served_only_under_its_generation_and_before_its_expiry() {
        let cache = CredentialCache::default();
        let digest = [1u8; 32];
        cache.put(digest, 7, identity(), None);
        assert!(cache.get(&digest, 7).is_some());
        assert!(cache.get(&digest, 8).is_none(), "a newer generation");
        assert!(cache.get(&digest, 7).is_none(), "dropped once stale");

        cache.put(
            digest,
            7,
            identity(),
            Some(Utc::now() - chrono::Duration::seconds(1)),
        );
        assert!(cache.get(&digest, 7).is_none(), "an expired session");
        cache.put(
            digest,
            7,
            identity(),
            Some(Utc::now() + chrono::Duration::hours(1)),
        );
        assert!(cache.get(&digest, 7).is_some());
        assert!(cache.get(&[2u8; 32], 7).is_none());
    }

    #[test]
    fn a_credential_is_served_for_three_quarters_of_the_ttl_to_all_of_it() {
        assert_eq!(ttl_of(&[0u8; 32]), TTL);
        let shortest = ttl_of(&[255u8; 32]);
        assert!(shortest >= TTL / 4 * 3 && shortest < TTL - Duration::from_secs(14));
        // Spread over the range: 256 digests' lives take many values.
        let lives: std::collections::BTreeSet<Duration> =
            (0..=255u8).map(|b| ttl_of(&[b; 32])).collect();
        assert_eq!(lives.len(), 256);

        // An entry older than its own life is not served; younger, it is.
        let cache = CredentialCache::default();
        let (short, long) = ([255u8; 32], [0u8; 32]);
        let aged = Duration::from_secs(50);
        for digest in [short, long] {
            cache.entries.lock().unwrap().insert(
                digest,
                Entry {
                    identity: identity(),
                    expires_at: None,
                    generation: 1,
                    stored: Instant::now() - aged,
                },
            );
        }
        assert!(cache.get(&short, 1).is_none(), "45 s life, 50 s old");
        assert!(cache.get(&long, 1).is_some(), "60 s life, 50 s old");
    }

    #[test]
    fn a_full_cache_drops_its_stale_entries_before_its_live_ones() {
        let cache = CredentialCache::default();
        let stale = Instant::now() - TTL - Duration::from_secs(1);
        {
            let mut entries = cache.entries.lock().unwrap();
            for n in 0..CAPACITY as u32 {
                let mut digest = [0u8; 32];
                digest[..4].copy_from_slice(&n.to_be_bytes());
                let stored = if n % 2 == 0 { stale } else { Instant::now() };
                let entry = Entry {
                    identity: identity(),
                    expires_at: None,
                    generation: 1,
                    stored,
                };
                entries.insert(digest, entry);
            }
        }
        let mut live = [0u8; 32];
        live[..4].copy_from_slice(&1u32.to_be_bytes()); // n = 1: odd, so live
        cache.put([9u8; 32], 1, identity(), None);
        let entries = cache.entries.lock().unwrap().len();
        assert_eq!(
            entries,
            CAPACITY / 2 + 1,
            "the stale half dropped, the new one in"
        );
        assert!(cache.get(&live, 1).is_some(), "a live entry kept");

        // All live: the cache starts over rather than sweep on every insert.
        let full = CredentialCache::default();
        {
            let mut entries = full.entries.lock().unwrap();
            for n in 0..CAPACITY as u32 {
                let mut digest = [0u8; 32];
                digest[..4].copy_from_slice(&n.to_be_bytes());
                let entry = Entry {
                    identity: identity(),
                    expires_at: None,
                    generation: 1,
                    stored: Instant::now(),
                };
                entries.insert(digest, entry);
            }
        }
        full.put([9u8; 32], 1, identity(), None);
        assert_eq!(full.entries.lock().unwrap().len(), 1);
    }
}
