//! wait_for_updates and ask_agent: waking across replicas, what wakes whom,
//! and questions answered only by the agent asked, to the window that asked.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{McpClient, eventually, spawn_app};

/// Keep posting `args` as `client` until `waiter` finishes (at most `tries`).
async fn post_until_done(
    client: &McpClient,
    args: Value,
    waiter: &tokio::task::JoinHandle<Value>,
    tries: usize,
) {
    for _ in 0..tries {
        if waiter.is_finished() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.call("post_message", args.clone()).await.unwrap();
    }
}

#[tokio::test]
async fn a_wait_on_one_replica_wakes_on_a_teammates_write_on_another() {
    let first = spawn_app().await;
    let second = first.replica().spawn().await;
    first.team("acme").await;
    let alice = McpClient::connect(&first.mcp_url(), &first.agent("acme", "alice").await, None)
        .await
        .unwrap();
    let bob_token = first.agent("acme", "bob").await;
    let bob = McpClient::connect(&second.mcp_url(), &bob_token, Some("web"))
        .await
        .unwrap();

    // Bob's window `web` focuses on channel `web`. The timeout (3 s) is shorter
    // than the database re-check (30 s while events flow): only an event can wake it in time.
    alice
        .call("create_channel", json!({"name": "web"}))
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        bob.call("wait_for_updates", json!({"timeout_seconds": 3}))
            .await
            .unwrap()
    });
    post_until_done(
        &alice,
        json!({"channel": "web", "body": "build is green"}),
        &waiter,
        8,
    )
    .await;
    let woke = waiter.await.unwrap();
    assert_eq!(woke["woke"], true, "{woke}");
    assert_eq!(woke["events"][0]["kind"], "message");
    assert_eq!(woke["events"][0]["channel"], "web");
    assert_eq!(woke["events"][0]["preview"], "build is green");
    assert_eq!(woke["events"][0]["by"], "alice");
}

/// The focus a wait starts with comes from the window's labels, read in the
/// wait's first statement with the channels their names could mean: a
/// `project` label spelled loosely (`#`, capitals, spaces) focuses the
/// channel it names, a `channel` label wins over it, and chatter elsewhere
/// wakes nothing.
#[tokio::test]
async fn a_wait_focuses_on_the_channel_its_labels_name_however_spelled() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("w1")).await;
    for name in ["backend", "frontend", "w1"] {
        alice
            .call("create_channel", json!({"name": name}))
            .await
            .unwrap();
    }
    let waits = [
        (json!({"project": " #Backend"}), "backend"),
        (json!({"channel": "frontend"}), "frontend"),
        (json!({"project": "", "channel": ""}), "w1"),
    ];
    let mut bob = bob;
    for (labels, focus) in waits {
        bob.call("heartbeat", labels.clone()).await.unwrap();
        let waiter = tokio::spawn(async move {
            let woke = bob
                .call("wait_for_updates", json!({"timeout_seconds": 5}))
                .await
                .unwrap();
            (bob, woke)
        });
        app.until_waiting(1).await;
        for elsewhere in ["backend", "frontend", "w1"]
            .iter()
            .filter(|c| **c != focus)
        {
            alice
                .call(
                    "post_message",
                    json!({"channel": elsewhere, "body": "not yours"}),
                )
                .await
                .unwrap();
        }
        alice
            .call("post_message", json!({"channel": focus, "body": "yours"}))
            .await
            .unwrap();
        let (back, woke) = waiter.await.unwrap();
        bob = back;
        assert_eq!(woke["woke"], true, "labels {labels}: {woke}");
        let events = woke["events"].as_array().unwrap();
        assert!(
            events
                .iter()
                .all(|e| e["channel"] == focus && e["preview"] == "yours"),
            "labels {labels} focus {focus}: {woke}"
        );
    }
}

