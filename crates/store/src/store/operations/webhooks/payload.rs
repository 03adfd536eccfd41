//! What a delivery sends. Generic hooks get a JSON envelope
//! `{id, webhook_id, team, event, occurred_at, data}`, signed with the hook's
//! secret over the send's timestamp and the exact body bytes
//! (`X-Bus-Timestamp: <unix seconds>`, `X-Bus-Signature: sha256=<hex>` of
//! `<timestamp>.<body>`): a receiver that refuses an old timestamp cannot be
//! fed a captured delivery again later;
//! Slack gets `{"text": …}`, Discord `{"content": …}`: one short line a
//! person reads, with mentions disabled so a message cannot ping a room.
//!
//! `data` is what the trigger stored (migration 0025), already without DMs,
//! conversation bodies or note values; nothing here adds content.

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use super::WebhookKind;
use super::delivery::Claimed;

/// Characters of a chat message (Discord refuses more than 2000).
const SUMMARY_MAX_CHARS: usize = 1_800;
/// Characters of a channel message's body a chat line quotes.
const QUOTE_MAX_CHARS: usize = 300;

/// The body to send, as bytes: the signature covers exactly these.
pub fn body(claimed: &Claimed) -> Vec<u8> {
    let value = match claimed.kind {
        WebhookKind::Generic => json!({
            "id": claimed.id,
            "webhook_id": claimed.webhook_id,
            "team": claimed.team,
            "event": claimed.event,
            "occurred_at": claimed.created_at,
            "data": claimed.payload,
        }),
        WebhookKind::Slack => json!({
            "text": slack_escape(&summary(&claimed.team, &claimed.event, &claimed.payload)),
        }),
        WebhookKind::Discord => json!({
            "content": summary(&claimed.team, &claimed.event, &claimed.payload),
            "allowed_mentions": { "parse": [] },
        }),
    };
    serde_json::to_vec(&value).expect("a JSON value serialises")
}

/// `sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" keyed with secret>`:
/// the timestamp (unix seconds, sent as `X-Bus-Timestamp`) is signed with
/// the body, so changing it breaks the signature, and a receiver that
/// refuses a stale one refuses a replayed capture. Each attempt is signed
/// anew with its own send time.
pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Slack reads `&`, `<` and `>` as markup (links, mentions).
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn field<'a>(data: &'a Value, name: &str) -> &'a str {
    data.get(name).and_then(Value::as_str).unwrap_or("?")
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut out: String = text.chars().take(max).collect();
        out.push('…');
        out
    }
}

/// One line a person reads in a chat room.
pub fn summary(team: &str, event: &str, data: &Value) -> String {
    let line = match event {
        "message.posted" | "announcement.posted" => {
            let body = clip(
                &field(data, "body").replace(['\n', '\r'], " "),
                QUOTE_MAX_CHARS,
            );
            let what = if event == "announcement.posted" {
                "announced"
            } else {
                "wrote"
            };
            format!(
                "#{} {} {what}: {body}",
                field(data, "channel"),
                field(data, "sender")
            )
        }
        _ if event.starts_with("task.") => format!(
            "task `{}` {} by {}: {}",
            field(data, "key"),
            event.trim_start_matches("task.").replace('_', " "),
            field(data, "by"),
            field(data, "title")
        ),
        "lock.acquired" => format!(
            "lock `{}` acquired by {}",
            field(data, "name"),
            field(data, "holder")
        ),
        "lock.released" => format!(
            "lock `{}` released by {}",
            field(data, "name"),
            field(data, "holder")
        ),
        _ if event.starts_with("note.") => format!(
            "note `{}/{}` {} by {} (revision {})",
            field(data, "scope"),
            field(data, "key"),
            if event == "note.delete" {
                "deleted"
            } else {
                "set"
            },
            field(data, "by"),
            data.get("revision").unwrap_or(&Value::Null)
        ),
        "conversation.created" => format!(
            "conversation “{}” (project {}) started by {}",
            field(data, "title"),
            field(data, "project"),
            field(data, "by")
        ),
        "conversation.member_joined" => format!(
            "{} joined conversation “{}” (project {})",
            field(data, "member"),
            field(data, "title"),
            field(data, "project")
        ),
        "conversation.message_sent" => format!(
            "{} sent message #{} in conversation “{}” (project {})",
            field(data, "sender"),
            data.get("seq").unwrap_or(&Value::Null),
            field(data, "title"),
            field(data, "project")
        ),
        other => other.to_owned(),
    };
    clip(&format!("[{team}] {line}"), SUMMARY_MAX_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_hex_of_timestamp_dot_body() {
        // Python: hmac.new(b"Jefe", b"1764900000.what do ya want for nothing?",
        // hashlib.sha256).hexdigest()
        assert_eq!(
            signature("Jefe", 1_764_900_000, b"what do ya want for nothing?"),
            "sha256=eb0388e42001310b72c166f20e4b252a81a0b9d083680290777f54abf4c54f97"
        );
        assert_ne!(
            signature("Jefe", 1_764_900_001, b"what do ya want for nothing?"),
            signature("Jefe", 1_764_900_000, b"what do ya want for nothing?"),
        );
    }

    #[test]
    fn summaries_are_one_short_line() {
        let data = json!({"channel": "general", "sender": "alice", "body": "a\nb".repeat(500)});
        let line = summary("acme", "message.posted", &data);
        assert!(line.starts_with("[acme] #general alice wrote: a b"));
        assert!(!line.contains('\n'));
        assert!(line.chars().count() < 400);
        assert_eq!(slack_escape("<@here> & co"), "&lt;@here&gt; &amp; co");
    }
}
