//! The agent side of ai-crew-sync: what runs on an agent's machine. No
//! database: this crate does not depend on the storage layer.
//!
//! - [`client`]: a real MCP client (Streamable HTTP), profiles, `.acs.toml`,
//!   the spool of a window's inbox, the host hooks.
//! - [`proxy`]: `mcp proxy`, the stdio MCP server a host starts per conversation.

pub mod client;
pub mod proxy;
