//! Where a webhook may point. A webhook makes the server send requests to a
//! URL an operator typed, so the URL is checked like any request forgery
//! vector: http or https only, a host, no credentials in it, and every
//! address the host resolves to public, unless the operator allowed private
//! ones for this hook (`--allow-private`, for a receiver on the same network).
//! "Public" is decided by [`private_reason`] alone: outside every block of
//! IANA's special-purpose registries (v4 and v6) and multicast, with an IPv4
//! address carried inside an IPv6 one (mapped, compatible, NAT64, 6to4)
//! judged as that IPv4 address.
//!
//! The check runs twice: at `webhook add` (a clear refusal, nothing written),
//! and at every send, on the addresses the connection will actually use
//! ([`GuardedResolver`]), so a name that resolved to a public address at add
//! and to 127.0.0.1 later (DNS rebinding) is still refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use url::Url;

use crate::error::{BusError, BusResult};

pub const URL_MAX_BYTES: usize = 2048;

/// IPv4 ranges no webhook may reach, with why: every block of IANA's IPv4
/// Special-Purpose Address Registry (RFC 6890 and its updates), the
/// globally reachable ones too (AS112, AMT: no webhook receiver lives
/// there), plus multicast. Network, prefix length, reason.
const V4_DENIED: &[([u8; 4], u8, &str)] = &[
    ([0, 0, 0, 0], 8, "\"this network\" (unspecified)"),
    ([10, 0, 0, 0], 8, "private"),
    (
        [100, 64, 0, 0],
        10,
        "shared address space (carrier-grade NAT)",
    ),
    ([127, 0, 0, 0], 8, "loopback"),
    (
        [169, 254, 0, 0],
        16,
        "link-local (cloud metadata services live here)",
    ),
    ([172, 16, 0, 0], 12, "private"),
    ([192, 0, 0, 0], 24, "IETF protocol assignments"),
    ([192, 0, 2, 0], 24, "documentation (TEST-NET-1)"),
    ([192, 31, 196, 0], 24, "AS112 anycast"),
    ([192, 52, 193, 0], 24, "AMT relay anycast"),
    ([192, 88, 99, 0], 24, "6to4 relay anycast (deprecated)"),
    ([192, 168, 0, 0], 16, "private"),
    ([192, 175, 48, 0], 24, "AS112 direct delegation"),
    ([198, 18, 0, 0], 15, "benchmarking"),
    ([198, 51, 100, 0], 24, "documentation (TEST-NET-2)"),
    ([203, 0, 113, 0], 24, "documentation (TEST-NET-3)"),
    ([224, 0, 0, 0], 4, "multicast"),
    ([240, 0, 0, 0], 4, "reserved (and the broadcast address)"),
];

