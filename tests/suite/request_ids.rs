//! Retries that never double (issue 38, item 2): a write tool called again
//! with the same `request_id` from the same window answers what the first
//! call answered (`replayed: true`) and changes nothing; other arguments or
//! another tool under the same id are refused naming the first call; another
//! window's id is its own; a refused call records nothing; ids older than
//! 24 h are pruned and a retry after that runs anew.

use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, spawn_app};
use ai_crew_sync::store::requests;

const ID: &str = "6f1c2b7e-3d4a-4b5c-8d9e-0a1b2c3d4e5f";

/// `answer` without the `replayed` mark, to compare with the first answer.
fn unmarked(answer: &Value) -> Value {
    let mut answer = answer.clone();
    answer.as_object_mut().unwrap().remove("replayed");
    answer
}

/// The retry answered the first call's answer, marked replayed.
fn assert_replayed(first: &Value, retry: &Value) {
    assert_eq!(retry["replayed"], true, "{retry}");
    assert!(first.get("replayed").is_none(), "{first}");
    assert_eq!(&unmarked(retry), first);
}

/// Team `acme`, agent alice in window w1, agent bob reading.
async fn alice_and_bob(app: &TestApp) -> (McpClient, McpClient) {
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    (
        app.mcp(&alice, Some("w1")).await,
        app.mcp(&bob, Some("b1")).await,
    )
}

/// Every message bob can read in `#general`, as a user would list them.
async fn bodies(bob: &McpClient) -> Vec<String> {
    let read = bob
        .call(
            "read_messages",
            json!({"scope": "general", "only_new": false, "limit": 200}),
        )
        .await
        .unwrap();
    read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_string())
        .collect()
}

fn post(body: &str) -> Value {
    json!({"channel": "general", "body": body, "request_id": ID})
}

#[tokio::test]
async fn a_retried_post_answers_the_first_message_and_posts_once() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    let first = alice
        .call("post_message", post("deploy done"))
        .await
        .unwrap();
    let retry = alice
        .call("post_message", post("deploy done"))
        .await
        .unwrap();
    assert_replayed(&first, &retry);
    assert_eq!(bodies(&bob).await, ["deploy done"]);

    // Keys in another order are the same call.
    let reordered = json!({"request_id": ID, "body": "deploy done", "channel": "general"});
    let again = alice.call("post_message", reordered).await.unwrap();
    assert_replayed(&first, &again);
    assert_eq!(bodies(&bob).await, ["deploy done"]);
}

#[tokio::test]
async fn the_same_id_with_other_arguments_or_another_tool_is_refused_naming_the_first_call() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    alice.call("post_message", post("first")).await.unwrap();

    let other = alice
        .call("post_message", post("second"))
        .await
        .unwrap_err();
    assert_eq!(other["error"], "conflict", "{other}");
    let text = other["message"].as_str().unwrap();
    assert!(
        text.contains(ID) && text.contains("for post_message") && text.contains("other arguments"),
        "{text}"
    );
    assert!(text.contains("new request_id"), "{text}");

    let note = json!({"key": "k", "value": "v", "request_id": ID});
    let tool = alice.call("set_note", note).await.unwrap_err();
    assert_eq!(tool["error"], "conflict", "{tool}");
    let text = tool["message"].as_str().unwrap();
    assert!(
        text.contains("for post_message") && text.contains("a call of set_note"),
        "{text}"
    );

    assert_eq!(bodies(&bob).await, ["first"]);
    let note = alice.call("get_note", json!({"key": "k"})).await.unwrap();
    assert_eq!(note["found"], false, "the refused set_note wrote nothing");
}

#[tokio::test]
async fn another_window_with_the_same_id_makes_its_own_call() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    let token = app.agent("acme", "carol").await;
    let w2 = app.mcp(&token, Some("w2")).await;
    let first = alice.call("post_message", post("hello")).await.unwrap();
    let own = w2.call("post_message", post("hello")).await.unwrap();
    assert!(own.get("replayed").is_none(), "{own}");
    assert_ne!(own["message"]["id"], first["message"]["id"]);
    assert_eq!(bodies(&bob).await, ["hello", "hello"]);
}

