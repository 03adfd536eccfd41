//! Bodies the broker no longer holds: a body gone reads tombstoned, a silent
//! broker reads unreachable, an absence counts only once confirmed, a
//! re-created stream makes old bodies read lost, and `conversations
//! declare-lost` tombstones what the broker cannot return.

use super::*;

// O19 and "Reading": a released body the broker no longer holds is
// tombstoned at read time with its reason, and the page still returns every
// other message with its body; a broker that does not answer makes the
// released bodies `unreachable` (not tombstoned: not lost), and they read
// again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_gone_from_the_broker_is_tombstoned_and_a_silent_broker_is_unreachable() {
    let mut server = OwnedNats::start();
    let app = TestApp::builder().broker_at(&server.url()).spawn().await;
    let t = Routed::new(&app, "jsb7").await;
    let first = t.send("first").await;
    let gone = t.send("deleted from the stream").await;
    let third = t.send("third").await;
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&[first, gone, third]).await;
    workers.stop().await;
    assert_eq!(t.release().await, 3);

    assert!(
        body_stream(&server.url(), t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[1]))
            .await
            .unwrap()
    );
    // One "not found" is not an absence: unreachable until the stream leader
    // still says so after the confirm delay, then tombstoned.
    let page = t.read_as_bob().await;
    assert_eq!(in_page(&page, gone)["unavailable"]["reason"], "unreachable");
    assert!(t.row(gone).await.tombstone_reason.is_none());
    let page = eventually("the absence confirmed", async || {
        let page = t.read_as_bob().await;
        (in_page(&page, gone)["unavailable"]["reason"] == "tombstoned").then_some(page)
    })
    .await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 3);
    assert_eq!(in_page(&page, first)["body"], "first");
    assert_eq!(in_page(&page, third)["body"], "third");
    let tombstoned = in_page(&page, gone);
    assert!(tombstoned["body"].is_null());
    assert_eq!(tombstoned["unavailable"]["reason"], "tombstoned");
    assert!(
        tombstoned["unavailable"]["detail"]
            .as_str()
            .unwrap()
            .contains("no longer holds"),
        "{tombstoned}"
    );
    assert_eq!(page["next_after_seq"], 3);
    let row = t.row(gone).await;
    assert!(
        row.tombstone_reason.is_some(),
        "O19: recorded, not just shown: {row:?}"
    );
    assert_eq!(row.publication_state, "stored", "the message itself stays");

    // The broker stops answering: unreachable, not tombstoned.
    tokio::task::block_in_place(|| server.stop());
    let page = t.read_as_bob().await;
    assert_eq!(page["messages"].as_array().unwrap().len(), 3);
    for id in [first, third] {
        let shown = in_page(&page, id);
        assert!(shown["body"].is_null(), "{shown}");
        assert_eq!(shown["unavailable"]["reason"], "unreachable", "{shown}");
        assert!(t.row(id).await.tombstone_reason.is_none(), "not tombstoned");
    }
    assert_eq!(in_page(&page, gone)["unavailable"]["reason"], "tombstoned");

    tokio::task::block_in_place(|| server.restart());
    wait_reachable(app.broker()).await;
    eventually("the bodies read again", async || {
        let page = t.read_as_bob().await;
        (in_page(&page, first)["body"] == "first" && in_page(&page, third)["body"] == "third")
            .then_some(())
    })
    .await;
}

