//! A message read once (issue 36, item 5): a direct message to the bare
//! agent name is read once per agent, whichever window reads it (a window
//! opened later is not told about it again); one to a window stays that
//! window's; an `ask_agent` answer the call returned is read; hooks never
//! repeat what the window's model was already shown.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::hooks::{HookRun, context_of, hook, payload, proxy_window};
use ai_crew_sync::db;
use ai_crew_sync::store::operations::retention::{self, PruneRequest};

use crate::message_positions::migrator_up_to;
use crate::messaging::bodies;
use crate::proxy::{Driver, Machine, calls};
use crate::support::postgres::fresh_database_url;
use crate::support::{McpClient, TestApp, eventually, in_team, spawn_app};

/// A hook that had nothing to say: exit 0, nothing printed.
fn silent(run: &HookRun) {
    assert_eq!((run.code, run.stdout.as_str()), (Some(0), ""), "{run:?}");
}

/// bob answers the first question in his inbox, to `to`, once it is there.
async fn answer(bob: &McpClient, to: &str, body: &str) {
    let question = eventually("the question in bob's inbox", async || {
        let inbox = bob
            .call("read_messages", json!({"scope": "inbox"}))
            .await
            .unwrap();
        inbox["messages"]
            .as_array()
            .unwrap()
            .first()
            .map(|q| q["id"].clone())
    })
    .await;
    bob.call(
        "post_message",
        json!({"to": to, "reply_to": question, "body": body}),
    )
    .await
    .unwrap();
}

/// `asker` asks bob, who answers `body` to `to`: what ask_agent returned.
async fn ask_and_answer(asker: &McpClient, bob: &McpClient, to: &str, body: &str) -> Value {
    ask_and_answer_by(asker, (bob, "bob"), to, body).await
}

/// `asker` asks `answerer` (its client and name), who answers `body` to `to`.
async fn ask_and_answer_by(
    asker: &McpClient,
    (bob, name): (&McpClient, &str),
    to: &str,
    body: &str,
) -> Value {
    let asking = async {
        asker
            .call(
                "ask_agent",
                json!({"to": name, "question": "which?", "timeout_seconds": 30}),
            )
            .await
            .unwrap()
    };
    let (asked, ()) = tokio::join!(asking, answer(bob, to, body));
    asked
}

async fn inbox(client: &McpClient) -> Vec<String> {
    bodies(
        &client
            .call("read_messages", json!({"scope": "inbox"}))
            .await
            .unwrap(),
    )
}

