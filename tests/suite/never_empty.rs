//! Never silently empty (issue 38 item 4): every read answers where it read
//! up to and whether more exists; an empty answer says what it means; a
//! position the bus cannot answer for (ahead of the newest, behind what a
//! prune deleted) and a name that does not exist are refused, never
//! answered with an empty page; a body its backend lost is reported, never
//! dropped from the page.

use ai_crew_sync::store::identity::teams;
use ai_crew_sync::store::operations::retention::{self, PruneRequest};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::jetstream_bus::{Routed, body_stream, sequence};
use crate::support::nats::OwnedNats;
use crate::support::{McpClient, TestApp, eventually::eventually, in_team, spawn_app, test_actor};

fn message(refusal: &Value) -> &str {
    refusal["message"].as_str().unwrap_or_default()
}

fn note(answer: &Value) -> &str {
    answer["note"].as_str().unwrap_or_default()
}

fn count(answer: &Value, list: &str) -> usize {
    answer[list].as_array().map_or(usize::MAX, Vec::len)
}

/// Team `slug` with conversations on, and alice and bob (window `w1`).
async fn team(app: &TestApp, slug: &str) -> (McpClient, McpClient) {
    app.team(slug).await;
    teams::capability(&app.pool, slug, Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.mcp(&app.agent(slug, "alice").await, None).await;
    let bob = app.mcp(&app.agent(slug, "bob").await, Some("w1")).await;
    (alice, bob)
}

async fn post(client: &McpClient, channel: &str, body: &str) {
    client
        .call("post_message", json!({"channel": channel, "body": body}))
        .await
        .unwrap();
}

async fn read(client: &McpClient, args: Value) -> Result<Value, Value> {
    client.call("read_messages", args).await
}

fn bodies(page: &Value) -> Vec<&str> {
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn an_empty_read_says_nothing_after_the_position_it_read_up_to() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne1").await;
    post(&alice, "dev", "one").await;
    post(&alice, "dev", "two").await;

    let page = read(&bob, json!({"scope": "dev"})).await.unwrap();
    assert_eq!(bodies(&page), ["one", "two"]);
    assert_eq!(page["more"], false, "{page}");
    let up_to = page["read_up_to"].as_i64().expect("read_up_to");
    assert!(up_to >= 2, "{page}");
    assert!(page.get("note").is_none(), "a page with messages: {page}");

    let empty = read(&bob, json!({"scope": "dev"})).await.unwrap();
    assert_eq!(count(&empty, "messages"), 0, "{empty}");
    assert_eq!(empty["more"], false, "{empty}");
    assert_eq!(empty["read_up_to"], up_to, "the cursor, where it read past");
    assert!(
        note(&empty).contains(&format!("nothing in #dev after position {up_to}"))
            && note(&empty).contains("as of"),
        "{empty}"
    );

    // A channel that exists with nothing in it answers empty, and says so.
    alice
        .call("create_channel", json!({"name": "quiet"}))
        .await
        .unwrap();
    for only_new in [true, false] {
        let quiet = read(&bob, json!({"scope": "quiet", "only_new": only_new}))
            .await
            .unwrap();
        assert_eq!(count(&quiet, "messages"), 0, "{quiet}");
        assert_eq!(quiet["more"], false, "{quiet}");
        assert!(note(&quiet).contains("#quiet"), "{quiet}");
    }
}

#[tokio::test]
async fn a_channel_or_scope_that_does_not_exist_is_refused_not_answered_empty() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne2").await;
    post(&alice, "dev", "one").await;
    for scope in ["nope", "inbx"] {
        let refused = read(&bob, json!({"scope": scope})).await.unwrap_err();
        assert_eq!(refused["error"], "not_found", "{refused}");
        assert!(
            message(&refused).contains(&format!("no channel `{scope}`"))
                && message(&refused).contains("list_channels"),
            "{refused}"
        );
    }
}

