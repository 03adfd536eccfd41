//! Where a webhook may point. A webhook makes the server send requests to a
//! URL an operator typed, so the URL is checked like any request forgery
//! vector: http or https only, a host, no credentials in it, and every
//! address the host resolves to public, unless the operator allowed private
//! ones for this hook (`--allow-private`, for a receiver on the same network).
//!
//! The check runs twice: at `webhook add` (a clear refusal, nothing written),
//! and at every send, on the addresses the connection will actually use
//! ([`GuardedResolver`]), so a name that resolved to a public address at add
//! and to 127.0.0.1 later (DNS rebinding) is still refused.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use url::Url;

use crate::error::{BusError, BusResult};

pub const URL_MAX_BYTES: usize = 2048;

/// Why an address may not receive a webhook, or `None` when it may.
pub fn private_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return v4_reason(v4);
            }
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if first & 0xfe00 == 0xfc00 {
                Some("private (unique local)")
            } else if first & 0xffc0 == 0xfe80 || first & 0xffc0 == 0xfec0 {
                Some("link-local")
            } else {
                None
            }
        }
    }
}

fn v4_reason(v4: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = v4.octets();
    if v4.is_loopback() {
        Some("loopback")
    } else if v4.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if v4.is_private() || (a == 100 && (64..128).contains(&b)) {
        Some("private")
    } else if v4.is_link_local() {
        Some("link-local")
    } else if v4.is_multicast() || v4.is_broadcast() {
        Some("multicast or broadcast")
    } else {
        None
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
    fn private_addresses_are_named() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(
                private_reason(ip.parse().unwrap()).is_some(),
                "{ip} should be refused"
            );
        }
        for ip in ["1.1.1.1", "93.184.216.34", "2606:4700::1111"] {
            assert!(
                private_reason(ip.parse().unwrap()).is_none(),
                "{ip} is public"
            );
        }
    }

    #[test]
    fn urls_are_checked_before_resolving() {
        assert!(check_url("ftp://example.com/x").is_err());
        assert!(check_url("https://user:pw@example.com/").is_err());
        assert!(check_url("not a url").is_err());
        assert!(check_url("https://example.com/hook").is_ok());
    }
}
