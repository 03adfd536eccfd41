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
//!   about once a minute, and at most [`CAPACITY`] are kept.
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
/// How many credentials are kept; a full cache starts over.
pub const CAPACITY: usize = 10_000;

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
            && entry.stored.elapsed() < TTL
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
        );
    }
}

/// Insert into a map that a full cache empties first.
fn insert_bounded<K: std::hash::Hash + Eq, V>(map: &Mutex<HashMap<K, V>>, key: K, value: V) {
    let mut map = map.lock().expect("credential cache lock");
    if map.len() >= CAPACITY {
        map.clear();
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
}
