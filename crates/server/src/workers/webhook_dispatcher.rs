//! The webhook dispatcher: sends the delivery rows the triggers of migration
//! 0025 wrote, on every replica at once without sending one twice while its
//! lease holds (`store::operations::webhooks::delivery`).
//!
//! A pass claims a batch (one short statement), sends each delivery with
//! nothing held in the database (a few at a time, each bounded by the
//! request timeout), then settles each in its own statement: a 2xx is
//! delivered; a 4xx other than 408 and 429 is permanent (the receiver said
//! no; asking again will not change it), as are a redirect (not followed: it
//! could point anywhere) and an address refused at send time; anything else
//! (5xx, 408, 429, a timeout, a refused connection) is retried after an
//! exponential backoff, and fails after six attempts with its last error.
//!
//! It polls (every second by default) rather than listening: waking on a
//! notification would put a `pg_notify` in every posting transaction of a
//! team with hooks, which serialises commits (see `events.rs`). Tool calls
//! never wait on it: the rows are written by the triggers and sent later.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use acs_store::error::{BusError, BusResult};
use acs_store::store::operations::webhooks::address::{self, GuardedResolver, PrivateDestination};
use acs_store::store::operations::webhooks::delivery::{self, Claimed, Settled};
use acs_store::store::operations::webhooks::payload;

/// How the dispatcher runs. The defaults are what `serve` uses.
#[derive(Clone, Debug)]
pub struct DispatchSettings {
    /// Time between passes while there is nothing due.
    pub poll: Duration,
    /// Deliveries claimed per pass.
    pub batch: i64,
    /// Deliveries sent at once.
    pub concurrency: usize,
    /// One request's whole budget (connect, send, answer).
    pub request_timeout: Duration,
    /// How long a claim holds its rows: longer than a request may take.
    pub lease: Duration,
    /// The wait after the first failed attempt; doubled after each.
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    /// How long delivered rows are kept (failed ones stay with their hook).
    pub keep_delivered: Duration,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        DispatchSettings {
            poll: Duration::from_secs(1),
            batch: 32,
            concurrency: 8,
            request_timeout: Duration::from_secs(10),
            lease: Duration::from_secs(60),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(300),
            keep_delivered: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl DispatchSettings {
    /// The wait after attempt `attempts` (1-based) failed.
    pub fn backoff(&self, attempts: i32) -> Duration {
        let doublings = attempts.saturating_sub(1).clamp(0, 20) as u32;
        self.backoff_base
            .saturating_mul(1 << doublings)
            .min(self.backoff_cap)
    }
}

/// What one delivery came to, for the metrics and the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    Retried,
    Failed,
    /// The lease was lost or the hook removed meanwhile: nothing written.
    Fenced,
}

/// The HTTP clients of one replica: one that refuses private addresses at
/// connection time, one for hooks added with `--allow-private`.
#[derive(Clone)]
pub struct Dispatcher {
    pool: sqlx::PgPool,
    settings: DispatchSettings,
    guarded: reqwest::Client,
    open: reqwest::Client,
}

impl Dispatcher {
    pub fn new(pool: sqlx::PgPool, settings: DispatchSettings) -> BusResult<Dispatcher> {
        // reqwest is built without a TLS provider of its own and refuses to
        // build a client without one; `main` installs ring, and so does this
        // for a library caller that did not (an error means one is installed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let build = |guarded: bool| {
            let mut builder = reqwest::Client::builder()
                .timeout(settings.request_timeout)
                .connect_timeout(settings.request_timeout)
                .redirect(reqwest::redirect::Policy::none())
                // A proxy would resolve the host itself, past the guard.
                .no_proxy()
                .user_agent(concat!("ai-crew-sync-webhooks/", env!("CARGO_PKG_VERSION")));
            if guarded {
                builder = builder.dns_resolver(Arc::new(GuardedResolver));
            }
            builder.build().map_err(|e| {
                BusError::unavailable(format!("could not build the webhook HTTP client: {e}"))
            })
        };
        Ok(Dispatcher {
            guarded: build(true)?,
            open: build(false)?,
            pool,
            settings,
        })
    }

    /// One pass: claim a batch, send it, settle it. Returns how many were
    /// claimed (a full batch means more may be due).
    pub async fn run_once(&self) -> BusResult<usize> {
        let claimed = delivery::claim(&self.pool, self.settings.batch, self.settings.lease).await?;
        let n = claimed.len();
        let results: Vec<BusResult<Outcome>> = futures::stream::iter(claimed)
            .map(|c| async move { self.deliver(&c).await })
            .buffer_unordered(self.settings.concurrency.max(1))
            .collect()
            .await;
        for result in results {
            match result {
                Ok(outcome) => count(outcome),
                // The lease lapses and another pass sends it again.
                Err(err) => tracing::warn!(error = %err, "settling a webhook delivery failed"),
            }
        }
        Ok(n)
    }

