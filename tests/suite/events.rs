//! The LISTEN/NOTIFY hub: an event emitted on one replica reaches every
//! replica's subscribers; /health reports the listener.

use std::time::Duration;

use ai_crew_sync::events::{BusEvent, EventKind};
use serde_json::Value;
use uuid::Uuid;

use crate::support::{http_client, spawn_app};

#[tokio::test]
async fn an_event_emitted_on_one_replica_reaches_subscribers_on_another() {
    let first = spawn_app().await;
    let second = first.replica().await;
    let mut on_second = second.bus.events.subscribe();
    let mut on_first = first.bus.events.subscribe();

    // The listener attaches asynchronously; /health says when it is live.
    for app in [&first, &second] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let health: Value = http_client()
                .get(app.url("/health"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if health["events"] == "live" {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "listener never live: {health}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let team = Uuid::new_v4();
    let sent: Vec<BusEvent> = (0..300)
        .map(|i| BusEvent::new(team, EventKind::Note, format!("note-{i}")))
        .collect();
    for event in &sent {
        first.bus.events.emit(event.clone());
    }
    for receiver in [&mut on_second, &mut on_first] {
        let mut got = Vec::new();
        while got.len() < sent.len() {
            let event = tokio::time::timeout(Duration::from_secs(5), receiver.recv())
                .await
                .expect("every event arrives within 5 s")
                .unwrap();
            if event.team_id == team {
                got.push((*event).clone());
            }
        }
        assert_eq!(got, sent, "in order, none lost, none duplicated");
    }
}