#[tokio::test]
async fn a_request_id_that_is_not_a_uuid_is_refused_and_nothing_is_posted() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    let args = json!({"channel": "general", "body": "x", "request_id": "retry-1"});
    alice
        .call("create_channel", json!({"name": "general"}))
        .await
        .unwrap();
    let refused = alice.call("post_message", args).await.unwrap_err();
    assert_eq!(refused["error"], "invalid", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("not a UUID"),
        "{refused}"
    );
    assert!(bodies(&bob).await.is_empty());
}

#[tokio::test]
async fn concurrent_calls_with_one_id_write_once_and_answer_alike() {
    let app = spawn_app().await;
    let (_, bob) = alice_and_bob(&app).await;
    let token = app.agent("acme", "racer").await;
    let mut racers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = app.mcp(&token, Some("w1")).await;
        racers.spawn(async move { client.call("post_message", post("once")).await });
    }
    let mut answers = Vec::new();
    while let Some(joined) = racers.join_next().await {
        answers.push(joined.unwrap().expect("every racer is answered"));
    }
    let fresh: Vec<&Value> = answers
        .iter()
        .filter(|a| a.get("replayed").is_none())
        .collect();
    assert_eq!(fresh.len(), 1, "one call wrote: {answers:?}");
    for answer in &answers {
        assert_eq!(&unmarked(answer), fresh[0]);
    }
    assert_eq!(bodies(&bob).await, ["once"]);
}

async fn task_events(client: &McpClient, key: &str) -> Vec<String> {
    let task = client.call("get_task", json!({"key": key})).await.unwrap();
    task["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn retried_claims_and_completions_happen_once() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    for key in ["t1", "t2"] {
        bob.call("create_task", json!({"key": key, "title": key}))
            .await
            .unwrap();
    }
    let claim = json!({"request_id": ID});
    let first = alice.call("claim_next_task", claim.clone()).await.unwrap();
    assert_eq!(first["task"]["key"], "t1");
    let retry = alice.call("claim_next_task", claim).await.unwrap();
    assert_replayed(&first, &retry);
    let claimed = bob
        .call("list_tasks", json!({"status": "claimed"}))
        .await
        .unwrap();
    assert_eq!(claimed["tasks"].as_array().unwrap().len(), 1, "{claimed}");
    let open = bob
        .call("list_tasks", json!({"status": "open"}))
        .await
        .unwrap();
    assert_eq!(
        open["tasks"][0]["key"], "t2",
        "t2 was not claimed by the retry"
    );

    let done_id = "0d9a5c3e-1111-4a2b-9c3d-4e5f6a7b8c9d";
    let complete = json!({"key": "t1", "result": "merged", "request_id": done_id});
    let first = alice.call("complete_task", complete.clone()).await.unwrap();
    let retry = alice.call("complete_task", complete).await.unwrap();
    assert_replayed(&first, &retry);
    assert_eq!(
        task_events(&bob, "t1").await,
        ["created", "claimed", "completed"]
    );
}

#[tokio::test]
async fn a_refused_claim_records_nothing_and_its_retry_runs_again() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    bob.call("create_task", json!({"key": "t1", "title": "t1"}))
        .await
        .unwrap();
    bob.call("claim_task", json!({"key": "t1"})).await.unwrap();
    let claim = json!({"key": "t1", "request_id": ID});
    let refused = alice.call("claim_task", claim.clone()).await.unwrap_err();
    assert_eq!(refused["error"], "conflict", "{refused}");
    bob.call("release_task", json!({"key": "t1"}))
        .await
        .unwrap();

    let claimed = alice.call("claim_task", claim.clone()).await.unwrap();
    assert!(claimed.get("replayed").is_none(), "it ran: {claimed}");
    assert_eq!(claimed["holder"]["address"], "alice/w1");
    let retry = alice.call("claim_task", claim).await.unwrap();
    assert_replayed(&claimed, &retry);
    assert_eq!(
        task_events(&bob, "t1").await,
        ["created", "claimed", "released", "claimed"]
    );
}

