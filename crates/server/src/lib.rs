//! The server of ai-crew-sync: the MCP tools, the HTTP surface (routes,
//! limits, the dashboard, `/metrics`), the background workers, and the app
//! that builds them over the storage layer and serves them.
//!
//! - [`app`]: the whole server built once from settings (`serve` and the tests).
//! - [`mcp`]: the MCP tools (thin, over `acs_store::store`).
//! - [`http`]: the router: `/mcp`, `/health`, `/admin`, `/dashboard`, authentication, limits.
//! - [`workers`]: the background loops (outbox drain, reconciler, sweepers, webhooks).
//! - [`config`]: the HTTP settings and their defaults.

pub mod app;
pub mod config;
pub mod http;
pub mod mcp;
pub mod workers;
