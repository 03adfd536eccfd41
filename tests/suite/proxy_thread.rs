//! `mcp proxy` started with no `--host-session` and no
//! `CLAUDE_CODE_SESSION_ID` (the Python SDK starts servers with a minimal
//! environment, so the test's own environment does not leak in): the host
//! conversation is the thread the first tool call names in its `_meta`, as
//! Codex (`threadId`) and OpenCode (`sessionID`) send it.

use ai_crew_sync::client::{spool, window_state};
use ai_crew_sync::proxy::window::label_for;
use serde_json::{Value, json};

use crate::conversations::team_with_conversations;
use crate::proxy::{Driver, Machine, calls, closed};
use crate::support::{eventually, spawn_app};

/// The `session_status` answer among a run's calls, the `n`th one.
fn status(lines: &[Value], n: usize) -> Value {
    calls(lines)
        .into_iter()
        .filter(|c| c["tool"] == "session_status")
        .nth(n)
        .unwrap_or_else(|| panic!("session_status #{n} in {lines:#?}"))["structured"]
        .clone()
}

/// The files in `dir` (none when it does not exist).
fn files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn the_first_calls_thread_id_picks_the_window_and_a_restart_of_that_thread_finds_it() {
    let app = spawn_app().await;
    // Conversations on, so the inbox loop polls (and opens its spool) each second.
    team_with_conversations(&app, "acme").await;
    let alice = app.agent("acme", "alice").await;
    let bus = app.mcp(&alice, None).await;
    for key in ["T-1", "T-2"] {
        bus.call("create_task", json!({"key": key, "title": "Fix it"}))
            .await
            .unwrap();
    }
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let poll = ["--inbox-poll-secs", "1"];
    let config = machine.config.path().to_path_buf();

    // Thread A: the first call is a claim; it runs in A's window, not in the
    // provisional one the proxy held until then.
    let mut a = Driver::start(&machine.script(
        &poll,
        json!([
            {"op": "call", "tool": "claim_task", "arguments": {"key": "T-1"}, "meta": {"threadId": "A"}},
            {"op": "call", "tool": "session_status", "meta": {"threadId": "A"}},
            {"op": "pause"},
            {"op": "call", "tool": "session_status", "meta": {"threadId": "Z"}},
        ]),
    ));
    let first = a.until_pause().await;
    let instructions = first[0]["instructions"].as_str().unwrap();
    assert!(instructions.contains("provisional"), "{instructions}");
    assert_eq!(calls(&first)[0]["is_error"], false, "{first:#?}");
    let label_a = label_for("A");
    let seen = status(&first, 0);
    assert_eq!(seen["label"], label_a.as_str(), "{seen}");
    assert_eq!(seen["label_from"], "_meta.threadId of the first tool call");
    let task = bus.call("get_task", json!({"key": "T-1"})).await.unwrap();
    assert_eq!(task["holder"]["session"], label_a.as_str(), "{task}");

    // The provisional window was revoked: no listing shows it, not even
    // with `all`; the dashboard neither (its data).
    let listed_a = vec![format!("alice/{label_a}")];
    eventually("only A's window is listed", async || {
        let sessions = bus
            .call("list_sessions", json!({"all": true}))
            .await
            .unwrap();
        let listed: Vec<String> = sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["address"].as_str().unwrap().to_string())
            .collect();
        (listed == listed_a).then_some(()).ok_or(listed)
    })
    .await;
    let agents = bus.call("list_agents", json!({"all": true})).await.unwrap();
    let alice_windows: Vec<&Value> = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["agent"] == "alice")
        .flat_map(|a| a["windows"].as_array().unwrap())
        .collect();
    assert_eq!(alice_windows.len(), 1, "{agents}");
    assert_eq!(alice_windows[0]["session"], label_a.as_str(), "{agents}");

    // The record for the hooks and the inbox spool follow the thread; the
    // provisional window's are gone.
    let record = window_state::WindowState::load(&config, "A").unwrap();
    assert_eq!(record.map(|r| r.label), Some(label_a.clone()));
    let windows = files(&config.join("windows"));
    assert_eq!(windows, [format!("{}.json", window_state::key_for("A"))]);
    let spool_a = spool::path_for(&config, &window_state::key_for("A")).unwrap();
    let only_a = [format!("{}.jsonl", window_state::key_for("A"))];
    eventually(
        &format!("only A's spool at {}", spool_a.display()),
        async || {
            let spools = files(&config.join("spool"));
            (spools == only_a).then_some(()).ok_or(spools)
        },
    )
    .await;

    // Another thread later: one proxy, one conversation.
    a.resume().await;
    let rest = a.rest().await;
    assert_eq!(status(&rest, 0)["label"], label_a.as_str(), "{rest:#?}");
    // The move changed no tool: nothing to tell the host.
    assert_eq!(closed(&rest)["notifications"], json!([]), "{rest:#?}");
    let stderr = closed(&rest)["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("one proxy serves one conversation"),
        "{stderr}"
    );

    // Thread B (OpenCode's key): another window.
    let b = machine
        .drive(
            &poll,
            json!([
                {"op": "call", "tool": "claim_task", "arguments": {"key": "T-2"}, "meta": {"sessionID": "B"}},
                {"op": "call", "tool": "session_status"},
            ]),
        )
        .await;
    let label_b = status(&b, 0)["label"].as_str().unwrap().to_string();
    assert_eq!(label_b, label_for("B"));
    assert_ne!(label_a, label_b);
    let task = bus.call("get_task", json!({"key": "T-2"})).await.unwrap();
    assert_eq!(task["holder"]["session"], label_b.as_str(), "{task}");

    // Thread A again, restarted: its window, which holds T-1, from the first call on.
    let again = machine
        .drive(
            &poll,
            json!([
                {"op": "call", "tool": "complete_task", "arguments": {"key": "T-1", "result": "done"}, "meta": {"threadId": "A"}},
                {"op": "call", "tool": "session_status"},
            ]),
        )
        .await;
    assert_eq!(calls(&again)[0]["is_error"], false, "{again:#?}");
    assert_eq!(status(&again, 0)["label"], label_a.as_str());
    let task = bus.call("get_task", json!({"key": "T-1"})).await.unwrap();
    assert_eq!(task["status"], "done", "{task}");
}

#[tokio::test]
async fn a_first_call_naming_no_thread_keeps_the_random_window() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let steps = json!([
        {"op": "call", "tool": "session_status", "meta": {"progressToken": 1}},
        {"op": "call", "tool": "session_status", "meta": {"threadId": "late"}},
    ]);
    let one = machine.drive(&[], steps.clone()).await;
    let first = status(&one, 0);
    let label = first["label"].as_str().unwrap();
    assert!(label.starts_with("conv-random"), "{first}");
    assert!(
        first["label_from"].as_str().unwrap().starts_with("random"),
        "{first}"
    );
    assert_eq!(
        status(&one, 1)["label"],
        label,
        "a later thread does not move it"
    );
    assert_ne!(label, label_for("late"));

    let two = machine.drive(&[], steps).await;
    assert_ne!(
        status(&two, 0)["label"],
        label,
        "random: a restart gets another"
    );
}
