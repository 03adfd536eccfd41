//! `mcp proxy` driven by the official MCP Python SDK's stdio client
//! (`tests/suite/py/proxy_client.py`), against a spawned server: what a host
//! such as Claude Code sees. The SDK reads stdout as JSON-RPC only, so any
//! stray byte there shows up in `stdout_errors`.
//!
//! The SDK is a test dependency (`scripts/test` installs it); a machine
//! without it fails here with what to install, never skips.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;

use ai_crew_sync::store::identity::tokens;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::support::{McpClient, TestApp, eventually, globally, in_team, spawn_app};

/// One machine: a config directory with profiles, a working directory.
pub(crate) struct Machine {
    pub(crate) config: tempfile::TempDir,
    cwd: tempfile::TempDir,
}

impl Machine {
    /// Profiles of team acme (the first is the default) in a private profiles.toml.
    pub(crate) fn with_profiles(app: &TestApp, profiles: &[(&str, &str, &str)]) -> Machine {
        let profiles: Vec<_> = profiles
            .iter()
            .map(|&(name, agent, token)| (name, "acme", agent, token))
            .collect();
        Machine::with_team_profiles(&app.mcp_url(), &profiles)
    }

    /// Profiles `(name, team, agent, token)` at `url`.
    pub(crate) fn with_team_profiles(url: &str, profiles: &[(&str, &str, &str, &str)]) -> Machine {
        let config = tempfile::tempdir().unwrap();
        let mut text = format!("default = \"{}\"\n", profiles[0].0);
        for (name, team, agent, token) in profiles {
            text.push_str(&format!(
                "\n[profiles.{name}]\nurl = \"{url}\"\nteam = \"{team}\"\nagent = \"{agent}\"\ntoken = \"{token}\"\n",
            ));
        }
        let path = config.path().join("profiles.toml");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Machine {
            config,
            cwd: tempfile::tempdir().unwrap(),
        }
    }

    pub(crate) fn script(&self, proxy_args: &[&str], steps: Value) -> String {
        let mut args = vec!["mcp", "proxy"];
        args.extend_from_slice(proxy_args);
        json!({
            "command": env!("CARGO_BIN_EXE_ai-crew-sync"),
            "args": args,
            "env": {
                "BUS_CONFIG_DIR": self.config.path(),
                "RUST_LOG": "acs_agent=info",
            },
            "cwd": self.cwd.path(),
            "steps": steps,
        })
        .to_string()
    }

    /// Run a whole session; every line the driver printed.
    pub(crate) async fn drive(&self, proxy_args: &[&str], steps: Value) -> Vec<Value> {
        Driver::start(&self.script(proxy_args, steps)).rest().await
    }
}

/// The Python driver as a child process, read line by line.
pub(crate) struct Driver {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Driver {
    pub(crate) fn start(script: &str) -> Driver {
        need_python_mcp();
        let mut child = tokio::process::Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/py/proxy_client.py"))
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Driver { child, lines }
    }

    async fn next(&mut self) -> Option<Value> {
        let line = self.lines.next_line().await.unwrap()?;
        Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("driver said {line:?}: {e}")))
    }

    /// Let a paused script go on.
    pub(crate) async fn resume(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// The lines up to a `pause` step (not included).
    pub(crate) async fn until_pause(&mut self) -> Vec<Value> {
        let mut lines = Vec::new();
        loop {
            let line = self.next().await.expect("the driver pauses");
            if line["step"] == "pause" {
                return lines;
            }
            lines.push(line);
        }
    }

    /// Every line left, once the driver exited successfully.
    pub(crate) async fn rest(mut self) -> Vec<Value> {
        let mut lines = Vec::new();
        while let Some(line) = self.next().await {
            lines.push(line);
        }
        let status = self.child.wait().await.unwrap();
        assert!(status.success(), "the driver failed: {status}");
        lines
    }
}

fn need_python_mcp() {
    let ok = std::process::Command::new("python3")
        // 1.19 and later send a tool call's _meta (`call_tool(meta=...)`).
        .args([
            "-c",
            "import inspect, mcp; assert 'meta' in inspect.signature(mcp.ClientSession.call_tool).parameters",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "these tests need the official MCP Python SDK: `pip install 'mcp>=1.19'` (scripts/test \
         installs it)"
    );
}

fn step<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["step"] == kind).collect()
}

