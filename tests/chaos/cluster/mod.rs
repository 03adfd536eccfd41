//! The servers a chaos run owns, all on loopback under one scratch
//! directory: PostgreSQL ([`postgres`]), a 3-node NATS cluster with
//! JetStream, and 3 `serve` replicas ([`replica`]). Each replica reaches
//! PostgreSQL through a relay of its own and each NATS node through another
//! (the suite's fault proxy), so a fault can cut or slow one replica's link
//! without touching the others'.
//!
//! Dropping the cluster (after an error or a panic too) stops everything it
//! started: replicas first, then the relays, NATS and PostgreSQL, and the
//! scratch directory goes last.

mod postgres;
mod replica;

use std::path::PathBuf;

use anyhow::Context as _;

use crate::Profile;
use crate::model::Target;
use crate::nats_cluster::NatsCluster;
use crate::relay::Proxy;
use postgres::Postgres;
use replica::{Replica, tail};

pub const REPLICAS: usize = 3;
pub const NATS_NODES: usize = 3;

/// The fields drop in this order: replicas, relays, NATS, PostgreSQL, files.
pub struct Cluster {
    replicas: Vec<Replica>,
    /// `pg_relays[r]`: replica r ↔ PostgreSQL.
    pg_relays: Vec<Proxy>,
    /// `nats_relays[r][n]`: replica r ↔ NATS node n.
    nats_relays: Vec<Vec<Proxy>>,
    nats: NatsCluster,
    postgres: Postgres,
    scratch: tempfile::TempDir,
}

impl Cluster {
    pub async fn start(profile: &Profile) -> anyhow::Result<Cluster> {
        let scratch = tempfile::Builder::new()
            .prefix("acs-chaos-")
            .tempdir()
            .context("a scratch directory for the run")?;
        eprintln!(
            "chaos: starting PostgreSQL, {NATS_NODES} NATS nodes and {REPLICAS} replicas in {} ({} profile)",
            scratch.path().display(),
            profile.name
        );
        let postgres = Postgres::start(&scratch.path().join("pg")).await?;
        let nats_dir = scratch.path().join("nats");
        let nats = tokio::task::spawn_blocking(move || NatsCluster::start(NATS_NODES, &nats_dir))
            .await?
            .context("starting the NATS cluster")?;
        let mut pg_relays = Vec::new();
        let mut nats_relays = Vec::new();
        let mut replicas = Vec::new();
        for r in 0..REPLICAS {
            let pg_relay = Proxy::start(postgres.bridge_addr()).await;
            let mut relays = Vec::new();
            for n in 0..NATS_NODES {
                relays.push(Proxy::start(nats.client_addr(n)).await);
            }
            let nats_urls = relays.iter().map(Proxy::url).collect::<Vec<_>>().join(",");
            let database_url = postgres.url_via(pg_relay.addr())?;
            pg_relays.push(pg_relay);
            nats_relays.push(relays);
            replicas.push(Replica::start(r, database_url, nats_urls, scratch.path()).await?);
        }
        Ok(Cluster {
            replicas,
            pg_relays,
            nats_relays,
            nats,
            postgres,
            scratch,
        })
    }

    pub fn target(&self) -> Target {
        Target {
            replicas: self.replicas.iter().map(Replica::mcp_url).collect(),
            database_url: self.postgres.direct_url(),
            nats_urls: self.nats.client_urls(),
            binary: PathBuf::from(env!("CARGO_BIN_EXE_ai-crew-sync")),
            scratch: self.scratch.path().to_path_buf(),
        }
    }

    pub fn replica_pid(&self, r: usize) -> Option<u32> {
        self.replicas[r].pid()
    }

    pub fn kill_replica(&mut self, r: usize) {
        self.replicas[r].kill();
    }

    pub async fn restart_replica(&mut self, r: usize) -> anyhow::Result<()> {
        self.replicas[r].restart().await
    }

