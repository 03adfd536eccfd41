//! The durable inbox over real MCP: references owed to a window, handed out
//! once at a time, confirmed idempotently (`delivered` written on the
//! receipt), never expired by PostgreSQL, and receipt references to a sender
//! on broker-backed conversations.

use std::time::Duration;

use ai_crew_sync::store::{outbox, teams};
use ai_crew_sync::workers::publication::{self, DrainSettings};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{McpClient, TestApp, spawn_app, test_actor};

struct Pair {
    app: TestApp,
    conversation_id: Uuid,
    alice: McpClient,
    bob: McpClient,
}

async fn pair() -> Pair {
    let app = spawn_app().await;
    app.team("ib").await;
    teams::capability(&app.pool, "ib", Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.mcp(&app.agent("ib", "alice").await, None).await;
    let bob = app.mcp(&app.agent("ib", "bob").await, Some("w1")).await;
    let created = alice
        .call(
            "create_conversation",
            json!({"title": "Inbox", "private": true, "invite": ["bob/w1"]}),
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
    Pair {
        app,
        conversation_id,
        alice,
        bob,
    }
}

impl Pair {
    async fn send(&self, body: &str) -> Uuid {
        let sent = self
            .alice
            .call(
                "send_conversation_message",
                json!({"conversation_id": self.conversation_id, "body": body,
                       "request_id": Uuid::new_v4()}),
            )
            .await
            .unwrap();
        sent["message_id"].as_str().unwrap().parse().unwrap()
    }
}

async fn fetch(client: &McpClient) -> Value {
    client
        .call("fetch_conversation_inbox", json!({}))
        .await
        .unwrap()
}

fn delivery_ids(fetched: &Value) -> Vec<String> {
    fetched["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["delivery_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn references_are_handed_out_once_confirmed_idempotently_and_marked_delivered() {
    let p = pair().await;
    let mut sent = Vec::new();
    for body in ["one", "two", "three"] {
        sent.push(p.send(body).await);
    }

    let first = fetch(&p.bob).await;
    let deliveries = first["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 3);
    for (delivery, (message_id, seq)) in deliveries.iter().zip(sent.iter().zip(1..)) {
        assert_eq!(delivery["kind"], "message");
        assert_eq!(delivery["message_id"], message_id.to_string());
        assert_eq!(delivery["seq"], seq);
        assert_eq!(delivery["from"], "alice");
        assert_eq!(delivery["conversation_id"], p.conversation_id.to_string());
        assert!(delivery.get("body").is_none(), "a reference, never a body");
    }
    assert_eq!(first["more"], false);
    // One open hand-out per reference.
    assert_eq!(fetch(&p.bob).await["deliveries"], json!([]));
    let status = p
        .bob
        .call("conversation_inbox_status", json!({}))
        .await
        .unwrap();
    assert_eq!(
        (status["owed"].as_i64(), status["handed_out"].as_i64()),
        (Some(3), Some(3))
    );
    assert_eq!(status["consumer"], "not_used");

    // The sender has nothing owed; the recipient's other window neither.
    assert_eq!(fetch(&p.alice).await["deliveries"], json!([]));

    let ids = delivery_ids(&first);
    let confirmed = p
        .bob
        .call("confirm_inbox_delivery", json!({"delivery_ids": ids[..2]}))
        .await
        .unwrap();
    assert_eq!(
        (
            confirmed["confirmed"].as_i64(),
            confirmed["already_confirmed"].as_i64()
        ),
        (Some(2), Some(0))
    );
    let again = p
        .bob
        .call("confirm_inbox_delivery", json!({"delivery_ids": ids[..2]}))
        .await
        .unwrap();
    assert_eq!(
        (
            again["confirmed"].as_i64(),
            again["already_confirmed"].as_i64()
        ),
        (Some(0), Some(2))
    );
    // Another window cannot confirm bob's references: they are unknown to it.
    let stranger = p
        .alice
        .call("confirm_inbox_delivery", json!({"delivery_ids": [ids[2]]}))
        .await
        .unwrap();
    assert_eq!(stranger["confirmed"], 0);
    assert_eq!(stranger["unknown"], json!([ids[2]]));

    let receipts = p
        .alice
        .call("get_message_receipts", json!({"message_id": sent[0]}))
        .await
        .unwrap();
    assert_eq!(receipts["delivered"], 1);
    assert!(receipts["recipients"][0]["delivered_at"].is_string());
    let receipts = p
        .alice
        .call("get_message_receipts", json!({"message_id": sent[2]}))
        .await
        .unwrap();
    assert_eq!(receipts["delivered"], 0);

    // A hand-out not confirmed in time comes back (the window may have
    // crashed before confirming); confirmed ones never do.
    sqlx::query("UPDATE inbox_references SET handed_out_at = now() - interval '2 minutes'")
        .execute(&p.app.pool)
        .await
        .unwrap();
    let later = fetch(&p.bob).await;
    assert_eq!(delivery_ids(&later), vec![ids[2].clone()]);
}

#[tokio::test]
async fn what_is_owed_survives_a_restart_and_a_pending_message_is_not_owed_yet() {
    let p = pair().await;
    let team_id: Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = 'ib'")
        .fetch_one(&p.app.pool)
        .await
        .unwrap();
    outbox::set_publication(&p.app.pool, team_id, p.conversation_id, true)
        .await
        .unwrap();
    let message_id = p.send("through the outbox").await;
    assert_eq!(
        fetch(&p.bob).await["deliveries"],
        json!([]),
        "no reference to a message nobody stored"
    );
    let settings = DrainSettings {
        publish_timeout: Duration::from_secs(10),
        ..DrainSettings::default()
    };
    let pass = publication::drain_once(&p.app.bus, "w", &settings)
        .await
        .unwrap();
    assert_eq!(pass.stored, 1);

    // Another process on the same database (a restart) owes the same.
    let restarted = p.app.replica().await;
    let bob_again = McpClient::connect(&restarted.mcp_url(), &bob_token_of(&p).await, Some("w1"))
        .await
        .unwrap();
    let fetched = fetch(&bob_again).await;
    assert_eq!(
        fetched["deliveries"][0]["message_id"],
        message_id.to_string()
    );
}

/// A fresh token for bob (tokens are shown once; the test issues another).
async fn bob_token_of(p: &Pair) -> String {
    ai_crew_sync::store::tokens::issue(&p.app.pool, "ib", "bob", None, &test_actor())
        .await
        .unwrap()
        .token
}

#[tokio::test]
async fn an_ack_on_a_broker_backed_conversation_queues_a_receipt_reference_for_the_sender() {
    let p = pair().await;
    let message_id = p.send("please ack").await;
    // A conversation whose bodies live on the broker (routing is not this
    // test's subject; the reference is).
    sqlx::query("UPDATE conversations SET backend = 'jetstream' WHERE id = $1")
        .bind(p.conversation_id)
        .execute(&p.app.pool)
        .await
        .unwrap();
    p.bob
        .call(
            "ack_message",
            json!({"message_id": message_id, "resolved": true}),
        )
        .await
        .unwrap();
    let fetched = fetch(&p.alice).await;
    let deliveries = fetched["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0]["kind"], "receipt");
    assert_eq!(deliveries[0]["receipt"], "resolved");
    assert_eq!(deliveries[0]["from"], "bob/w1");
    assert_eq!(deliveries[0]["message_id"], message_id.to_string());
}

#[tokio::test]
async fn bad_inbox_arguments_are_refused_with_the_limits() {
    let p = pair().await;
    for limit in [0, 51] {
        let err = p
            .bob
            .call("fetch_conversation_inbox", json!({"limit": limit}))
            .await
            .unwrap_err();
        assert!(err["message"].as_str().unwrap().contains("1..50"), "{err}");
    }
    let err = p
        .bob
        .call("confirm_inbox_delivery", json!({"delivery_ids": []}))
        .await
        .unwrap_err();
    assert!(err["message"].as_str().unwrap().contains("1..100"), "{err}");
}
