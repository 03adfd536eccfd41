//! `context hook`: the real binary fed recorded Claude Code hook payloads,
//! speaking as the window a proxy holds for that host conversation (its
//! state file written here as the proxy writes it), against a real server.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use serde_json::{Value, json};

use crate::support::proxy::Proxy;
use crate::support::{McpClient, TestApp, free_port, spawn_app, test_actor};
use ai_crew_sync::client::hook::CONTEXT_MAX_CHARS;
use ai_crew_sync::client::window_state::WindowState;
use ai_crew_sync::store::identity::teams;

/// Claude Code's hook input for `event`, as it sends it.
pub(crate) fn payload(session: &str, event: &str, extra: Value) -> String {
    let mut input = json!({
        "session_id": session,
        "transcript_path": "/home/dev/.claude/projects/repo/transcript.jsonl",
        "cwd": "/home/dev/repo",
        "permission_mode": "default",
        "hook_event_name": event,
    });
    input
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    input.to_string()
}

#[derive(Debug)]
pub(crate) struct HookRun {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// Run `context hook --event EVENT` with `stdin`; a hook still running
/// after 30 s fails the test (the host would have been held).
pub(crate) async fn hook(config: &Path, event: &str, stdin: String) -> HookRun {
    hook_with(config, &["--event", event], &[], stdin).await
}

/// [`hook`] with these arguments after `context hook` and these variables.
async fn hook_with(config: &Path, args: &[&str], env: &[(&str, &str)], stdin: String) -> HookRun {
    let config = config.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .args(["context", "hook"])
            .args(&args)
            .env("BUS_CONFIG_DIR", &config)
            .env_remove("CLAUDE_CODE_SESSION_ID")
            .env_remove("RUST_LOG")
            .env_remove("ACS_HOOK_DEBUG")
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ai-crew-sync context hook");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("the hook held the host for 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        HookRun {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}

/// What a proxy for host conversation `host` holds: a registered window,
/// its state file in `config`, and a client speaking as that window.
pub(crate) async fn proxy_window(
    app: &TestApp,
    token: &str,
    host: &str,
    label: &str,
    config: &Path,
) -> (WindowState, McpClient) {
    let agent = app.mcp(token, None).await;
    let issued = agent
        .call("register_session", json!({"session": label}))
        .await
        .unwrap();
    let me = agent.call("whoami", json!({})).await.unwrap();
    let state = WindowState {
        host_session: host.to_string(),
        label: label.to_string(),
        url: app.url("/mcp"),
        team: me["team"].as_str().unwrap().to_string(),
        agent: me["agent"].as_str().unwrap().to_string(),
        credential: issued["credential"].as_str().unwrap().to_string(),
        epoch: issued["epoch"].as_i64().unwrap(),
        expires_at: issued["expires_at"].as_str().unwrap().parse().unwrap(),
        pid: std::process::id(),
        updated_at: Utc::now(),
    };
    state.save(config).unwrap();
    let epoch = state.epoch.to_string();
    let window = McpClient::connect_with(
        &state.url,
        &state.credential,
        &[("x-crew-session", label), ("x-crew-epoch", &epoch)],
    )
    .await
    .unwrap();
    (state, window)
}

pub(crate) fn context_of(run: &HookRun, event: &str) -> String {
    assert_eq!(run.code, Some(0), "{run:?}");
    let out: Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {run:?}"));
    assert_eq!(out["hookSpecificOutput"]["hookEventName"], event, "{out}");
    out["hookSpecificOutput"]["additionalContext"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn session_start_and_prompt_hooks_tell_the_window_what_is_new_and_read_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, window) = proxy_window(&app, &alice, "cc-1", "cc-one", config.path()).await;

    bob.call(
        "post_message",
        json!({"to": "alice/cc-one", "body": "deploy is blocked on the migration"}),
    )
    .await
    .unwrap();
    bob.call(
        "post_message",
        json!({"channel": "general", "body": "freeze starts at noon", "announce": true}),
    )
    .await
    .unwrap();
    let asked = bob
        .call(
            "ask_agent",
            json!({"to": "alice", "question": "which branch has the fix?", "timeout_seconds": 1}),
        )
        .await
        .unwrap();
    // A conversation message to the window: its body shown is `presented`.
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let conversation = bob
        .call(
            "create_conversation",
            json!({"title": "rollout", "private": true, "invite": ["alice/cc-one"]}),
        )
        .await
        .unwrap()["id"]
        .clone();
    window
        .call(
            "join_conversation",
            json!({"conversation_id": conversation}),
        )
        .await
        .unwrap();
    let rollout = bob
        .call(
            "send_conversation_message",
            json!({"conversation_id": conversation, "body": "canary at 10%, then 50%",
                   "request_id": uuid::Uuid::now_v7()}),
        )
        .await
        .unwrap()["message_id"]
        .clone();
    let presented = async || {
        bob.call("get_message_receipts", json!({"message_id": rollout}))
            .await
            .unwrap()["presented"]
            .clone()
    };
    assert_eq!(presented().await, 0, "nothing shown yet");
    window
        .call(
            "create_task",
            json!({"key": "fix-login", "title": "Fix the login form"}),
        )
        .await
        .unwrap();
    window
        .call(
            "claim_task",
            json!({"key": "fix-login", "lease_seconds": 120}),
        )
        .await
        .unwrap();

    let start = hook(
        config.path(),
        "session_start",
        payload("cc-1", "SessionStart", json!({"source": "startup"})),
    )
    .await;
    let context = context_of(&start, "SessionStart");
    for expected in [
        "alice/cc-one",
        "deploy is blocked on the migration",
        "which branch has the fix?",
        asked["question_message_id"].as_str().unwrap(),
        "freeze starts at noon",
        "fix-login",
        "canary at 10%, then 50%",
        rollout.as_str().unwrap(),
    ] {
        assert!(
            context.contains(expected),
            "{expected:?} missing: {context}"
        );
    }
    assert!(context.chars().count() <= CONTEXT_MAX_CHARS);
    assert_eq!(presented().await, 1, "the hook recorded what it showed");
    // The same conversation starting again (resume, compact): nothing the
    // model was shown is repeated, not even the conversation's debt.
    let resumed = hook(
        config.path(),
        "session_start",
        payload("cc-1", "SessionStart", json!({"source": "resume"})),
    )
    .await;
    assert_eq!(
        (resumed.code, resumed.stdout.as_str()),
        (Some(0), ""),
        "{resumed:?}"
    );

    // Nothing new since: the prompt hook says nothing at all.
    let quiet = hook(
        config.path(),
        "user_prompt",
        payload("cc-1", "UserPromptSubmit", json!({"prompt": "carry on"})),
    )
    .await;
    assert_eq!(
        (quiet.code, quiet.stdout.as_str()),
        (Some(0), ""),
        "{quiet:?}"
    );

    bob.call(
        "post_message",
        json!({"to": "alice/cc-one", "body": "migration merged"}),
    )
    .await
    .unwrap();
    let prompt = hook(
        config.path(),
        "user_prompt",
        payload("cc-1", "UserPromptSubmit", json!({"prompt": "carry on"})),
    )
    .await;
    let context = context_of(&prompt, "UserPromptSubmit");
    assert!(context.contains("migration merged"), "{context}");
    assert!(
        !context.contains("deploy is blocked"),
        "only what is new: {context}"
    );

    // The hooks marked nothing read: the window still reads both as new.
    let read = window
        .call("read_messages", json!({"scope": "inbox"}))
        .await
        .unwrap();
    let bodies: Vec<&str> = read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert!(
        bodies.contains(&"deploy is blocked on the migration"),
        "{read}"
    );
    assert!(bodies.contains(&"migration merged"), "{read}");
}

#[tokio::test]
async fn stop_blocks_once_for_an_unanswered_question_and_session_end_takes_the_window_offline() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, window) = proxy_window(&app, &alice, "cc-2", "cc-two", config.path()).await;
    let stop = |active: bool| payload("cc-2", "Stop", json!({"stop_hook_active": active}));

