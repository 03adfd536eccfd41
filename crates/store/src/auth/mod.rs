//! Credentials and who is calling.
//!
//! An agent token (`acs_` + 64 hex) *is* one agent of one team; it is stored
//! only as its SHA-256. The window (session) comes from `X-Crew-Session` and
//! partitions presence, claims and cursors; it never changes who the caller is.
//! The prefix of a credential is checked before any lookup, so a credential of
//! another class is refused with a message naming where it belongs.

pub mod cache;

use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::error::{BusError, BusResult};

pub const AGENT_TOKEN_PREFIX: &str = "acs_";
pub const SESSION_CREDENTIAL_PREFIX: &str = "acss_";
pub const ADMIN_CREDENTIAL_PREFIX: &str = "acsa_";
/// How many characters of a credential are kept for listings.
pub const DISPLAY_PREFIX_LEN: usize = 12;
pub use acs_wire::label::SESSION_LABEL_MAX_BYTES;

/// The caller of one MCP request, resolved from its credential before any tool runs.
#[derive(Clone, Debug)]
pub struct Identity {
    pub team_id: Uuid,
    pub team: String,
    pub agent_id: Uuid,
    pub agent: String,
    /// The agent token the call rests on (directly, or as a session's parent).
    pub token_id: Uuid,
    /// The window label; `""` is the agent's shared session.
    pub window: String,
    /// Set when the caller used a session credential: which row, at which epoch.
    pub session_credential: Option<SessionCredential>,
}

/// A session credential as it was when the request authenticated. Mutations
/// re-check it inside their own transaction ([`crate::store::identity::sessions::guard`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionCredential {
    pub session_id: Uuid,
    pub epoch: i64,
}

impl Identity {
    /// `agent` for the shared session, `agent/session` for a named window.
    pub fn address(&self) -> String {
        acs_wire::label::address(&self.agent, &self.window)
    }
}

/// A freshly minted secret: shown once, stored only as its digest.
pub struct NewSecret {
    pub plaintext: String,
    pub sha256: [u8; 32],
    pub display_prefix: String,
}

/// `acs_` followed by 32 random bytes in lower-case hex.
pub fn new_agent_token() -> NewSecret {
    new_secret(AGENT_TOKEN_PREFIX)
}

/// `prefix` followed by 32 random bytes in lower-case hex; every credential
/// class has this shape, only the prefix differs.
pub fn new_secret(prefix: &str) -> NewSecret {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let plaintext = format!("{prefix}{}", hex::encode(bytes));
    NewSecret {
        sha256: digest(&plaintext),
        display_prefix: plaintext[..DISPLAY_PREFIX_LEN].to_string(),
        plaintext,
    }
}

pub fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// A credential presented to `/mcp`, checked for class and shape only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentCredential {
    /// The digest of an agent token (`acs_…`).
    Token([u8; 32]),
    /// The digest of a session credential (`acss_…`).
    Session([u8; 32]),
}

/// Check a bearer credential's class and shape before anything is looked up.
pub fn parse_agent_credential(bearer: &str) -> BusResult<AgentCredential> {
    if bearer.starts_with(ADMIN_CREDENTIAL_PREFIX) {
        return Err(BusError::unauthenticated(
            "an admin credential (acsa_…) cannot call /mcp: admin credentials manage teams, agents \
             and tokens over /admin only. Connect with an agent token (acs_…) or a session \
             credential (acss_…).",
        ));
    }
    if let Some(rest) = bearer.strip_prefix(SESSION_CREDENTIAL_PREFIX) {
        return Ok(AgentCredential::Session(well_formed(
            "session credential",
            SESSION_CREDENTIAL_PREFIX,
            rest,
            bearer,
        )?));
    }
    let Some(rest) = bearer.strip_prefix(AGENT_TOKEN_PREFIX) else {
        return Err(BusError::unauthenticated(
            "the bearer credential is not an agent token: agent tokens start with `acs_` followed \
             by 64 hex characters. Check the Authorization header of your MCP client config.",
        ));
    };
    Ok(AgentCredential::Token(well_formed(
        "agent token",
        AGENT_TOKEN_PREFIX,
        rest,
        bearer,
    )?))
}

