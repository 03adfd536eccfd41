//! The bodies around a request: [`DeadlineBody`] fails a request body that
//! has not arrived in full within its time limit (and flags it, so the
//! answer becomes [`body_timed_out`]'s 408 whatever the route made of the
//! error), and [`Finishing`] keeps a request counted open until its response
//! has been sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper::body::Incoming;
use tokio::time::Sleep;

use super::activity::RequestOpen;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// 408 for a body that did not arrive in time, whatever the route answered
/// to the error it saw; the connection closes after it.
pub(super) fn body_timed_out(limit: Duration) -> Response {
    let mut response = crate::http::json_error(
        StatusCode::REQUEST_TIMEOUT,
        "timeout",
        format!(
            "the request body did not arrive within {} s of its headers (this server's limit for \
             every request body); nothing was done. Send the whole body at once.",
            limit.as_secs()
        ),
    );
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// 503 for a request that arrived on a connection just evicted for a
/// newcomer: nothing was done, and the connection closes.
pub(super) fn evicted_before_start() -> Response {
    let mut response = crate::http::server_busy(
        "this connection had waited longest with no request and was closed to make room for \
         a new one just as this request arrived"
            .to_string(),
    );
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A response body that keeps its request open until it has been sent in
/// full (hyper drops it then) or dropped with its connection.
pub(super) struct Finishing {
    body: Body,
    _open: RequestOpen,
}

impl Finishing {
    pub(super) fn new(body: Body, open: RequestOpen) -> Finishing {
        Finishing { body, _open: open }
    }
}

impl http_body::Body for Finishing {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body that fails once `limit` has passed since its headers
/// arrived without it arriving in full.
pub(super) struct DeadlineBody {
    inner: Incoming,
    /// `None` for a body that is already complete (no body at all).
    deadline: Option<Pin<Box<Sleep>>>,
    limit: Duration,
    timed_out: Arc<AtomicBool>,
}

impl DeadlineBody {
    pub(super) fn new(
        inner: Incoming,
        limit: Duration,
        timed_out: Arc<AtomicBool>,
    ) -> DeadlineBody {
        let deadline =
            (!http_body::Body::is_end_stream(&inner)).then(|| Box::pin(tokio::time::sleep(limit)));
        DeadlineBody {
            inner,
            deadline,
            limit,
            timed_out,
        }
    }
}

/// The error a route sees when reading a body past its time limit.
#[derive(Debug)]
struct BodyTimedOut(Duration);

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} s of its headers",
            self.0.as_secs()
        )
    }
}

impl std::error::Error for BodyTimedOut {}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if let Some(deadline) = self.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            self.timed_out.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut(self.limit)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