pub(crate) fn calls(lines: &[Value]) -> Vec<&Value> {
    step(lines, "call")
}

/// The last line: the server exited, with what it wrote on stderr.
pub(crate) fn closed(lines: &[Value]) -> &Value {
    let last = lines.last().expect("the driver printed something");
    assert_eq!(last["step"], "closed", "{lines:#?}");
    last
}

/// A proxy for host conversation `host` that has made one call and waits
/// (resume the driver to end it), and the label of its window.
pub(crate) async fn paused_proxy(machine: &Machine, host: &str) -> (Driver, String) {
    let mut driver = Driver::start(&machine.script(
        &["--host-session", host],
        json!([{"op": "call", "tool": "session_status"}, {"op": "pause"}]),
    ));
    let lines = driver.until_pause().await;
    let label = calls(&lines)[0]["structured"]["label"]
        .as_str()
        .unwrap()
        .to_string();
    (driver, label)
}

/// Window `label` as `list_sessions` shows it to `bus` (null: not listed).
pub(crate) async fn listed_window(bus: &McpClient, label: &str) -> Value {
    let sessions = bus.call("list_sessions", json!({})).await.unwrap();
    sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session"] == label)
        .cloned()
        .unwrap_or(Value::Null)
}

async fn acme_with_alice(app: &TestApp) -> String {
    app.team("acme").await;
    app.agent("acme", "alice").await
}

#[tokio::test]
async fn two_host_conversations_of_one_agent_are_two_windows_and_a_claim_stays_in_its_own() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let bus = app.mcp(&alice, None).await;
    bus.call(
        "create_task",
        json!({"key": "T-1", "title": "Fix the parser"}),
    )
    .await
    .unwrap();
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);

    let a = machine
        .drive(
            &["--host-session", "a"],
            json!([
                {"op": "call", "tool": "claim_task", "arguments": {"key": "T-1"}},
                {"op": "call", "tool": "session_status"},
            ]),
        )
        .await;
    let a_calls = calls(&a);
    assert_eq!(a_calls[0]["is_error"], false, "{a:#?}");
    let label_a = a_calls[1]["structured"]["label"]
        .as_str()
        .unwrap()
        .to_string();

    let b = machine
        .drive(
            &["--host-session", "b"],
            json!([
                {"op": "call", "tool": "complete_task", "arguments": {"key": "T-1", "result": "done"}},
                {"op": "call", "tool": "session_status"},
            ]),
        )
        .await;
    let b_calls = calls(&b);
    let label_b = b_calls[1]["structured"]["label"].as_str().unwrap();
    assert_ne!(label_a, label_b, "two conversations, two windows");
    assert_eq!(b_calls[0]["is_error"], true, "{b:#?}");
    let refusal = b_calls[0]["text"].as_str().unwrap();
    assert!(
        refusal.contains(&label_a),
        "the refusal names the window holding the claim: {refusal}"
    );

    let sessions = bus.call("list_sessions", json!({})).await.unwrap();
    let labels: Vec<&str> = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["session"].as_str())
        .collect();
    assert!(
        labels.contains(&label_a.as_str()) && labels.contains(&label_b),
        "{sessions}"
    );
    let task = bus.call("get_task", json!({"key": "T-1"})).await.unwrap();
    assert_eq!(task["status"], "claimed", "{task}");
    assert_eq!(task["holder"]["session"], label_a.as_str(), "{task}");
}

