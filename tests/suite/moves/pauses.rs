//! The write pause a move holds: who may lift it (abort, unpause, a stale
//! abort), two operators sharing one run, an abort that cannot finish, what
//! an abort clears, `is_paused`, and cleanup within the rollback window.

use super::*;
use crate::support::eventually;
use crate::write_fence::waiting_on;

// M14: cleanup refuses a negative window, never drops a body inside the
// window nor one of a move that did not cut over, and drops the rest only
// with --apply.
#[tokio::test]
async fn cleanup_respects_the_rollback_window_and_unfinished_moves() {
    let t = thread("mv-clean", 10).await;
    let failed_conversation = new_conversation(&t.alice, &t.bob, "failed move").await;
    t.send(failed_conversation, "keep me").await.unwrap();
    t.run(Direction::ToJetStream).await.unwrap();
    // A move of the other thread that failed: its bodies are not released.
    t.left_run(failed_conversation, "to_jetstream", "failed", false)
        .await;

    let err = moves::cleanup(t.pool(), t.team_id, -1, true)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "invalid");
    assert!(err.to_string().contains("negative"), "{err}");

    let inside = moves::cleanup(t.pool(), t.team_id, 168, true)
        .await
        .unwrap();
    assert_eq!(inside.messages, 0, "the move is younger than the window");
    sqlx::query("UPDATE conversation_migrations SET cut_over_at = now() - interval '200 hours' WHERE state = 'cut_over'")
        .execute(t.pool())
        .await
        .unwrap();
    // A move back that is open (interrupted) holds the rows it writes into.
    let back = t
        .left_run(t.conversation_id, "to_postgres", "copying", false)
        .await;
    let held = moves::cleanup(t.pool(), t.team_id, 168, true)
        .await
        .unwrap();
    assert_eq!(held.messages, 0, "nothing under an open move");
    sqlx::query("UPDATE conversation_migrations SET state = 'failed' WHERE id = $1")
        .bind(back)
        .execute(t.pool())
        .await
        .unwrap();
    // A jetstream thread cannot be switched to synchronous publication: its
    // sends would never reach the broker.
    let err = ai_crew_sync::store::delivery::outbox::set_publication(
        t.pool(),
        t.team_id,
        t.conversation_id,
        Publication::Sync,
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("migrate --to postgres"), "{err}");
    let report = moves::cleanup(t.pool(), t.team_id, 168, false)
        .await
        .unwrap();
    assert_eq!((report.messages, report.applied), (10, false));
    let kept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_messages WHERE body <> ''")
            .fetch_one(t.pool())
            .await
            .unwrap();
    assert_eq!(kept, 11, "a report changes nothing");

    let out = tokio::task::spawn_blocking({
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .args([
                "conversations",
                "cleanup",
                "--team",
                &t.team,
                "--apply",
                "--json",
            ])
            .env("DATABASE_URL", &t.app.database_url);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let applied: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (applied["messages"].as_i64(), applied["applied"].as_bool()),
        (Some(10), Some(true))
    );
    let left: Vec<String> =
        sqlx::query_scalar("SELECT body FROM conversation_messages WHERE body <> ''")
            .fetch_all(t.pool())
            .await
            .unwrap();
    assert_eq!(left, ["keep me"], "only the moved thread's copies went");
    assert_eq!(t.read_all().await.len(), 10, "read from the broker now");
}

