//! The whole bus on a real `nats-server -js` (issue 6, "Done when"): real MCP
//! clients send into a conversation of a team routed to jetstream, the
//! publication workers drain the outbox to the team's body stream, and what
//! the recipient reads and what the stream holds are checked, with the broker
//! stopped, restarted, or behind a proxy that loses its answers. Invariant
//! numbers (O*, B*) are those listed in ARCHITECTURE.md.
//!
//! Every wait is a poll with a deadline; no test asserts a timing.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ai_crew_sync::backend::Locator;
use ai_crew_sync::backend::jetstream::{
    Broker, StreamSizes, body_stream_name, body_subject, parse_locator,
};
use ai_crew_sync::store::{lost_bodies, outbox, teams};
use ai_crew_sync::workers::publication;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::nats::{OwnedNats, nats_url};
use crate::support::proxy::Proxy;
use crate::support::{
    BROKER_ABSENCE_CONFIRM_DELAY, McpClient, TestApp, drain_settings, globally,
    spawn_app_with_broker, test_actor,
};

/// How long any wait may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);

/// Poll `probe` until it returns `Some`, failing after [`DEADLINE`].
async fn eventually<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_reachable(broker: &Broker) {
    eventually("the broker answers again", async || {
        broker.reachable().await.then_some(())
    })
    .await;
}

fn socket(url: &str) -> SocketAddr {
    url.trim_start_matches("nats://")
        .parse()
        .expect("host:port")
}

/// The team's body stream, on a connection of its own straight to the
/// server (never through the app's broker or a proxy in front of it).
pub(crate) async fn body_stream(
    nats_url: &str,
    team_id: Uuid,
) -> async_nats::jetstream::stream::Stream {
    let js = async_nats::jetstream::new(
        async_nats::connect(nats_url)
            .await
            .expect("an inspecting connection"),
    );
    js.get_stream(body_stream_name(team_id))
        .await
        .expect("the team's body stream")
}

async fn stream_messages(nats_url: &str, team_id: Uuid) -> u64 {
    let mut stream = body_stream(nats_url, team_id).await;
    stream.info().await.unwrap().state.messages
}

/// The sequence a `jetstream:` locator of this team names.
pub(crate) fn sequence(team_id: Uuid, locator: &str) -> u64 {
    let parsed = Locator(locator.to_owned());
    let (stream, seq) = parse_locator(&parsed).unwrap_or_else(|| panic!("{locator}"));
    assert_eq!(stream, body_stream_name(team_id), "{locator}");
    seq
}

/// Each message is in the team's body stream exactly once: as many entries
/// as messages, one distinct sequence per locator, and the entry at each
/// sequence is that message (subject, headers, body).
async fn assert_once_in_stream(
    nats_url: &str,
    team_id: Uuid,
    conversation_id: Uuid,
    stored: &[(Uuid, String, String)],
) {
    let stream = body_stream(nats_url, team_id).await;
    assert_eq!(
        stream_messages(nats_url, team_id).await,
        stored.len() as u64,
        "one stream entry per message"
    );
    let mut seen = HashSet::new();
    for (message_id, body, locator) in stored {
        let seq = sequence(team_id, locator);
        assert!(seen.insert(seq), "sequence {seq} is two messages' locator");
        let entry = stream.get_raw_message(seq).await.expect("the entry");
        let header = |name: &str| {
            entry
                .headers
                .get(name)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        assert_eq!(header("Acs-Message-Id"), message_id.to_string());
        assert_eq!(header("Acs-Conversation-Id"), conversation_id.to_string());
        assert_eq!(header("Acs-Team-Id"), team_id.to_string());
        assert_eq!(
            entry.subject.as_str(),
            body_subject(team_id, conversation_id)
        );
        assert_eq!(std::str::from_utf8(&entry.payload).unwrap(), body);
    }
}

/// What PostgreSQL holds for a message.
#[derive(sqlx::FromRow, Debug)]
struct Row {
    publication_state: String,
    canonical_locator: Option<String>,
    /// The local copy ('' once the sweep released it).
    body: String,
    uncertain: bool,
    tombstone_reason: Option<String>,
}

/// A team routed to jetstream (streams provisioned, `conversation_backend`
/// jetstream) with alice (sender) and bob (recipient) in a conversation on
/// it; publication is therefore the outbox.
pub(crate) struct Routed<'a> {
    app: &'a TestApp,
    pub(crate) team_id: Uuid,
    pub(crate) alice: McpClient,
    pub(crate) bob: McpClient,
    pub(crate) conversation_id: Uuid,
}

impl<'a> Routed<'a> {
    pub(crate) async fn new(app: &'a TestApp, slug: &str) -> Routed<'a> {
        Self::with_sizes(app, slug, &StreamSizes::default()).await
    }

    /// As [`Routed::new`], the team's streams provisioned at `sizes`.
    pub(crate) async fn with_sizes(
        app: &'a TestApp,
        slug: &str,
        sizes: &StreamSizes,
    ) -> Routed<'a> {
        let team_id = app.jetstream_team_with(slug, sizes).await;
        let alice = app.mcp(&app.agent(slug, "alice").await, None).await;
        let bob = app.mcp(&app.agent(slug, "bob").await, None).await;
        let mut routed = Routed {
            app,
            team_id,
            alice,
            bob,
            conversation_id: Uuid::nil(),
        };
        routed.conversation_id = routed.conversation("Bodies on the broker").await;
        routed
    }

    /// Another conversation of alice and bob; on jetstream, outbox publication.
    async fn conversation(&self, title: &str) -> Uuid {
        let created = self
            .alice
            .call(
                "create_conversation",
                json!({"title": title, "private": true, "invite": ["bob"]}),
            )
            .await
            .unwrap();
        let id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
        self.bob
            .call("join_conversation", json!({"conversation_id": id}))
            .await
            .unwrap();
        let (backend, publication): (String, String) =
            sqlx::query_as("SELECT backend, publication FROM conversations WHERE id = $1")
                .bind(id)
                .fetch_one(&self.app.pool)
                .await
                .unwrap();
        assert_eq!(
            (backend.as_str(), publication.as_str()),
            ("jetstream", "outbox")
        );
        id
    }

    /// Alice sends `body` into `conversation_id`: accepted, never an error,
    /// and pending until the broker confirms (O3).
    async fn send_in(&self, conversation_id: Uuid, body: &str) -> Uuid {
        let sent = self
            .alice
            .call(
                "send_conversation_message",
                json!({"conversation_id": conversation_id, "body": body,
                       "request_id": Uuid::new_v4()}),
            )
            .await
            .unwrap_or_else(|e| panic!("a send is accepted, whatever the broker does: {e}"));
        assert_eq!(sent["stored"], false, "{sent}");
        assert_eq!(sent["publication"], "pending_publication", "{sent}");
        sent["message_id"].as_str().unwrap().parse().unwrap()
    }

    pub(crate) async fn send(&self, body: &str) -> Uuid {
        self.send_in(self.conversation_id, body).await
    }

    async fn read_as_bob_in(&self, conversation_id: Uuid) -> Value {
        self.bob
            .call(
                "read_conversation",
                json!({"conversation_id": conversation_id}),
            )
            .await
            .expect("a page never fails because one body is missing")
    }

    pub(crate) async fn read_as_bob(&self) -> Value {
        self.read_as_bob_in(self.conversation_id).await
    }

    async fn row(&self, message_id: Uuid) -> Row {
        sqlx::query_as(
            "SELECT publication_state, canonical_locator, body,
                    uncertain_at IS NOT NULL AS uncertain, tombstone_reason
               FROM conversation_messages WHERE id = $1",
        )
        .bind(message_id)
        .fetch_one(&self.app.pool)
        .await
        .unwrap()
    }

    /// Wait until every message is stored; their locators, in order.
    pub(crate) async fn wait_stored(&self, ids: &[Uuid]) -> Vec<String> {
        eventually("every message stored", async || {
            let mut locators = Vec::new();
            for id in ids {
                let row = self.row(*id).await;
                assert_ne!(row.publication_state, "failed", "{id}: {row:?}");
                if row.publication_state != "stored" {
                    return None;
                }
                locators.push(
                    row.canonical_locator
                        .expect("a stored message has a locator"),
                );
            }
            Some(locators)
        })
        .await
    }

    /// Make every pending slot due now: the backoff is not what these tests
    /// are about, and it would outlast their deadlines.
    pub(crate) async fn make_due(&self) {
        sqlx::query(
            "UPDATE conversation_outbox SET next_attempt_at = now() WHERE state = 'pending'",
        )
        .execute(&self.app.pool)
        .await
        .unwrap();
    }

    pub(crate) async fn release(&self) -> u64 {
        outbox::release_published_bodies(&self.app.pool, &self.app.bus.backends, None, 0)
            .await
            .expect("a sweep pass")
    }
}

