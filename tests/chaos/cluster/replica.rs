//! One `serve` replica: the real binary as a child process on a fixed
//! loopback port, reaching PostgreSQL and each NATS node through its own
//! relays. Killed with SIGKILL, paused with SIGSTOP, and started again on the
//! same port with the same relays; its stdout and stderr go to one log file
//! across restarts.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// `serve`'s drain after SIGTERM; SIGKILL a little after it.
const SHUTDOWN_GRACE_SECS: u64 = 3;
/// How long a (re)started replica may take to answer /health.
const STARTUP_LIMIT: Duration = Duration::from_secs(60);

pub struct Replica {
    index: usize,
    port: u16,
    database_url: String,
    nats_urls: String,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl Replica {
    /// Start replica `index` and wait until it answers /health.
    pub async fn start(
        index: usize,
        database_url: String,
        nats_urls: String,
        scratch: &Path,
    ) -> anyhow::Result<Replica> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut replica = Replica {
            index,
            port,
            database_url,
            nats_urls,
            log: scratch.join(format!("replica-{index}.log")),
            child: None,
            paused: false,
        };
        replica.restart().await?;
        Ok(replica)
    }

    pub fn mcp_url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    fn health_url(&self) -> String {
        format!("http://127.0.0.1:{}/health", self.port)
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Start the binary (when not running) and wait for /health.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if !self.is_running() {
            self.spawn()?;
        }
        self.wait_healthy().await
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| self.log.display().to_string())?;
        writeln!(log, "---- chaos: replica {} starting ----", self.index)?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .arg("serve")
            .args(["--bind", &format!("127.0.0.1:{}", self.port)])
            .args(["--metrics-bind", "off"])
            .args(["--nats-url", &self.nats_urls])
            // Every client of a run shares few tokens from one address: the
            // limits meant for the open internet would refuse the workload.
            .args(["--rate-limit-per-minute", "0"])
            .args(["--max-in-flight-per-credential", "0"])
            .args(["--max-long-polls-per-credential", "2048"])
            .args(["--max-in-flight-per-agent", "0"])
            .args(["--max-long-polls-per-agent", "0"])
            .args(["--max-in-flight-per-team", "0"])
            .args(["--max-long-polls-per-team", "0"])
            .args(["--max-connections-per-address", "4096"])
            .args(["--shutdown-grace-secs", &SHUTDOWN_GRACE_SECS.to_string()])
            .env("DATABASE_URL", &self.database_url)
            // Plain text in the log file, no terminal colours.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Settings from the caller's environment would change the run.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("BUS_") {
                command.env_remove(name);
            }
        }
        self.child = Some(command.spawn().context("starting ai-crew-sync serve")?);
        self.paused = false;
        Ok(())
    }

    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let client = reqwest::Client::builder().no_proxy().build()?;
        let started = Instant::now();
        loop {
            if !self.is_running() {
                bail!(
                    "replica {} exited during startup; its log ends:\n{}",
                    self.index,
                    tail(&self.log, 40)
                );
            }
            let answer = client
                .get(self.health_url())
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if answer.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if started.elapsed() > STARTUP_LIMIT {
                bail!(
                    "replica {} did not answer /health within {} s; its log ends:\n{}",
                    self.index,
                    STARTUP_LIMIT.as_secs(),
                    tail(&self.log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether it answers /health now.
    pub async fn healthy(&self) -> bool {
        let Ok(client) = reqwest::Client::builder().no_proxy().build() else {
            return false;
        };
        client
            .get(self.health_url())
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// SIGSTOP: the process holds its sockets and its slots, and does nothing.
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = true;
    }

    /// SIGCONT after [`Replica::pause`].
    pub fn resume(&mut self) {
        if self.paused {
            self.signal(libc::SIGCONT);
            self.paused = false;
        }
    }

    fn signal(&mut self, signal: libc::c_int) {
        if let Some(child) = &mut self.child
            && matches!(child.try_wait(), Ok(None))
        {
            // SAFETY: a plain syscall on our own child, not yet reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    /// SIGCONT, SIGTERM, then SIGKILL if the drain overruns. Blocking.
    pub fn stop(&mut self) {
        self.resume();
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            // SAFETY: as in `signal`.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let limit = Instant::now() + Duration::from_secs(SHUTDOWN_GRACE_SECS + 5);
            while Instant::now() < limit && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
