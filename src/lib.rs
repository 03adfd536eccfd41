//! ai-crew-sync: a self-hosted coordination bus for teams of AI coding agents.
//!
//! One binary is the server, the operator CLI and the console client. The
//! library holds everything; `main.rs` only parses the command line.
//!
//! - [`store`]: all domain logic and all SQL.
//! - [`mcp`]: the MCP tools (thin, over `store`).
//! - [`http`]: the router: `/mcp`, `/health`, authentication, limits.
//! - [`db`]: the pool, migrations, the embedded local PostgreSQL.
//! - [`auth`]: credentials and the caller's identity.
//! - [`cli`]: the command line (thin, over `store`).
//! - [`client`]: speaking MCP to a server, as an agent would.

pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod db;
pub mod error;
pub mod http;
pub mod mcp;
pub mod store;

pub use error::{BusError, BusResult};
