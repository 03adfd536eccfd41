//! What webhooks refuse and keep back: a hook without `allow_private` never
//! connects to a private address (even one a name resolves to only at send
//! time), a generic delivery is signed over its exact bytes, direct
//! messages, conversation bodies, private conversations and note values
//! never reach a receiver, and a URL that is not http(s), private, carries
//! credentials or names an unknown event is refused with nothing written.

use std::collections::BTreeSet;

use ai_crew_sync::store::identity::teams;
use ai_crew_sync::store::operations::webhooks::{self, NewWebhook};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use uuid::Uuid;

use super::{Receiver, Request, add, call, deliveries, eventually, hook, in_state, post};
use crate::support::{McpClient, TestApp, free_port, in_team, spawn_app, test_actor};

/// A name that resolved to a public address at `add` and resolves to
/// loopback now (DNS rebinding) is refused at send time: here the hooks are
/// added with `allow_private` and the flag is then cleared underneath them.
#[tokio::test]
async fn a_hook_without_allow_private_never_connects_to_a_private_address() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    let port = receiver.addr.port();
    for url in [
        format!("http://localhost:{port}/by-name"),
        format!("http://127.0.0.1:{port}/by-address"),
        // 127.0.0.1 inside IPv6: judged as the IPv4 address it carries.
        format!("http://[64:ff9b::7f00:1]:{port}/nat64"),
        format!("http://[::ffff:127.0.0.1]:{port}/mapped"),
    ] {
        add(&app, "acme", hook(&url, &["message"])).await;
    }
    sqlx::query("UPDATE webhooks SET allow_private = false")
        .execute(&app.pool)
        .await
        .unwrap();
    post(&app.mcp(&token, None).await, "general", "stay inside").await;

    eventually("every delivery failed", || async {
        in_state(&app, "failed").await == 4
    })
    .await;
    assert!(receiver.requests().is_empty(), "nothing was sent");
    for row in deliveries(&app).await {
        let error = row.last_error.unwrap();
        assert_eq!(row.attempts, 1, "refused at once, not retried: {error}");
        assert!(
            error.contains("--allow-private") && error.contains("127.0.0.1"),
            "{error}"
        );
    }
}

/// The signature covers `X-Bus-Timestamp` and the exact body, as docs/dashboard-and-webhooks.md
/// tells a receiver to check it: a captured delivery sent again with a fresh
/// timestamp no longer verifies, so a receiver that refuses stale
/// timestamps refuses the replay.
#[tokio::test]
async fn generic_deliveries_are_signed_over_the_timestamp_and_the_exact_body() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let receiver = Receiver::start().await;
    let created = add(&app, "acme", hook(&receiver.url(), &["message"])).await;
    assert!(created.secret.starts_with("whsec_"), "{}", created.secret);
    let alice = app.mcp(&token, None).await;
    post(&alice, "general", "sign me").await;

    eventually("one request", || async { receiver.requests().len() == 1 }).await;
    let request = &receiver.requests()[0];
    // The recipe in docs/dashboard-and-webhooks.md: HMAC-SHA256 of "<X-Bus-Timestamp>.<raw body>".
    let verify = |timestamp: &str, body: &[u8]| {
        let mut mac = Hmac::<Sha256>::new_from_slice(created.secret.as_bytes()).unwrap();
        mac.update(timestamp.as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    };
    let timestamp = request.header("x-bus-timestamp");
    let seconds: i64 = timestamp
        .parse()
        .unwrap_or_else(|_| panic!("X-Bus-Timestamp is unix seconds: {timestamp:?}"));
    assert_eq!(
        request.header("x-bus-signature"),
        verify(timestamp, &request.body)
    );
    assert_ne!(
        request.header("x-bus-signature"),
        verify(&(seconds + 600).to_string(), &request.body),
        "a replay under a later timestamp does not verify"
    );
    let mut tampered = request.body.to_vec();
    tampered.push(b' ');
    assert_ne!(
        request.header("x-bus-signature"),
        verify(timestamp, &tampered),
        "the signature covers the exact bytes"
    );

    let body = request.json();
    assert_eq!(
        body["id"].as_str().unwrap(),
        request.header("x-bus-delivery")
    );
    assert_eq!(body["event"], "message.posted");
    assert_eq!(request.header("x-bus-event"), "message.posted");
    assert_eq!(body["team"], "acme");
    assert_eq!(body["webhook_id"], json!(created.webhook.id));
    assert_eq!(body["data"]["channel"], "general");
    assert_eq!(body["data"]["sender"], "alice");
    assert_eq!(body["data"]["body"], "sign me");
    assert!(body["occurred_at"].is_string());
}

