//! ai-crew-sync: a self-hosted coordination bus for teams of AI coding agents.
//!
//! One binary is the server, the operator CLI and the console client. The
//! work lives in the workspace's crates, one per layer (ARCHITECTURE.md):
//! `acs-wire` (the contract both sides share), `acs-metrics`, `acs-store`
//! (database and domain logic), `acs-server` (MCP, HTTP, workers, the app)
//! and `acs-agent` (client, proxy, hooks). This package is the binary: the
//! command line ([`cli`]); `main.rs` only parses it.
//!
//! The crates' modules are re-exported under their old names so tests,
//! benchmarks and scripts reach them by one path (`ai_crew_sync::store`).

pub mod cli;

pub use acs_agent::{client, proxy};
pub use acs_metrics as metrics;
pub use acs_server::{app, config, http, mcp, workers};
pub use acs_store::{Bus, BusError, BusResult, auth, backend, db, error, events, store};
pub use acs_wire as wire;
