//! The run's PostgreSQL: the embedded manager's cluster (the code `serve`
//! uses) in the scratch directory, the bus's database made and migrated
//! before any replica starts, and a bridge from a loopback TCP port to the
//! cluster's Unix socket, so each replica's fault relay has a TCP address to
//! forward to.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ai_crew_sync::db::{self, embedded::EmbeddedPostgres};
use anyhow::Context as _;
use tokio::net::{TcpListener, UnixStream};

/// The bus's database in the run's cluster.
const DATABASE: &str = "chaos";

pub struct Postgres {
    embedded: Option<EmbeddedPostgres>,
    bridge: SocketAddr,
    bridge_task: tokio::task::JoinHandle<()>,
    /// Down after [`Postgres::crash`] until [`Postgres::restart`].
    running: bool,
}

impl Postgres {
    /// initdb, start, create and migrate the bus's database (blocking steps
    /// run off the runtime's threads).
    pub async fn start(dir: &Path) -> anyhow::Result<Postgres> {
        let dir = dir.to_path_buf();
        let embedded = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&dir))
            .await?
            .context("starting the run's PostgreSQL")?;
        db::create_database_if_missing(&embedded.database_url("postgres"), DATABASE)
            .await
            .context("creating the bus's database")?;
        let pool = db::connect(&embedded.database_url(DATABASE), 2).await?;
        db::migrator()
            .run(&pool)
            .await
            .context("migrating the bus's database")?;
        pool.close().await;
        let socket = socket_path(&embedded.database_url(DATABASE))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let bridge = listener.local_addr()?;
        let bridge_task = tokio::spawn(serve_bridge(listener, socket));
        Ok(Postgres {
            embedded: Some(embedded),
            bridge,
            bridge_task,
            running: true,
        })
    }

    fn embedded(&self) -> &EmbeddedPostgres {
        self.embedded.as_ref().expect("running until dropped")
    }

    /// The bus's database over the Unix socket, as the superuser (never
    /// through a relay): for the checker and setup.
    pub fn direct_url(&self) -> String {
        self.embedded().database_url(DATABASE)
    }

    /// The TCP address a relay forwards to.
    pub fn bridge_addr(&self) -> SocketAddr {
        self.bridge
    }

    /// [`Postgres::direct_url`] with its host and port replaced by a relay's.
    pub fn url_via(&self, relay: SocketAddr) -> anyhow::Result<String> {
        let mut url = url::Url::parse(&self.direct_url())?;
        url.set_host(Some(&relay.ip().to_string()))?;
        url.set_port(Some(relay.port()))
            .map_err(|()| anyhow::anyhow!("a database URL without a port"))?;
        url.set_query(None);
        Ok(url.to_string())
    }

    /// `pg_ctl stop -m immediate`: every session cut, no checkpoint.
    pub fn crash(&mut self) -> anyhow::Result<()> {
        self.running = false;
        Ok(self.embedded().stop_immediately()?)
    }

    /// Start again after a crash (recovery from the WAL).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.embedded().restart()?;
        self.running = true;
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        self.running
    }

    pub fn log(&self) -> PathBuf {
        self.embedded().data_dir().join("pgrun/postgres.log")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.bridge_task.abort();
        if let Some(embedded) = self.embedded.take()
            && let Err(e) = embedded.stop()
        {
            eprintln!("chaos: could not stop PostgreSQL: {e}");
        }
    }
}

/// `<dir>/.s.PGSQL.<port>` from a URL of the form `…:PORT/db?host=DIR`.
fn socket_path(url: &str) -> anyhow::Result<PathBuf> {
    let url = url::Url::parse(url)?;
    let dir = url
        .query_pairs()
        .find(|(k, _)| k == "host")
        .map(|(_, v)| v.into_owned())
        .context("the embedded cluster's URL names no socket directory")?;
    let port = url.port().unwrap_or(5432);
    Ok(Path::new(&dir).join(format!(".s.PGSQL.{port}")))
}

/// Each TCP connection gets its own Unix connection; while the cluster is
/// down the connect fails and the TCP side is closed, as a refused
/// connection would be.
async fn serve_bridge(listener: TcpListener, socket: PathBuf) {
    while let Ok((mut tcp, _)) = listener.accept().await {
        let socket = socket.clone();
        tokio::spawn(async move {
            if let Ok(mut unix) = UnixStream::connect(&socket).await {
                let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
            }
        });
    }
}
