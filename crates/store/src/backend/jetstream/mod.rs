//! The JetStream backend (NATS): where a team's conversation bodies live once
//! the team is routed there, and the durable inbox of references.
//!
//! Layout per team (`<team>` = the team UUID as 32 lowercase hex):
//!
//! * body stream `ACS_T_<team>`, subjects `acs.<team>.conv.<conversation>`:
//!   file storage, limits retention, discard new (a full stream refuses a new
//!   body rather than dropping an old one: history is never silently lost);
//! * inbox stream `ACS_I_<team>`, subjects `acsi.<team>.inbox.<recipient_key>`:
//!   work-queue retention (a reference goes once its window acked it), discard
//!   old, 7 days (PostgreSQL rebuilds anything owed that expired here).
//!
//! Every stream, subject and consumer name is derived here from ids the bus
//! owns; none is ever a client argument.
//!
//! What this module deliberately does not do: decide what a failure *means*
//! for a message. It reports what the broker said (`Published`), and the
//! outbox settles it.

mod backend;
mod conditions;
mod inbox;
mod inspect;
mod provision;
mod replicas;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use uuid::Uuid;

use crate::error::{BusError, BusResult};

pub use backend::JetStreamBackend;
pub use conditions::{CHECK_CACHE, ConditionKind, StreamCondition};
pub use inbox::InboxDelivery;
pub use inspect::{LimitFinding, StreamInspection};
pub use provision::{StreamReport, StreamSizes, TeamStreams};
pub use replicas::ALLOWED as ALLOWED_REPLICAS;

/// The largest body the bus accepts (the outbox cap, O1).
pub use acs_wire::limits::BODY_MAX_BYTES;

/// Room for the headers a body travels with (`Nats-Msg-Id` and three
/// `Acs-*` ids take ~200 bytes); generous, so a future header does not
/// turn a full body into a refusal.
pub const HEADER_ALLOWANCE: usize = 4 * 1024;

/// The smallest `max_payload` a broker must accept for the bus to route
/// bodies to it: a full body plus its headers. NATS's default (1 MB =
/// 1 048 576 bytes) is just short of it.
pub const REQUIRED_MAX_PAYLOAD: usize = BODY_MAX_BYTES + HEADER_ALLOWANCE;

/// How long a request to the broker may take before it counts as unanswered.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long after the broker first answered "no such message" for a body
/// its absence may be confirmed (by the stream leader) and the body
/// tombstoned. One answer is not enough: a replica that lags, or a broker
/// restored or re-provisioned a moment ago, answers "not found" for a body
/// that is (or will be again) there, and a tombstone is for good.
pub const DEFAULT_ABSENCE_CONFIRM_DELAY: Duration = Duration::from_secs(5);

/// How many first misses one process remembers. Forgetting one only restarts
/// its clock (a later tombstone, never an earlier one), so when full the
/// record is simply cleared.
const MISSES_MAX: usize = 10_000;

/// How to connect. `Default` is what `serve` and the operator commands use.
#[derive(Clone, Debug)]
pub struct BrokerOptions {
    /// Bounds every JetStream request and every PubAck wait. A publish whose
    /// ack does not come back within it is reported `Unanswered`.
    pub timeout: Duration,
    /// A body is declared gone only when the stream leader still answers
    /// "no such message" at least this long after the first such answer
    /// ([`DEFAULT_ABSENCE_CONFIRM_DELAY`]).
    pub absence_confirm_delay: Duration,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_TIMEOUT,
            absence_confirm_delay: DEFAULT_ABSENCE_CONFIRM_DELAY,
        }
    }
}

