//! Settings of the HTTP surface, filled from `serve`'s flags (or by tests).

use std::net::IpAddr;
use std::time::Duration;

pub const DEFAULT_MAX_REQUEST_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_RATE_LIMIT_PER_MINUTE: u32 = 600;
/// Enough for every window of a large team at once; each costs a task, not a body.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;
/// 32 bodies of the default 8 MiB limit buffered at once.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 256 * 1024 * 1024;
/// An agent's windows share its token; 16 ordinary calls at once is far above
/// what one model drives, and far below what would starve the others.
pub const DEFAULT_MAX_IN_FLIGHT_PER_CREDENTIAL: u32 = 16;
/// Blocked waits per credential, counted apart from ordinary calls.
pub const DEFAULT_MAX_LONG_POLLS_PER_CREDENTIAL: u32 = 16;
/// Ordinary calls in flight per agent, summed over its windows: four busy
/// windows' worth, a sixteenth of the server's requests in flight.
pub const DEFAULT_MAX_IN_FLIGHT_PER_AGENT: u32 = 64;
/// Long polls in flight per agent, summed over its windows: one wait in
/// each of as many windows as an agent may have live.
pub const DEFAULT_MAX_LONG_POLLS_PER_AGENT: u32 = 64;
/// Ordinary calls in flight per team, summed over its agents: a quarter of
/// the server's requests in flight, so with its long polls one team holds at
/// most half and the other teams keep the rest.
pub const DEFAULT_MAX_IN_FLIGHT_PER_TEAM: u32 = 256;
/// Long polls in flight per team (see [`DEFAULT_MAX_IN_FLIGHT_PER_TEAM`]).
pub const DEFAULT_MAX_LONG_POLLS_PER_TEAM: u32 = 256;
/// Live session credentials (authenticated windows) per agent.
pub use acs_store::DEFAULT_MAX_SESSIONS_PER_AGENT;
/// Failed authentications per client address per minute.
pub const DEFAULT_UNAUTHENTICATED_PER_MINUTE: u32 = 120;
/// Seconds a request body may take to arrive in full.
pub const DEFAULT_BODY_READ_TIMEOUT_SECS: u64 = 30;
/// Seconds a request's headers may take to arrive in full: far more than any
/// client needs, short enough that a socket sending nothing is soon gone.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: u64 = 10;
/// Seconds a kept-alive connection may sit with no request before it is
/// closed: under the 75-90 s after which common clients drop their own idle
/// connections, so neither side keeps one the other has forgotten for long.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 60;
/// Open connections at once, lowered by `serve` to fit the process's
/// descriptor limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Open connections per client address: as many as the server handles
/// requests at once, a quarter of all connections.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 1024;

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
    /// Requests on `/mcp` and `/admin` being handled at once; more get 503.
    pub max_in_flight: usize,
    /// Request body bytes buffered at once across all requests; a body that
    /// does not fit gets 503. At least `max_request_bytes`.
    pub max_buffered_bytes: usize,
    /// Ordinary calls in flight per credential (session credential, else
    /// agent token); more get 429. 0 = no cap.
    pub max_in_flight_per_credential: u32,
    /// Long polls (`wait_for_updates`, `ask_agent`,
    /// `wait_for_conversation_updates`) in flight per credential, counted
    /// apart from ordinary calls; more get 429. 0 = no cap.
    pub max_long_polls_per_credential: u32,
    /// Ordinary calls in flight per agent, summed over its windows and
    /// tokens; more get 429. 0 = no cap.
    pub max_in_flight_per_agent: u32,
    /// Long polls in flight per agent, summed over its windows and tokens;
    /// more get 429. 0 = no cap.
    pub max_long_polls_per_agent: u32,
    /// Ordinary calls in flight per team, summed over its agents; more get
    /// 429. 0 = no cap.
    pub max_in_flight_per_team: u32,
    /// Long polls in flight per team, summed over its agents; more get 429.
    /// 0 = no cap.
    pub max_long_polls_per_team: u32,
    /// Live session credentials per agent; `register_session` past it is
    /// refused. 0 = no cap.
    pub max_sessions_per_agent: u32,
    /// Proxies whose `X-Forwarded-For` names the client; none: the peer's
    /// address is the client's.
    pub trusted_proxies: TrustedProxies,
    /// Failed authentications per client address per minute; past it the
    /// address's lookups run a few at a time and its failures get 429 (a
    /// credential that verifies is never refused); 0 = no limit.
    pub unauthenticated_per_minute: u32,
    /// How long a request body may take to arrive in full after its headers,
    /// on every route; a slower one is answered 408 (its connection then
    /// closes) and gives its share of the buffered-bytes budget back.
    pub body_read_timeout: Duration,
    /// How long a request's headers may take to arrive in full (from the
    /// accept for a connection's first request, from its first byte for a
    /// later one); past it the connection is closed.
    pub header_read_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request; a
    /// request in flight (a long poll) is never idle.
    pub idle_timeout: Duration,
    /// Open connections at once. At the cap a newcomer evicts the connection
    /// that has waited longest without a request in flight; it is refused
    /// only when every connection is answering one.
    pub max_connections: usize,
    /// Open connections per client address (IPv6 per /64); more are refused
    /// at once. At most `max_connections`.
    pub max_connections_per_address: usize,
    /// How long shutdown waits for in-flight requests.
    pub shutdown_grace: Duration,
    /// The key that signs dashboard cookies; `None`: a random one per
    /// process (cookies then end with the process and are not accepted by
    /// another replica).
    pub dashboard_secret: Option<String>,
    /// Whether the dashboard's cookie is `Secure` on every answer, or only
    /// when a proxy says the request came over https.
    pub dashboard_cookie: DashboardCookie,
}

