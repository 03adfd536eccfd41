//! A small TCP proxy for fault injection at the network (DESIGN.md, Tests):
//! it passes bytes through, delays them, cuts every connection, or
//! black-holes them (accepts and forwards nothing) — in both directions or
//! only on the way back, which is how a reply (a PubAck) gets lost after the
//! server acted on the request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, Default)]
struct Mode {
    delay: Option<Duration>,
    /// Drop what the client sends.
    drop_up: bool,
    /// Drop what the server sends back.
    drop_down: bool,
}

pub struct Proxy {
    addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    /// Bumped by `cut`: every connection open at that moment closes.
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listen on a free loopback port, forwarding to `upstream` (host:port).
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let mode: Arc<Mutex<Mode>> = Arc::default();
        let (cuts, _) = watch::channel(0u64);
        let task = {
            let mode = mode.clone();
            let cuts = cuts.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let mode = mode.clone();
                    let cut = cuts.subscribe();
                    tokio::spawn(connection(client, upstream, mode, cut));
                }
            })
        };
        Proxy {
            addr,
            mode,
            cuts,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// The address clients connect to, for a protocol other than NATS.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    fn set(&self, change: impl FnOnce(&mut Mode)) {
        change(&mut self.mode.lock().unwrap());
    }

    /// Forward everything again, undelayed.
    pub fn pass(&self) {
        self.set(|m| *m = Mode::default());
    }

    /// Hold every chunk this long before forwarding it.
    pub fn delay(&self, by: Duration) {
        self.set(|m| m.delay = Some(by));
    }

    /// Accept, read, forward nothing, either way.
    pub fn black_hole(&self) {
        self.set(|m| {
            m.drop_up = true;
            m.drop_down = true;
        });
    }

    /// Forward requests, drop every reply: the server acts, the client never
    /// hears.
    pub fn black_hole_replies(&self) {
        self.set(|m| m.drop_down = true);
    }

    /// Close every connection open now (new ones are accepted).
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    mut cut: watch::Receiver<u64>,
) {
    cut.mark_unchanged();
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, mode.clone(), true);
    let down = pump(server_read, client_write, mode, false);
    // The cut first: a connection cut while bytes wait in its socket must
    // not forward them when it is next polled, whatever the mode is by then
    // (a test cuts and then lets replies pass again).
    tokio::select! {
        biased;
        _ = cut.changed() => {}
        _ = up => {}
        _ = down => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: Arc<Mutex<Mode>>,
    upward: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = mode.lock().unwrap().delay;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        // A chunk held by a delay is judged by the mode when it is let go,
        // so a test can cut off what is already on its way.
        let now = *mode.lock().unwrap();
        if (upward && now.drop_up) || (!upward && now.drop_down) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
