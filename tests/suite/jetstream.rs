//! The JetStream backend against a real `nats-server -js` (Debian's 2.9):
//! publish, fetch, idempotency, the refusals, lost answers through a TCP
//! proxy, a stopped broker, provisioning, the inbox helpers, and the operator
//! commands. Invariant numbers are those listed in ARCHITECTURE.md.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::Duration;

use ai_crew_sync::BusError;
use ai_crew_sync::backend::jetstream::{
    Broker, BrokerOptions, StreamSizes, body_stream_name, inbox_stream_name,
};
use ai_crew_sync::backend::{Envelope, JetStreamBackend, Locator, MessagingBackend, Published};
use serde_json::Value;
use uuid::Uuid;

use crate::support::eventually;
use crate::support::nats::{OwnedNats, nats_url};
use crate::support::postgres::fresh_database_url;
use crate::support::proxy::Proxy;

fn quick() -> BrokerOptions {
    BrokerOptions {
        timeout: Duration::from_secs(1),
        ..BrokerOptions::default()
    }
}

async fn shared_broker() -> Broker {
    Broker::connect(&nats_url(), None)
        .await
        .expect("connect to the test NATS")
}

/// A team with both streams on `broker`; its id.
async fn provisioned(broker: &Broker) -> Uuid {
    let team = Uuid::new_v4();
    broker
        .provision_team(team, &StreamSizes::default(), false)
        .await
        .expect("provision the team's streams");
    team
}

fn envelope(team_id: Uuid, body: &str) -> Envelope {
    Envelope {
        message_id: Uuid::new_v4(),
        conversation_id: Uuid::new_v4(),
        team_id,
        body: body.to_owned(),
        publish_key: Uuid::new_v4(),
    }
}

fn confirmed(published: Published) -> Locator {
    match published {
        Published::Confirmed(locator) => locator,
        other => panic!("expected Confirmed, got {other:?}"),
    }
}

/// How many messages the team's body stream holds, asked on a separate
/// connection so a proxy in front of the backend does not blur the answer.
async fn body_messages(team: Uuid) -> u64 {
    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    let mut stream = js.get_stream(body_stream_name(team)).await.unwrap();
    stream.info().await.unwrap().state.messages
}

async fn wait_reachable(broker: &Broker) {
    eventually("the broker to answer again", async || {
        broker.reachable().await
    })
    .await;
}

fn socket(url: &str) -> SocketAddr {
    url.trim_start_matches("nats://")
        .parse()
        .expect("host:port")
}

// B1: publish is stored once under a jetstream locator; fetch reads it back.
#[tokio::test]
async fn publish_returns_a_jetstream_locator_and_fetch_reads_the_body_once_stored() {
    let broker = shared_broker().await;
    let team = provisioned(&broker).await;
    let backend = JetStreamBackend::new(broker.clone(), team);
    let env = envelope(team, "hello from the broker");

    let locator = confirmed(backend.publish(&env).await);
    assert!(
        locator
            .0
            .starts_with(&format!("jetstream:{}:", body_stream_name(team))),
        "{locator:?}"
    );
    assert_eq!(
        backend.fetch(&locator, env.message_id).await.unwrap(),
        Some("hello from the broker".to_owned())
    );
    assert_eq!(body_messages(team).await, 1, "present once in the stream");
    broker.remove_team_streams(team).await.unwrap();
}

// B1: idempotent on publish_key — the duplicate PubAck is success with the
// original sequence; reconcile re-presents and reads the same answer.
#[tokio::test]
async fn the_same_publish_key_twice_is_one_stream_entry_with_one_sequence() {
    let broker = shared_broker().await;
    let team = provisioned(&broker).await;
    let backend = JetStreamBackend::new(broker.clone(), team);
    let env = envelope(team, "once");

    let first = confirmed(backend.publish(&env).await);
    let second = confirmed(backend.publish(&env).await);
    assert_eq!(first, second);
    assert_eq!(backend.reconcile(&env).await.unwrap(), Some(first));
    assert_eq!(body_messages(team).await, 1);
    broker.remove_team_streams(team).await.unwrap();
}

