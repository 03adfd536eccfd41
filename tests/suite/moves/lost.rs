//! Bodies the broker lost under a move: the move back stops, the plan names
//! them, and `--tombstone-lost` records them lost and moves the rest.

use super::*;

// M5, M11: a body the broker no longer holds stops a move back to postgres
// with the "no longer holds" message; nothing is cut over and the thread reopens. One
// "not found" is not yet "no longer holds": the first run stops on an absence
// not confirmed, the run after the confirm delay on the body being gone.
#[tokio::test]
async fn a_body_the_broker_lost_stops_the_move_back() {
    let t = thread("mv-lost", 4).await;
    t.run(Direction::ToJetStream).await.unwrap();
    moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    let locator: String = sqlx::query_scalar(
        "SELECT canonical_locator FROM conversation_messages WHERE conversation_id = $1 AND seq = 2",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let sequence: u64 = locator.rsplit(':').next().unwrap().parse().unwrap();
    let stream = t
        .backends
        .broker()
        .unwrap()
        .js()
        .get_stream(ai_crew_sync::backend::jetstream::body_stream_name(
            t.team_id,
        ))
        .await
        .unwrap();
    assert!(stream.delete_message(sequence).await.unwrap());

    let err = t.run(Direction::ToPostgres).await.unwrap_err().to_string();
    // The mover dates the first miss inside that run: counting from its
    // answer (not from before the call) waits at least the delay after it,
    // however long the run took (CI saw "2.0 s so far" when counted from
    // before the call on a loaded machine).
    let first_miss = Instant::now();
    assert!(err.contains("stream leader"), "{err}");
    assert!(!err.contains("no longer holds the body"), "{err}");
    tokio::time::sleep(
        (BROKER_ABSENCE_CONFIRM_DELAY + Duration::from_millis(250))
            .saturating_sub(first_miss.elapsed()),
    )
    .await;
    let err = t.run(Direction::ToPostgres).await.unwrap_err().to_string();
    assert!(err.contains("no longer holds the body"), "{err}");
    // Issue 15 item 5: the error names the message it met.
    assert!(err.contains("(seq 2)"), "{err}");
    assert!(
        err.contains("tombstone it deliberately or restore the stream"),
        "{err}"
    );
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    assert_eq!(
        t.runs().await,
        [
            ("to_jetstream".into(), "cut_over".into()),
            ("to_postgres".into(), "failed".into()),
            ("to_postgres".into(), "failed".into())
        ]
    );
    // M12: the copies written back that never verified are cleared again.
    let written_back: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_messages WHERE conversation_id = $1 AND body <> ''",
    )
    .bind(t.conversation_id)
    .fetch_one(t.pool())
    .await
    .unwrap();
    let verified: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT i.message_id) FROM conversation_migration_items i
           JOIN conversation_migrations g ON g.id = i.migration_id
          WHERE g.direction = 'to_postgres' AND i.state = 'verified'",
    )
    .fetch_one(t.pool())
    .await
    .unwrap();
    assert_eq!(written_back, verified, "only verified copies stay");
}

/// `team stream`: provision or adopt the team's streams and record their
/// identities, as the operator's command does.
async fn team_stream(t: &Thread) {
    teams::provision_streams(
        t.pool(),
        &t.team,
        t.backends.broker().unwrap(),
        &sizes(),
        false,
        &test_actor(),
    )
    .await
    .expect("`team stream`");
}

/// The tombstone reason of each seq of the conversation (`None`: none).
async fn tombstones(t: &Thread) -> Vec<(i64, Option<String>)> {
    sqlx::query_as(
        "SELECT seq, tombstone_reason FROM conversation_messages
          WHERE conversation_id = $1 ORDER BY seq",
    )
    .bind(t.conversation_id)
    .fetch_all(t.pool())
    .await
    .unwrap()
}

