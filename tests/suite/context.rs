//! `context …`: local profiles, `.acs.toml` and what applies where, through
//! the real binary against a spawned server, as a person at a terminal (or a
//! script piping the token) uses them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{TestApp, spawn_app};

/// A config directory that holds no profiles, for runs that must not see
/// the profiles of whoever runs the tests.
pub fn no_profiles_dir() -> PathBuf {
    std::env::temp_dir().join(format!("acs-no-profiles-{}", std::process::id()))
}

/// One person's machine: a config directory of its own and a working directory.
#[derive(Clone)]
struct Machine {
    config: std::sync::Arc<tempfile::TempDir>,
    env: Vec<(String, String)>,
}

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        assert_eq!(self.code, Some(0), "{self:?}");
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("no JSON ({e}): {self:?}"))
    }
}

impl Machine {
    fn new() -> Machine {
        Machine {
            config: std::sync::Arc::new(tempfile::tempdir().unwrap()),
            env: Vec::new(),
        }
    }

    /// The same machine (same profiles) with one more variable set.
    fn with_env(&self, name: &str, value: &str) -> Machine {
        let mut machine = self.clone();
        machine.env.push((name.into(), value.into()));
        machine
    }

    async fn run(&self, dir: &Path, args: &[&str], stdin: &str) -> Run {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .args(args)
            .current_dir(dir)
            .env("BUS_CONFIG_DIR", self.config.path())
            .env_remove("BUS_URL")
            .env_remove("BUS_TOKEN")
            .env_remove("BUS_PROFILE")
            .env_remove("BUS_SESSION")
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let stdin = stdin.to_string();
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut child = command.spawn().expect("run ai-crew-sync");
            child
                .stdin
                .take()
                .unwrap()
                .write_all(stdin.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            Run {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
        })
        .await
        .unwrap()
    }

    async fn ok(&self, dir: &Path, args: &[&str]) -> String {
        let run = self.run(dir, args, "").await;
        assert_eq!(run.code, Some(0), "{args:?}: {run:?}");
        run.stdout
    }

    async fn add_profile(&self, app: &TestApp, name: &str, agent: &str, token: &str) {
        let url = app.url("/mcp");
        let run = self
            .run(
                self.config.path(),
                &[
                    "context", "profile", "add", "--name", name, "--url", &url, "--team", "acme",
                    "--agent", agent,
                ],
                &format!("{token}\n"),
            )
            .await;
        assert_eq!(run.code, Some(0), "{run:?}");
        assert!(!run.stdout.contains(token) && !run.stderr.contains(token));
    }

    fn profiles_file(&self) -> PathBuf {
        self.config.path().join("profiles.toml")
    }
}

#[tokio::test]
async fn a_profile_keeps_the_token_private_and_the_client_speaks_as_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let machine = Machine::new();
    let nowhere = tempfile::tempdir().unwrap();

    machine.add_profile(&app, "work", "alice", &token).await;

    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&machine.profiles_file()), 0o600);
    let listed = machine
        .run(
            nowhere.path(),
            &["context", "profile", "list", "--json"],
            "",
        )
        .await
        .json();
    assert_eq!(listed[0]["name"], "work");
    assert_eq!(
        listed[0]["default"], true,
        "the first profile is the default"
    );
    let shown = machine
        .run(nowhere.path(), &["context", "show", "--json"], "")
        .await;
    assert!(
        !shown.stdout.contains(&token),
        "show never prints the token"
    );
    let shown = shown.json();
    assert_eq!(shown["profile"]["value"], "work");
    assert!(
        shown["profile"]["from"]
            .as_str()
            .unwrap()
            .contains("default profile"),
        "{shown}"
    );
    assert_eq!(shown["agent"]["value"], "alice");
    assert_eq!(shown["url"]["value"], app.url("/mcp"));

    let verified = machine.ok(nowhere.path(), &["context", "verify"]).await;
    assert!(verified.contains("agent alice of team acme"), "{verified}");
    // No BUS_TOKEN anywhere: the console client takes the profile.
    let me: Value = serde_json::from_str(
        &machine
            .ok(nowhere.path(), &["client", "whoami", "--json"])
            .await,
    )
    .unwrap();
    assert_eq!(me["agent"], "alice");
    // `--json` belongs to the whole command line: before the command too.
    let me_again: Value = serde_json::from_str(
        &machine
            .ok(nowhere.path(), &["--json", "client", "whoami"])
            .await,
    )
    .unwrap();
    assert_eq!(me_again["agent"], "alice");
}