#[tokio::test]
async fn a_position_ahead_of_the_newest_is_refused_and_one_at_it_reads_empty() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne3").await;
    post(&alice, "dev", "one").await;
    let newest = read(&bob, json!({"scope": "dev", "only_new": false}))
        .await
        .unwrap()["read_up_to"]
        .as_i64()
        .unwrap();

    let refused = read(&bob, json!({"scope": "dev", "after": newest + 100}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "invalid", "{refused}");
    let text = message(&refused);
    assert!(
        text.contains(&format!(
            "after {} is ahead of the newest position {newest}",
            newest + 100
        )) && text.contains("Start from the newest")
            && text.contains("omit `after`"),
        "{refused}"
    );

    let at_newest = read(&bob, json!({"scope": "dev", "after": newest}))
        .await
        .unwrap();
    assert_eq!(count(&at_newest, "messages"), 0);
    assert_eq!(at_newest["more"], false);
    assert_eq!(at_newest["read_up_to"], newest);
    assert!(
        note(&at_newest).contains(&format!("after position {newest}")),
        "{at_newest}"
    );
}

#[tokio::test]
async fn a_position_resumes_a_lost_place_without_moving_the_cursor() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne4").await;
    for body in ["one", "two", "three"] {
        post(&alice, "dev", body).await;
    }
    let first = read(&bob, json!({"scope": "dev", "after": 0, "limit": 2}))
        .await
        .unwrap();
    assert_eq!(bodies(&first), ["one", "two"]);
    assert_eq!(first["more"], true, "a full page: {first}");
    let rest = read(&bob, json!({"scope": "dev", "after": first["read_up_to"]}))
        .await
        .unwrap();
    assert_eq!(bodies(&rest), ["three"]);
    assert_eq!(rest["more"], false);
    // The cursor did not move: all three are still new.
    let new = read(&bob, json!({"scope": "dev"})).await.unwrap();
    assert_eq!(bodies(&new), ["one", "two", "three"]);
}

async fn prune(app: &TestApp, team: &str) -> Value {
    let request = PruneRequest {
        older_than_days: 30,
        audit_older_than_days: None,
        apply: true,
    };
    let pruned = retention::prune(
        &app.pool,
        &app.bus.backends,
        &in_team(team),
        &request,
        &|_| {},
    )
    .await
    .unwrap();
    serde_json::to_value(pruned).unwrap()
}

