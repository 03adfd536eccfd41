//! Who may do what: teams, agents, tokens, windows (sessions and the write fence), admin credentials, the audit trail.

pub mod admin;
pub mod agents;
pub mod audit;
pub mod sessions;
pub mod teams;
pub mod tokens;