// B1: fetch verifies the locator names this team's stream and this message.
#[tokio::test]
async fn a_locator_from_another_team_or_message_reads_nothing() {
    let broker = shared_broker().await;
    let (ours, theirs) = (provisioned(&broker).await, provisioned(&broker).await);
    let our_backend = JetStreamBackend::new(broker.clone(), ours);
    let their_backend = JetStreamBackend::new(broker.clone(), theirs);
    let their_env = envelope(theirs, "their secret");
    let their_locator = confirmed(their_backend.publish(&their_env).await);
    let our_env = envelope(ours, "ours");
    let our_locator = confirmed(our_backend.publish(&our_env).await);

    let err = our_backend
        .fetch(&their_locator, their_env.message_id)
        .await
        .expect_err("another team's locator is refused");
    assert!(matches!(err, BusError::Forbidden(_)), "{err:?}");

    let err = our_backend
        .fetch(&our_locator, their_env.message_id)
        .await
        .expect_err("a locator naming another message is refused");
    assert!(matches!(err, BusError::Forbidden(_)), "{err:?}");

    // A guessed sequence in our own stream that holds another message.
    let second = envelope(ours, "another");
    let second_locator = confirmed(our_backend.publish(&second).await);
    assert!(matches!(
        our_backend.fetch(&second_locator, our_env.message_id).await,
        Err(BusError::Forbidden(_))
    ));

    let err = our_backend
        .fetch(&Locator("not-a-locator".into()), our_env.message_id)
        .await
        .unwrap_err();
    assert!(matches!(err, BusError::Invalid(_)), "{err:?}");

    // A sequence that holds nothing: the broker answered, it has no body;
    // one answer is not a confirmed absence (jetstream_bus shows the
    // confirmation), so it reads as unavailable, never as gone.
    let stream = body_stream_name(ours);
    let missing = Locator(format!("jetstream:{stream}:999"));
    let err = our_backend
        .fetch(&missing, Uuid::new_v4())
        .await
        .expect_err("one \"not found\" is not an absence");
    assert!(matches!(err, BusError::Unavailable(_)), "{err:?}");
    assert!(err.to_string().contains("stream leader"), "{err}");

    broker.remove_team_streams(ours).await.unwrap();
    broker.remove_team_streams(theirs).await.unwrap();
}

#[tokio::test]
async fn a_broker_whose_max_payload_cannot_take_a_full_body_is_refused_at_connect() {
    let server = OwnedNats::start_with_default_max_payload();
    let err = Broker::connect(&server.url(), None)
        .await
        .err()
        .expect("a 1 MB max_payload broker is refused");
    let text = err.to_string();
    assert!(
        text.contains("max_payload") && text.contains("nats-server.conf") && text.contains("2MB"),
        "the refusal names the setting and a value: {text}"
    );

    let roomy = OwnedNats::start();
    let broker = Broker::connect(&roomy.url(), None).await.unwrap();
    assert!(broker.max_payload() >= 8 * 1000 * 1000);
    assert!(broker.reachable().await);
}

// B1: reconcile re-presents the same envelope; a PubAck lost after the broker
// stored the body ends with the original sequence, not a second entry.
#[tokio::test]
async fn a_lost_puback_is_reconciled_to_the_original_sequence() {
    let proxy = Proxy::start(socket(&nats_url())).await;
    let broker = Broker::connect_with(&proxy.url(), None, quick())
        .await
        .unwrap();
    let team = provisioned(&broker).await;
    let backend = JetStreamBackend::new(broker.clone(), team);
    let env = envelope(team, "the ack of this one is lost");

    proxy.black_hole_replies();
    let outcome = backend.publish(&env).await;
    assert!(
        matches!(outcome, Published::Unanswered(_)),
        "no answer is not a failure: {outcome:?}"
    );
    assert_eq!(body_messages(team).await, 1, "the broker did store it");

    // Connection cut after the broker stored it; the client reconnects.
    proxy.pass();
    proxy.cut();
    wait_reachable(&broker).await;

    let direct = shared_broker().await;
    let stored = direct
        .js()
        .get_stream(body_stream_name(team))
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .state
        .last_sequence;
    let reconciled = backend
        .reconcile(&env)
        .await
        .unwrap()
        .expect("the broker holds it");
    assert_eq!(
        reconciled.0,
        format!("jetstream:{}:{stored}", body_stream_name(team)),
        "the original sequence"
    );
    assert_eq!(body_messages(team).await, 1, "not stored twice");
    assert_eq!(
        backend.fetch(&reconciled, env.message_id).await.unwrap(),
        Some(env.body.clone())
    );
    direct.remove_team_streams(team).await.unwrap();
}