#[tokio::test]
async fn a_position_behind_what_a_prune_deleted_is_refused_and_the_oldest_kept_reads() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne5").await;
    post(&alice, "dev", "old one").await;
    post(&alice, "dev", "old two").await;
    // Bob's cursor on #elsewhere (made by a read before the post) holds
    // its message back from the prune.
    alice
        .call("create_channel", json!({"name": "elsewhere"}))
        .await
        .unwrap();
    read(&bob, json!({"scope": "elsewhere"})).await.unwrap();
    post(&alice, "elsewhere", "kept: bob has not read it").await;
    alice
        .call(
            "post_message",
            json!({"to": "bob", "body": "an old direct message"}),
        )
        .await
        .unwrap();
    // Bob reads his inbox and #dev: what he read may go.
    read(&bob, json!({"scope": "inbox"})).await.unwrap();
    let read_before = read(&bob, json!({"scope": "dev"})).await.unwrap();
    let pruned_through = read_before["read_up_to"].as_i64().unwrap();
    sqlx::query("UPDATE messages SET created_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    let pruned = prune(&app, "ne5").await;
    assert!(pruned["total_rows"].as_i64().unwrap() >= 3, "{pruned}");
    post(&alice, "dev", "new").await;

    let refused = read(&bob, json!({"scope": "dev", "after": 0}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "invalid", "{refused}");
    let text = message(&refused);
    assert!(
        text.contains("behind what retention pruned in #dev")
            && text.contains(&format!("up to position {pruned_through}"))
            && text.contains(&format!("pass after: {pruned_through}"))
            && text.contains(&format!("reads from position {}", pruned_through + 1)),
        "{refused}"
    );
    // So is `all`, which holds #dev.
    let refused = read(&bob, json!({"scope": "all", "after": 0}))
        .await
        .unwrap_err();
    assert!(
        message(&refused).contains("behind what retention pruned"),
        "{refused}"
    );

    // Direct messages keep a mark per recipient.
    let refused = read(&bob, json!({"scope": "inbox", "after": 0}))
        .await
        .unwrap_err();
    assert!(
        message(&refused).contains("behind what retention pruned in inbox"),
        "{refused}"
    );
    // From the oldest kept, the page is whole.
    let kept = read(&bob, json!({"scope": "dev", "after": pruned_through}))
        .await
        .unwrap();
    assert_eq!(bodies(&kept), ["new"]);
    // A channel the prune did not touch still reads from the start.
    let elsewhere = read(&bob, json!({"scope": "elsewhere", "after": 0}))
        .await
        .unwrap();
    assert_eq!(count(&elsewhere, "messages"), 1, "{elsewhere}");
}

// A read from a position passes the prune check, then waits for a slower
// writer's gap; meanwhile a prune deletes the page's first messages and
// raises the mark. The page it reads next would look whole while it is not:
// it is refused. Without the look after the page (in after.rs, the second
// `check_position` removed) the read answers ["slow", "fast"] as if the scope
// began there: this test fails.
#[tokio::test]
async fn a_prune_committed_while_a_read_waits_is_refused_not_answered_with_holes() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne9").await;
    post(&alice, "dev", "old one").await;
    post(&alice, "dev", "old two").await;
    // Bob read them: a prune may delete them.
    assert_eq!(
        bodies(&read(&bob, json!({"scope": "dev"})).await.unwrap()),
        ["old one", "old two"]
    );
    sqlx::query("UPDATE messages SET created_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    let (slow, _) =
        crate::parallel_posts::open_post(&app.pool, "ne9", "dev", "alice", "slow").await;
    post(&alice, "dev", "fast").await;

    let bob = std::sync::Arc::new(bob);
    let reader = bob.clone();
    let waiting =
        tokio::spawn(async move { read(&reader, json!({"scope": "dev", "after": 0})).await });
    eventually("the read waits for the slow writer", async || {
        crate::write_fence::waiting_on(&app.pool, true).await > 0
    })
    .await;
    let pruned = prune(&app, "ne9").await;
    assert!(pruned["total_rows"].as_i64().unwrap() >= 2, "{pruned}");
    slow.commit().await.unwrap();

    let refused = waiting.await.unwrap().unwrap_err();
    assert!(
        message(&refused).contains("behind what retention pruned in #dev"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_conversation_cursor_ahead_of_the_newest_seq_is_refused_and_an_empty_page_says_so() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne6").await;
    let talk = crate::inbox::open_conversation(&alice, &bob, "talk").await;
    let id = talk["id"].as_str().unwrap().to_string();
    alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": id, "body": "hello", "request_id": Uuid::new_v4()}),
        )
        .await
        .unwrap();

    let refused = bob
        .call(
            "read_conversation",
            json!({"conversation_id": id, "after_seq": 5}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "invalid", "{refused}");
    assert!(
        message(&refused).contains("after_seq 5 is ahead of the newest seq 1")
            && message(&refused).contains("Start from the newest"),
        "{refused}"
    );

    let page = bob
        .call("read_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    assert_eq!(count(&page, "messages"), 1);
    assert_eq!(
        (&page["more"], &page["last_seq"]),
        (&json!(false), &json!(1))
    );
    let empty = bob
        .call(
            "read_conversation",
            json!({"conversation_id": id, "after_seq": 1}),
        )
        .await
        .unwrap();
    assert_eq!(count(&empty, "messages"), 0);
    assert_eq!(empty["more"], false);
    assert_eq!(empty["next_after_seq"], 1);
    assert!(note(&empty).starts_with("nothing after seq 1"), "{empty}");

    // A conversation that does not exist is refused, not an empty page.
    let refused = bob
        .call(
            "read_conversation",
            json!({"conversation_id": Uuid::new_v4()}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "not_found", "{refused}");
}

#[tokio::test]
async fn a_recovery_cursor_ahead_of_the_newest_seq_is_refused_and_an_empty_page_says_so() {
    // recover_conversation_history pages with after_seq like read_conversation:
    // a cursor past the conversation's newest seq must be refused, not
    // answered with an empty page that looks like "nothing more".
    let app = spawn_app().await;
    let (alice, _bob) = team(&app, "ne6r").await;
    let carl_token = app.agent("ne6r", "carl").await;
    let carl = app.mcp(&carl_token, None).await;
    let w1 = carl
        .call("register_session", json!({"session": "w1"}))
        .await
        .unwrap();
    let carl_w1 = app.mcp(w1["credential"].as_str().unwrap(), None).await;
    let created = carl_w1
        .call(
            "create_conversation",
            json!({"title": "Lost", "private": true, "invite": ["alice"]}),
        )
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    alice
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": id, "body": "hello", "request_id": Uuid::new_v4()}),
        )
        .await
        .unwrap();
    carl.call("revoke_session", json!({"session": "w1"}))
        .await
        .unwrap();

    let refused = carl
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id, "after_seq": 5}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "invalid", "{refused}");
    assert!(
        message(&refused).contains("after_seq 5 is ahead of the newest seq 1"),
        "{refused}"
    );
    let page = carl
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id}),
        )
        .await
        .unwrap();
    assert_eq!(count(&page, "messages"), 1, "{page}");
    let empty = carl
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id, "after_seq": 1}),
        )
        .await
        .unwrap();
    assert_eq!(count(&empty, "messages"), 0);
    assert!(note(&empty).starts_with("nothing after seq 1"), "{empty}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_body_its_backend_lost_is_reported_on_the_page_not_dropped() {
    let server = OwnedNats::start();
    let app = TestApp::builder().broker_at(&server.url()).spawn().await;
    let t = Routed::new(&app, "ne7").await;
    let first = t.send("first").await;
    let gone = t.send("deleted from the stream").await;
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&[first, gone]).await;
    workers.stop().await;
    assert_eq!(t.release().await, 2);
    assert!(
        body_stream(&server.url(), t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[1]))
            .await
            .unwrap()
    );

    let page = eventually("the absence confirmed", async || {
        let page = t.read_as_bob().await;
        let shown = page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["message_id"] == gone.to_string() || m["id"] == gone.to_string())
            .cloned()
            .unwrap_or_default();
        (shown["unavailable"]["reason"] == "tombstoned").then_some(page)
    })
    .await;
    // Both slots are on the page: the lost body is explained, not dropped.
    assert_eq!(count(&page, "messages"), 2, "{page}");
    assert_eq!(page["more"], false, "{page}");
    let single = t
        .bob
        .call("get_conversation_message", json!({"message_id": gone}))
        .await
        .unwrap();
    assert!(single["body"].is_null(), "{single}");
    assert_eq!(single["unavailable"]["reason"], "tombstoned", "{single}");
}

