//! The answers a load limit gives (429, 503), each with `Retry-After` and
//! worded for a language model: which allowance ran out, its size, and what
//! to do instead. The gates in `http/mod.rs` and the dashboard decide when;
//! this file only says it.

use std::net::IpAddr;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use super::json_error;
use super::limits::{self, Limits};

/// 429 with `Retry-After`, saying which allowance ran out.
pub(crate) fn rate_limited(wait: Duration, per_minute: u32, what: &str) -> Response {
    let seconds = wait.as_secs() + 1;
    too_many_requests(
        seconds,
        format!(
            "this {what} made more than {per_minute} requests in the last minute (the limit of \
             this server). Wait {seconds} s before the next call; batch work or use \
             wait_for_updates instead of polling."
        ),
    )
}

/// 503 + `Retry-After`: the server holds as much as it is allowed to.
pub(crate) fn server_busy(what: String) -> Response {
    let seconds = limits::RETRY_AFTER_BUSY.as_secs();
    retry_after(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        seconds,
        format!(
            "{what}. Nothing was done. Retry in {seconds} s; if this keeps happening, send \
             smaller bodies or fewer calls at once."
        ),
    )
}

pub(crate) fn too_many_in_flight(limits: &Limits) -> Response {
    server_busy(format!(
        "the server is handling its maximum of {} requests at once",
        limits.max_in_flight()
    ))
}

/// 429 + `Retry-After` for a caller at one of its in-flight caps: which
/// level (its credential, its agent over all its windows, its team), the
/// limit, and what to do.
pub(crate) fn caller_busy(at: limits::AtCap, what: &str, instead: &str) -> Response {
    let seconds = limits::RETRY_AFTER_BUSY.as_secs();
    let cap = at.cap;
    let who = match at.level {
        limits::Level::Credential => format!(
            "this credential already has {cap} {what} in flight (the limit per credential on \
             this server)"
        ),
        limits::Level::Agent => format!(
            "this agent already has {cap} {what} in flight across all its windows (the limit \
             per agent on this server, whatever the number of windows)"
        ),
        limits::Level::Team => format!(
            "this team already has {cap} {what} in flight across all its agents (the limit per \
             team on this server, which keeps room for other teams)"
        ),
    };
    too_many_requests(
        seconds,
        format!(
            "{who}. Nothing was done. Wait for one to return, then retry (Retry-After: \
             {seconds} s); {instead}"
        ),
    )
}

/// 429 + `Retry-After` for a credential that did not verify, from an
/// address that failed to authenticate too often.
pub(crate) fn address_throttled(
    address: Option<IpAddr>,
    wait: Duration,
    per_minute: u32,
) -> Response {
    unauthenticated_address(address, wait, |from, seconds| {
        format!(
            "this credential did not verify, and too many requests from {from} failed to \
             authenticate (more than {per_minute} a minute), so its credentials are looked up \
             only a few at a time for now (valid ones are still served). Wait {seconds} s, and \
             check that every client here sends a current credential (`Authorization: Bearer \
             acs_…`); an operator issues one with `ai-crew-sync token issue`."
        )
    })
}

/// 429 `rate_limited` saying `message`, with `Retry-After: seconds`.
pub(crate) fn too_many_requests(seconds: u64, message: String) -> Response {
    retry_after(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        seconds,
        message,
    )
}

/// `status` with error `kind` saying `message`, and `Retry-After: seconds`.
fn retry_after(status: StatusCode, kind: &str, seconds: u64, message: String) -> Response {
    let mut response = json_error(status, kind, message);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// 429 for a request from an address past its allowance that already has
/// its most credential lookups waiting: this one was not looked up at all.
pub(crate) fn address_crowded(
    address: Option<IpAddr>,
    wait: Duration,
    per_minute: u32,
) -> Response {
    unauthenticated_address(address, wait, |from, seconds| {
        format!(
            "this credential was not looked up: too many requests from {from} failed to \
             authenticate (more than {per_minute} a minute), and {from} already has its most \
             credential lookups waiting. A credential this server already knows is still served \
             at once. Wait {seconds} s and try again, and check that every client here sends a \
             current credential (`Authorization: Bearer acs_…`); an operator issues one with \
             `ai-crew-sync token issue`."
        )
    })
}

/// 429 + `Retry-After` to a request from `address`, which failed to
/// authenticate too often: counted, and worded by `say` from the address
/// (as the message names it) and the seconds to wait.
fn unauthenticated_address(
    address: Option<IpAddr>,
    wait: Duration,
    say: impl FnOnce(&str, u64) -> String,
) -> Response {
    acs_metrics::record_refusal(acs_metrics::Refusal::UnauthenticatedAddress);
    let seconds = wait.as_secs() + 1;
    let from = address.map_or_else(|| "this address".to_string(), |a| a.to_string());
    too_many_requests(seconds, say(&from, seconds))
}
