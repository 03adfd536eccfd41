//! What one connection is doing, as far as its timeouts care: whether a
//! request is open, since when it has waited for one, and when the first
//! byte of the next arrived. [`WatchedIo`] reports bytes read, [`RequestOpen`]
//! marks a request from its headers until its response has been sent, and
//! [`Activity::deadline`] turns that into the moment the connection is closed
//! if nothing changes (none while a request is open: a long poll is never
//! idle).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The connection timeouts of [`crate::config::HttpSettings`].
#[derive(Clone, Copy)]
pub(super) struct Timeouts {
    pub(super) header: Duration,
    pub(super) idle: Duration,
    pub(super) body: Duration,
}

/// What one connection is doing, as far as the timeouts care.
pub(super) struct Activity {
    state: Mutex<State>,
    /// Signalled when a deadline may have moved (a first byte, a request
    /// starting or finishing).
    pub(super) changed: Notify,
    /// Cancelled to make room for a newcomer at the global cap.
    pub(super) evicted: CancellationToken,
}

struct State {
    /// Requests being answered: their response not yet sent in full.
    open_requests: u32,
    /// Since when no request has been open: the accept, or the end of the
    /// last response.
    waiting_since: Instant,
    /// The first byte read since `waiting_since`.
    heard_at: Option<Instant>,
    /// Whether a request has been seen on this connection.
    served: bool,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            state: Mutex::new(State {
                open_requests: 0,
                waiting_since: Instant::now(),
                heard_at: None,
                served: false,
            }),
            changed: Notify::new(),
            evicted: CancellationToken::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes arrived.
    pub(super) fn heard(&self) {
        let mut state = self.state();
        if state.open_requests == 0 && state.heard_at.is_none() {
            state.heard_at = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    pub(super) fn request_started(&self) {
        let mut state = self.state();
        state.open_requests += 1;
        state.served = true;
        drop(state);
        self.changed.notify_one();
    }

    pub(super) fn request_finished(&self) {
        let mut state = self.state();
        state.open_requests = state.open_requests.saturating_sub(1);
        if state.open_requests == 0 {
            state.waiting_since = Instant::now();
            state.heard_at = None;
        }
        drop(state);
        self.changed.notify_one();
    }

    /// When this connection is to be closed if nothing changes; `None`
    /// while a request is open (a request in flight is never idle).
    pub(super) fn deadline(&self, timeouts: &Timeouts) -> Option<(Instant, Expiry)> {
        let state = self.state();
        if state.open_requests > 0 {
            return None;
        }
        Some(match (state.served, state.heard_at) {
            // A new connection is opened to send a request: its headers are due
            // from the accept, however slowly the first bytes come.
            (false, _) => (state.waiting_since + timeouts.header, Expiry::Headers),
            (true, Some(heard_at)) => (heard_at + timeouts.header, Expiry::Headers),
            (true, None) => (state.waiting_since + timeouts.idle, Expiry::Idle),
        })
    }

    /// Since when this connection has had no request in flight, if it has none.
    pub(super) fn waiting_since(&self) -> Option<Instant> {
        let state = self.state();
        (state.open_requests == 0).then_some(state.waiting_since)
    }
}

/// Which timeout a deadline is (for the log).
#[derive(Clone, Copy, Debug)]
pub(super) enum Expiry {
    Headers,
    Idle,
}

/// A request counted open on its connection until dropped.
pub(super) struct RequestOpen(Arc<Activity>);

impl RequestOpen {
    pub(super) fn new(activity: Arc<Activity>) -> RequestOpen {
        activity.request_started();
        RequestOpen(activity)
    }
}

impl Drop for RequestOpen {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// The socket, telling its connection's [`Activity`] when bytes arrive.
pub(super) struct WatchedIo {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl WatchedIo {
    pub(super) fn new(inner: TcpStream, activity: Arc<Activity>) -> WatchedIo {
        WatchedIo { inner, activity }
    }
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.heard();
        }
        result
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
