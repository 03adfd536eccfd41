//! Acknowledgements owed (issue 38, item 3), over real HTTP with the MCP
//! client: a direct or channel message asking for an acknowledgement is
//! listed as owed on both sides until acked, one agent's ack clears only its
//! own debt, conversation messages are listed too, `overdue_only` shows what
//! passed its due time, the `ack.overdue` webhook reaches a real receiver
//! once per (message, debtor) however many passes run at once,
//! `pending_for_me` and the Stop hook name what
//! is owed, and bad requests are refused with nothing changed.
//!
//! A due time passes by moving `ack_due_at` into the past in the database
//! (the shortest due time is 10 s, and no test waits on a clock).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::hooks::{hook, payload, proxy_window};
use crate::support::{
    McpClient, TestApp, eventually, in_team, spawn_app, test_actor, test_authority,
};
use ai_crew_sync::store::identity::teams;
use ai_crew_sync::store::operations::webhooks::{self, NewWebhook, PrivateTargets, WebhookKind};

fn id_of(posted: &Value) -> String {
    posted["message"]["id"].as_str().unwrap().to_string()
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e["message_id"].as_str().unwrap().to_string())
        .collect()
}

fn message(refusal: &Value) -> &str {
    refusal["message"].as_str().unwrap_or_default()
}

async fn owed(client: &McpClient, args: Value) -> Value {
    client.call("list_owed", args).await.unwrap()
}

