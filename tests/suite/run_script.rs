//! `scripts/run`, the README's first command, as a new user runs it: with
//! PostgreSQL's server binaries off the search path it still serves
//! `/health` and keeps its data for the next run; when it would have to
//! install them and cannot, it says what to install and stops; with
//! DATABASE_URL it needs none of them.
//!
//! The script runs this suite's build of the binary (`ACS_RUN_BINARY`), not
//! its default release build, to keep the suite fast; everything before the
//! binary starts is the script as users run it. The install itself (apt-get
//! as root) is not exercised: this machine has PostgreSQL. Its refusal is, by
//! the script's one test hook (`ACS_PRETEND_NO_PG=1`: the search finds
//! nothing) and a genuinely unprivileged run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::binary::sigterm_and_wait;
use crate::support::postgres::fresh_database_url;
use crate::support::{McpClient, eventually, free_port, http_client};

const BINARY: &str = env!("CARGO_BIN_EXE_ai-crew-sync");

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A search path without PostgreSQL's server binaries. On this machine they
/// are under /usr/lib/postgresql/<version>/bin (with links in
/// /usr/local/bin), and `pg_config` (in /usr/bin) names that directory: that
/// is how the script and the embedded manager still find them.
const BARE_PATH: &str = "/usr/bin:/bin";

/// `scripts/run ARGS` with nothing of this process's environment but `env`.
fn run_script(args: &[&str], env: &[(&str, &Path)]) -> Command {
    let mut command = Command::new(repo().join("scripts/run"));
    command
        .env_clear()
        .env("ACS_RUN_BINARY", BINARY)
        // Tests run servers side by side: none takes the default metrics port.
        .env("BUS_METRICS_BIND", "off")
        .envs(env.iter().copied())
        .args(args);
    command
}

/// The same command as an unprivileged user when we are root (so the script
/// cannot install anything), as ourselves otherwise.
fn unprivileged(command: Command) -> Command {
    if unsafe { libc::geteuid() } != 0 {
        return command;
    }
    let mut wrapped = Command::new("setpriv");
    wrapped
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(command.get_program())
        .args(command.get_args())
        .env_clear();
    for (name, value) in command.get_envs() {
        if let Some(value) = value {
            wrapped.env(name, value);
        }
    }
    wrapped
}

/// Start `command` with its stderr in `log`.
fn spawn_logged(mut command: Command, log: &Path) -> Child {
    command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start scripts/run")
}

/// Wait until `/health` answers 200, failing with the script's output if it
/// exits first or takes over a minute.
async fn wait_healthy(child: &mut Child, port: u16, log: &Path) -> Value {
    let response = eventually("/health to answer", async || {
        if let Ok(response) = http_client()
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            && response.status().is_success()
        {
            return Ok(response);
        }
        let output = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(status) = child.try_wait().unwrap() {
            panic!("scripts/run exited ({status}) before /health answered:\n{output}");
        }
        Err(output)
    })
    .await;
    response.json().await.unwrap()
}

