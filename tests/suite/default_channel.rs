//! Issue 36 item 3: one default channel. The bus alone decides a window's
//! default channel (the channel set for the window, else its project
//! label's, else its window label's), and every surface says the same: the
//! proxy's instructions and `session_status`, `whoami`, where a post naming
//! neither channel nor recipient lands, `team_digest`'s focus, and the
//! console's `whoami` and `digest`. Each source is set in turn through what
//! a person uses: `.acs.toml` and `configure_session` through the real
//! proxy, the heartbeat's `project`, the window name, and `.acs.toml` at the
//! console.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::proxy::{Driver, Machine, calls};
use crate::support::{TestApp, spawn_app};

/// Every surface's default channel for one window, by name.
type Surfaces = Vec<(&'static str, Option<String>)>;

/// `client ARGS…` as alice's window `session`, run in `dir`; its stdout.
async fn console(app: &TestApp, token: &str, session: &str, dir: &Path, args: &[&str]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
    command
        .arg("client")
        .args(args)
        .env("BUS_URL", app.url("/mcp"))
        .env("BUS_TOKEN", token)
        .env("BUS_SESSION", session)
        .env_remove("BUS_PROFILE")
        .env("BUS_CONFIG_DIR", crate::context::no_profiles_dir())
        .env_remove("RUST_LOG")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // On a blocking thread: the test's runtime must stay free to serve.
    let out = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "client {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The console's surfaces for window `session`: whoami (JSON and text) and
/// digest (JSON and text).
async fn console_surfaces(
    app: &TestApp,
    token: &str,
    session: &str,
    dir: &Path,
    surfaces: &mut Surfaces,
) {
    let me: Value =
        serde_json::from_str(&console(app, token, session, dir, &["whoami", "--json"]).await)
            .unwrap();
    surfaces.push(("console whoami", as_name(&me["default_channel"])));
    let text = console(app, token, session, dir, &["whoami"]).await;
    surfaces.push((
        "console whoami text",
        after(&text, "default channel: ", &[' ', ';']).filter(|c| c != "-"),
    ));
    let digest: Value =
        serde_json::from_str(&console(app, token, session, dir, &["digest", "--json"]).await)
            .unwrap();
    surfaces.push(("console digest", as_name(&digest["focus"])));
    let text = console(app, token, session, dir, &["digest"]).await;
    surfaces.push(("console digest text", after(&text, "focus #", &[' ', '\n'])));
}

fn as_name(value: &Value) -> Option<String> {
    value.as_str().map(str::to_string)
}

/// The word after `mark` in `text`, up to one of `ends`.
fn after(text: &str, mark: &str, ends: &[char]) -> Option<String> {
    let start = text.find(mark)? + mark.len();
    let rest = &text[start..];
    let end = rest.find(ends).unwrap_or(rest.len());
    Some(rest[..end].trim_end_matches('.').to_string())
}

/// One proxy conversation `host` of alice's, run in `dir`: the surfaces it
/// shows (instructions, session_status, whoami, a post naming no channel,
/// team_digest), after `before` (steps run first). Returns the window label.
async fn proxy_surfaces(
    machine: &Machine,
    host: &str,
    dir: &Path,
    before: Value,
    body: &str,
    surfaces: &mut Surfaces,
) -> String {
    let mut steps = before.as_array().unwrap().clone();
    let first = steps.len();
    steps.extend(
        json!([
            {"op": "call", "tool": "session_status"},
            {"op": "call", "tool": "whoami"},
            {"op": "call", "tool": "post_message", "arguments": {"body": body}},
            {"op": "call", "tool": "team_digest"},
        ])
        .as_array()
        .unwrap()
        .iter()
        .cloned(),
    );
    let mut script: Value =
        serde_json::from_str(&machine.script(&["--host-session", host], Value::Array(steps)))
            .unwrap();
    script["cwd"] = json!(dir);
    let lines = Driver::start(&script.to_string()).rest().await;
    let instructions = lines
        .iter()
        .find(|l| l["step"] == "initialize")
        .and_then(|l| l["instructions"].as_str())
        .unwrap()
        .to_string();
    let calls = calls(&lines);
    for call in &calls {
        assert_eq!(call["is_error"], false, "{call:#?}");
    }
    let status = &calls[first]["structured"];
    surfaces.push((
        "instructions",
        after(&instructions, "Default channel: #", &[',', ' ']),
    ));
    surfaces.push(("session_status", as_name(&status["default_channel"])));
    surfaces.push((
        "whoami",
        as_name(&calls[first + 1]["structured"]["default_channel"]),
    ));
    surfaces.push((
        "post without channel",
        as_name(&calls[first + 2]["structured"]["message"]["channel"]),
    ));
    surfaces.push((
        "team_digest focus",
        as_name(&calls[first + 3]["structured"]["focus"]),
    ));
    status["label"].as_str().unwrap().to_string()
}

fn all_say(surfaces: &Surfaces, expected: &str, source: &str) {
    for (surface, said) in surfaces {
        assert_eq!(
            said.as_deref(),
            Some(expected),
            "{source}: {surface} names another default channel: {surfaces:#?}"
        );
    }
}

/// A directory at the top of a git work tree, with this `.acs.toml`.
fn tree_with(acs_toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(".git")).unwrap();
    if !acs_toml.is_empty() {
        std::fs::write(dir.path().join(".acs.toml"), acs_toml).unwrap();
    }
    dir
}

/// Alice's window of host conversation `one`, seen through every surface.
struct Window<'a> {
    app: &'a TestApp,
    alice: &'a str,
    machine: &'a Machine,
    label: String,
    /// A work tree without `.acs.toml`.
    plain: &'a Path,
}

