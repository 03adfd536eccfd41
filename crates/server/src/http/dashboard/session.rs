//! The dashboard's session cookie: who signed in, for which team, which
//! sign-in, until when, signed with HMAC-SHA256 under the server's dashboard
//! key.
//!
//! The cookie carries ids only ([`SignIn`]: the principal and its sign-in
//! row), never a credential, and is checked in constant time
//! ([`Mac::verify_slice`]). A valid signature is not enough: the handler
//! re-reads the principal and the sign-in row on every request
//! (`store::operations::dashboard::recheck`), so a revocation or a sign-out ends the
//! session at the next request, on every replica. The attributes keep the
//! cookie to this page: `HttpOnly` (no script reads it), `SameSite=Strict`
//! (no other site sends it), `Path=/dashboard` (so `/mcp` and `/admin` never
//! see it, and they take bearer credentials only anyway), and `Secure` unless
//! the operator serves the dashboard over plain http ([`DashboardCookie`]; a
//! request a TLS-terminating proxy marks `X-Forwarded-Proto: https` gets it
//! either way).

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use uuid::Uuid;

use crate::config::DashboardCookie;
use acs_store::store::operations::dashboard::{Principal, SignIn};

pub const COOKIE_NAME: &str = "crew_dashboard";
/// How long a dashboard sign-in lasts.
pub const LIFETIME: chrono::Duration = chrono::Duration::hours(8);
/// The shortest `--dashboard-secret` accepted.
pub const SECRET_MIN_CHARS: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// The key dashboard cookies are signed with.
#[derive(Clone)]
pub struct CookieKey(Vec<u8>);

impl CookieKey {
    /// The operator's secret, or 32 random bytes for this process.
    pub fn new(secret: Option<&str>) -> CookieKey {
        match secret {
            Some(secret) => CookieKey(secret.as_bytes().to_vec()),
            None => {
                let mut bytes = vec![0u8; 32];
                rand::rng().fill_bytes(&mut bytes);
                CookieKey(bytes)
            }
        }
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length")
    }

    /// The write token of one sign-in (`csrf` in a person's forms): the
    /// HMAC of the sign-in's id under this key, so it is known only to a
    /// page this server rendered for that sign-in, and ends with it.
    pub fn write_token(&self, session_id: Uuid) -> String {
        let mut mac = self.mac();
        mac.update(b"dashboard-write|");
        mac.update(session_id.as_bytes());
        URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }

    /// Whether `token` is the write token of `session_id`, compared in
    /// constant time ([`Mac::verify_slice`]).
    pub fn write_token_matches(&self, session_id: Uuid, token: &str) -> bool {
        let Ok(given) = URL_SAFE_NO_PAD.decode(token.trim()) else {
            return false;
        };
        let mut mac = self.mac();
        mac.update(b"dashboard-write|");
        mac.update(session_id.as_bytes());
        mac.verify_slice(&given).is_ok()
    }

    /// The cookie value for `sign_in`, good until `expires`.
    pub fn seal(&self, sign_in: SignIn, expires: chrono::DateTime<chrono::Utc>) -> String {
        let kind = sign_in.principal.kind();
        let (team, id) = match sign_in.principal {
            Principal::Agent { team_id, token_id } | Principal::Person { team_id, token_id } => {
                (team_id, token_id)
            }
            Principal::Admin {
                team_id,
                credential_id,
            } => (team_id, credential_id),
        };
        let payload = format!(
            "{kind}|{team}|{id}|{}|{}",
            sign_in.session_id,
            expires.timestamp()
        );
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        let signature = mac.finalize().into_bytes();
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(signature)
        )
    }

    /// The sign-in a cookie value names, if this key signed it and it has
    /// not expired.
    pub fn open(&self, value: &str) -> Option<SignIn> {
        let (payload, signature) = value.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        let mut mac = self.mac();
        mac.update(&payload);
        mac.verify_slice(&signature).ok()?;
        let payload = String::from_utf8(payload).ok()?;
        let mut parts = payload.split('|');
        let (kind, team, id, session, expires) = (
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
        );
        let expires: i64 = expires.parse().ok()?;
        if parts.next().is_some() || expires <= chrono::Utc::now().timestamp() {
            return None;
        }
        let team_id: Uuid = team.parse().ok()?;
        let id: Uuid = id.parse().ok()?;
        let session_id: Uuid = session.parse().ok()?;
        let principal = match kind {
            "agent" => Principal::Agent {
                team_id,
                token_id: id,
            },
            "admin" => Principal::Admin {
                team_id,
                credential_id: id,
            },
            "person" => Principal::Person {
                team_id,
                token_id: id,
            },
            _ => return None,
        };
        Some(SignIn {
            principal,
            session_id,
        })
    }
}

