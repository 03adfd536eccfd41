//! The whole bus on a real `nats-server -js` (issue 6, "Done when"): real MCP
//! clients send into a conversation of a team routed to jetstream, the
//! publication workers drain the outbox to the team's body stream, and what
//! the recipient reads and what the stream holds are checked, with the broker
//! stopped, restarted, or behind a proxy that loses its answers. Invariant
//! numbers (O*, B*) are those listed in ARCHITECTURE.md.
//!
//! Every wait is a poll with a deadline; no test asserts a timing.
//!
//! This file holds what the tests share (a routed team with alice and bob,
//! stream readers, the CLI, a drain to completion); the tests live by
//! concept in `drain` (the outbox into the stream), `conditions`
//! (what an operator sees and fixes), `sweep` (releasing local copies) and
//! `lost` (bodies the broker no longer holds).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ai_crew_sync::backend::Locator;
use ai_crew_sync::backend::jetstream::{
    Broker, StreamSizes, body_stream_name, body_subject, parse_locator,
};
use ai_crew_sync::store::{delivery::lost_bodies, delivery::outbox, identity::teams};
use ai_crew_sync::workers::publication;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::nats::{OwnedNats, nats_url};
use crate::support::proxy::Proxy;
use crate::support::{
    BROKER_ABSENCE_CONFIRM_DELAY, McpClient, TestApp, drain_settings, eventually, globally,
    test_actor,
};

mod conditions;
mod drain;
mod lost;
mod sweep;

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
