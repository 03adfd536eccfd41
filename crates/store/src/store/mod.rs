//! All domain logic and all SQL, one file per aggregate.
//!
//! Tools, HTTP routes and CLI commands translate arguments, call one function
//! here and shape the answer; nothing above this module writes SQL. Every state
//! change is one short transaction that validates first, writes second, and
//! records its audit row inside the same transaction.

// The domains.
pub mod conversations;
pub mod delivery;
pub mod identity;
pub mod messaging;
pub mod operations;
pub mod tasks;

// What every domain uses.
mod fenced;
pub mod limits;
mod long_poll;
pub mod requests;
pub use long_poll::Waited;
pub mod text;

use crate::error::{BusError, BusResult};

/// Who made a change, for the audit log.
#[derive(Clone, Debug)]
pub struct Actor {
    pub name: String,
    pub source: Source,
    /// The admin credential (`acsa_…`) the change rests on, when it came over
    /// `/admin`: [`audit::record`] re-checks it under its fence, so a change
    /// never commits after that credential's revocation.
    pub admin_credential: Option<uuid::Uuid>,
}

acs_wire::text_enum! {
    pub enum Source {
        Cli = "cli",
        Http = "http",
        Mcp = "mcp",
    }
}

impl Actor {
    /// The operator at a local terminal: `cli:<unix user>`.
    pub fn local_operator() -> Actor {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_else(|_| format!("uid{}", unsafe { libc::geteuid() }));
        Actor {
            name: format!("cli:{user}"),
            source: Source::Cli,
            admin_credential: None,
        }
    }
}

pub use acs_wire::label::address;

/// A transaction whose statements are planned with their own values. The
/// pool forces generic plans (`db::connect`); a rare statement that a generic
/// plan serves badly (search's words, a team's storage recount, whose
/// generic plan read 11 times the buffers) runs in one of these instead.
/// The setting goes with `BEGIN` in one round trip.
pub async fn custom_plans(
    pool: &sqlx::PgPool,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    pool.begin_with("BEGIN; SET LOCAL plan_cache_mode = force_custom_plan")
        .await
}

/// How a refusal names a window, so the reader knows exactly who holds what.
pub(crate) fn window_phrase(agent: &str, session: &str) -> String {
    if session.is_empty() {
        format!("agent `{agent}` in its shared session (no X-Crew-Session)")
    } else {
        format!("agent `{agent}` in window `{session}` (address {agent}/{session})")
    }
}

/// A time as refusals print it: RFC 3339, whole seconds, UTC.
pub(crate) fn at(time: chrono::DateTime<chrono::Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Whether `name` (already lower-cased) has the shape of the bus's names:
/// 1 to `max` bytes, an ASCII letter or digit first, then letters, digits
/// and the bytes of `also`.
pub(crate) fn is_name(name: &str, max: usize, also: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || also.contains(&b))
}

/// Team slugs: trimmed, lower-cased, `[a-z0-9][a-z0-9-]*`, at most 63 bytes.
pub fn normalize_team_slug(raw: &str) -> BusResult<String> {
    let slug = raw.trim().to_ascii_lowercase();
    if !is_name(&slug, 63, b"-") {
        return Err(BusError::invalid(format!(
            "team slug {} is not valid: use 1-63 lower-case ASCII letters, digits and `-`, \
             starting with a letter or digit (for example `acme-web`).",
            text::quote(raw)
        )));
    }
    Ok(slug)
}

/// Agent names: trimmed, lower-cased, `[a-z0-9][a-z0-9._-]*`, at most 64 bytes.
/// No `/`: it separates agent and window in an address.
pub fn normalize_agent_name(raw: &str) -> BusResult<String> {
    let name = raw.trim().to_ascii_lowercase();
    if !is_name(&name, 64, b"-_.") {
        return Err(BusError::invalid(format!(
            "agent name {} is not valid: use 1-64 lower-case ASCII letters, digits and `-_.`, \
             starting with a letter or digit (for example `alice-claude`). `/` is reserved for \
             addresses (`agent/window`).",
            text::quote(raw)
        )));
    }
    Ok(name)
}

/// Bytes of a display name (a team's name, a conversation's title), at most.
pub const DISPLAY_NAME_MAX_BYTES: usize = 200;

/// Free-text display names: one line ([`text::one_line`]), 1 to
/// [`DISPLAY_NAME_MAX_BYTES`] bytes.
pub fn check_display_name(what: &str, raw: &str) -> BusResult<String> {
    let name = text::one_line(what, raw)?;
    if name.is_empty() || name.len() > DISPLAY_NAME_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "{what} must be 1-{DISPLAY_NAME_MAX_BYTES} bytes of one-line text (got {} bytes); \
             nothing was changed. Give a shorter one.",
            name.len()
        )));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalised_or_refused() {
        assert_eq!(normalize_team_slug(" Acme-Web ").unwrap(), "acme-web");
        assert!(normalize_team_slug("-acme").is_err());
        assert!(normalize_team_slug("acme_web").is_err());
        assert!(normalize_team_slug("").is_err());
        assert_eq!(
            normalize_agent_name("Alice.Claude").unwrap(),
            "alice.claude"
        );
        assert!(normalize_agent_name("alice/claude").is_err());
        assert!(normalize_agent_name(&"a".repeat(65)).is_err());
        assert!(check_display_name("team name", " ").is_err());
    }
}