impl Window<'_> {
    /// `configure_session ARGUMENTS` in a conversation of the window, then
    /// every surface in it (but its instructions, written before) and at
    /// the console; then the window's next conversation, instructions
    /// included. Each posts `source` (then `source, next`) naming no channel.
    async fn configure(&self, arguments: Value, expected: &str, source: &str) {
        let mut surfaces = Surfaces::new();
        let configure =
            json!([{"op": "call", "tool": "configure_session", "arguments": arguments}]);
        proxy_surfaces(
            self.machine,
            "one",
            self.plain,
            configure,
            source,
            &mut surfaces,
        )
        .await;
        surfaces.retain(|(surface, _)| *surface != "instructions");
        console_surfaces(self.app, self.alice, &self.label, self.plain, &mut surfaces).await;
        all_say(&surfaces, expected, source);
        let mut surfaces = Surfaces::new();
        let next = format!("{source}, next");
        proxy_surfaces(
            self.machine,
            "one",
            self.plain,
            json!([]),
            &next,
            &mut surfaces,
        )
        .await;
        all_say(&surfaces, expected, &next);
    }
}

#[tokio::test]
async fn every_surface_names_the_one_default_channel_whichever_source_sets_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let bus = app.mcp(&alice, None).await;
    let plain = tree_with("");

    // 1. .acs.toml names the channel and the project: the channel it names
    // wins everywhere (the reproduction said #billing in four places
    // and #billing-dev in two).
    let billing = tree_with("project = \"billing\"\nchannel = \"billing-dev\"\n");
    let mut surfaces = Surfaces::new();
    let label = proxy_surfaces(
        &machine,
        "one",
        billing.path(),
        json!([]),
        "from the file",
        &mut surfaces,
    )
    .await;
    console_surfaces(&app, &alice, &label, plain.path(), &mut surfaces).await;
    all_say(&surfaces, "billing-dev", ".acs.toml channel");
    let me = app.mcp(&alice, Some(&label)).await;
    let whoami = me.call("whoami", json!({})).await.unwrap();
    assert_eq!(whoami["channel"], "billing-dev", "{whoami}");
    assert_eq!(whoami["default_channel_from"], "set", "{whoami}");

    let window = Window {
        app: &app,
        alice: &alice,
        machine: &machine,
        label: label.clone(),
        plain: plain.path(),
    };
    // 2. configure_session sets another channel (no .acs.toml from here on).
    window
        .configure(json!({"channel": "#Ops"}), "ops", "configured")
        .await;
    // 3. Cleared: the heartbeat's project (from .acs.toml at 1) names it.
    window
        .configure(json!({"channel": ""}), "billing", "project")
        .await;
    // 4. No channel, no project: the window label names it.
    window
        .configure(json!({"project": ""}), &label, "window")
        .await;

    // 5. At the console, .acs.toml's channel is told to the bus, which then
    // decides for that window as for any other.
    let mut surfaces = Surfaces::new();
    console_surfaces(&app, &alice, "desk", billing.path(), &mut surfaces).await;
    console(
        &app,
        &alice,
        "desk",
        billing.path(),
        &["send", "from the desk"],
    )
    .await;
    let desk = app.mcp(&alice, Some("desk")).await;
    let whoami = desk.call("whoami", json!({})).await.unwrap();
    surfaces.push(("whoami", as_name(&whoami["default_channel"])));
    let digest = desk.call("team_digest", json!({})).await.unwrap();
    surfaces.push(("team_digest focus", as_name(&digest["focus"])));
    all_say(&surfaces, "billing-dev", "console .acs.toml channel");
    // A wait focuses on the default channel too: told first.
    console(
        &app,
        &alice,
        "bench",
        billing.path(),
        &["wait", "--timeout", "1"],
    )
    .await;
    let bench = app.mcp(&alice, Some("bench")).await;
    let whoami = bench.call("whoami", json!({})).await.unwrap();
    assert_eq!(whoami["default_channel"], "billing-dev", "{whoami}");

    // Each post landed in the channel every surface named; nothing went to
    // a channel no surface named.
    let read = |scope: &str| {
        let bus = &bus;
        let scope = scope.to_string();
        async move {
            let read = bus
                .call("read_messages", json!({"scope": scope, "limit": 50}))
                .await
                .unwrap();
            read["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["body"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        read("billing-dev").await,
        ["from the file", "from the desk"]
    );
    assert_eq!(read("ops").await, ["configured", "configured, next"]);
    assert_eq!(read("billing").await, ["project", "project, next"]);
    assert_eq!(read(&label).await, ["window", "window, next"]);
    let channels = bus.call("list_channels", json!({})).await.unwrap();
    assert_eq!(
        channels["channels"].as_array().unwrap().len(),
        4,
        "{channels}"
    );
}

#[tokio::test]
async fn a_channel_that_cannot_be_a_default_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let window = app.mcp(&alice, Some("w1")).await;
    window
        .call("heartbeat", json!({"channel": "ops"}))
        .await
        .unwrap();
    for (channel, says) in [
        ("inbox", "read_messages scopes"),
        ("no spaces", "is not valid"),
    ] {
        let err = window
            .call("heartbeat", json!({"channel": channel, "project": "web"}))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{channel}: {err}");
        assert!(err.contains("Nothing was written"), "{channel}: {err}");
    }
    let me = window.call("whoami", json!({})).await.unwrap();
    assert_eq!(me["default_channel"], "ops", "{me}");
    assert_eq!(me["project"], Value::Null, "nothing was written: {me}");

    // A proxy whose .acs.toml names such a channel still connects, and says
    // why its window has none of its own.
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let dir = tree_with("channel = \"inbox\"\n");
    let mut script: Value = serde_json::from_str(&machine.script(
        &["--host-session", "bad"],
        json!([{"op": "call", "tool": "session_status"}]),
    ))
    .unwrap();
    script["cwd"] = json!(dir.path());
    let lines = Driver::start(&script.to_string()).rest().await;
    let status = &calls(&lines)[0]["structured"];
    assert_eq!(status["connected"], true, "{status}");
    assert!(
        status["channel_refused"]
            .as_str()
            .is_some_and(|why| why.contains("inbox")),
        "{status}"
    );
    let label = status["label"].as_str().unwrap();
    assert_eq!(status["default_channel"], label, "{status}");
}