fn conversation_id(created: &Value) -> String {
    created["conversation"]["id"]
        .as_str()
        .or(created["id"].as_str())
        .unwrap_or_else(|| panic!("a conversation id in {created}"))
        .to_owned()
}

async fn say(client: &McpClient, conversation: &str, body: &str) {
    let args = json!({"conversation_id": conversation, "body": body,
                      "request_id": Uuid::new_v4().to_string()});
    call(client, "send_conversation_message", args).await;
}

/// Team `acme` with conversations on, and tokens of its agents alice and bob.
async fn acme_with_conversations() -> (TestApp, String, String) {
    let app = spawn_app().await;
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice_token = app.agent("acme", "alice").await;
    let bob_token = app.agent("acme", "bob").await;
    (app, alice_token, bob_token)
}

#[tokio::test]
async fn direct_messages_and_conversation_bodies_never_reach_the_receiver() {
    let (app, alice_token, bob_token) = acme_with_conversations().await;
    let receiver = Receiver::start().await;
    add(&app, "acme", hook(&receiver.url(), &[])).await;
    let alice = app.mcp(&alice_token, None).await;
    let bob = app.mcp(&bob_token, None).await;

    call(
        &alice,
        "post_message",
        json!({"to": "bob", "body": "DM-SECRET-7731"}),
    )
    .await;
    call(&alice, "create_project", json!({"project": "web"})).await;
    let grant = json!({"project": "web", "agent": "bob"});
    call(&alice, "grant_project_access", grant).await;
    let project = json!({"title": "release plan", "project": "web", "invite": ["bob"]});
    let project_conv = conversation_id(&call(&alice, "create_conversation", project).await);
    let join = json!({"conversation_id": project_conv});
    call(&bob, "join_conversation", join).await;
    say(&alice, &project_conv, "CONV-BODY-4410").await;
    let private = json!({"title": "PRIVATE-TITLE-9902", "private": true});
    let private_conv = conversation_id(&call(&alice, "create_conversation", private).await);
    say(&alice, &private_conv, "PRIVATE-BODY-5521").await;
    let note = json!({"key": "deploy", "value": "NOTE-VALUE-8812"});
    call(&alice, "set_note", note).await;
    call(
        &alice,
        "create_task",
        json!({"key": "ship", "title": "ship it"}),
    )
    .await;
    call(&alice, "claim_task", json!({"key": "ship"})).await;
    call(&alice, "acquire_lock", json!({"name": "deploy"})).await;
    call(&alice, "release_lock", json!({"name": "deploy"})).await;
    let announcement = json!({"channel": "general", "body": "freeze at 5", "announce": true});
    call(&alice, "post_message", announcement).await;
    post(&alice, "general", "the last event").await;

    // Triggers enqueue at commit: every row exists now; wait until all are sent.
    eventually("every delivery sent", || async {
        let rows = deliveries(&app).await;
        !rows.is_empty() && rows.iter().all(|r| r.state == "delivered")
    })
    .await;
    let received = receiver.requests();
    let events: BTreeSet<String> = received
        .iter()
        .map(|r| r.json()["event"].as_str().unwrap().to_owned())
        .collect();
    for expected in [
        "message.posted",
        "announcement.posted",
        "task.created",
        "task.claimed",
        "lock.acquired",
        "lock.released",
        "note.set",
        "conversation.created",
        "conversation.member_joined",
        "conversation.message_sent",
    ] {
        assert!(
            events.contains(expected),
            "{expected} missing from {events:?}"
        );
    }
    let everything: String = received
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    for secret in [
        "DM-SECRET-7731",
        "CONV-BODY-4410",
        "PRIVATE-BODY-5521",
        "PRIVATE-TITLE-9902",
        "NOTE-VALUE-8812",
        private_conv.as_str(),
    ] {
        assert!(
            !everything.contains(secret),
            "{secret} reached the receiver: {everything}"
        );
    }
    let sent = received
        .iter()
        .map(Request::json)
        .find(|b| b["event"] == "conversation.message_sent")
        .unwrap();
    assert_eq!(sent["data"]["conversation_id"], json!(project_conv));
    assert_eq!(sent["data"]["title"], "release plan");
    assert_eq!(sent["data"]["sender"], "alice");
    assert_eq!(sent["data"]["seq"], 1);
    let messages = received
        .iter()
        .filter(|r| r.json()["event"] == "message.posted")
        .count();
    assert_eq!(messages, 1, "the DM is not a channel message");
}

