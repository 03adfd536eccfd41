//! The servers a run owns: a throwaway PostgreSQL and the real `ai-crew-sync`
//! binary as a child process. Both are guards: dropping them (after an error
//! or a panic too) stops the process, so a run leaves nothing behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ai_crew_sync::db::embedded::EmbeddedPostgres;
use anyhow::{Context as _, Result, bail};

/// A PostgreSQL cluster in a temporary directory, removed with it.
pub struct Postgres {
    embedded: Option<EmbeddedPostgres>,
    dir: tempfile::TempDir,
}

impl Postgres {
    /// Blocking: runs initdb and pg_ctl.
    pub fn start() -> Result<Postgres> {
        let dir = tempfile::Builder::new()
            .prefix("acs-bench-")
            .tempdir()
            .context("a temporary directory for the benchmark's PostgreSQL")?;
        let embedded = EmbeddedPostgres::start(dir.path())
            .context("starting the benchmark's throwaway PostgreSQL")?;
        Ok(Postgres {
            embedded: Some(embedded),
            dir,
        })
    }

    pub fn database_url(&self, database: &str) -> String {
        self.embedded
            .as_ref()
            .expect("running until dropped")
            .database_url(database)
    }

    /// A scratch directory that lives as long as the cluster (for logs).
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(embedded) = self.embedded.take() {
            eprintln!("bench: stopping PostgreSQL");
            if let Err(err) = embedded.stop() {
                eprintln!("bench: could not stop PostgreSQL: {err}");
            }
        }
    }
}

/// The real server binary, built by cargo in the same profile as this runner.
pub struct Server {
    child: Child,
    base_url: String,
    log: PathBuf,
    stopped: bool,
}

/// The server's drain after SIGTERM; we wait a little longer before SIGKILL.
const SHUTDOWN_GRACE_SECS: u64 = 5;
const STARTUP_LIMIT: Duration = Duration::from_secs(60);

impl Server {
    /// Start `serve` on a free loopback port against `database_url` and wait
    /// until `/health` answers 200. Its stderr goes to `log_dir/server.log`.
    pub async fn start(database_url: &str, log_dir: &Path) -> Result<Server> {
        let port = free_port()?;
        let log = log_dir.join("server.log");
        let log_file = fs::File::create(&log).with_context(|| format!("{}", log.display()))?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .arg("serve")
            .args(["--bind", &format!("127.0.0.1:{port}")])
            // Not the default metrics port: another server may hold it.
            .args(["--metrics-bind", "off"])
            // The limiter would turn a load test into a test of the limiter.
            .args(["--rate-limit-per-minute", "0"])
            // long_polls_10k holds 10 000 waits of the one bench agent, and
            // capacity up to 10 000 agents' waits, each on its own connection
            // from 127.0.0.1 (many hosts simulated on one address): room for
            // them and the calls beside them. The server raises its soft
            // open-file limit to the hard one (20 000 here) to fit them.
            .args(["--max-long-polls-per-credential", "0"])
            .args(["--max-in-flight", "16384"])
            .args(["--max-connections", "16384"])
            .args(["--max-connections-per-address", "16384"])
            // Every client of a run speaks with one token; the cap on its
            // calls in flight (16 by default) would refuse the 16 pairs of
            // `wake_latency` (32 calls) on kept-alive connections.
            .args(["--max-in-flight-per-credential", "0"])
            // ... and they are all one agent of one team: its agent's and
            // team's caps would refuse the same waits and pairs.
            .args(["--max-in-flight-per-agent", "0"])
            .args(["--max-long-polls-per-agent", "0"])
            .args(["--max-in-flight-per-team", "0"])
            .args(["--max-long-polls-per-team", "0"])
            .args(["--shutdown-grace-secs", &SHUTDOWN_GRACE_SECS.to_string()])
            .env("DATABASE_URL", database_url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        // Settings from the caller's environment would make runs incomparable.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("BUS_") {
                command.env_remove(name);
            }
        }
        let child = command
            .spawn()
            .context("starting the ai-crew-sync server")?;
        let mut server = Server {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
            log,
            stopped: false,
        };
        server.wait_healthy().await?;
        Ok(server)
    }

    async fn wait_healthy(&mut self) -> Result<()> {
        let client = http_client()?;
        let url = format!("{}/health", self.base_url);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.stopped = true;
                bail!(
                    "the server exited during startup ({status}); its log ends:\n{}",
                    self.log_tail()
                );
            }
            let answer = client
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if answer.is_ok_and(|r| r.status() == reqwest::StatusCode::OK) {
                return Ok(());
            }
            if started.elapsed() > STARTUP_LIMIT {
                bail!(
                    "the server did not answer GET /health with 200 within {}s; its log ends:\n{}",
                    STARTUP_LIMIT.as_secs(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The server's process id (for its memory, read from /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base_url)
    }

    /// Forget the peak so far, so the next reading covers only what follows.
    /// Best effort (Linux 4.0+): if refused, the next reading is the peak since start.
    pub fn reset_peak_rss(&self) {
        let _ = fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5");
    }

    /// Peak resident memory (VmHWM) in MiB.
    pub fn peak_rss_mib(&self) -> Option<f64> {
        memory_mib(self.child.id(), "VmHWM")
    }

    /// SIGTERM, then wait for the drain; SIGKILL if it overruns.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        eprintln!("bench: stopping the server");
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: plain syscall on our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let limit = Instant::now() + Duration::from_secs(SHUTDOWN_GRACE_SECS + 10);
        while Instant::now() < limit {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!(
                            "bench: the server exited with {status}; log in {}",
                            self.log.display()
                        );
                    }
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(_) => break,
            }
        }
        eprintln!("bench: the server ignored SIGTERM; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A memory figure of process `pid` from /proc/PID/status in MiB: `VmRSS`
/// (resident now) or `VmHWM` (its peak).
pub fn memory_mib(pid: u32, field: &str) -> Option<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| {
        l.strip_prefix(field)
            .is_some_and(|rest| rest.starts_with(':'))
    })?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// An HTTP client that never goes through a proxy: every request stays on 127.0.0.1.
pub fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .context("building an HTTP client")
}

/// A throwaway `nats-server -js` in a temporary directory, for the
/// scenarios that publish to JetStream. Its `max_payload` is raised to 8 MB
/// (as the test suite's is): the bus refuses a broker that cannot take a full
/// 1 MiB body plus headers, and NATS's default 1 MB is just short of it.
pub struct Nats {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Nats {
    /// Blocking: spawns the server and waits until it listens.
    pub fn start() -> Result<Nats> {
        let dir = tempfile::Builder::new()
            .prefix("acs-bench-nats-")
            .tempdir()
            .context("a temporary directory for the benchmark's nats-server")?;
        let port = free_port()?;
        let config = dir.path().join("nats.conf");
        fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:{port}\nmax_payload: 8MB\n\
                 jetstream {{\n  store_dir: \"{}\"\n  max_file_store: 8GB\n}}\n",
                dir.path().join("js").display()
            ),
        )
        .context("writing nats.conf")?;
        let log = fs::File::create(dir.path().join("nats.log")).context("nats.log")?;
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&config)
            // Its own working directory: nats-server 2.9 has been seen to
            // write consumer metadata into it.
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context(
                "starting nats-server (scripts/bench installs it; by hand: \
                 apt-get install nats-server)",
            )?;
        let mut nats = Nats {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = nats.child.try_wait()? {
                bail!("nats-server exited during startup ({status})");
            }
            if Instant::now() > deadline {
                bail!("nats-server did not listen on {port} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nats)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        eprintln!("bench: stopping nats-server");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