/// What a window is told is unread: whoami's count, pending_for_me's count
/// and the bodies it previews.
async fn unread(client: &McpClient) -> (i64, i64, Vec<String>) {
    let me = client.call("whoami", json!({})).await.unwrap();
    let pending = client.call("pending_for_me", json!({})).await.unwrap();
    let previews = pending["direct_messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["preview"].as_str().unwrap().to_string())
        .collect();
    (
        me["unread_direct_messages"].as_i64().unwrap(),
        pending["unread_direct_messages"]["count"].as_i64().unwrap(),
        previews,
    )
}

async fn send(from: &McpClient, to: &str, body: &str) -> Value {
    from.call("post_message", json!({"to": to, "body": body}))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_dm_to_the_agent_read_by_one_window_is_read_for_every_window_of_it() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob_token = app.agent("acme", "bob").await;
    send(&alice, "bob", "to every bob window").await;
    send(&alice, "bob/w1", "to w1 only").await;
    alice
        .call(
            "post_message",
            json!({"channel": "general", "body": "hello all"}),
        )
        .await
        .unwrap();

    let w1 = app.mcp(&bob_token, Some("w1")).await;
    assert_eq!(
        unread(&w1).await,
        (
            2,
            2,
            vec!["to every bob window".into(), "to w1 only".into()]
        )
    );
    assert_eq!(inbox(&w1).await, ["to every bob window", "to w1 only"]);
    assert_eq!(unread(&w1).await, (0, 0, vec![]));

    // A window opened later: the DM to bob was read (by w1), and w1's own is
    // not w2's. Channel messages stay per window.
    let w2 = app.mcp(&bob_token, Some("w2")).await;
    assert_eq!(unread(&w2).await, (0, 0, vec![]));
    let all = w2.call("read_messages", json!({})).await.unwrap();
    assert_eq!(bodies(&all), ["hello all"], "{all}");
    // The latest page (not only_new) still shows it: read is not gone.
    let latest = w2
        .call(
            "read_messages",
            json!({"scope": "inbox", "only_new": false}),
        )
        .await
        .unwrap();
    assert_eq!(bodies(&latest), ["to every bob window"]);

    // Read by the later window this time: not unread for the first.
    send(&alice, "bob", "second to bob").await;
    send(&alice, "bob/w1", "second to w1").await;
    assert_eq!(unread(&w1).await.0, 2);
    assert_eq!(unread(&w2).await, (1, 1, vec!["second to bob".into()]));
    assert_eq!(inbox(&w2).await, ["second to bob"]);
    assert_eq!(unread(&w1).await, (1, 1, vec!["second to w1".into()]));
    // Reading every window's DMs does not read w1's own for it.
    let everyone = w2
        .call(
            "read_messages",
            json!({"scope": "inbox", "all_sessions": true}),
        )
        .await
        .unwrap();
    assert_eq!(bodies(&everyone), ["second to w1"], "{everyone}");
    assert_eq!(unread(&w1).await.0, 1, "a DM to w1 stays w1's to read");
    // Read through scope `all`, the same.
    send(&alice, "bob", "third to bob").await;
    let all = bodies(&w1.call("read_messages", json!({})).await.unwrap());
    assert!(all.contains(&"third to bob".to_string()), "{all:?}");
    assert!(
        !all.iter()
            .any(|b| b.starts_with("to every") || b.starts_with("second to bob")),
        "read by other windows already: {all:?}"
    );
    let w3 = app.mcp(&bob_token, Some("w3")).await;
    assert_eq!(unread(&w3).await, (0, 0, vec![]));
    assert!(inbox(&w2).await.is_empty());
    assert!(inbox(&w3).await.is_empty());
}

/// Many windows (and two reads of one window) reading the agent's DMs at
/// once, while they arrive: every message is handed out as new exactly
/// once, and none is left unread or passed over.
#[tokio::test]
async fn windows_reading_the_agents_dms_at_once_get_each_exactly_once() {
    const SENT: usize = 60;
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob_token = app.agent("acme", "bob").await;
    let w1 = Arc::new(app.mcp(&bob_token, Some("w1")).await);
    // Two reads of one window and scope at once too, between channel posts:
    // the agent's cursor and the window's move together or not at all.
    let readers = [
        (w1.clone(), "all"),
        (w1.clone(), "all"),
        (w1.clone(), "inbox"),
        (Arc::new(app.mcp(&bob_token, Some("w2")).await), "all"),
        (Arc::new(app.mcp(&bob_token, Some("w3")).await), "inbox"),
    ];
    let sent = Arc::new(AtomicBool::new(false));
    let mut reading = Vec::new();
    for (reader, scope) in readers {
        let sent = sent.clone();
        reading.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                // Whether every DM was sent before this read began.
                let all_sent = sent.load(Ordering::SeqCst);
                let page = reader
                    .call("read_messages", json!({"scope": scope, "limit": 3}))
                    .await
                    .unwrap();
                let page = bodies(&page);
                if page.is_empty() && all_sent {
                    return got;
                }
                if page.is_empty() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                // Channel posts are every window's: only DMs count here.
                got.extend(page.into_iter().filter(|b| b.starts_with("dm ")));
            }
        }));
    }
    for i in 0..SENT {
        send(&alice, "bob", &format!("dm {i}")).await;
        alice
            .call(
                "post_message",
                json!({"channel": "general", "body": format!("post {i}")}),
            )
            .await
            .unwrap();
    }
    sent.store(true, Ordering::SeqCst);
    let mut all = Vec::new();
    for r in reading {
        all.extend(r.await.unwrap());
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "handed out twice: {all:?}");
    assert_eq!(all.len(), SENT, "{all:?}");
    // And nothing is left unread for any window, a new one included.
    let w4 = app.mcp(&bob_token, Some("w4")).await;
    assert_eq!(unread(&w4).await, (0, 0, vec![]));
    assert_eq!(unread(&w1).await, (0, 0, vec![]));
}