#[tokio::test]
async fn a_wait_does_not_wake_for_a_sibling_windows_dm_or_other_channels_or_itself() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob_token = app.agent("acme", "bob").await;
    let w1 = app.mcp(&bob_token, Some("w1")).await;
    alice
        .call("create_channel", json!({"name": "elsewhere"}))
        .await
        .unwrap();

    let waiter = tokio::spawn(async move {
        let result = w1
            .call("wait_for_updates", json!({"timeout_seconds": 2}))
            .await
            .unwrap();
        (w1, result)
    });
    app.until_waiting(1).await;
    alice
        .call("post_message", json!({"to": "bob/w2", "body": "for w2"}))
        .await
        .unwrap();
    alice
        .call(
            "post_message",
            json!({"channel": "elsewhere", "body": "chatter"}),
        )
        .await
        .unwrap();
    let (w1, result) = waiter.await.unwrap();
    assert_eq!(result["timed_out"], true, "{result}");
    assert_eq!(result["woke"], false);

    // Its own post does not wake it either; an announcement anywhere does.
    let waiter = tokio::spawn(async move {
        w1.call("wait_for_updates", json!({"timeout_seconds": 3}))
            .await
            .unwrap()
    });
    let bob_w1 = app.mcp(&bob_token, Some("w1")).await;
    bob_w1
        .call(
            "post_message",
            json!({"channel": "elsewhere", "body": "mine", "announce": true}),
        )
        .await
        .unwrap();
    post_until_done(
        &alice,
        json!({"channel": "elsewhere", "body": "all hands at 3", "announce": true}),
        &waiter,
        8,
    )
    .await;
    let result = waiter.await.unwrap();
    assert_eq!(result["woke"], true, "{result}");
    assert_eq!(result["events"][0]["preview"], "all hands at 3");

    // An unread DM to the window wakes it at once, even if sent before the wait.
    let w2 = app.mcp(&bob_token, Some("w2")).await;
    let result = w2
        .call("wait_for_updates", json!({"timeout_seconds": 2}))
        .await
        .unwrap();
    assert_eq!(result["woke"], true);
    assert_eq!(result["events"][0]["preview"], "for w2");
    let refused = w2
        .call("wait_for_updates", json!({"timeout_seconds": 301}))
        .await
        .unwrap_err();
    assert!(
        refused["message"].as_str().unwrap().contains("300"),
        "{refused}"
    );
    let refused = w2
        .call("wait_for_updates", json!({"kinds": ["gossip"]}))
        .await
        .unwrap_err();
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("message, task, lock, note and reservation"),
        "{refused}"
    );
}