// Issue 13, item 7: one "not found" from the broker never tombstones a
// released body. The team's body stream is lost and created again empty,
// outside `team stream`: every released body reads `unreachable`,
// none is tombstoned. Restored into the stream at their sequences (as from a
// backup), they read again. One that stays missing is tombstoned, with its
// reason, only once the stream leader still answers "not found" at least
// the confirm delay after the first answer.
#[tokio::test]
async fn a_body_missing_after_the_stream_is_reprovisioned_is_unreachable_until_its_absence_is_confirmed()
 {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let t = Routed::new(&app, "jsb13").await;
    let bodies = ["restored from a backup", "also restored", "never restored"];
    let mut ids = Vec::new();
    for body in bodies {
        ids.push(t.send(body).await);
    }
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&ids).await;
    workers.stop().await;
    assert_eq!(t.release().await, 3, "every local copy released");
    let lost = ids[2];

    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    let stream = body_stream_name(t.team_id);
    js.delete_stream(&stream).await.unwrap();
    // Re-created on the broker behind the bus's back (as an operator's
    // `nats stream restore` would), not through `team stream`: the bus has
    // recorded no new identity, so it cannot know the bodies are lost (the
    // identity case is `a_stream_recreated_…` below).
    app.broker()
        .provision_team(t.team_id, &StreamSizes::default(), false)
        .await
        .expect("the streams created again");
    assert_eq!(stream_messages(&nats_url(), t.team_id).await, 0);

    let first_miss = Instant::now();
    let page = t.read_as_bob().await;
    for id in &ids {
        let shown = in_page(&page, *id);
        assert!(shown["body"].is_null(), "{shown}");
        assert_eq!(shown["unavailable"]["reason"], "unreachable", "{shown}");
        assert!(
            shown["unavailable"]["detail"]
                .as_str()
                .unwrap()
                .contains("stream leader"),
            "{shown}"
        );
        assert!(
            t.row(*id).await.tombstone_reason.is_none(),
            "one \"not found\" tombstones nothing"
        );
    }

    // The backup: every body again at its sequence, then the one that was
    // not in it deleted.
    let mut in_order: Vec<(u64, usize)> = locators
        .iter()
        .enumerate()
        .map(|(i, l)| (sequence(t.team_id, l), i))
        .collect();
    in_order.sort();
    for (seq, i) in &in_order {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Acs-Message-Id", ids[*i].to_string().as_str());
        headers.insert(
            "Acs-Conversation-Id",
            t.conversation_id.to_string().as_str(),
        );
        headers.insert("Acs-Team-Id", t.team_id.to_string().as_str());
        let ack = js
            .publish_with_headers(
                body_subject(t.team_id, t.conversation_id),
                headers,
                bodies[*i].into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(ack.sequence, *seq, "restored at its sequence");
    }
    assert!(
        body_stream(&nats_url(), t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[2]))
            .await
            .unwrap()
    );

    let page = t.read_as_bob().await;
    assert_eq!(in_page(&page, ids[0])["body"], bodies[0]);
    assert_eq!(in_page(&page, ids[1])["body"], bodies[1]);
    if first_miss.elapsed() < BROKER_ABSENCE_CONFIRM_DELAY {
        assert_eq!(in_page(&page, lost)["unavailable"]["reason"], "unreachable");
        assert!(t.row(lost).await.tombstone_reason.is_none());
    }

    // Two looks from the leader, the confirm delay apart: gone, and said why.
    tokio::time::sleep(
        (BROKER_ABSENCE_CONFIRM_DELAY + Duration::from_millis(250))
            .saturating_sub(first_miss.elapsed()),
    )
    .await;
    let page = t.read_as_bob().await;
    let shown = in_page(&page, lost);
    assert!(shown["body"].is_null(), "{shown}");
    assert_eq!(shown["unavailable"]["reason"], "tombstoned", "{shown}");
    assert!(
        shown["unavailable"]["detail"]
            .as_str()
            .unwrap()
            .contains("no longer holds"),
        "{shown}"
    );
    assert!(t.row(lost).await.tombstone_reason.is_some(), "recorded");
    assert_eq!(in_page(&page, ids[0])["body"], bodies[0]);
    for id in &ids[..2] {
        assert!(t.row(*id).await.tombstone_reason.is_none());
    }
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