#[tokio::test]
async fn instructions_say_who_and_what_is_held_and_configure_session_sets_the_project() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let bus = app.mcp(&alice, None).await;
    bus.call("create_task", json!({"key": "T-7", "title": "Ship it"}))
        .await
        .unwrap();
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let first = machine
        .drive(
            &["--host-session", "conv-42"],
            json!([{"op": "call", "tool": "claim_task", "arguments": {"key": "T-7"}}]),
        )
        .await;
    assert_eq!(calls(&first)[0]["is_error"], false, "{first:#?}");

    // The same host conversation again: the same window, which holds T-7.
    let again = machine
        .drive(
            &["--host-session", "conv-42"],
            json!([
                {"op": "list_tools"},
                {"op": "call", "tool": "session_status"},
                {"op": "call", "tool": "configure_session", "arguments": {"project": "billing"}},
                {"op": "call", "tool": "list_sessions", "arguments": {"project": "billing"}},
                {"op": "call", "tool": "configure_session", "arguments": {"colour": "red"}},
                {"op": "call", "tool": "configure_session", "arguments": {"channel": "no spaces"}},
                {"op": "call", "tool": "configure_session", "arguments": {"channel": "billing-dev"}},
                {"op": "call", "tool": "post_message", "arguments": {"body": "invoices are late"}},
            ]),
        )
        .await;
    let instructions = step(&again, "initialize")[0]["instructions"]
        .as_str()
        .unwrap();
    assert!(instructions.contains("agent alice"), "{instructions}");
    assert!(instructions.contains("T-7"), "{instructions}");
    assert!(instructions.chars().count() <= 2_000);

    let tools = step(&again, "list_tools")[0]["tools"].as_array().unwrap();
    for name in [
        "session_status",
        "configure_session",
        "post_message",
        "claim_task",
    ] {
        assert!(tools.iter().any(|t| t == name), "{name} in {tools:?}");
    }
    assert!(
        !tools.iter().any(|t| t == "resume_session"),
        "the proxy keeps the window's credential to itself"
    );

    let calls = calls(&again);
    let status = &calls[0]["structured"];
    let label = status["label"].as_str().unwrap();
    assert!(label.starts_with("conv-conv42-"), "{status}");
    assert_eq!(status["agent"], "alice");
    assert_eq!(status["profile"], "work");
    assert_eq!(status["window"], format!("alice/{label}").as_str());
    // The count is of the bus tools the host was listed (the local two aside).
    assert_eq!(status["bus_tools"], tools.len() - 2, "{status} {tools:?}");
    let shown = calls[0]["text"].as_str().unwrap().to_string() + &status.to_string();
    assert!(
        !shown.contains(&alice) && !shown.contains("acss_"),
        "{shown}"
    );

    assert_eq!(calls[1]["is_error"], false, "{:#?}", calls[1]);
    let listed = &calls[2]["structured"]["sessions"];
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["session"], label);
    assert_eq!(listed[0]["project"], "billing");
    assert_eq!(calls[3]["is_error"], true);
    assert!(
        calls[3]["text"]
            .as_str()
            .unwrap()
            .contains("unknown argument `colour`"),
        "{:#?}",
        calls[3]
    );
    assert_eq!(calls[4]["is_error"], true);
    assert!(
        calls[4]["text"].as_str().unwrap().contains("is not valid"),
        "{:#?}",
        calls[4]
    );
    assert_eq!(calls[5]["structured"]["session"]["channel"], "billing-dev");
    // post_message naming no channel goes to the window's default channel.
    assert_eq!(calls[6]["is_error"], false, "{:#?}", calls[6]);
    let read = bus
        .call("read_messages", json!({"scope": "billing-dev"}))
        .await
        .unwrap();
    assert_eq!(read["messages"][0]["body"], "invoices are late", "{read}");
}

#[tokio::test]
async fn a_revoked_token_stops_the_next_call_with_what_to_do() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let mut driver = Driver::start(&machine.script(
        &["--host-session", "r"],
        json!([
            {"op": "call", "tool": "whoami"},
            {"op": "pause"},
            {"op": "call", "tool": "whoami"},
        ]),
    ));
    let before = driver.until_pause().await;
    assert_eq!(calls(&before)[0]["is_error"], false, "{before:#?}");

    let generation = || app.bus.events.credentials_generation();
    eventually(
        "the event listener to attach (a credentials generation)",
        async || generation().is_some(),
    )
    .await;
    let heard = generation();
    for token in tokens::list(&app.pool, &in_team("acme")).await.unwrap() {
        tokens::revoke(&app.pool, token.id, &globally())
            .await
            .unwrap();
    }
    // The server's credential cache forgets on the revocation's notification.
    eventually(
        "the revocation to reach the credentials cache",
        async || generation() != heard,
    )
    .await;
    driver.resume().await;
    let after = driver.rest().await;
    let refused = calls(&after)[0];
    assert_eq!(refused["is_error"], true, "{after:#?}");
    let text = refused["text"].as_str().unwrap();
    assert!(text.contains("no longer accepts"), "{text}");
    assert!(
        text.contains("token issue --team acme --agent alice"),
        "{text}"
    );
    assert!(text.contains("context profile add --name work"), "{text}");
}

