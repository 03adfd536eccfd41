//! The LISTEN/NOTIFY hub: an event emitted on one replica reaches every
//! replica's subscribers; /health reports the listener.

use std::time::Duration;

use ai_crew_sync::events::{BusEvent, EventKind};
use serde_json::Value;
use uuid::Uuid;

use crate::support::{eventually, http_client, spawn_app};

#[tokio::test]
async fn an_event_emitted_on_one_replica_reaches_subscribers_on_another() {
    let first = spawn_app().await;
    let second = first.replica().spawn().await;
    let mut on_second = second.bus.events.subscribe();
    let mut on_first = first.bus.events.subscribe();

    // The listener attaches asynchronously; /health says when it is live.
    for app in [&first, &second] {
        eventually("the listener to be live (/health)", async || {
            let health: Value = http_client()
                .get(app.url("/health"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (health["events"] == "live").then_some(()).ok_or(health)
        })
        .await;
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

#[tokio::test]
async fn the_listener_reconnects_by_itself_and_events_flow_again() {
    let app = spawn_app().await;
    let health = |app: &crate::support::TestApp| {
        let url = app.url("/health");
        async move {
            let body: Value = http_client()
                .get(url)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            body["events"].as_str().unwrap().to_string()
        }
    };
    let live = async || health(&app).await == "live";
    eventually("the listener to be live", live).await;

    // Cut the LISTEN connection from the server side, as a failover would.
    let cut: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query ILIKE 'LISTEN%') cut",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(cut, 1, "one listener per process");
    eventually("the listener to be live again", live).await;

    let mut events = app.bus.events.subscribe();
    let team = Uuid::new_v4();
    let event = BusEvent::new(team, EventKind::Lock, "after-reconnect");
    // The listener may report live a moment before its LISTEN is back; keep
    // emitting until one arrives.
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            app.bus.events.emit(event.clone());
            if let Ok(Ok(got)) =
                tokio::time::timeout(Duration::from_millis(200), events.recv()).await
                && got.team_id == team
            {
                return got;
            }
        }
    })
    .await
    .expect("events flow again after the reconnect");
    assert_eq!(got.id, "after-reconnect");
}
