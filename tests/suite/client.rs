//! The console client as a person at a terminal uses it: the real binary
//! (`ai-crew-sync client …`) against a spawned server, configured from
//! BUS_URL / BUS_TOKEN / BUS_SESSION, reading what it prints and its exit code.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::support::{TestApp, eventually, free_port, spawn_app};

/// One agent window at the console.
#[derive(Clone)]
pub(crate) struct Console {
    url: String,
    token: Option<String>,
    session: Option<String>,
    cwd: Option<PathBuf>,
}

/// What one run printed and how it ended.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Console {
    pub(crate) async fn new(app: &TestApp, agent: &str, session: Option<&str>) -> Console {
        Console {
            url: app.url("/mcp"),
            token: Some(app.agent("acme", agent).await),
            session: session.map(str::to_string),
            cwd: None,
        }
    }

    /// The same agent (same token) in another window.
    fn window(&self, session: &str) -> Console {
        Console {
            session: Some(session.to_string()),
            ..self.clone()
        }
    }

    fn in_dir(&self, dir: &Path) -> Console {
        Console {
            cwd: Some(dir.to_path_buf()),
            ..self.clone()
        }
    }

    /// Run `client ARGS…`. The child runs on a blocking thread: the test's
    /// single-threaded runtime must stay free to serve its requests.
    async fn run_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> Run {
        let console = self.clone();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let stdin = stdin.map(str::to_string);
        tokio::task::spawn_blocking(move || console.run_blocking(&args, stdin.as_deref()))
            .await
            .unwrap()
    }

    fn run_blocking(&self, args: &[String], stdin: Option<&str>) -> Run {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .arg("client")
            .args(args)
            .env("BUS_URL", &self.url)
            .env_remove("BUS_TOKEN")
            .env_remove("BUS_SESSION")
            .env_remove("BUS_PROFILE")
            // No profiles of the person running the tests.
            .env("BUS_CONFIG_DIR", crate::context::no_profiles_dir())
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(token) = &self.token {
            command.env("BUS_TOKEN", token);
        }
        if let Some(session) = &self.session {
            command.env("BUS_SESSION", session);
        }
        if let Some(dir) = &self.cwd {
            command.current_dir(dir);
        }
        let mut child = command.spawn().expect("run ai-crew-sync client");
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub(crate) async fn run(&self, args: &[&str]) -> Run {
        self.run_with_stdin(args, None).await
    }

    /// Run and expect success; its stdout.
    pub(crate) async fn ok(&self, args: &[&str]) -> String {
        let run = self.run(args).await;
        assert_eq!(run.code, Some(0), "client {args:?} failed: {run:?}");
        run.stdout
    }

    /// Run with `--json` and expect success; its parsed stdout.
    pub(crate) async fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let stdout = self.ok(&args).await;
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("client {args:?} printed no JSON ({e}): {stdout}"))
    }
}

/// Team `acme` and its first agent's console.
async fn team_with(app: &TestApp, agent: &str, session: Option<&str>) -> Console {
    app.team("acme").await;
    Console::new(app, agent, session).await
}

#[tokio::test]
async fn client_two_agents_exchange_messages_with_send_and_read() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", Some("w1")).await;
    let bob = Console::new(&app, "bob", None).await;

    let sent = alice
        .ok(&["send", "--channel", "general", "hello", "bob"])
        .await;
    assert!(
        sent.starts_with("sent ") && sent.contains("#general"),
        "{sent}"
    );

    let read = bob.json(&["read"]).await;
    let messages = read["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{read}");
    assert_eq!(
        messages[0]["body"], "hello bob",
        "positional words are joined"
    );
    assert_eq!(messages[0]["from"], "alice/w1");

    let dm = alice.json(&["send", "--to", "bob", "are you there?"]).await;
    assert_eq!(dm["delivered_to"], serde_json::json!(["bob"]));
    let dm_id = dm["message"]["id"].as_str().unwrap().to_string();

    let text = bob.ok(&["read"]).await;
    assert!(text.contains("alice/w1 -> bob"), "{text}");
    assert!(text.contains("    are you there?"), "{text}");
    assert!(text.contains(&dm_id), "the id is shown to reply to: {text}");
    assert!(!text.contains("hello bob"), "already read: {text}");

    let again = bob.ok(&["read"]).await;
    // An empty page says what it read past, never a bare "nothing".
    assert!(
        again.trim().starts_with("nothing in ") && again.contains(" after position "),
        "the cursor moved on, and the empty page says past where: {again}"
    );
    let latest = bob.json(&["read", "--all"]).await;
    assert_eq!(
        latest["messages"].as_array().unwrap().len(),
        2,
        "--all shows the latest page again: {latest}"
    );

    bob.ok(&["send", "--to", "alice/w1", "--reply-to", &dm_id, "yes"])
        .await;
    let inbox = alice.json(&["read", "--scope", "inbox"]).await;
    assert_eq!(inbox["messages"][0]["body"], "yes");
    assert_eq!(inbox["messages"][0]["reply_to"], dm_id.as_str());
}

