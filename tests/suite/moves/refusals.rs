//! What a move plans and refuses before it writes: the plan that writes
//! nothing, a message waiting out a long retry, sends racing the pause,
//! concurrent operators, a target without streams, a message whose
//! publication failed.

use super::*;
use crate::write_fence::queued_on_one_row;

// Issue 14 item 2. A message accepted before the pause whose publication is
// waiting out a retry backoff longer than the move may pause writes: the move
// is refused before copying or pausing anything and the slot keeps its schedule and its attempts
// (cutting the backoff short would spend them faster than O8 allows). Once
// the slot is due and stored, the same command moves the thread.
#[tokio::test]
async fn a_move_is_refused_unpaused_while_a_message_waits_out_a_long_retry_backoff() {
    let t = thread("mv-backoff", 3).await;
    t.run(Direction::ToJetStream).await.unwrap();
    let sent = t.send(t.conversation_id, "in the outbox").await.unwrap();
    assert_eq!(sent["publication"], "pending_publication");
    // As a slot looks after a few transient failures.
    sqlx::query(
        "UPDATE conversation_outbox
            SET attempts = 5, last_error = 'broker busy',
                next_attempt_at = now() + interval '10 minutes'
          WHERE conversation_id = $1",
    )
    .bind(t.conversation_id)
    .execute(t.pool())
    .await
    .unwrap();
    let _workers = t.app.start_publication_workers();

    let refused = t.run(Direction::ToPostgres).await.unwrap_err().to_string();
    assert!(
        refused.contains("waiting to retry their publication"),
        "{refused}"
    );
    assert!(refused.contains("broker busy"), "{refused}");
    assert!(
        refused.contains("Nothing was copied, paused or moved"),
        "{refused}"
    );
    // Refused before any work: no body was copied back (no item recorded,
    // no run opened).
    let items: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_migration_items i
           JOIN conversation_migrations g ON g.id = i.migration_id
          WHERE g.direction = 'to_postgres'",
    )
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(items, 0, "no body copied before the refusal");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false),
        "not paused, not moved"
    );
    let (attempts, later): (i32, bool) = sqlx::query_as(
        "SELECT attempts, next_attempt_at > now() + interval '5 minutes'
           FROM conversation_outbox WHERE conversation_id = $1",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(
        (attempts, later),
        (5, true),
        "the schedule is the slot's own"
    );

    // Its time comes; the drain stores it; the same command moves the thread.
    sqlx::query(
        "UPDATE conversation_outbox SET next_attempt_at = now() WHERE conversation_id = $1",
    )
    .bind(t.conversation_id)
    .execute(t.pool())
    .await
    .unwrap();
    let back = t.run(Direction::ToPostgres).await.unwrap();
    assert_eq!((back.copied, back.state), (4, MoveState::CutOver));
    let (state, body): (String, String) = sqlx::query_as(
        "SELECT publication_state, body FROM conversation_messages WHERE id = $1::uuid",
    )
    .bind(sent["message_id"].as_str().unwrap())
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!((state.as_str(), body.as_str()), ("stored", "in the outbox"));
}