/// The message with `id` in a read page.
fn in_page(page: &Value, id: Uuid) -> &Value {
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["message_id"] == id.to_string())
        .unwrap_or_else(|| panic!("{id} is in the page: {page}"))
}

// ------------------------------------------------------------------ tests --

// O2, O3, O6, O7, B1: a send on a jetstream team is accepted pending (and the
// reader's cursor stops before it), then the drain stores it under a
// `jetstream:` locator; the recipient reads it through the bus, and the body
// stream holds it once, under the outbox's publish key.
#[tokio::test]
async fn a_send_is_pending_then_stored_once_in_the_stream_and_read_through_the_bus() {
    let url = nats_url();
    let app = spawn_app_with_broker(&url).await;
    let t = Routed::new(&app, "jsb1").await;
    let body = "hello through the broker";
    let id = t.send(body).await;

    let page = t.read_as_bob().await;
    let pending = in_page(&page, id);
    assert_eq!(pending["publication"], "pending_publication");
    assert_eq!(pending["unavailable"]["reason"], "pending_publication");
    assert!(pending["body"].is_null());
    assert_eq!(page["next_after_seq"], 0, "the cursor stops before it");
    let publish_key: Uuid =
        sqlx::query_scalar("SELECT publish_key FROM conversation_outbox WHERE message_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .expect("one outbox slot (O2)");

    let workers = app.start_publication_workers();
    let locator = t.wait_stored(&[id]).await.remove(0);
    assert!(
        locator.starts_with(&format!("jetstream:{}:", body_stream_name(t.team_id))),
        "{locator}"
    );
    let page = t.read_as_bob().await;
    let stored = in_page(&page, id);
    assert_eq!(stored["publication"], "stored");
    assert_eq!(stored["body"], body);
    assert!(stored["unavailable"].is_null());
    assert!(
        stored["my_receipt"]["stored_at"].is_string(),
        "O7: {stored}"
    );
    assert_eq!(page["next_after_seq"], 1);
    let one = t
        .bob
        .call("get_conversation_message", json!({"message_id": id}))
        .await
        .unwrap();
    assert_eq!(one["body"], body);

    assert_once_in_stream(
        &url,
        t.team_id,
        t.conversation_id,
        &[(id, body.to_owned(), locator.clone())],
    )
    .await;
    let entry = body_stream(&url, t.team_id)
        .await
        .get_raw_message(sequence(t.team_id, &locator))
        .await
        .unwrap();
    assert_eq!(
        entry.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some(publish_key.to_string().as_str()),
        "the broker deduplicates on the outbox's publish key"
    );
    assert_eq!(
        outbox::status(&app.pool, t.team_id).await.unwrap(),
        outbox::Status::default(),
        "nothing left in flight"
    );
    workers.stop().await;
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O8, O14, issue 15 item 2: a full stream is a condition the operator fixes,
// not the message's fault. The overflow waits pending without spending its
// attempts however many passes run (never `failed`); /health?broker=check
// and `conversations status` name the team, the stream, why, and the
// `team stream --update-quotas` that fixes it; once the operator raises the
// quota with that command the drain stores every message, each once, and
// the condition clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_stream_keeps_the_overflow_pending_until_its_quota_is_raised() {
    let url = nats_url();
    let app = spawn_app_with_broker(&url).await;
    let t = Routed::new(&app, "jsbfull").await;
    let quota = StreamSizes {
        max_messages: 5,
        ..StreamSizes::default()
    };
    teams::provision_streams(
        &app.pool,
        "jsbfull",
        app.broker(),
        &quota,
        true,
        &test_actor(),
    )
    .await
    .expect("lower the body stream's quota to 5 messages");
    let mut sent = Vec::new();
    for i in 1..=8 {
        let body = format!("message {i}");
        sent.push((t.send(&body).await, body));
    }
    let ids: Vec<Uuid> = sent.iter().map(|(id, _)| *id).collect();

    // More passes than a message has attempts (8): none is spent.
    for pass_no in 1..=10 {
        let pass = publication::drain_once(&app.bus, "drain-test", &drain_settings())
            .await
            .unwrap();
        let expected_stored = if pass_no == 1 { 5 } else { 0 };
        assert_eq!(
            (pass.stored, pass.waiting, pass.retrying, pass.failed),
            (expected_stored, 3, 0, 0),
            "pass {pass_no}: {pass:?}"
        );
        let overflow: Vec<(String, i32, Option<String>, f64)> = sqlx::query_as(
            "SELECT state, attempts, last_error,
                    extract(epoch FROM next_attempt_at - now())::float8
               FROM conversation_outbox WHERE team_id = $1",
        )
        .bind(t.team_id)
        .fetch_all(&app.pool)
        .await
        .unwrap();
        assert_eq!(overflow.len(), 3, "three slots left: {overflow:?}");
        for (state, attempts, last_error, due_in) in &overflow {
            assert_eq!(state, "pending", "waiting, never failed: {overflow:?}");
            assert_eq!(*attempts, 0, "no attempt is spent on a full stream");
            let why = last_error.as_deref().unwrap_or_default();
            assert!(
                why.contains("full") && why.contains("--update-quotas"),
                "{why}"
            );
            assert!(
                (outbox::WAIT_RECHECK_SECS - 1.0..=outbox::WAIT_RECHECK_SECS + 0.5)
                    .contains(due_in),
                "re-checked in {} s, due in {due_in}",
                outbox::WAIT_RECHECK_SECS
            );
        }
        t.make_due().await;
    }
    let states: Vec<String> = sqlx::query_scalar(
        "SELECT publication_state FROM conversation_messages
          WHERE conversation_id = $1 ORDER BY publication_state",
    )
    .bind(t.conversation_id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        [vec!["pending_publication"; 3], vec!["stored"; 5]].concat()
    );
    let status = outbox::status(&app.pool, t.team_id).await.unwrap();
    assert_eq!((status.pending, status.failed), (3, 0));

    // What the operator sees: health and status name team, stream, why, fix.
    let stream = body_stream_name(t.team_id);
    let health = health_check(&app).await;
    assert_eq!(health["status"], "degraded", "{health}");
    let condition = only_condition(&health, &stream);
    assert_eq!(condition["team"], "jsbfull", "{health}");
    assert_eq!(condition["condition"], "stream_full", "{health}");
    assert!(
        condition["fix"]
            .as_str()
            .unwrap()
            .contains("team stream --team jsbfull")
            && condition["fix"]
                .as_str()
                .unwrap()
                .contains("--update-quotas"),
        "{health}"
    );
    let status = cli_json(
        &app,
        &[
            "conversations",
            "status",
            "--team",
            "jsbfull",
            "--nats-url",
            &url,
            "--json",
        ],
    );
    assert_eq!(status["outbox"]["pending"], 3, "{status}");
    assert_eq!(status["outbox"]["failed"], 0, "{status}");
    let said = status["broker_conditions"].as_array().unwrap();
    assert!(
        said.iter()
            .any(|c| c["stream"] == stream.as_str() && c["condition"] == "stream_full"),
        "{status}"
    );
    let text = cli_ok(
        &app,
        &[
            "conversations",
            "status",
            "--team",
            "jsbfull",
            "--nats-url",
            &url,
        ],
    );
    assert!(
        text.contains(&stream)
            && text.contains("stream_full")
            && text.contains("fix: ai-crew-sync team stream --team jsbfull"),
        "{text}"
    );

    // The fix, as the operator runs it.
    cli_ok(
        &app,
        &[
            "team",
            "stream",
            "--team",
            "jsbfull",
            "--nats-url",
            &url,
            "--update-quotas",
            "--max-messages",
            "1000",
        ],
    );
    t.make_due().await;
    let pass = publication::drain_once(&app.bus, "drain-test", &drain_settings())
        .await
        .unwrap();
    assert_eq!(
        (pass.stored, pass.failed, pass.waiting),
        (3, 0, 0),
        "{pass:?}"
    );
    let locators = t.wait_stored(&ids).await;
    let stored: Vec<(Uuid, String, String)> = sent
        .into_iter()
        .zip(locators)
        .map(|((id, body), locator)| (id, body, locator))
        .collect();
    assert_once_in_stream(&url, t.team_id, t.conversation_id, &stored).await;
    let page = t.read_as_bob().await;
    for (id, body, _) in &stored {
        assert_eq!(in_page(&page, *id)["body"], body.as_str(), "{page}");
    }
    let health = health_check(&app).await;
    assert_eq!(health["status"], "ok", "the condition cleared: {health}");
    assert_eq!(health["broker_conditions"], json!([]), "{health}");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

/// `GET /health?broker=check`, as an operator asks it: with a global admin
/// credential, so conditions name their team, stream and fix.
async fn health_check(app: &TestApp) -> Value {
    let admin = ai_crew_sync::store::admin::grant(&app.pool, &globally(), None, None)
        .await
        .expect("a global admin credential")
        .credential;
    crate::support::http_client()
        .get(app.url("/health?broker=check"))
        .bearer_auth(admin)
        .send()
        .await
        .expect("/health answers")
        .json()
        .await
        .expect("/health is JSON")
}

/// `/health` with `bearer` (none: anonymous), checking the broker.
async fn health_as(app: &TestApp, bearer: Option<&str>) -> Value {
    let mut request = crate::support::http_client().get(app.url("/health?broker=check"));
    if let Some(bearer) = bearer {
        request = request.bearer_auth(bearer);
    }
    let response = request.send().await.expect("/health answers");
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.expect("/health is JSON")
}

// A condition makes `/health` look up the admin credential a probe carries
// (to name the team). A made-up credential costs a database query, so it
// spends the address's allowance of failed authentications as on `/admin`:
// once spent, that address's probes are answered as anonymous without a
// lookup, a valid credential's too, until it refills.
#[tokio::test]
async fn health_looks_up_made_up_admin_credentials_only_within_the_address_allowance() {
    let app = spawn_app_with_broker(&nats_url()).await;
    let team_id = app.jetstream_team("jsbprobe").await;
    app.broker()
        .js()
        .delete_stream(body_stream_name(team_id))
        .await
        .unwrap();
    let admin = ai_crew_sync::store::admin::grant(&app.pool, &globally(), None, None)
        .await
        .expect("a global admin credential")
        .credential;
    let named = eventually("the missing stream named to the admin", async || {
        let health = health_as(&app, Some(&admin)).await;
        (health["broker_conditions"][0]["team"] == "jsbprobe").then_some(health)
    })
    .await;
    assert_eq!(named["status"], "degraded", "{named}");

    let made_up = format!("acsa_{}", "0".repeat(64));
    // The allowance refills while the probes are answered: a few more than
    // it holds spend it.
    let allowance = ai_crew_sync::config::HttpSettings::default().unauthenticated_per_minute;
    let mut sent = 0;
    let spent = loop {
        let anonymous = health_as(&app, Some(&made_up)).await;
        assert_eq!(
            anonymous["broker_conditions"][0]["condition"],
            "stream_missing"
        );
        assert!(!anonymous.to_string().contains("jsbprobe"), "{anonymous}");
        sent += 1;
        if sent >= allowance {
            let seen = health_as(&app, Some(&admin)).await;
            if !seen.to_string().contains("jsbprobe") {
                break seen;
            }
        }
        assert!(
            sent < 3 * allowance,
            "{sent} made-up credentials, and a lookup is still made for each"
        );
    };
    assert_eq!(spent["status"], "degraded", "{spent}");
    assert_eq!(spent["broker_conditions"][0]["condition"], "stream_missing");
}

/// The one condition `health` names for `stream`.
fn only_condition<'v>(health: &'v Value, stream: &str) -> &'v Value {
    let found: Vec<&Value> = health["broker_conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("broker_conditions in {health}"))
        .iter()
        .filter(|c| c["stream"] == stream)
        .collect();
    assert_eq!(found.len(), 1, "one condition for {stream}: {health}");
    found[0]
}

/// The operator CLI (the real binary) against the app's database.
fn cli(app: &TestApp, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(args)
        .env("DATABASE_URL", &app.database_url)
        .env_remove("BUS_NATS_URL")
        .output()
        .expect("run ai-crew-sync")
}

/// A CLI command that must succeed; what it printed.
fn cli_ok(app: &TestApp, args: &[&str]) -> String {
    let out = cli(app, args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn cli_json(app: &TestApp, args: &[&str]) -> Value {
    let text = cli_ok(app, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {text}"))
}

/// A CLI command that must be refused; what it said on stderr.
fn cli_refused(app: &TestApp, args: &[&str]) -> String {
    let out = cli(app, args);
    assert!(
        !out.status.success(),
        "{args:?} was not refused: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

// O8, O14, issue 15 items 2 and 3: the broker's store is wiped and it
// restarts empty. Messages sent meanwhile wait pending, attempts unspent,
// however many passes run; /health and `conversations status` name both
// missing streams with the `team stream` command; `create_conversation` is
// refused naming it; `team stream` re-creates the streams and says how many
// messages name a stream that no longer holds them; then the waiting
// messages are stored and nothing PostgreSQL held is lost to a reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_broker_store_keeps_messages_pending_until_team_stream_recreates_the_streams() {
    let mut server = OwnedNats::start();
    let url = server.url();
    let app = spawn_app_with_broker(&url).await;
    let t = Routed::new(&app, "jsbwipe").await;
    let mut sent = Vec::new();
    for i in 1..=2 {
        let body = format!("before the wipe {i}");
        sent.push((t.send(&body).await, body));
    }
    drain_all(&app).await;
    t.wait_stored(&[sent[0].0, sent[1].0]).await;

    server.wipe_store();
    wait_reachable(app.broker()).await;
    let mut waiting = Vec::new();
    for i in 1..=3 {
        let body = format!("during the outage {i}");
        waiting.push((t.send(&body).await, body));
    }
    for pass_no in 1..=10 {
        let pass = publication::drain_once(&app.bus, "drain-test", &drain_settings())
            .await
            .unwrap();
        assert_eq!(
            (pass.stored, pass.waiting, pass.failed),
            (0, 3, 0),
            "pass {pass_no}: {pass:?}"
        );
        t.make_due().await;
    }
    let attempts: Vec<(String, i32)> =
        sqlx::query_as("SELECT state, attempts FROM conversation_outbox WHERE team_id = $1")
            .bind(t.team_id)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        vec![("pending".to_owned(), 0); 3],
        "no attempt spent"
    );
    for (id, _) in &waiting {
        assert_eq!(t.row(*id).await.publication_state, "pending_publication");
    }

    let body_stream = body_stream_name(t.team_id);
    let inbox_stream = ai_crew_sync::backend::jetstream::inbox_stream_name(t.team_id);
    // A stream check is reused for a moment (CHECK_CACHE); both streams
    // are named once it runs again.
    let health = eventually("health names both missing streams", async || {
        let health = health_check(&app).await;
        (health["broker_conditions"].as_array()?.len() == 2).then_some(health)
    })
    .await;
    assert_eq!(health["status"], "degraded", "{health}");
    // Without a credential the probe says what and where to look, never which team.
    let anonymous: Value = crate::support::http_client()
        .get(app.url("/health?broker=check"))
        .send()
        .await
        .expect("/health answers")
        .json()
        .await
        .expect("/health is JSON");
    assert_eq!(anonymous["status"], "degraded", "{anonymous}");
    assert_eq!(
        anonymous["broker_conditions"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(
        anonymous["broker_conditions"][0]["condition"],
        "stream_missing"
    );
    assert!(!anonymous.to_string().contains("jsbwipe"), "{anonymous}");
    assert!(!anonymous.to_string().contains(&body_stream), "{anonymous}");
    for stream in [&body_stream, &inbox_stream] {
        let condition = only_condition(&health, stream);
        assert_eq!(condition["team"], "jsbwipe", "{health}");
        assert_eq!(condition["condition"], "stream_missing", "{health}");
        assert_eq!(
            condition["fix"],
            format!("ai-crew-sync team stream --team jsbwipe --nats-url {url}"),
            "{health}"
        );
    }
    let status = cli_json(
        &app,
        &[
            "conversations",
            "status",
            "--team",
            "jsbwipe",
            "--nats-url",
            &url,
            "--json",
        ],
    );
    assert_eq!(
        (
            status["outbox"]["pending"].as_i64(),
            status["outbox"]["failed"].as_i64()
        ),
        (Some(3), Some(0)),
        "{status}"
    );
    let said = status["broker_conditions"].as_array().unwrap();
    assert_eq!(said.len(), 2, "{status}");
    assert!(
        said.iter().all(|c| c["condition"] == "stream_missing"),
        "{status}"
    );

    let refused = t
        .alice
        .call(
            "create_conversation",
            json!({"title": "not now", "private": true, "invite": ["bob"]}),
        )
        .await
        .expect_err("no new conversation on missing streams");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains(&body_stream)
            && message.contains(&format!(
                "ai-crew-sync team stream --team jsbwipe --nats-url {url}"
            )),
        "{refused}"
    );
    let conversations: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversations WHERE team_id = $1")
            .bind(t.team_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(conversations, 1, "nothing was created");

    // The fix, as the health answer names it.
    let streams = cli_json(
        &app,
        &[
            "team",
            "stream",
            "--team",
            "jsbwipe",
            "--nats-url",
            &url,
            "--json",
        ],
    );
    assert_eq!(streams["body"]["state"], "created", "{streams}");
    assert_eq!(
        streams["stale_locators"]["messages"], 2,
        "the two stored before the wipe: {streams}"
    );
    t.make_due().await;
    drain_all(&app).await;
    let ids: Vec<Uuid> = waiting.iter().map(|(id, _)| *id).collect();
    t.wait_stored(&ids).await;
    let page = t.read_as_bob().await;
    for (id, body) in sent.iter().chain(&waiting) {
        assert_eq!(
            in_page(&page, *id)["body"],
            body.as_str(),
            "nothing lost: {page}"
        );
    }
    eventually("health is ok again", async || {
        let health = health_check(&app).await;
        (health["status"] == "ok" && health["broker_conditions"] == json!([])).then_some(())
    })
    .await;
    t.conversation("after the fix").await;
}

// O9, issue 15 item 3: a message failed for good (a body its stream refused
// as too large: fatal) is recovered with one command once the cause is
// fixed. `conversations retry` is a dry run by default, refuses while the
// team's stream is missing (naming it and `team stream`) and changes
// nothing; after `team stream`, `--apply` puts it back to pending with fresh
// attempts (audited), and the drain stores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_retry_recovers_failed_messages_once_the_cause_is_fixed() {
    let mut server = OwnedNats::start();
    let url = server.url();
    let app = spawn_app_with_broker(&url).await;
    let t = Routed::new(&app, "jsbretry").await;
    // An operator's stream that takes only small bodies.
    let body_stream = body_stream_name(t.team_id);
    let mut config = app
        .broker()
        .js()
        .get_stream(&body_stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    config.max_message_size = 64;
    app.broker().js().update_stream(config).await.unwrap();
    let body = "a body longer than sixty-four bytes, which this stream refuses for good";
    let id = t.send(body).await;
    drain_all(&app).await;
    eventually("the message fails", async || {
        (t.row(id).await.publication_state == "failed").then_some(())
    })
    .await;

    // The cause goes on: the broker's store is wiped.
    server.wipe_store();
    wait_reachable(app.broker()).await;
    let refused = cli_refused(
        &app,
        &[
            "conversations",
            "retry",
            "--team",
            "jsbretry",
            "--nats-url",
            &url,
            "--apply",
        ],
    );
    assert!(
        refused.contains(&body_stream)
            && refused.contains("stream_missing")
            && refused.contains("team stream --team jsbretry"),
        "{refused}"
    );
    assert_eq!(
        t.row(id).await.publication_state,
        "failed",
        "nothing changed"
    );

    cli_ok(
        &app,
        &["team", "stream", "--team", "jsbretry", "--nats-url", &url],
    );
    let dry = cli_json(
        &app,
        &[
            "conversations",
            "retry",
            "--team",
            "jsbretry",
            "--nats-url",
            &url,
            "--json",
        ],
    );
    assert_eq!(dry["applied"], false, "{dry}");
    assert_eq!(dry["retried"][0]["message_id"], id.to_string(), "{dry}");
    assert_eq!(
        t.row(id).await.publication_state,
        "failed",
        "a dry run writes nothing"
    );

    let applied = cli_json(
        &app,
        &[
            "conversations",
            "retry",
            "--team",
            "jsbretry",
            "--nats-url",
            &url,
            "--apply",
            "--json",
        ],
    );
    assert_eq!(applied["applied"], true, "{applied}");
    let slot: (String, i32) =
        sqlx::query_as("SELECT state, attempts FROM conversation_outbox WHERE message_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(slot, ("pending".to_owned(), 0), "fresh attempts");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'conversation.retry' AND team_id = $1",
    )
    .bind(t.team_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(audited, 1);
    drain_all(&app).await;
    t.wait_stored(&[id]).await;
    let page = t.read_as_bob().await;
    assert_eq!(in_page(&page, id)["body"], body, "{page}");
}

// O3, O8, O16, B1: nats-server stopped mid-traffic. Every send is accepted
// and pending (never an error to the sender), reads still answer, and after
// the restart every message is stored exactly once: one stream entry per
// message, each locator a distinct sequence holding that message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_stopped_mid_traffic_leaves_sends_pending_and_stores_each_once_after_restart() {
    let mut server = OwnedNats::start();
    let app = spawn_app_with_broker(&server.url()).await;
    let t = Routed::new(&app, "jsb2").await;
    let workers = app.start_publication_workers();
    let mut sent: Vec<(Uuid, String)> = Vec::new();

    for i in 0..10 {
        let body = format!("before the stop {i}");
        sent.push((t.send(&body).await, body));
    }
    // Some of those are still in flight when the broker goes.
    tokio::task::block_in_place(|| server.stop());
    for i in 0..10 {
        let body = format!("while the broker is down {i}");
        sent.push((t.send(&body).await, body));
    }
    // The drain tried while the broker was down and was told nothing: the
    // slots wait (pending, with the reason), none failed.
    eventually("an attempt fails against the stopped broker", async || {
        let tried: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_outbox
              WHERE state = 'pending' AND last_error IS NOT NULL",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        (tried > 0).then_some(())
    })
    .await;
    let page = t.read_as_bob().await;
    assert_eq!(page["messages"].as_array().unwrap().len(), sent.len());
    let down = sent.last().unwrap().0;
    assert_eq!(in_page(&page, down)["publication"], "pending_publication");
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_outbox WHERE state = 'failed'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(failed, 0, "a stopped broker fails nothing");

    tokio::task::block_in_place(|| server.restart());
    wait_reachable(app.broker()).await;
    for i in 0..5 {
        let body = format!("after the restart {i}");
        sent.push((t.send(&body).await, body));
    }
    t.make_due().await;
    let ids: Vec<Uuid> = sent.iter().map(|(id, _)| *id).collect();
    let locators = t.wait_stored(&ids).await;
    workers.stop().await;

    let stored: Vec<(Uuid, String, String)> = sent
        .into_iter()
        .zip(locators)
        .map(|((id, body), locator)| (id, body, locator))
        .collect();
    assert_once_in_stream(&server.url(), t.team_id, t.conversation_id, &stored).await;
    let page = t.read_as_bob().await;
    for (id, body, _) in &stored {
        assert_eq!(&in_page(&page, *id)["body"], body);
    }
    assert_eq!(page["next_after_seq"], stored.len());
}

// O11, O16, O17, B1: the broker stores the body and its PubAck is lost (the
// replies black-holed, then the connection cut). The drain marks the
// attempt uncertain (not failed, not retried blindly); the reconciler
// re-presents the same envelope under the same Nats-Msg-Id and settles the
// message with the ORIGINAL sequence. One stream entry.
#[tokio::test]
async fn a_lost_puback_ends_stored_with_the_original_sequence_through_drain_and_reconciler() {
    let url = nats_url();
    let proxy = Proxy::start(socket(&url)).await;
    let app = spawn_app_with_broker(&proxy.url()).await;
    let t = Routed::new(&app, "jsb3").await;
    let body = "the answer to this one is lost";
    let id = t.send(body).await;

    proxy.black_hole_replies();
    let pass = publication::drain_once(&app.bus, "drain", &drain_settings())
        .await
        .unwrap();
    assert_eq!(
        (pass.leased, pass.stored, pass.retrying, pass.failed),
        (1, 0, 1, 0),
        "no answer is neither stored nor failed"
    );
    let row = t.row(id).await;
    assert_eq!(row.publication_state, "pending_publication");
    assert!(row.uncertain, "O16: marked uncertain");
    assert!(row.canonical_locator.is_none());
    let page = t.read_as_bob().await;
    let pending = in_page(&page, id);
    assert_eq!(pending["unavailable"]["reason"], "pending_publication");
    assert!(
        pending["unavailable"]["detail"]
            .as_str()
            .unwrap()
            .contains("without an answer"),
        "{pending}"
    );
    // The broker did store it.
    eventually("the broker holds the body", async || {
        (stream_messages(&url, t.team_id).await == 1).then_some(())
    })
    .await;
    let original = {
        let mut stream = body_stream(&url, t.team_id).await;
        stream.info().await.unwrap().state.last_sequence
    };

    // The connection is cut and comes back; the reconciler asks.
    proxy.pass();
    proxy.cut();
    wait_reachable(app.broker()).await;
    assert_eq!(publication::reconcile_once(&app.bus).await.unwrap(), 1);
    let row = t.row(id).await;
    assert_eq!(row.publication_state, "stored");
    assert!(!row.uncertain, "stored is no longer uncertain");
    let locator = row.canonical_locator.unwrap();
    assert_eq!(
        sequence(t.team_id, &locator),
        original,
        "the original sequence"
    );
    assert_once_in_stream(
        &url,
        t.team_id,
        t.conversation_id,
        &[(id, body.to_owned(), locator)],
    )
    .await;
    // Nothing left for the drain to publish again.
    let pass = publication::drain_once(&app.bus, "drain", &drain_settings())
        .await
        .unwrap();
    assert_eq!(pass.leased, 0);
    assert_eq!(in_page(&t.read_as_bob().await, id)["body"], body);
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// B1 (fetch verifies the locator names this message and this team's
// stream): a locator copied onto another message, from another conversation
// of the team or from another team, reads nothing of the body it points at.
#[tokio::test]
async fn a_locator_copied_from_another_conversation_or_team_reads_nothing() {
    let url = nats_url();
    let app = spawn_app_with_broker(&url).await;
    let ours = Routed::new(&app, "jsb4a").await;
    let theirs = Routed::new(&app, "jsb4b").await;
    let elsewhere = ours.conversation("Another thread").await;
    let secret = "the body of conversation one";
    let their_secret = "the body of another team";
    let a = ours.send(secret).await;
    let b = ours.send_in(elsewhere, "b's own body").await;
    let x = theirs.send(their_secret).await;
    let workers = app.start_publication_workers();
    let a_locator = ours.wait_stored(&[a, b]).await.remove(0);
    let x_locator = theirs.wait_stored(&[x]).await.remove(0);
    workers.stop().await;

    for (copied, whose) in [(&a_locator, secret), (&x_locator, their_secret)] {
        // B's locator replaced by the copy, its local body released as the
        // sweep would: the only way to B's body is now the copied locator.
        sqlx::query(
            "UPDATE conversation_messages SET canonical_locator = $2, body = '' WHERE id = $1",
        )
        .bind(b)
        .bind(copied)
        .execute(&app.pool)
        .await
        .unwrap();
        let page = ours.read_as_bob_in(elsewhere).await;
        let shown = in_page(&page, b);
        assert!(shown["body"].is_null(), "{copied} read as B: {shown}");
        assert!(shown["unavailable"]["reason"].is_string(), "{shown}");
        assert!(!page.to_string().contains(whose), "{page}");
        let one = ours
            .bob
            .call("get_conversation_message", json!({"message_id": b}))
            .await
            .unwrap();
        assert!(one["body"].is_null(), "{one}");
        assert!(!one.to_string().contains(whose), "{one}");
        let one = ours
            .alice
            .call("get_conversation_message", json!({"message_id": b}))
            .await
            .unwrap();
        assert!(!one.to_string().contains(whose), "nor to its sender: {one}");
    }
    // The messages the locators belong to still read as themselves.
    assert_eq!(in_page(&ours.read_as_bob().await, a)["body"], secret);
    assert_eq!(
        in_page(&theirs.read_as_bob().await, x)["body"],
        their_secret
    );
    for team in [ours.team_id, theirs.team_id] {
        app.broker().remove_team_streams(team).await.unwrap();
    }
}

// O18: the body sweep releases a local copy only when the broker answers now
// with a body whose digest matches: nothing while the broker is stopped;
// not one whose stream entry was deleted, nor one whose digest does not
// match, nor one a migration holds (until that migration is over); the one
// it releases is still read, fetched from the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_releases_only_bodies_the_broker_confirms_and_none_a_migration_holds() {
    let mut server = OwnedNats::start();
    let app = spawn_app_with_broker(&server.url()).await;
    let t = Routed::new(&app, "jsb5").await;
    let deleted = t.send("its stream entry will be deleted").await;
    let mismatch = t.send("its digest will not match").await;
    let migrating = t.send("a migration holds this one").await;
    let released = t.send("released, then read from the broker").await;
    let ids = [deleted, mismatch, migrating, released];
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&ids).await;
    workers.stop().await;

    // A stopped broker confirms nothing: nothing is released.
    tokio::task::block_in_place(|| server.stop());
    assert_eq!(t.release().await, 0);
    for id in ids {
        assert!(
            !t.row(id).await.body.is_empty(),
            "kept while the broker is down"
        );
    }
    tokio::task::block_in_place(|| server.restart());
    wait_reachable(app.broker()).await;

    assert!(
        body_stream(&server.url(), t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[0]))
            .await
            .unwrap()
    );
    sqlx::query("UPDATE conversation_messages SET body_sha256 = $2 WHERE id = $1")
        .bind(mismatch)
        .bind(&outbox::body_digest("another body")[..])
        .execute(&app.pool)
        .await
        .unwrap();
    let migration = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO conversation_migrations
             (id, team_id, conversation_id, direction, state, started_by)
         VALUES ($1, $2, $3, 'to_postgres', 'copying', 'test')",
    )
    .bind(migration)
    .bind(t.team_id)
    .bind(t.conversation_id)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO conversation_migration_items
             (migration_id, message_id, team_id, body_sha256, bytes, state)
         SELECT $1, id, team_id, body_sha256, body_bytes, 'copied'
           FROM conversation_messages WHERE id = $2",
    )
    .bind(migration)
    .bind(migrating)
    .execute(&app.pool)
    .await
    .unwrap();

    assert_eq!(t.release().await, 1, "only the confirmable body goes");
    assert_eq!(t.row(released).await.body, "", "released in PostgreSQL");
    for id in [deleted, mismatch, migrating] {
        assert!(!t.row(id).await.body.is_empty(), "{id} kept");
    }
    assert_eq!(t.release().await, 0, "a second pass finds nothing more");
    let page = t.read_as_bob().await;
    assert_eq!(
        in_page(&page, released)["body"],
        "released, then read from the broker",
        "fetched from the broker"
    );
    assert_eq!(
        in_page(&page, deleted)["body"],
        "its stream entry will be deleted"
    );
    assert_eq!(
        in_page(&page, migrating)["body"],
        "a migration holds this one"
    );

    // Once the migration is over (failed: nothing moved), its hold ends.
    sqlx::query("UPDATE conversation_migrations SET state = 'failed' WHERE id = $1")
        .bind(migration)
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(t.release().await, 1);
    assert_eq!(t.row(migrating).await.body, "");
    assert_eq!(
        in_page(&t.read_as_bob().await, migrating)["body"],
        "a migration holds this one"
    );
}

/// Drain until nothing is due: every pass's outcome, summed.
async fn drain_all(app: &TestApp) -> publication::DrainPass {
    let settings = publication::DrainSettings {
        batch: 256,
        in_flight: 64,
        ..drain_settings()
    };
    let mut total = publication::DrainPass::default();
    loop {
        let pass = publication::drain_once(&app.bus, "drain-test", &settings)
            .await
            .unwrap();
        if pass.leased == 0 {
            return total;
        }
        total.leased += pass.leased;
        total.stored += pass.stored;
        total.failed += pass.failed;
    }
}

/// One sweep pass with a grace period of `grace_secs`.
async fn sweep(app: &TestApp, grace_secs: i64) -> u64 {
    outbox::release_published_bodies(&app.pool, &app.bus.backends, None, grace_secs)
        .await
        .expect("a sweep pass")
}

// O18: the grace period: a body younger than it stays, whatever the broker
// holds; once older, it goes. (Mutation: drop `AND m.created_at <= now() -
// make_interval(secs => $2)` from the candidates: the young body goes at
// once.)
#[tokio::test]
async fn o18_the_sweep_keeps_a_body_younger_than_its_grace_period() {
    let app = spawn_app_with_broker(&nats_url()).await;
    let t = Routed::new(&app, "jsgrace").await;
    let id = t.send("young").await;
    assert_eq!(drain_all(&app).await.stored, 1);
    assert_eq!(sweep(&app, 300).await, 0, "younger than 300 s: kept");
    assert_eq!(t.row(id).await.body, "young");
    sqlx::query(
        "UPDATE conversation_messages SET created_at = now() - interval '301 seconds'
          WHERE id = $1",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(sweep(&app, 300).await, 1, "past the grace: released");
    assert_eq!(t.row(id).await.body, "");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O18: one pass releases at most 200 bodies and examines at most 1 000
// candidates: 201 confirmable bodies take two passes; a confirmable body
// behind 1 000 unconfirmable ones is not reached, and behind 999 it is.
// (Mutations: `RELEASE_BATCH = 200` → 300: the first pass releases 201;
// `SCAN_LIMIT = 1_000` → 2_000: the body behind 1 000 is released.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o18_a_sweep_pass_releases_at_most_200_and_examines_at_most_1000() {
    let app = spawn_app_with_broker(&nats_url()).await;
    let t = Routed::new(&app, "jsbounds").await;
    for i in 0..201 {
        t.send(&format!("body {i}")).await;
    }
    assert_eq!(drain_all(&app).await.stored, 201);
    assert_eq!(sweep(&app, 0).await, 200, "at most 200 per pass");
    assert_eq!(sweep(&app, 0).await, 1, "the rest on the next pass");
    assert_eq!(sweep(&app, 0).await, 0);

    // 1 000 older candidates the broker cannot confirm (their locators name
    // sequences the stream never had), then one it can.
    let template: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 LIMIT 1",
    )
    .bind(t.conversation_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO conversation_messages
             (id, team_id, conversation_id, seq, sender_member_id, sender_id, sender_session,
              request_id, body, body_sha256, body_bytes, backend, publication_state,
              canonical_locator, created_at)
         SELECT gen_random_uuid(), team_id, conversation_id, 10000 + g, sender_member_id,
                sender_id, sender_session, gen_random_uuid(), 'unconfirmable', body_sha256,
                13, backend, 'stored', $2 || (1000000 + g),
                now() - interval '1 day' + g * interval '1 millisecond'
           FROM conversation_messages, generate_series(1, 1000) AS g
          WHERE id = $1",
    )
    .bind(template)
    .bind(format!("jetstream:{}:", body_stream_name(t.team_id)))
    .execute(&app.pool)
    .await
    .unwrap();
    let behind = t.send("behind a thousand").await;
    assert_eq!(drain_all(&app).await.stored, 1);
    assert_eq!(
        sweep(&app, 0).await,
        0,
        "not reached within 1 000 candidates"
    );
    assert_eq!(t.row(behind).await.body, "behind a thousand");
    sqlx::query(
        "DELETE FROM conversation_messages
          WHERE id = (SELECT id FROM conversation_messages
                       WHERE body = 'unconfirmable' ORDER BY created_at LIMIT 1)",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(sweep(&app, 0).await, 1, "the 1 000th candidate is examined");
    assert_eq!(t.row(behind).await.body, "");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O18: a backend that fails is skipped for the rest of the pass, for that
// (backend, team) only: after team A's first body fails to be fetched, A's
// next (confirmable) body is not asked for in that pass, while team B's is
// released. (Mutations: drop the `if unusable.contains(..) { continue; }`
// skip: A's second body is released in the same pass; `break 'scan` instead
// of marking the (backend, team) unusable: B's body is not released.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o18_a_failing_backend_is_skipped_for_the_rest_of_the_pass_for_its_team_only() {
    let app = spawn_app_with_broker(&nats_url()).await;
    let a = Routed::new(&app, "jsskipa").await;
    let b = Routed::new(&app, "jsskipb").await;
    let failing = a.send("A: its fetch fails").await;
    let skipped = a.send("A: confirmable, but after a failure").await;
    let other = b.send("B: confirmable").await;
    assert_eq!(drain_all(&app).await.stored, 3);
    // A's first body now names B's stream: fetching it is refused (an error,
    // not "not held"), which makes A's backend unusable for this pass.
    let own: String =
        sqlx::query_scalar("SELECT canonical_locator FROM conversation_messages WHERE id = $1")
            .bind(failing)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let foreign = format!(
        "jetstream:{}:{}",
        body_stream_name(b.team_id),
        sequence(a.team_id, &own)
    );
    let relocate = async |locator: &str| {
        sqlx::query("UPDATE conversation_messages SET canonical_locator = $2 WHERE id = $1")
            .bind(failing)
            .bind(locator)
            .execute(&app.pool)
            .await
            .unwrap();
    };
    relocate(&foreign).await;

    assert_eq!(sweep(&app, 0).await, 1, "only team B's body");
    assert_eq!(b.row(other).await.body, "", "B released");
    assert!(
        !a.row(skipped).await.body.is_empty(),
        "A skipped for the pass"
    );
    assert!(!a.row(failing).await.body.is_empty());

    // Next pass, A's backend is asked again.
    relocate(&own).await;
    assert_eq!(sweep(&app, 0).await, 2);
    assert_eq!(a.row(skipped).await.body, "");
    for team in [a.team_id, b.team_id] {
        app.broker().remove_team_streams(team).await.unwrap();
    }
}

// O18: the clear re-checks the whole predicate at clear time: a move to
// postgres that commits while the pass is between its fetch and its clear
// makes the row the record again, and the body stays. (Mutation: reduce the
// clear's WHERE to `m.id = ANY($1)` and the join: the moved row's body is
// emptied.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn o18_the_clear_rechecks_the_predicate_and_keeps_a_body_moved_meanwhile() {
    let app = spawn_app_with_broker(&nats_url()).await;
    let t = Routed::new(&app, "jsrecheck").await;
    let id = t.send("moved back to postgres meanwhile").await;
    assert_eq!(drain_all(&app).await.stored, 1);

    // The "cutover" holds the row while the pass fetches and confirms, and
    // commits once the pass's clear waits for it.
    let mut cutover = app.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM conversation_messages WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *cutover)
        .await
        .unwrap();
    let pass = tokio::spawn({
        let pool = app.pool.clone();
        let backends = app.bus.backends.clone();
        async move { outbox::release_published_bodies(&pool, &backends, None, 0).await }
    });
    eventually("the pass's clear waits for the row", async || {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%SET body = ''''%'",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await;
    for moved in [
        "UPDATE conversation_messages SET backend = 'postgres', canonical_locator = NULL
          WHERE id = $1",
        "UPDATE conversations SET backend = 'postgres', publication = 'sync'
          WHERE id = (SELECT conversation_id FROM conversation_messages WHERE id = $1)",
    ] {
        sqlx::query(moved)
            .bind(id)
            .execute(&mut *cutover)
            .await
            .unwrap();
    }
    cutover.commit().await.unwrap();
    assert_eq!(pass.await.unwrap().unwrap(), 0, "nothing cleared");
    assert_eq!(t.row(id).await.body, "moved back to postgres meanwhile");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O4, O6, B1: two replicas of the bus on one database, each with its own
// broker connection and its own drain, drain the same outbox: every message
// is stored, each published once (stream entries = messages, distinct
// sequences), one set of inbox references each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_draining_one_outbox_publish_each_message_once() {
    let url = nats_url();
    let first = spawn_app_with_broker(&url).await;
    let second = first.replica_with_broker(&url).await;
    let t = Routed::new(&first, "jsb6").await;
    let mut sent = Vec::new();
    for i in 0..40 {
        let body = format!("message {i}");
        sent.push((t.send(&body).await, body));
    }
    let workers = [
        first.start_publication_workers(),
        second.start_publication_workers(),
    ];
    // More while both drain.
    for i in 40..60 {
        let body = format!("message {i}");
        sent.push((t.send(&body).await, body));
    }
    let ids: Vec<Uuid> = sent.iter().map(|(id, _)| *id).collect();
    let locators = t.wait_stored(&ids).await;
    for w in workers {
        w.stop().await;
    }
    let stored: Vec<(Uuid, String, String)> = sent
        .into_iter()
        .zip(locators)
        .map(|((id, body), locator)| (id, body, locator))
        .collect();
    assert_once_in_stream(&url, t.team_id, t.conversation_id, &stored).await;
    let references: Vec<i64> = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM inbox_references i WHERE i.message_id = m.id)
           FROM conversation_messages m WHERE m.conversation_id = $1",
    )
    .bind(t.conversation_id)
    .fetch_all(&first.pool)
    .await
    .unwrap();
    assert_eq!(references, vec![1; 60], "one reference per recipient, once");
    assert_eq!(
        outbox::status(&first.pool, t.team_id).await.unwrap(),
        outbox::Status::default()
    );
    first.broker().remove_team_streams(t.team_id).await.unwrap();
}

// O19 and "Reading": a released body the broker no longer holds is
// tombstoned at read time with its reason, and the page still returns every
// other message with its body; a broker that does not answer makes the
// released bodies `unreachable` (not tombstoned: not lost), and they read
// again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_gone_from_the_broker_is_tombstoned_and_a_silent_broker_is_unreachable() {
    let mut server = OwnedNats::start();
    let app = spawn_app_with_broker(&server.url()).await;
    let t = Routed::new(&app, "jsb7").await;
    let first = t.send("first").await;
    let gone = t.send("deleted from the stream").await;
    let third = t.send("third").await;
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&[first, gone, third]).await;
    workers.stop().await;
    assert_eq!(t.release().await, 3);

    assert!(
        body_stream(&server.url(), t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[1]))
            .await
            .unwrap()
    );
    // One "not found" is not an absence: unreachable until the stream leader
    // still says so after the confirm delay, then tombstoned.
    let page = t.read_as_bob().await;
    assert_eq!(in_page(&page, gone)["unavailable"]["reason"], "unreachable");
    assert!(t.row(gone).await.tombstone_reason.is_none());
    let page = eventually("the absence confirmed", async || {
        let page = t.read_as_bob().await;
        (in_page(&page, gone)["unavailable"]["reason"] == "tombstoned").then_some(page)
    })
    .await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 3);
    assert_eq!(in_page(&page, first)["body"], "first");
    assert_eq!(in_page(&page, third)["body"], "third");
    let tombstoned = in_page(&page, gone);
    assert!(tombstoned["body"].is_null());
    assert_eq!(tombstoned["unavailable"]["reason"], "tombstoned");
    assert!(
        tombstoned["unavailable"]["detail"]
            .as_str()
            .unwrap()
            .contains("no longer holds"),
        "{tombstoned}"
    );
    assert_eq!(page["next_after_seq"], 3);
    let row = t.row(gone).await;
    assert!(
        row.tombstone_reason.is_some(),
        "O19: recorded, not just shown: {row:?}"
    );
    assert_eq!(row.publication_state, "stored", "the message itself stays");

    // The broker stops answering: unreachable, not tombstoned.
    tokio::task::block_in_place(|| server.stop());
    let page = t.read_as_bob().await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 3);
    for id in [first, third] {
        let shown = in_page(&page, id);
        assert!(shown["body"].is_null(), "{shown}");
        assert_eq!(shown["unavailable"]["reason"], "unreachable", "{shown}");
        assert!(t.row(id).await.tombstone_reason.is_none(), "not tombstoned");
    }
    assert_eq!(in_page(&page, gone)["unavailable"]["reason"], "tombstoned");

    tokio::task::block_in_place(|| server.restart());
    wait_reachable(app.broker()).await;
    eventually("the bodies read again", async || {
        let page = t.read_as_bob().await;
        (in_page(&page, first)["body"] == "first" && in_page(&page, third)["body"] == "third")
            .then_some(())
    })
    .await;
}

// Issue 13, item 7: one "not found" from the broker never tombstones a
// released body. The team's body stream is lost and created again empty,
// outside `team stream`: every released body reads `unreachable`,
// none is tombstoned. Restored into the stream at their sequences (as from a
// backup), they read again. One that stays missing is tombstoned, with its
// reason, only once the stream leader still answers "not found" at least
// the confirm delay after the first answer.
#[tokio::test]
async fn a_body_missing_after_the_stream_is_reprovisioned_is_unreachable_until_its_absence_is_confirmed()
 {
    let app = spawn_app_with_broker(&nats_url()).await;
    let t = Routed::new(&app, "jsb13").await;
    let bodies = ["restored from a backup", "also restored", "never restored"];
    let mut ids = Vec::new();
    for body in bodies {
        ids.push(t.send(body).await);
    }
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&ids).await;
    workers.stop().await;
    assert_eq!(t.release().await, 3, "every local copy released");
    let lost = ids[2];

    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    let stream = body_stream_name(t.team_id);
    js.delete_stream(&stream).await.unwrap();
    // Re-created on the broker behind the bus's back (as an operator's
    // `nats stream restore` would), not through `team stream`: the bus has
    // recorded no new identity, so it cannot know the bodies are lost (the
    // identity case is `a_stream_recreated_…` below).
    app.broker()
        .provision_team(t.team_id, &StreamSizes::default(), false)
        .await
        .expect("the streams created again");
    assert_eq!(stream_messages(&nats_url(), t.team_id).await, 0);

    let first_miss = Instant::now();
    let page = t.read_as_bob().await;
    for id in &ids {
        let shown = in_page(&page, *id);
        assert!(shown["body"].is_null(), "{shown}");
        assert_eq!(shown["unavailable"]["reason"], "unreachable", "{shown}");
        assert!(
            shown["unavailable"]["detail"]
                .as_str()
                .unwrap()
                .contains("stream leader"),
            "{shown}"
        );
        assert!(
            t.row(*id).await.tombstone_reason.is_none(),
            "one \"not found\" tombstones nothing"
        );
    }

    // The backup: every body again at its sequence, then the one that was
    // not in it deleted.
    let mut in_order: Vec<(u64, usize)> = locators
        .iter()
        .enumerate()
        .map(|(i, l)| (sequence(t.team_id, l), i))
        .collect();
    in_order.sort();
    for (seq, i) in &in_order {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Acs-Message-Id", ids[*i].to_string().as_str());
        headers.insert(
            "Acs-Conversation-Id",
            t.conversation_id.to_string().as_str(),
        );
        headers.insert("Acs-Team-Id", t.team_id.to_string().as_str());
        let ack = js
            .publish_with_headers(
                body_subject(t.team_id, t.conversation_id),
                headers,
                bodies[*i].into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(ack.sequence, *seq, "restored at its sequence");
    }
    assert!(
        body_stream(&nats_url(), t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[2]))
            .await
            .unwrap()
    );

    let page = t.read_as_bob().await;
    assert_eq!(in_page(&page, ids[0])["body"], bodies[0]);
    assert_eq!(in_page(&page, ids[1])["body"], bodies[1]);
    if first_miss.elapsed() < BROKER_ABSENCE_CONFIRM_DELAY {
        assert_eq!(in_page(&page, lost)["unavailable"]["reason"], "unreachable");
        assert!(t.row(lost).await.tombstone_reason.is_none());
    }

    // Two looks from the leader, the confirm delay apart: gone, and said why.
    tokio::time::sleep(
        (BROKER_ABSENCE_CONFIRM_DELAY + Duration::from_millis(250))
            .saturating_sub(first_miss.elapsed()),
    )
    .await;
    let page = t.read_as_bob().await;
    let shown = in_page(&page, lost);
    assert!(shown["body"].is_null(), "{shown}");
    assert_eq!(shown["unavailable"]["reason"], "tombstoned", "{shown}");
    assert!(
        shown["unavailable"]["detail"]
            .as_str()
            .unwrap()
            .contains("no longer holds"),
        "{shown}"
    );
    assert!(t.row(lost).await.tombstone_reason.is_some(), "recorded");
    assert_eq!(in_page(&page, ids[0])["body"], bodies[0]);
    for id in &ids[..2] {
        assert!(t.row(*id).await.tombstone_reason.is_none());
    }
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

/// The identity the bus recorded for the team's body stream, and the one
/// each message's locator was stamped with.
async fn identities(t: &Routed<'_>, ids: &[Uuid]) -> (Option<String>, Vec<Option<String>>) {
    let recorded: Option<String> = sqlx::query_scalar(
        "SELECT created_at_broker::text FROM team_streams WHERE team_id = $1 AND stream = $2",
    )
    .bind(t.team_id)
    .bind(body_stream_name(t.team_id))
    .fetch_optional(&t.app.pool)
    .await
    .unwrap();
    let mut stamps = Vec::new();
    for id in ids {
        stamps.push(
            sqlx::query_scalar(
                "SELECT stream_created_at::text FROM conversation_messages WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&t.app.pool)
            .await
            .unwrap(),
        );
    }
    (recorded, stamps)
}

/// An `unavailable: unreachable` that promises nothing about the body.
fn assert_unreachable_without_promise(shown: &Value) {
    assert!(shown["body"].is_null(), "{shown}");
    assert_eq!(shown["unavailable"]["reason"], "unreachable", "{shown}");
    let detail = shown["unavailable"]["detail"].as_str().unwrap();
    assert!(
        !detail.contains("not lost"),
        "an unreachable body is not promised to be safe: {shown}"
    );
}

async fn team_stream(t: &Routed<'_>, slug: &str) {
    teams::provision_streams(
        &t.app.pool,
        slug,
        t.app.broker(),
        &StreamSizes::default(),
        false,
        &test_actor(),
    )
    .await
    .expect("`team stream` re-run");
}

// Issue 15, item 4: lost is lost, said once, the same way every time. The
// broker's store is wiped (the team's body stream deleted): until the bus
// knows, old bodies read `unreachable` and nothing promises they are safe.
// The stream comes back empty outside the bus and new messages are published
// into it, so old locators collide with new sequences (1, 2) or lie past its
// end (3): still unknown to the bus, still `unreachable`. Once `team stream`
// records the new stream's identity, every old body reads tombstoned "the
// broker lost this body" on the first read, whatever the new stream holds at
// its sequence, and the new ones (published before the identity was
// recorded) read fine. A broker restarted with its store keeps the identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_after_a_wipe_makes_every_old_body_read_lost_at_once_and_new_ones_read()
{
    let mut server = OwnedNats::start();
    let app = spawn_app_with_broker(&server.url()).await;
    let t = Routed::new(&app, "jsb15").await;
    let old_bodies = ["old one", "old two", "old three"];
    let mut old = Vec::new();
    for body in old_bodies {
        old.push(t.send(body).await);
    }
    let workers = app.start_publication_workers();
    t.wait_stored(&old).await;
    workers.stop().await;
    assert_eq!(t.release().await, 3, "every local copy released");
    let (recorded, stamps) = identities(&t, &old).await;
    assert!(recorded.is_some(), "`team stream` recorded the identity");
    assert!(
        stamps.iter().all(|s| *s == recorded),
        "each locator stamped with the identity it was written under: {stamps:?}"
    );

    // A silent broker: unreachable, and no promise.
    tokio::task::block_in_place(|| server.stop());
    let page = t.read_as_bob().await;
    for id in &old {
        assert_unreachable_without_promise(in_page(&page, *id));
    }
    // Restarted with its store: the same stream, the same identity.
    tokio::task::block_in_place(|| server.restart());
    wait_reachable(app.broker()).await;
    team_stream(&t, "jsb15").await;
    assert_eq!(identities(&t, &[]).await.0, recorded, "a restart keeps it");
    let page = eventually("the bodies read again", async || {
        let page = t.read_as_bob().await;
        (in_page(&page, old[2])["body"] == old_bodies[2]).then_some(page)
    })
    .await;
    assert_eq!(in_page(&page, old[0])["body"], old_bodies[0]);

    // The store wiped: the stream is gone.
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream(body_stream_name(t.team_id)).await.unwrap();
    let page = t.read_as_bob().await;
    for id in &old {
        assert_unreachable_without_promise(in_page(&page, *id));
        assert!(t.row(*id).await.tombstone_reason.is_none());
    }

    // Back empty, outside `team stream`; new messages take sequences 1, 2.
    app.broker()
        .provision_team(t.team_id, &StreamSizes::default(), false)
        .await
        .unwrap();
    let new = [t.send("new one").await, t.send("new two").await];
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&new).await;
    workers.stop().await;
    assert_eq!(t.release().await, 2);
    let mut taken: Vec<u64> = locators.iter().map(|l| sequence(t.team_id, l)).collect();
    taken.sort();
    assert_eq!(
        taken,
        [1, 2],
        "the old locators 1 and 2 now name new messages"
    );
    let page = t.read_as_bob().await;
    for id in &old {
        assert_unreachable_without_promise(in_page(&page, *id));
        assert!(t.row(*id).await.tombstone_reason.is_none(), "not known yet");
    }

    // `team stream` re-run: the bus learns the stream was re-created.
    team_stream(&t, "jsb15").await;
    let (now_recorded, _) = identities(&t, &[]).await;
    assert_ne!(
        now_recorded, recorded,
        "a re-created stream has a new identity"
    );
    let page = t.read_as_bob().await;
    for id in &old {
        let shown = in_page(&page, *id);
        assert!(shown["body"].is_null(), "{shown}");
        assert_eq!(shown["unavailable"]["reason"], "tombstoned", "{shown}");
        assert_eq!(shown["unavailable"]["detail"], "the broker lost this body");
        let row = t.row(*id).await;
        assert_eq!(
            row.tombstone_reason.as_deref(),
            Some("the broker lost this body"),
            "recorded, not only shown: {row:?}"
        );
        assert_eq!(row.publication_state, "stored", "the message itself stays");
    }
    assert_eq!(in_page(&page, new[0])["body"], "new one");
    assert_eq!(in_page(&page, new[1])["body"], "new two");
    let (_, stamps) = identities(&t, &new).await;
    assert!(
        stamps.iter().all(|s| *s == now_recorded),
        "a body found in the new stream is stamped with it: {stamps:?}"
    );
    // Said once: the same answer on every later read.
    let again = t.read_as_bob().await;
    for id in &old {
        assert_eq!(
            in_page(&again, *id)["unavailable"]["detail"],
            "the broker lost this body"
        );
    }
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// Issue 15, item 4: the body sweep records bodies of a re-created stream
// lost without anyone reading them, and leaves the new stream's bodies be.
#[tokio::test]
async fn the_sweep_records_bodies_of_a_recreated_stream_lost_without_a_read() {
    let app = spawn_app_with_broker(&nats_url()).await;
    let t = Routed::new(&app, "jsb15s").await;
    let old = [t.send("old one").await, t.send("old two").await];
    let workers = app.start_publication_workers();
    t.wait_stored(&old).await;
    workers.stop().await;
    assert_eq!(t.release().await, 2);
    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    js.delete_stream(body_stream_name(t.team_id)).await.unwrap();
    team_stream(&t, "jsb15s").await;
    let new = t.send("new one").await;
    let workers = app.start_publication_workers();
    t.wait_stored(&[new]).await;
    workers.stop().await;
    assert_eq!(t.release().await, 1);

    let swept = lost_bodies::tombstone_bodies_of_replaced_streams(&app.pool, &app.bus.backends)
        .await
        .unwrap();
    assert_eq!(swept, 2, "both old bodies recorded lost");
    for id in old {
        assert_eq!(
            t.row(id).await.tombstone_reason.as_deref(),
            Some("the broker lost this body")
        );
    }
    assert!(t.row(new).await.tombstone_reason.is_none());
    assert_eq!(
        lost_bodies::tombstone_bodies_of_replaced_streams(&app.pool, &app.bus.backends)
            .await
            .unwrap(),
        0,
        "recorded once"
    );
    let page = t.read_as_bob().await;
    assert_eq!(in_page(&page, new)["body"], "new one");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

/// `ai-crew-sync conversations declare-lost …` against the app's database;
/// its JSON answer.
fn declare_lost(app: &TestApp, nats: &str, args: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args([
            "conversations",
            "declare-lost",
            "--nats-url",
            nats,
            "--json",
        ])
        .args(args)
        .env("DATABASE_URL", &app.database_url)
        .env_remove("BUS_NATS_URL")
        .output()
        .expect("run the binary");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

// Issue 15, item 4: after a restore failed, the operator declares the bodies
// the broker cannot return lost. The dry run counts and names them and
// writes nothing; bodies the broker returns and bodies PostgreSQL still holds
// are never counted; `--apply` tombstones them "the broker lost this body",
// one audit entry per conversation.
#[tokio::test]
async fn declare_lost_counts_then_tombstones_and_audits_what_the_broker_cannot_return() {
    let url = nats_url();
    let app = spawn_app_with_broker(&url).await;
    let t = Routed::new(&app, "jsb15d").await;
    let other = t.conversation("Another thread").await;
    let a = [t.send("a1").await, t.send("a2").await, t.send("a3").await];
    let b = t.send_in(other, "b1").await;
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&[a[0], a[1], a[2], b]).await;
    workers.stop().await;
    assert_eq!(t.release().await, 4);
    let kept = t.send("still held locally").await;
    let workers = app.start_publication_workers();
    t.wait_stored(&[kept]).await;
    workers.stop().await;

    // One body deleted from a stream that is otherwise there.
    assert!(
        body_stream(&url, t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[1]))
            .await
            .unwrap()
    );
    let conversation = t.conversation_id.to_string();
    let dry = declare_lost(
        &app,
        &url,
        &["--team", "jsb15d", "--conversation", &conversation],
    );
    assert_eq!(dry["applied"], false);
    assert_eq!(dry["lost"], 1, "{dry}");
    assert_eq!(dry["readable"], 2, "{dry}");
    assert_eq!(dry["conversations"][0]["seqs"], json!([2]), "{dry}");
    assert!(
        t.row(a[1]).await.tombstone_reason.is_none(),
        "a dry run writes nothing"
    );

    // The restore failed: the stream is gone.
    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    js.delete_stream(body_stream_name(t.team_id)).await.unwrap();
    let dry = declare_lost(&app, &url, &["--team", "jsb15d"]);
    assert_eq!(dry["stream_present"], false, "{dry}");
    assert_eq!(dry["lost"], 4, "the local copy is not counted: {dry}");
    for id in [a[0], a[1], a[2], b] {
        assert!(t.row(id).await.tombstone_reason.is_none());
    }
    let audited_before: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'conversation.declare_lost'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(audited_before, 0);

    let applied = declare_lost(&app, &url, &["--team", "jsb15d", "--apply"]);
    assert_eq!(applied["applied"], true);
    assert_eq!(applied["lost"], 4, "{applied}");
    for id in [a[0], a[1], a[2], b] {
        assert_eq!(
            t.row(id).await.tombstone_reason.as_deref(),
            Some("the broker lost this body")
        );
    }
    assert!(t.row(kept).await.tombstone_reason.is_none());
    let audited: Vec<(String, Value)> = sqlx::query_as(
        "SELECT subject, detail FROM audit_log WHERE action = 'conversation.declare_lost'
          ORDER BY subject",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(audited.len(), 2, "one entry per conversation: {audited:?}");
    let page = t.read_as_bob().await;
    assert_eq!(
        in_page(&page, a[0])["unavailable"]["detail"],
        "the broker lost this body"
    );
    assert_eq!(in_page(&page, kept)["body"], "still held locally");
    let again = declare_lost(&app, &url, &["--team", "jsb15d", "--apply"]);
    assert_eq!(again["lost"], 0, "declared once: {again}");
}

// `serve --nats-url` while the broker is down starts anyway (the bus is up
// while PostgreSQL is), reports the broker unreachable, and routes to it once
// it answers.
#[tokio::test]
async fn serve_starts_during_a_broker_outage_and_picks_the_broker_up_when_it_answers() {
    let mut nats = crate::support::nats::OwnedNats::start();
    nats.stop();
    let database_url = crate::support::postgres::fresh_database_url().await;
    let port = crate::support::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args([
            "serve",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--nats-url",
            &nats.url(),
            "--metrics-bind",
            "off",
        ])
        .env("DATABASE_URL", &database_url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let health = async |check: bool| -> Option<Value> {
        let url = format!(
            "http://127.0.0.1:{port}/health{}",
            if check { "?broker=check" } else { "" }
        );
        let response = crate::support::http_client().get(url).send().await.ok()?;
        response.json::<Value>().await.ok()
    };
    let down = eventually("serve answers /health", async || health(false).await).await;
    assert_eq!(down["database"], "ok");
    assert_eq!(down["broker"], "unreachable");
    assert_eq!(down["status"], "degraded");

    nats.restart();
    let up = eventually("the broker is picked up", async || {
        health(true).await.filter(|h| h["broker"] == "ok")
    })
    .await;
    assert_eq!(up["status"], "ok");
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "serve stops cleanly: {status}");
}
