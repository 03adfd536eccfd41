//! Issue 36, items 1 and 2: the README's path from nothing to two connected
//! agents, walked with the binary alone from an empty home directory
//! (`serve`; `quickstart` per agent, which finds the running server and keeps
//! the token in a profile; `proxy-config`; `context verify`; two `mcp proxy`
//! processes driven by the official MCP Python SDK exchanging a direct
//! message and a channel message), with no token in any file written but
//! the profile store. And no silent second installation: a command about to
//! create a new embedded cluster says where and that no server uses it, the
//! server's first hint names its database, a token the server does not know
//! is refused when a profile is added (naming the server asked), and
//! `doctor` says when the server a profile names does not answer.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::{Value, json};

use crate::proxy::Driver;
use crate::support::postgres::{fresh_database_url, migrated_database_url};
use crate::support::{eventually, free_port, http_client, spawn_app};

const BINARY: &str = env!("CARGO_BIN_EXE_ai-crew-sync");

/// An empty home directory: HOME and the XDG directories point into it, and
/// nothing else from the machine's environment reaches the binary but PATH.
struct Home {
    root: tempfile::TempDir,
    database_url: String,
}

impl Home {
    fn new(database_url: String) -> Home {
        let root = tempfile::Builder::new()
            .prefix("acs-newcomer-")
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(root.path().join("home/project")).unwrap();
        Home { root, database_url }
    }

    fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    fn project(&self) -> PathBuf {
        self.home().join("project")
    }

    fn profiles_file(&self) -> PathBuf {
        self.home().join(".config/ai-crew-sync/profiles.toml")
    }