    async fn deliver(&self, claimed: &Claimed) -> BusResult<Outcome> {
        let body = payload::body(claimed);
        let backoff = self.settings.backoff(claimed.attempts);
        let fail = |status: Option<u16>, error: String, permanent: bool| async move {
            let settled =
                delivery::settle_failed(&self.pool, claimed, status, &error, permanent, backoff)
                    .await?;
            tracing::info!(delivery = %claimed.id, webhook = %claimed.webhook_id,
                           attempts = claimed.attempts, ?settled, error, "webhook delivery failed");
            Ok(match settled {
                Settled::Retrying => Outcome::Retried,
                Settled::Failed => Outcome::Failed,
                Settled::Fenced => Outcome::Fenced,
            })
        };
        // Nothing below puts the hook's URL into an error: its path or query
        // may carry the receiver's secret (Slack's and Discord's do), and
        // the error is both logged and listed.
        let url = match address::check_url(&claimed.url) {
            Ok(url) => url,
            Err(_) => {
                let error = "the hook's stored URL no longer passes the URL checks; remove the \
                             hook and add it again";
                return fail(None, error.to_owned(), true).await;
            }
        };
        if !claimed.allow_private
            && let Some(refusal) = address::literal_refusal(&url)
        {
            return fail(None, refusal, true).await;
        }
        let client = if claimed.allow_private {
            &self.open
        } else {
            &self.guarded
        };
        let timestamp = chrono::Utc::now().timestamp();
        let sent = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("X-Bus-Delivery", claimed.id.to_string())
            .header("X-Bus-Event", &claimed.event)
            .header("X-Bus-Timestamp", timestamp.to_string())
            .header(
                "X-Bus-Signature",
                payload::signature(&claimed.secret, timestamp, &body),
            )
            .body(body)
            .send()
            .await;
        match sent {
            Ok(response) => {
                let status = response.status();
                if status.is_success() {
                    return Ok(
                        if delivery::settle_delivered(&self.pool, claimed, status.as_u16()).await? {
                            Outcome::Delivered
                        } else {
                            Outcome::Fenced
                        },
                    );
                }
                let permanent = status.is_redirection()
                    || (status.is_client_error() && !matches!(status.as_u16(), 408 | 429));
                // The status and its standard phrase only, never the body:
                // the listing shows this to whoever manages the team's hooks,
                // and a body is whatever the receiver (a metadata service,
                // an internal admin page) chose to say.
                let mut error = format!("the receiver answered {status}");
                if status.is_redirection() {
                    error.push_str(" (redirects are not followed; give the final URL)");
                }
                fail(Some(status.as_u16()), error, permanent).await
            }
            Err(err) => {
                let refused = private_refusal(&err);
                let error = match &refused {
                    Some(refusal) => refusal.clone(),
                    None if err.is_timeout() => format!(
                        "no answer within {} s",
                        self.settings.request_timeout.as_secs_f64()
                    ),
                    None => format!(
                        "could not reach the receiver: {}",
                        unreachable(err, &claimed.url)
                    ),
                };
                fail(None, error, refused.is_some()).await
            }
        }
    }
}

fn count(outcome: Outcome) {
    let label = match outcome {
        Outcome::Delivered => "delivered",
        Outcome::Retried => "retried",
        Outcome::Failed => "failed",
        Outcome::Fenced => return,
    };
    metrics::counter!("bus_webhook_deliveries_total", "outcome" => label).increment(1);
}

/// The guard's refusal, if that is why the request failed.
fn private_refusal(err: &reqwest::Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(refused) = e.downcast_ref::<PrivateDestination>() {
            return Some(refused.to_string());
        }
        source = e.source();
    }
    None
}

/// Why a request got no answer, with its causes (reqwest's own text is only
/// the outermost), and never the hook's URL: reqwest's text names it
/// (`error sending request for url (…)`), so it is stripped from the error,
/// and any cause that repeats it has it replaced.
fn unreachable(err: reqwest::Error, url: &str) -> String {
    let err = err.without_url();
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text.replace(url, "<the hook's URL>")
}

/// Run passes until `shutdown`: at once again after a full batch, else after
/// `settings.poll`; once an hour, prune old delivered rows.
pub fn spawn(
    pool: sqlx::PgPool,
    settings: DispatchSettings,
    shutdown: CancellationToken,
) -> BusResult<tokio::task::JoinHandle<()>> {
    let dispatcher = Dispatcher::new(pool, settings)?;
    Ok(tokio::spawn(async move {
        let settings = dispatcher.settings.clone();
        let mut last_prune: Option<tokio::time::Instant> = None;
        loop {
            let full = match dispatcher.run_once().await {
                Ok(n) => n as i64 >= settings.batch,
                Err(err) => {
                    tracing::warn!(error = %err, "webhook dispatch pass failed; retrying");
                    false
                }
            };
            if last_prune.is_none_or(|at| at.elapsed() >= Duration::from_secs(3600)) {
                last_prune = Some(tokio::time::Instant::now());
                if let Err(err) =
                    delivery::prune_delivered(&dispatcher.pool, settings.keep_delivered, 10_000)
                        .await
                {
                    tracing::warn!(error = %err, "pruning delivered webhook rows failed");
                }
            }
            if full {
                if shutdown.is_cancelled() {
                    return;
                }
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(settings.poll) => {}
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_up_to_the_cap() {
        let settings = DispatchSettings::default();
        let waits: Vec<u64> = (1..=12).map(|n| settings.backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }
}