// A broker slower than the timeout: the answer comes too late to count, so
// the outcome is unknown (not failed), and reconcile finds the original.
#[tokio::test]
async fn an_answer_slower_than_the_timeout_is_unanswered_then_reconciled() {
    let proxy = Proxy::start(socket(&nats_url())).await;
    let broker = Broker::connect_with(&proxy.url(), None, quick())
        .await
        .unwrap();
    let team = provisioned(&broker).await;
    let backend = JetStreamBackend::new(broker.clone(), team);

    proxy.delay(Duration::from_millis(50));
    confirmed(backend.publish(&envelope(team, "slow but in time")).await);

    let env = envelope(team, "too slow");
    proxy.delay(Duration::from_millis(1500));
    let outcome = backend.publish(&env).await;
    assert!(matches!(outcome, Published::Unanswered(_)), "{outcome:?}");
    proxy.pass();
    proxy.cut();
    wait_reachable(&broker).await;
    let locator = backend.reconcile(&env).await.unwrap().unwrap();
    assert_eq!(
        backend.fetch(&locator, env.message_id).await.unwrap(),
        Some("too slow".into())
    );
    assert_eq!(body_messages(team).await, 2, "each body once");
    broker.remove_team_streams(team).await.unwrap();
}

// A black-holed broker (accepts, answers nothing) is unreachable, and a fetch
// through it says so instead of claiming the body is gone.
#[tokio::test]
async fn a_black_holed_broker_is_unreachable_and_fetch_says_so() {
    let proxy = Proxy::start(socket(&nats_url())).await;
    let broker = Broker::connect_with(&proxy.url(), None, quick())
        .await
        .unwrap();
    let team = provisioned(&broker).await;
    let backend = JetStreamBackend::new(broker.clone(), team);
    let env = envelope(team, "kept");
    let locator = confirmed(backend.publish(&env).await);

    proxy.black_hole();
    assert!(!broker.reachable().await);
    let err = backend.fetch(&locator, env.message_id).await.unwrap_err();
    assert!(matches!(err, BusError::Unavailable(_)), "{err:?}");
    let err = backend.reconcile(&env).await.unwrap_err();
    assert!(matches!(err, BusError::Unavailable(_)), "{err:?}");

    proxy.pass();
    proxy.cut();
    wait_reachable(&broker).await;
    assert_eq!(
        backend.fetch(&locator, env.message_id).await.unwrap(),
        Some("kept".into())
    );
    broker.remove_team_streams(team).await.unwrap();
}

// B7 context: a publish to a stopped broker is never Confirmed; after the
// restart, reconcile settles it to exactly one stream entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_a_stopped_broker_is_never_confirmed_and_lands_once_after_restart() {
    let mut server = OwnedNats::start();
    let broker = Broker::connect_with(&server.url(), None, quick())
        .await
        .unwrap();
    let team = provisioned(&broker).await;
    let backend = JetStreamBackend::new(broker.clone(), team);
    let env = envelope(team, "sent while the broker was down");

    tokio::task::block_in_place(|| server.stop());
    let outcome = backend.publish(&env).await;
    assert!(
        matches!(outcome, Published::Retryable(_) | Published::Unanswered(_)),
        "{outcome:?}"
    );
    assert!(!broker.reachable().await);

    tokio::task::block_in_place(|| server.restart());
    wait_reachable(&broker).await;
    let locator = backend
        .reconcile(&env)
        .await
        .unwrap()
        .expect("stored now, or found under its key");
    assert_eq!(
        backend.fetch(&locator, env.message_id).await.unwrap(),
        Some(env.body.clone())
    );
    let mut stream = broker
        .js()
        .get_stream(body_stream_name(team))
        .await
        .unwrap();
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        1,
        "exactly once"
    );
}