#[tokio::test]
async fn urls_are_validated_and_a_refusal_writes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let refusal = |new: NewWebhook| {
        let pool = app.pool.clone();
        async move {
            webhooks::add(&pool, &in_team("acme"), new)
                .await
                .expect_err("refused")
                .to_string()
        }
    };
    let ftp = refusal(hook("ftp://example.com/hook", &[])).await;
    assert!(ftp.contains("only http and https"), "{ftp}");
    let loopback = refusal(NewWebhook {
        allow_private: None,
        ..hook("http://127.0.0.1:9/hook", &[])
    })
    .await;
    assert!(
        loopback.contains("127.0.0.1") && loopback.contains("--allow-private"),
        "{loopback}"
    );
    let localhost = refusal(NewWebhook {
        allow_private: None,
        ..hook("http://localhost:9/hook", &[])
    })
    .await;
    assert!(localhost.contains("loopback"), "{localhost}");
    let metadata = refusal(NewWebhook {
        allow_private: None,
        ..hook("http://[64:ff9b::a9fe:a9fe]/latest/meta-data", &[])
    })
    .await;
    assert!(
        metadata.contains("NAT64 form of 169.254.169.254") && metadata.contains("--allow-private"),
        "{metadata}"
    );
    let benchmarking = refusal(NewWebhook {
        allow_private: None,
        ..hook("http://198.18.0.1/hook", &[])
    })
    .await;
    assert!(benchmarking.contains("benchmarking"), "{benchmarking}");
    let credentials = refusal(hook("https://user:pw@example.com/hook", &[])).await;
    assert!(
        credentials.contains("user name or password"),
        "{credentials}"
    );
    let event = refusal(hook("http://127.0.0.1:9/hook", &["messages"])).await;
    assert!(event.contains("message, announcement"), "{event}");

    let (hooks, audits): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhooks),
                (SELECT count(*) FROM audit_log WHERE action LIKE 'webhook.%')",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((hooks, audits), (0, 0), "a refused add writes nothing");
}

/// reqwest's error text names the URL it was sending to, and a hook's URL
/// may carry the receiver's secret in its path (Slack's and Discord's do):
/// a delivery that cannot connect records (and logs: the log line carries
/// the same text) why, without the URL.
#[tokio::test]
async fn an_unreachable_receiver_is_recorded_without_the_hooks_url() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/services/T0/B0/s3cr3t-path-token?key=q-s3cr3t");
    add(&app, "acme", hook(&url, &["message"])).await;
    post(&app.mcp(&token, None).await, "general", "nobody listens").await;

    eventually("the delivery gave up", || async {
        in_state(&app, "failed").await == 1
    })
    .await;
    let listed = webhooks::list(&app.pool, &in_team("acme")).await.unwrap();
    let error = listed[0].failures[0].last_error.clone().unwrap();
    assert!(error.starts_with("could not reach the receiver"), "{error}");
    assert!(
        !error.contains("s3cr3t"),
        "the URL is never in the error: {error}"
    );
}