#[tokio::test]
async fn stdout_is_only_json_rpc_and_closing_stdin_ends_the_proxy_leaving_the_window_offline() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    // A git repository as the working directory: the heartbeat names it.
    let repo = machine.cwd.path().join("shop");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(&repo)
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q", "-b", "feature-x"]);
    // The repository's .acs.toml names the role its windows have.
    std::fs::write(repo.join(".acs.toml"), "role = \"reviewer\"\n").unwrap();
    let mut script: Value = serde_json::from_str(&machine.script(
        &["--host-session", "idle-check"],
        json!([{"op": "call", "tool": "session_status"}]),
    ))
    .unwrap();
    script["cwd"] = json!(repo);
    let lines = Driver::start(&script.to_string()).rest().await;

    let end = closed(&lines);
    assert_eq!(end["stdout_errors"], json!([]), "{end}");
    let stderr = end["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("the host closed stdin"),
        "the proxy saw stdin close and left on its own: {stderr}"
    );
    let label = calls(&lines)[0]["structured"]["label"]
        .as_str()
        .unwrap()
        .to_string();

    // The conversation ended: the window is offline now, not when its
    // presence ttl (300 s) runs out.
    let bus = app.mcp(&alice, None).await;
    let find = async || listed_window(&bus, &label).await;
    eventually("the window is offline", async || {
        let window = find().await;
        (window["state"] == "offline").then_some(()).ok_or(window)
    })
    .await;
    let window = find().await;
    assert_eq!(window["online"], false, "{window}");
    assert_eq!(window["status"], "idle", "{window}");
    assert_eq!(window["repo"], "shop", "{window}");
    assert_eq!(window["branch"], "feature-x", "{window}");
    assert_eq!(window["role"], "reviewer", "{window}");
}

#[tokio::test]
async fn a_profile_switch_stays_in_the_team_and_lists_what_stays_behind() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let bob = app.agent("acme", "bob").await;
    app.team("other").await;
    let carol = app.agent("other", "carol").await;
    app.mcp(&alice, None)
        .await
        .call("create_task", json!({"key": "T-9", "title": "Migrate"}))
        .await
        .unwrap();
    let machine = Machine::with_team_profiles(
        &app.mcp_url(),
        &[
            ("work", "acme", "alice", &alice),
            ("as-bob", "acme", "bob", &bob),
            ("elsewhere", "other", "carol", &carol),
        ],
    );
    let lines = machine
        .drive(
            &["--host-session", "switch"],
            json!([
                {"op": "call", "tool": "claim_task", "arguments": {"key": "T-9"}},
                {"op": "call", "tool": "acquire_lock", "arguments": {"name": "db"}},
                {"op": "call", "tool": "configure_session", "arguments": {"profile": "elsewhere"}},
                {"op": "call", "tool": "configure_session", "arguments": {"profile": "as-bob"}},
                {"op": "call", "tool": "whoami"},
            ]),
        )
        .await;
    let calls = calls(&lines);
    assert_eq!(calls[1]["is_error"], false, "{:#?}", calls[1]);
    let refused = &calls[2];
    assert_eq!(refused["is_error"], true, "{refused:#}");
    let text = refused["text"].as_str().unwrap();
    assert!(
        text.contains("stays in the team") && text.contains("Nothing was changed"),
        "{text}"
    );

    let switched = &calls[3]["structured"];
    assert_eq!(calls[3]["is_error"], false, "{:#?}", calls[3]);
    let switch = &switched["profile_switch"];
    assert_eq!(switch["to"]["agent"], "bob", "{switched}");
    assert_eq!(switch["tasks_left_behind"][0]["key"], "T-9", "{switched}");
    assert_eq!(switch["locks_left_behind"][0]["name"], "db", "{switched}");
    assert_eq!(switched["session"]["agent"], "bob");
    assert_eq!(switched["session"]["profile"], "as-bob");
    let label = switched["session"]["label"].as_str().unwrap();
    assert_eq!(calls[4]["structured"]["agent"], "bob");
    assert_eq!(
        calls[4]["structured"]["session"], label,
        "the same window label"
    );

    let task = app
        .mcp(&bob, None)
        .await
        .call("get_task", json!({"key": "T-9"}))
        .await
        .unwrap();
    assert_eq!(task["holder"]["agent"], "alice", "the claim stayed: {task}");
}

