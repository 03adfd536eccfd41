//! The NATS server the tests use: `TEST_NATS_URL` when given, otherwise a
//! throwaway `nats-server -js` on a free loopback port, started once per test
//! process and killed when it exits. Its `max_payload` is raised to 8 MiB, so a
//! full 1 MiB body plus headers fits (the default 1 MB does not).

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::eventually_blocking;

/// Streams reserve their `max_bytes` (2 GiB by default for a team's body
/// stream) against the server's file store, which defaults to 75 % of the
/// free disk: the suite's tests at once would reserve more than that and be
/// refused with "insufficient resources" (10047). They write a few MiB.
const JETSTREAM_STORE_LIMIT: &str = "max_file_store: 1099511627776";

struct Server {
    url: String,
    child: Mutex<Option<Child>>,
    _dir: Option<tempfile::TempDir>,
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// `nats://host:port` of a JetStream-enabled server for this test process.
pub fn nats_url() -> String {
    SERVER.get_or_init(start).url.clone()
}

fn start() -> Server {
    if let Some(url) = std::env::var("TEST_NATS_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        return Server {
            url,
            child: Mutex::new(None),
            _dir: None,
        };
    }
    let dir = tempfile::Builder::new()
        .prefix("acs-test-nats-")
        .tempdir()
        .expect("a temp dir for the throwaway nats-server");
    let port = super::free_port();
    let config = dir.path().join("nats.conf");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\nmax_payload: 8MB\njetstream {{\n  store_dir: \"{}\"\n  {JETSTREAM_STORE_LIMIT}\n}}\n",
            dir.path().join("js").display()
        ),
    )
    .expect("write nats.conf");
    let child = Command::new("nats-server")
        .arg("-c")
        .arg(&config)
        // Its working directory is its own: see `NatsCluster::spawn`.
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "no TEST_NATS_URL and `nats-server` could not be started ({e}). Install it \
                 (Debian/Ubuntu: apt-get install nats-server) or set TEST_NATS_URL."
            )
        });
    eventually_blocking(&format!("nats-server to listen on {port}"), || {
        std::net::TcpStream::connect(("127.0.0.1", port))
    });
    // SAFETY: registering a plain extern "C" fn; it runs once at process exit.
    unsafe { libc::atexit(kill_at_exit) };
    Server {
        url: format!("nats://127.0.0.1:{port}"),
        child: Mutex::new(Some(child)),
        _dir: Some(dir),
    }
}

extern "C" fn kill_at_exit() {
    if let Some(server) = SERVER.get()
        && let Some(mut child) = server
            .child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    {
        let _ = child.kill();
        let _ = child.wait();
        if let Some(dir) = &server._dir {
            let _ = std::fs::remove_dir_all(dir.path());
        }
    }
}

/// A `nats-server -js` owned by one test, for tests that stop and restart
/// the broker: its own port and store directory, kept across `stop`/`start`
/// so a restarted server has the same streams.
pub struct OwnedNats {
    port: u16,
    dir: tempfile::TempDir,
    max_payload: Option<&'static str>,
    /// Extra lines for nats.conf (users and permissions).
    extra: String,
    child: Option<Child>,
}

impl OwnedNats {
    /// `max_payload` raised to 8 MB, as the shared server.
    pub fn start() -> OwnedNats {
        Self::start_with(Some("8MB"))
    }

    /// NATS's default `max_payload` (1 MB), too small for a full body.
    pub fn start_with_default_max_payload() -> OwnedNats {
        Self::start_with(None)
    }

    /// With extra configuration (e.g. an `authorization` block), 8 MB payloads.
    pub fn start_with_config(extra: &str) -> OwnedNats {
        Self::start_full(Some("8MB"), extra)
    }

    fn start_with(max_payload: Option<&'static str>) -> OwnedNats {
        Self::start_full(max_payload, "")
    }

    fn start_full(max_payload: Option<&'static str>, extra: &str) -> OwnedNats {
        let dir = tempfile::Builder::new()
            .prefix("acs-test-owned-nats-")
            .tempdir()
            .expect("a temp dir for an owned nats-server");
        let mut server = OwnedNats {
            port: super::free_port(),
            dir,
            max_payload,
            extra: extra.to_owned(),
            child: None,
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The URL with a user and password in it.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("nats://{user}:{password}@127.0.0.1:{}", self.port)
    }

    /// Start again on the same port and store directory (after `stop`).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the owned nats-server is running");
        let config = self.dir.path().join("nats.conf");
        let payload = self
            .max_payload
            .map(|p| format!("max_payload: {p}\n"))
            .unwrap_or_default();
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:{}\n{payload}jetstream {{\n  store_dir: \"{}\"\n  {JETSTREAM_STORE_LIMIT}\n}}\n{}\n",
                self.port,
                self.dir.path().join("js").display(),
                self.extra
            ),
        )
        .expect("write nats.conf");
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&config)
            .current_dir(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("`nats-server` could not be started ({e})"));
        self.child = Some(child);
        let port = self.port;
        eventually_blocking(
            &format!("the owned nats-server to listen on {port}"),
            || std::net::TcpStream::connect(("127.0.0.1", port)),
        );
    }

    /// Lose everything the broker stored, as an operator whose disk was
    /// wiped would: stop it, delete its JetStream store, start it again
    /// empty on the same port.
    pub fn wipe_store(&mut self) {
        self.stop();
        let store = self.dir.path().join("js");
        if store.exists() {
            std::fs::remove_dir_all(&store).expect("delete the JetStream store");
        }
        self.restart();
    }

    /// Stop it (SIGTERM, then SIGKILL after 5 s) and wait until it is gone.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OwnedNats {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