    let calm = hook(config.path(), "stop", stop(false)).await;
    assert_eq!((calm.code, calm.stdout.as_str()), (Some(0), ""), "{calm:?}");

    let asked = bob
        .call(
            "ask_agent",
            json!({"to": "alice/cc-two", "question": "may I rebase main?", "timeout_seconds": 1}),
        )
        .await
        .unwrap();
    let question_id = asked["question_message_id"].as_str().unwrap().to_string();

    // The host already continues because of a stop hook: never block again.
    let continuing = hook(config.path(), "stop", stop(true)).await;
    assert_eq!(
        (continuing.code, continuing.stdout.as_str()),
        (Some(0), ""),
        "{continuing:?}"
    );
    let blocked = hook(config.path(), "stop", stop(false)).await;
    assert_eq!(blocked.code, Some(0), "{blocked:?}");
    let out: Value = serde_json::from_str(blocked.stdout.trim()).unwrap();
    assert_eq!(out["decision"], "block", "{out}");
    let reason = out["reason"].as_str().unwrap();
    assert!(
        reason.contains("may I rebase main?") && reason.contains(&question_id),
        "{reason}"
    );
    let again = hook(config.path(), "stop", stop(false)).await;
    assert_eq!(again.stdout, "", "one question blocks one stop: {again:?}");

    // Answered: the status line counts no open question any more.
    window
        .call(
            "post_message",
            json!({"to": "bob", "reply_to": question_id, "body": "yes"}),
        )
        .await
        .unwrap();
    let status = hook(
        config.path(),
        "status",
        payload("cc-2", "Status", json!({})),
    )
    .await;
    assert_eq!(status.code, Some(0), "{status:?}");
    assert!(
        status.stdout.contains("alice/cc-two") && status.stdout.contains("0 question(s)"),
        "{status:?}"
    );