async fn acks_stored(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM message_acks")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn messages_stored(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Let `message`'s due time pass.
async fn make_overdue(pool: &PgPool, message: &str) {
    sqlx::query("UPDATE messages SET ack_due_at = now() - interval '1 second' WHERE id = $1")
        .bind(message.parse::<Uuid>().unwrap())
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_direct_message_asking_for_an_ack_is_owed_on_both_sides_until_any_window_acks_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    let bob_token = app.agent("acme", "bob").await;
    let bob_w1 = app.mcp(&bob_token, Some("w1")).await;
    let bob_w2 = app.mcp(&bob_token, Some("w2")).await;

    let posted = alice
        .call(
            "post_message",
            json!({"to": "bob/w1", "body": "deploy is frozen until 18:00",
                   "ack_required": true, "ack_within_seconds": 600}),
        )
        .await
        .unwrap();
    let id = id_of(&posted);
    assert_eq!(posted["message"]["ack_required"], true, "{posted}");
    assert!(posted["message"]["ack_due_at"].is_string(), "{posted}");
    assert_eq!(
        acks_stored(&app.pool).await,
        0,
        "a post writes no debt rows"
    );

    // The debt is the agent's: every window of bob lists it.
    for window in [&bob_w1, &bob_w2] {
        let list = owed(window, json!({})).await;
        assert_eq!(ids(&list["i_owe"]), vec![id.clone()], "{list}");
        let entry = &list["i_owe"][0];
        assert_eq!(entry["kind"], "dm");
        assert_eq!(entry["from"], "alice/w1");
        assert_eq!(entry["to"], "bob/w1");
        assert_eq!(entry["overdue"], false);
        assert!(entry["due_at"].is_string(), "{entry}");
        assert!(list["note"].is_null(), "{list}");
    }
    let mine = owed(&alice, json!({})).await;
    assert_eq!(ids(&mine["owed_to_me"]), vec![id.clone()], "{mine}");
    assert_eq!(mine["owed_to_me"][0]["owed_by"], json!(["bob"]));
    assert!(ids(&mine["i_owe"]).is_empty(), "{mine}");

    // The reader sees the request and that it has not acked.
    let read = bob_w1
        .call("read_messages", json!({"scope": "inbox"}))
        .await
        .unwrap();
    let shown = &read["messages"][0];
    assert_eq!(
        (&shown["ack_required"], &shown["acked"]),
        (&json!(true), &json!(false)),
        "{read}"
    );
    let pending = bob_w1.call("pending_for_me", json!({})).await.unwrap();
    assert_eq!(pending["owed_acks"]["count"], 1, "{pending}");
    assert_eq!(ids(&pending["owed_acks"]["items"]), vec![id.clone()]);

    // Acked from the other window, with a note; a repeat answers the first.
    let acked = bob_w2
        .call(
            "ack_message",
            json!({"message_id": id, "note": "understood, holding"}),
        )
        .await
        .unwrap();
    assert_eq!(acked["kind"], "dm", "{acked}");
    assert_eq!(acked["acked_from"], "bob/w2");
    assert_eq!(acked["already_acknowledged"], false);
    let again = bob_w1
        .call("ack_message", json!({"message_id": id}))
        .await
        .unwrap();
    assert_eq!(again["already_acknowledged"], true, "{again}");
    assert_eq!(again["acked_at"], acked["acked_at"]);
    assert_eq!(again["note"], "understood, holding");
    assert_eq!(acks_stored(&app.pool).await, 1);

    for client in [&bob_w1, &bob_w2, &alice] {
        let list = owed(client, json!({})).await;
        assert!(ids(&list["i_owe"]).is_empty() && ids(&list["owed_to_me"]).is_empty());
        assert!(
            list["note"]
                .as_str()
                .is_some_and(|n| n.starts_with("nothing owed as of ")),
            "{list}"
        );
    }
    let read = bob_w1
        .call(
            "read_messages",
            json!({"scope": "inbox", "only_new": false}),
        )
        .await
        .unwrap();
    assert_eq!(read["messages"][0]["acked"], true, "{read}");
}

#[tokio::test]
async fn a_channel_message_is_owed_once_by_every_other_agent_and_one_ack_clears_only_its_own() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, Some("c1")).await;

    let posted = alice
        .call(
            "post_message",
            json!({"channel": "ops", "body": "rotate your keys today", "ack_required": true}),
        )
        .await
        .unwrap();
    let id = id_of(&posted);
    assert!(
        posted["message"]["ack_due_at"].is_null(),
        "no due time asked"
    );
    assert_eq!(
        acks_stored(&app.pool).await,
        0,
        "a post writes no debt rows"
    );
    // An agent added after the post owes nothing for it.
    let dave = app.mcp(&app.agent("acme", "dave").await, None).await;

    let mine = owed(&alice, json!({})).await;
    assert_eq!(ids(&mine["owed_to_me"]), vec![id.clone()], "{mine}");
    assert_eq!(mine["owed_to_me"][0]["owed_by"], json!(["bob", "carol"]));
    assert_eq!(mine["owed_to_me"][0]["owed_by_count"], 2);
    assert_eq!(mine["owed_to_me"][0]["channel"], "ops");
    for client in [&bob, &carol] {
        let list = owed(client, json!({})).await;
        assert_eq!(ids(&list["i_owe"]), vec![id.clone()], "{list}");
        assert_eq!(list["i_owe"][0]["kind"], "channel");
    }
    assert!(ids(&owed(&dave, json!({})).await["i_owe"]).is_empty());

    bob.call("ack_message", json!({"message_id": id}))
        .await
        .unwrap();
    assert!(ids(&owed(&bob, json!({})).await["i_owe"]).is_empty());
    assert_eq!(
        ids(&owed(&carol, json!({})).await["i_owe"]),
        vec![id.clone()],
        "bob's ack does not clear carol's"
    );
    let mine = owed(&alice, json!({})).await;
    assert_eq!(mine["owed_to_me"][0]["owed_by"], json!(["carol"]), "{mine}");

    // Not owed by its sender, nor by an agent that did not exist then.
    for (who, client) in [("alice", &alice), ("dave", &dave)] {
        let refused = client
            .call("ack_message", json!({"message_id": id}))
            .await
            .unwrap_err();
        assert_eq!(refused["error"], "forbidden", "{who}: {refused}");
        assert!(message(&refused).contains("not owed by you"), "{refused}");
    }
    carol
        .call("ack_message", json!({"message_id": id}))
        .await
        .unwrap();
    assert!(ids(&owed(&alice, json!({})).await["owed_to_me"]).is_empty());
    assert_eq!(acks_stored(&app.pool).await, 2);
}