#[tokio::test]
async fn proxy_config_prints_each_hosts_block_without_a_credential() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .arg("proxy-config")
            .args(args)
            .env("BUS_CONFIG_DIR", machine.config.path())
            .env("BUS_TOKEN", &alice)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            !stdout.contains(&alice) && !stdout.contains("acs_"),
            "{stdout}"
        );
        stdout
    };
    let claude: Value =
        serde_json::from_str(&run(&["--format", "json", "--profile", "work"])).unwrap();
    assert_eq!(
        claude["mcpServers"]["ai-crew-sync"],
        json!({"type": "stdio", "command": "ai-crew-sync", "args": ["mcp", "proxy", "--profile", "work"], "env": {}})
    );
    let cursor: Value = serde_json::from_str(&run(&["--host", "cursor"])).unwrap();
    assert_eq!(
        cursor["mcpServers"]["ai-crew-sync"],
        json!({"command": "ai-crew-sync", "args": ["mcp", "proxy"]})
    );
    let codex: toml::Table = toml::from_str(&run(&["--format", "toml"])).unwrap();
    assert_eq!(
        codex["mcp_servers"]["ai-crew-sync"]["args"],
        toml::Value::Array(vec!["mcp".into(), "proxy".into()])
    );
    let all = run(&[]);
    for place in [".mcp.json", "config.toml", ".cursor/mcp.json"] {
        assert!(all.contains(place), "{all}");
    }
}

#[tokio::test]
async fn a_bus_down_at_start_gives_the_local_tools_then_the_bus_tools_when_it_answers() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let gate = crate::support::proxy::Proxy::start(app.addr).await;
    gate.black_hole();
    let url = gate.url().replace("nats://", "http://") + "/mcp";
    let machine = Machine::with_team_profiles(&url, &[("work", "acme", "alice", &alice)]);
    let mut driver = Driver::start(&machine.script(
        &["--host-session", "late"],
        json!([
            {"op": "list_tools"},
            {"op": "call", "tool": "whoami"},
            {"op": "pause"},
            {"op": "wait_tools", "name": "claim_task", "timeout": 90},
            {"op": "call", "tool": "whoami"},
        ]),
    ));
    let before = driver.until_pause().await;
    let instructions = step(&before, "initialize")[0]["instructions"]
        .as_str()
        .unwrap();
    assert!(instructions.contains("not connected"), "{instructions}");
    let tools = &step(&before, "list_tools")[0]["tools"];
    assert_eq!(tools, &json!(["session_status", "configure_session"]));
    let whoami = calls(&before)[0];
    assert_eq!(whoami["is_error"], true);
    let text = whoami["text"].as_str().unwrap();
    assert!(text.contains("not connected"), "{whoami}");
    // Not a transport's words: which bus, what to check, that nothing is lost.
    assert!(text.contains(&format!("the bus at {url}")), "{whoami}");
    assert!(
        text.contains("did not answer") || text.contains("has not answered"),
        "{whoami}"
    );
    assert!(text.contains("context show"), "{whoami}");
    assert!(text.contains("Nothing is lost"), "{whoami}");

    gate.pass();
    gate.cut();
    driver.resume().await;
    let after = driver.rest().await;
    assert_eq!(step(&after, "wait_tools")[0]["found"], true, "{after:#?}");
    // The host was told, not left to poll.
    let told = &closed(&after)["notifications"];
    assert_eq!(
        told,
        &json!(["notifications/tools/list_changed"]),
        "{after:#?}"
    );
    let whoami = calls(&after)[0];
    assert_eq!(whoami["is_error"], false, "{whoami}");
    assert_eq!(whoami["structured"]["agent"], "alice");
}