#[tokio::test]
async fn ask_agent_returns_the_teammates_answer_and_a_sibling_cannot_answer_for_the_asker() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let asker = app.mcp(&alice_token, Some("w1")).await;
    let sibling = app.mcp(&alice_token, Some("w2")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;

    let asking = tokio::spawn(async move {
        let result = asker
            .call(
                "ask_agent",
                json!({"to": "bob", "question": "which port?", "timeout_seconds": 2}),
            )
            .await
            .unwrap();
        (asker, result)
    });
    // The sibling window sees nothing to answer in its inbox, but tries anyway.
    let question_id = eventually("the question in bob's inbox", async || {
        let inbox = bob
            .call(
                "read_messages",
                json!({"scope": "inbox", "only_new": false}),
            )
            .await
            .unwrap();
        let q = inbox["messages"].as_array().unwrap().first()?;
        assert_eq!(q["from"], "alice/w1", "the question says where to answer");
        assert_eq!(q["question"], true);
        Some(q["id"].clone())
    })
    .await;
    sibling
        .call(
            "post_message",
            json!({"to": "alice/w1", "reply_to": question_id, "body": "8080 (says the sibling)"}),
        )
        .await
        .unwrap();
    let (asker, timed_out) = asking.await.unwrap();
    assert_eq!(timed_out["answered"], false, "{timed_out}");
    assert_eq!(timed_out["question_message_id"], question_id);
    assert!(
        timed_out["suggestion"]
            .as_str()
            .unwrap()
            .contains("resume_message_id")
    );

    bob.call(
        "post_message",
        json!({"to": "alice/w1", "reply_to": question_id, "body": "8787"}),
    )
    .await
    .unwrap();
    let answered = asker
        .call("ask_agent", json!({"to": "bob", "question": "ignored on resume", "resume_message_id": question_id, "timeout_seconds": 5}))
        .await
        .unwrap();
    assert_eq!(answered["answered"], true, "{answered}");
    assert_eq!(answered["answer"], "8787");
    assert_eq!(answered["answered_by"], "bob");
    let questions: i64 = sqlx::query_scalar("SELECT count(*) FROM messages WHERE is_question")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(questions, 1, "resuming does not ask again");

    // Only the asking window can resume its question.
    let refused = sibling
        .call("ask_agent", json!({"to": "bob", "question": "x", "resume_message_id": question_id, "timeout_seconds": 1}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "not_found");
}

#[tokio::test]
async fn only_the_asked_agent_answers_a_question_and_a_third_agents_reply_stays_a_plain_message() {
    let app = spawn_app().await;
    app.team("acme").await;
    let asker = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    let bob_token = app.agent("acme", "bob").await;
    let bob = app.mcp(&bob_token, None).await;
    let bob_w2 = app.mcp(&bob_token, Some("w2")).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;

    // 3 s is under the wait's database re-check (30 s while events flow): carol's reply reaches
    // the wait as an event, which wakes it to look, and it must keep waiting.
    let started = std::time::Instant::now();
    let asking = tokio::spawn(async move {
        let result = asker
            .call(
                "ask_agent",
                json!({"to": "bob", "question": "which port?", "timeout_seconds": 3}),
            )
            .await
            .unwrap();
        (asker, result, started.elapsed())
    });
    let question_id = eventually("the question in bob's inbox", async || {
        let inbox = bob
            .call("read_messages", json!({"scope": "inbox"}))
            .await
            .unwrap();
        Some(inbox["messages"].as_array().unwrap().first()?["id"].clone())
    })
    .await;
    let carols = carol
        .call(
            "post_message",
            json!({"to": "alice/w1", "reply_to": question_id, "body": "9090 (says carol)"}),
        )
        .await
        .unwrap();
    let (asker, timed_out, waited) = asking.await.unwrap();
    assert_eq!(timed_out["answered"], false, "{timed_out}");
    assert!(timed_out["answer"].is_null(), "{timed_out}");
    assert_eq!(timed_out["question_message_id"], question_id);
    assert!(
        waited >= Duration::from_secs(3),
        "carol's reply woke the wait but must not end it: it returned after {waited:?}"
    );

    // Carol's reply is an ordinary direct message in the asker's inbox.
    let inbox = asker
        .call("read_messages", json!({"scope": "inbox"}))
        .await
        .unwrap();
    let messages = inbox["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{inbox}");
    assert_eq!(messages[0]["id"], carols["message"]["id"]);
    assert_eq!(messages[0]["from"], "carol");
    assert_eq!(messages[0]["body"], "9090 (says carol)");
    assert_eq!(messages[0]["reply_to"], question_id);

    // Bob answers from another of his windows; resuming takes his reply and
    // passes over carol's, which came first.
    bob_w2
        .call(
            "post_message",
            json!({"to": "alice/w1", "reply_to": question_id, "body": "8787"}),
        )
        .await
        .unwrap();
    let answered = asker
        .call(
            "ask_agent",
            json!({"to": "bob", "question": "ignored on resume",
                   "resume_message_id": question_id, "timeout_seconds": 5}),
        )
        .await
        .unwrap();
    assert_eq!(answered["answered"], true, "{answered}");
    assert_eq!(answered["answer"], "8787");
    assert_eq!(answered["answered_by"], "bob/w2");
}

#[tokio::test]
async fn tasks_locks_and_notes_wake_a_wait_and_kinds_filter_them() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;

    let waiter = tokio::spawn(async move {
        let result = bob
            .call(
                "wait_for_updates",
                json!({"timeout_seconds": 3, "kinds": ["task"]}),
            )
            .await
            .unwrap();
        (bob, result)
    });
    for i in 0..8 {
        if waiter.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        // A note does not wake a wait for tasks; the task does.
        alice
            .call("set_note", json!({"key": format!("n{i}"), "value": "v"}))
            .await
            .unwrap();
        alice
            .call("create_task", json!({"key": format!("t{i}"), "title": "T"}))
            .await
            .unwrap();
    }
    let (bob, result) = waiter.await.unwrap();
    assert_eq!(result["woke"], true, "{result}");
    let kinds: Vec<&str> = result["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.iter().all(|k| *k == "task"), "{result}");
    assert_eq!(result["events"][0]["by"], "alice");

    // (A task event from just before this wait may still be in flight to the
    // listener; asking for locks only keeps the check about locks.)
    let waiter = tokio::spawn(async move {
        bob.call(
            "wait_for_updates",
            json!({"timeout_seconds": 3, "kinds": ["lock"]}),
        )
        .await
        .unwrap()
    });
    for i in 0..8 {
        if waiter.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        alice
            .call("acquire_lock", json!({"name": format!("deploy-{i}")}))
            .await
            .unwrap();
    }
    let result = waiter.await.unwrap();
    assert_eq!(result["events"][0]["kind"], "lock", "{result}");
}

/// A client that records the progress notifications it receives.
#[derive(Clone)]
struct ProgressRecorder(tokio::sync::mpsc::UnboundedSender<rmcp::model::ProgressNotificationParam>);

impl rmcp::ClientHandler for ProgressRecorder {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let _ = self.0.send(params);
    }
}