#[tokio::test]
async fn conversation_messages_are_owed_by_their_recipients_and_listed_with_the_others() {
    let app = spawn_app().await;
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("w1")).await;
    let created = alice
        .call(
            "create_conversation",
            json!({"title": "Release", "private": true, "invite": ["bob/w1"]}),
        )
        .await
        .unwrap();
    let conversation = created["id"].as_str().unwrap().to_string();
    bob.call(
        "join_conversation",
        json!({"conversation_id": conversation}),
    )
    .await
    .unwrap();
    let sent = alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": conversation, "body": "cut the branch?",
                   "request_id": Uuid::new_v4().to_string()}),
        )
        .await
        .unwrap();
    let id = sent["message_id"].as_str().unwrap().to_string();

    let list = eventually("bob owes the conversation message", || async {
        let list = owed(&bob, json!({})).await;
        (!ids(&list["i_owe"]).is_empty()).then_some(list)
    })
    .await;
    assert_eq!(ids(&list["i_owe"]), vec![id.clone()], "{list}");
    assert_eq!(list["i_owe"][0]["kind"], "conversation");
    assert_eq!(list["i_owe"][0]["conversation_id"], conversation.as_str());
    assert_eq!(list["i_owe"][0]["overdue"], false);
    let mine = owed(&alice, json!({})).await;
    assert_eq!(ids(&mine["owed_to_me"]), vec![id.clone()], "{mine}");
    assert_eq!(mine["owed_to_me"][0]["owed_by"], json!(["bob/w1"]));
    // Never overdue: it has no due time.
    assert!(ids(&owed(&bob, json!({"overdue_only": true})).await["i_owe"]).is_empty());

    bob.call("ack_message", json!({"message_id": id}))
        .await
        .unwrap();
    assert!(ids(&owed(&bob, json!({})).await["i_owe"]).is_empty());
    assert!(ids(&owed(&alice, json!({})).await["owed_to_me"]).is_empty());
}

#[tokio::test]
async fn overdue_only_lists_what_passed_its_due_time_and_pending_for_me_marks_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let late = id_of(
        &alice
            .call(
                "post_message",
                json!({"to": "bob", "body": "sign the release", "ack_required": true,
                       "ack_within_seconds": 60}),
            )
            .await
            .unwrap(),
    );
    let timely = id_of(
        &alice
            .call(
                "post_message",
                json!({"to": "bob", "body": "read the notes", "ack_required": true,
                       "ack_within_seconds": 3600}),
            )
            .await
            .unwrap(),
    );
    let none = owed(&bob, json!({"overdue_only": true})).await;
    assert!(ids(&none["i_owe"]).is_empty(), "{none}");
    assert!(
        none["note"]
            .as_str()
            .unwrap()
            .starts_with("nothing overdue as of "),
        "{none}"
    );
    make_overdue(&app.pool, &late).await;

    let list = owed(&bob, json!({"overdue_only": true})).await;
    assert_eq!(ids(&list["i_owe"]), vec![late.clone()], "{list}");
    assert_eq!(list["i_owe"][0]["overdue"], true);
    let mine = owed(&alice, json!({"overdue_only": true})).await;
    assert_eq!(ids(&mine["owed_to_me"]), vec![late.clone()], "{mine}");
    let all = owed(&bob, json!({})).await;
    assert_eq!(
        ids(&all["i_owe"]),
        [late.clone(), timely.clone()],
        "oldest first"
    );
    let one = owed(&bob, json!({"limit": 1})).await;
    assert_eq!(
        (ids(&one["i_owe"]), &one["i_owe_more"]),
        (vec![late.clone()], &json!(true))
    );

    let pending = bob.call("pending_for_me", json!({})).await.unwrap();
    let acks = &pending["owed_acks"];
    assert_eq!(
        (&acks["count"], &acks["overdue"]),
        (&json!(2), &json!(1)),
        "{pending}"
    );
    assert_eq!(acks["items"][0]["overdue"], true);
    assert_eq!(acks["items"][1]["overdue"], false);
}

/// A webhook receiver on a loopback port that records each body.
struct Receiver {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Value>>>,
    server: tokio::task::JoinHandle<()>,
}

async fn record(State(bodies): State<Arc<Mutex<Vec<Value>>>>, body: Bytes) -> &'static str {
    bodies
        .lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
    "ok"
}