// M1, M2: the plan writes nothing and says what a move would do.
#[tokio::test]
async fn the_plan_writes_nothing_and_explains_each_conversation() {
    let t = thread("mv-plan", 5).await;
    let other = new_conversation(&t.alice, &t.bob, "empty").await;
    let err = "s3".parse::<Direction>().unwrap_err().to_string();
    assert!(
        err.contains("jetstream") && err.contains("postgres"),
        "{err}"
    );

    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "jetstream", "--json"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plans: Value = serde_json::from_slice(&out.stdout).unwrap();
    let plans = plans.as_array().unwrap();
    assert_eq!(plans.len(), 2);
    let first = &plans[0];
    assert_eq!(first["conversation_id"], t.conversation_id.to_string());
    assert_eq!(first["messages"], 5);
    let bytes: i64 = (0..5).map(|i| body_of(i).len() as i64).sum();
    assert_eq!(first["bytes"], bytes);
    assert_eq!(first["already_there"], 0);
    assert_eq!(first["blocked"], Value::Null);
    assert_eq!(first["resuming"], false);
    assert_eq!(plans[1]["conversation_id"], other.to_string());
    assert!(t.runs().await.is_empty(), "nothing written");
    assert_eq!(t.conversation_row().await.0, "postgres");

    // The move as an operator runs it without a terminal: progress as plain
    // lines on stderr, a summary per conversation on stdout.
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&[
            "migrate",
            "--to",
            "jetstream",
            "--apply",
            "--conversation",
            &t.conversation_id.to_string(),
        ]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains(&format!(
            "{}: cut over to jetstream (5 copied",
            t.conversation_id
        )),
        "{summary}"
    );
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(progress.contains("copying"), "{progress}");
    assert!(progress.contains("cut_over 5/5 messages"), "{progress}");

    // Moved already: the plan says so.
    let plans = moves::plan(
        t.pool(),
        &t.backends,
        t.team_id,
        Direction::ToJetStream,
        &[t.conversation_id],
    )
    .await
    .unwrap();
    assert_eq!(
        plans[0].blocked,
        Some(moves::Blocked::AlreadyThere(
            ai_crew_sync::backend::BackendKind::Jetstream
        ))
    );
    assert_eq!(plans[0].already_there, 5);
    // Asked again, the move has nothing to do: where it was asked to be is
    // success for a script (issue 33 item 15).
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&[
            "migrate",
            "--to",
            "jetstream",
            "--apply",
            "--conversation",
            &t.conversation_id.to_string(),
        ]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "already there exits 0: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("skipped (already on jetstream)"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

