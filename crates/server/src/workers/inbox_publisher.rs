//! The inbox publisher: copies queued references of teams routed to
//! JetStream into the team's inbox stream, where each window's durable
//! consumer picks them up.
//!
//! PostgreSQL stays the record of what is owed; the broker is a faster path
//! to the window. A pass reads a batch with no lock held, publishes each
//! reference under its own id as `Nats-Msg-Id` (so two replicas publishing
//! the same reference make one stream entry), then records the stream
//! sequence only where nobody recorded one yet.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use acs_store::Bus;
use acs_store::error::BusResult;
use acs_store::store::conversations::inbox;

/// References published per pass, at most.
pub const BATCH: i64 = 500;
/// Time between passes when there was nothing to publish.
pub const IDLE: Duration = Duration::from_millis(500);

/// One pass; returns how many references were published.
pub async fn publish_once(bus: &Bus) -> BusResult<u64> {
    let Some(broker) = bus.backends.broker() else {
        return Ok(0);
    };
    let queued = inbox::unpublished(&bus.pool, BATCH).await?;
    let mut published = Vec::with_capacity(queued.len());
    // A team whose inbox stream refuses (not provisioned, full) is skipped
    // for the rest of the pass; the other teams' references still go out.
    let mut refusing = std::collections::HashSet::new();
    for reference in &queued {
        if refusing.contains(&reference.team_id) {
            continue;
        }
        let payload = serde_json::to_vec(&reference.delivery).unwrap_or_default();
        match broker
            .publish_inbox_reference(
                reference.team_id,
                &reference.recipient_key,
                reference.delivery.delivery_id,
                &payload,
            )
            .await
        {
            Ok(sequence) => published.push((reference.delivery.delivery_id, sequence)),
            Err(e) => {
                // Retried next pass; meanwhile the window gets everything
                // from PostgreSQL.
                tracing::debug!(error = %e, team = %reference.team_id,
                    "inbox publish failed; retrying next pass");
                refusing.insert(reference.team_id);
            }
        }
    }
    inbox::mark_published(&bus.pool, &published).await
}

/// Run [`publish_once`] until `shutdown`: again at once while there is work,
/// otherwise after [`IDLE`].
pub fn spawn(bus: Bus, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let busy = match publish_once(&bus).await {
                Ok(n) => n > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "inbox publisher pass failed; retrying");
                    false
                }
            };
            if busy {
                if shutdown.is_cancelled() {
                    return;
                }
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(IDLE) => {}
            }
        }
    })
}
