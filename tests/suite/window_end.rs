//! A window that ends releases what it holds (issue 37): the `session_end`
//! hook (a leaving heartbeat) releases its locks and path reservations at
//! once and its claimed tasks after a grace unless it comes back;
//! revocation releases everything (a token revoked or an agent disabled at
//! once, `revoke_session` unless the label is registered again at once, as a
//! restarted proxy does); the presence sweeper releases
//! the reservations of a window whose presence expired. And the Stop hook
//! blocks a stop once, naming what the window still holds.
//!
//! Hooks run as the real binary with Claude Code's JSON on stdin
//! (`hooks.rs`'s helpers), against a real server; reservations are taken
//! with `reserve_paths` and seen with `list_reservations`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::hooks::{hook, payload, proxy_window};
use crate::support::{McpClient, TestApp, eventually, in_team, spawn_app};
use ai_crew_sync::store::identity::agents;
use ai_crew_sync::workers::departures::DepartureSettings;
use ai_crew_sync::workers::presence_sweeper;

/// `reserve_paths` of `pattern` (exclusive) by `window`.
async fn reserve(window: &McpClient, pattern: &str) {
    window
        .call(
            "reserve_paths",
            json!({"paths": [pattern], "ttl_seconds": 3600, "reason": "editing"}),
        )
        .await
        .unwrap();
}

/// The patterns window `holder` (`agent/window`) holds, as
/// `list_reservations` shows them to `reader`.
async fn reservations_of(reader: &McpClient, holder: &str) -> Vec<String> {
    let listed = reader.call("list_reservations", json!({})).await.unwrap();
    listed["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["holder"] == holder)
        .map(|r| r["pattern"].as_str().unwrap().to_string())
        .collect()
}

async fn create_and_claim(planner: &McpClient, window: &McpClient, key: &str) {
    planner
        .call(
            "create_task",
            json!({"key": key, "title": format!("do {key}")}),
        )
        .await
        .unwrap();
    window
        .call("claim_task", json!({"key": key, "lease_seconds": 3600}))
        .await
        .unwrap();
}

fn lock_names(listed: &Value) -> Vec<&str> {
    listed["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect()
}

fn session_end(host: &str) -> String {
    payload(host, "SessionEnd", json!({"reason": "prompt_input_exit"}))
}

/// The last event of task `key`, as `get_task` shows it.
async fn last_event(client: &McpClient, key: &str) -> (Value, Value) {
    let task = client.call("get_task", json!({"key": key})).await.unwrap();
    let last = task["events"].as_array().unwrap().last().unwrap().clone();
    (task, last)
}

#[tokio::test]
async fn session_end_releases_the_windows_locks_and_reservations_at_once_and_marks_it_idle() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, window) = proxy_window(&app, &alice, "cc-1", "cc-one", config.path()).await;
    window
        .call("acquire_lock", json!({"name": "deploy:prod"}))
        .await
        .unwrap();
    reserve(&window, "src/api/**").await;
    create_and_claim(&bob, &window, "T-1").await;
    // Another window of alice keeps what it holds.
    let (_, other) = proxy_window(&app, &alice, "cc-9", "cc-nine", config.path()).await;
    other
        .call("acquire_lock", json!({"name": "docs"}))
        .await
        .unwrap();
    reserve(&other, "docs/**").await;

    let waiter = tokio::spawn(async move {
        let woke = bob
            .call(
                "wait_for_updates",
                json!({"kinds": ["lock"], "timeout_seconds": 30}),
            )
            .await
            .unwrap();
        (bob, woke)
    });
    app.until_waiting(1).await;
    let ended = hook(config.path(), "session_end", session_end("cc-1")).await;
    assert_eq!(
        (ended.code, ended.stdout.as_str()),
        (Some(0), ""),
        "{ended:?}"
    );

    let (bob, woke) = waiter.await.unwrap();
    assert_eq!(woke["woke"], true, "{woke}");
    assert_eq!(woke["events"][0]["kind"], "lock", "{woke}");
    assert_eq!(woke["events"][0]["id"], "deploy:prod", "{woke}");
    assert_eq!(woke["events"][0]["by"], "alice/cc-one", "{woke}");
    let locks = bob.call("list_locks", json!({})).await.unwrap();
    assert_eq!(lock_names(&locks), ["docs"], "{locks}");
    assert!(reservations_of(&bob, "alice/cc-one").await.is_empty());
    assert_eq!(reservations_of(&bob, "alice/cc-nine").await, ["docs/**"]);
    // Its claimed task waits for the grace: a resumed conversation keeps it.
    let (task, _) = last_event(&bob, "T-1").await;
    assert_eq!(task["status"], "claimed", "{task}");

    let sessions = bob.call("list_sessions", json!({})).await.unwrap();
    let mine = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["address"] == "alice/cc-one")
        .unwrap_or_else(|| panic!("{sessions}"))
        .clone();
    assert_eq!(
        (mine["status"].as_str(), mine["state"].as_str()),
        (Some("idle"), Some("offline")),
        "{mine}"
    );
}