#[tokio::test]
async fn an_ask_agent_answer_the_call_returned_is_read_for_the_asker() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let asker = app.mcp(&alice_token, Some("a1")).await;
    let sibling = app.mcp(&alice_token, Some("a2")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;

    for (to, body) in [("alice", "port 8787"), ("alice/a1", "branch fix-login")] {
        let asked = ask_and_answer(&asker, &bob, to, body).await;
        assert_eq!(asked["answer"], body, "{asked}");
        assert_eq!(unread(&asker).await, (0, 0, vec![]), "{to}");
        assert!(inbox(&asker).await.is_empty(), "{to}");
        assert_eq!(unread(&sibling).await, (0, 0, vec![]), "{to}");
    }

    // An answer that came after the call gave up was not returned: unread,
    // until a resumed call returns it.
    let asked = asker
        .call(
            "ask_agent",
            json!({"to": "bob", "question": "late?", "timeout_seconds": 1}),
        )
        .await
        .unwrap();
    assert_eq!(asked["answered"], false, "{asked}");
    answer(&bob, "alice/a1", "late answer").await;
    assert_eq!(unread(&asker).await, (1, 1, vec!["late answer".into()]));
    let resumed = asker
        .call(
            "ask_agent",
            json!({"to": "bob", "question": "late?", "timeout_seconds": 5,
                   "resume_message_id": asked["question_message_id"]}),
        )
        .await
        .unwrap();
    assert_eq!(resumed["answer"], "late answer", "{resumed}");
    assert_eq!(unread(&asker).await, (0, 0, vec![]));
    assert!(inbox(&asker).await.is_empty());
}

#[tokio::test]
async fn hooks_do_not_repeat_what_the_window_was_shown_or_another_window_read() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let config = tempfile::tempdir().unwrap();
    let (_, one) = proxy_window(&app, &alice, "cc-a", "cc-a", config.path()).await;
    let start = |host: &str| payload(host, "SessionStart", json!({"source": "startup"}));
    let prompt = |host: &str| payload(host, "UserPromptSubmit", json!({"prompt": "go on"}));

    send(&bob, "alice", "the build is green").await;
    send(&bob, "alice/cc-a", "only for cc-a").await;
    let first = context_of(
        &hook(config.path(), "session_start", start("cc-a")).await,
        "SessionStart",
    );
    assert!(
        first.contains("the build is green") && first.contains("only for cc-a"),
        "{first}"
    );
    // The same window starts again (resume, compact): nothing repeated.
    let again = hook(config.path(), "session_start", start("cc-a")).await;
    silent(&again);

    // cc-a reads its inbox; a new conversation's window is not told about
    // the DM to alice again.
    assert_eq!(inbox(&one).await, ["the build is green", "only for cc-a"]);
    let (_, two) = proxy_window(&app, &alice, "cc-b", "cc-b", config.path()).await;
    let quiet = hook(config.path(), "session_start", start("cc-b")).await;
    silent(&quiet);

    // An ask_agent answer the call returned is no news for the next hook.
    let asked = ask_and_answer(&two, &bob, "alice", "ship it").await;
    assert_eq!(asked["answer"], "ship it");
    for host in ["cc-a", "cc-b"] {
        let after = hook(config.path(), "user_prompt", prompt(host)).await;
        silent(&after);
    }

    // Something new is still news, once, with the count the bus gives.
    send(&bob, "alice", "new after all that").await;
    let news = context_of(
        &hook(config.path(), "user_prompt", prompt("cc-b")).await,
        "UserPromptSubmit",
    );
    assert!(
        news.contains("new after all that") && news.contains("(1 unread direct message(s))"),
        "{news}"
    );
    let again = hook(config.path(), "session_start", start("cc-b")).await;
    silent(&again);
}

/// Through the real `mcp proxy` (one window per host conversation): a new
/// conversation is not told about a DM another conversation read, nor about
/// the answer its own ask_agent returned.
#[tokio::test]
async fn a_new_host_conversation_is_not_told_about_what_another_read() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let instructions = |lines: &[Value]| {
        let init = lines.iter().find(|l| l["step"] == "initialize").unwrap();
        init["instructions"].as_str().unwrap().to_string()
    };
    let read_inbox =
        json!({"op": "call", "tool": "read_messages", "arguments": {"scope": "inbox"}});
    send(&bob, "alice", "the release is tagged").await;

    let a = machine
        .drive(&["--host-session", "a"], json!([read_inbox]))
        .await;
    assert!(
        instructions(&a).contains("Unread direct messages: 1"),
        "{a:#?}"
    );
    let got = &calls(&a)[0]["structured"];
    assert_eq!(bodies(got), ["the release is tagged"], "{got}");

    // Another conversation, opened after: nothing unread, nothing new; it
    // asks bob, and gets the answer from the call.
    let script = machine.script(
        &["--host-session", "b"],
        json!([read_inbox, {"op": "call", "tool": "ask_agent",
               "arguments": {"to": "bob", "question": "ready?", "timeout_seconds": 30}}]),
    );
    let b = Driver::start(&script);
    answer(&bob, "alice", "ready").await;
    let b = b.rest().await;
    assert!(
        instructions(&b).contains("Unread direct messages: 0"),
        "{b:#?}"
    );
    let b_calls = calls(&b);
    assert!(bodies(&b_calls[0]["structured"]).is_empty(), "{b:#?}");
    assert_eq!(b_calls[1]["structured"]["answer"], "ready", "{b:#?}");

    let c = machine
        .drive(&["--host-session", "c"], json!([read_inbox]))
        .await;
    assert!(
        instructions(&c).contains("Unread direct messages: 0"),
        "{c:#?}"
    );
    assert!(bodies(&calls(&c)[0]["structured"]).is_empty(), "{c:#?}");
}

