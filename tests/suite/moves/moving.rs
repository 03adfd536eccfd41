//! The move itself: a thousand messages to jetstream and back unchanged, a
//! killed move resumed by the same command, a resumed run verifying what it
//! recorded, a checksum mismatch and a refused publish failing the move, a
//! failed move started again past the duplicate window, and the summary's
//! byte counts.

use super::*;

// M10, M5, M14: 1 000 messages move to JetStream (their PostgreSQL copies
// then released by cleanup) and back, with every body identical and every
// seq, author, recipient and receipt unchanged.
#[tokio::test]
async fn a_thousand_messages_move_to_jetstream_and_back_unchanged() {
    let t = thread("mv-roundtrip", 1000).await;
    let before = t.snapshot().await;
    let bodies = t.read_all().await;
    assert_eq!(bodies.len(), 1000);

    let there = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!((there.copied, there.state), (1000, MoveState::CutOver));
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    let located: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages
          WHERE conversation_id = $1 AND backend = 'jetstream' AND canonical_locator LIKE 'jetstream:%'",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(located, 1000);
    assert_eq!(
        t.stream_messages().await,
        1000,
        "one stream entry per message"
    );
    assert_eq!(t.snapshot().await, before);

    // Drop the PostgreSQL copies: every read now comes from the broker.
    let cleaned = moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    assert_eq!(cleaned.messages, 1000);
    assert_eq!(t.read_all().await, bodies);

    let back = t.run(Direction::ToPostgres).await.unwrap();
    assert_eq!((back.copied, back.state), (1000, MoveState::CutOver));
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    let local: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages
          WHERE conversation_id = $1 AND backend = 'postgres' AND canonical_locator IS NULL
            AND publication_state = 'stored' AND body <> ''",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(local, 1000);
    assert_eq!(t.snapshot().await, before);
    assert_eq!(t.read_all().await, bodies);
    assert_eq!(
        t.runs().await,
        [
            ("to_jetstream".into(), "cut_over".into()),
            ("to_postgres".into(), "cut_over".into())
        ]
    );
    // The thread is open for business on PostgreSQL again.
    let sent = t
        .send(t.conversation_id, "after the round trip")
        .await
        .unwrap();
    assert_eq!(sent["seq"], 1001);
    assert_eq!(sent["stored"], true);
}

// M3, M11: a move killed mid-copy and just before its cutover resumes with
// the same command and finishes with one stream entry per message.
#[tokio::test]
async fn a_killed_move_resumes_with_the_same_command_without_duplicates() {
    let t = thread("mv-kill", 600).await;
    let before = t.snapshot().await;
    for kill_after_verified in [150_i64, 450, 600] {
        let mut child = t
            .command(&["migrate", "--to", "jetstream", "--apply"])
            .spawn()
            .unwrap();
        // Let it get this far, then kill it without warning.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let verified: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM conversation_migration_items WHERE state = 'verified'",
            )
            .fetch_one(t.pool())
            .await
            .unwrap();
            let finished = child.try_wait().unwrap().is_some();
            if verified >= kill_after_verified || finished {
                break;
            }
            assert!(Instant::now() < deadline, "the move made no progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        if t.conversation_row().await.0 == "jetstream" {
            break;
        }
        // Killed with the run open: the thread says it is paused (or not
        // yet), and nothing is cut over.
        assert_eq!(t.runs().await, [("to_jetstream".into(), "copying".into())]);
    }
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "jetstream", "--apply"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert_eq!(t.stream_messages().await, 600, "no duplicate stream entry");
    assert_eq!(t.snapshot().await, before);
    assert_eq!(t.read_all().await.len(), 600);
}