#[tokio::test]
async fn a_retried_lock_release_is_answered_not_refused() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    let take = json!({"name": "deploy", "ttl_seconds": 60, "request_id": ID});
    let first = alice.call("acquire_lock", take.clone()).await.unwrap();
    let retry = alice.call("acquire_lock", take).await.unwrap();
    assert_replayed(&first, &retry);

    let release_id = "7e8f9a0b-2222-4c3d-8e9f-a0b1c2d3e4f5";
    let release = json!({"name": "deploy", "request_id": release_id});
    let first = alice.call("release_lock", release.clone()).await.unwrap();
    // Without its id, a second release would be refused: nothing is held.
    let retry = alice.call("release_lock", release).await.unwrap();
    assert_replayed(&first, &retry);
    let locks = bob.call("list_locks", json!({})).await.unwrap();
    assert_eq!(locks["count"], 0, "{locks}");
}

#[tokio::test]
async fn a_late_retry_of_a_note_does_not_overwrite_a_newer_value() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    let set = json!({"key": "build", "value": "v1", "request_id": ID});
    let first = alice.call("set_note", set.clone()).await.unwrap();
    bob.call("set_note", json!({"key": "build", "value": "v2"}))
        .await
        .unwrap();
    let retry = alice.call("set_note", set).await.unwrap();
    assert_replayed(&first, &retry);
    let note = bob.call("get_note", json!({"key": "build"})).await.unwrap();
    assert_eq!(note["value"], "v2", "{note}");
    assert_eq!(note["revision"], 2, "{note}");

    let beat = json!({"activity": "reviewing", "request_id": ID});
    let refused = alice.call("heartbeat", beat).await.unwrap_err();
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("for set_note"),
        "{refused}"
    );
    let beat_id = "1a2b3c4d-3333-4e5f-8a9b-c0d1e2f3a4b5";
    let beat = json!({"activity": "reviewing", "request_id": beat_id});
    let first = alice.call("heartbeat", beat.clone()).await.unwrap();
    let retry = alice.call("heartbeat", beat).await.unwrap();
    assert_replayed(&first, &retry);
}

#[tokio::test]
async fn ids_older_than_a_day_are_pruned_and_a_retry_after_runs_anew() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    alice.call("post_message", post("day one")).await.unwrap();
    let recent = "2b3c4d5e-4444-4f6a-9b0c-d1e2f3a4b5c6";
    let args = json!({"channel": "general", "body": "today", "request_id": recent});
    alice.call("post_message", args.clone()).await.unwrap();
    sqlx::query(
        "UPDATE request_ids SET created_at = now() - interval '25 hours' WHERE request_id = $1",
    )
    .bind(uuid::Uuid::parse_str(ID).unwrap())
    .execute(&app.pool)
    .await
    .unwrap();

    // Not pruned yet: a call over the stale id still runs anew.
    let again = alice.call("post_message", post("day one")).await.unwrap();
    assert!(again.get("replayed").is_none(), "{again}");
    assert_eq!(bodies(&bob).await, ["day one", "today", "day one"]);

    sqlx::query(
        "UPDATE request_ids SET created_at = now() - interval '25 hours' WHERE request_id = $1",
    )
    .bind(uuid::Uuid::parse_str(ID).unwrap())
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(requests::prune(&app.pool).await.unwrap(), 1);
    let kept: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT request_id FROM request_ids")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(kept, [uuid::Uuid::parse_str(recent).unwrap()]);
    let retry = alice.call("post_message", args).await.unwrap();
    assert_eq!(retry["replayed"], true, "the recent id still answers");
}