/// Whether the dashboard's sign-in cookie carries `Secure` (browsers then
/// send it back over https only, and to `http://localhost`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DashboardCookie {
    /// `Secure` on every sign-in: the dashboard is reached over https.
    Secure,
    /// `Secure` only on a request a proxy says came over https
    /// (`X-Forwarded-Proto: https`): the dashboard is reached over plain
    /// http, where a browser would drop a `Secure` cookie.
    PlainHttp,
}

impl DashboardCookie {
    /// `serve`'s choice: plain http when the operator says so
    /// (`--dashboard-plain-http`) or when the listener is bound to a
    /// loopback address only (`scripts/run` on http://127.0.0.1:8787: no
    /// one else can reach it, and browsers ask no TLS of localhost); `Secure`
    /// on any other address.
    pub fn for_listener(bind: std::net::IpAddr, plain_http: bool) -> DashboardCookie {
        if plain_http || bind.is_loopback() {
            DashboardCookie::PlainHttp
        } else {
            DashboardCookie::Secure
        }
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            allowed_hosts: default_allowed_hosts(),
            allowed_origins: Vec::new(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            rate_limit_per_minute: DEFAULT_RATE_LIMIT_PER_MINUTE,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            max_in_flight_per_credential: DEFAULT_MAX_IN_FLIGHT_PER_CREDENTIAL,
            max_long_polls_per_credential: DEFAULT_MAX_LONG_POLLS_PER_CREDENTIAL,
            max_in_flight_per_agent: DEFAULT_MAX_IN_FLIGHT_PER_AGENT,
            max_long_polls_per_agent: DEFAULT_MAX_LONG_POLLS_PER_AGENT,
            max_in_flight_per_team: DEFAULT_MAX_IN_FLIGHT_PER_TEAM,
            max_long_polls_per_team: DEFAULT_MAX_LONG_POLLS_PER_TEAM,
            max_sessions_per_agent: DEFAULT_MAX_SESSIONS_PER_AGENT,
            trusted_proxies: TrustedProxies::default(),
            unauthenticated_per_minute: DEFAULT_UNAUTHENTICATED_PER_MINUTE,
            body_read_timeout: Duration::from_secs(DEFAULT_BODY_READ_TIMEOUT_SECS),
            header_read_timeout: Duration::from_secs(DEFAULT_HEADER_READ_TIMEOUT_SECS),
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            shutdown_grace: Duration::from_secs(10),
            dashboard_secret: None,
            // What `serve` picks for its default, loopback, listener.
            dashboard_cookie: DashboardCookie::PlainHttp,
        }
    }
}