impl Receiver {
    async fn start() -> Receiver {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(axum::routing::post(record))
            .with_state(bodies.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            addr,
            bodies,
            server,
        }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn ack_hook(app: &TestApp, receiver: &Receiver) {
    webhooks::add(
        &app.pool,
        &in_team("acme"),
        NewWebhook {
            url: format!("http://{}/hook", receiver.addr),
            kind: WebhookKind::Generic,
            events: vec!["ack".into()],
            channels: vec![],
            allow_private: Some(PrivateTargets::grant(&test_authority()).unwrap()),
        },
    )
    .await
    .expect("add the webhook");
}

#[tokio::test]
async fn ack_overdue_reaches_a_receiver_once_per_message_and_agent_that_still_owes() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    app.agent("acme", "carol").await;
    let receiver = Receiver::start().await;
    ack_hook(&app, &receiver).await;

    let id = id_of(
        &alice
            .call(
                "post_message",
                json!({"channel": "ops", "body": "confirm the freeze", "ack_required": true,
                       "ack_within_seconds": 60}),
            )
            .await
            .unwrap(),
    );
    bob.call("ack_message", json!({"message_id": id}))
        .await
        .unwrap();
    make_overdue(&app.pool, &id).await;

    let bodies = eventually("ack.overdue delivered", || async {
        let bodies = receiver.bodies();
        (!bodies.is_empty()).then_some(bodies)
    })
    .await;
    let event = &bodies[0];
    assert_eq!(event["event"], "ack.overdue", "{event}");
    let data = &event["data"];
    assert_eq!(data["message_id"], id.as_str(), "{event}");
    assert_eq!(data["debtor"], "carol", "bob acked: only carol is reported");
    assert_eq!(data["channel"], "ops");
    assert_eq!(data["from"], "alice");
    assert!(data.get("body").is_none(), "never a body: {event}");

    // More passes (any replica's) find nothing left to fire.
    for _ in 0..3 {
        assert_eq!(
            ai_crew_sync::workers::ack_overdue::pass(&app.pool)
                .await
                .unwrap(),
            0
        );
    }
    let queued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_deliveries WHERE event = 'ack.overdue'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(queued, 1, "fired once");
    eventually("the delivery settled", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM webhook_deliveries WHERE state = 'delivered'",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap()
            == 1
    })
    .await;
    assert_eq!(receiver.bodies().len(), 1, "received once");
}

#[tokio::test]
async fn bad_requests_are_refused_with_their_limits_and_change_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;

    for (args, words) in [
        (
            json!({"to": "bob", "body": "x", "ack_required": true, "ack_within_seconds": 9}),
            "ack_within_seconds must be between 10 and 604800",
        ),
        (
            json!({"to": "bob", "body": "x", "ack_required": true, "ack_within_seconds": 604801}),
            "ack_within_seconds must be between 10 and 604800",
        ),
        (
            json!({"to": "bob", "body": "x", "ack_within_seconds": 60}),
            "ack_within_seconds applies only with ack_required",
        ),
    ] {
        let refused = alice.call("post_message", args.clone()).await.unwrap_err();
        assert_eq!(refused["error"], "invalid", "{args}: {refused}");
        assert!(message(&refused).contains(words), "{refused}");
    }
    assert_eq!(messages_stored(&app.pool).await, 0, "nothing was posted");

    let plain = id_of(
        &alice
            .call("post_message", json!({"to": "bob", "body": "fyi"}))
            .await
            .unwrap(),
    );
    let refused = bob
        .call("ack_message", json!({"message_id": plain}))
        .await
        .unwrap_err();
    assert!(
        message(&refused).contains("does not ask for an acknowledgement"),
        "{refused}"
    );
    let to_bob = id_of(
        &alice
            .call(
                "post_message",
                json!({"to": "bob", "body": "ack me", "ack_required": true}),
            )
            .await
            .unwrap(),
    );
    let refused = carol
        .call("ack_message", json!({"message_id": to_bob}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden", "{refused}");
    assert!(message(&refused).contains("not owed by you"), "{refused}");
    let refused = bob
        .call(
            "ack_message",
            json!({"message_id": to_bob, "note": "two\nlines"}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "invalid", "{refused}");
    assert_eq!(acks_stored(&app.pool).await, 0, "no ack recorded");

    for limit in [0, 101] {
        let refused = bob
            .call("list_owed", json!({"limit": limit}))
            .await
            .unwrap_err();
        assert!(
            message(&refused).contains("limit must be between 1 and 100"),
            "{refused}"
        );
    }
    assert_eq!(ids(&owed(&bob, json!({})).await["i_owe"]), [to_bob]);
}

#[tokio::test]
async fn the_stop_hook_and_session_start_name_the_acks_a_window_owes() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, _window) = proxy_window(&app, &alice, "cc-7", "cc-seven", config.path()).await;
    let id = id_of(
        &bob.call(
            "post_message",
            json!({"to": "alice/cc-seven", "body": "approve the schema change",
                   "ack_required": true, "ack_within_seconds": 600}),
        )
        .await
        .unwrap(),
    );

    let start = hook(
        config.path(),
        "session_start",
        payload("cc-7", "SessionStart", json!({"source": "startup"})),
    )
    .await;
    let context = crate::hooks::context_of(&start, "SessionStart");
    assert!(
        context.contains(&id)
            && context.contains("to acknowledge")
            && context.contains("ack_message"),
        "{context}"
    );

    make_overdue(&app.pool, &id).await;
    let stop = hook(
        config.path(),
        "stop",
        payload("cc-7", "Stop", json!({"stop_hook_active": false})),
    )
    .await;
    assert_eq!(stop.code, Some(0), "{stop:?}");
    let out: Value = serde_json::from_str(stop.stdout.trim()).unwrap();
    assert_eq!(out["decision"], "block", "{out}");
    let reason = out["reason"].as_str().unwrap();
    assert!(
        reason.contains(&id) && reason.contains("OVERDUE") && reason.contains("bob"),
        "{reason}"
    );
}