#[tokio::test]
async fn retried_reservations_and_their_release_happen_once() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    let reserve = json!({"paths": ["src/api/**"], "request_id": ID});
    let first = alice.call("reserve_paths", reserve.clone()).await.unwrap();
    let retry = alice.call("reserve_paths", reserve).await.unwrap();
    assert_replayed(&first, &retry);
    let listed = bob.call("list_reservations", json!({})).await.unwrap();
    assert_eq!(
        listed["reservations"].as_array().unwrap().len(),
        1,
        "{listed}"
    );

    let release_id = "3c4d5e6f-5555-4a7b-8c9d-e0f1a2b3c4d5";
    let release = json!({"request_id": release_id});
    let first = alice.call("release_paths", release.clone()).await.unwrap();
    assert_eq!(first["released"], json!(["src/api/**"]), "{first}");
    let retry = alice.call("release_paths", release).await.unwrap();
    assert_replayed(&first, &retry);
}

/// The stdio proxy gives a post a request_id before its first attempt; the
/// reply is lost after the bus committed (a TCP proxy drops it, then cuts
/// the connection); the proxy repeats the call with the same id and the
/// agent gets the first answer, the message posted once.
#[tokio::test]
async fn the_proxy_repeats_a_post_whose_answer_was_lost_and_it_is_posted_once() {
    use crate::proxy::{Driver, Machine};
    use crate::support::eventually;
    use crate::support::proxy::Proxy;

    let app = spawn_app().await;
    let (_, bob) = alice_and_bob(&app).await;
    bob.call("create_channel", json!({"name": "general"}))
        .await
        .unwrap();
    let token = app.agent("acme", "dora").await;
    let tcp = Proxy::start(app.addr).await;
    let url = format!("http://{}/mcp", tcp.addr());
    let machine = Machine::with_team_profiles(&url, &[("work", "acme", "dora", &token)]);
    let body = "posted exactly once";
    let mut driver = Driver::start(&machine.script(
        &["--host-session", "retrying"],
        json!([
            {"op": "wait_tools", "name": "post_message", "timeout": 60},
            {"op": "pause"},
            {"op": "call", "tool": "post_message",
             "arguments": {"channel": "general", "body": body}},
        ]),
    ));
    driver.until_pause().await;
    tcp.black_hole_replies();
    driver.resume().await;
    eventually("the bus to commit the post", async || {
        bodies(&bob).await == [body]
    })
    .await;
    // Close the connection the lost answer belongs to before replies pass
    // again: passed first, an answer still on its way from the server
    // (written after the commit bob saw) reached the proxy, which then had
    // nothing to repeat.
    tcp.cut();
    tcp.pass();
    let lines = driver.rest().await;
    let call = lines
        .iter()
        .find(|l| l["step"] == "call")
        .expect("the call's line");
    assert_eq!(call["is_error"], false, "{call}");
    let answer = &call["structured"];
    assert_eq!(
        answer["replayed"], true,
        "the repeat got the first answer: {answer}"
    );
    assert_eq!(answer["message"]["body"], body);
    assert_eq!(bodies(&bob).await, [body], "posted once");
}

#[tokio::test]
async fn a_retried_ask_asks_once_and_waits_for_the_first_question() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    let ask = json!({"to": "bob", "question": "which port?", "timeout_seconds": 1,
                     "request_id": ID});
    let first = alice.call("ask_agent", ask.clone()).await.unwrap();
    assert_eq!(first["answered"], false, "{first}");
    let retry = alice.call("ask_agent", ask).await.unwrap();
    assert_eq!(retry["question_message_id"], first["question_message_id"]);
    let inbox = bob
        .call(
            "read_messages",
            json!({"scope": "inbox", "only_new": false}),
        )
        .await
        .unwrap();
    let questions: Vec<&Value> = inbox["messages"].as_array().unwrap().iter().collect();
    assert_eq!(questions.len(), 1, "asked once: {inbox}");
    assert_eq!(questions[0]["id"], first["question_message_id"]);
}

