//! The outbox and the backend boundary against real PostgreSQL, with faults
//! injected only at the backend boundary (`Faults`), and nowhere else. Each
//! test cites the invariants (listed in ARCHITECTURE.md) it shows
//! (O* for the outbox, B* for the backend).
//!
//! Messages are sent by real MCP clients into a conversation switched to
//! outbox publication on the postgres backend; the workers are not running
//! (no broker), so each test drives the outbox functions itself.
//!
//! This file holds what the tests share (a conversation on outbox
//! publication, its slot and message rows, leasing one slot, a body that
//! landed uncertain); the tests live by concept in `lifecycle`, `uncertain`,
//! `fences` (invariants that bite), `workers` and `operator`.

use std::time::Duration;

use ai_crew_sync::backend::{
    BackendKind, Backends, Envelope, Faults, Locator, MessagingBackend, PostgresBackend, Published,
};
use ai_crew_sync::store::conversations::Publication;
use ai_crew_sync::store::conversations::operator as conversation_operator;
use ai_crew_sync::store::delivery::outbox::{Lease, Settled};
use ai_crew_sync::store::{delivery::outbox, identity::teams};
use ai_crew_sync::workers::publication::{self, DrainPass, DrainSettings};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{McpClient, TestApp, eventually, spawn_app, test_actor};

mod fences;
mod lifecycle;
mod operator;
mod unanswered;
mod uncertain;
mod workers;

/// A conversation of alice (sender) and bob (recipient) on outbox publication.
struct Outboxed {
    app: TestApp,
    team_id: Uuid,
    conversation_id: Uuid,
    alice: McpClient,
    bob: McpClient,
}

impl Outboxed {
    async fn new() -> Outboxed {
        let app = spawn_app().await;
        app.team("ob").await;
        teams::capability(&app.pool, "ob", Some(true), &test_actor())
            .await
            .unwrap();
        let alice = app.mcp(&app.agent("ob", "alice").await, None).await;
        let bob = app.mcp(&app.agent("ob", "bob").await, None).await;
        let created = alice
            .call(
                "create_conversation",
                json!({"title": "Outbox", "private": true, "invite": ["bob"]}),
            )
            .await
            .unwrap();
        let conversation_id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
        bob.call(
            "join_conversation",
            json!({"conversation_id": conversation_id}),
        )
        .await
        .unwrap();
        let team_id: Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = 'ob'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        outbox::set_publication(&app.pool, team_id, conversation_id, Publication::Outbox)
            .await
            .unwrap();
        Outboxed {
            app,
            team_id,
            conversation_id,
            alice,
            bob,
        }
    }

    fn pool(&self) -> &PgPool {
        &self.app.pool
    }

    /// Alice sends `body`; the answer of the tool.
    async fn send(&self, body: &str) -> Value {
        self.alice
            .call(
                "send_conversation_message",
                json!({"conversation_id": self.conversation_id, "body": body,
                       "request_id": Uuid::new_v4()}),
            )
            .await
            .unwrap()
    }

    async fn send_id(&self, body: &str) -> Uuid {
        self.send(body).await["message_id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    async fn read_as_bob(&self) -> Value {
        self.bob
            .call(
                "read_conversation",
                json!({"conversation_id": self.conversation_id}),
            )
            .await
            .unwrap()
    }

    /// Make every slot due now (skip the backoff a test is not about).
    async fn make_due(&self) {
        sqlx::query("UPDATE conversation_outbox SET next_attempt_at = now()")
            .execute(self.pool())
            .await
            .unwrap();
    }

    async fn slot(&self, message_id: Uuid) -> Option<Slot> {
        sqlx::query_as(
            "SELECT state, generation, attempts, leased_by, last_error,
                    extract(epoch FROM lease_expires_at - now())::float8 AS lease_left,
                    extract(epoch FROM next_attempt_at - now())::float8 AS due_in
               FROM conversation_outbox WHERE message_id = $1",
        )
        .bind(message_id)
        .fetch_optional(self.pool())
        .await
        .unwrap()
    }

    async fn message(&self, message_id: Uuid) -> MessageState {
        sqlx::query_as(
            "SELECT publication_state, canonical_locator, uncertain_at IS NOT NULL AS uncertain,
                    tombstone_reason,
                    (SELECT count(*) FROM message_receipts r
                      WHERE r.message_id = m.id AND r.stored_at IS NOT NULL) AS receipts_stored,
                    (SELECT count(*) FROM inbox_references i WHERE i.message_id = m.id) AS references
               FROM conversation_messages m WHERE id = $1",
        )
        .bind(message_id)
        .fetch_one(self.pool())
        .await
        .unwrap()
    }
}

#[derive(sqlx::FromRow, Debug)]
struct Slot {
    state: String,
    generation: i64,
    attempts: i32,
    leased_by: Option<String>,
    last_error: Option<String>,
    lease_left: Option<f64>,
    due_in: f64,
}

#[derive(sqlx::FromRow, Debug)]
struct MessageState {
    publication_state: String,
    canonical_locator: Option<String>,
    uncertain: bool,
    tombstone_reason: Option<String>,
    receipts_stored: i64,
    references: i64,
}

fn backend(pool: &PgPool) -> PostgresBackend {
    PostgresBackend::new(pool.clone())
}

fn faulty(pool: &PgPool, faults: Faults) -> PostgresBackend {
    PostgresBackend::with_faults(pool.clone(), faults)
}

async fn lease(pool: &PgPool) -> Lease {
    outbox::lease(pool, "test-worker")
        .await
        .unwrap()
        .expect("a due slot")
}

/// An uncertain message whose body did land (the backend wrote it and the
/// answer was lost), with its slot pending again.
async fn landed_but_uncertain(t: &Outboxed, body: &str) -> Uuid {
    let message_id = t.send_id(body).await;
    let held = lease(t.pool()).await;
    let lossy = faulty(
        t.pool(),
        Faults {
            lose_confirmation: true,
            ..Faults::default()
        },
    );
    assert!(matches!(
        lossy.publish(&held.envelope()).await,
        Published::Retryable(_)
    ));
    outbox::mark_uncertain(t.pool(), &held, "no answer")
        .await
        .unwrap();
    message_id
}