/// The identity the bus recorded for the team's body stream, and the one
/// each message's locator was stamped with.
async fn identities(t: &Routed<'_>, ids: &[Uuid]) -> (Option<String>, Vec<Option<String>>) {
    let recorded: Option<String> = sqlx::query_scalar(
        "SELECT created_at_broker::text FROM team_streams WHERE team_id = $1 AND stream = $2",
    )
    .bind(t.team_id)
    .bind(body_stream_name(t.team_id))
    .fetch_optional(&t.app.pool)
    .await
    .unwrap();
    let mut stamps = Vec::new();
    for id in ids {
        stamps.push(
            sqlx::query_scalar(
                "SELECT stream_created_at::text FROM conversation_messages WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&t.app.pool)
            .await
            .unwrap(),
        );
    }
    (recorded, stamps)
}

/// An `unavailable: unreachable` that promises nothing about the body.
fn assert_unreachable_without_promise(shown: &Value) {
    assert!(shown["body"].is_null(), "{shown}");
    assert_eq!(shown["unavailable"]["reason"], "unreachable", "{shown}");
    let detail = shown["unavailable"]["detail"].as_str().unwrap();
    assert!(
        !detail.contains("not lost"),
        "an unreachable body is not promised to be safe: {shown}"
    );
}

async fn team_stream(t: &Routed<'_>, slug: &str) {
    teams::provision_streams(
        &t.app.pool,
        slug,
        t.app.broker(),
        &StreamSizes::default(),
        false,
        &test_actor(),
    )
    .await
    .expect("`team stream` re-run");
}

// Issue 15, item 4: lost is lost, said once, the same way every time. The
// broker's store is wiped (the team's body stream deleted): until the bus
// knows, old bodies read `unreachable` and nothing promises they are safe.
// The stream comes back empty outside the bus and new messages are published
// into it, so old locators collide with new sequences (1, 2) or lie past its
// end (3): still unknown to the bus, still `unreachable`. Once `team stream`
// records the new stream's identity, every old body reads tombstoned "the
// broker lost this body" on the first read, whatever the new stream holds at
// its sequence, and the new ones (published before the identity was
// recorded) read fine. A broker restarted with its store keeps the identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_after_a_wipe_makes_every_old_body_read_lost_at_once_and_new_ones_read()
{
    let mut server = OwnedNats::start();
    let app = TestApp::builder().broker_at(&server.url()).spawn().await;
    let t = Routed::new(&app, "jsb15").await;
    let old_bodies = ["old one", "old two", "old three"];
    let mut old = Vec::new();
    for body in old_bodies {
        old.push(t.send(body).await);
    }
    let workers = app.start_publication_workers();
    t.wait_stored(&old).await;
    workers.stop().await;
    assert_eq!(t.release().await, 3, "every local copy released");
    let (recorded, stamps) = identities(&t, &old).await;
    assert!(recorded.is_some(), "`team stream` recorded the identity");
    assert!(
        stamps.iter().all(|s| *s == recorded),
        "each locator stamped with the identity it was written under: {stamps:?}"
    );

    // A silent broker: unreachable, and no promise.
    tokio::task::block_in_place(|| server.stop());
    let page = t.read_as_bob().await;
    for id in &old {
        assert_unreachable_without_promise(in_page(&page, *id));
    }
    // Restarted with its store: the same stream, the same identity.
    tokio::task::block_in_place(|| server.restart());
    wait_reachable(app.broker()).await;
    team_stream(&t, "jsb15").await;
    assert_eq!(identities(&t, &[]).await.0, recorded, "a restart keeps it");
    let page = eventually("the bodies read again", async || {
        let page = t.read_as_bob().await;
        (in_page(&page, old[2])["body"] == old_bodies[2]).then_some(page)
    })
    .await;
    assert_eq!(in_page(&page, old[0])["body"], old_bodies[0]);

    // The store wiped: the stream is gone.
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream(body_stream_name(t.team_id)).await.unwrap();
    let page = t.read_as_bob().await;
    for id in &old {
        assert_unreachable_without_promise(in_page(&page, *id));
        assert!(t.row(*id).await.tombstone_reason.is_none());
    }

    // Back empty, outside `team stream`; new messages take sequences 1, 2.
    app.broker()
        .provision_team(t.team_id, &StreamSizes::default(), false)
        .await
        .unwrap();
    let new = [t.send("new one").await, t.send("new two").await];
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&new).await;
    workers.stop().await;
    assert_eq!(t.release().await, 2);
    let mut taken: Vec<u64> = locators.iter().map(|l| sequence(t.team_id, l)).collect();
    taken.sort();
    assert_eq!(
        taken,
        [1, 2],
        "the old locators 1 and 2 now name new messages"
    );
    let page = t.read_as_bob().await;
    for id in &old {
        assert_unreachable_without_promise(in_page(&page, *id));
        assert!(t.row(*id).await.tombstone_reason.is_none(), "not known yet");
    }

    // `team stream` re-run: the bus learns the stream was re-created.
    team_stream(&t, "jsb15").await;
    let (now_recorded, _) = identities(&t, &[]).await;
    assert_ne!(
        now_recorded, recorded,
        "a re-created stream has a new identity"
    );
    let page = t.read_as_bob().await;
    for id in &old {
        let shown = in_page(&page, *id);
        assert!(shown["body"].is_null(), "{shown}");
        assert_eq!(shown["unavailable"]["reason"], "tombstoned", "{shown}");
        assert_eq!(shown["unavailable"]["detail"], "the broker lost this body");
        let row = t.row(*id).await;
        assert_eq!(
            row.tombstone_reason.as_deref(),
            Some("the broker lost this body"),
            "recorded, not only shown: {row:?}"
        );
        assert_eq!(row.publication_state, "stored", "the message itself stays");
    }
    assert_eq!(in_page(&page, new[0])["body"], "new one");
    assert_eq!(in_page(&page, new[1])["body"], "new two");
    let (_, stamps) = identities(&t, &new).await;
    assert!(
        stamps.iter().all(|s| *s == now_recorded),
        "a body found in the new stream is stamped with it: {stamps:?}"
    );
    // Said once: the same answer on every later read.
    let again = t.read_as_bob().await;
    for id in &old {
        assert_eq!(
            in_page(&again, *id)["unavailable"]["detail"],
            "the broker lost this body"
        );
    }
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

// Issue 15, item 4: the body sweep records bodies of a re-created stream
// lost without anyone reading them, and leaves the new stream's bodies be.
#[tokio::test]
async fn the_sweep_records_bodies_of_a_recreated_stream_lost_without_a_read() {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let t = Routed::new(&app, "jsb15s").await;
    let old = [t.send("old one").await, t.send("old two").await];
    let workers = app.start_publication_workers();
    t.wait_stored(&old).await;
    workers.stop().await;
    assert_eq!(t.release().await, 2);
    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    js.delete_stream(body_stream_name(t.team_id)).await.unwrap();
    team_stream(&t, "jsb15s").await;
    let new = t.send("new one").await;
    let workers = app.start_publication_workers();
    t.wait_stored(&[new]).await;
    workers.stop().await;
    assert_eq!(t.release().await, 1);

    let swept = lost_bodies::tombstone_bodies_of_replaced_streams(&app.pool, &app.bus.backends)
        .await
        .unwrap();
    assert_eq!(swept, 2, "both old bodies recorded lost");
    for id in old {
        assert_eq!(
            t.row(id).await.tombstone_reason.as_deref(),
            Some("the broker lost this body")
        );
    }
    assert!(t.row(new).await.tombstone_reason.is_none());
    assert_eq!(
        lost_bodies::tombstone_bodies_of_replaced_streams(&app.pool, &app.bus.backends)
            .await
            .unwrap(),
        0,
        "recorded once"
    );
    let page = t.read_as_bob().await;
    assert_eq!(in_page(&page, new)["body"], "new one");
    app.broker().remove_team_streams(t.team_id).await.unwrap();
}

/// `ai-crew-sync conversations declare-lost …` against the app's database;
/// its JSON answer.
fn declare_lost(app: &TestApp, nats: &str, args: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args([
            "conversations",
            "declare-lost",
            "--nats-url",
            nats,
            "--json",
        ])
        .args(args)
        .env("DATABASE_URL", &app.database_url)
        .env_remove("BUS_NATS_URL")
        .output()
        .expect("run the binary");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

// Issue 15, item 4: after a restore failed, the operator declares the bodies
// the broker cannot return lost. The dry run counts and names them and
// writes nothing; bodies the broker returns and bodies PostgreSQL still holds
// are never counted; `--apply` tombstones them "the broker lost this body",
// one audit entry per conversation.
#[tokio::test]
async fn declare_lost_counts_then_tombstones_and_audits_what_the_broker_cannot_return() {
    let url = nats_url();
    let app = TestApp::builder().broker_at(&url).spawn().await;
    let t = Routed::new(&app, "jsb15d").await;
    let other = t.conversation("Another thread").await;
    let a = [t.send("a1").await, t.send("a2").await, t.send("a3").await];
    let b = t.send_in(other, "b1").await;
    let workers = app.start_publication_workers();
    let locators = t.wait_stored(&[a[0], a[1], a[2], b]).await;
    workers.stop().await;
    assert_eq!(t.release().await, 4);
    let kept = t.send("still held locally").await;
    let workers = app.start_publication_workers();
    t.wait_stored(&[kept]).await;
    workers.stop().await;

    // One body deleted from a stream that is otherwise there.
    assert!(
        body_stream(&url, t.team_id)
            .await
            .delete_message(sequence(t.team_id, &locators[1]))
            .await
            .unwrap()
    );
    let conversation = t.conversation_id.to_string();
    let dry = declare_lost(
        &app,
        &url,
        &["--team", "jsb15d", "--conversation", &conversation],
    );
    assert_eq!(dry["applied"], false);
    assert_eq!(dry["lost"], 1, "{dry}");
    assert_eq!(dry["readable"], 2, "{dry}");
    assert_eq!(dry["conversations"][0]["seqs"], json!([2]), "{dry}");
    assert!(
        t.row(a[1]).await.tombstone_reason.is_none(),
        "a dry run writes nothing"
    );

    // The restore failed: the stream is gone.
    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    js.delete_stream(body_stream_name(t.team_id)).await.unwrap();
    let dry = declare_lost(&app, &url, &["--team", "jsb15d"]);
    assert_eq!(dry["stream_present"], false, "{dry}");
    assert_eq!(dry["lost"], 4, "the local copy is not counted: {dry}");
    for id in [a[0], a[1], a[2], b] {
        assert!(t.row(id).await.tombstone_reason.is_none());
    }
    let audited_before: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'conversation.declare_lost'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(audited_before, 0);

    let applied = declare_lost(&app, &url, &["--team", "jsb15d", "--apply"]);
    assert_eq!(applied["applied"], true);
    assert_eq!(applied["lost"], 4, "{applied}");
    for id in [a[0], a[1], a[2], b] {
        assert_eq!(
            t.row(id).await.tombstone_reason.as_deref(),
            Some("the broker lost this body")
        );
    }
    assert!(t.row(kept).await.tombstone_reason.is_none());
    let audited: Vec<(String, Value)> = sqlx::query_as(
        "SELECT subject, detail FROM audit_log WHERE action = 'conversation.declare_lost'
          ORDER BY subject",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(audited.len(), 2, "one entry per conversation: {audited:?}");
    let page = t.read_as_bob().await;
    assert_eq!(
        in_page(&page, a[0])["unavailable"]["detail"],
        "the broker lost this body"
    );
    assert_eq!(in_page(&page, kept)["body"], "still held locally");
    let again = declare_lost(&app, &url, &["--team", "jsb15d", "--apply"]);
    assert_eq!(again["lost"], 0, "declared once: {again}");
}

// Issue 33 item 17: the team's body stream deleted on a live broker (its
// store wiped): a body only the broker held reads `unavailable:
// unreachable`, not lost (a restore brings it back), and the detail says
// what the bus knows and `/health` and `conversations status` say: the
// team's stream is missing (the same `stream_missing` condition), reading
// again will not help, and the operator's fix (restore the store, or `team
// stream`). Not "read again shortly".
#[tokio::test]
async fn a_read_while_the_teams_stream_is_missing_names_it_and_the_operators_fix() {
    let app = TestApp::builder().broker_at(&nats_url()).spawn().await;
    let t = Routed::new(&app, "jsb33missing").await;
    let id = t.send("held by the broker alone").await;
    let workers = app.start_publication_workers();
    t.wait_stored(&[id]).await;
    workers.stop().await;
    assert_eq!(t.release().await, 1, "the local copy released");

    let stream = body_stream_name(t.team_id);
    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    js.delete_stream(&stream).await.unwrap();
    let page = t.read_as_bob().await;
    let shown = in_page(&page, id);
    assert_unreachable_without_promise(shown);
    let detail = shown["unavailable"]["detail"].as_str().unwrap();
    for said in [
        stream.as_str(),
        "missing",
        "stream_missing",
        "will not show it until an operator acts",
        "Restoring the broker's store",
        "ai-crew-sync team stream --team jsb33missing --nats-url",
    ] {
        assert!(detail.contains(said), "{said:?} in {detail}");
    }
    assert!(!detail.contains("Read again shortly"), "{detail}");
    assert!(t.row(id).await.tombstone_reason.is_none(), "not lost");
    let _ = app.broker().remove_team_streams(t.team_id).await;
}