#[tokio::test]
async fn client_send_dash_reads_the_body_from_stdin() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = Console::new(&app, "bob", None).await;

    let run = alice
        .run_with_stdin(
            &["send", "--channel", "builds", "-"],
            Some("line one\nline two\n"),
        )
        .await;
    assert_eq!(run.code, Some(0), "{run:?}");

    let read = bob.json(&["read", "--scope", "builds"]).await;
    assert_eq!(
        read["messages"][0]["body"], "line one\nline two",
        "stdin is the body, less its final newline"
    );
}

#[tokio::test]
async fn client_beat_then_agents_shows_the_window() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", Some("frontend")).await;
    let bob = Console::new(&app, "bob", None).await;

    let beat = alice
        .ok(&[
            "beat",
            "--status",
            "busy",
            "--activity",
            "fixing CI",
            "--project",
            "web",
        ])
        .await;
    assert!(beat.starts_with("alice/frontend is busy"), "{beat}");

    let table = bob.ok(&["agents"]).await;
    assert!(table.starts_with("1 of 2 agents online"), "{table}");
    let alice_row = |table: &str| {
        table
            .lines()
            .find(|l| l.starts_with("alice"))
            .unwrap_or_else(|| panic!("no row for alice: {table}"))
            .to_string()
    };
    let row = alice_row(&table);
    for cell in ["yes", "busy", "fixing CI", "alice/frontend"] {
        assert!(row.contains(cell), "{cell:?} missing: {row}");
    }

    let online = bob.json(&["agents", "--online"]).await;
    let agents = online["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 1, "only alice has a live window: {online}");
    assert_eq!(agents[0]["windows"][0]["session"], "frontend");
    assert_eq!(agents[0]["windows"][0]["project"], "web");

    // Two more windows of alice: one idle, one whose conversation ended.
    // Live windows by address, the others folded into a count.
    let token = alice.token.clone().unwrap();
    for (window, beat) in [
        ("reader", json!({"status": "idle"})),
        ("gone", json!({"status": "idle", "offline": true})),
    ] {
        app.mcp(&token, Some(window))
            .await
            .call("heartbeat", beat)
            .await
            .unwrap();
    }
    let row = alice_row(&bob.ok(&["agents"]).await);
    for cell in ["alice/frontend", "alice/reader (idle)", "+1 offline"] {
        assert!(row.contains(cell), "{cell:?} missing: {row}");
    }
    assert!(!row.contains("gone"), "{row}");

    let sessions = bob.ok(&["sessions", "--project", "web"]).await;
    assert!(sessions.contains("alice/frontend"), "{sessions}");
    let all = bob.ok(&["sessions"]).await;
    let gone = all
        .lines()
        .find(|l| l.starts_with("alice/gone"))
        .unwrap_or_else(|| panic!("{all}"));
    assert!(gone.contains("offline"), "its state: {gone}");
}