#[tokio::test]
async fn a_claimed_task_is_released_after_the_grace_with_a_note_unless_the_window_comes_back() {
    let app = TestApp::builder()
        .departures(DepartureSettings {
            interval: Duration::from_millis(200),
            grace: Duration::from_secs(2),
            ..DepartureSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, back) = proxy_window(&app, &alice, "cc-b", "cc-back", config.path()).await;
    let (_, gone) = proxy_window(&app, &alice, "cc-g", "cc-gone", config.path()).await;
    create_and_claim(&bob, &back, "T-back").await;
    create_and_claim(&bob, &gone, "T-gone").await;

    // cc-back leaves first and comes back within the grace (its proxy beats
    // at start); cc-gone leaves after it and stays away.
    hook(config.path(), "session_end", session_end("cc-b")).await;
    back.call("heartbeat", json!({})).await.unwrap();
    hook(config.path(), "session_end", session_end("cc-g")).await;

    let (task, released) = eventually("T-gone released after the grace", async || {
        let (task, last) = last_event(&bob, "T-gone").await;
        (task["status"] == "open").then_some((task, last))
    })
    .await;
    assert_eq!(released["kind"], "released", "{task}");
    assert_eq!(released["by"], "alice/cc-gone", "{task}");
    assert_eq!(released["detail"]["released_by"], "bus", "{task}");
    assert_eq!(released["detail"]["why"], "session_end", "{task}");
    let note = released["detail"]["note"].as_str().unwrap();
    assert!(
        note.contains("alice/cc-gone") && note.contains("within 2 s"),
        "{note}"
    );
    // Every pass since cc-gone's grace ran out also saw cc-back's, which ran
    // out earlier: it came back, so it keeps its task.
    let (kept, _) = last_event(&bob, "T-back").await;
    assert_eq!(kept["status"], "claimed", "{kept}");
    assert_eq!(kept["holder"]["address"], "alice/cc-back", "{kept}");
    // The task is free for anyone again.
    let claimed = bob
        .call("claim_task", json!({"key": "T-gone"}))
        .await
        .unwrap();
    assert_eq!(claimed["status"], "claimed", "{claimed}");
}

#[tokio::test]
async fn a_revoked_window_releases_what_it_holds_unless_its_label_is_registered_again_at_once() {
    let app = TestApp::builder()
        .departures(DepartureSettings {
            interval: Duration::from_millis(200),
            revoked_settle: Duration::from_secs(1),
            ..DepartureSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, taken) = proxy_window(&app, &alice, "cc-t", "cc-taken", config.path()).await;
    let (_, window) = proxy_window(&app, &alice, "cc-r", "cc-rev", config.path()).await;
    create_and_claim(&bob, &taken, "T-taken").await;
    taken
        .call("acquire_lock", json!({"name": "docs"}))
        .await
        .unwrap();
    window
        .call("acquire_lock", json!({"name": "schema"}))
        .await
        .unwrap();
    reserve(&window, "migrations/**").await;
    create_and_claim(&bob, &window, "T-rev").await;

    // A restarted proxy takes its window over: revoke, then register the
    // same label at once. It keeps what the window holds.
    let owner = app.mcp(&alice, None).await;
    owner
        .call("revoke_session", json!({"session": "cc-taken"}))
        .await
        .unwrap();
    owner
        .call("register_session", json!({"session": "cc-taken"}))
        .await
        .unwrap();
    owner
        .call("revoke_session", json!({"session": "cc-rev"}))
        .await
        .unwrap();

    let (task, last) = eventually("T-rev released after the revocation", async || {
        let (task, last) = last_event(&bob, "T-rev").await;
        (task["status"] == "open").then_some((task, last))
    })
    .await;
    assert_eq!(last["kind"], "released", "{task}");
    assert_eq!(last["by"], "alice/cc-rev", "{task}");
    assert_eq!(last["detail"]["why"], "session_revoked", "{task}");
    assert!(
        last["detail"]["note"]
            .as_str()
            .unwrap()
            .contains("window alice/cc-rev was revoked"),
        "{task}"
    );
    let locks = bob.call("list_locks", json!({})).await.unwrap();
    assert_eq!(lock_names(&locks), ["docs"], "{locks}");
    assert!(reservations_of(&bob, "alice/cc-rev").await.is_empty());
    // cc-taken was revoked first and its settle ran out before cc-rev's: the
    // pass that released cc-rev saw it registered again.
    let (kept, _) = last_event(&bob, "T-taken").await;
    assert_eq!(kept["holder"]["address"], "alice/cc-taken", "{kept}");
}

#[tokio::test]
async fn disabling_an_agent_releases_what_every_window_of_it_held() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, one) = proxy_window(&app, &alice, "cc-1", "one", config.path()).await;
    let (_, two) = proxy_window(&app, &alice, "cc-2", "two", config.path()).await;
    create_and_claim(&bob, &one, "T-1").await;
    two.call("acquire_lock", json!({"name": "release"}))
        .await
        .unwrap();
    reserve(&two, "Cargo.lock").await;

    agents::set_disabled(&app.pool, &in_team("acme"), "alice", true)
        .await
        .unwrap();

    let (task, last) = last_event(&bob, "T-1").await;
    assert_eq!(task["status"], "open", "{task}");
    assert_eq!(last["detail"]["why"], "agent_disabled", "{task}");
    let locks = bob.call("list_locks", json!({})).await.unwrap();
    assert!(lock_names(&locks).is_empty(), "{locks}");
    assert!(reservations_of(&bob, "alice/two").await.is_empty());
}