/// Alice of a new team `acme` on rmcp's own client, recording the progress
/// notifications it receives (rmcp's client asks for progress on every call).
async fn recorded_alice() -> (
    crate::support::TestApp,
    rmcp::service::RunningService<rmcp::RoleClient, ProgressRecorder>,
    tokio::sync::mpsc::UnboundedReceiver<rmcp::model::ProgressNotificationParam>,
) {
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let (sender, received) = tokio::sync::mpsc::unbounded_channel();
    let config = StreamableHttpClientTransportConfig::with_uri(app.mcp_url()).auth_header(token);
    let client = ProgressRecorder(sender)
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .unwrap();
    (app, client, received)
}

#[tokio::test]
async fn a_blocked_wait_sends_progress_when_the_client_asks_for_it() {
    use rmcp::model::{CallToolRequestParams, NumberOrString, ProgressToken, RequestParamsMeta};

    let (app, client, mut received) = recorded_alice().await;
    // rmcp's client assigns its own token; asking for one is what matters.
    // Progress is sent for a wait longer than the default 50 s (one that
    // clients allowing ~60 s a call would cut without it).
    let mut params = CallToolRequestParams::new("wait_for_updates")
        .with_arguments(json!({"timeout_seconds": 120}).as_object().unwrap().clone());
    params.set_progress_token(ProgressToken(NumberOrString::String("w-1".into())));
    let wait = tokio::spawn(async move { client.call_tool(params).await.unwrap() });
    let progress = tokio::time::timeout(Duration::from_secs(30), received.recv())
        .await
        .expect("a progress notification within 30 s of blocking")
        .expect("the recorder is alive");
    assert_eq!(progress.total, Some(120.0));
    // A DM ends the wait; its answer comes after the progress.
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    bob.call(
        "post_message",
        json!({"to": "alice", "body": "done waiting"}),
    )
    .await
    .unwrap();
    let result = wait.await.unwrap();
    assert_eq!(result.structured_content.unwrap()["woke"], true);
}

#[tokio::test]
async fn a_wait_within_the_default_length_sends_no_progress() {
    use rmcp::model::CallToolRequestParams;

    let (_app, client, mut received) = recorded_alice().await;
    // rmcp's client asks for progress on this call too; a wait that ends
    // within the default sends none (the server waits for it before rmcp
    // builds its per-request service: `mcp::park`).
    let params = CallToolRequestParams::new("wait_for_updates")
        .with_arguments(json!({"timeout_seconds": 6}).as_object().unwrap().clone());
    let result = client.call_tool(params).await.unwrap();
    assert_eq!(result.structured_content.unwrap()["timed_out"], true);
    assert!(
        received.try_recv().is_err(),
        "no progress for a wait within the default"
    );
}

