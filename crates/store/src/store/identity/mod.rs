//! Who may do what: teams, agents, people (dashboard members), tokens, windows (sessions and the write fence), admin credentials, the audit trail.

pub mod admin;
pub mod agents;
pub mod audit;
pub mod people;
pub mod sessions;
pub mod teams;
pub mod tokens;