// Breakage: without the claim's `FOR UPDATE SKIP LOCKED` (or its mark), two
// passes at once each fire the same messages.
#[tokio::test]
async fn passes_on_several_replicas_at_once_fire_each_overdue_debt_once() {
    let app = spawn_app().await;
    let second = app.replica().spawn().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    app.agent("acme", "bob").await;
    app.agent("acme", "carol").await;
    let receiver = Receiver::start().await;
    ack_hook(&app, &receiver).await;
    const N: usize = 20;
    for i in 0..N {
        alice
            .call(
                "post_message",
                json!({"channel": "ops", "body": format!("ack {i}"), "ack_required": true,
                       "ack_within_seconds": 60}),
            )
            .await
            .unwrap();
    }
    // All due at once, while both replicas' workers and four more passes run.
    sqlx::query("UPDATE messages SET ack_due_at = now() - interval '1 second'")
        .execute(&app.pool)
        .await
        .unwrap();
    let pass = || ai_crew_sync::workers::ack_overdue::pass(&app.pool);
    let (a, b, c, d) = tokio::join!(pass(), pass(), pass(), pass());
    let by_passes = a.unwrap() + b.unwrap() + c.unwrap() + d.unwrap();
    assert!(by_passes <= 2 * N as u64, "{by_passes}");
    let queued = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM webhook_deliveries WHERE event = 'ack.overdue'",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap()
    };
    eventually("every debt queued", || async {
        queued().await == 2 * N as i64
    })
    .await;
    let unfired: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM messages WHERE ack_required AND ack_overdue_fired_at IS NULL",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(unfired, 0);
    assert_eq!(pass().await.unwrap(), 0);
    assert_eq!(queued().await, 2 * N as i64, "one per (message, debtor)");
    let delivered = eventually("all delivered", || async {
        let bodies = receiver.bodies();
        (bodies.len() >= 2 * N).then_some(bodies)
    })
    .await;
    let mut pairs: Vec<(String, String)> = delivered
        .iter()
        .map(|b| {
            (
                b["data"]["message_id"].as_str().unwrap().to_string(),
                b["data"]["debtor"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    pairs.sort();
    pairs.dedup();
    assert_eq!(pairs.len(), 2 * N, "each (message, debtor) once");
    drop(second);
}

#[tokio::test]
async fn an_ask_agent_answer_shows_that_it_asks_for_an_acknowledgement() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let asked = alice
        .call(
            "ask_agent",
            json!({"to": "bob", "question": "may I deploy?", "timeout_seconds": 1}),
        )
        .await
        .unwrap();
    let question = asked["question_message_id"].as_str().unwrap().to_string();
    bob.call(
        "post_message",
        json!({"to": "alice", "reply_to": question, "body": "yes, after the freeze",
               "ack_required": true, "ack_within_seconds": 300}),
    )
    .await
    .unwrap();
    let answered = alice
        .call(
            "ask_agent",
            json!({"to": "bob", "question": "may I deploy?", "resume_message_id": question,
                   "timeout_seconds": 5}),
        )
        .await
        .unwrap();
    assert_eq!(answered["answered"], true, "{answered}");
    assert_eq!(answered["answer_ack_required"], true, "{answered}");
    assert!(answered["answer_ack_due_at"].is_string(), "{answered}");
    assert_eq!(answered["answer_acked"], false, "{answered}");
}