/// Migration 0041 on a database from before it: what any window of an agent
/// had read of the DMs to the agent is read for all its windows.
#[tokio::test]
async fn migration_0041_counts_what_a_window_read_for_the_agent() {
    let url = fresh_database_url().await;
    let pool = db::connect(&url, 4).await.unwrap();
    migrator_up_to(40).run(&pool).await.unwrap();
    let before = TestApp::builder()
        .database(pool.clone(), url.clone())
        .spawn()
        .await;
    before.team("acme").await;
    before.agent("acme", "alice").await;
    let bob_token = before.agent("acme", "bob").await;
    drop(before);
    // Three DMs to bob, then one to bob/w1; window w1 had read the first two.
    for (body, window) in [
        ("dm 1", None),
        ("dm 2", None),
        ("dm 3", None),
        ("to w1", Some("w1")),
    ] {
        sqlx::query(
            "INSERT INTO messages (id, team_id, position, recipient_id, recipient_session,
                                   sender_id, sender_session, body)
             SELECT gen_random_uuid(), t.id, nextval(message_position_sequence(t.id)::regclass),
                    b.id, $2, a.id, '', $1
             FROM teams t JOIN agents a ON a.team_id = t.id AND a.name = 'alice'
                          JOIN agents b ON b.team_id = t.id AND b.name = 'bob'",
        )
        .bind(body)
        .bind(window)
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO read_cursors (team_id, agent_id, session, scope, last_position)
         SELECT b.team_id, b.id, 'w1', 'inbox', m.position
         FROM agents b JOIN messages m ON m.team_id = b.team_id AND m.body = 'dm 2'
         WHERE b.name = 'bob'",
    )
    .execute(&pool)
    .await
    .unwrap();

    db::migrator().run(&pool).await.unwrap();
    let app = TestApp::builder()
        .database(pool.clone(), url.clone())
        .spawn()
        .await;
    let w2 = app.mcp(&bob_token, Some("w2")).await;
    assert_eq!(unread(&w2).await, (1, 1, vec!["dm 3".into()]));
    assert_eq!(inbox(&w2).await, ["dm 3"]);
    let w1 = app.mcp(&bob_token, Some("w1")).await;
    assert_eq!(unread(&w1).await, (1, 1, vec!["to w1".into()]));
}

/// `team prune`: a DM to the agent that one window read is read, whatever a
/// window that did not read it has as a cursor; one to a window waits for
/// that window, and an ask_agent answer the call returned is read.
#[tokio::test]
async fn a_prune_takes_a_dm_to_the_agent_that_any_window_read() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob_token = app.agent("acme", "bob").await;
    // w2 read its inbox once, before anything came: its cursor is behind.
    let w2 = app.mcp(&bob_token, Some("w2")).await;
    assert!(inbox(&w2).await.is_empty());
    send(&alice, "bob", "read by w1").await;
    send(&alice, "bob/w2", "for w2, unread").await;
    let w1 = app.mcp(&bob_token, Some("w1")).await;
    assert_eq!(inbox(&w1).await, ["read by w1"]);
    send(&alice, "bob", "nobody read this").await;
    let asker = app.mcp(&bob_token, Some("w3")).await;
    let asked = ask_and_answer_by(&asker, (&alice, "alice"), "bob", "an answer received").await;
    assert_eq!(asked["answer"], "an answer received");
    sqlx::query("UPDATE messages SET created_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();

    let request = PruneRequest {
        older_than_days: 30,
        audit_older_than_days: None,
        apply: true,
    };
    retention::prune(
        &app.pool,
        &app.bus.backends,
        &in_team("acme"),
        &request,
        &|_| {},
    )
    .await
    .unwrap();
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT body FROM messages WHERE recipient_id IS NOT NULL ORDER BY position",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(left, ["for w2, unread", "nobody read this"]);
}
