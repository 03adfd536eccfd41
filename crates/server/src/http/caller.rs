//! Who sends an `/mcp` request: the window headers (`X-Crew-Session`,
//! `X-Crew-Epoch`), then the bearer credential, answered from the
//! credential cache or looked up in its address's turn, and the refusal
//! that says what is wrong.

use axum::http::{HeaderMap, header};
use axum::response::Response;

use super::{
    AppState, EPOCH_HEADER, SESSION_HEADER, address_crowded, address_throttled, bus_error_response,
    limits,
};
use acs_store::auth::{self, AgentCredential};
use acs_store::error::BusError;
use acs_store::store::{identity::sessions, identity::tokens};

/// Who sends an `/mcp` request, or the refusal. The window headers are
/// checked before the credential is looked up, so a malformed header never
/// costs a database round trip. Past the address's allowance of failures
/// the lookup waits its turn (a few at a time), so a flood of bad
/// credentials costs a few lookups at a time; a credential that verifies is
/// never refused for it.
pub(super) async fn mcp_caller(
    state: &AppState,
    headers: &HeaderMap,
    address: Option<std::net::IpAddr>,
) -> Result<acs_store::auth::Identity, Response> {
    let limits = &state.limits;
    let (label, epoch) = window_headers(headers).map_err(|err| bus_error_response(&err))?;
    let Unverified {
        error,
        throttled,
        crowded,
    } = match authenticate(state, headers, label, epoch, address).await {
        Ok(identity) => return Ok(identity),
        Err(unverified) => unverified,
    };
    if let (true, Some(wait)) = (crowded, throttled) {
        return Err(address_crowded(
            address,
            wait,
            limits.unauthenticated_per_minute(),
        ));
    }
    if matches!(error, BusError::Unauthenticated(_)) {
        limits.failed_authentication(address);
        if let Some(wait) = throttled {
            return Err(address_throttled(
                address,
                wait,
                limits.unauthenticated_per_minute(),
            ));
        }
    }
    Err(bus_error_response(&error))
}

/// `X-Crew-Session` (normalised) and `X-Crew-Epoch`, each optional.
fn window_headers(headers: &HeaderMap) -> Result<(Option<String>, Option<i64>), BusError> {
    let text = |name: &str| -> Result<Option<&str>, BusError> {
        headers
            .get(name)
            .map(|v| {
                v.to_str().map_err(|_| {
                    BusError::invalid(format!(
                        "the {name} header is not ASCII text; a window label may hold only ASCII \
                         letters, digits and `-_.:`, an epoch only digits."
                    ))
                })
            })
            .transpose()
    };
    let label = text(SESSION_HEADER)?
        .map(auth::normalize_session_label)
        .transpose()?;
    let epoch = text(EPOCH_HEADER)?.map(auth::parse_epoch).transpose()?;
    Ok((label, epoch))
}

/// Resolve the bearer credential (agent token or session credential) to the
/// caller: from the credential cache when it holds a good answer
/// ([`auth::cache`]), else from the database, caching what was accepted.
async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    label: Option<String>,
    epoch: Option<i64>,
    address: Option<std::net::IpAddr>,
) -> Result<acs_store::auth::Identity, Unverified> {
    let mut turn = None;
    let result = authenticate_with(state, headers, label, epoch, address, &mut turn).await;
    result.map_err(|error| Unverified {
        throttled: turn.as_ref().and_then(limits::LookupTurn::throttled),
        crowded: turn.as_ref().is_some_and(limits::LookupTurn::crowded),
        error,
    })
}

/// A credential that did not verify, and whether its address was past its
/// allowance of failed authentications when it was looked up.
struct Unverified {
    error: BusError,
    throttled: Option<std::time::Duration>,
    /// Not looked up at all: the address already had its most lookups queued.
    crowded: bool,
}

/// Wait for the address's turn to look a credential up, kept in `turn`. An
/// address past its allowance that already has its most lookups queued gets
/// no turn: refused as unverified (the caller answers 429), without holding
/// a request slot in the queue.
async fn take_lookup_turn(
    state: &AppState,
    address: Option<std::net::IpAddr>,
    turn: &mut Option<limits::LookupTurn>,
) -> Result<(), BusError> {
    let taken = turn.insert(state.limits.lookup_turn(address).await);
    if taken.crowded() {
        return Err(BusError::unauthenticated(
            "this address is past its allowance of failed authentications and already has its \
             most credential lookups waiting; this one was not looked up.",
        ));
    }
    Ok(())
}

/// [`authenticate`]: a cached credential is answered at once; a lookup waits
/// for the address's turn ([`Limits::lookup_turn`]), kept in `turn` until
/// the caller has judged the answer.
async fn authenticate_with(
    state: &AppState,
    headers: &HeaderMap,
    label: Option<String>,
    epoch: Option<i64>,
    address: Option<std::net::IpAddr>,
    turn: &mut Option<limits::LookupTurn>,
) -> Result<acs_store::auth::Identity, BusError> {
    // Read before the lookup: a revocation heard during it makes the answer
    // stale on arrival.
    let generation = state.events.credentials_generation();
    let cache = state.events.credential_cache();
    match auth::parse_agent_credential(bearer(headers)?)? {
        AgentCredential::Session(digest) => {
            if let Some(identity) = generation.and_then(|g| cache.get(&digest, g)) {
                let held = identity.session_credential.map(|w| w.epoch);
                // Another label or epoch is looked up: the refusal is the database's.
                if label.as_ref().is_none_or(|l| *l == identity.window)
                    && epoch.is_none_or(|e| Some(e) == held)
                {
                    return Ok(identity);
                }
            }
            take_lookup_turn(state, address, turn).await?;
            let (identity, expires_at) =
                sessions::authenticate_until(&state.pool, &digest, label.as_deref(), epoch).await?;
            if let Some(generation) = generation {
                cache.put(digest, generation, identity.clone(), Some(expires_at));
            }
            Ok(identity)
        }
        AgentCredential::Token(digest) => {
            if epoch.is_some() {
                return Err(BusError::invalid(
                    "X-Crew-Epoch fences session credentials (acss_…); this call used an agent \
                     token. Drop the header, or register_session and call with its credential.",
                ));
            }
            let window = label.unwrap_or_default();
            if let Some(identity) = generation.and_then(|g| cache.get(&digest, g)) {
                return Ok(acs_store::auth::Identity { window, ..identity });
            }
            take_lookup_turn(state, address, turn).await?;
            let identity = tokens::authenticate(&state.pool, &digest, window).await?;
            if let Some(generation) = generation {
                let shared = acs_store::auth::Identity {
                    window: String::new(),
                    ..identity.clone()
                };
                cache.put(digest, generation, shared, None);
            }
            Ok(identity)
        }
    }
}

pub(crate) fn bearer(headers: &HeaderMap) -> Result<&str, BusError> {
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        BusError::unauthenticated(
            "no credential: send `Authorization: Bearer acs_…` with your agent token. An operator \
             issues one with `ai-crew-sync token issue --team T --agent A`.",
        )
    })?;
    let value = value.to_str().unwrap_or_default().trim();
    match value.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(token.trim())
        }
        _ => Err(BusError::unauthenticated(
            "the Authorization header must be `Bearer acs_…` (the Bearer scheme with your agent token).",
        )),
    }
}