    /// What every process of this machine sees.
    fn env(&self) -> Vec<(&'static str, PathBuf)> {
        let home = self.home();
        vec![
            ("PATH", PathBuf::from(std::env::var("PATH").unwrap())),
            ("HOME", home.clone()),
            ("XDG_CONFIG_HOME", home.join(".config")),
            ("XDG_DATA_HOME", home.join(".local/share")),
        ]
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BINARY);
        command
            .env_clear()
            .envs(self.env())
            .env("DATABASE_URL", &self.database_url)
            .current_dir(self.project())
            .args(args);
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// stdout of a command that must succeed.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `serve` on `port`, its log in `log`.
    fn serve(&self, port: u16, log: &Path) -> Child {
        self.command(&["serve", "--bind", &format!("127.0.0.1:{port}")])
            .args(["--metrics-bind", "off"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap()
    }

    /// The tokens the profile store holds, by profile.
    fn profile_token(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.profiles_file()).unwrap();
        let parsed: toml::Value = toml::from_str(&text).unwrap();
        parsed["profiles"][name]["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The Python SDK's stdio client, running `mcp proxy --profile NAME` as
    /// a host on this machine would.
    fn proxy(&self, profile: &str, steps: Value) -> Driver {
        let env: serde_json::Map<String, Value> = self
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect();
        let script = json!({
            "command": BINARY,
            "args": ["mcp", "proxy", "--profile", profile],
            "env": env,
            "cwd": self.project(),
            "steps": steps,
        });
        Driver::start(&script.to_string())
    }
}

/// Every file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

async fn wait_healthy(port: u16, serve: &mut Child, log: &Path) {
    eventually("serve to answer /health", async || {
        if let Some(status) = serve.try_wait().unwrap() {
            panic!(
                "serve exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        http_client()
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await;
}

fn active_tokens_of(home: &Home, agent: &str) -> usize {
    let list: Value =
        serde_json::from_str(&home.ok(&["token", "list", "--team", "acme", "--json"])).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .filter(|t| t["agent"] == agent && t["revoked_at"].is_null())
        .count()
}

/// The done-when test of issue 36: the README's first screen, from an empty
/// home directory, to two agents whose proxies exchange a DM and a channel
/// message; no token anywhere but the profile store.
// Breakage: with quickstart's old default URL (127.0.0.1:8787) the profiles
// point at no server and `context verify` fails; with the token printed or
// put in a host config, the scan at the end names the file.
#[tokio::test]
async fn from_an_empty_home_to_two_agents_talking_through_their_proxies() {
    let home = Home::new(fresh_database_url().await);
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("serve.log");
    let port = free_port();
    let mut serve = home.serve(port, &log);
    wait_healthy(port, &mut serve, &log).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    // The first hint names the database and the command to run next.
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("no teams yet in this server's database (postgres://")
            && said.contains("with the same DATABASE_URL as this server")
            && said.contains("quickstart --team my-team --agent my-agent --profile my-agent"),
        "{said}"
    );

    let first = home.ok(&["quickstart", "--team", "acme", "--agent", "alice"]);
    let alice_first = home.profile_token("alice");
    assert!(alice_first.starts_with("acs_"));
    assert!(!first.contains(&alice_first), "no token on screen: {first}");
    assert!(
        first.contains(&format!(
            "server: {url} (recorded by the server on this database)"
        )) && first.contains("it answers.")
            && first.contains("ai-crew-sync proxy-config")
            && first.contains("ai-crew-sync context verify"),
        "{first}"
    );
    let bob_said = home.ok(&[
        "quickstart",
        "--team",
        "acme",
        "--agent",
        "bob",
        "--profile",
        "bob",
    ]);
    assert!(
        bob_said.contains("proxy-config --profile bob")
            && bob_said.contains("context verify --profile bob"),
        "{bob_said}"
    );

    // Run again: says what exists, mints nothing, changes nothing.
    let again = home.ok(&["quickstart", "--team", "acme", "--agent", "alice"]);
    assert!(
        again.contains("team `acme` exists; agent `alice` exists.")
            && again.contains("no token minted (--new-token"),
        "{again}"
    );
    assert_eq!(active_tokens_of(&home, "alice"), 1, "{again}");
    assert_eq!(home.profile_token("alice"), alice_first);
    // Asked, it mints one and puts it in the profile.
    let renewed = home.ok(&[
        "quickstart",
        "--team",
        "acme",
        "--agent",
        "alice",
        "--new-token",
        "--json",
    ]);
    let renewed: Value = serde_json::from_str(&renewed).unwrap();
    assert_eq!(renewed["token_minted"], true, "{renewed}");
    assert!(
        renewed.get("token").is_none(),
        "no token unless asked: {renewed}"
    );
    assert_eq!(active_tokens_of(&home, "alice"), 2);
    let alice = home.profile_token("alice");
    let bob = home.profile_token("bob");
    assert_ne!(alice, alice_first);

    // The host configs, as the README says to make them.
    let claude = home.ok(&["proxy-config", "--host", "claude-code"]);
    std::fs::write(home.project().join(".mcp.json"), &claude).unwrap();
    let codex = home.ok(&["proxy-config", "--profile", "bob", "--format", "toml"]);
    std::fs::create_dir_all(home.home().join(".codex")).unwrap();
    std::fs::write(home.home().join(".codex/config.toml"), &codex).unwrap();
    for (profile, agent) in [("alice", "alice"), ("bob", "bob")] {
        let verified = home.ok(&["context", "verify", "--profile", profile]);
        assert!(
            verified.contains(&format!("ok: {url} answers as agent {agent} of team acme")),
            "{verified}"
        );
    }

    // Two proxies at once: bob's is connected while alice's sends.
    let mut bob_proxy = home.proxy(
        "bob",
        json!([
            {"op": "list_tools"},
            {"op": "pause"},
            {"op": "call", "tool": "read_messages", "arguments": {"scope": "all"}},
        ]),
    );
    let opened = bob_proxy.until_pause().await;
    assert!(
        opened[1]["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("read_messages")),
        "{opened:?}"
    );
    let alice_said = home
        .proxy(
            "alice",
            json!([
                {"op": "call", "tool": "post_message",
                 "arguments": {"to": "bob", "body": "can you review the login form?"}},
                {"op": "call", "tool": "post_message",
                 "arguments": {"channel": "general", "body": "deploy at five"}},
            ]),
        )
        .rest()
        .await;
    for line in alice_said.iter().filter(|l| l["step"] == "call") {
        assert_eq!(line["is_error"], false, "{line}");
    }
    bob_proxy.resume().await;
    let bob_read = bob_proxy.rest().await;
    let read = bob_read
        .iter()
        .find(|l| l["step"] == "call" && l["tool"] == "read_messages")
        .expect("bob read");
    assert_eq!(read["is_error"], false, "{read}");
    let messages = read["structured"]["messages"].as_array().unwrap();
    let dm = messages
        .iter()
        .find(|m| m["body"] == "can you review the login form?")
        .unwrap_or_else(|| panic!("bob got alice's DM: {read}"));
    assert_eq!(dm["to"], "bob", "{dm}");
    let posted = messages
        .iter()
        .find(|m| m["body"] == "deploy at five")
        .unwrap_or_else(|| panic!("bob read the channel: {read}"));
    assert_eq!(posted["channel"], "general", "{posted}");

    // quickstart beside another database, pointed at this server: the
    // second installation is named at once, not at the first 401.
    let other = fresh_database_url().await;
    let stray = home
        .command(&[
            "quickstart",
            "--team",
            "acme",
            "--agent",
            "carol",
            "--profile",
            "stray",
            "--url",
            &url,
        ])
        .env("DATABASE_URL", &other)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&stray.stdout);
    assert!(stray.status.success(), "{said}");
    assert!(
        said.contains("it answers, but does not know this token (401)"),
        "{said}"
    );

    // No token in any file but the profile store.
    let mut written = Vec::new();
    files(home.root.path(), &mut written);
    assert!(written.contains(&home.project().join(".mcp.json")));
    for file in written {
        if file == home.profiles_file() {
            continue;
        }
        let bytes = std::fs::read(&file).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        for token in [&alice_first, &alice, &bob] {
            assert!(
                !text.contains(token.as_str()),
                "{} holds a token: {text}",
                file.display()
            );
        }
    }
    crate::binary::sigterm_and_wait(serve);
}

/// Issue 36 item 2: a command run where no cluster exists says, before
/// creating one, where and that no server uses it; the next one, finding
/// it, says nothing.
#[tokio::test]
async fn a_command_about_to_create_a_new_cluster_says_where_and_that_no_server_uses_it() {
    let dir = tempfile::Builder::new()
        .prefix("acs-new-cluster-")
        .tempdir()
        .unwrap();
    let data = dir.path().join("data");
    let run = || {
        Command::new(BINARY)
            .env_remove("DATABASE_URL")
            .env_remove("BUS_DATA_DIR")
            .arg("--data-dir")
            .arg(&data)
            .args(["team", "list"])
            .output()
            .unwrap()
    };
    let first = run();
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "creating a new embedded PostgreSQL cluster in {}: no server uses it",
            data.join("pgdata").display()
        )) && stderr.contains("--data-dir (BUS_DATA_DIR) or DATABASE_URL"),
        "{stderr}"
    );
    let second = run();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{stderr}");
    assert!(!stderr.contains("creating a new"), "{stderr}");
}

/// `context profile add` asks the server who the token is: one it does not
/// know is refused naming the server and what to do, one of another agent
/// too, and nothing is written.
#[tokio::test]
async fn a_profile_is_added_only_with_a_token_its_server_knows() {
    let app = spawn_app().await;
    app.team("acme").await;
    let bob = app.agent("acme", "bob").await;
    let config = tempfile::tempdir().unwrap();
    let url = app.mcp_url();
    // Off the test's runtime thread, which also serves the app being asked.
    let add = |token: String| {
        let config = config.path().to_path_buf();
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let mut child = Command::new(BINARY)
                .env("BUS_CONFIG_DIR", &config)
                .args([
                    "context", "profile", "add", "--name", "work", "--url", &url, "--team", "acme",
                    "--agent", "alice",
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write as _;
            writeln!(child.stdin.take().unwrap(), "{token}").unwrap();
            child.wait_with_output().unwrap()
        })
    };
    let unknown = add(format!("acs_{}", "0".repeat(64))).await.unwrap();
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert_eq!(unknown.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{url} does not know that token (401)"))
            && stderr.contains("another installation")
            && stderr.contains("--url"),
        "{stderr}"
    );
    assert!(!config.path().join("profiles.toml").exists());

    let someone_else = add(bob).await.unwrap();
    let stderr = String::from_utf8_lossy(&someone_else.stderr);
    assert_eq!(someone_else.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the token is agent \"bob\", not \"alice\""),
        "{stderr}"
    );
    assert!(!config.path().join("profiles.toml").exists());
}

/// `doctor` checks the server the profile names, and the one this database's
/// `serve` recorded: one that does not answer is named with its URL.
#[tokio::test]
async fn doctor_names_the_server_that_does_not_answer() {
    let database_url = migrated_database_url().await;
    let config = tempfile::tempdir().unwrap();
    let here = tempfile::tempdir().unwrap();
    let nowhere = format!("http://127.0.0.1:{}/mcp", free_port());
    let profiles = config.path().join("profiles.toml");
    std::fs::write(
        &profiles,
        format!(
            "default = \"work\"\n[profiles.work]\nurl = \"{nowhere}\"\nteam = \"acme\"\n\
             agent = \"alice\"\ntoken = \"acs_{}\"\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&profiles, std::fs::Permissions::from_mode(0o600)).unwrap();
    let pool = ai_crew_sync::db::connect(&database_url, 2).await.unwrap();
    let recorded = format!("http://127.0.0.1:{}", free_port());
    ai_crew_sync::store::operations::listeners::record(&pool, &recorded, "here", 1)
        .await
        .unwrap();
    pool.close().await;

    let doctor = |config: &Path| {
        let out = Command::new(BINARY)
            .env("DATABASE_URL", &database_url)
            .env("BUS_CONFIG_DIR", config)
            .env_remove("BUS_PROFILE")
            .current_dir(here.path())
            .args(["doctor", "--json"])
            .output()
            .unwrap();
        let checks: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        });
        (out.status.success(), checks)
    };
    let named = |checks: &[Value], name: &str| -> Value {
        checks
            .iter()
            .find(|c| c["check"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {checks:#?}"))
    };
    let (passed, checks) = doctor(config.path());
    assert!(
        !passed,
        "a profile whose server does not answer fails doctor"
    );
    let profile = named(&checks, "profile");
    assert_eq!(profile["status"], "fail", "{profile}");
    let verdict = profile["verdict"].as_str().unwrap();
    assert!(
        verdict.contains(&format!("profile work points at {nowhere}"))
            && verdict.contains("nothing answers"),
        "{profile}"
    );
    let server = named(&checks, "server");
    assert_eq!(server["status"], "warn", "{server}");
    assert!(
        server["verdict"]
            .as_str()
            .unwrap()
            .contains(&format!("last listened at {recorded}/mcp")),
        "{server}"
    );

    // Without a profile, only the recorded server is checked (a warning).
    let empty = tempfile::tempdir().unwrap();
    let (_, checks) = doctor(empty.path());
    assert!(
        checks.iter().all(|c| c["check"] != "profile"),
        "{checks:#?}"
    );
    assert_eq!(named(&checks, "server")["status"], "warn");
}