#[tokio::test]
async fn client_task_create_next_done_then_tasks_lists_it_done() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = Console::new(&app, "bob", Some("w2")).await;

    let created = alice
        .ok(&["task", "create", "fix-login", "Fix the login form"])
        .await;
    assert_eq!(created.trim(), "task fix-login: open (Fix the login form)");

    let next = bob.ok(&["task", "next", "--lease", "120"]).await;
    assert!(
        next.starts_with("task fix-login: claimed") && next.contains("held by bob/w2"),
        "{next}"
    );

    let done = bob
        .ok(&["task", "done", "fix-login", "patched the form"])
        .await;
    assert!(done.starts_with("task fix-login: done"), "{done}");

    let listed = alice.json(&["tasks"]).await;
    let tasks = listed["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "{listed}");
    assert_eq!(tasks[0]["key"], "fix-login");
    assert_eq!(tasks[0]["status"], "done");
    assert_eq!(tasks[0]["completed_by"], "bob/w2");

    let shown = alice.json(&["task", "show", "fix-login"]).await;
    assert_eq!(shown["result"], "patched the form");

    let none = bob.run(&["task", "next"]).await;
    assert_eq!(none.code, Some(1), "nothing ready is a failure: {none:?}");
    assert!(none.stderr.contains("no task claimed"), "{none:?}");
}

#[tokio::test]
async fn client_task_cancel_and_depends_re_point_what_waited_on_the_cancelled_task() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = Console::new(&app, "bob", Some("w2")).await;
    alice
        .ok(&["task", "create", "schema", "Design the schema"])
        .await;
    alice
        .ok(&[
            "task",
            "create",
            "deploy",
            "Deploy",
            "--depends-on",
            "schema",
        ])
        .await;

    // Someone else's task: refused with the server's words, exit 1.
    let refused = bob.run(&["task", "cancel", "schema", "not needed"]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("only its creator"), "{refused:?}");

    // The reason from stdin; the answer names who still waits.
    let cancelled = alice
        .run_with_stdin(
            &["task", "cancel", "schema", "-"],
            Some("replaced by schema-v2\n"),
        )
        .await;
    assert_eq!(cancelled.code, Some(0), "{cancelled:?}");
    assert!(
        cancelled
            .stdout
            .starts_with("task schema: cancelled (Design the schema)"),
        "{cancelled:?}"
    );
    assert!(
        cancelled
            .stdout
            .contains("1 task(s) still wait on it: deploy"),
        "{cancelled:?}"
    );
    let shown = alice.ok(&["task", "show", "schema"]).await;
    assert!(shown.contains("cancelled by alice at"), "{shown}");
    assert!(shown.contains("replaced by schema-v2"), "{shown}");
    let listed = alice.ok(&["tasks"]).await;
    assert!(listed.contains("schema (cancelled)"), "{listed}");

    alice
        .ok(&["task", "create", "schema-v2", "Schema, again"])
        .await;
    let repointed = alice
        .json(&["task", "depends", "deploy", "--on", "schema-v2"])
        .await;
    assert_eq!(repointed["depends_on"], serde_json::json!(["schema-v2"]));
    let cleared = alice.ok(&["task", "depends", "deploy", "--none"]).await;
    assert_eq!(cleared.trim(), "task deploy: open (Deploy)");
    let neither = alice.run(&["task", "depends", "deploy"]).await;
    assert_eq!(
        neither.code,
        Some(2),
        "--on or --none is required: {neither:?}"
    );
}

#[tokio::test]
async fn client_task_priority_orders_task_next_and_is_the_creators_to_change() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = Console::new(&app, "bob", Some("w2")).await;
    alice.ok(&["task", "create", "chore", "Tidy up"]).await;
    let hot = alice
        .ok(&["task", "create", "hotfix", "Fix prod", "--priority", "high"])
        .await;
    assert_eq!(hot.trim(), "task hotfix: open (Fix prod), priority high");

    let refused = bob.run(&["task", "priority", "chore", "urgent"]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("only its creator"), "{refused:?}");
    let raised = alice.ok(&["task", "priority", "chore", "urgent"]).await;
    assert_eq!(raised.trim(), "task chore: open (Tidy up), priority urgent");
    let listed = alice.ok(&["tasks", "--status", "open"]).await;
    let chore = listed.find("chore").unwrap();
    let hotfix = listed.find("hotfix").unwrap();
    assert!(chore < hotfix, "the urgent task is listed first: {listed}");
    assert!(
        listed.contains("urgent") && listed.contains("high"),
        "{listed}"
    );

    let next = bob.ok(&["task", "next"]).await;
    assert!(next.starts_with("task chore: claimed"), "{next}");
}