// Issue 14 item 1 (M12, M4): two operators share one run of a move back to
// postgres. B's read-back fails at the backend boundary and B aborts (run
// failed, nothing paused); A, still in its bulk copy, then reaches the pause.
// A must not pause for a run that is no longer open: the thread is never left
// paused with no move owning the pause, and the same command moves it after.
#[tokio::test]
async fn two_operators_sharing_a_run_never_leave_a_pause_no_move_owns() {
    use std::sync::mpsc;
    let t = thread("mv-strand", 12).await;
    t.run(Direction::ToJetStream).await.unwrap();

    // Operator A is another process: its own thread, runtime and pool. It
    // reports its first copied body, then waits (a slow terminal) until B
    // is done; nothing of the test's runtime waits with it.
    let (reached_tx, mut reached) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (resume, resume_rx) = mpsc::channel::<()>();
    let (a_done_tx, a_done) = tokio::sync::oneshot::channel();
    let operator_a = std::thread::spawn({
        let (url, broker) = (
            t.app.database_url.clone(),
            t.backends.broker().unwrap().clone(),
        );
        let (team_id, conversation_id) = (t.team_id, t.conversation_id);
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let moved = runtime.block_on(async move {
                let pool = ai_crew_sync::db::connect(&url, 4).await.unwrap();
                let backends = Backends::with_broker(pool.clone(), broker);
                let resume_rx = std::sync::Mutex::new(resume_rx);
                let first = std::sync::atomic::AtomicBool::new(false);
                moves::run(
                    &pool,
                    &backends,
                    team_id,
                    conversation_id,
                    Direction::ToPostgres,
                    "operator a",
                    None,
                    &|_: &Progress| {
                        if !first.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            let _ = reached_tx.send(());
                            let _ = resume_rx
                                .lock()
                                .unwrap()
                                .recv_timeout(Duration::from_secs(60));
                        }
                    },
                )
                .await
                .map_err(|e| e.to_string())
            });
            let _ = a_done_tx.send(moved);
        }
    });
    tokio::time::timeout(Duration::from_secs(60), reached.recv())
        .await
        .expect("operator A copied its first body")
        .expect("operator A reports before it finishes");
    let b = t
        .run_on(
            &t.faulty(Faults {
                fetch_fails_after: Some(0),
                ..Faults::default()
            }),
            Direction::ToPostgres,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(b.contains("could not be read"), "{b}");
    assert_eq!(
        t.runs().await,
        [
            ("to_jetstream".into(), "cut_over".into()),
            ("to_postgres".into(), "failed".into())
        ]
    );
    resume.send(()).unwrap();
    let a = a_done.await.unwrap().unwrap_err();
    operator_a.join().unwrap();
    assert!(a.contains("given up by another process"), "{a}");
    assert!(a.contains("did not pause writes"), "{a}");

    let never_paused: bool = sqlx::query_scalar(
        "SELECT paused_at IS NULL FROM conversation_migrations WHERE direction = 'to_postgres'",
    )
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert!(never_paused, "the failed run never paused the thread");
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    t.send(t.conversation_id, "open after both failed")
        .await
        .unwrap();
    assert_eq!(t.plan_of(Direction::ToPostgres).await.blocked, None);
    let _workers = t.app.start_publication_workers();
    let back = t.run(Direction::ToPostgres).await.unwrap();
    assert_eq!(back.state, MoveState::CutOver);
    assert_eq!(t.read_all().await.len(), 13);
}

// M4: the pause is taken under the conversation's lock, so an abort that
// lands between the mover's open-run check and its pause cannot happen: the
// abort (queued first on the conversation row) fails the run, and the mover
// (queued second, at its pause) then finds the run no longer open and
// pauses nothing. (Mutation: drop `lock_conversation` from `pause`: the
// mover checks the run while it is still open, queues on the row at its
// pause update and pauses for a failed run after the abort; it stops only at
// its cutover, and the failed run records a pause.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m4_an_abort_between_the_open_run_check_and_the_pause_pauses_nothing() {
    let t = thread("mv-abortgap", 3).await;
    let (run, mut reached, resume) = stopping_at_first_copy(&t, Direction::ToJetStream);
    let mover = tokio::spawn(run);
    tokio::time::timeout(Duration::from_secs(60), reached.recv())
        .await
        .expect("the mover copied its first body")
        .expect("the mover reports before it finishes");
    let open: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_migrations WHERE conversation_id = $1 AND state = 'copying'",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();

    let mut held = t.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM conversations WHERE id = $1 FOR UPDATE")
        .bind(t.conversation_id)
        .execute(&mut *held)
        .await
        .unwrap();
    let abort = tokio::spawn({
        let pool = t.pool().clone();
        async move { moves::abort(&pool, open, "another operator gave up").await }
    });
    eventually("the abort queues on the conversation", async || {
        waiting_on(t.pool(), false).await >= 1
    })
    .await;
    resume.send(()).unwrap();
    // Every body copied and verified: the mover is past its copy, so what
    // it waits on is its pause.
    eventually("the mover queues at its pause", async || {
        let verified: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_migration_items
              WHERE migration_id = $1 AND state = 'verified'",
        )
        .bind(open)
        .fetch_one(t.pool())
        .await
        .unwrap();
        verified == 3 && waiting_on(t.pool(), false).await >= 2
    })
    .await;
    held.rollback().await.unwrap();
    abort.await.unwrap().unwrap();

    let said = mover.await.unwrap().unwrap_err().to_string();
    assert!(said.contains("given up by another process"), "{said}");
    assert!(said.contains("did not pause writes"), "{said}");
    let (state, paused): (String, bool) = sqlx::query_as(
        "SELECT state, paused_at IS NOT NULL FROM conversation_migrations WHERE id = $1",
    )
    .bind(open)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!((state.as_str(), paused), ("failed", false), "never paused");
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    t.send(t.conversation_id, "open after the abort")
        .await
        .unwrap();
}