// M9, M11, M12, M6: a body altered on the target fails the move; nothing is
// cut over and the thread is open again, on its old backend; the item was
// recorded with its checksum and size before anything was written.
#[tokio::test]
async fn a_checksum_mismatch_fails_the_move_and_reopens_the_thread() {
    let t = thread("mv-mismatch", 20).await;
    let victim: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 AND seq = 7",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    // Someone wrote another body under the key the move will use.
    let broker = JetStreamBackend::new(t.backends.broker().unwrap().clone(), t.team_id);
    let tampered = broker
        .publish(&Envelope {
            message_id: victim,
            conversation_id: t.conversation_id,
            team_id: t.team_id,
            body: "not what was sent".into(),
            publish_key: victim,
        })
        .await;
    assert!(matches!(tampered, Published::Confirmed(_)));

    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(err.contains("Nothing was cut over"), "{err}");
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    assert_eq!(t.runs().await, [("to_jetstream".into(), "failed".into())]);
    let moved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages WHERE conversation_id = $1 AND backend <> 'postgres'",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(moved, 0, "the thread is untouched");
    let item: String =
        sqlx::query_scalar("SELECT state FROM conversation_migration_items WHERE message_id = $1")
            .bind(victim)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(item, "failed");
    let recorded: (Vec<u8>, i32) = sqlx::query_as(
        "SELECT body_sha256, bytes FROM conversation_migration_items WHERE message_id = $1",
    )
    .bind(victim)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let sent: (Vec<u8>, i32) =
        sqlx::query_as("SELECT body_sha256, body_bytes FROM conversation_messages WHERE id = $1")
            .bind(victim)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(recorded, sent, "M6: the source's checksum and size");
    // M13: the operator is told the thread is open again.
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    t.send(t.conversation_id, "still open").await.unwrap();
    assert_eq!(t.read_all().await.len(), 21);
}

// M7: a resumed run finds the copy it recorded before and verifies it
// without publishing again, even where the broker would not deduplicate
// (the copy went in under another key, as after a long interruption).
#[tokio::test]
async fn a_resumed_run_verifies_a_recorded_copy_instead_of_publishing_again() {
    let t = thread("mv-resume", 5).await;
    let first: (Uuid, String) = sqlx::query_as(
        "SELECT id, body FROM conversation_messages WHERE conversation_id = $1 AND seq = 1",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let broker = JetStreamBackend::new(t.backends.broker().unwrap().clone(), t.team_id);
    let Published::Confirmed(locator) = broker
        .publish(&Envelope {
            message_id: first.0,
            conversation_id: t.conversation_id,
            team_id: t.team_id,
            body: first.1.clone(),
            publish_key: Uuid::new_v4(),
        })
        .await
    else {
        panic!("the earlier copy was not published");
    };
    // What an interrupted run left: open, its item copied with a locator.
    let run = t
        .left_run(t.conversation_id, "to_jetstream", "copying", false)
        .await;
    sqlx::query(
        "INSERT INTO conversation_migration_items
             (migration_id, message_id, team_id, body_sha256, bytes, target_locator, state)
         SELECT $1, id, team_id, body_sha256, body_bytes, $3, 'copied'
           FROM conversation_messages WHERE id = $2",
    )
    .bind(run)
    .bind(first.0)
    .bind(&locator.0)
    .execute(t.pool())
    .await
    .unwrap();

    let outcome = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!(outcome.migration_id, run, "the open run was resumed");
    assert_eq!((outcome.resumed, outcome.copied), (1, 4));
    assert_eq!(
        t.stream_messages().await,
        5,
        "the recorded copy was not published again"
    );
    let canonical: String =
        sqlx::query_scalar("SELECT canonical_locator FROM conversation_messages WHERE id = $1")
            .bind(first.0)
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(canonical, locator.0);
}

// M8, M11, M13: a publish the target refuses stops the move with that error;
// nothing is cut over and the thread is open again.
#[tokio::test]
async fn a_refused_publish_stops_the_move_and_reopens_the_thread() {
    let t = thread("mv-refused", 3).await;
    // The body stream takes two bodies, and refuses the third.
    let sizes = StreamSizes {
        max_messages: 2,
        ..sizes()
    };
    t.backends
        .broker()
        .unwrap()
        .provision_team(t.team_id, &sizes, true)
        .await
        .unwrap();
    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("copying message"), "{err}");
    assert!(err.contains("Nothing was cut over"), "{err}");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "failed".into())]);
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    t.send(t.conversation_id, "still open").await.unwrap();
}