// B1 and the boundary's classification: a full discard-new stream refuses the
// body, and that is retryable (an operator raising the quota cures it), with
// a reason naming the quota flags; nothing is stored by the refusal.
#[tokio::test]
async fn a_full_stream_is_retryable_and_names_the_quota_flags() {
    let broker = shared_broker().await;
    let team = Uuid::new_v4();
    let sizes = StreamSizes {
        max_messages: 1,
        ..StreamSizes::default()
    };
    broker.provision_team(team, &sizes, false).await.unwrap();
    let backend = JetStreamBackend::new(broker.clone(), team);
    confirmed(backend.publish(&envelope(team, "fits")).await);
    let refused = envelope(team, "does not, yet");
    match backend.publish(&refused).await {
        // Retryable, and the operator's to fix: the slot waits unspent.
        Published::Blocked(reason) => {
            assert!(
                reason.contains("full") && reason.contains("--update-quotas"),
                "{reason}"
            )
        }
        other => panic!("a full discard-new stream blocks (retryable, waiting): {other:?}"),
    }
    assert_eq!(body_messages(team).await, 1, "the refusal stored nothing");
    // Once the quota is raised, the same envelope lands.
    broker
        .provision_team(team, &StreamSizes::default(), true)
        .await
        .unwrap();
    confirmed(backend.publish(&refused).await);
    assert_eq!(body_messages(team).await, 2);
    broker.remove_team_streams(team).await.unwrap();
}