pub fn default_allowed_hosts() -> Vec<String> {
    ["localhost", "127.0.0.1", "::1"]
        .into_iter()
        .map(String::from)
        .collect()
}

/// The proxies whose `X-Forwarded-For` is believed (`serve
/// --trusted-proxies`); none by default, and then the peer's address is the
/// client's whatever the header says, so a client cannot pick the address
/// its failures are counted against.
#[derive(Clone, Debug, Default)]
pub struct TrustedProxies(Vec<Cidr>);

impl TrustedProxies {
    /// A comma-separated list of addresses or CIDR blocks (`10.0.0.0/8`,
    /// `::1`, `fd00::/8`).
    pub fn parse(list: &str) -> Result<TrustedProxies, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(Cidr::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(TrustedProxies)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.0.iter().any(|c| c.contains(address))
    }

    /// The client of a request from `peer`: `peer` itself unless it is a
    /// trusted proxy; then the nearest hop of `X-Forwarded-For` (read from
    /// the right, each trusted hop skipped) that is not one. An entry that
    /// is not an address ends the walk at the hop that reported it.
    pub fn client(&self, peer: IpAddr, headers: &axum::http::HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            let Ok(address) = hop.parse::<IpAddr>() else {
                break;
            };
            client = address;
            if !self.trusts(address) {
                break;
            }
        }
        client
    }
}

/// An address block: `address/prefix`, or one address.
#[derive(Clone, Copy, Debug)]
struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn parse(text: &str) -> Result<Cidr, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("`{text}` is not an address nor an address/prefix block"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix =
            match prefix {
                None => max,
                Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| {
                    format!("`{text}`: the prefix must be a number from 0 to {max}")
                })?,
            };
        Ok(Cidr { network, prefix })
    }

    fn contains(&self, address: IpAddr) -> bool {
        let address = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
            v4 => v4,
        };
        match (self.network, address) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dashboard_cookie_is_secure_off_loopback_unless_the_operator_says_plain_http() {
        let on = |ip: &str, plain| DashboardCookie::for_listener(ip.parse().unwrap(), plain);
        assert_eq!(on("127.0.0.1", false), DashboardCookie::PlainHttp);
        assert_eq!(on("::1", false), DashboardCookie::PlainHttp);
        assert_eq!(on("0.0.0.0", false), DashboardCookie::Secure);
        assert_eq!(on("::", false), DashboardCookie::Secure);
        assert_eq!(on("192.168.1.10", false), DashboardCookie::Secure);
        assert_eq!(on("0.0.0.0", true), DashboardCookie::PlainHttp);
    }

    #[test]
    fn forwarded_addresses_are_believed_only_from_trusted_proxies() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("x-forwarded-for", "203.0.113.9, 10.1.2.3".parse().unwrap());
        let peer: IpAddr = "10.0.0.5".parse().unwrap();
        let none = TrustedProxies::default();
        assert_eq!(none.client(peer, &headers), peer);
        let proxies = TrustedProxies::parse("10.0.0.0/8, ::1").unwrap();
        assert_eq!(
            proxies.client(peer, &headers),
            "203.0.113.9".parse::<IpAddr>().unwrap(),
            "trusted hops are skipped from the right"
        );
        let stranger: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(proxies.client(stranger, &headers), stranger);
        assert!(TrustedProxies::parse("10.0.0.0/33").is_err());
        assert!(TrustedProxies::parse("proxy.local").is_err());
    }
}