    pub fn pause_replica(&mut self, r: usize) {
        self.replicas[r].pause();
    }

    pub fn resume_replica(&mut self, r: usize) {
        self.replicas[r].resume();
    }

    pub fn pg_relay(&self, r: usize) -> &Proxy {
        &self.pg_relays[r]
    }

    pub fn nats_relays(&self, r: usize) -> &[Proxy] {
        &self.nats_relays[r]
    }

    pub fn crash_postgres(&mut self) -> anyhow::Result<()> {
        tokio::task::block_in_place(|| self.postgres.crash())
    }

    pub fn restart_postgres(&mut self) -> anyhow::Result<()> {
        tokio::task::block_in_place(|| self.postgres.restart())
    }

    pub fn kill_nats(&mut self, node: usize) {
        self.nats.kill(node);
    }

    /// Every NATS node stopped as an operator restarting the cluster does.
    pub fn shut_down_all_nats(&mut self) {
        tokio::task::block_in_place(|| self.nats.shut_down_all());
    }

    pub fn restart_nats(&mut self, node: usize) -> anyhow::Result<()> {
        tokio::task::block_in_place(|| self.nats.restart(node))
    }

    /// The node leading `stream`, None during an election or when the
    /// cluster does not answer.
    pub async fn stream_leader(&self, stream: &str) -> Option<usize> {
        self.nats.stream_leader(stream).await.ok().flatten()
    }

    /// Every relay passing, every process running and answering /health.
    pub async fn heal_all(&mut self) -> anyhow::Result<()> {
        for relay in self
            .pg_relays
            .iter()
            .chain(self.nats_relays.iter().flatten())
        {
            relay.pass();
        }
        if !self.postgres.is_running() {
            self.restart_postgres()?;
        }
        for node in 0..NATS_NODES {
            if !self.nats.is_running(node) {
                self.restart_nats(node)?;
            }
        }
        for replica in &mut self.replicas {
            replica.resume();
            replica.restart().await?;
        }
        for (r, replica) in self.replicas.iter().enumerate() {
            anyhow::ensure!(
                replica.healthy().await,
                "replica {r} does not answer /health after every fault was healed"
            );
        }
        Ok(())
    }

    /// The last 40 lines of every process's log, for a failed run.
    pub fn print_logs(&self) {
        let mut logs: Vec<(String, PathBuf)> = self
            .replicas
            .iter()
            .enumerate()
            .map(|(r, replica)| (format!("replica {r}"), replica.log().to_path_buf()))
            .collect();
        logs.push(("postgres".into(), self.postgres.log()));
        for node in 0..NATS_NODES {
            let log = self.scratch.path().join(format!("nats/n{node}/nats.log"));
            if log.exists() {
                logs.push((format!("nats node {node}"), log));
            }
        }
        for (name, path) in logs {
            eprintln!("chaos: ---- {name}: {} (last 40 lines)", path.display());
            eprintln!("{}", tail(&path, 40));
        }
    }

    /// Stop everything (what dropping it does, off the runtime's threads).
    /// After a failed run the scratch directory stays, with the logs and
    /// whatever the workload and the checker wrote there, but without the
    /// databases' and streams' files.
    pub async fn stop(self, failed: bool) {
        eprintln!("chaos: stopping the replicas, NATS and PostgreSQL");
        let scratch = self.scratch;
        let pg_log = self.postgres.log();
        tokio::task::block_in_place(move || {
            drop(self.replicas);
            drop((self.pg_relays, self.nats_relays, self.nats, self.postgres));
        });
        if failed {
            let dir = scratch.keep();
            let _ = std::fs::copy(&pg_log, dir.join("postgres.log"));
            for data in ["pg", "nats"] {
                let _ = std::fs::remove_dir_all(dir.join(data));
            }
            eprintln!("chaos: logs kept in {}", dir.display());
        }
    }
}