#[tokio::test]
async fn a_retried_conversation_is_created_once() {
    let app = spawn_app().await;
    crate::conversations::team_with_conversations(&app, "acme").await;
    let token = app.agent("acme", "alice").await;
    let alice = app.mcp(&token, Some("w1")).await;
    let project = json!({"project": "web", "request_id": ID});
    let first = alice.call("create_project", project.clone()).await.unwrap();
    let retry = alice.call("create_project", project).await.unwrap();
    assert_replayed(&first, &retry);

    let create_id = "4d5e6f7a-6666-4b8c-9d0e-f1a2b3c4d5e6";
    let create = json!({"title": "Plan", "project": "web", "request_id": create_id});
    let first = alice
        .call("create_conversation", create.clone())
        .await
        .unwrap();
    let retry = alice.call("create_conversation", create).await.unwrap();
    assert_replayed(&first, &retry);
    let listed = alice.call("list_conversations", json!({})).await.unwrap();
    assert_eq!(
        listed["conversations"].as_array().unwrap().len(),
        1,
        "{listed}"
    );
}

#[tokio::test]
async fn a_registered_windows_conversation_answer_is_not_replayed_to_the_agent_token() {
    // A registered window's conversations are its session credential's: the
    // agent token naming its label (X-Crew-Session) is refused, and so must
    // be a replay of the window's request id, which would hand it the answer.
    let app = spawn_app().await;
    crate::conversations::team_with_conversations(&app, "acme").await;
    let token = app.agent("acme", "alice").await;
    let plain = app.mcp(&token, None).await;
    let w1 = plain
        .call("register_session", json!({"session": "w1"}))
        .await
        .unwrap();
    let window = app.mcp(w1["credential"].as_str().unwrap(), None).await;
    let create = json!({"title": "Secret plan", "private": true, "request_id": ID});
    let first = window
        .call("create_conversation", create.clone())
        .await
        .unwrap();
    assert_eq!(first["title"], "Secret plan");
    let borrowed = app.mcp(&token, Some("w1")).await;
    let refused = borrowed
        .call("create_conversation", create.clone())
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden", "{refused}");
    assert!(refused.get("id").is_none(), "{refused}");
    // The window itself still gets its answer on a retry.
    let retry = window.call("create_conversation", create).await.unwrap();
    assert_replayed(&first, &retry);
}

/// `ack_message` under a request id: the retry answers exactly the first
/// answer (the same acked_at), marked replayed, and another note under the
/// same id is refused naming the first call; the sender sees one ack.
#[tokio::test]
async fn a_retried_acknowledgement_answers_the_first_and_another_note_is_refused() {
    let app = spawn_app().await;
    let (alice, bob) = alice_and_bob(&app).await;
    let posted = alice
        .call(
            "post_message",
            json!({"to": "bob", "body": "ship it?", "ack_required": true}),
        )
        .await
        .unwrap();
    let id = posted["message"]["id"].clone();
    let args = json!({"message_id": id, "note": "seen", "request_id": ID});
    let first = bob.call("ack_message", args.clone()).await.unwrap();
    let retry = bob.call("ack_message", args).await.unwrap();
    assert_replayed(&first, &retry);

    let other = bob
        .call(
            "ack_message",
            json!({"message_id": id, "note": "other", "request_id": ID}),
        )
        .await
        .unwrap_err();
    assert_eq!(other["error"], "conflict", "{other}");
    assert!(
        other["message"]
            .as_str()
            .unwrap()
            .contains("for ack_message"),
        "{other}"
    );
    let owed = alice.call("list_owed", json!({})).await.unwrap();
    assert_eq!(owed["owed_to_me"], json!([]), "acked once: {owed}");
    let acks: i64 = sqlx::query_scalar("SELECT count(*) FROM message_acks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(acks, 1);
}