// M12: an abort fails only an open run. One arriving late, for a run that
// has cut over or already failed, leaves it as it is: the moved thread stays
// moved and its run `cut_over`, and a failed run keeps its first error.
// (Mutation: drop `AND state IN ('planned', 'copying', 'verified')` from the
// abort's update: the finished run is marked failed with the late reason.)
#[tokio::test]
async fn m12_a_stale_abort_leaves_a_finished_or_failed_run_as_it_is() {
    let t = thread("mv-lateabort", 2).await;
    let moved = t.run(Direction::ToJetStream).await.unwrap();
    let failed = t
        .left_run(t.conversation_id, "to_postgres", "failed", false)
        .await;
    sqlx::query("UPDATE conversation_migrations SET error = 'the first reason' WHERE id = $1")
        .bind(failed)
        .execute(t.pool())
        .await
        .unwrap();
    for run in [moved.migration_id, failed] {
        moves::abort(t.pool(), run, "a late abort").await.unwrap();
    }
    let runs: Vec<(String, Option<String>, bool)> = sqlx::query_as(
        "SELECT state, error, failed_at IS NOT NULL FROM conversation_migrations
          WHERE conversation_id = $1 ORDER BY created_at",
    )
    .bind(t.conversation_id)
    .fetch_all(t.pool())
    .await
    .unwrap();
    assert_eq!(
        runs,
        [
            ("cut_over".into(), None, false),
            ("failed".into(), Some("the first reason".into()), false)
        ]
    );
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    assert_eq!(t.read_all().await.len(), 2);
}

// Issue 14 item 1, M2, M12: a thread paused with no move owning the pause
// (as the race above left it before the fix) is blocked in the plan, which
// says what lifts it; an abort of the run that is no longer open still lifts
// that pause. An open run, by contrast, is resumed (`resuming`).
#[tokio::test]
async fn m2_a_stale_abort_still_lifts_a_pause_no_move_owns() {
    let t = thread("mv-orphan", 2).await;
    let failed = t
        .left_run(t.conversation_id, "to_jetstream", "failed", true)
        .await;
    let plan = t.plan_of(Direction::ToJetStream).await;
    let blocked = plan.blocked.map(|b| b.to_string()).unwrap_or_default();
    assert!(blocked.contains("no move owns the pause"), "{blocked}");
    assert!(blocked.contains("conversations unpause"), "{blocked}");
    assert!(!plan.resuming);
    let refused = t.send(t.conversation_id, "refused").await.unwrap_err();
    assert!(refused["message"].as_str().unwrap().contains("paused"));

    moves::abort(t.pool(), failed, "late abort").await.unwrap();
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    assert_eq!(
        t.runs().await,
        [("to_jetstream".into(), "failed".into())],
        "the run is not touched again"
    );
    t.send(t.conversation_id, "open again").await.unwrap();

    // An open run owns its pause: the plan resumes it, an abort of an old
    // run leaves its pause alone.
    let open = t
        .left_run(t.conversation_id, "to_jetstream", "copying", true)
        .await;
    let plan = t.plan_of(Direction::ToJetStream).await;
    assert!(plan.resuming);
    assert_eq!(plan.blocked, None);
    moves::abort(t.pool(), failed, "late again").await.unwrap();
    assert!(moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    let outcome = t.run(Direction::ToJetStream).await.unwrap();
    assert_eq!(outcome.migration_id, open);
}

// Issue 14 item 1: `conversations unpause` lifts a pause no move owns,
// audited; refused (changing nothing) while a move is open.
#[tokio::test]
async fn unpause_lifts_only_a_pause_no_move_owns_and_is_audited() {
    let t = thread("mv-unpause", 1).await;
    let open = t
        .left_run(t.conversation_id, "to_jetstream", "copying", true)
        .await;
    let unpause = |json: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
        command
            .args(["conversations", "unpause", "--team", &t.team])
            .args(["--conversation", &t.conversation_id.to_string()])
            .env("DATABASE_URL", &t.app.database_url);
        if json {
            command.arg("--json");
        }
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    let audited = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM audit_log WHERE action = 'conversation.unpause' AND subject = $1",
        )
        .bind(t.conversation_id.to_string())
        .fetch_one(t.pool())
        .await
        .unwrap()
    };

    let out = unpause(false).await.unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("owns the pause"), "{said}");
    assert!(said.contains("migrate --to jetstream"), "{said}");
    assert!(moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    assert_eq!(audited().await, 0);

    sqlx::query("UPDATE conversation_migrations SET state = 'failed' WHERE id = $1")
        .bind(open)
        .execute(t.pool())
        .await
        .unwrap();
    let out = unpause(true).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(done["paused_seconds"].is_i64(), "{done}");
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    assert_eq!(audited().await, 1);
    t.send(t.conversation_id, "open").await.unwrap();

    let out = unpause(false).await.unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("not paused; nothing changed"));
    assert_eq!(audited().await, 1, "nothing to lift, nothing audited");
}