#[tokio::test]
async fn client_lock_acquire_is_refused_for_another_window_naming_the_holder() {
    let app = spawn_app().await;
    let w1 = team_with(&app, "alice", Some("w1")).await;
    let w2 = w1.window("w2");

    let acquired = w1
        .ok(&["lock", "acquire", "deploy", "--purpose", "release 1.2"])
        .await;
    assert!(
        acquired.starts_with("acquired lock deploy until"),
        "{acquired}"
    );

    let refused = w2.run(&["lock", "acquire", "deploy"]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stdout.is_empty(), "{refused:?}");
    assert!(
        refused.stderr.contains("acquire_lock was refused") && refused.stderr.contains("alice/w1"),
        "the refusal names the holding window: {}",
        refused.stderr
    );

    let list = w2.ok(&["lock", "list"]).await;
    assert!(
        list.contains("deploy") && list.contains("alice/w1") && list.contains("release 1.2"),
        "{list}"
    );
    let released = w1.ok(&["lock", "release", "deploy"]).await;
    assert_eq!(released.trim(), "released lock deploy");
}

#[tokio::test]
async fn client_note_set_then_get_prints_the_value() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = Console::new(&app, "bob", None).await;

    let set = alice
        .ok(&[
            "note",
            "set",
            "build/commands",
            "cargo test --all",
            "--tag",
            "ci",
        ])
        .await;
    assert!(
        set.starts_with("note global/build/commands created: revision 1"),
        "{set}"
    );

    assert_eq!(
        bob.ok(&["note", "get", "build/commands"]).await,
        "cargo test --all\n"
    );
    let found = bob.ok(&["note", "search", "cargo"]).await;
    assert!(found.contains("build/commands"), "{found}");

    let missing = bob.run(&["note", "get", "nothing-here"]).await;
    assert_eq!(missing.code, Some(1), "{missing:?}");
    assert!(
        missing.stderr.contains("no note `nothing-here`"),
        "{missing:?}"
    );
}

#[tokio::test]
async fn client_attach_and_download_round_trip_identical_bytes() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = Console::new(&app, "bob", None).await;
    let upload_dir = tempfile::tempdir().unwrap();
    let download_dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 256) as u8).collect();
    let file = upload_dir.path().join("trace.log");
    std::fs::write(&file, &bytes).unwrap();

    alice
        .ok(&["task", "create", "flaky-test", "Find the flake"])
        .await;
    let attached = alice
        .json(&["attach", "flaky-test", file.to_str().unwrap()])
        .await;
    assert_eq!(attached["filename"], "trace.log");
    assert_eq!(attached["content_type"], "text/plain", "guessed from .log");
    assert_eq!(attached["size_bytes"], 5000);
    let id = attached["id"].as_str().unwrap();

    let bob_here = bob.in_dir(download_dir.path());
    let wrote = bob_here.ok(&["download", id]).await;
    assert!(wrote.starts_with("wrote trace.log (5000 bytes"), "{wrote}");
    let downloaded = download_dir.path().join("trace.log");
    assert_eq!(
        std::fs::read(&downloaded).unwrap(),
        bytes,
        "identical bytes"
    );

    std::fs::write(&downloaded, b"local edits").unwrap();
    let refused = bob_here.run(&["download", id]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("already exists") && refused.stderr.contains("--force"),
        "{refused:?}"
    );
    assert_eq!(
        std::fs::read(&downloaded).unwrap(),
        b"local edits",
        "an existing file is left alone"
    );

    bob_here.ok(&["download", id, "--force"]).await;
    assert_eq!(std::fs::read(&downloaded).unwrap(), bytes);
    let elsewhere = download_dir.path().join("copy.bin");
    bob.ok(&["download", id, "--out", elsewhere.to_str().unwrap()])
        .await;
    assert_eq!(std::fs::read(&elsewhere).unwrap(), bytes);
}

