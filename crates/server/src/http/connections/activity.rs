//! What one connection is doing, as far as its timeouts care: whether a
//! request is open, since when it has waited for one, and when the heads of
//! requests not yet started began to arrive. [`WatchedIo`] follows the bytes
//! read ([`super::framing`]) and reports each head that begins, even one
//! pipelined behind a request still being answered, [`RequestOpen`]
//! marks a request from its headers until its response has been sent, and
//! [`Activity::deadline`] turns that into the moment the connection is closed
//! if nothing changes (none while a request is open: a long poll is never
//! idle).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::framing::Framing;

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
    /// When each request head read but not yet started began to arrive:
    /// the header timeout of the next request counts from the first.
    pending_heads: VecDeque<Instant>,
    /// The first byte read since `waiting_since`, on a connection whose
    /// framing is no longer followed.
    heard_at: Option<Instant>,
    /// Whether a request has been seen on this connection.
    served: bool,
    /// Taken for a newcomer ([`Activity::try_evict`]): no request starts.
    evicted: bool,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            state: Mutex::new(State {
                open_requests: 0,
                waiting_since: Instant::now(),
                pending_heads: VecDeque::new(),
                heard_at: None,
                served: false,
                evicted: false,
            }),
            changed: Notify::new(),
            evicted: CancellationToken::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `count` request heads began to arrive.
    pub(super) fn heads_begun(&self, count: usize) {
        let now = Instant::now();
        let mut state = self.state();
        state.pending_heads.extend(std::iter::repeat_n(now, count));
        drop(state);
        self.changed.notify_one();
    }

    /// Bytes arrived on a connection whose framing is no longer followed.
    pub(super) fn heard(&self) {
        let mut state = self.state();
        if state.open_requests == 0 && state.heard_at.is_none() {
            state.heard_at = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// A request's headers have arrived; `false` when the connection was
    /// evicted first (the request must not run: the connection is closing).
    /// Decided under the same lock as [`Activity::try_evict`], so a request
    /// either starts before the eviction, which then looks elsewhere, or
    /// not at all.
    pub(super) fn request_started(&self) -> bool {
        let mut state = self.state();
        if state.evicted {
            return false;
        }
        state.open_requests += 1;
        state.served = true;
        state.pending_heads.pop_front();
        drop(state);
        self.changed.notify_one();
        true
    }

    /// Evict this connection for a newcomer if no request is open on it:
    /// compare and set under the state's lock, so a request that has just
    /// started is never cut. `false`: it is busy (or already evicted).
    pub(super) fn try_evict(&self) -> bool {
        let mut state = self.state();
        if state.open_requests > 0 || state.evicted {
            return false;
        }
        state.evicted = true;
        drop(state);
        self.evicted.cancel();
        true
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
        let begun = state.pending_heads.front().copied().or(state.heard_at);
        Some(match (state.served, begun) {
            // A new connection is opened to send a request: its headers are due
            // from the accept, however slowly the first bytes come.
            (false, _) => (state.waiting_since + timeouts.header, Expiry::Headers),
            // Part of a next request is here (perhaps read ahead while the
            // last one was answered): its headers are due from its first
            // byte, or from the last answer if that came later (hyper reads
            // no more of it until then).
            (true, Some(begun)) => (
                begun.max(state.waiting_since) + timeouts.header,
                Expiry::Headers,
            ),
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
    /// `None` when the connection was evicted before the request started.
    pub(super) fn new(activity: Arc<Activity>) -> Option<RequestOpen> {
        activity.request_started().then(|| RequestOpen(activity))
    }
}

impl Drop for RequestOpen {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// The socket, telling its connection's [`Activity`] when request heads
/// begin in the bytes read.
pub(super) struct WatchedIo {
    inner: TcpStream,
    activity: Arc<Activity>,
    framing: Framing,
}

impl WatchedIo {
    pub(super) fn new(inner: TcpStream, activity: Arc<Activity>) -> WatchedIo {
        WatchedIo {
            inner,
            activity,
            framing: Framing::new(),
        }
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
            let this = &mut *self;
            let begun = this.framing.feed(&buf.filled()[before..]);
            if this.framing.lost() {
                this.activity.heard();
            } else if begun > 0 {
                this.activity.heads_begun(begun);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_has_started_is_never_evicted_and_an_evicted_one_never_starts() {
        let busy = Arc::new(Activity::new());
        let open = RequestOpen::new(busy.clone()).expect("starts on a fresh connection");
        assert!(!busy.try_evict(), "a started request keeps its connection");
        assert!(!busy.evicted.is_cancelled());
        drop(open);
        assert!(busy.try_evict(), "once answered, it may be evicted");

        let evicted = Arc::new(Activity::new());
        assert!(evicted.try_evict());
        assert!(evicted.evicted.is_cancelled());
        assert!(
            RequestOpen::new(evicted.clone()).is_none(),
            "no request starts on an evicted connection"
        );
        assert!(!evicted.try_evict(), "evicted once");
    }
}
