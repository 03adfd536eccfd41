//! A JetStream cluster of `n` `nats-server` nodes on loopback, owned by one
//! test: each node has its own client port, route port and store directory,
//! kept across `kill`/`restart` so a restarted node rejoins with its streams.
//!
//! Self-contained on purpose (std, tokio, anyhow, async-nats, serde_json):
//! other test binaries include it with `#[path]`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// As in `support/nats.rs`: streams reserve their `max_bytes` against the
/// file store, which defaults to 75 % of the free disk.
const JETSTREAM_STORE_LIMIT: &str = "max_file_store: 1099511627776";

/// How long a node may take to listen, and the cluster to elect a meta leader.
const START_TIMEOUT: Duration = Duration::from_secs(20);

struct Node {
    client_port: u16,
    config: PathBuf,
    child: Option<Child>,
}

/// The cluster; dropping it kills every node.
pub struct NatsCluster {
    nodes: Vec<Node>,
}

impl NatsCluster {
    /// Start `n` nodes ("n0".."n{n-1}", JetStream on, 8 MB payloads, routes
    /// between all of them) with store directories under `dir`. Blocks until
    /// every node accepts clients and JetStream has a meta leader.
    pub fn start(n: usize, dir: &Path) -> anyhow::Result<NatsCluster> {
        anyhow::ensure!(n >= 1, "a cluster needs at least one node");
        let mut client_ports = free_ports(2 * n)?;
        let route_ports = client_ports.split_off(n);
        let routes = route_ports
            .iter()
            .map(|p| format!("nats-route://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let node_dir = dir.join(format!("n{i}"));
            std::fs::create_dir_all(&node_dir)
                .with_context(|| format!("create {}", node_dir.display()))?;
            let config = node_dir.join("nats.conf");
            // A single node gets no cluster block: JetStream refuses a
            // cluster of one.
            let cluster = if n > 1 {
                format!(
                    "cluster {{\n  name: acs-test\n  listen: 127.0.0.1:{}\n  routes: [{routes}]\n}}\n",
                    route_ports[i]
                )
            } else {
                String::new()
            };
            std::fs::write(
                &config,
                format!(
                    "server_name: n{i}\nlisten: 127.0.0.1:{}\nmax_payload: 8MB\njetstream {{\n  store_dir: \"{}\"\n  {JETSTREAM_STORE_LIMIT}\n}}\n{cluster}",
                    client_ports[i],
                    node_dir.join("js").display()
                ),
            )
            .with_context(|| format!("write {}", config.display()))?;
            nodes.push(Node {
                client_port: client_ports[i],
                config,
                child: None,
            });
        }
        let mut cluster = NatsCluster { nodes };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_listening(i)?;
        }
        cluster.wait_meta_leader()?;
        Ok(cluster)
    }