/// A connection to the NATS server this process publishes to. Cheap to
/// clone: every clone shares one client (async-nats reconnects it).
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    client: async_nats::Client,
    js: jetstream::Context,
    max_payload: usize,
    timeout: Duration,
    /// Subjects the server reported a publish permission violation for, and
    /// when. NATS answers such a publish with an asynchronous `-ERR` and no
    /// reply, so without this a denied publish would look unanswered forever.
    denied: Arc<Mutex<HashMap<String, Instant>>>,
    /// Whether each body stream read so far allows direct get. A stream the
    /// bus created does; an adopted one may not, and on NATS 2.9 a direct
    /// get to such a stream is not refused but left unanswered, so the
    /// choice is made from the stream's config rather than by trying.
    direct: Mutex<HashMap<String, bool>>,
    absence_confirm_delay: Duration,
    /// When the broker first answered that it holds nothing at (stream,
    /// sequence), for bodies whose absence is not confirmed yet. In memory
    /// on purpose: a restart or another replica starts the clock again, which
    /// can only delay a tombstone.
    misses: Mutex<HashMap<(String, u64), Instant>>,
    /// Conditions of the teams' streams an operator can fix (`conditions.rs`).
    conditions: conditions::Conditions,
}

impl Broker {
    /// Connect with the default options. Refuses a broker that cannot take a
    /// full body plus headers, or that has JetStream off.
    pub async fn connect(url: &str, credentials: Option<&Path>) -> BusResult<Broker> {
        Self::connect_with(url, credentials, BrokerOptions::default()).await
    }

    pub async fn connect_with(
        url: &str,
        credentials: Option<&Path>,
        options: BrokerOptions,
    ) -> BusResult<Broker> {
        Self::connect_checking(url, credentials, options, true).await
    }

    /// Connect as [`Broker::connect`] does, but take a broker whose
    /// `max_payload` is too small for a full body (compare [`Broker::max_payload`]
    /// with [`REQUIRED_MAX_PAYLOAD`]): `doctor` reports that itself and
    /// still looks at the streams. Never used to route bodies.
    pub async fn connect_to_inspect(url: &str, credentials: Option<&Path>) -> BusResult<Broker> {
        Self::connect_checking(url, credentials, BrokerOptions::default(), false).await
    }

    async fn connect_checking(
        url: &str,
        credentials: Option<&Path>,
        options: BrokerOptions,
        refuse_small_payload: bool,
    ) -> BusResult<Broker> {
        // Several servers of a cluster, comma-separated; userinfo in a URL
        // (`nats://user:pass@host`, `nats://token@host`) is passed on as
        // credentials, and never printed.
        let (servers, user_info) = split_servers(url)?;
        let shown = servers.join(",");
        let url = shown.as_str();
        let denied: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let seen = denied.clone();
        let mut connect = async_nats::ConnectOptions::new()
            .name("ai-crew-sync")
            .connection_timeout(options.timeout)
            .request_timeout(Some(options.timeout))
            .event_callback(move |event| {
                let seen = seen.clone();
                async move {
                    if let async_nats::Event::ServerError(async_nats::ServerError::Other(text)) =
                        &event
                        && let Some(subject) = denied_publish_subject(text)
                    {
                        seen.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(subject, Instant::now());
                    }
                }
            });
        match user_info {
            Some((user, Some(password))) => connect = connect.user_and_password(user, password),
            Some((token, None)) => connect = connect.token(token),
            None => {}
        }
        if let Some(path) = credentials {
            connect = connect.credentials_file(path).await.map_err(|e| {
                BusError::invalid(format!(
                    "could not read the NATS credentials file {}: {e}. Name a readable \
                     .creds file (nsc generate creds), or leave --nats-credentials out.",
                    path.display()
                ))
            })?;
        }
        let client = connect.connect(servers.as_slice()).await.map_err(|e| {
            BusError::unavailable(format!(
                "could not connect to the NATS server at {url}: {e}. Check the URL and that \
                 nats-server is running with JetStream on (`nats-server -js`)."
            ))
        })?;
        let max_payload = client.server_info().max_payload;
        if refuse_small_payload && max_payload < REQUIRED_MAX_PAYLOAD {
            return Err(BusError::invalid(format!(
                "the NATS server at {url} accepts at most {max_payload} bytes per message \
                 (its `max_payload`), and a conversation body can be 1 MiB ({BODY_MAX_BYTES} \
                 bytes) plus headers, at least {REQUIRED_MAX_PAYLOAD} bytes in all. The bus \
                 refuses to route bodies to a broker that would reject a full one. Raise it \
                 in nats-server.conf (e.g. `max_payload: 2MB`) and restart nats-server."
            )));
        }
        let js = jetstream::ContextBuilder::new()
            .timeout(options.timeout)
            .build(client.clone());
        account_info(&client, options.timeout).await.map_err(|e| {
            BusError::unavailable(format!(
                "the NATS server at {url} answered, but JetStream did not ({e}). Start \
                 nats-server with JetStream on (`-js`, or a `jetstream {{}}` block in its \
                 config) and give this account access to it."
            ))
        })?;
        Ok(Broker {
            inner: Arc::new(Inner {
                url: url.to_owned(),
                client,
                js,
                max_payload,
                timeout: options.timeout,
                denied,
                direct: Mutex::default(),
                absence_confirm_delay: options.absence_confirm_delay,
                misses: Mutex::default(),
                conditions: conditions::Conditions::default(),
            }),
        })
    }

