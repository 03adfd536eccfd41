//! Credentials and who is calling.
//!
//! An agent token (`acs_` + 64 hex) *is* one agent of one team; it is stored
//! only as its SHA-256. The window (session) comes from `X-Crew-Session` and
//! partitions presence, claims and cursors; it never changes who the caller is.
//! The prefix of a credential is checked before any lookup, so a credential of
//! another class is refused with a message naming where it belongs.

use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::error::{BusError, BusResult};

pub const AGENT_TOKEN_PREFIX: &str = "acs_";
pub const SESSION_CREDENTIAL_PREFIX: &str = "acss_";
pub const ADMIN_CREDENTIAL_PREFIX: &str = "acsa_";
/// How many characters of a credential are kept for listings.
pub const DISPLAY_PREFIX_LEN: usize = 12;
pub const SESSION_LABEL_MAX_BYTES: usize = 64;

/// The caller of one MCP request, resolved from its credential before any tool runs.
#[derive(Clone, Debug)]
pub struct Identity {
    pub team_id: Uuid,
    pub team: String,
    pub agent_id: Uuid,
    pub agent: String,
    pub token_id: Uuid,
    /// The window label; `""` is the agent's shared session.
    pub session: String,
}

impl Identity {
    /// `agent` for the shared session, `agent/session` for a named window.
    pub fn address(&self) -> String {
        if self.session.is_empty() {
            self.agent.clone()
        } else {
            format!("{}/{}", self.agent, self.session)
        }
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
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let plaintext = format!("{AGENT_TOKEN_PREFIX}{}", hex::encode(bytes));
    NewSecret {
        sha256: digest(&plaintext),
        display_prefix: plaintext[..DISPLAY_PREFIX_LEN].to_string(),
        plaintext,
    }
}

pub fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Check a bearer credential's class and shape before anything is looked up.
/// Returns the digest of a well-formed agent token.
pub fn parse_agent_token(bearer: &str) -> BusResult<[u8; 32]> {
    if bearer.starts_with(ADMIN_CREDENTIAL_PREFIX) {
        return Err(BusError::unauthenticated(
            "an admin credential (acsa_…) cannot call /mcp: admin credentials manage teams, agents \
             and tokens over /admin only. Connect with an agent token (acs_…) issued by \
             `ai-crew-sync token issue --team T --agent A`.",
        ));
    }
    if bearer.starts_with(SESSION_CREDENTIAL_PREFIX) {
        return Err(BusError::unauthenticated(
            "session credentials (acss_…) are not accepted by this server version. Connect with \
             the agent token (acs_…) and name the window in the X-Crew-Session header.",
        ));
    }
    let Some(hex_part) = bearer.strip_prefix(AGENT_TOKEN_PREFIX) else {
        return Err(BusError::unauthenticated(
            "the bearer credential is not an agent token: agent tokens start with `acs_` followed \
             by 64 hex characters. Check the Authorization header of your MCP client config.",
        ));
    };
    if hex_part.len() != 64 || !hex_part.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BusError::unauthenticated(format!(
            "malformed agent token: expected `acs_` followed by 64 hex characters, got {} characters \
             after the prefix. Copy the whole token printed by `ai-crew-sync token issue`.",
            hex_part.len()
        )));
    }
    Ok(digest(&bearer.to_ascii_lowercase()))
}

/// Normalise an `X-Crew-Session` label: trimmed, lower-cased, ASCII letters,
/// digits and `-_.:`, at most 64 bytes. Empty means the shared session.
pub fn normalize_session_label(raw: &str) -> BusResult<String> {
    let label = raw.trim().to_ascii_lowercase();
    if label.len() > SESSION_LABEL_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "session label is {} bytes; the limit is {SESSION_LABEL_MAX_BYTES}. Use a short window \
             name such as `frontend` or `win-2`.",
            label.len()
        )));
    }
    if let Some(bad) = label
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        let what = if bad == '/' {
            "`/` (it separates agent and window in an address)".to_string()
        } else if bad.is_control() {
            "a control character".to_string()
        } else {
            format!("{bad:?}")
        };
        return Err(BusError::invalid(format!(
            "session label {raw:?} contains {what}; a label may hold only ASCII letters, digits and \
             `-_.:` (at most {SESSION_LABEL_MAX_BYTES} bytes). Rename the window, e.g. `frontend`."
        )));
    }
    Ok(label)
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
        assert_eq!(parse_agent_token(&t.plaintext).unwrap(), t.sha256);
        assert_eq!(t.display_prefix, &t.plaintext[..12]);
        assert!(
            parse_agent_token("acsa_whatever")
                .unwrap_err()
                .to_string()
                .contains("/admin")
        );
        assert!(parse_agent_token("acs_123").is_err());
        assert!(parse_agent_token("Bearer-ish").is_err());
    }
}