    hook(
        config.path(),
        "session_end",
        payload("cc-2", "SessionEnd", json!({"reason": "prompt_input_exit"})),
    )
    .await;
    let sessions = bob.call("list_sessions", json!({})).await.unwrap();
    let mine = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["address"] == "alice/cc-two")
        .unwrap_or_else(|| panic!("{sessions}"))
        .clone();
    assert_eq!(mine["status"], "idle", "{mine}");
    assert_eq!(
        mine["state"], "offline",
        "offline at once, not when its ttl runs out: {mine}"
    );
    assert_eq!(mine["online"], false, "{mine}");
}

#[tokio::test]
async fn a_hook_without_a_proxy_window_or_with_the_bus_down_prints_nothing_and_exits_0() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let config = tempfile::tempdir().unwrap();
    let start = || payload("cc-3", "SessionStart", json!({"source": "startup"}));

    let none = hook(config.path(), "session_start", start()).await;
    assert_eq!((none.code, none.stdout.as_str()), (Some(0), ""), "{none:?}");
    let garbage = hook(config.path(), "stop", "{not json".to_string()).await;
    assert_eq!(
        (garbage.code, garbage.stdout.as_str()),
        (Some(0), ""),
        "{garbage:?}"
    );

    let (mut state, _) = proxy_window(&app, &alice, "cc-3", "cc-three", config.path()).await;
    // A bus that is gone: the connection is refused.
    state.url = format!("http://127.0.0.1:{}/mcp", free_port());
    state.save(config.path()).unwrap();
    let refused = hook(config.path(), "session_start", start()).await;
    assert_eq!(
        (refused.code, refused.stdout.as_str()),
        (Some(0), ""),
        "{refused:?}"
    );

    // A bus that accepts and never answers: the hook gives up by itself.
    let silent = Proxy::start(app.addr).await;
    silent.black_hole();
    state.url = format!("http://{}/mcp", silent.addr());
    state.save(config.path()).unwrap();
    let hung = hook(config.path(), "stop", payload("cc-3", "Stop", json!({}))).await;
    assert_eq!((hung.code, hung.stdout.as_str()), (Some(0), ""), "{hung:?}");
    assert!(hung.stderr.contains("no answer within"), "{hung:?}");
}

/// Issue 36 item 6: a hook that finds no window was silent, with no way to
/// learn why. `--explain` (or `ACS_HOOK_DEBUG=1`) says on stderr which stdin
/// fields it read, which window it found and why, or which windows this
/// machine has and why none matched; stdout, which the host parses, stays
/// the same.
// Breakage: without the trail, the mismatched run's stderr is empty.
#[tokio::test]
async fn explain_names_the_window_found_or_why_none_matched() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let config = tempfile::tempdir().unwrap();
    let status = |session: &str| payload(session, "Status", json!({}));

    let empty = hook_with(
        config.path(),
        &["--event", "status", "--explain"],
        &[],
        status("cc-9"),
    )
    .await;
    assert_eq!(
        (empty.code, empty.stdout.as_str()),
        (Some(0), ""),
        "{empty:?}"
    );
    assert!(
        empty.stderr.contains("no proxy has recorded any window"),
        "{empty:?}"
    );

    let (state, _) = proxy_window(&app, &alice, "cc-9", "cc-nine", config.path()).await;
    let plain = hook(config.path(), "status", status("cc-9")).await;
    assert!(plain.stdout.contains("acs alice/cc-nine"), "{plain:?}");
    assert_eq!(plain.stderr, "", "{plain:?}");
    let found = hook_with(
        config.path(),
        &["--event", "status", "--explain"],
        &[],
        status("cc-9"),
    )
    .await;
    assert_eq!(
        (found.code, &found.stdout),
        (Some(0), &plain.stdout),
        "{found:?}"
    );
    for said in [
        "session_id = \"cc-9\"",
        "host conversation: \"cc-9\", from stdin's session_id",
        "found: window alice/cc-nine of team acme",
        "transcript_path",
    ] {
        assert!(
            found.stderr.contains(said),
            "{said:?} not in {}",
            found.stderr
        );
    }
    assert!(
        !found.stderr.contains(&state.credential),
        "{}",
        found.stderr
    );

    // Another host conversation's id: nothing on stdout, and why on stderr.
    let other = hook_with(
        config.path(),
        &["--event", "status"],
        &[("ACS_HOOK_DEBUG", "1")],
        status("cc-other"),
    )
    .await;
    assert_eq!(
        (other.code, other.stdout.as_str()),
        (Some(0), ""),
        "{other:?}"
    );
    for said in [
        "no window: no `mcp proxy` recorded one for host conversation \"cc-other\"",
        "seen: host conversation \"cc-9\" -> window alice/cc-nine of team acme",
        "--host-session",
    ] {
        assert!(
            other.stderr.contains(said),
            "{said:?} not in {}",
            other.stderr
        );
    }
    // Without either, a miss stays silent.
    let quiet = hook(config.path(), "status", status("cc-other")).await;
    assert_eq!(
        (quiet.stdout.as_str(), quiet.stderr.as_str()),
        ("", ""),
        "{quiet:?}"
    );
}