#[tokio::test]
async fn the_window_credential_is_renewed_at_half_life_and_keeps_its_epoch() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    // The shortest lifetime the bus grants: renewed 30 s after it was issued.
    let mut driver = Driver::start(&machine.script(
        &["--host-session", "renew", "--session-ttl-seconds", "60"],
        json!([
            {"op": "call", "tool": "session_status"},
            {"op": "pause"},
            {"op": "call", "tool": "session_status"},
            {"op": "call", "tool": "whoami"},
        ]),
    ));
    let before = driver.until_pause().await;
    let status = &calls(&before)[0]["structured"];
    let label = status["label"].as_str().unwrap().to_string();
    let row = || async {
        sqlx::query_as::<_, (chrono::DateTime<chrono::Utc>, i64)>(
            "SELECT expires_at, epoch FROM agent_sessions WHERE label = $1",
        )
        .bind(&label)
        .fetch_one(&app.pool)
        .await
        .unwrap()
    };
    let (issued_until, epoch) = row().await;
    assert_eq!(status["credential_epoch"], epoch);
    // Wait for the renewal (a bound only against hanging forever).
    eventually(
        &format!("the credential of {label} to be renewed"),
        async || row().await.0 > issued_until,
    )
    .await;
    driver.resume().await;
    let after = driver.rest().await;
    let calls = calls(&after);
    let (renewed_until, epoch_now) = row().await;
    assert_eq!(epoch_now, epoch, "a renewal keeps the epoch");
    assert!(renewed_until > issued_until);
    assert_eq!(calls[0]["structured"]["credential_epoch"], epoch);
    assert_eq!(calls[1]["is_error"], false, "{:#?}", calls[1]);
    assert_eq!(calls[1]["structured"]["session"], label.as_str());
}

/// The hooks of a host conversation speak as the window its proxy holds:
/// the proxy keeps the window's record, `context hook` with the same
/// conversation id finds it (no token of its own) and reports what was sent
/// to exactly that window.
#[tokio::test]
async fn a_hook_of_the_same_host_conversation_speaks_as_the_proxys_window() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let lines = machine
        .drive(
            &["--host-session", "conv-77"],
            json!([{"op": "call", "tool": "session_status"}]),
        )
        .await;
    let label = calls(&lines)[0]["structured"]["label"]
        .as_str()
        .unwrap()
        .to_string();
    bob.call(
        "post_message",
        json!({"to": format!("alice/{label}"), "body": "need your review on PR 9"}),
    )
    .await
    .unwrap();

    let start = crate::hooks::hook(
        machine.config.path(),
        "session_start",
        crate::hooks::payload("conv-77", "SessionStart", json!({"source": "resume"})),
    )
    .await;
    let context = crate::hooks::context_of(&start, "SessionStart");
    assert!(context.contains(&format!("alice/{label}")), "{context}");
    assert!(context.contains("need your review on PR 9"), "{context}");
    let other = crate::hooks::hook(
        machine.config.path(),
        "session_start",
        crate::hooks::payload("conv-78", "SessionStart", json!({"source": "startup"})),
    )
    .await;
    assert_eq!(
        other.stdout, "",
        "another conversation has no window here: {other:?}"
    );
}

/// Claude Code runs the `session_end` hook when a conversation ends, before
/// it stops the conversation's MCP servers: the hook takes the proxy's window
/// offline at once.
#[tokio::test]
async fn the_session_end_hook_takes_the_proxys_window_offline() {
    let app = spawn_app().await;
    let alice = acme_with_alice(&app).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let (mut driver, label) = paused_proxy(&machine, "conv-end").await;
    let state = async || listed_window(&bob, &label).await["state"].clone();
    assert_eq!(state().await, "online");

    let end = crate::hooks::hook(
        machine.config.path(),
        "session_end",
        crate::hooks::payload("conv-end", "SessionEnd", json!({"reason": "logout"})),
    )
    .await;
    assert_eq!((end.code, end.stdout.as_str()), (Some(0), ""), "{end:?}");
    eventually("the window is offline", async || {
        let now = state().await;
        (now == "offline").then_some(()).ok_or(now)
    })
    .await;
    driver.resume().await;
    closed(&driver.rest().await);
}
