//! Connections: the accept loop under [`serve`], and what keeps sockets from
//! taking the server down before a single request is parsed.
//!
//! Every accepted socket costs a file descriptor whatever it sends, so the
//! limits here act on connections, not requests (those are [`super::limits`]):
//!
//! - **A cap on open connections**, below the process's descriptor limit
//!   (`serve` raises the soft limit to the hard one and keeps room for the
//!   database pool and the broker), **and one per client address** (IPv6 per
//!   /64), well below it. A connection over its address's cap is answered a
//!   fixed 503 if the socket takes it at once, and closed.
//! - **At the global cap a newcomer evicts** the connection that has waited
//!   longest without a request in flight (idle, or still sending its
//!   headers) instead of being turned away; only when every connection is
//!   busy answering is it refused. A connection is taken by compare-and-set
//!   on its state ([`activity::Activity::try_evict`]): one whose request
//!   started since it was picked is passed over, never cut, and a request
//!   arriving on one already taken is answered 503 without running. A flood of sockets that never finish their
//!   headers, from one address or many, therefore never keeps `/health` (or
//!   anyone else) out: its sockets are what gets evicted, and each lives at
//!   most the header timeout anyway.
//! - **A header timeout**: a request's headers must arrive in full within it,
//!   counted from the accept for a connection's first request and from the
//!   first byte for a later one. Past it the connection is closed. A later
//!   request's first byte is found by following the framing of the bytes
//!   read ([`framing`]), so the start of a request pipelined behind another
//!   (read ahead by hyper, perhaps in the same read as the end of the one
//!   before) is timed by this deadline too, not by the idle one.
//! - **An idle timeout**: a kept-alive connection with no request in flight
//!   and no byte of a next one is closed after it. A request in flight (a
//!   long poll waiting up to 300 s, a progress stream) is never idle.
//! - **A body time limit on every route**: a request's body must arrive in
//!   full within `body_read_timeout` of its headers; one that does not is
//!   answered 408 (`timeout`) and its connection closed, whatever the route
//!   did with the body.
//!
//! Shutdown: the loop stops accepting (the listening socket is closed), each
//! connection finishes the request it is answering and closes (idle ones at
//! once), and after `shutdown_grace` whatever is left is dropped. Long polls
//! answer at once on their own (they watch [`acs_store::Bus::stopping`]).
//!
//! hyper's own header timeout is not used: it also restarts when a
//! connection goes idle, which would make the idle timeout the header timeout.

mod activity;
mod bodies;
mod framing;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use activity::{Activity, RequestOpen, Timeouts, WatchedIo};
use bodies::{DeadlineBody, Finishing, body_timed_out, evicted_before_start};

use super::limits::address_key;
use crate::config::HttpSettings;

/// How long a newcomer at the global cap waits for the connection it evicted
/// to let go of its slot (a task wake-up, normally far less).
const EVICTION_WAIT: Duration = Duration::from_secs(1);
/// At most one warning per this long about refused connections: a flood
/// must not also flood the log.
const REFUSAL_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Serve `app` on `listener` until `shutdown` is cancelled, under the
/// connection limits of `settings` (see the module docs); then stop
/// accepting and give the requests in flight up to `settings.shutdown_grace`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    settings: &HttpSettings,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let registry = Arc::new(Registry::new(settings));
    let timeouts = Timeouts {
        header: settings.header_read_timeout,
        idle: settings.idle_timeout,
        body: settings.body_read_timeout,
    };
    let hard_stop = CancellationToken::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            // The peer gave up between connect and accept: nothing to do.
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                // Out of descriptors (another part of the process, or a limit
                // set below the caps): accepting again at once would spin.
                tracing::error!(error = %err, "accept failed; retrying in 1 s");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        // Answers go out as they are written: with Nagle's algorithm a
        // response written in two parts (headers, then body) waits for the
        // client's delayed ACK, ~40 ms, on every kept-alive call.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err, "could not set TCP_NODELAY");
        }
        match registry.admit(peer.ip()).await {
            Ok(admission) => {
                let connection = Connection {
                    app: app.clone(),
                    peer,
                    timeouts,
                    shutdown: shutdown.clone(),
                    hard_stop: hard_stop.clone(),
                };
                tokio::spawn(connection.run(stream, admission));
            }
            Err(refusal) => registry.refuse(stream, peer, refusal),
        }
    }
    drop(listener);
    let grace = settings.shutdown_grace;
    if tokio::time::timeout(grace, registry.all_closed())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_secs = grace.as_secs(),
            "in-flight requests did not finish in time; closing them"
        );
        hard_stop.cancel();
        let _ = tokio::time::timeout(EVICTION_WAIT, registry.all_closed()).await;
    }
    Ok(())
}