#[tokio::test]
async fn acs_toml_names_the_profile_project_and_channel_for_its_tree() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let machine = Machine::new();
    machine.add_profile(&app, "mine", "alice", &alice).await;
    machine.add_profile(&app, "bob-here", "bob", &bob).await;

    let repo = tempfile::tempdir().unwrap();
    std::fs::create_dir(repo.path().join(".git")).unwrap();
    let deep = repo.path().join("src/lib");
    std::fs::create_dir_all(&deep).unwrap();
    machine
        .ok(
            &deep,
            &[
                "context",
                "set-project",
                "--profile",
                "bob-here",
                "--project",
                "billing",
                "--channel",
                "billing-dev",
                "--role",
                "backend",
            ],
        )
        .await;
    let file = repo.path().join(".acs.toml");
    let text = std::fs::read_to_string(&file).expect("written at the top of the work tree");
    assert!(!text.contains("acs_"), "no secret in .acs.toml: {text}");

    let shown = machine
        .run(&deep, &["context", "show", "--json"], "")
        .await
        .json();
    assert_eq!(shown["profile"]["value"], "bob-here");
    assert_eq!(shown["profile"]["from"], file.display().to_string());
    assert_eq!(shown["project"]["value"], "billing");
    assert_eq!(shown["channel"]["value"], "billing-dev");
    assert_eq!(shown["role"]["value"], "backend");

    // A post with no channel goes to the tree's channel, as the tree's profile.
    machine
        .ok(&deep, &["client", "send", "invoices", "are", "late"])
        .await;
    let reader = app.mcp(&alice, None).await;
    let read = reader
        .call("read_messages", serde_json::json!({"scope": "billing-dev"}))
        .await
        .unwrap();
    let messages = read["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{read}");
    assert_eq!(messages[0]["body"], "invoices are late");
    assert_eq!(messages[0]["from"], "bob");

    // BUS_PROFILE outranks the file; outside the tree the default applies.
    let shown = machine
        .with_env("BUS_PROFILE", "mine")
        .run(&deep, &["context", "show", "--json"], "")
        .await
        .json();
    assert_eq!(shown["profile"]["value"], "mine");
    assert_eq!(shown["profile"]["from"], "--profile / BUS_PROFILE");
    let elsewhere = tempfile::tempdir().unwrap();
    let shown = machine
        .run(elsewhere.path(), &["context", "show", "--json"], "")
        .await
        .json();
    assert_eq!(shown["profile"]["value"], "mine", "the first profile added");
    assert_eq!(shown["project"], Value::Null);
}

#[tokio::test]
async fn a_token_and_a_profile_together_are_refused_and_a_token_alone_works_as_before() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let here = tempfile::tempdir().unwrap();
    let machine = Machine::new()
        .with_env("BUS_TOKEN", &alice)
        .with_env("BUS_URL", &app.url("/mcp"));
    let me: Value = serde_json::from_str(
        &machine
            .ok(here.path(), &["client", "whoami", "--json"])
            .await,
    )
    .unwrap();
    assert_eq!(me["agent"], "alice");

    let both = machine
        .run(here.path(), &["client", "--profile", "work", "whoami"], "")
        .await;
    assert_eq!(both.code, Some(1), "{both:?}");
    assert!(both.stderr.contains("both a token"), "{}", both.stderr);
}

#[tokio::test]
async fn verify_names_a_profile_whose_token_speaks_for_another_agent() {
    let app = spawn_app().await;
    app.team("acme").await;
    let bob = app.agent("acme", "bob").await;
    let machine = Machine::new();
    // `profile add` refuses such a profile (newcomer.rs); one edited by hand
    // is still caught by `verify`.
    std::fs::write(
        machine.profiles_file(),
        format!(
            "default = \"mixed\"\n[profiles.mixed]\nurl = \"{}\"\nteam = \"acme\"\n\
             agent = \"alice\"\ntoken = \"{bob}\"\n",
            app.url("/mcp")
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        machine.profiles_file(),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let here = tempfile::tempdir().unwrap();
    let run = machine.run(here.path(), &["context", "verify"], "").await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("answers as agent \"bob\"") && run.stderr.contains("\"alice\""),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn unsafe_profiles_and_wrong_credentials_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let machine = Machine::new();
    let here = tempfile::tempdir().unwrap();
    let url = app.url("/mcp");
    let add = |stdin: String| {
        let url = url.clone();
        let machine = &machine;
        let here = here.path().to_path_buf();
        async move {
            machine
                .run(
                    &here,
                    &[
                        "context", "profile", "add", "--name", "p", "--url", &url, "--team",
                        "acme", "--agent", "alice",
                    ],
                    &stdin,
                )
                .await
        }
    };
    for (secret, words) in [
        ("acss_0123".to_string(), "session credential"),
        ("acsa_0123".to_string(), "admin credential"),
        ("hello".to_string(), "does not look like an agent token"),
        (String::new(), "no credential given"),
    ] {
        let run = add(format!("{secret}\n")).await;
        assert_eq!(run.code, Some(1), "{run:?}");
        assert!(run.stderr.contains(words), "{secret}: {}", run.stderr);
        assert!(!machine.profiles_file().exists(), "nothing written");
    }

    machine.add_profile(&app, "p", "alice", &alice).await;
    std::fs::set_permissions(
        machine.profiles_file(),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let run = machine.run(here.path(), &["client", "whoami"], "").await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("readable by others") && run.stderr.contains("chmod 600"),
        "{}",
        run.stderr
    );
}

/// Issue 33 item 10: a config directory others may write in is refused,
/// naming it and the fix, before a profile (a token) is written there or
/// read from it.
#[tokio::test]
async fn a_config_directory_others_may_write_in_is_refused_naming_it_and_the_fix() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let machine = Machine::new();
    let here = tempfile::tempdir().unwrap();
    let config = machine.config.path();
    let url = app.url("/mcp");
    let add = [
        "context", "profile", "add", "--name", "p", "--url", &url, "--team", "acme", "--agent",
        "alice",
    ];

    std::fs::set_permissions(config, std::fs::Permissions::from_mode(0o777)).unwrap();
    let run = machine.run(here.path(), &add, &format!("{alice}\n")).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains(&config.display().to_string())
            && run.stderr.contains("writable by its group or others")
            && run
                .stderr
                .contains(&format!("chmod 700 {}", config.display())),
        "{}",
        run.stderr
    );
    assert!(!machine.profiles_file().exists(), "nothing written");

    // Private again: the profile is written; opened up later, it is not read.
    std::fs::set_permissions(config, std::fs::Permissions::from_mode(0o700)).unwrap();
    machine.add_profile(&app, "p", "alice", &alice).await;
    std::fs::set_permissions(config, std::fs::Permissions::from_mode(0o775)).unwrap();
    let run = machine.run(here.path(), &["client", "whoami"], "").await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("chmod 700"), "{}", run.stderr);
}