#[tokio::test]
async fn a_team_without_streams_is_retryable_and_says_how_to_provision() {
    let broker = shared_broker().await;
    let team = Uuid::new_v4();
    let backend = JetStreamBackend::new(broker.clone(), team);
    match backend.publish(&envelope(team, "nowhere")).await {
        Published::Blocked(reason) => assert!(reason.contains("team stream"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(!broker.team_streams_exist(team).await.unwrap());
}

#[tokio::test]
async fn provisioning_adopts_existing_streams_and_updates_quotas_only_when_asked() {
    let broker = shared_broker().await;
    let team = Uuid::new_v4();
    let simple = team.simple().to_string();
    // An operator's stream, with its own limits.
    broker
        .js()
        .create_stream(async_nats::jetstream::stream::Config {
            name: body_stream_name(team),
            subjects: vec![format!("acs.{simple}.conv.*")],
            max_messages: 500,
            description: Some("made by the operator".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!broker.team_streams_exist(team).await.unwrap());

    let streams = broker
        .provision_team(team, &StreamSizes::default(), false)
        .await
        .unwrap();
    assert_eq!(streams.body.state, "adopted");
    assert_eq!(streams.body.max_messages, 500, "adopted as it was");
    assert!(
        streams
            .body
            .quotas_not_applied
            .contains(&"max_messages: kept 500, asked 100000".to_owned()),
        "an adopted stream names the limits it kept: {:?}",
        streams.body.quotas_not_applied
    );
    assert_eq!(streams.inbox.state, "created");
    assert_eq!(streams.inbox.retention, "workqueue");
    assert_eq!(streams.inbox.max_age_seconds, 7 * 24 * 3600);
    // The inbox is bounded in size like the body stream (issue 15, item 6).
    assert_eq!(streams.inbox.max_bytes, 256 * 1024 * 1024);
    assert_eq!(streams.inbox.max_messages, 1_000_000);
    assert_eq!(streams.inbox.max_message_size, 64 * 1024);
    assert!(broker.team_streams_exist(team).await.unwrap());
    assert!(
        !streams.body.allow_direct,
        "the operator's stream has no direct get"
    );

    // Reading from it goes to the stream leader instead (B1: still checked).
    let backend = JetStreamBackend::new(broker.clone(), team);
    let env = envelope(team, "on an adopted stream");
    let locator = confirmed(backend.publish(&env).await);
    assert_eq!(
        backend.fetch(&locator, env.message_id).await.unwrap(),
        Some(env.body.clone())
    );
    assert!(matches!(
        backend.fetch(&locator, Uuid::new_v4()).await,
        Err(BusError::Forbidden(_))
    ));
    let gone = Locator(format!("jetstream:{}:77", body_stream_name(team)));
    assert_eq!(
        backend.fetch_once(&gone, env.message_id).await.unwrap(),
        None,
        "one look: the leader holds nothing there"
    );
    assert!(
        matches!(
            backend.fetch(&gone, env.message_id).await,
            Err(BusError::Unavailable(_))
        ),
        "an absence is not confirmed by one answer"
    );

    let updated = broker
        .provision_team(team, &StreamSizes::default(), true)
        .await
        .unwrap();
    assert_eq!(updated.body.state, "updated");
    assert_eq!(updated.body.max_messages, 100_000);
    assert_eq!(updated.body.max_message_size, 2 * 1024 * 1024);
    assert_eq!(updated.inbox.state, "adopted", "its quota already matched");

    let mut removed = broker.remove_team_streams(team).await.unwrap();
    removed.sort();
    let mut expected = [body_stream_name(team), inbox_stream_name(team)];
    expected.sort();
    assert_eq!(removed, expected);
    assert!(!broker.team_streams_exist(team).await.unwrap());
    assert!(broker.remove_team_streams(team).await.unwrap().is_empty());

    // A stream under the team's name that does not take its subjects.
    broker
        .js()
        .create_stream(async_nats::jetstream::stream::Config {
            name: body_stream_name(team),
            subjects: vec![format!("elsewhere.{simple}")],
            ..Default::default()
        })
        .await
        .unwrap();
    let err = broker
        .provision_team(team, &StreamSizes::default(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, BusError::Conflict(_)) && err.to_string().contains("subjects"));
    broker
        .js()
        .delete_stream(body_stream_name(team))
        .await
        .unwrap();
}

#[tokio::test]
async fn inbox_references_are_deduplicated_handed_out_and_gone_once_acked() {
    let broker = shared_broker().await;
    let team = provisioned(&broker).await;
    let key = Uuid::new_v4().simple().to_string();
    let reference = Uuid::new_v4();

    assert!(!broker.inbox_consumer_exists(team, &key).await.unwrap());
    let seq = broker
        .publish_inbox_reference(team, &key, reference, b"{\"seq\":1}")
        .await
        .unwrap();
    let again = broker
        .publish_inbox_reference(team, &key, reference, b"{\"seq\":1}")
        .await
        .unwrap();
    assert_eq!(seq, again, "one reference per id");

    let got = broker
        .fetch_inbox(team, &key, 10, Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, b"{\"seq\":1}");
    assert_eq!(got[0].stream_sequence, seq);
    assert!(broker.inbox_consumer_exists(team, &key).await.unwrap());

    // Handed out and not acked: not handed out again before the ack wait.
    assert!(
        broker
            .fetch_inbox(team, &key, 10, Duration::ZERO)
            .await
            .unwrap()
            .is_empty()
    );

    let other_key = Uuid::new_v4().simple().to_string();
    let err = broker
        .ack_inbox(team, &other_key, &got[0].ack_subject)
        .await
        .unwrap_err();
    assert!(matches!(err, BusError::Invalid(_)), "{err:?}");
    broker
        .ack_inbox(team, &key, &got[0].ack_subject)
        .await
        .unwrap();

    // Work queue: acked is gone from the stream.
    let mut stream = broker
        .js()
        .get_stream(inbox_stream_name(team))
        .await
        .unwrap();
    eventually("the acked reference to leave the stream", async || {
        stream.info().await.unwrap().state.messages == 0
    })
    .await;

    // A reference published later arrives within the wait.
    let waiter = {
        let broker = broker.clone();
        let key = key.clone();
        tokio::spawn(async move {
            broker
                .fetch_inbox(team, &key, 10, Duration::from_secs(5))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    broker
        .publish_inbox_reference(team, &key, Uuid::new_v4(), b"late")
        .await
        .unwrap();
    let late = waiter.await.unwrap();
    assert_eq!(late.len(), 1);
    assert_eq!(late[0].payload, b"late");

    assert!(broker.delete_inbox_consumer(team, &key).await.unwrap());
    assert!(!broker.inbox_consumer_exists(team, &key).await.unwrap());
    assert!(!broker.delete_inbox_consumer(team, &key).await.unwrap());
    broker.remove_team_streams(team).await.unwrap();
}

pub(crate) fn bus(database_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .env_remove("BUS_NATS_URL")
        .env_remove("BUS_NATS_CREDENTIALS")
        .output()
        .expect("run ai-crew-sync")
}

pub(crate) fn ok_json(database_url: &str, args: &[&str]) -> Value {
    let out = bus(database_url, args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

pub(crate) fn refused(database_url: &str, args: &[&str]) -> String {
    let out = bus(database_url, args);
    assert!(!out.status.success(), "{args:?} should have been refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn team_stream_provisions_and_remove_is_refused_while_the_team_routes_there() {
    let db = fresh_database_url().await;
    let url = nats_url();
    let slug = format!("js{}", &Uuid::new_v4().simple().to_string()[..8]);
    tokio::task::spawn_blocking(move || {
        ok_json(
            &db,
            &["team", "create", "--slug", &slug, "--name", "JS", "--json"],
        );
        let streams = ok_json(
            &db,
            &[
                "team",
                "stream",
                "--team",
                &slug,
                "--nats-url",
                &url,
                "--json",
            ],
        );
        assert_eq!(streams["body"]["state"], "created");
        assert_eq!(streams["inbox"]["state"], "created");
        let again = ok_json(
            &db,
            &[
                "team",
                "stream",
                "--team",
                &slug,
                "--nats-url",
                &url,
                "--json",
            ],
        );
        assert_eq!(again["body"]["state"], "adopted");

        let caps = ok_json(
            &db,
            &[
                "team",
                "capability",
                "--team",
                &slug,
                "--backend",
                "jetstream",
                "--nats-url",
                &url,
                "--json",
            ],
        );
        assert_eq!(caps["conversation_backend"], "jetstream");

        let err = refused(
            &db,
            &[
                "team",
                "stream",
                "--team",
                &slug,
                "--nats-url",
                &url,
                "--remove",
            ],
        );
        assert!(
            err.contains("still routes to jetstream") && err.contains("--backend postgres"),
            "{err}"
        );

        ok_json(
            &db,
            &[
                "team",
                "capability",
                "--team",
                &slug,
                "--backend",
                "postgres",
                "--json",
            ],
        );
        let removed = ok_json(
            &db,
            &[
                "team",
                "stream",
                "--team",
                &slug,
                "--nats-url",
                &url,
                "--remove",
                "--json",
            ],
        );
        assert_eq!(removed["removed"].as_array().unwrap().len(), 2);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn team_capability_backend_jetstream_is_refused_without_a_broker_or_streams() {
    let db = fresh_database_url().await;
    let url = nats_url();
    tokio::task::spawn_blocking(move || {
        ok_json(
            &db,
            &[
                "team", "create", "--slug", "acme", "--name", "Acme", "--json",
            ],
        );
        let err = refused(
            &db,
            &[
                "team",
                "capability",
                "--team",
                "acme",
                "--backend",
                "jetstream",
            ],
        );
        assert!(err.contains("--nats-url"), "{err}");
        let err = refused(
            &db,
            &[
                "team",
                "capability",
                "--team",
                "acme",
                "--backend",
                "jetstream",
                "--nats-url",
                &url,
                "--conversations",
                "on",
            ],
        );
        assert!(err.contains("team stream"), "{err}");
        let caps = ok_json(&db, &["team", "capability", "--team", "acme", "--json"]);
        assert_eq!(
            caps["conversation_backend"], "postgres",
            "never a silent switch"
        );
        assert_eq!(
            caps["conversations"], false,
            "a refused command changes nothing"
        );
    })
    .await
    .unwrap();
}

// Permission denied is fatal: the server answers a denied publish with an
// asynchronous -ERR and no reply, which must not read as "unanswered".
#[tokio::test]
async fn a_publish_the_nats_user_may_not_make_is_fatal_not_unanswered() {
    let server = OwnedNats::start_with_config(
        "authorization {\n  users = [\n    { user: admin, password: admin }\n    \
         { user: bus, password: bus, permissions: { publish: { allow: [\"$JS.API.>\", \"acsi.>\"] }, subscribe: { allow: [\"_INBOX.>\"] } } }\n  ]\n}",
    );
    let admin = Broker::connect(&server.url_as("admin", "admin"), None)
        .await
        .unwrap();
    let team = provisioned(&admin).await;
    let bus = Broker::connect_with(&server.url_as("bus", "bus"), None, quick())
        .await
        .unwrap();
    let backend = JetStreamBackend::new(bus, team);
    match backend.publish(&envelope(team, "denied")).await {
        Published::Fatal(reason) => assert!(reason.contains("permission denied"), "{reason}"),
        other => panic!("a denied publish is fatal: {other:?}"),
    }
    let mut stream = admin.js().get_stream(body_stream_name(team)).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 0);
}

// Inbox references are on disk: a restarted broker still hands them out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_references_survive_a_broker_restart() {
    let mut server = OwnedNats::start();
    let broker = Broker::connect_with(&server.url(), None, quick())
        .await
        .unwrap();
    let team = provisioned(&broker).await;
    let key = Uuid::new_v4().simple().to_string();
    broker.ensure_inbox_consumer(team, &key).await.unwrap();
    broker
        .publish_inbox_reference(team, &key, Uuid::new_v4(), b"kept")
        .await
        .unwrap();

    tokio::task::block_in_place(|| {
        server.stop();
        server.restart();
    });
    wait_reachable(&broker).await;
    assert!(broker.inbox_consumer_exists(team, &key).await.unwrap());
    let got = broker
        .fetch_inbox(team, &key, 10, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, b"kept");
    broker
        .ack_inbox(team, &key, &got[0].ack_subject)
        .await
        .unwrap();
}

/// `team stream` with a size flag on streams that exist never says only
/// `adopted`: it says which flags it ignored and that `--update-quotas`
/// applies them, and with `--update-quotas` it does (issue 15, item 7).
#[tokio::test]
async fn team_stream_says_it_ignored_size_flags_on_existing_streams_until_update_quotas() {
    let db = fresh_database_url().await;
    let url = nats_url();
    let slug = format!("js{}", &Uuid::new_v4().simple().to_string()[..8]);
    tokio::task::spawn_blocking(move || {
        ok_json(
            &db,
            &["team", "create", "--slug", &slug, "--name", "JS", "--json"],
        );
        let stream = |extra: &[&str]| {
            let mut args = vec!["team", "stream", "--team", &slug, "--nats-url", &url];
            args.extend_from_slice(extra);
            bus(&db, &args)
        };
        let created = stream(&["--json"]);
        assert!(created.status.success());
        let created: Value = serde_json::from_slice(&created.stdout).unwrap();
        assert_eq!(created["inbox"]["max_bytes"], 256 * 1024 * 1024);

        let ignored = stream(&["--max-bytes", "33554432", "--inbox-max-messages", "5000"]);
        assert!(ignored.status.success());
        let text = String::from_utf8_lossy(&ignored.stdout);
        let body = created["body"]["name"].as_str().unwrap();
        let inbox = created["inbox"]["name"].as_str().unwrap();
        assert!(
            text.contains(&format!("ignored the size flags for {body}"))
                && text.contains("max_bytes: kept 2147483648, asked 33554432")
                && text.contains(&format!("ignored the size flags for {inbox}"))
                && text.contains("max_messages: kept 1000000, asked 5000")
                && text.contains("--update-quotas to apply them"),
            "{text}"
        );
        let json = stream(&["--max-bytes", "33554432", "--json"]);
        let json: Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(json["body"]["state"], "adopted");
        assert_eq!(json["body"]["max_bytes"], 2147483648_i64, "nothing applied");
        assert_eq!(
            json["body"]["quotas_not_applied"][0],
            "max_bytes: kept 2147483648, asked 33554432"
        );

        let applied = stream(&["--max-bytes", "33554432", "--update-quotas", "--json"]);
        let applied: Value = serde_json::from_slice(&applied.stdout).unwrap();
        assert_eq!(applied["body"]["state"], "updated");
        assert_eq!(applied["body"]["max_bytes"], 33554432);
        assert!(applied["body"].get("quotas_not_applied").is_none());
        let quiet = stream(&["--max-bytes", "33554432"]);
        let quiet = String::from_utf8_lossy(&quiet.stdout);
        assert!(!quiet.contains("ignored"), "{quiet}");
        stream(&["--remove"]);
    })
    .await
    .unwrap();
}