    /// Whether the broker answers now: connected, and JetStream replies to an
    /// account-info request within a short timeout.
    pub async fn reachable(&self) -> bool {
        if self.inner.client.connection_state() != async_nats::connection::State::Connected {
            return false;
        }
        let wait = self.inner.timeout.min(Duration::from_secs(2));
        account_info(&self.inner.client, wait).await.is_ok()
    }

    /// The server's `max_payload`, as read at connect.
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload
    }

    /// The URL this broker was connected with (for messages; no credentials).
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The JetStream context (for tests and operator tooling that inspect
    /// streams; the bus itself goes through the methods here).
    pub fn js(&self) -> &jetstream::Context {
        &self.inner.js
    }

    pub(crate) fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    pub(crate) fn allows_direct(&self, stream: &str) -> Option<bool> {
        self.inner
            .direct
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(stream)
            .copied()
    }

    pub(crate) fn remember_direct(&self, stream: &str, allowed: Option<bool>) {
        let mut known = self.inner.direct.lock().unwrap_or_else(|p| p.into_inner());
        match allowed {
            Some(allowed) => known.insert(stream.to_owned(), allowed),
            None => known.remove(stream),
        };
    }

    fn conditions(&self) -> &conditions::Conditions {
        &self.inner.conditions
    }

    pub(crate) fn absence_confirm_delay(&self) -> Duration {
        self.inner.absence_confirm_delay
    }

    /// Record that the broker answered "no such message" at `sequence` of
    /// `stream`; how long ago it first did (zero the first time).
    pub(crate) fn note_miss(&self, stream: &str, sequence: u64) -> Duration {
        let mut misses = self.inner.misses.lock().unwrap_or_else(|p| p.into_inner());
        let key = (stream.to_owned(), sequence);
        if !misses.contains_key(&key) && misses.len() >= MISSES_MAX {
            misses.clear();
        }
        misses.entry(key).or_insert_with(Instant::now).elapsed()
    }

    /// The body at `sequence` of `stream` was found: its clock is over.
    pub(crate) fn forget_miss(&self, stream: &str, sequence: u64) {
        let mut misses = self.inner.misses.lock().unwrap_or_else(|p| p.into_inner());
        if !misses.is_empty() {
            misses.remove(&(stream.to_owned(), sequence));
        }
    }

    /// Whether the server reported a publish to `subject` denied since `since`.
    pub(crate) fn publish_denied_since(&self, subject: &str, since: Instant) -> bool {
        self.inner
            .denied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(subject)
            .is_some_and(|at| *at >= since)
    }
}

type UserInfo = Option<(String, Option<String>)>;