#[tokio::test]
async fn client_call_runs_any_tool_and_prints_its_json() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", Some("cli")).await;

    let stdout = alice.ok(&["call", "whoami", "--args", "{}"]).await;
    let me: Value = serde_json::from_str(&stdout).expect("call prints JSON");
    assert_eq!(me["agent"], "alice");
    assert_eq!(me["team"], "acme");
    assert_eq!(me["session"], "cli", "BUS_SESSION names the window");

    let text = alice.ok(&["whoami"]).await;
    assert!(text.starts_with("alice/cli in team acme"), "{text}");

    let refused = alice
        .run(&["call", "get_task", "--args", r#"{"key": "nope"}"#])
        .await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("get_task was refused") && refused.stderr.contains("nope"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn client_ask_waits_for_the_answer() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", Some("w1")).await;
    let bob = Console::new(&app, "bob", None).await;

    let asking = {
        let alice = alice.clone();
        tokio::spawn(async move {
            alice
                .run(&["ask", "bob", "which port?", "--timeout", "30"])
                .await
        })
    };
    let question = eventually("the question in bob's inbox", async || {
        let inbox = bob.json(&["read", "--scope", "inbox"]).await;
        inbox["messages"].as_array().unwrap().first().cloned()
    })
    .await;
    assert_eq!(question["question"], true);
    bob.ok(&[
        "send",
        "--to",
        question["from"].as_str().unwrap(),
        "--reply-to",
        question["id"].as_str().unwrap(),
        "8787",
    ])
    .await;

    let answered = asking.await.unwrap();
    assert_eq!(answered.code, Some(0), "{answered:?}");
    assert_eq!(answered.stdout, "8787\n");
}

#[tokio::test]
async fn client_wait_wakes_on_a_direct_message() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = Console::new(&app, "bob", Some("w1")).await;

    let quiet = bob.ok(&["wait", "--timeout", "1"]).await;
    assert_eq!(quiet.trim(), "timed out: nothing happened");

    let waiting = {
        let bob = bob.clone();
        tokio::spawn(async move { bob.run(&["wait", "--timeout", "30"]).await })
    };
    app.until_waiting(1).await;
    alice
        .ok(&["send", "--to", "bob/w1", "build is green"])
        .await;
    let woke = waiting.await.unwrap();
    assert_eq!(woke.code, Some(0), "{woke:?}");
    let row = woke
        .stdout
        .lines()
        .find(|l| l.starts_with("message"))
        .unwrap_or_else(|| panic!("no message event: {woke:?}"));
    assert!(
        row.contains("alice") && row.contains("build is green"),
        "{row}"
    );
}

#[tokio::test]
async fn client_without_a_token_names_bus_token() {
    let app = spawn_app().await;
    let nobody = Console {
        url: app.url("/mcp"),
        token: None,
        session: None,
        cwd: None,
    };
    let run = nobody.run(&["whoami"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("BUS_TOKEN"), "{}", run.stderr);
}

#[tokio::test]
async fn client_a_wrong_token_says_the_server_refused_it() {
    let app = spawn_app().await;
    let stranger = Console {
        url: app.url("/mcp"),
        token: Some(format!("acs_{}", "0".repeat(64))),
        session: None,
        cwd: None,
    };
    let run = stranger.run(&["whoami"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("refused the credential (401)") && run.stderr.contains("BUS_TOKEN"),
        "{}",
        run.stderr
    );
    // Issue 36 item 2: which installation it asked, and how to ask another.
    assert!(
        run.stderr.contains(&stranger.url)
            && run.stderr.contains("another installation")
            && run.stderr.contains("--url URL")
            && run.stderr.contains("--profile NAME"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn client_an_unreachable_url_is_named() {
    let url = format!("http://127.0.0.1:{}/mcp", free_port());
    let lost = Console {
        url: url.clone(),
        token: Some("acs_whatever".into()),
        session: None,
        cwd: None,
    };
    let run = lost.run(&["whoami"]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr
            .contains(&format!("could not open an MCP connection to {url}")),
        "{}",
        run.stderr
    );
}

/// Team `acme` with conversations turned on, and alice's console.
async fn conversations_on(app: &TestApp) -> Console {
    let alice = team_with(app, "alice", None).await;
    ai_crew_sync::store::identity::teams::capability(
        &app.pool,
        "acme",
        Some(true),
        &crate::support::test_actor(),
    )
    .await
    .unwrap();
    alice
}

#[tokio::test]
async fn client_conversation_create_join_send_read_ack_then_receipts_count_it() {
    let app = spawn_app().await;
    let alice = conversations_on(&app).await;
    let bob = Console::new(&app, "bob", None).await;

    let created = alice
        .json(&[
            "conversation",
            "create",
            "Release",
            "--private",
            "--invite",
            "bob",
        ])
        .await;
    assert_eq!(created["title"], "Release", "{created}");
    let id = created["id"].as_str().unwrap().to_string();

    let joined = bob.ok(&["conversation", "join", &id]).await;
    assert!(joined.starts_with("joined bob as participant"), "{joined}");
    let listed = bob.ok(&["conversation", "list"]).await;
    assert!(
        listed.contains(&id) && listed.contains("Release"),
        "{listed}"
    );

    let sent = alice.json(&["conversation", "send", &id, "ship it"]).await;
    assert_eq!(sent["seq"], 1, "{sent}");
    assert_eq!(sent["recipients"], serde_json::json!(["bob"]), "{sent}");
    let message = sent["message_id"].as_str().unwrap().to_string();
    let request_id = sent["request_id"].as_str().unwrap().to_string();
    assert!(uuid::Uuid::parse_str(&request_id).is_ok(), "{sent}");

    let read = bob.ok(&["conversation", "read", &id]).await;
    assert!(
        read.contains("#1 ") && read.contains("alice") && read.contains("    ship it"),
        "{read}"
    );
    assert!(read.contains("next after seq: 1"), "{read}");

    let acked = bob
        .ok(&["conversation", "ack", &message, "--resolved"])
        .await;
    assert!(acked.starts_with("resolved message"), "{acked}");

    let receipts = alice.json(&["conversation", "receipts", &message]).await;
    assert_eq!(receipts["total"], 1, "{receipts}");
    assert_eq!(receipts["acknowledged"], 1, "{receipts}");
    assert_eq!(receipts["resolved"], 1, "{receipts}");
    let text = alice.ok(&["conversation", "receipts", &message]).await;
    assert!(
        text.contains("total 1") && text.contains("acknowledged 1, resolved 1"),
        "{text}"
    );

    let waited = bob.ok(&["conversation", "wait", "--timeout", "1"]).await;
    assert!(waited.contains("timed out"), "{waited}");
}

#[tokio::test]
async fn client_conversation_send_retried_with_the_request_id_returns_the_same_seq() {
    let app = spawn_app().await;
    let alice = conversations_on(&app).await;
    let created = alice
        .json(&["conversation", "create", "Solo", "--private"])
        .await;
    let id = created["id"].as_str().unwrap().to_string();

    let first = alice.ok(&["conversation", "send", &id, "ship it"]).await;
    assert!(first.starts_with("sent seq 1 "), "{first}");
    let request_id = first
        .split("--request-id ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the send prints its request id: {first}"))
        .to_string();

    let retry = alice
        .json(&[
            "conversation",
            "send",
            &id,
            "ship it",
            "--request-id",
            &request_id,
        ])
        .await;
    assert_eq!(retry["seq"], 1, "{retry}");
    assert_eq!(retry["replayed"], true, "{retry}");
    assert_eq!(retry["request_id"], request_id.as_str(), "{retry}");
}

#[tokio::test]
async fn client_conversation_with_conversations_off_names_team_capability() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let refused = alice
        .run(&["conversation", "create", "Release", "--private"])
        .await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stdout.is_empty(), "{refused:?}");
    assert!(
        refused.stderr.contains("create_conversation was refused")
            && refused.stderr.contains("team capability"),
        "{}",
        refused.stderr
    );
}

#[tokio::test]
async fn client_text_never_passes_another_agents_control_characters_to_the_terminal() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    // Clear the screen, retitle the window, ring the bell, overwrite the line.
    let hostile = "hi\x1b[2J\x1b]0;pwned\x07 there\r\u{9b}31mred";
    let shown = "hi[2J]0;pwned there31mred";
    bob.call(
        "post_message",
        serde_json::json!({"to": "alice", "body": hostile}),
    )
    .await
    .unwrap();
    bob.call(
        "post_message",
        serde_json::json!({"channel": "general", "body": hostile}),
    )
    .await
    .unwrap();
    bob.call(
        "create_task",
        serde_json::json!({"key": "t1", "title": "plain", "description": hostile}),
    )
    .await
    .unwrap();
    // A title is one line and refuses control characters now; one stored
    // before that rule must still never reach the terminal raw.
    sqlx::query("UPDATE tasks SET title = $1 WHERE key = 't1'")
        .bind(hostile)
        .execute(&app.pool)
        .await
        .unwrap();
    bob.call(
        "set_note",
        serde_json::json!({"key": "n1", "value": hostile}),
    )
    .await
    .unwrap();

    for args in [
        &["read", "--all"][..],
        &["tasks"],
        &["task", "show", "t1"],
        &["note", "get", "n1"],
        &["digest", "--all-channels"],
    ] {
        let run = alice.run(args).await;
        assert_eq!(run.code, Some(0), "{args:?}: {run:?}");
        for printed in [&run.stdout, &run.stderr] {
            assert!(
                !printed.contains(['\x1b', '\x07', '\r', '\u{9b}']),
                "{args:?} printed a control character: {printed:?}"
            );
        }
        assert!(run.stdout.contains("hi[2J"), "{args:?}: {:?}", run.stdout);
    }
    let read = alice.ok(&["read", "--all"]).await;
    assert!(read.contains(&format!("    {shown}")), "{read:?}");

    // JSON for scripts keeps the text exactly, escaped.
    let run = alice.run(&["read", "--all", "--json"]).await;
    assert!(
        !run.stdout.contains(['\x1b', '\x07', '\r', '\u{9b}']),
        "{:?}",
        run.stdout
    );
    let answer: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(answer["messages"][0]["body"], hostile);
}

// Issue 33 item 8: bidirectional embeddings, overrides and isolates in
// another agent's text are spelled out in text mode (`<U+202E>`), so a body
// cannot display in another order than it was written in; JSON keeps them.
#[tokio::test]
async fn client_text_spells_out_bidirectional_formatting_characters_and_json_keeps_them() {
    let app = spawn_app().await;
    let alice = team_with(&app, "alice", None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    // Reads as "invoice_exe.pdf" on a terminal that honours U+202E; the
    // implicit right-to-left mark (U+200F) in Hebrew text is left alone.
    let hostile = "invoice_\u{202E}fdp.exe\u{202C} \u{2067}isolated\u{2069} שלום\u{200F}!";
    let shown = "invoice_<U+202E>fdp.exe<U+202C> <U+2067>isolated<U+2069> שלום\u{200F}!";
    bob.call(
        "post_message",
        serde_json::json!({"to": "alice", "body": hostile}),
    )
    .await
    .unwrap();
    bob.call(
        "create_task",
        serde_json::json!({"key": "t1", "title": "plain", "description": hostile}),
    )
    .await
    .unwrap();
    for args in [&["read", "--all"][..], &["task", "show", "t1"]] {
        let run = alice.run(args).await;
        assert_eq!(run.code, Some(0), "{args:?}: {run:?}");
        assert!(run.stdout.contains(shown), "{args:?}: {:?}", run.stdout);
        for c in ai_crew_sync::store::text::BIDI_CONTROLS {
            assert!(
                !run.stdout.contains(c),
                "{args:?} printed U+{:04X} raw",
                c as u32
            );
        }
    }
    let answer = alice.json(&["read", "--all"]).await;
    assert_eq!(
        answer["messages"][0]["body"], hostile,
        "JSON keeps the text"
    );
}
