//! The durable inbox: references owed to a recipient window ("message M, seq
//! S, from X, is in conversation C"; "your message M was acknowledged by Y"),
//! never a body.
//!
//! A reference is queued in the transaction that makes it true: at
//! confirmation for an outbox message (no reference to a message nobody
//! stored), at ack for a receipt reference. PostgreSQL never expires what is
//! owed, so whatever a broker loses is rebuilt from here and from
//! `message_receipts`.

use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::error::BusResult;

/// The deterministic key of a recipient window: the first 16 bytes of
/// SHA-256 over "<agent id>/<session label>", as 32 hex digits. It survives
/// re-registration of the window (same agent, same label), and names the
/// window's subject and consumer on a broker without exposing either.
pub fn recipient_key(agent_id: Uuid, session: &str) -> String {
    let digest = Sha256::digest(format!("{agent_id}/{session}").as_bytes());
    hex::encode(&digest[..16])
}

/// [`recipient_key`] in SQL, over columns `agent` and `session`.
macro_rules! recipient_key_sql {
    ($agent:literal, $session:literal) => {
        concat!(
            "encode(substring(sha256(convert_to(",
            $agent,
            "::text || '/' || ",
            $session,
            ", 'UTF8')) FROM 1 FOR 16), 'hex')"
        )
    };
}

/// Queue one message reference per frozen recipient of each message (given
/// as `(team_id, message_id)`). Called in the transaction that records the
/// messages as stored; a second call queues nothing new.
pub async fn enqueue_message_references(
    tx: &mut sqlx::PgConnection,
    messages: &[(Uuid, Uuid)],
) -> BusResult<u64> {
    let teams: Vec<Uuid> = messages.iter().map(|m| m.0).collect();
    let ids: Vec<Uuid> = messages.iter().map(|m| m.1).collect();
    let queued = sqlx::query(concat!(
        "INSERT INTO inbox_references
             (id, team_id, recipient_key, recipient_id, recipient_session, kind,
              conversation_id, message_id, seq, actor)
         SELECT gen_random_uuid(), r.team_id, ",
        recipient_key_sql!("r.recipient_id", "r.recipient_session"),
        ", r.recipient_id, r.recipient_session, 'message', m.conversation_id, m.id, m.seq,
                CASE WHEN m.sender_session = '' THEN a.name ELSE a.name || '/' || m.sender_session END
           FROM unnest($1::uuid[], $2::uuid[]) AS s(team_id, message_id)
           JOIN message_receipts r ON r.team_id = s.team_id AND r.message_id = s.message_id
           JOIN conversation_messages m ON m.team_id = r.team_id AND m.id = r.message_id
           JOIN agents a ON a.team_id = m.team_id AND a.id = m.sender_id
         ON CONFLICT DO NOTHING"
    ))
    .bind(&teams)
    .bind(&ids)
    .execute(tx)
    .await?;
    Ok(queued.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipient_key_is_32_hex_and_depends_on_both_parts() {
        let agent = Uuid::nil();
        let key = recipient_key(agent, "laptop");
        assert_eq!(key.len(), 32);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(key, recipient_key(agent, "laptop"));
        assert_ne!(key, recipient_key(agent, "desktop"));
        assert_ne!(key, recipient_key(Uuid::from_u128(1), "laptop"));
    }
}