    /// `nats://127.0.0.1:PORT` per node; the index is the node's.
    pub fn client_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.client_port))
            .collect()
    }

    pub fn client_addr(&self, node: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.nodes[node].client_port))
    }

    /// `kill -9` the node (a no-op when it is not running).
    pub fn kill(&mut self, node: usize) {
        if let Some(mut child) = self.nodes[node].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stop every node the way an operator restarting the cluster does
    /// (`SIGTERM`, each node flushing its store and leaving), all at once;
    /// a node still running after 10 s is killed.
    #[allow(
        dead_code,
        reason = "the chaos run's restart of every node; the suite kills nodes"
    )]
    pub fn shut_down_all(&mut self) {
        for node in &self.nodes {
            if let Some(child) = &node.child {
                // SAFETY: signalling our own child by its pid.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for node in 0..self.nodes.len() {
            while self.is_running(node) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            self.kill(node);
        }
    }

    /// Start a killed node again on the same ports and store directory;
    /// returns once it accepts clients.
    pub fn restart(&mut self, node: usize) -> anyhow::Result<()> {
        if self.is_running(node) {
            return Ok(());
        }
        self.spawn(node)?;
        self.wait_listening(node)
    }

    pub fn is_running(&mut self, node: usize) -> bool {
        match &mut self.nodes[node].child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The index of the node leading `stream` (`$JS.API.STREAM.INFO`'s
    /// `cluster.leader`), `None` while it has none (an election).
    pub async fn stream_leader(&self, stream: &str) -> anyhow::Result<Option<usize>> {
        let client = self.connect_any().await?;
        let reply = tokio::time::timeout(
            Duration::from_secs(2),
            client.request(format!("$JS.API.STREAM.INFO.{stream}"), "".into()),
        )
        .await
        .context("stream info timed out")?
        .context("stream info")?;
        let info: serde_json::Value =
            serde_json::from_slice(&reply.payload).context("stream info is not JSON")?;
        if let Some(error) = info.get("error") {
            // 503 / 10008 "JetStream system temporarily unavailable" and
            // friends mean an election is under way.
            if error.get("code").and_then(|c| c.as_u64()) == Some(503) {
                return Ok(None);
            }
            bail!("stream info for {stream}: {error}");
        }
        let Some(leader) = info
            .pointer("/cluster/leader")
            .and_then(|l| l.as_str())
            .filter(|l| !l.is_empty())
        else {
            return Ok(None);
        };
        let index = leader
            .strip_prefix('n')
            .and_then(|i| i.parse::<usize>().ok())
            .with_context(|| format!("leader {leader:?} is not one of ours"))?;
        Ok(Some(index))
    }

    /// Kill every node.
    pub fn stop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }

    fn spawn(&mut self, node: usize) -> anyhow::Result<()> {
        let n = &mut self.nodes[node];
        let dir = n.config.parent().unwrap_or(Path::new("."));
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&n.config)
            // Its own working directory: nats-server 2.9 has been seen to
            // write a consumer's meta.inf and meta.sum into it (the chaos
            // run left them in the checkout's root).
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context(
                "`nats-server` could not be started (Debian/Ubuntu: apt-get install nats-server)",
            )?;
        n.child = Some(child);
        Ok(())
    }

    fn wait_listening(&mut self, node: usize) -> anyhow::Result<()> {
        let addr = self.client_addr(node);
        let deadline = Instant::now() + START_TIMEOUT;
        while std::net::TcpStream::connect(addr).is_err() {
            if !self.is_running(node) {
                bail!("nats-server n{node} exited before listening on {addr}");
            }
            if Instant::now() > deadline {
                bail!("nats-server n{node} did not listen on {addr} within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Until `$JS.API.INFO` answers without error through every node (only
    /// a meta leader answers it in a cluster) and a stream with a replica on
    /// every node can be placed. On a thread with its own
    /// runtime, so `start` can block inside a test's runtime.
    fn wait_meta_leader(&self) -> anyhow::Result<()> {
        let urls = self.client_urls();
        std::thread::spawn(move || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let deadline = Instant::now() + START_TIMEOUT;
                for url in &urls {
                    let client = async_nats::connect(url.as_str())
                        .await
                        .with_context(|| format!("connect to {url}"))?;
                    if !answered_before(&client, "$JS.API.INFO", String::new(), deadline).await {
                        bail!("JetStream had no meta leader via {url} within {START_TIMEOUT:?}");
                    }
                }
                // A meta leader answers before every peer has joined its
                // group; until then a stream of N replicas is refused "no
                // suitable peers for placement" (a test failed so under
                // load). Wait until one can be placed, then remove it.
                let client = async_nats::connect(urls[0].as_str())
                    .await
                    .with_context(|| format!("connect to {}", urls[0]))?;
                let probe = serde_json::json!({
                    "name": "ACS_CLUSTER_PROBE", "subjects": ["acs.cluster.probe"],
                    "num_replicas": urls.len(), "max_bytes": 1024,
                });
                let create = "$JS.API.STREAM.CREATE.ACS_CLUSTER_PROBE";
                if !answered_before(&client, create, probe.to_string(), deadline).await {
                    bail!(
                        "the cluster could not place a stream of {} replicas within {START_TIMEOUT:?}",
                        urls.len()
                    );
                }
                client
                    .request("$JS.API.STREAM.DELETE.ACS_CLUSTER_PROBE", "".into())
                    .await
                    .context("delete the placement probe")?;
                Ok(())
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the meta-leader wait panicked"))?
    }

    async fn connect_any(&self) -> anyhow::Result<async_nats::Client> {
        let mut last = None;
        for url in self.client_urls() {
            match tokio::time::timeout(Duration::from_secs(1), async_nats::connect(url.as_str()))
                .await
            {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(e)) => last = Some(anyhow::Error::new(e)),
                Err(e) => last = Some(anyhow::Error::new(e)),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no node")))
            .context("no node of the cluster accepted a client")
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `n` distinct free loopback ports (all bound at once, so none repeats).
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("bind a free loopback port")?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// Ask `subject` every 100 ms until the answer is JSON without an `error`
/// (true), or `deadline` passes (false).
async fn answered_before(
    client: &async_nats::Client,
    subject: &'static str,
    payload: String,
    deadline: Instant,
) -> bool {
    loop {
        let answer = tokio::time::timeout(
            Duration::from_secs(1),
            client.request(subject, payload.clone().into()),
        )
        .await;
        if let Ok(Ok(reply)) = answer
            && serde_json::from_slice::<serde_json::Value>(&reply.payload)
                .is_ok_and(|v| v.get("error").is_none())
        {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