/// `nats://a:4222,nats://b:4222` (a cluster's servers, any of which the
/// client may use) → each URL without its userinfo, and the userinfo, which
/// must be the same wherever it is given.
fn split_servers(raw: &str) -> BusResult<(Vec<String>, UserInfo)> {
    let mut servers = Vec::new();
    let mut user_info: UserInfo = None;
    for one in raw.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let (shown, info) = split_user_info(one);
        if let Some(info) = info {
            if user_info.as_ref().is_some_and(|known| *known != info) {
                return Err(BusError::invalid(
                    "the NATS URLs carry different users or passwords; one connection logs in \
                     once, so give the same credentials in each URL (or in only one).",
                ));
            }
            user_info = Some(info);
        }
        servers.push(shown);
    }
    if servers.is_empty() {
        return Err(BusError::invalid(
            "the NATS URL is empty; name a server (nats://host:4222), or several of a \
             cluster comma-separated.",
        ));
    }
    Ok((servers, user_info))
}

/// `nats://user:pass@host:port` → (`nats://host:port`, Some((user, Some(pass)))).
/// Anything `url` cannot parse is passed on untouched for async-nats to judge.
fn split_user_info(raw: &str) -> (String, Option<(String, Option<String>)>) {
    let Ok(mut parsed) = url::Url::parse(raw) else {
        return (raw.to_owned(), None);
    };
    if parsed.username().is_empty() {
        return (raw.to_owned(), None);
    }
    let decode = |s: &str| {
        url::form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    let user = decode(parsed.username());
    let password = parsed.password().map(decode);
    let _ = parsed.set_username("");
    let _ = parsed.set_password(None);
    (parsed.to_string(), Some((user, password)))
}

/// One round trip to JetStream's account info (`$JS.API.INFO`), read as
/// plain JSON: async-nats's typed `Account` does not parse NATS 2.9's answer.
async fn account_info(client: &async_nats::Client, wait: Duration) -> Result<(), String> {
    let ask = client.request("$JS.API.INFO", "".into());
    let reply = match tokio::time::timeout(wait, ask).await {
        Err(_) => return Err("no answer within the timeout".into()),
        Ok(Err(e)) => return Err(e.to_string()),
        Ok(Ok(reply)) => reply,
    };
    let body: serde_json::Value =
        serde_json::from_slice(&reply.payload).map_err(|e| format!("unreadable answer: {e}"))?;
    match body.get("error") {
        Some(error) => Err(error.to_string()),
        None => Ok(()),
    }
}

/// `Permissions Violation for Publish to "subject"` → `subject`.
fn denied_publish_subject(text: &str) -> Option<String> {
    let rest = text
        .trim()
        .strip_prefix("Permissions Violation for Publish to ")?;
    Some(rest.trim().trim_matches('"').to_owned())
}

/// The team's token in every name: the UUID as 32 lowercase hex.
fn token(id: Uuid) -> String {
    id.simple().to_string()
}

/// `ACS_T_<team>`: the team's body stream.
pub fn body_stream_name(team_id: Uuid) -> String {
    format!("ACS_T_{}", token(team_id))
}

/// `acs.<team>.conv.<conversation>`: where one conversation's bodies go.
pub fn body_subject(team_id: Uuid, conversation_id: Uuid) -> String {
    format!("acs.{}.conv.{}", token(team_id), token(conversation_id))
}

/// `ACS_I_<team>`: the team's inbox stream.
pub fn inbox_stream_name(team_id: Uuid) -> String {
    format!("ACS_I_{}", token(team_id))
}

/// `acsi.<team>.inbox.<recipient_key>`: one window's references.
pub fn inbox_subject(team_id: Uuid, recipient_key: &str) -> BusResult<String> {
    Ok(format!(
        "acsi.{}.inbox.{}",
        token(team_id),
        check_recipient_key(recipient_key)?
    ))
}

/// `IN_<recipient_key>`: the durable pull consumer of one window.
pub fn inbox_consumer_name(recipient_key: &str) -> BusResult<String> {
    Ok(format!("IN_{}", check_recipient_key(recipient_key)?))
}

/// A recipient key is 32 lowercase hex: it becomes a subject token and a
/// consumer name, so anything else (a `.`, a `*`, a `>`) is refused here.
fn check_recipient_key(key: &str) -> BusResult<&str> {
    if key.len() == 32 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(key)
    } else {
        Err(BusError::invalid(format!(
            "recipient key {} is not 32 lowercase hex characters; it is derived by the \
             bus from the agent and window, never typed by hand.",
            acs_wire::text::quote(key)
        )))
    }
}