/// Check an `/admin` bearer credential; agent tokens and session credentials
/// are refused with a message naming where they belong.
pub fn parse_admin_credential(bearer: &str) -> BusResult<[u8; 32]> {
    if bearer.starts_with(SESSION_CREDENTIAL_PREFIX) || bearer.starts_with(AGENT_TOKEN_PREFIX) {
        return Err(BusError::unauthenticated(
            "agent tokens (acs_…) and session credentials (acss_…) call /mcp; /admin needs an \
             admin credential (acsa_…). `ai-crew-sync admin bootstrap` mints the first one; a \
             global admin grants more with `ai-crew-sync admin grant`.",
        ));
    }
    let Some(rest) = bearer.strip_prefix(ADMIN_CREDENTIAL_PREFIX) else {
        return Err(BusError::unauthenticated(
            "the bearer credential is not an admin credential: those start with `acsa_` followed \
             by 64 hex characters.",
        ));
    };
    well_formed("admin credential", ADMIN_CREDENTIAL_PREFIX, rest, bearer)
}

fn well_formed(what: &str, prefix: &str, hex_part: &str, whole: &str) -> BusResult<[u8; 32]> {
    if hex_part.len() != 64 || !hex_part.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BusError::unauthenticated(format!(
            "malformed {what}: expected `{prefix}` followed by 64 hex characters, got {} characters \
             after the prefix. Copy the whole credential as it was printed.",
            hex_part.len()
        )));
    }
    Ok(digest(&whole.to_ascii_lowercase()))
}

/// Parse `X-Crew-Epoch`: a positive integer.
pub fn parse_epoch(raw: &str) -> BusResult<i64> {
    raw.trim().parse::<i64>().ok().filter(|e| *e >= 1).ok_or_else(|| {
        BusError::invalid(format!(
            "X-Crew-Epoch must be a positive integer (the epoch register_session or resume_session \
             returned); got {}. Omit the header to skip the check.",
            acs_wire::text::quote(raw)
        ))
    })
}

/// Normalise an `X-Crew-Session` label ([`acs_wire::label::normalize`]: the
/// agent side applies the same rule before it asks).
pub fn normalize_session_label(raw: &str) -> BusResult<String> {
    acs_wire::label::normalize(raw).map_err(BusError::invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_labels_are_normalised_or_refused() {
        assert_eq!(
            normalize_session_label("  Front-End ").unwrap(),
            "front-end"
        );
        assert_eq!(normalize_session_label("").unwrap(), "");
        assert_eq!(normalize_session_label("a.b:c_d").unwrap(), "a.b:c_d");
        assert!(normalize_session_label("a/b").is_err());
        assert!(normalize_session_label("a\u{7}b").is_err());
        assert!(normalize_session_label("é").is_err());
        assert!(normalize_session_label(&"x".repeat(65)).is_err());
        assert!(normalize_session_label(&"x".repeat(64)).is_ok());
    }

    #[test]
    fn tokens_have_the_documented_shape_and_classes_do_not_cross() {
        let t = new_agent_token();
        assert_eq!(t.plaintext.len(), 4 + 64);
        assert_eq!(
            parse_agent_credential(&t.plaintext).unwrap(),
            AgentCredential::Token(t.sha256)
        );
        assert_eq!(t.display_prefix, &t.plaintext[..12]);
        let s = new_secret(SESSION_CREDENTIAL_PREFIX);
        assert_eq!(
            parse_agent_credential(&s.plaintext).unwrap(),
            AgentCredential::Session(s.sha256)
        );
        let admin_on_mcp = parse_agent_credential("acsa_whatever").unwrap_err();
        assert!(admin_on_mcp.to_string().contains("/admin"));
        assert!(parse_agent_credential("acs_123").is_err());
        assert!(parse_agent_credential("Bearer-ish").is_err());
        let a = new_secret(ADMIN_CREDENTIAL_PREFIX);
        assert_eq!(parse_admin_credential(&a.plaintext).unwrap(), a.sha256);
        assert!(
            parse_admin_credential(&t.plaintext)
                .unwrap_err()
                .to_string()
                .contains("/mcp")
        );
        assert!(parse_epoch("0").is_err() && parse_epoch("x").is_err());
        assert_eq!(parse_epoch(" 3 ").unwrap(), 3);
    }
}