/// The value of our cookie in a request, if it carries one.
pub fn cookie_value(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value)
}

/// Whether the request reached us over https (through a proxy that says so).
pub fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// Whether the cookie set in answer to `request` is `Secure`.
fn secure(mode: DashboardCookie, request: &HeaderMap) -> &'static str {
    if mode == DashboardCookie::Secure || over_https(request) {
        "; Secure"
    } else {
        ""
    }
}

/// `Set-Cookie` for a fresh sign-in.
pub fn set_cookie(mode: DashboardCookie, request: &HeaderMap, value: &str) -> HeaderValue {
    let secure = secure(mode, request);
    let header = format!(
        "{COOKIE_NAME}={value}; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        LIFETIME.num_seconds()
    );
    HeaderValue::from_str(&header).expect("a cookie of base64url and fixed words")
}

/// `Set-Cookie` that makes the browser forget the sign-in.
pub fn clear_cookie(mode: DashboardCookie, request: &HeaderMap) -> HeaderValue {
    let secure = secure(mode, request);
    let header =
        format!("{COOKIE_NAME}=; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age=0{secure}");
    HeaderValue::from_str(&header).expect("fixed words")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_opens_only_under_its_key_untampered_and_unexpired() {
        let key = CookieKey::new(None);
        let principal = SignIn {
            principal: Principal::Agent {
                team_id: Uuid::new_v4(),
                token_id: Uuid::new_v4(),
            },
            session_id: Uuid::new_v4(),
        };
        let later = chrono::Utc::now() + LIFETIME;
        let sealed = key.seal(principal, later);
        assert_eq!(key.open(&sealed), Some(principal));
        assert_eq!(CookieKey::new(None).open(&sealed), None, "another key");
        let expired = key.seal(principal, chrono::Utc::now() - chrono::Duration::seconds(1));
        assert_eq!(key.open(&expired), None, "expired");

        // Swap the principal's kind but keep the signature.
        let (payload, signature) = sealed.split_once('.').unwrap();
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        let forged = URL_SAFE_NO_PAD.encode(text.replacen("agent", "admin", 1));
        assert_eq!(key.open(&format!("{forged}.{signature}")), None);
        assert_eq!(key.open("garbage"), None);

        let admin = SignIn {
            principal: Principal::Admin {
                team_id: Uuid::new_v4(),
                credential_id: Uuid::new_v4(),
            },
            session_id: Uuid::new_v4(),
        };
        let fixed = CookieKey::new(Some("a shared secret for every replica!!"));
        assert_eq!(fixed.open(&fixed.seal(admin, later)), Some(admin));

        let person = SignIn {
            principal: Principal::Person {
                team_id: Uuid::new_v4(),
                token_id: Uuid::new_v4(),
            },
            session_id: Uuid::new_v4(),
        };
        let sealed = key.seal(person, later);
        assert_eq!(key.open(&sealed), Some(person));
        // A person's cookie turned into an agent's no longer opens.
        let (payload, signature) = sealed.split_once('.').unwrap();
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        let forged = URL_SAFE_NO_PAD.encode(text.replacen("person", "agent", 1));
        assert_eq!(key.open(&format!("{forged}.{signature}")), None);
    }

    #[test]
    fn a_write_token_belongs_to_one_sign_in_under_one_key() {
        let key = CookieKey::new(None);
        let (one, other) = (Uuid::new_v4(), Uuid::new_v4());
        let token = key.write_token(one);
        assert!(key.write_token_matches(one, &token));
        assert!(!key.write_token_matches(other, &token), "another sign-in");
        assert!(
            !CookieKey::new(None).write_token_matches(one, &token),
            "another key"
        );
        assert!(!key.write_token_matches(one, ""));
        assert!(!key.write_token_matches(one, "not base64 !"));
    }
}