/// `jetstream:<stream>:<sequence>`.
pub fn locator(stream: &str, sequence: u64) -> super::Locator {
    super::Locator(format!("jetstream:{stream}:{sequence}"))
}

/// The stream and sequence a locator names, or `None` when it is not one
/// this backend issues.
pub fn parse_locator(locator: &super::Locator) -> Option<(&str, u64)> {
    let rest = locator.0.strip_prefix("jetstream:")?;
    let (stream, seq) = rest.rsplit_once(':')?;
    let seq: u64 = seq.parse().ok()?;
    (!stream.is_empty() && seq > 0).then_some((stream, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_derived_from_ids() {
        let team = Uuid::parse_str("0190aaaa-bbbb-7ccc-8ddd-eeeeffff0000").unwrap();
        assert_eq!(
            body_stream_name(team),
            "ACS_T_0190aaaabbbb7ccc8dddeeeeffff0000"
        );
        assert_eq!(
            inbox_subject(team, &"ab".repeat(16)).unwrap(),
            format!(
                "acsi.0190aaaabbbb7ccc8dddeeeeffff0000.inbox.{}",
                "ab".repeat(16)
            )
        );
        assert!(inbox_subject(team, "a.b").is_err());
        assert!(inbox_consumer_name(&"AB".repeat(16)).is_err());
    }

    #[test]
    fn locators_round_trip_and_strangers_are_refused() {
        let l = locator("ACS_T_x", 42);
        assert_eq!(l.0, "jetstream:ACS_T_x:42");
        assert_eq!(parse_locator(&l), Some(("ACS_T_x", 42)));
        for bad in [
            "jetstream:ACS_T_x",
            "jetstream::4",
            "jetstream:S:0",
            "x:S:1",
            "S:1",
        ] {
            assert_eq!(
                parse_locator(&super::super::Locator(bad.into())),
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn credentials_in_the_url_are_split_off_and_never_shown() {
        let (shown, creds) = split_user_info("nats://bus:s%40cret@127.0.0.1:4222");
        assert_eq!(shown, "nats://127.0.0.1:4222");
        assert_eq!(creds, Some(("bus".into(), Some("s@cret".into()))));
        let (shown, creds) = split_user_info("nats://127.0.0.1:4222");
        assert_eq!((shown.as_str(), creds), ("nats://127.0.0.1:4222", None));
    }

    #[test]
    fn several_servers_are_split_with_one_login() {
        let (servers, creds) =
            split_servers("nats://bus:pw@10.0.0.1:4222, nats://10.0.0.2:4222,").unwrap();
        assert_eq!(servers, ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]);
        assert_eq!(creds, Some(("bus".into(), Some("pw".into()))));
        assert!(split_servers("nats://a:b@h1:1,nats://c:d@h2:2").is_err());
        assert!(split_servers(" , ").is_err());
        let (servers, creds) = split_servers("nats://127.0.0.1:4222").unwrap();
        assert_eq!((servers.len(), creds), (1, None));
    }

    #[test]
    fn a_permission_violation_names_its_subject() {
        assert_eq!(
            denied_publish_subject("Permissions Violation for Publish to \"acs.t.conv.c\""),
            Some("acs.t.conv.c".into())
        );
        assert_eq!(denied_publish_subject("something else"), None);
    }
}