#[tokio::test]
async fn the_presence_sweeper_releases_the_reservations_of_a_window_whose_presence_expired() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let idle = app.mcp(&alice, Some("idle")).await;
    let busy = app.mcp(&alice, Some("busy")).await;
    idle.call("heartbeat", json!({"ttl_seconds": 30}))
        .await
        .unwrap();
    busy.call("heartbeat", json!({"ttl_seconds": 600}))
        .await
        .unwrap();
    reserve(&idle, "src/**").await;
    reserve(&busy, "tests/**").await;
    // The idle window stopped beating a while ago: its ttl ran out.
    sqlx::query(
        "UPDATE presence SET last_seen_at = now() - interval '40 seconds',
                             expires_at = now() - interval '10 seconds'
         WHERE session = 'idle'",
    )
    .execute(&app.pool)
    .await
    .unwrap();

    let deleted = presence_sweeper::release_reservations(&app.pool, 500)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(reservations_of(&busy, "alice/idle").await.is_empty());
    assert_eq!(reservations_of(&busy, "alice/busy").await, ["tests/**"]);
}

#[tokio::test]
async fn the_stop_hook_blocks_once_naming_what_the_window_holds_and_never_twice_in_a_row() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, window) = proxy_window(&app, &alice, "cc-s", "cc-stop", config.path()).await;
    let stop = |active: bool| payload("cc-s", "Stop", json!({"stop_hook_active": active}));
    let block_reason = |run: &crate::hooks::HookRun| -> String {
        assert_eq!(run.code, Some(0), "{run:?}");
        let out: Value = serde_json::from_str(run.stdout.trim())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"));
        assert_eq!(out["decision"], "block", "{out}");
        out["reason"].as_str().unwrap().to_string()
    };

    create_and_claim(&bob, &window, "T-7").await;
    window
        .call("acquire_lock", json!({"name": "deploy:prod"}))
        .await
        .unwrap();
    reserve(&window, "src/api/**").await;

    let blocked = hook(config.path(), "stop", stop(false)).await;
    let reason = block_reason(&blocked);
    for named in [
        "T-7",
        "release_task",
        "complete_task",
        "deploy:prod",
        "release_lock",
        "src/api/**",
        "release_paths",
        "alice/cc-stop",
    ] {
        assert!(reason.contains(named), "{named} missing: {reason}");
    }
    // The host continues because of that block: never block that stop.
    let continuing = hook(config.path(), "stop", stop(true)).await;
    assert_eq!(continuing.stdout, "", "{continuing:?}");
    // The next stop finds the same holdings: not blocked twice in a row.
    let same = hook(config.path(), "stop", stop(false)).await;
    assert_eq!((same.code, same.stdout.as_str()), (Some(0), ""), "{same:?}");

    // Something new to hand back is worth one more block, naming it.
    window
        .call("release_lock", json!({"name": "deploy:prod"}))
        .await
        .unwrap();
    let asked = bob
        .call(
            "ask_agent",
            json!({"to": "alice/cc-stop", "question": "can I take T-7?", "timeout_seconds": 1}),
        )
        .await
        .unwrap();
    let question = asked["question_message_id"].as_str().unwrap().to_string();
    let again = hook(config.path(), "stop", stop(false)).await;
    let reason = block_reason(&again);
    assert!(
        reason.contains("can I take T-7?") && reason.contains(&question),
        "{reason}"
    );
    assert!(
        reason.contains("T-7") && !reason.contains("deploy:prod"),
        "{reason}"
    );

    // Everything handed back and answered: the stop goes through.
    window
        .call("release_task", json!({"key": "T-7"}))
        .await
        .unwrap();
    window.call("release_paths", json!({})).await.unwrap();
    let calm = hook(config.path(), "stop", stop(false)).await;
    assert_eq!((calm.code, calm.stdout.as_str()), (Some(0), ""), "{calm:?}");
}
