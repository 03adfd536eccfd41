//! The binary as a user starts it: `serve` with no DATABASE_URL runs its own
//! PostgreSQL in the data directory, keeps data across restarts, answers a
//! waiting call when SIGTERM arrives, and leaves no PostgreSQL process behind.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{McpClient, eventually, eventually_blocking, free_port, http_client};

fn bus(data_dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
    command
        .env_remove("DATABASE_URL")
        .arg("--data-dir")
        .arg(data_dir);
    command
}

fn start_server(data_dir: &Path, port: u16) -> Child {
    bus(data_dir)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        // Tests run servers side by side: none takes the default metrics port.
        .args(["--metrics-bind", "off"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn serve")
}

async fn wait_healthy(port: u16) -> Value {
    let response = eventually("serve to answer /health", async || {
        http_client()
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
            .ok()
            .filter(|response| response.status().is_success())
    })
    .await;
    response.json().await.unwrap()
}

pub(crate) fn sigterm_and_wait(mut child: Child) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = eventually_blocking("serve to stop on SIGTERM", || child.try_wait().unwrap());
    assert!(status.success(), "serve exits cleanly on SIGTERM: {status}");
}

/// Processes whose command line names `needle` (the cluster's data directory).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(needle) {
                found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[tokio::test]
async fn serve_without_database_url_runs_embedded_postgres_keeps_data_and_cleans_up() {
    let dir = tempfile::Builder::new()
        .prefix("acs-serve-")
        .tempdir()
        .unwrap();
    let data_dir = dir.path().join("data");
    let pgdata = data_dir
        .join("pgdata")
        .canonicalize()
        .unwrap_or(data_dir.join("pgdata"));

    // A command with no server running starts the cluster for itself and stops it.
    let out = bus(&data_dir)
        .args([
            "quickstart",
            "--team",
            "acme",
            "--agent",
            "alice",
            "--show-token",
            "--json",
        ])
        // Its profile goes in the test's directory, not this machine's.
        .env("BUS_CONFIG_DIR", dir.path().join("config"))
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
    assert!(
        processes_mentioning(&pgdata.to_string_lossy()).is_empty(),
        "quickstart left PostgreSQL running"
    );

    // Run as root, the cluster's server runs as another user whose processes
    // could reach the socket: it takes a password, kept root-only.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::fs::PermissionsExt;
        let pgpass = data_dir.join("pgpass");
        assert_eq!(
            std::fs::metadata(&pgpass).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let hba = std::fs::read_to_string(data_dir.join("pgdata/pg_hba.conf")).unwrap();
        assert!(
            !hba.lines()
                .any(|l| !l.trim_start().starts_with('#') && l.contains("trust")),
            "no trust lines when run as root"
        );
    }

    for round in 0..2 {
        let port = free_port();
        let child = start_server(&data_dir, port);
        let health = wait_healthy(port).await;
        assert_eq!(health["database"], "ok");

        // The agent created before (by quickstart, then by the previous serve) is still there.
        let client =
            McpClient::connect(&format!("http://127.0.0.1:{port}/mcp"), &token, Some("w1"))
                .await
                .unwrap();
        let me = client.call("whoami", json!({})).await.unwrap();
        assert_eq!(me["team"], "acme", "round {round}");

        // A command while serve runs joins the same cluster and leaves it running.
        let out = bus(&data_dir)
            .args(["team", "list", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let teams: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(teams[0]["slug"], "acme");
        wait_healthy(port).await;

        // SIGTERM while a call waits: the waiter gets its normal answer,
        // saying the server is restarting, not an HTTP error.
        let waiting = tokio::spawn(async move {
            client
                .call("wait_for_updates", json!({"timeout_seconds": 120}))
                .await
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let answer = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("the wait is answered when SIGTERM arrives")
            .unwrap()
            .expect("a tool result, not a refusal");
        assert_eq!(answer["server_restarting"], true, "round {round}: {answer}");
        assert_eq!(answer["woke"], false, "round {round}: {answer}");
        sigterm_and_wait(child);
        let pgdata = data_dir.join("pgdata").canonicalize().unwrap();
        let left = processes_mentioning(&pgdata.to_string_lossy());
        assert!(
            left.is_empty(),
            "PostgreSQL still running after SIGTERM: {left:?}"
        );
        assert!(!pgdata.join("postmaster.pid").exists());
    }
}

#[tokio::test]
async fn no_postgres_binaries_gives_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let empty_bin = dir.path().join("bin");
    std::fs::create_dir_all(&empty_bin).unwrap();
    let out = bus(&dir.path().join("data"))
        .args(["team", "list"])
        .env("BUS_PG_BIN_DIR", &empty_bin)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("apt-get install postgresql") && err.contains("DATABASE_URL"),
        "{err}"
    );
    // It says where it looked (only BUS_PG_BIN_DIR, here) and names the script
    // that installs them.
    assert!(
        err.contains(&format!("BUS_PG_BIN_DIR ({})", empty_bin.display()))
            && err.contains("scripts/run"),
        "{err}"
    );
}

/// `serve` under a low open-file limit: it raises its soft limit to the hard
/// one and serves at most what fits beside the descriptors it keeps for the
/// database and the rest, saying so, rather than failing accepts later.
#[tokio::test]
async fn serve_fits_its_connection_cap_under_the_open_file_limit() {
    use std::os::unix::process::CommandExt;

    let database_url = crate::support::postgres::fresh_database_url().await;
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
    command
        .env("DATABASE_URL", &database_url)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .args(["--metrics-bind", "off"])
        .args(["--max-connections", "4096"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs before exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 300,
                rlim_max: 600,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().expect("spawn serve");
    let health = wait_healthy(port).await;
    assert_eq!(health["database"], "ok");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "serve exits cleanly on SIGTERM");
    let stderr = String::from_utf8_lossy(&output.stderr);
    // 600 (the hard limit, the soft one raised to it) less the 128 kept.
    assert!(
        stderr.contains(
            "--max-connections 4096 does not fit the open-file limit (ulimit -n) beside the 128 \
             descriptors kept for the database and the rest; serving at most 472 connections."
        ),
        "{stderr}"
    );
}
