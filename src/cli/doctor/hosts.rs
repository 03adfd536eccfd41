//! `doctor`'s allowed-hosts check: what `serve` with the same `--bind` and
//! `--allowed-hosts` would refuse. The Host check guards against DNS
//! rebinding, so a client must use an allowed name; this says when none
//! that can reach the address is allowed.

use std::net::{IpAddr, SocketAddr};

use super::{Check, NOTHING_TO_DO, Status, check};
use acs_server::config;

/// Whether a Host entry names this machine's loopback only.
fn is_loopback_name(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.split(']').next())
        .unwrap_or(host);
    let bare = match bare.parse::<IpAddr>() {
        Ok(ip) => return ip.is_loopback(),
        Err(_) => bare.rsplit_once(':').map_or(bare, |(h, _)| h),
    };
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// What `serve` with these settings refuses: a Host a client must use but
/// may not (the `Host` check guards against DNS rebinding).
pub(super) fn allowed_hosts_check(bind: SocketAddr, given: &[String]) -> Check {
    let mut hosts: Vec<String> = given
        .iter()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .collect();
    if hosts.is_empty() {
        hosts = config::default_allowed_hosts();
    }
    let list = hosts.join(", ");
    let ip = bind.ip();
    let set_hosts = "set --allowed-hosts (BUS_ALLOWED_HOSTS) to the names and addresses \
                     clients use, e.g. `bus.example.com,10.0.0.5`";
    if hosts.iter().any(|h| h == "*") {
        return if ip.is_loopback() {
            check(
                "allowed_hosts",
                Status::Warn,
                format!(
                    "{bind} accepts any Host name: a web page in a local browser could reach \
                     the bus by DNS rebinding"
                ),
                "list the names clients use in --allowed-hosts instead of `*`",
            )
        } else {
            check(
                "allowed_hosts",
                Status::Ok,
                format!("{bind} accepts any Host name"),
                NOTHING_TO_DO,
            )
        };
    }
    let only_loopback = hosts.iter().all(|h| is_loopback_name(h));
    if ip.is_unspecified() && only_loopback {
        check(
            "allowed_hosts",
            Status::Warn,
            format!(
                "{bind} listens on every interface, but the allowed Host names are only {list}: \
                 clients on other machines are refused (403)"
            ),
            set_hosts,
        )
    } else if !ip.is_unspecified() && !ip.is_loopback() && only_loopback {
        check(
            "allowed_hosts",
            Status::Fail,
            format!(
                "{bind} listens on {ip} only, and the allowed Host names are loopback names \
                 ({list}): every client is refused (403)"
            ),
            set_hosts,
        )
    } else {
        check(
            "allowed_hosts",
            Status::Ok,
            format!("{bind} answers to the Host names {list}"),
            NOTHING_TO_DO,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(bind: &str, hosts: &[&str]) -> Status {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        allowed_hosts_check(bind.parse().unwrap(), &hosts).status
    }

    #[test]
    fn allowed_hosts_are_judged_against_the_bind_address() {
        assert_eq!(status("127.0.0.1:8787", &[]), Status::Ok);
        assert_eq!(status("0.0.0.0:8787", &[]), Status::Warn);
        assert_eq!(status("[::]:8787", &["localhost", "[::1]"]), Status::Warn);
        assert_eq!(status("10.0.0.5:8787", &[]), Status::Fail);
        assert_eq!(status("10.0.0.5:8787", &["localhost:8787"]), Status::Fail);
        assert_eq!(status("0.0.0.0:8787", &["bus.example.com"]), Status::Ok);
        assert_eq!(status("10.0.0.5:8787", &["10.0.0.5"]), Status::Ok);
        assert_eq!(status("127.0.0.1:8787", &["*"]), Status::Warn);
        assert_eq!(status("0.0.0.0:8787", &["*"]), Status::Ok);
    }
}