#[tokio::test]
async fn a_change_whose_notification_is_lost_still_wakes_a_wait() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let waiter = tokio::spawn(async move {
        bob.call("wait_for_updates", json!({"timeout_seconds": 9}))
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Written behind the bus's back: no notification is ever sent for it.
    sqlx::query(
        "INSERT INTO locks (team_id, name, holder_agent_id, holder_session, expires_at)
         SELECT team_id, 'silent-lock', id, '', now() + interval '1 minute' FROM agents WHERE name = 'alice'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let result = waiter.await.unwrap();
    assert_eq!(
        result["woke"], true,
        "the periodic database check found it: {result}"
    );
    assert_eq!(result["events"][0]["kind"], "lock");
    assert_eq!(result["events"][0]["id"], "silent-lock");
    assert_eq!(result["events"][0]["by"], "alice");
}

/// A direct message written behind the bus's back (no notification) while a
/// wait is blocked: the wait's next look asks for unread direct messages and
/// the changes in one statement, then reads the message it was told of.
#[tokio::test]
async fn a_direct_message_whose_notification_is_lost_still_wakes_a_wait() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.agent("acme", "alice").await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let waiter = tokio::spawn(async move {
        bob.call(
            "wait_for_updates",
            json!({"timeout_seconds": 9, "kinds": ["message"]}),
        )
        .await
        .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    sqlx::query(
        "INSERT INTO messages (id, team_id, sender_id, sender_session, recipient_id, body, position)
         SELECT gen_random_uuid(), a.team_id, a.id, '', b.id, 'told quietly',
                nextval(message_position_sequence(a.team_id)::regclass)
         FROM agents a JOIN agents b ON b.team_id = a.team_id AND b.name = 'bob'
         WHERE a.name = 'alice'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let result = waiter.await.unwrap();
    assert_eq!(result["woke"], true, "a later look found it: {result}");
    assert_eq!(result["events"][0]["kind"], "message", "{result}");
    assert_eq!(result["events"][0]["by"], "alice", "{result}");
    assert_eq!(result["events"][0]["preview"], "told quietly", "{result}");
    assert_eq!(result["events"].as_array().unwrap().len(), 1, "{result}");
}

/// Many windows blocked at once on one server: each is woken by the DM sent
/// to it and by nothing else. Half of them get a DM, everyone hears
/// chatter in a channel none of them focuses on; the windows nobody wrote to
/// sleep through all of it, and no window is handed another's message.
#[tokio::test]
async fn many_blocked_waits_each_wake_for_their_own_dm_and_nothing_else() {
    // Three agents of eight windows each: under the per-credential cap on
    // long polls, and within the test pool's eight connections.
    const AGENTS: usize = 3;
    const WINDOWS: usize = 8;
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    alice
        .call("create_channel", json!({"name": "elsewhere"}))
        .await
        .unwrap();
    // Every window connected first, so the waits start together.
    let mut windows = Vec::new();
    for a in 0..AGENTS {
        let token = app.agent("acme", &format!("bob{a}")).await;
        for w in 0..WINDOWS {
            let window = app.mcp(&token, Some(&format!("w{w}"))).await;
            windows.push((format!("bob{a}/w{w}"), window));
        }
    }
    let waiters: Vec<_> = windows
        .into_iter()
        .map(|(address, window)| {
            let waiter = tokio::spawn(async move {
                window
                    .call(
                        "wait_for_updates",
                        json!({"timeout_seconds": 10, "kinds": ["message"]}),
                    )
                    .await
                    .unwrap()
            });
            (address, waiter)
        })
        .collect();
    // A DM sent before a wait subscribed is found by its first check, so the
    // posts need not wait for the waits to block.
    alice
        .call(
            "post_message",
            json!({"channel": "elsewhere", "body": "chatter"}),
        )
        .await
        .unwrap();
    let concerned = |i: usize| i % 2 == 1;
    for (i, (address, _)) in waiters.iter().enumerate() {
        if concerned(i) {
            alice
                .call(
                    "post_message",
                    json!({"to": address, "body": format!("for {address}")}),
                )
                .await
                .unwrap();
        }
    }
    for (i, (address, waiter)) in waiters.into_iter().enumerate() {
        let result = waiter.await.unwrap();
        if concerned(i) {
            assert_eq!(result["woke"], true, "{address}: {result}");
            let events = result["events"].as_array().unwrap();
            assert_eq!(events.len(), 1, "{address}: only its own DM: {result}");
            assert_eq!(events[0]["kind"], "message", "{address}: {result}");
            assert_eq!(
                events[0]["preview"],
                format!("for {address}"),
                "{address}: {result}"
            );
        } else {
            assert_eq!(result["woke"], false, "{address}: {result}");
            assert_eq!(result["timed_out"], true, "{address}: {result}");
        }
    }
}

/// A blocked wait holds one registration with the event hub, whose filter
/// the hub runs for every event of the team, and gives it back when it
/// ends: woken, or abandoned by a client that went away (a registration
/// left behind would be filtered for every event of the team for good).
#[tokio::test]
async fn a_wait_gives_its_hub_registration_back_when_woken_or_abandoned() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;
    let registered = |count: usize| app.until_waiting(count);
    let wait = json!({"timeout_seconds": 60, "kinds": ["message"]});

    let woken = tokio::spawn({
        let wait = wait.clone();
        async move { bob.call("wait_for_updates", wait).await.unwrap() }
    });
    registered(1).await;
    alice
        .call("post_message", json!({"to": "bob", "body": "wake up"}))
        .await
        .unwrap();
    assert_eq!(woken.await.unwrap()["woke"], true);
    registered(0).await;

    let abandoned = tokio::spawn(async move { carol.call("wait_for_updates", wait).await });
    registered(1).await;
    // The client goes away mid-call: its connection closes.
    abandoned.abort();
    registered(0).await;
}