// M4: sends racing the pause either commit before it (and are moved) or are
// refused with the pause explained; none is lost or half-moved. Other
// threads keep working.
#[tokio::test]
async fn sends_racing_the_pause_commit_before_it_or_are_refused() {
    // Enough history for the senders to be well under way when the pause
    // comes; what they send during the copy is the tail, copied paused.
    const HISTORY: usize = 100;
    let t = thread("mv-race", HISTORY).await;
    let elsewhere = new_conversation(&t.alice, &t.bob, "elsewhere").await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut senders = Vec::new();
    for w in 0..4 {
        let client = McpClient::connect(
            &t.app.mcp_url(),
            &ai_crew_sync::store::identity::tokens::issue(
                t.pool(),
                &in_team(&t.team),
                "alice",
                None,
            )
            .await
            .unwrap()
            .token,
            None,
        )
        .await
        .unwrap();
        let stop = stop.clone();
        let conversation_id = t.conversation_id;
        senders.push(tokio::spawn(async move {
            let (mut accepted, mut refused) = (Vec::new(), 0);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                match client
                    .call(
                        "send_conversation_message",
                        json!({"conversation_id": conversation_id, "body": format!("racer {w}/{i}"),
                               "request_id": Uuid::new_v4()}),
                    )
                    .await
                {
                    Ok(sent) => {
                        accepted.push(sent["message_id"].as_str().unwrap().to_string());
                        // Steady sends rather than a flood: what the copy
                        // misses becomes the paused tail.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => {
                        let text = e["message"].as_str().unwrap_or_default();
                        assert!(text.contains("paused for a backend move"), "{e}");
                        assert!(text.contains("s so far"), "{e}");
                        refused += 1;
                        // Refused: the pause has begun. Retry as a client
                        // told to wait does, not in a loop that takes the
                        // CPU the paused move needs for its tail.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            (accepted, refused)
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let outcome = t.run(Direction::ToJetStream).await;
    // The other thread was never paused.
    let elsewhere_sent = t.send(elsewhere, "unaffected").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let outcome = outcome.unwrap();
    elsewhere_sent.unwrap();
    let mut accepted = Vec::new();
    for sender in senders {
        let (ids, _) = sender.await.unwrap();
        accepted.extend(ids);
    }
    assert!(outcome.paused_ms >= 0);
    // Nothing was on jetstream before: every message the thread held at the
    // cut-over, the history and what the racers sent while it copied, was
    // copied by this run, and none is counted as found there.
    assert_eq!(outcome.skipped, 0, "{outcome:?}");
    // Every accepted send is in the thread, exactly once, and on jetstream
    // (moved before the cutover) or sent after it (through the outbox).
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT id::text, backend, publication_state FROM conversation_messages WHERE conversation_id = $1",
    )
    .bind(t.conversation_id)
    .fetch_all(t.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), HISTORY + accepted.len());
    let present: std::collections::HashSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    for id in &accepted {
        assert!(
            present.contains(id.as_str()),
            "accepted send {id} is missing"
        );
    }
    for (id, backend, state) in &rows {
        assert_eq!(backend, "jetstream", "{id} half-moved: {state}");
    }
}

// M3: two operators starting the same move make one run; a move the other
// way while one is open is a conflict (and the open one is resumable).
#[tokio::test]
async fn concurrent_operators_share_one_run_and_opposite_directions_conflict() {
    let t = thread("mv-ops", 200).await;
    let (a, b) = tokio::join!(t.run(Direction::ToJetStream), t.run(Direction::ToJetStream));
    assert!(a.is_ok() || b.is_ok(), "{a:?} {b:?}");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert_eq!(t.stream_messages().await, 200);
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );

    // A process died holding an open move back to postgres...
    let other = new_conversation(&t.alice, &t.bob, "second").await;
    t.send(other, "one").await.unwrap();
    t.left_run(other, "to_jetstream", "copying", true).await;
    let t2 = Thread {
        conversation_id: other,
        ..t
    };
    let err = t2.run(Direction::ToPostgres).await.unwrap_err();
    assert_eq!(err.kind(), "conflict");
    assert!(err.to_string().contains("already open"), "{err}");
    // ...and its thread refuses sends, saying why, while reads keep working.
    let refused = t2.send(other, "during").await.unwrap_err();
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("paused for a backend move")
    );
    assert_eq!(t2.read_all().await.len(), 1);
    // The same direction resumes it and lifts the pause.
    t2.run(Direction::ToJetStream).await.unwrap();
    assert_eq!(
        t2.runs().await,
        [("to_jetstream".into(), "cut_over".into())]
    );
    assert!(!moves::is_paused(t2.pool(), other).await.unwrap());
}

// M3: two operators opening opposite moves at once: the one that takes the
// conversation's lock second is refused with the conflict message (the open
// move named, what to do), not a unique-index error, and the first moves the
// thread. Both queue on the conversation row an uncommitted open run holds,
// so without the lock they would both pass the open-run check and race on
// the one-open-run index instead. The first stops at its first copy until
// the second has answered, so its run is still open when the second looks.
// (Mutation: drop `lock_conversation` from `open_run`: the loser's error is
// the unique index's, `conversation_migrations_one_open`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m3_the_loser_of_two_concurrent_operators_gets_the_conflict_message() {
    let t = thread("mv-loser", 4).await;
    let (first, mut reached, resume) = stopping_at_first_copy(&t, Direction::ToJetStream);
    let second = {
        let (pool, backends) = (t.pool().clone(), t.backends.clone());
        let (team_id, conversation_id) = (t.team_id, t.conversation_id);
        async move {
            let answer = moves::run(
                &pool,
                &backends,
                team_id,
                conversation_id,
                Direction::ToPostgres,
                "second operator",
                None,
                &|_: &Progress| {},
            )
            .await;
            let _ = resume.send(());
            answer
        }
    };
    let hold: &'static str = Box::leak(
        format!(
            "WITH held AS (SELECT team_id, id FROM conversations WHERE id = '{}' FOR UPDATE)
             INSERT INTO conversation_migrations
                 (id, team_id, conversation_id, direction, state, started_by)
             SELECT gen_random_uuid(), team_id, id, 'to_jetstream', 'copying', 'held' FROM held",
            t.conversation_id
        )
        .into_boxed_str(),
    );
    let (first, second) = queued_on_one_row(t.pool(), hold, first, second).await;
    let outcomes = [&first, &second].map(|o| o.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    let loser = match (first, second) {
        (Ok(moved), Err(loser)) => {
            assert_eq!(moved.state, MoveState::CutOver);
            loser
        }
        _ => panic!("one operator moves, the other is refused: {outcomes:?}"),
    };
    assert!(reached.try_recv().is_ok(), "the first stopped at its copy");
    assert_eq!(loser.kind(), "conflict", "{loser}");
    let said = loser.to_string();
    assert!(said.contains("is already open"), "{said}");
    assert!(said.contains("to jetstream"), "{said}");
    assert!(said.contains("run the same command again"), "{said}");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
}

// Issue 14 items 2 and 6: the plan refuses a target whose streams are missing
// or too small for a full body, before anything is written; an open run whose
// plan fails is aborted (its pause lifted), not left holding the thread.
#[tokio::test]
async fn a_target_not_provisioned_is_refused_before_anything_is_written() {
    let t = thread("mv-target", 3).await;
    let broker = t.backends.broker().unwrap().clone();
    broker.remove_team_streams(t.team_id).await.unwrap();
    let err = moves::plan(
        t.pool(),
        &t.backends,
        t.team_id,
        Direction::ToJetStream,
        &[],
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("do not exist"), "{err}");
    assert!(err.contains("team stream"), "{err}");
    assert!(t.runs().await.is_empty(), "the plan wrote nothing");

    // A move left open and paused by a process that died: its plan now
    // fails, and the run is given up with the pause lifted.
    t.left_run(t.conversation_id, "to_jetstream", "copying", true)
        .await;
    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("do not exist"), "{err}");
    assert_eq!(t.runs().await, [("to_jetstream".into(), "failed".into())]);
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    let copied: i64 = sqlx::query_scalar("SELECT count(*) FROM conversation_migration_items")
        .fetch_one(t.pool())
        .await
        .unwrap();
    assert_eq!(copied, 0, "no body copied");
    t.send(t.conversation_id, "open").await.unwrap();

    // Streams that cannot take a full body are refused too.
    broker
        .provision_team(t.team_id, &sizes(), false)
        .await
        .unwrap();
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
    config.max_message_size = 64 * 1024;
    broker.js().update_stream(config).await.unwrap();
    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("takes at most 65536 bytes"), "{err}");
    assert!(err.contains("--update-quotas"), "{err}");
    assert_eq!(t.stream_messages().await, 0);

    broker
        .provision_team(t.team_id, &sizes(), true)
        .await
        .unwrap();
    let moved = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!((moved.copied, moved.state), (4, MoveState::CutOver));
}