/// The exit status of a run that must end by itself, with its stderr.
fn finishes(mut child: Child, log: &Path) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, std::fs::read_to_string(log).unwrap_or_default());
        }
        if Instant::now() > deadline {
            // A server started by mistake stops its cluster on SIGTERM.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let stop_by = Instant::now() + Duration::from_secs(30);
            while child.try_wait().unwrap().is_none() && Instant::now() < stop_by {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "scripts/run was still running after 60 s (it should have stopped):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The first command of the README's "The two commands" section.
fn readme_run_command() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split("## The two commands")
        .nth(1)
        .expect("the README has a section 'The two commands'");
    let block = section
        .split("```sh\n")
        .nth(1)
        .expect("a sh block in 'The two commands'");
    block.lines().next().unwrap().trim().to_string()
}

#[tokio::test]
async fn the_readme_run_command_serves_without_pg_binaries_on_path_and_keeps_its_data() {
    assert_eq!(readme_run_command(), "scripts/run");
    for dir in BARE_PATH.split(':') {
        assert!(
            !Path::new(dir).join("initdb").exists(),
            "{dir} holds initdb: the test would not show a run without them on PATH"
        );
    }
    let dir = tempfile::Builder::new()
        .prefix("acs-run-")
        .tempdir()
        .unwrap();
    let xdg = dir.path().join("xdg");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let env = [
        ("PATH", Path::new(BARE_PATH)),
        ("HOME", home.as_path()),
        ("XDG_DATA_HOME", xdg.as_path()),
    ];
    let log = dir.path().join("run.log");

    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let mut child = spawn_logged(run_script(&["--bind", &bind], &env), &log);
    let health = wait_healthy(&mut child, port, &log).await;
    assert_eq!(health["database"], "ok", "{health}");
    // The embedded cluster lives where the README says: $XDG_DATA_HOME/ai-crew-sync.
    assert!(xdg.join("ai-crew-sync/pgdata/PG_VERSION").is_file());

    // An agent made beside the running server (it joins the same cluster).
    let out = Command::new(BINARY)
        .env_clear()
        .envs(env)
        .args([
            "quickstart",
            "--team",
            "acme",
            "--agent",
            "alice",
            "--show-token",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = serde_json::from_slice::<Value>(&out.stdout).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mcp = format!("http://{bind}/mcp");
    let client = McpClient::connect(&mcp, &token, None).await.unwrap();
    assert_eq!(
        client.call("whoami", json!({})).await.unwrap()["team"],
        "acme"
    );
    drop(client);
    // The script hands its process to the server, so SIGTERM reaches it and
    // it stops cleanly.
    sigterm_and_wait(child);

    // The second run reuses the data directory: the token still works.
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let mut child = spawn_logged(run_script(&["--bind", &bind], &env), &log);
    wait_healthy(&mut child, port, &log).await;
    let client = McpClient::connect(&format!("http://{bind}/mcp"), &token, None)
        .await
        .unwrap();
    let me = client.call("whoami", json!({})).await.unwrap();
    assert_eq!(
        (me["team"].clone(), me["agent"].clone()),
        (json!("acme"), json!("alice")),
        "{me}"
    );
    drop(client);
    sigterm_and_wait(child);
}

#[tokio::test]
async fn the_run_command_that_cannot_install_postgresql_says_what_to_install() {
    let dir = tempfile::Builder::new()
        .prefix("acs-run-")
        .tempdir()
        .unwrap();
    // Writable by the unprivileged user, so a script that went on anyway
    // would start a cluster here, and the test would see it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let xdg = dir.path().join("xdg");
    let log = dir.path().join("run.log");
    let env = [
        ("PATH", Path::new(BARE_PATH)),
        ("HOME", dir.path()),
        ("XDG_DATA_HOME", xdg.as_path()),
        ("ACS_PRETEND_NO_PG", Path::new("1")),
    ];
    let bind = format!("127.0.0.1:{}", free_port());
    let child = spawn_logged(unprivileged(run_script(&["--bind", &bind], &env)), &log);
    let (status, err) = finishes(child, &log);

    assert!(!status.success(), "{err}");
    for needed in [
        "missing postgresql",
        "not running as root",
        "sudo apt-get install postgresql",
        "sudo dnf install postgresql-server",
        "brew install postgresql",
        "DATABASE_URL",
    ] {
        assert!(err.contains(needed), "no {needed:?} in:\n{err}");
    }
    assert!(
        !xdg.exists(),
        "the script went on to start the server:\n{err}"
    );
}

#[tokio::test]
async fn the_run_command_with_database_url_needs_no_pg_binaries() {
    let database_url = fresh_database_url().await;
    let dir = tempfile::Builder::new()
        .prefix("acs-run-")
        .tempdir()
        .unwrap();
    // A machine without apt-get, so a script that wanted the server binaries
    // would refuse (it finds none, by the hook) rather than install them.
    let bin = no_apt_get_path(dir.path());
    let xdg = dir.path().join("xdg");
    let log = dir.path().join("run.log");
    let env = [
        ("PATH", bin.as_path()),
        ("HOME", dir.path()),
        ("XDG_DATA_HOME", xdg.as_path()),
        ("ACS_PRETEND_NO_PG", Path::new("1")),
    ];

    // DATABASE_URL in the environment, then in a file named by the flag
    // (the URL may carry a password, which is never taken from argv).
    let url_file = dir.path().join("database-url");
    std::fs::write(&url_file, &database_url).unwrap();
    std::fs::set_permissions(&url_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    for flag in [false, true] {
        let port = free_port();
        let bind = format!("127.0.0.1:{port}");
        let database_flag = format!("--database-url-file={}", url_file.display());
        let command = if flag {
            run_script(&["--bind", &bind, &database_flag], &env)
        } else {
            let mut command = run_script(&["--bind", &bind], &env);
            command.env("DATABASE_URL", &database_url);
            command
        };
        let mut child = spawn_logged(command, &log);
        let health = wait_healthy(&mut child, port, &log).await;
        assert_eq!(health["database"], "ok", "flag {flag}: {health}");
        sigterm_and_wait(child);
        assert!(!xdg.exists(), "no embedded cluster was started");
    }
}

/// A directory holding only what the script runs (bash, dirname, id, readlink),
/// to stand for a machine without apt-get.
fn no_apt_get_path(root: &Path) -> PathBuf {
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["bash", "dirname", "id", "readlink"] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(tool))
            .find(|path| path.exists())
            .unwrap_or_else(|| panic!("{tool} not in /usr/bin or /bin"));
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    bin
}