/// Issue 33 item 10: the `.acs.toml` search stops at the top of the git work
/// tree or at `$HOME`; outside both only the current directory counts, so a
/// file planted in a shared directory above (`/tmp/.acs.toml`) chooses nothing.
#[tokio::test]
async fn an_acs_toml_above_the_work_tree_or_home_chooses_nothing() {
    let machine = Machine::new();
    let shared = tempfile::tempdir().unwrap(); // stands for /tmp
    std::fs::write(
        shared.path().join(".acs.toml"),
        "profile = \"planted\"\nproject = \"planted\"\n",
    )
    .unwrap();
    let home = shared.path().join("home");
    let work = shared.path().join("work/deeper");
    let repo = home.join("repo");
    let inside = repo.join("src");
    for dir in [&work, &inside] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::create_dir(repo.join(".git")).unwrap();
    let machine = machine.with_env("HOME", &home.display().to_string());
    let project_in = async |dir: &Path| {
        let run = machine
            .run(dir, &["context", "show", "--json"], "")
            .await
            .json();
        run["project"]["value"].clone()
    };

    assert_eq!(
        project_in(&work).await,
        Value::Null,
        "outside home and repo"
    );
    assert_eq!(project_in(&home).await, Value::Null, "above home");
    assert_eq!(project_in(&inside).await, Value::Null, "above the repo");

    // Within the line, the nearest file still wins.
    std::fs::write(home.join(".acs.toml"), "project = \"mine\"\n").unwrap();
    assert_eq!(project_in(&home).await, "mine");
    assert_eq!(
        project_in(&inside).await,
        Value::Null,
        "the repo is the top"
    );
    std::fs::write(repo.join(".acs.toml"), "project = \"repo\"\n").unwrap();
    assert_eq!(project_in(&inside).await, "repo");
    std::fs::write(work.join(".acs.toml"), "project = \"here\"\n").unwrap();
    assert_eq!(
        project_in(&work).await,
        "here",
        "the current directory counts"
    );
}

/// A `.git` is only a name: another user who plants `/tmp/.git` beside
/// `/tmp/.acs.toml` puts that file inside the search of everyone working
/// under `/tmp`. A project file that another user owns, or that every user
/// may write, is skipped with a warning naming it. Fails with
/// `not_trusted` answering `None`: the planted project is chosen.
#[tokio::test]
async fn a_project_file_another_user_owns_or_anyone_may_write_is_skipped() {
    use std::os::unix::fs::PermissionsExt;
    let machine = Machine::new();
    let shared = tempfile::tempdir().unwrap(); // stands for /tmp
    let scratch = shared.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::create_dir(shared.path().join(".git")).unwrap();
    let planted = shared.path().join(".acs.toml");
    std::fs::write(&planted, "project = \"planted\"\n").unwrap();
    let machine = machine.with_env("HOME", "/nonexistent");
    let show = async || {
        machine
            .run(&scratch, &["context", "show", "--json"], "")
            .await
    };

    // Another user's file (the suite runs as root here, which may hand it over).
    std::os::unix::fs::chown(&planted, Some(65534), None).unwrap();
    let run = show().await;
    assert_eq!(run.json()["project"]["value"], Value::Null, "{run:?}");
    assert!(
        run.stderr.contains("ignoring") && run.stderr.contains(&*planted.to_string_lossy()),
        "the skipped file is named: {run:?}"
    );
    // Yours, but anyone may write it.
    std::os::unix::fs::chown(&planted, Some(unsafe { libc::geteuid() }), None).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
    let run = show().await;
    assert_eq!(run.json()["project"]["value"], Value::Null, "{run:?}");
    // Yours and only yours to write: used.
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(show().await.json()["project"]["value"], "planted");
}
