//! Settings of the HTTP surface, filled from `serve`'s flags (or by tests).

use std::time::Duration;

pub const DEFAULT_MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_RATE_LIMIT_PER_MINUTE: u32 = 600;

#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// `Host` names (or `host:port`) a request may carry; `*` allows any.
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call `/mcp`; empty = no `Origin` check.
    pub allowed_origins: Vec<String>,
    /// Largest request body accepted; larger gets 413.
    pub max_request_bytes: usize,
    /// Requests per token per minute in this process; 0 turns the limit off.
    pub rate_limit_per_minute: u32,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            allowed_hosts: default_allowed_hosts(),
            allowed_origins: Vec::new(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            rate_limit_per_minute: DEFAULT_RATE_LIMIT_PER_MINUTE,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

pub fn default_allowed_hosts() -> Vec<String> {
    ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .map(String::from)
        .collect()
}