#[tokio::test]
async fn reservations_of_an_agent_not_in_the_team_are_refused_and_none_held_says_so() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne8").await;
    alice
        .call("heartbeat", json!({"project": "web"}))
        .await
        .unwrap();
    let refused = alice
        .call("list_reservations", json!({"agent": "bobb"}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "not_found", "{refused}");
    assert!(message(&refused).contains("no agent `bobb`"), "{refused}");
    drop(bob);
    let none = alice
        .call("list_reservations", json!({"agent": "bob"}))
        .await
        .unwrap();
    assert_eq!(count(&none, "reservations"), 0);
    assert_eq!(none["more"], false);
    assert!(note(&none).contains("no live reservation"), "{none}");
    assert!(none["as_of"].is_string(), "{none}");
}

#[tokio::test]
async fn a_reservation_whose_pattern_cannot_be_read_is_reported_not_left_out() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app, "ne10").await;
    for client in [&alice, &bob] {
        client
            .call("heartbeat", json!({"project": "web"}))
            .await
            .unwrap();
    }
    alice
        .call(
            "reserve_paths",
            json!({"paths": ["src/**"], "exclusive": true, "reason": "refactor"}),
        )
        .await
        .unwrap();
    // A pattern stored under other glob rules: this server cannot parse it.
    sqlx::query("UPDATE path_reservations SET pattern = 'src/[' WHERE pattern = 'src/**'")
        .execute(&app.pool)
        .await
        .unwrap();

    let checked = bob
        .call("check_paths", json!({"paths": ["src/a.rs"]}))
        .await
        .unwrap();
    let unreadable = checked["unreadable"].as_array().expect("unreadable listed");
    assert_eq!(unreadable.len(), 1, "{checked}");
    assert_eq!(unreadable[0]["pattern"], "src/[", "{checked}");
    let listed = bob
        .call("list_reservations", json!({"path": "src/a.rs"}))
        .await
        .unwrap();
    assert_eq!(count(&listed, "reservations"), 1, "{listed}");
}

