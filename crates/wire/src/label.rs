//! The window label rule (`X-Crew-Session`, `--host-session`): the server
//! refuses by it, and the agent side checks a label before it asks.

/// The longest label, in bytes.
pub const SESSION_LABEL_MAX_BYTES: usize = 64;

/// A label as it is stored: trimmed, lower-cased, ASCII letters,
/// digits and `-_.:`, at most 64 bytes. Empty means the shared session.
pub fn normalize(raw: &str) -> Result<String, String> {
    let label = raw.trim().to_ascii_lowercase();
    if label.len() > SESSION_LABEL_MAX_BYTES {
        return Err(format!(
            "session label is {} bytes; the limit is {SESSION_LABEL_MAX_BYTES}. Use a short window \
             name such as `frontend` or `win-2`.",
            label.len()
        ));
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
            crate::text::quote(&bad.to_string())
        };
        return Err(format!(
            "session label {} contains {what}; a label may hold only ASCII letters, digits and \
             `-_.:` (at most {SESSION_LABEL_MAX_BYTES} bytes). Rename the window, e.g. `frontend`.",
            crate::text::quote(raw)
        ));
    }
    Ok(label)
}

/// An address: `agent` for the shared session, `agent/window` otherwise.
pub fn address(agent: &str, session: &str) -> String {
    if session.is_empty() {
        agent.to_string()
    } else {
        format!("{agent}/{session}")
    }
}