// M11: an abort that cannot finish (its connection is lost while it waits
// for the run's row) leaves the run open and paused; the move's own error is
// reported, not the abort's; the same command resumes the run and finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m11_an_abort_that_cannot_finish_leaves_the_run_open_and_paused_until_resumed() {
    let t = thread("mv-abortfail", 6).await;
    t.run(Direction::ToJetStream).await.unwrap();
    let open = t
        .left_run(t.conversation_id, "to_postgres", "copying", true)
        .await;
    // Another session holds the run's row, so the abort has to wait for it.
    let mut holder = t.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM conversation_migrations WHERE id = $1 FOR NO KEY UPDATE")
        .bind(open)
        .execute(&mut *holder)
        .await
        .unwrap();
    let mover = tokio::spawn({
        let (pool, backends) = (
            t.pool().clone(),
            t.faulty(Faults {
                fetch_fails_after: Some(0),
                ..Faults::default()
            }),
        );
        let (team_id, conversation_id) = (t.team_id, t.conversation_id);
        async move {
            moves::run(
                &pool,
                &backends,
                team_id,
                conversation_id,
                Direction::ToPostgres,
                "test",
                None,
                &|_: &Progress| {},
            )
            .await
        }
    });
    // The abort is waiting on the run's row: its connection is lost.
    eventually(
        "the abort to wait on the run's row (then its connection is killed)",
        async || {
            let killed: Option<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE '%SET state = ''failed''%'",
            )
            .fetch_optional(t.pool())
            .await
            .unwrap();
            killed == Some(true)
        },
    )
    .await;
    let err = mover.await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains("could not be read"),
        "the move's own error: {err}"
    );
    holder.rollback().await.unwrap();

    assert_eq!(
        t.runs().await,
        [
            ("to_jetstream".into(), "cut_over".into()),
            ("to_postgres".into(), "copying".into())
        ]
    );
    assert!(moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    let refused = t.send(t.conversation_id, "during").await.unwrap_err();
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("paused for a backend move")
    );
    let resumed = t.run(Direction::ToPostgres).await.unwrap();
    assert_eq!(resumed.migration_id, open, "the same run, resumed");
    assert_eq!(resumed.state, MoveState::CutOver);
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
}

// M12: an abort of a move back to postgres clears the copy written back for
// the message that failed (it has an item row, never verified) and keeps the
// verified ones; every body still reads right from the broker.
#[tokio::test]
async fn m12_an_abort_clears_the_unverified_copies_written_back() {
    let t = thread("mv-clear", 6).await;
    let bodies = t.read_all().await;
    t.run(Direction::ToJetStream).await.unwrap();
    moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    let err = t
        .run_on(
            &t.faulty(Faults {
                fetch_fails_after: Some(3),
                ..Faults::default()
            }),
            Direction::ToPostgres,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("could not be read"), "{err}");
    let item: String = sqlx::query_scalar(
        "SELECT i.state FROM conversation_migration_items i
           JOIN conversation_messages m ON m.id = i.message_id
           JOIN conversation_migrations g ON g.id = i.migration_id
          WHERE m.conversation_id = $1 AND m.seq = 4 AND g.direction = 'to_postgres'",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(item, "copied", "the failing message has an item row");
    assert_eq!(t.body_at(4).await, "", "its unverified copy is cleared");
    for seq in 1..=3 {
        assert_eq!(t.body_at(seq).await, bodies[&seq], "verified {seq} kept");
    }
    assert_eq!(t.conversation_row().await.0, "jetstream");
    assert_eq!(t.read_all().await, bodies);
}

// M13 and issue 14 item 5: `is_paused` answers true for a paused thread and
// false for an open one; an unknown conversation is an error, not "open".
#[tokio::test]
async fn m13_is_paused_answers_for_a_paused_thread_and_refuses_an_unknown_one() {
    let t = thread("mv-paused", 1).await;
    assert!(!moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    t.left_run(t.conversation_id, "to_jetstream", "copying", true)
        .await;
    assert!(moves::is_paused(t.pool(), t.conversation_id).await.unwrap());
    let err = moves::is_paused(t.pool(), Uuid::new_v4())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "not_found");
    assert!(err.to_string().contains("no conversation"), "{err}");
}