// Issue 15 item 5 (M2, M5, M11; lost bodies as src/store/lost_bodies.rs
// knows them). A thread moved to JetStream, its PostgreSQL copies cleaned
// up, then the broker's store wiped and the stream re-created by `team
// stream`; two messages sent after land in the new stream (so old locators 1
// and 2 name them, 3 and 4 lie past its end). The plan names the four lost
// bodies; `--apply` refuses naming them and the two ways out, and changes
// nothing; `--apply --tombstone-lost` tombstones them ("the broker lost this
// body", audited) and moves the rest, whose bodies read fine.
#[tokio::test]
async fn a_move_over_bodies_the_broker_lost_names_them_and_tombstones_them_only_when_told() {
    let t = thread("mv-lost15", 4).await;
    team_stream(&t).await;
    t.run(Direction::ToJetStream).await.unwrap();
    moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    let lost_ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM conversation_messages WHERE conversation_id = $1 ORDER BY seq",
    )
    .bind(t.conversation_id)
    .fetch_all(t.pool())
    .await
    .unwrap();

    // The store wiped; `team stream` re-creates the stream.
    let broker = t.backends.broker().unwrap();
    broker
        .js()
        .delete_stream(ai_crew_sync::backend::jetstream::body_stream_name(
            t.team_id,
        ))
        .await
        .unwrap();
    team_stream(&t).await;
    t.send(t.conversation_id, "after the wipe, one")
        .await
        .unwrap();
    t.send(t.conversation_id, "after the wipe, two")
        .await
        .unwrap();
    let workers = t.app.start_publication_workers();
    eventually("the new messages to be published", async || {
        let stored: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_messages
              WHERE conversation_id = $1 AND seq > 4 AND publication_state = 'stored'",
        )
        .bind(t.conversation_id)
        .fetch_one(t.pool())
        .await
        .unwrap();
        stored == 2
    })
    .await;
    workers.stop().await;
    let before = t.snapshot().await;

    // The plan names them.
    let plan = t.plan_of(Direction::ToPostgres).await;
    let seqs: Vec<i64> = plan.lost.iter().map(|l| l.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "{plan:?}");
    let ids: Vec<Uuid> = plan.lost.iter().map(|l| l.message_id).collect();
    assert_eq!(ids, lost_ids);
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "postgres"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("4 bod(ies) lost by the broker (seqs 1, 2, 3, 4)")
            && shown.contains("--tombstone-lost")
            && !shown.contains("  ready  ("),
        "{shown}"
    );

    // `--apply` alone refuses, naming them, and changes nothing.
    let out = tokio::task::spawn_blocking({
        let mut command = t.command(&["migrate", "--to", "postgres", "--apply"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success(), "refused");
    let said = String::from_utf8_lossy(&out.stdout);
    for (seq, id) in (1..=4).zip(&lost_ids) {
        assert!(
            said.contains(&format!("seq {seq} (message {id})")),
            "{said}"
        );
    }
    assert!(
        said.contains("4 message(s) whose bodies the broker lost")
            && said.contains("restore the stream")
            && said.contains("--tombstone-lost"),
        "{said}"
    );
    assert_eq!(t.runs().await, [("to_jetstream".into(), "cut_over".into())]);
    assert!(tombstones(&t).await.iter().all(|(_, r)| r.is_none()));
    assert_eq!(
        t.conversation_row().await,
        ("jetstream".into(), "outbox".into(), false)
    );
    assert_eq!(t.snapshot().await, before);

    // With the flag: tombstoned (audited), and the rest moved.
    let out = tokio::task::spawn_blocking({
        let mut command =
            t.command(&["migrate", "--to", "postgres", "--apply", "--tombstone-lost"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("4 lost bod(ies) tombstoned"), "{said}");
    let lost = Some("the broker lost this body".to_owned());
    assert_eq!(
        tombstones(&t).await,
        [
            (1, lost.clone()),
            (2, lost.clone()),
            (3, lost.clone()),
            (4, lost.clone()),
            (5, None),
            (6, None)
        ]
    );
    let audited: Vec<Value> = sqlx::query_scalar(
        "SELECT detail FROM audit_log
          WHERE action = 'conversation.migrate_tombstone_lost' AND subject = $1",
    )
    .bind(t.conversation_id.to_string())
    .fetch_all(t.pool())
    .await
    .unwrap();
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(audited[0]["seqs"], json!([1, 2, 3, 4]));
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    // Every other body reads fine; the lost ones say why.
    let page = t
        .bob
        .call(
            "read_conversation",
            json!({"conversation_id": t.conversation_id, "after_seq": 0, "limit": 50}),
        )
        .await
        .unwrap();
    let messages = page["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 6, "{page}");
    for m in &messages[..4] {
        assert!(m["body"].is_null(), "{m}");
        assert_eq!(m["unavailable"]["reason"], "tombstoned", "{m}");
        assert_eq!(
            m["unavailable"]["detail"], "the broker lost this body",
            "{m}"
        );
    }
    assert_eq!(messages[4]["body"], "after the wipe, one");
    assert_eq!(messages[5]["body"], "after the wipe, two");
}

// Issue 33 item 16 (M5, M11, O18; lost_bodies: a body PostgreSQL still holds
// with its recorded digest is not lost). A thread moved to JetStream and
// cleaned up, then two more messages published to the stream whose local
// copies the sweep has not released yet; the broker's store wiped and the
// stream re-created by `team stream`. The plan names only the released
// bodies as lost, and `--apply --tombstone-lost` does what it said:
// tombstones those and moves the rest, the held bodies taken from
// PostgreSQL byte for byte (the broker holds nothing at their sequences).
#[tokio::test]
async fn a_move_back_after_a_wipe_keeps_the_bodies_postgres_still_holds() {
    let t = thread("mv-held33", 3).await;
    team_stream(&t).await;
    t.run(Direction::ToJetStream).await.unwrap();
    moves::cleanup(t.pool(), t.team_id, 0, true).await.unwrap();
    let held = ["held before the wipe, one", "held before the wipe, two ✓"];
    for body in held {
        t.send(t.conversation_id, body).await.unwrap();
    }
    let workers = t.app.start_publication_workers();
    eventually("the new messages to be published", async || {
        let stored: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_messages
              WHERE conversation_id = $1 AND seq > 3 AND publication_state = 'stored'
                AND canonical_locator IS NOT NULL",
        )
        .bind(t.conversation_id)
        .fetch_one(t.pool())
        .await
        .unwrap();
        stored == 2
    })
    .await;
    workers.stop().await;
    // Published to the stream, and still held by PostgreSQL (the sweep's
    // grace has not passed).
    assert_eq!(t.body_at(4).await, held[0]);
    assert_eq!(t.body_at(5).await, held[1]);

    // The store wiped; `team stream` re-creates the stream, empty.
    t.backends
        .broker()
        .unwrap()
        .js()
        .delete_stream(ai_crew_sync::backend::jetstream::body_stream_name(
            t.team_id,
        ))
        .await
        .unwrap();
    team_stream(&t).await;
    assert_eq!(t.stream_messages().await, 0);

    let plan = t.plan_of(Direction::ToPostgres).await;
    let seqs: Vec<i64> = plan.lost.iter().map(|l| l.seq).collect();
    assert_eq!(
        seqs,
        [1, 2, 3],
        "only the released bodies are lost: {plan:?}"
    );
    assert!(plan.blocked.is_none(), "{plan:?}");

    let out = tokio::task::spawn_blocking({
        let mut command =
            t.command(&["migrate", "--to", "postgres", "--apply", "--tombstone-lost"]);
        move || command.output().unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the apply does what its plan said: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("3 lost bod(ies) tombstoned"), "{said}");
    let lost = Some(ai_crew_sync::store::delivery::lost_bodies::LOST_BODY_REASON.to_owned());
    assert_eq!(
        tombstones(&t).await,
        [
            (1, lost.clone()),
            (2, lost.clone()),
            (3, lost),
            (4, None),
            (5, None)
        ]
    );
    assert_eq!(
        t.conversation_row().await,
        ("postgres".into(), "sync".into(), false)
    );
    // Kept byte for byte, in the row that is now the record, and read so.
    assert_eq!(t.body_at(4).await, held[0]);
    assert_eq!(t.body_at(5).await, held[1]);
    let page = t
        .bob
        .call(
            "read_conversation",
            json!({"conversation_id": t.conversation_id, "after_seq": 3, "limit": 50}),
        )
        .await
        .unwrap();
    let bodies: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap_or_else(|| panic!("no body: {m}")))
        .collect();
    assert_eq!(bodies, held, "{page}");
}
