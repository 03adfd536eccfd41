//! The proxy process ending: `kill -9` after it wrote a conversation inbox
//! reference to its spool and before the bus heard the confirmation, and
//! SIGTERM or SIGINT from a host that closes a conversation, and a bus that
//! stops answering just then.
//!
//! For the crash, the proxy reaches the bus through a relay that holds every
//! chunk a while, so the confirmation is still on its way when the test cuts
//! it off and kills the process; the bus must then still owe the delivery,
//! and the next proxy of the same host conversation must confirm it from the
//! spool, once.

use std::path::Path;
use std::time::Duration;

use ai_crew_sync::client::{spool, window_state};
use ai_crew_sync::store::identity::teams;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::proxy::{Driver, Machine, calls, closed, listed_window, paused_proxy};
use crate::support::proxy::Proxy;
use crate::support::{McpClient, eventually, spawn_app, test_actor};

/// The spool's records, one JSON value per line.
fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn a_proxy_killed_between_spooling_and_confirming_loses_no_reference_and_confirms_none_twice()
{
    let app = spawn_app().await;
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let relay = Proxy::start(app.addr).await;
    let machine = Machine::with_team_profiles(
        &format!("http://{}/mcp", relay.addr()),
        &[("work", "acme", "alice", &alice)],
    );
    let host = "conv-spool";
    let args = ["--host-session", host, "--inbox-poll-secs", "1"];
    let mut first = Driver::start(&machine.script(
        &args,
        json!([{"op": "call", "tool": "session_status"}, {"op": "pause"}]),
    ));
    let lines = first.until_pause().await;
    assert_eq!(calls(&lines)[0]["is_error"], false, "{lines:#?}");

    // alice's proxy window joins bob's conversation, as itself.
    let state = window_state::WindowState::load(machine.config.path(), host)
        .unwrap()
        .expect("the proxy keeps its window's record");
    let epoch = state.epoch.to_string();
    let window = McpClient::connect_with(
        &app.mcp_url(),
        &state.credential,
        &[("x-crew-session", &state.label), ("x-crew-epoch", &epoch)],
    )
    .await
    .unwrap();
    let conversation = bob
        .call(
            "create_conversation",
            json!({"title": "release", "private": true,
                   "invite": [format!("alice/{}", state.label)]}),
        )
        .await
        .unwrap()["id"]
        .clone();
    assert!(conversation.is_string(), "a conversation id");
    window
        .call(
            "join_conversation",
            json!({"conversation_id": conversation}),
        )
        .await
        .unwrap();

    // Every chunk between proxy and bus now waits 1.5 s in the relay.
    relay.delay(Duration::from_millis(1500));
    let sent = bob
        .call(
            "send_conversation_message",
            json!({"conversation_id": conversation, "body": "ship it?",
                   "request_id": Uuid::now_v7()}),
        )
        .await
        .unwrap();
    let message_id = sent["message_id"].as_str().unwrap().to_string();
    let spool_path = spool::path_for(machine.config.path(), &window_state::key_for(host)).unwrap();
    let spooled = |path: &Path| -> Option<String> {
        records(path).iter().find_map(|r| {
            (r["spooled"]["reference"]["message_id"] == message_id.as_str()).then(|| {
                r["spooled"]["reference"]["delivery_id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
        })
    };
    eventually("the reference is in the spool", async || {
        spooled(&spool_path).is_some()
    })
    .await;
    // The confirmation is in the relay now: drop it there, kill the proxy.
    relay.black_hole();
    // SAFETY: a signal to the proxy process this test started.
    assert_eq!(unsafe { libc::kill(state.pid as i32, libc::SIGKILL) }, 0);
    drop(first);

    let delivered = async || -> Option<chrono::DateTime<chrono::Utc>> {
        sqlx::query_scalar("SELECT r.delivered_at FROM message_receipts r WHERE r.message_id = $1")
            .bind(Uuid::parse_str(&message_id).unwrap())
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    assert_eq!(
        delivered().await,
        None,
        "killed between spooling and confirming: the bus still owes it"
    );
    let delivery_id = spooled(&spool_path).unwrap();
    let confirmations = |path: &Path| {
        records(path)
            .iter()
            .filter(|r| {
                r["confirmed"]["delivery_ids"]
                    .as_array()
                    .is_some_and(|ids| ids.iter().any(|id| id == delivery_id.as_str()))
            })
            .count()
    };
    assert_eq!(confirmations(&spool_path), 0);

    // The same host conversation starts again: the spool is confirmed first.
    relay.pass();
    let mut second = Driver::start(&machine.script(&args, json!([{"op": "pause"}])));
    second.until_pause().await;
    eventually("the spooled reference is confirmed", async || {
        delivered().await.is_some()
    })
    .await;
    // A few more polls: nothing is confirmed again, nothing spooled twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(confirmations(&spool_path), 1, "{:#?}", records(&spool_path));
    let spooled_times = records(&spool_path)
        .iter()
        .filter(|r| r["spooled"]["reference"]["delivery_id"] == delivery_id.as_str())
        .count();
    assert_eq!(spooled_times, 1);
    assert!(
        !std::fs::read_to_string(&spool_path)
            .unwrap()
            .contains("ship it?"),
        "never a body in the spool"
    );
}

/// A host ending a conversation sends SIGTERM (or SIGINT, from a terminal):
/// the proxy marks its window offline before it exits, so teammates do not
/// see a window that is gone as online for the rest of its presence ttl.
#[tokio::test]
async fn sigterm_or_sigint_ends_the_proxy_and_takes_its_window_offline() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let machine = Machine::with_team_profiles(&app.mcp_url(), &[("work", "acme", "alice", &alice)]);
    let bus = app.mcp(&alice, None).await;
    for (host, signal) in [("conv-term", libc::SIGTERM), ("conv-int", libc::SIGINT)] {
        let (driver, label) = paused_proxy(&machine, host).await;
        let state = async || {
            let window = listed_window(&bus, &label).await;
            json!([window["state"], window["status"]])
        };
        assert_eq!(state().await, json!(["online", "active"]), "{host}");

        let record = window_state::WindowState::load(machine.config.path(), host)
            .unwrap()
            .unwrap();
        // SAFETY: a signal to the proxy process this test started.
        assert_eq!(unsafe { libc::kill(record.pid as i32, signal) }, 0);
        eventually(&format!("{host}'s window is offline"), async || {
            let now = state().await;
            (now == json!(["offline", "idle"])).then_some(()).ok_or(now)
        })
        .await;
        drop(driver);
    }
}

/// A bus that stops answering never holds up the host at the end of a
/// conversation: the proxy gives the leaving heartbeat its bound, says it
/// did not get through, and exits on its own.
#[tokio::test]
async fn a_bus_that_stops_answering_does_not_keep_the_proxy_from_exiting() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let relay = Proxy::start(app.addr).await;
    let machine = Machine::with_team_profiles(
        &format!("http://{}/mcp", relay.addr()),
        &[("work", "acme", "alice", &alice)],
    );
    let (mut driver, label) = paused_proxy(&machine, "conv-dead-bus").await;
    let bus = app.mcp(&alice, None).await;
    assert_eq!(listed_window(&bus, &label).await["state"], "online");

    relay.black_hole();
    driver.resume().await;
    let lines = driver.rest().await;
    let stderr = closed(&lines)["stderr"].as_str().unwrap().to_string();
    assert!(
        stderr.contains("the bus did not take the leaving heartbeat in time; exiting anyway"),
        "{stderr}"
    );
    // The bus never heard it: the window is left to its ttl.
    assert_eq!(listed_window(&bus, &label).await["state"], "online");
}
