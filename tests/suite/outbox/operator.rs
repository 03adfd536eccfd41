//! The operator's commands and view: `conversations publication` (O15),
//! `conversations tombstone` (O19), `/health` and `conversations status`.

use super::*;

/// `ai-crew-sync ARGS` against the test's database, as an operator runs it.
async fn operator_cli(t: &Outboxed, args: &[&str]) -> std::process::Output {
    let database_url = t.app.database_url.clone();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .args(&args)
            .env("DATABASE_URL", database_url)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The `audit_log` rows of one action: (actor, detail).
async fn audited(t: &Outboxed, action: &str) -> Vec<(String, Value)> {
    sqlx::query_as("SELECT actor, detail FROM audit_log WHERE action = $1 ORDER BY id")
        .bind(action)
        .fetch_all(t.pool())
        .await
        .unwrap()
}

async fn publication_of(t: &Outboxed) -> String {
    sqlx::query_scalar("SELECT publication FROM conversations WHERE id = $1")
        .bind(t.conversation_id)
        .fetch_one(t.pool())
        .await
        .unwrap()
}

// O15 through the operator's command: `conversations publication` back to
// sync is refused while a slot remains (the message explains the gap, nothing
// changes, nothing is audited), allowed once it settled, audited once per
// change, and a switch to the mode it already has writes nothing.
#[tokio::test]
async fn o15_the_publication_command_refuses_sync_while_slots_remain_and_audits_the_switch() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("in flight").await;
    let conversation = t.conversation_id.to_string();
    let to = |mode: &'static str| {
        [
            "conversations",
            "publication",
            "--team",
            "ob",
            "--conversation",
            conversation.as_str(),
            "--mode",
            mode,
            "--json",
        ]
    };

    let refused = operator_cli(&t, &to("sync")).await;
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("1 message(s)"), "{said}");
    assert!(said.contains("awaiting publication"), "{said}");
    assert!(said.contains("a gap nobody will close"), "{said}");
    assert_eq!(publication_of(&t).await, "outbox", "nothing changed");
    assert!(audited(&t, "conversation.publication").await.is_empty());

    outbox::run_once(t.pool(), &backend(t.pool()), "w")
        .await
        .unwrap();
    assert_eq!(t.message(message_id).await.publication_state, "stored");
    let switched = operator_cli(&t, &to("sync")).await;
    assert!(
        switched.status.success(),
        "{}",
        String::from_utf8_lossy(&switched.stderr)
    );
    let answer: Value = serde_json::from_slice(&switched.stdout).unwrap();
    assert_eq!(
        (&answer["before"], &answer["after"], &answer["changed"]),
        (&json!("outbox"), &json!("sync"), &json!(true))
    );
    assert_eq!(publication_of(&t).await, "sync");
    let rows = audited(&t, "conversation.publication").await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].0.starts_with("cli:"), "{rows:?}");
    assert_eq!(rows[0].1["before"], "outbox");
    assert_eq!(rows[0].1["after"], "sync");
    let sent = t.send("synchronous again").await;
    assert_eq!(sent["stored"], true);

    let again = operator_cli(&t, &to("sync")).await;
    let answer: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(answer["changed"], false);
    assert_eq!(audited(&t, "conversation.publication").await.len(), 1);

    let bad = operator_cli(&t, &to("later")).await;
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("`sync`") && said.contains("`outbox`"),
        "{said}"
    );

    // A move open on it sets the publication when it cuts over: refused.
    sqlx::query(
        "INSERT INTO conversation_migrations (id, team_id, conversation_id, direction, state, started_by)
         VALUES ($1, $2, $3, 'to_jetstream', 'copying', 'test')",
    )
    .bind(Uuid::new_v4())
    .bind(t.team_id)
    .bind(t.conversation_id)
    .execute(t.pool())
    .await
    .unwrap();
    let during_move = operator_cli(&t, &to("outbox")).await;
    assert!(!during_move.status.success());
    let said = String::from_utf8_lossy(&during_move.stderr);
    assert!(said.contains("open move (to_jetstream, copying)"), "{said}");
    assert_eq!(publication_of(&t).await, "sync", "nothing changed");
    sqlx::query("UPDATE conversation_migrations SET state = 'failed' WHERE conversation_id = $1")
        .bind(t.conversation_id)
        .execute(t.pool())
        .await
        .unwrap();

    let back = operator_cli(&t, &to("outbox")).await;
    assert!(back.status.success());
    assert_eq!(publication_of(&t).await, "outbox");
    assert_eq!(audited(&t, "conversation.publication").await.len(), 2);
    assert_eq!(t.send("queued again").await["stored"], false);
}