/// IPv6 ranges no webhook may reach, with why: IANA's IPv6 Special-Purpose
/// Address Registry and the non-unicast blocks. The forms that carry an IPv4
/// address are not here: [`embedded_v4`] unwraps them and the IPv4 address
/// decides. Whatever is outside global unicast (`2000::/3`) and not listed
/// is refused too.
const V6_DENIED: &[([u16; 8], u8, &str)] = &[
    ([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"),
    ([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),
    (
        [0x64, 0xff9b, 1, 0, 0, 0, 0, 0],
        48,
        "local-use IPv4/IPv6 translation",
    ),
    ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only"),
    ([0x100, 0, 0, 1, 0, 0, 0, 0], 64, "dummy prefix"),
    (
        [0x2001, 0, 0, 0, 0, 0, 0, 0],
        23,
        "IETF protocol assignments (Teredo, benchmarking, ORCHID, ...)",
    ),
    ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation"),
    (
        [0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0],
        48,
        "AS112 direct delegation",
    ),
    ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation"),
    (
        [0x5f00, 0, 0, 0, 0, 0, 0, 0],
        16,
        "segment routing (SRv6) identifiers",
    ),
    ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "private (unique local)"),
    ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
    ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local (deprecated)"),
    ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
];

/// The IPv4 address inside an IPv6 one that carries it, and what the form
/// is called: IPv4-mapped `::ffff:a.b.c.d`, IPv4-translated
/// `::ffff:0:a.b.c.d`, IPv4-compatible `::a.b.c.d` (deprecated, but a stack
/// may still route it), NAT64 `64:ff9b::a.b.c.d` and 6to4 `2002:AABB:CCDD::`.
/// A packet to any of these can end at the IPv4 address, so that address is
/// what is judged.
fn embedded_v4(v6: Ipv6Addr) -> Option<(Ipv4Addr, &'static str)> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some((low, "IPv4-mapped")),
        [0, 0, 0, 0, 0xffff, 0, _, _] => Some((low, "IPv4-translated")),
        // `::` and `::1` are themselves (V6_DENIED), not IPv4 addresses.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, _, _] => Some((low, "IPv4-compatible")),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some((low, "NAT64")),
        [0x2002, hi, lo, ..] => Some((
            Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8),
            "6to4",
        )),
        _ => None,
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

fn v4_reason(v4: Ipv4Addr) -> Option<&'static str> {
    V4_DENIED
        .iter()
        .find(|(net, len, _)| in_v4(v4, *net, *len))
        .map(|(_, _, reason)| *reason)
}

/// Why an address may not receive a webhook, or `None` when it may.
pub fn private_reason(ip: IpAddr) -> Option<String> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4).map(str::to_owned),
        IpAddr::V6(v6) => {
            if let Some((v4, form)) = embedded_v4(v6) {
                return v4_reason(v4).map(|reason| format!("{reason}: {form} form of {v4}"));
            }
            if let Some((_, _, reason)) =
                V6_DENIED.iter().find(|(net, len, _)| in_v6(v6, *net, *len))
            {
                return Some((*reason).to_owned());
            }
            if !in_v6(v6, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) {
                return Some("not global unicast (outside 2000::/3)".to_owned());
            }
            None
        }
    }
}