// Issue 14 item 3 (M7): a move that failed and is started again after the
// broker's duplicate window finds the copies the failed run wrote and
// publishes none of them a second time.
#[tokio::test]
async fn a_failed_move_started_again_past_the_duplicate_window_publishes_nothing_twice() {
    let t = thread("mv-rerun", 10).await;
    let broker = t.backends.broker().unwrap().clone();
    let name = ai_crew_sync::backend::jetstream::body_stream_name(t.team_id);
    let mut config = broker
        .js()
        .get_stream(&name)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    let window = Duration::from_secs(2);
    config.duplicate_window = window;
    broker.js().update_stream(config).await.unwrap();
    // The seventh message's key already holds another body: the first run
    // copies six, then fails on the seventh.
    let victim: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 AND seq = 7",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let tampered = JetStreamBackend::new(broker.clone(), t.team_id)
        .publish(&Envelope {
            message_id: victim,
            conversation_id: t.conversation_id,
            team_id: t.team_id,
            body: "not what was sent".into(),
            publish_key: victim,
        })
        .await;
    assert!(matches!(tampered, Published::Confirmed(_)));
    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
    assert_eq!(
        t.stream_messages().await,
        7,
        "six copies and the tampered one"
    );
    let first: BTreeMap<Uuid, String> = sqlx::query_as(
        "SELECT message_id, target_locator FROM conversation_migration_items
          WHERE state = 'verified'",
    )
    .fetch_all(t.pool())
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(first.len(), 6);

    tokio::time::sleep(window + Duration::from_millis(500)).await;
    let again = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!((again.resumed, again.copied), (6, 4));
    assert_eq!(
        t.stream_messages().await,
        11,
        "one entry per message (and the tampered one), none published twice"
    );
    for (message_id, locator) in first {
        let canonical: String =
            sqlx::query_scalar("SELECT canonical_locator FROM conversation_messages WHERE id = $1")
                .bind(message_id)
                .fetch_one(t.pool())
                .await
                .unwrap();
        assert_eq!(canonical, locator, "the failed run's copy is the one kept");
    }
    assert_eq!(t.read_all().await.len(), 10);
}

// Issue 15 item 7 (M2): a move's summary counts bytes as its plan does. A
// resumed run whose first message was verified by the interrupted pass used
// to count only what it copied itself (the 6.6 MB against 8.0 MB).
#[tokio::test]
async fn a_moves_summary_counts_the_bytes_its_plan_counts() {
    let t = thread("mv-bytes15", 5).await;
    let first: (Uuid, String) = sqlx::query_as(
        "SELECT id, body FROM conversation_messages WHERE conversation_id = $1 AND seq = 1",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let broker = JetStreamBackend::new(t.backends.broker().unwrap().clone(), t.team_id);
    let Published::Confirmed(locator) = broker
        .publish(&Envelope {
            message_id: first.0,
            conversation_id: t.conversation_id,
            team_id: t.team_id,
            body: first.1.clone(),
            publish_key: first.0,
        })
        .await
    else {
        panic!("the earlier copy was not published");
    };
    // What an interrupted run left: open, its first item verified.
    let run = t
        .left_run(t.conversation_id, "to_jetstream", "copying", false)
        .await;
    sqlx::query(
        "INSERT INTO conversation_migration_items
             (migration_id, message_id, team_id, body_sha256, bytes, target_locator, state)
         SELECT $1, id, team_id, body_sha256, body_bytes, $3, 'verified'
           FROM conversation_messages WHERE id = $2",
    )
    .bind(run)
    .bind(first.0)
    .bind(&locator.0)
    .execute(t.pool())
    .await
    .unwrap();

    let plan = t.plan_of(Direction::ToJetStream).await;
    assert!(plan.resuming);
    let bytes: i64 = (0..5).map(|i| body_of(i).len() as i64).sum();
    assert_eq!(plan.bytes, bytes);
    let outcome = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!(outcome.migration_id, run);
    assert_eq!(outcome.copied, 4);
    assert_eq!(outcome.bytes, plan.bytes, "the summary counts as the plan");
    assert_eq!(outcome.bytes_copied, bytes - first.1.len() as i64);
}