// O15: the switch takes the conversation row a send takes. A send holding it
// whose slot is not committed yet is waited for, and its slot is counted, so
// the switch to sync is refused instead of stranding that slot.
#[tokio::test]
async fn o15_the_switch_waits_for_a_send_holding_the_conversation_row() {
    let t = Outboxed::new().await;
    let message_id = t.send_id("first").await;
    outbox::run_once(t.pool(), &backend(t.pool()), "w")
        .await
        .unwrap();
    assert_eq!(t.message(message_id).await.publication_state, "stored");

    // What a send into the outbox does: the conversation row, then a slot.
    let mut sending = t.pool().begin().await.unwrap();
    sqlx::query("UPDATE conversations SET last_seq = last_seq WHERE id = $1")
        .bind(t.conversation_id)
        .execute(&mut *sending)
        .await
        .unwrap();
    outbox::enqueue(
        &mut sending,
        message_id,
        t.conversation_id,
        t.team_id,
        BackendKind::Postgres,
        "first",
    )
    .await
    .unwrap();

    let pool = t.pool().clone();
    let conversation_id = t.conversation_id;
    let switch = tokio::spawn(async move {
        conversation_operator::set_publication(
            &pool,
            "ob",
            conversation_id,
            Publication::Sync,
            &test_actor(),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !switch.is_finished(),
        "the switch must wait for the send holding the conversation row"
    );
    sending.commit().await.unwrap();
    let err = switch.await.unwrap().unwrap_err().to_string();
    assert!(err.contains("1 message(s)"), "{err}");
    assert_eq!(publication_of(&t).await, "outbox");
    assert!(audited(&t, "conversation.publication").await.is_empty());
}

// O19 through the operator's command: `conversations tombstone` records the
// time and the reason once (a second one is refused and changes neither),
// readers are told the reason instead of the body, and the message, its seq,
// its recipients and receipts stay. Audited; bad input changes nothing.
#[tokio::test]
async fn o19_the_tombstone_command_records_once_and_readers_see_the_reason() {
    let t = Outboxed::new().await;
    let first = t.send_id("a secret pasted by mistake").await;
    t.send_id("the follow-up").await;
    for _ in 0..2 {
        outbox::run_once(t.pool(), &backend(t.pool()), "w")
            .await
            .unwrap();
    }
    let conversation = t.conversation_id.to_string();
    let tombstone = |seq: &'static str, reason: &'static str| {
        [
            "conversations",
            "tombstone",
            "--team",
            "ob",
            "--conversation",
            conversation.as_str(),
            "--seq",
            seq,
            "--reason",
            reason,
            "--json",
        ]
    };

    let done = operator_cli(&t, &tombstone("1", "it held a credential")).await;
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let answer: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(answer["message_id"], first.to_string());
    assert_eq!(answer["seq"], 1);
    let shown = "tombstoned by an operator: it held a credential";
    assert_eq!(answer["reason"], shown);
    let at: (chrono::DateTime<chrono::Utc>, String) = sqlx::query_as(
        "SELECT tombstoned_at, tombstone_reason FROM conversation_messages WHERE id = $1",
    )
    .bind(first)
    .fetch_one(t.pool())
    .await
    .unwrap();

    let page = t.read_as_bob().await;
    let messages = page["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "the message stays in the thread");
    assert_eq!(messages[0]["seq"], 1);
    assert_eq!(messages[0]["body"], Value::Null);
    assert_eq!(messages[0]["unavailable"]["reason"], "tombstoned");
    assert_eq!(messages[0]["unavailable"]["detail"], shown);
    assert!(messages[0]["my_receipt"]["stored_at"].is_string());
    assert_eq!(messages[1]["body"], "the follow-up");
    let receipts = t.message(first).await;
    assert_eq!(receipts.receipts_stored, 1, "receipts stay");
    assert_eq!(receipts.publication_state, "stored");

    let rows = audited(&t, "conversation.tombstone").await;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].0.starts_with("cli:"), "{rows:?}");
    assert_eq!(rows[0].1["seq"], 1);
    assert_eq!(rows[0].1["reason"], "it held a credential");

    let twice = operator_cli(&t, &tombstone("1", "another reason")).await;
    assert!(!twice.status.success());
    let said = String::from_utf8_lossy(&twice.stderr);
    assert!(said.contains("already tombstoned"), "{said}");
    assert!(said.contains("it held a credential"), "{said}");
    let after: (chrono::DateTime<chrono::Utc>, String) = sqlx::query_as(
        "SELECT tombstoned_at, tombstone_reason FROM conversation_messages WHERE id = $1",
    )
    .bind(first)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(after, at, "the first time and reason stay");
    assert_eq!(audited(&t, "conversation.tombstone").await.len(), 1);

    for (seq, reason, expect) in [
        ("2", "  ", "needs a reason"),
        ("2", "two\nlines", "control character"),
        ("9", "gone", "no message with seq 9"),
    ] {
        let out = operator_cli(&t, &tombstone(seq, reason)).await;
        assert!(!out.status.success());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(expect), "{said}");
    }
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages WHERE tombstoned_at IS NOT NULL",
    )
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(untouched, 1, "refused input tombstoned nothing");
    assert_eq!(audited(&t, "conversation.tombstone").await.len(), 1);
}

// O14 as an operator sees it: /health's publication section and
// `conversations status --team T`.
#[tokio::test]
async fn health_and_conversations_status_show_what_is_in_flight() {
    let t = Outboxed::new().await;
    t.send_id("refused").await;
    t.send_id("waiting").await;
    let first = lease(t.pool()).await;
    outbox::settle(t.pool(), &first, Published::Fatal("too large".into()))
        .await
        .unwrap();

    for path in ["/health", "/health?broker=check"] {
        let health: Value = crate::support::http_client()
            .get(t.app.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(health["status"], "ok");
        assert_eq!(health["broker"], "not_configured", "{path}");
        assert_eq!(health["publication"]["pending"], 1);
        assert_eq!(health["publication"]["failed"], 1);
        assert!(health["publication"]["oldest_pending_seconds"].is_i64());
    }

    let database_url = t.app.database_url.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .args(["conversations", "status", "--team", "ob", "--json"])
            .env("DATABASE_URL", database_url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["team"], "ob");
    assert_eq!(report["conversation_backend"], "postgres");
    assert_eq!(report["outbox"]["pending"], 1);
    assert_eq!(report["outbox"]["failed"], 1);
    let conversations = report["conversations"].as_array().unwrap();
    assert_eq!(conversations.len(), 1);
    assert_eq!(
        conversations[0]["conversation_id"],
        t.conversation_id.to_string()
    );
    assert_eq!(conversations[0]["publication"], "outbox");
    assert_eq!(
        (
            conversations[0]["pending"].as_i64(),
            conversations[0]["failed"].as_i64()
        ),
        (Some(1), Some(1))
    );
}
