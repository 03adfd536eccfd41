//! What the dashboard (`/dashboard`) shows, who may see it, and what a
//! person may write from it.
//!
//! Two principals sign in to look: an agent (with its agent token) or an admin
//! credential confined to, or global over, the team it names. The cookie the
//! dashboard hands out only names the principal by id ([`Principal`]) and
//! the sign-in's row in `dashboard_sessions` ([`SignIn`], written by
//! [`begin`]), so [`recheck`] reads both back on every request: a revoked
//! token, a disabled agent or a revoked admin credential stops the cookie at
//! the next request, and so does signing out ([`end`] deletes the row), on
//! every replica, for every copy of the cookie.
//!
//! [`snapshot`] is a fixed handful of bounded queries (the newest N of each
//! kind; live locks and path reservations), so the page costs the same on a
//! team with a long history. What it
//! deliberately never returns: a direct message (channel messages only), a
//! conversation the signed-in agent holds no active seat in (a registered
//! window's seat does not count: its private data is for its session
//! credential, not the agent token), a body before the seat's
//! `history_from_seq`, and for an admin principal any conversation body at
//! all (metadata and receipt counts only).
//!
//! A third principal, a person of the team (`identity::people`), signs in
//! with their credential and is the only one who writes: `person.rs` holds
//! those writes (each the store function an agent's tool calls, with the
//! person's identity, then an audit row naming them) and the questions
//! waiting for the person. Agents and admins only look.
//!
//! `sign_in.rs`: the principals, their sign-ins and the recheck on every request;
//! `snapshot.rs`: what one render shows; `person.rs`: a person's writes.

pub mod person;
mod sign_in;
mod snapshot;

pub use sign_in::{
    Principal, SIGN_INS_PER_PRINCIPAL, SignIn, Viewer, begin, end, recheck, sign_in_admin,
    sign_in_agent,
};
pub use snapshot::{
    AgentView, ChannelMessageView, ConversationMessageView, ConversationView, Conversations,
    Health, Limits, LockView, ReservationView, Snapshot, TaskView, WindowView, snapshot,
};

/// Newest agents (with their windows) shown.
pub const AGENTS_MAX: i64 = 200;
/// Windows shown across those agents.
pub const WINDOWS_MAX: i64 = 1_000;
/// Newest-updated tasks shown on the board.
pub const TASKS_MAX: i64 = 200;
/// Held locks shown, soonest to expire first.
pub const LOCKS_MAX: i64 = 100;
/// Live path reservations shown, soonest to expire first.
pub const RESERVATIONS_MAX: i64 = 100;
/// Newest channel messages (announcements included) shown.
pub const MESSAGES_MAX: i64 = 50;
/// Conversations shown, most recently written first.
pub const CONVERSATIONS_MAX: i64 = 20;
/// Newest messages shown per conversation.
pub const CONVERSATION_MESSAGES_MAX: i64 = 20;
/// Characters of a body shown; the rest is cut and marked.
pub const BODY_CHARS_MAX: i32 = 2_000;