fn is_connection_error(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        err.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// Why a connection was not taken.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// Its address holds its cap of connections.
    AddressFull,
    /// The server holds its cap, every connection busy with a request.
    ServerFull,
}

/// Every open connection: the global count, the count per address, and each
/// connection's [`Activity`], which eviction looks at.
struct Registry {
    slots: Arc<Semaphore>,
    max: u32,
    max_per_address: usize,
    per_address: Mutex<HashMap<IpAddr, usize>>,
    open: Mutex<HashMap<u64, Arc<Activity>>>,
    next_id: AtomicU64,
    warned_at: Mutex<Option<Instant>>,
}

impl Registry {
    fn new(settings: &HttpSettings) -> Registry {
        let max = u32::try_from(settings.max_connections.clamp(1, Semaphore::MAX_PERMITS))
            .unwrap_or(u32::MAX);
        Registry {
            slots: Arc::new(Semaphore::new(max as usize)),
            max,
            max_per_address: settings.max_connections_per_address.clamp(1, max as usize),
            per_address: Mutex::new(HashMap::new()),
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            warned_at: Mutex::new(None),
        }
    }

    /// A place for a connection from `address`, evicting a waiting
    /// connection when the server is at its cap.
    async fn admit(self: &Arc<Self>, address: IpAddr) -> Result<Admission, Refusal> {
        let key = address_key(address);
        let held = |registry: &Registry| {
            let counts = registry
                .per_address
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            counts.get(&key).copied().unwrap_or(0)
        };
        if held(self) >= self.max_per_address {
            return Err(Refusal::AddressFull);
        }
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if !self.evict_longest_waiting() {
                    return Err(Refusal::ServerFull);
                }
                match tokio::time::timeout(EVICTION_WAIT, self.slots.clone().acquire_owned()).await
                {
                    Ok(Ok(slot)) => slot,
                    _ => return Err(Refusal::ServerFull),
                }
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new());
        *self
            .per_address
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_insert(0) += 1;
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, activity.clone());
        Ok(Admission {
            registry: self.clone(),
            id,
            key,
            activity,
            _slot: slot,
        })
    }

    /// Evict the open connection that has waited longest with no request
    /// in flight; `false` when every one is answering a request. Each
    /// candidate is taken by compare and set ([`Activity::try_evict`]): one
    /// whose request started since the list was made is passed over, never
    /// cut.
    fn evict_longest_waiting(&self) -> bool {
        let mut waiting: Vec<_> = {
            let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            open.values()
                .filter(|a| !a.evicted.is_cancelled())
                .filter_map(|a| a.waiting_since().map(|since| (since, a.clone())))
                .collect()
        };
        waiting.sort_by_key(|(since, _)| *since);
        waiting.iter().any(|(_, a)| a.try_evict())
    }

    /// Resolves once every connection has closed.
    async fn all_closed(&self) {
        let _ = self.slots.acquire_many(self.max).await;
    }

    /// Close `stream` at once, after a fixed 503 if its send buffer takes it
    /// without waiting (a fresh socket's does): a client over a cap learns why.
    fn refuse(&self, stream: TcpStream, peer: SocketAddr, refusal: Refusal) {
        let message = match refusal {
            Refusal::AddressFull => format!(
                "this client address already has {} connections open to this server, its limit. \
                 Nothing was done. Reuse open connections (keep-alive) or close idle ones, then \
                 retry.",
                self.max_per_address
            ),
            Refusal::ServerFull => format!(
                "the server has its maximum of {} connections open, each answering a request. \
                 Nothing was done. Retry in 1 s.",
                self.max
            ),
        };
        let body = serde_json::json!({ "error": "overloaded", "message": message }).to_string();
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.try_write(response.as_bytes());
        drop(stream);
        let now = Instant::now();
        let mut warned_at = self.warned_at.lock().unwrap_or_else(|p| p.into_inner());
        if warned_at.is_none_or(|at| now.duration_since(at) >= REFUSAL_WARNING_EVERY) {
            *warned_at = Some(now);
            tracing::warn!(peer = %peer, reason = ?refusal,
                "refusing connections over the connection caps (--max-connections, \
                 --max-connections-per-address); further refusals are not logged for 10 s");
        }
    }
}