/// The URL's syntax: http/https, a host, no credentials, at most
/// [`URL_MAX_BYTES`]. Returns the parsed URL.
pub fn check_url(raw: &str) -> BusResult<Url> {
    let raw = raw.trim();
    if raw.len() > URL_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "the webhook URL is {} bytes; the limit is {URL_MAX_BYTES}. Use a shorter URL.",
            raw.len()
        )));
    }
    let url = Url::parse(raw).map_err(|e| {
        BusError::invalid(format!(
            "the webhook URL `{raw}` is not a valid URL ({e}). Give a full URL such as \
             https://hooks.example.com/bus."
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(BusError::invalid(format!(
            "the webhook URL uses `{}:`; only http and https URLs can receive webhooks. Give an \
             https:// URL (or http:// for a receiver without TLS).",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(BusError::invalid(format!(
            "the webhook URL `{raw}` names no host. Give a full URL such as \
             https://hooks.example.com/bus."
        )));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(BusError::invalid(
            "the webhook URL carries a user name or password; credentials in a URL end up in \
             logs and listings. Put the secret in the URL's path or query (as Slack and Discord \
             do), or verify the X-Bus-Signature header instead.",
        ));
    }
    Ok(url)
}

/// Resolve the URL's host and refuse it unless every address is public or
/// `allow_private` is set. Used at `webhook add`.
pub async fn check_destination(url: &Url, allow_private: bool) -> BusResult<()> {
    let host = url.host_str().unwrap_or_default();
    let port = url.port_or_known_default().unwrap_or(443);
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match tokio::net::lookup_host((bare, port)).await {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            return Err(BusError::invalid(format!(
                "the webhook host `{host}` does not resolve ({e}); nothing was added. Check the \
                 URL's spelling, or add it once the name exists."
            )));
        }
    };
    if allow_private {
        return Ok(());
    }
    for addr in &addrs {
        if let Some(reason) = private_reason(addr.ip()) {
            return Err(BusError::invalid(format!(
                "the webhook host `{host}` resolves to {} ({reason}); webhooks go only to public \
                 addresses, since a webhook makes this server send requests. Nothing was added. \
                 If the receiver really is on a private network, pass --allow-private \
                 (`allow_private: true` over /admin).",
                addr.ip()
            )));
        }
    }
    Ok(())
}

/// The refusal a send meets when its host resolves only to private addresses.
#[derive(Debug)]
pub struct PrivateDestination(pub String);

impl std::fmt::Display for PrivateDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PrivateDestination {}

/// reqwest's resolver for hooks without `allow_private`: the system's answer
/// with every private address removed; none left is a [`PrivateDestination`]
/// error, so the connection is never opened.
pub struct GuardedResolver;

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<SocketAddr> = all
                .iter()
                .copied()
                .filter(|a| private_reason(a.ip()).is_none())
                .collect();
            if public.is_empty() {
                let shown: Vec<String> = all.iter().map(|a| a.ip().to_string()).collect();
                return Err(Box::new(PrivateDestination(format!(
                    "host `{host}` now resolves only to non-public addresses ({}); the hook was \
                     not added with --allow-private, so nothing was sent",
                    shown.join(", ")
                )))
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The send-time check of a URL whose host is an IP literal (reqwest does
/// not ask the resolver for those).
pub fn literal_refusal(url: &Url) -> Option<String> {
    let ip: IpAddr = match url.host()? {
        url::Host::Ipv4(v4) => IpAddr::V4(v4),
        url::Host::Ipv6(v6) => IpAddr::V6(v6),
        url::Host::Domain(_) => return None,
    };
    private_reason(ip).map(|reason| {
        format!(
            "address {ip} is {reason}; the hook was not added with --allow-private, so nothing \
             was sent"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_special_purpose_range_is_refused() {
        for ip in [
            // IPv4: IANA's special-purpose registry, multicast, reserved.
            "0.0.0.0",
            "0.1.2.3",
            "10.1.2.3",
            "100.64.0.1",
            "100.127.255.254",
            "127.0.0.1",
            "127.255.0.9",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.0.170",
            "192.0.2.1",
            "192.31.196.1",
            "192.52.193.1",
            "192.88.99.1",
            "192.168.1.1",
            "192.175.48.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            // IPv6: the registry and the non-unicast blocks.
            "::",
            "::1",
            "64:ff9b:1::1",
            "100::1",
            "100:0:0:1::1",
            "2001::1",
            "2001:2::1",
            "2001:20::1",
            "2001:db8::1",
            "2620:4f:8000::1",
            "3fff::1",
            "5f00::1",
            "fc00::1",
            "fd00::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "ff02::1",
            "4000::1",
            "::2:0:0:1",
            // IPv4 inside IPv6: the IPv4 address decides.
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0:10.0.0.1",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::198.18.0.1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "2002:c0a8:0101:5::1",
        ] {
            assert!(
                private_reason(ip.parse().unwrap()).is_some(),
                "{ip} should be refused"
            );
        }
    }

    #[test]
    fn public_addresses_pass_in_every_form() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:1.1.1.1",
            "::1.1.1.1",
            "64:ff9b::1.1.1.1",
            "2002:0101:0101::1",
        ] {
            assert_eq!(private_reason(ip.parse().unwrap()), None, "{ip} is public");
        }
    }

    #[test]
    fn a_refusal_names_the_embedded_address() {
        let reason = private_reason("64:ff9b::a9fe:a9fe".parse().unwrap()).unwrap();
        assert!(
            reason.contains("link-local") && reason.contains("NAT64 form of 169.254.169.254"),
            "{reason}"
        );
    }

    #[test]
    fn urls_are_checked_before_resolving() {
        assert!(check_url("ftp://example.com/x").is_err());
        assert!(check_url("https://user:pw@example.com/").is_err());
        assert!(check_url("not a url").is_err());
        assert!(check_url("https://example.com/hook").is_ok());
    }
}