// Issue 14 item 4: a message whose publication failed for good is stored on
// no backend. The plan blocks the move with the count and what to do; a run
// is refused before copying and never cuts over with it left behind.
#[tokio::test]
async fn a_message_whose_publication_failed_blocks_the_move() {
    let t = thread("mv-failedmsg", 3).await;
    outbox::set_publication(t.pool(), t.team_id, t.conversation_id, Publication::Outbox)
        .await
        .unwrap();
    let sent = t.send(t.conversation_id, "never stored").await.unwrap();
    assert_eq!(sent["publication"], "pending_publication");
    let refusing = PostgresBackend::with_faults(
        t.pool().clone(),
        Faults {
            fatal: true,
            ..Faults::default()
        },
    );
    outbox::run_once(t.pool(), &refusing, "test").await.unwrap();
    let state: String = sqlx::query_scalar(
        "SELECT publication_state FROM conversation_messages WHERE id = $1::uuid",
    )
    .bind(sent["message_id"].as_str().unwrap())
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(state, "failed");

    let plan = t.plan_of(Direction::ToJetStream).await;
    assert_eq!((plan.messages, plan.failed), (4, 1));
    let blocked = plan.blocked.map(|b| b.to_string()).unwrap_or_default();
    assert!(blocked.contains("1 message(s)"), "{blocked}");
    assert!(blocked.contains("tombstone"), "{blocked}");

    let err = t.run(Direction::ToJetStream).await.unwrap_err().to_string();
    assert!(err.contains("1 message(s)"), "{err}");
    assert!(err.contains("Nothing was copied or cut over"), "{err}");
    assert_eq!(t.stream_messages().await, 0, "no body copied");
    assert_eq!(t.conversation_row().await.0, "postgres");
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());

    // Issue 33 item 15: the operator's command, as a script runs it, exits
    // non-zero when a conversation it was asked to move is refused, and says
    // which and why (here in its JSON outcome).
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "jetstream", "--apply", "--json"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a refused conversation fails the command: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcomes: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        outcomes[0]["conversation_id"],
        t.conversation_id.to_string()
    );
    assert_eq!(outcomes[0]["state"], "skipped");
    assert!(
        outcomes[0]["reason"]
            .as_str()
            .unwrap()
            .contains("1 message(s)"),
        "{outcomes}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("1 of the 1 conversation(s)"), "{stderr}");
    assert_eq!(t.conversation_row().await.0, "postgres");
}
