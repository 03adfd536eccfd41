//! A team's traffic outside conversations: channels and messages, direct messages and questions, waits, presence, notes, attachments, locks, path reservations, and the reads over them (`pending_for_me`, `whoami`'s overview, `team_digest`).

pub mod acks;
pub mod attachments;
pub mod channels;
pub mod holdings;
pub mod locks;
pub mod messages;
pub mod notes;
pub mod overview;
pub mod pending;
pub mod presence;
pub mod reservations;
pub mod waits;