/// One connection's place among the open ones; dropping it gives the place back.
struct Admission {
    registry: Arc<Registry>,
    id: u64,
    key: IpAddr,
    activity: Arc<Activity>,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.registry
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        let mut counts = self
            .registry
            .per_address
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// One accepted connection, served until it ends, times out, is evicted or
/// the server stops.
struct Connection {
    app: Router,
    peer: SocketAddr,
    timeouts: Timeouts,
    shutdown: CancellationToken,
    hard_stop: CancellationToken,
}

impl Connection {
    async fn run(self, stream: TcpStream, admission: Admission) {
        let activity = admission.activity.clone();
        let io = TokioIo::new(WatchedIo::new(stream, activity.clone()));
        let (app, peer, body_limit) = (self.app, self.peer, self.timeouts.body);
        let watched = activity.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            answer(app.clone(), peer, body_limit, watched.clone(), request)
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.header_read_timeout(None);
        let mut conn = pin!(builder.serve_connection(io, service));
        let mut draining = false;
        loop {
            let deadline = activity.deadline(&self.timeouts);
            let expired = async {
                match deadline {
                    Some((at, _)) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(err) = result {
                        tracing::debug!(peer = %peer, error = %err, "connection ended with an error");
                    }
                    break;
                }
                () = activity.changed.notified() => {}
                () = expired => {
                    // Closed only if the deadline still stands: a request may
                    // have begun since it was computed.
                    if let Some((at, why)) = activity.deadline(&self.timeouts)
                        && at <= Instant::now()
                    {
                        tracing::debug!(peer = %peer, reason = ?why, "closing a connection past its timeout");
                        break;
                    }
                }
                () = activity.evicted.cancelled() => {
                    tracing::debug!(peer = %peer, "closing a waiting connection to make room for a new one");
                    break;
                }
                () = self.shutdown.cancelled(), if !draining => {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = self.hard_stop.cancelled() => break,
            }
        }
        drop(admission);
    }
}

/// Answer one request with `app`: the peer address as `ConnectInfo`, the
/// body under its time limit, and the request counted open until its
/// response has been sent in full (or dropped).
async fn answer(
    app: Router,
    peer: SocketAddr,
    body_limit: Duration,
    activity: Arc<Activity>,
    request: hyper::Request<Incoming>,
) -> Result<Response, Infallible> {
    let Some(open) = RequestOpen::new(activity) else {
        // The connection was evicted just before this request began: it is
        // closing, and the request did nothing.
        return Ok(evicted_before_start());
    };
    let timed_out = Arc::new(AtomicBool::new(false));
    let mut request =
        request.map(|body| Body::new(DeadlineBody::new(body, body_limit, timed_out.clone())));
    request.extensions_mut().insert(ConnectInfo(peer));
    let response = app.oneshot(request).await?;
    let response = if timed_out.load(Ordering::Relaxed) {
        body_timed_out(body_limit)
    } else {
        response
    };
    Ok(response.map(|body| Body::new(Finishing::new(body, open))))
}

/// Raise this process's soft limit of open files to its hard limit, and
/// say how many connections fit under it once `reserved` descriptors are
/// kept for everything else (the database pool, the broker, files).
pub fn connection_budget(reserved: u64) -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given and nothing else.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        }
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
    let soft = limit.rlim_cur as u64;
    Ok(soft.saturating_sub(reserved))
}