#[tokio::test]
async fn a_name_or_id_that_does_not_exist_is_refused_by_every_read_that_takes_one() {
    let app = spawn_app().await;
    let (alice, _bob) = team(&app, "ne11").await;
    let missing = Uuid::new_v4();
    let calls = [
        ("get_task", json!({"key": "no-such-task"}), "not_found"),
        ("list_tasks", json!({"status": "opne"}), "invalid"),
        ("get_attachment", json!({"id": missing}), "not_found"),
        (
            "get_conversation_message",
            json!({"message_id": missing}),
            "not_found",
        ),
        (
            "get_message_receipts",
            json!({"message_id": missing}),
            "not_found",
        ),
        (
            "read_conversation",
            json!({"conversation_id": missing}),
            "not_found",
        ),
        (
            "read_messages",
            json!({"scope": "no-such-channel"}),
            "not_found",
        ),
        ("list_reservations", json!({"agent": "nobody"}), "not_found"),
    ];
    for (tool, args, kind) in calls {
        let refused = alice.call(tool, args).await.unwrap_err();
        assert_eq!(refused["error"], kind, "{tool}: {refused}");
        assert!(message(&refused).len() > 20, "{tool} explains: {refused}");
    }
}

#[tokio::test]
async fn every_list_read_answers_as_of_more_and_a_note_when_it_is_empty() {
    let app = spawn_app().await;
    let (alice, _bob) = team(&app, "ne9").await;
    let reads = [
        ("list_channels", json!({}), "channels"),
        ("list_locks", json!({}), "locks"),
        ("list_tasks", json!({"status": "claimed"}), "tasks"),
        ("list_notes", json!({"scope": "nothing-here"}), "notes"),
        ("search_notes", json!({"query": "zebra"}), "results"),
        ("search_messages", json!({"query": "zebra"}), "messages"),
        ("list_projects", json!({}), "projects"),
        ("list_conversations", json!({}), "conversations"),
        ("fetch_conversation_inbox", json!({}), "deliveries"),
        ("list_sessions", json!({"role": "nobody"}), "sessions"),
    ];
    for (tool, args, list) in reads {
        let answer = alice.call(tool, args).await.unwrap();
        assert_eq!(count(&answer, list), 0, "{tool}: {answer}");
        assert_eq!(answer["more"], false, "{tool}: {answer}");
        assert!(answer["as_of"].is_string(), "{tool}: {answer}");
        assert!(
            note(&answer).contains("as of") && note(&answer).len() > 10,
            "{tool} says what its empty answer means: {answer}"
        );
    }
    // `get_note`'s documented `found: false` stays.
    let missing = alice
        .call("get_note", json!({"key": "nothing"}))
        .await
        .unwrap();
    assert_eq!(missing["found"], false, "{missing}");
}

/// The read tools, each of whose descriptions says what its empty answer
/// means (or that it refuses instead).
const READ_TOOLS: &[&str] = &[
    "read_messages",
    "search_messages",
    "list_channels",
    "wait_for_updates",
    "list_agents",
    "list_sessions",
    "get_note",
    "list_notes",
    "search_notes",
    "list_tasks",
    "get_task",
    "list_locks",
    "list_reservations",
    "check_paths",
    "list_projects",
    "list_conversations",
    "read_conversation",
    "get_conversation_message",
    "get_message_receipts",
    "fetch_conversation_inbox",
    "conversation_inbox_status",
    "wait_for_conversation_updates",
    "whoami",
    "pending_for_me",
    "team_digest",
    "get_attachment",
];

#[test]
fn every_read_tool_description_says_what_its_empty_answer_means() {
    let tools = ai_crew_sync::mcp::BusServer::tool_list();
    for name in READ_TOOLS {
        let tool = tools
            .iter()
            .find(|t| t.name == *name)
            .unwrap_or_else(|| panic!("{name} is a tool"));
        let description = tool.description.as_deref().unwrap_or_default();
        assert!(
            ["empty", "Empty", "refused", "found: false", "nothing"]
                .iter()
                .any(|word| description.contains(word)),
            "{name}'s description says nothing of an empty answer: {description}"
        );
    }
}