/// Migration 0028 cleans what older builds left: a receiver's body after its
/// status and the hook's URL in recorded errors, and `allow_private` on a
/// hook a credential confined to a team added.
#[tokio::test]
async fn migration_0028_scrubs_recorded_errors_and_a_confined_credentials_allow_private() {
    use ai_crew_sync::db;
    let url = crate::support::postgres::fresh_database_url().await;
    let pool = db::connect(&url, 2).await.unwrap();
    let mut before = db::migrator();
    before.migrations.to_mut().retain(|m| m.version < 28);
    before.run(&pool).await.unwrap();
    let hook = "http://127.0.0.1:9/services/T0/B0/s3cr3t";
    sqlx::query(
        "WITH t AS (INSERT INTO teams (id, slug, name) VALUES (gen_random_uuid(), 'acme', 'Acme')
                    RETURNING id),
              w AS (INSERT INTO webhooks (id, team_id, url, kind, events, secret, created_by)
                    SELECT gen_random_uuid(), t.id, $1, 'generic', ARRAY['message'],
                           repeat('k', 40), 'test' FROM t RETURNING id, team_id)
         INSERT INTO webhook_deliveries (team_id, webhook_id, event, payload, state, last_error)
         SELECT w.team_id, w.id, 'message.posted', '{}', 'failed', e.error
           FROM w, (VALUES ('the receiver answered 404 Not Found: instance-id: i-0s3cr3t'),
                           ('the receiver answered 302 Found (redirects are not followed; give \
                             the final URL): <html>s3cr3t</html>'),
                           ('could not reach the receiver: error sending request for url (' || $1
                            || '): client error (Connect): tcp connect error: Connection refused'))
                    AS e (error)",
    )
    .bind(hook)
    .execute(&pool)
    .await
    .unwrap();
    // Hooks with allow_private added by a credential confined to the team
    // and by a global one.
    sqlx::query(
        "WITH c AS (INSERT INTO admin_credentials (id, team_id, secret_sha256, display_prefix,
                                                   created_by)
                    SELECT gen_random_uuid(), CASE WHEN p = 'acsa_team0001' THEN t.id END,
                           sha256(p::bytea), p, 'test'
                      FROM teams t, unnest(ARRAY['acsa_team0001', 'acsa_glob0001']) AS p
                    RETURNING team_id, display_prefix)
         INSERT INTO webhooks (id, team_id, url, kind, events, secret, allow_private, created_by)
         SELECT gen_random_uuid(), t.id, $1, 'generic', ARRAY['task'], repeat('k', 40), true,
                'admin:' || c.display_prefix
           FROM teams t, c",
    )
    .bind(hook)
    .execute(&pool)
    .await
    .unwrap();

    db::migrator().run(&pool).await.unwrap();
    let private: Vec<(String, bool)> = sqlx::query_as(
        "SELECT created_by, allow_private FROM webhooks WHERE created_by LIKE 'admin:%'
          ORDER BY created_by",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        private,
        [
            ("admin:acsa_glob0001".to_owned(), true),
            ("admin:acsa_team0001".to_owned(), false),
        ],
        "a confined credential's hook loses allow_private; a global one's keeps it"
    );
    let errors: Vec<String> =
        sqlx::query_scalar("SELECT last_error FROM webhook_deliveries ORDER BY last_error")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        errors,
        [
            "could not reach the receiver: error sending request: client error (Connect): tcp \
             connect error: Connection refused",
            "the receiver answered 302 Found (redirects are not followed; give the final URL)",
            "the receiver answered 404 Not Found",
        ]
    );
    pool.close().await;
}

/// A conversation send queues `conversation.message_sent` itself (migration
/// 0037; a row trigger did before): one delivery per hook subscribed to
/// conversations, from a project conversation only, a reply included, and
/// nothing for a hook of other events or for a private conversation.
#[tokio::test]
async fn a_conversation_send_queues_its_event_for_subscribed_hooks_only() {
    let (app, alice_token, bob_token) = acme_with_conversations().await;
    // Never delivered (nothing listens there): only the queued rows matter.
    let subscribed = add(
        &app,
        "acme",
        hook("http://127.0.0.1:9/c", &["conversation"]),
    )
    .await;
    add(&app, "acme", hook("http://127.0.0.1:9/m", &["message"])).await;
    let alice = app.mcp(&alice_token, None).await;
    let bob = app.mcp(&bob_token, None).await;
    call(&alice, "create_project", json!({"project": "web"})).await;
    let grant = json!({"project": "web", "agent": "bob"});
    call(&alice, "grant_project_access", grant).await;
    let project = json!({"title": "release plan", "project": "web", "invite": ["bob"]});
    let project_conv = conversation_id(&call(&alice, "create_conversation", project).await);
    call(
        &bob,
        "join_conversation",
        json!({"conversation_id": project_conv}),
    )
    .await;
    let private = json!({"title": "side chat", "private": true, "invite": ["bob"]});
    let private_conv = conversation_id(&call(&alice, "create_conversation", private).await);
    say(&alice, &private_conv, "not for hooks").await;
    let first = call(
        &alice,
        "send_conversation_message",
        json!({"conversation_id": project_conv, "body": "first",
               "request_id": Uuid::new_v4().to_string()}),
    )
    .await;
    let reply = json!({"conversation_id": project_conv, "body": "second",
                       "request_id": Uuid::new_v4().to_string(),
                       "reply_to": first["message_id"]});
    call(&bob, "send_conversation_message", reply).await;

    let queued: Vec<(Uuid, Value)> = sqlx::query_as(
        "SELECT webhook_id, payload FROM webhook_deliveries
         WHERE event = 'conversation.message_sent' ORDER BY payload->>'seq'",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(queued.len(), 2, "{queued:?}");
    for (seq, ((webhook, data), sender)) in queued.iter().zip(["alice", "bob"]).enumerate() {
        assert_eq!(*webhook, subscribed.webhook.id);
        assert_eq!(data["conversation_id"], json!(project_conv));
        assert_eq!(data["title"], "release plan");
        assert_eq!(data["project"], "web");
        assert_eq!(data["seq"], seq + 1);
        assert_eq!(data["sender"], sender);
    }
    assert_eq!(queued[0].1["message_id"], first["message_id"]);
}
