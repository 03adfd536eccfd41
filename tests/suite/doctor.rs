//! `ai-crew-sync doctor` as an operator runs it: the real binary against the
//! suite's PostgreSQL and NATS, read from its `--json` array and its lines.
//! A healthy setup passes every check; a pending migration, a database ahead
//! of the binary, a broker that does not answer, one whose `max_payload` is
//! too small and a stream whose limits are wrong are each named, with what
//! to do, and exit non-zero. Doctor changes nothing: a pending migration is
//! still pending after it ran.

use std::process::{Command, Output};

use ai_crew_sync::backend::jetstream::{Broker, body_stream_name};
use ai_crew_sync::db::{self, schema};
use serde_json::Value;
use uuid::Uuid;

use crate::support::free_port;
use crate::support::nats::{OwnedNats, nats_url};
use crate::support::postgres::{fresh_database_url, fresh_pool};

/// The binary with only what the test gives it (no BUS_* from the machine).
fn bus(database_url: &str, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
    for var in [
        "BUS_BIND",
        "BUS_ALLOWED_HOSTS",
        "BUS_NATS_URL",
        "BUS_NATS_CREDENTIALS",
        "BUS_PROFILE",
    ] {
        command.env_remove(var);
    }
    // No profile of this machine's: the `profile` check is newcomer.rs's.
    command.env(
        "BUS_CONFIG_DIR",
        std::env::temp_dir().join("acs-doctor-no-profiles"),
    );
    command
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .expect("run ai-crew-sync")
}

fn ok(database_url: &str, args: &[&str]) {
    let out = bus(database_url, args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `doctor --json` with `args`: its exit success and its checks.
fn doctor(database_url: &str, args: &[&str]) -> (bool, Vec<Value>) {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    let out = bus(database_url, &all);
    let checks: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON array ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), checks)
}

fn named<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    checks
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no `{name}` check in {checks:#?}"))
}

/// A team with both streams on the broker at `url`, routed to jetstream.
fn team_on_jetstream(database_url: &str, url: &str) -> String {
    let slug = format!("doc{}", &Uuid::new_v4().simple().to_string()[..8]);
    ok(
        database_url,
        &["team", "create", "--slug", &slug, "--name", "Doctor"],
    );
    ok(
        database_url,
        &["team", "stream", "--team", &slug, "--nats-url", url],
    );
    ok(
        database_url,
        &[
            "team",
            "capability",
            "--team",
            &slug,
            "--backend",
            "jetstream",
            "--nats-url",
            url,
        ],
    );
    slug
}

// Several threads: doctor, run blocking, asks the in-process server's /health.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_setup_passes_every_check_and_exits_zero() {
    let (pool, db) = fresh_pool().await;
    let url = nats_url();
    let slug = team_on_jetstream(&db, &url);
    // A server on the database, recorded where it listens as `serve` records it.
    let app = crate::support::TestApp::builder()
        .database(pool.clone(), db.clone())
        .spawn()
        .await;
    ai_crew_sync::store::operations::listeners::record(&pool, &app.url(""), "here", 1)
        .await
        .unwrap();

    let (success, checks) = doctor(&db, &["--nats-url", &url]);
    for c in &checks {
        assert_eq!(c["status"], "ok", "{c:#}");
        assert!(!c["verdict"].as_str().unwrap().is_empty(), "{c:#}");
        assert!(!c["action"].as_str().unwrap().is_empty(), "{c:#}");
    }
    assert!(success, "{checks:#?}");
    let listed: Vec<&str> = checks
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    let team_streams = format!("streams:{slug}");
    assert_eq!(
        listed,
        [
            "database",
            "schema",
            "events",
            "clock",
            "outbox",
            "broker",
            "max_payload",
            team_streams.as_str(),
            "allowed_hosts",
            "server"
        ],
        "DATABASE_URL is set, so there is no embedded line"
    );
    assert!(
        named(&checks, &team_streams)["verdict"]
            .as_str()
            .unwrap()
            .contains(&body_stream_name(team_id(&db, &slug).await)),
        "{checks:#?}"
    );

    // The same checks for a person: one line each, status first, then the
    // check, the verdict and what to do.
    let out = bus(&db, &["doctor", "--nats-url", &url]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), checks.len(), "{text}");
    for (line, c) in lines.iter().zip(&checks) {
        let name = c["check"].as_str().unwrap();
        assert!(line.starts_with("ok "), "{line}");
        assert!(line.split_whitespace().nth(1) == Some(name), "{line}");
        assert!(line.contains(" — nothing to do"), "{line}");
    }
}

async fn team_id(database_url: &str, slug: &str) -> Uuid {
    let pool = db::connect(database_url, 1).await.unwrap();
    let id = ai_crew_sync::store::identity::teams::find(&pool, slug)
        .await
        .unwrap()
        .id;
    pool.close().await;
    id
}

#[tokio::test]
async fn a_missing_migration_is_named_and_doctor_does_not_apply_it() {
    let db = fresh_database_url().await;
    let pool = db::connect(&db, 2).await.unwrap();
    let migrator = db::migrator();
    let last = migrator.iter().last().expect("the binary has migrations");
    let before_last = migrator
        .iter()
        .rev()
        .nth(1)
        .expect("more than one migration")
        .version;
    migrator.run_to(before_last, &pool).await.unwrap();
    let last_name = format!("{:04} ({})", last.version, last.description);

    let (success, checks) = doctor(&db, &[]);
    assert!(!success, "a pending migration exits non-zero: {checks:#?}");
    let schema_check = named(&checks, "schema");
    assert_eq!(schema_check["status"], "fail", "{schema_check:#}");
    let verdict = schema_check["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("1 migration(s) of this binary not applied")
            && verdict.contains(&last_name),
        "{verdict}"
    );
    assert!(
        schema_check["action"]
            .as_str()
            .unwrap()
            .contains("ai-crew-sync migrate"),
        "{schema_check:#}"
    );
    assert_eq!(named(&checks, "database")["status"], "ok");

    // Inspect, never change: the migration is still pending.
    let state = schema::schema_state(&pool).await.unwrap();
    assert_eq!(
        state.pending.iter().map(|m| m.version).collect::<Vec<_>>(),
        [last.version],
        "doctor applied a migration"
    );

    // Applied, the schema is fine; a version this binary does not know (a
    // newer binary migrated the database) is named as ahead of it.
    migrator.run(&pool).await.unwrap();
    let (success, checks) = doctor(&db, &[]);
    assert!(success, "{checks:#?}");
    assert_eq!(named(&checks, "schema")["status"], "ok");
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (99990001, 'from a newer binary', true, '\\x00', 1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (success, checks) = doctor(&db, &[]);
    assert!(!success);
    let schema_check = named(&checks, "schema");
    assert_eq!(schema_check["status"], "fail");
    let verdict = schema_check["verdict"].as_str().unwrap();
    assert!(
        verdict.contains("ahead of this binary")
            && verdict.contains("99990001 (from a newer binary)"),
        "{verdict}"
    );
    pool.close().await;
}

#[tokio::test]
async fn a_broker_that_does_not_answer_fails_and_its_dependants_are_skipped() {
    let (_pool, db) = fresh_pool().await;
    let closed = format!("nats://127.0.0.1:{}", free_port());

    let (success, checks) = doctor(&db, &["--nats-url", &closed]);
    assert!(!success, "a broker down exits non-zero: {checks:#?}");
    let broker = named(&checks, "broker");
    assert_eq!(broker["status"], "fail", "{broker:#}");
    assert!(
        broker["verdict"].as_str().unwrap().contains(&closed)
            && broker["action"].as_str().unwrap().contains("nats-server"),
        "{broker:#}"
    );
    assert_eq!(named(&checks, "max_payload")["status"], "skip");
    assert_eq!(named(&checks, "streams")["status"], "skip");
    assert_eq!(
        named(&checks, "schema")["status"],
        "ok",
        "the database is still checked"
    );

    // The line a person reads says it too.
    let out = bus(&db, &["doctor", "--nats-url", &closed]);
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("fail  broker") && l.contains(" — ")),
        "{text}"
    );
}

#[tokio::test]
async fn a_broker_whose_max_payload_is_too_small_is_named_and_its_streams_still_checked() {
    let (_pool, db) = fresh_pool().await;
    let nats = OwnedNats::start_with_default_max_payload();
    let url = nats.url();
    let slug = format!("doc{}", &Uuid::new_v4().simple().to_string()[..8]);
    ok(&db, &["team", "create", "--slug", &slug, "--name", "Small"]);

    let (success, checks) = doctor(&db, &["--nats-url", &url]);
    assert!(!success);
    assert_eq!(named(&checks, "broker")["status"], "ok");
    let payload = named(&checks, "max_payload");
    assert_eq!(payload["status"], "fail", "{payload:#}");
    assert!(
        payload["verdict"].as_str().unwrap().contains("1048576")
            && payload["action"]
                .as_str()
                .unwrap()
                .contains("max_payload: 2MB"),
        "{payload:#}"
    );
    assert_eq!(
        named(&checks, "streams")["status"],
        "ok",
        "no team uses JetStream here: {checks:#?}"
    );
}

#[tokio::test]
async fn a_stream_whose_limits_are_wrong_is_named_with_the_limit_and_the_fix() {
    let (_pool, db) = fresh_pool().await;
    let url = nats_url();
    let slug = team_on_jetstream(&db, &url);
    let team = team_id(&db, &slug).await;
    let stream = body_stream_name(team);

    // An operator shrinks the body stream's largest message by hand.
    let broker = Broker::connect(&url, None).await.unwrap();
    let mut config = broker
        .js()
        .get_stream(&stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    config.max_message_size = 1000;
    broker.js().update_stream(config).await.unwrap();

    let (success, checks) = doctor(&db, &["--nats-url", &url]);
    assert!(
        !success,
        "a stream with wrong limits exits non-zero: {checks:#?}"
    );
    let line = named(&checks, &format!("streams:{slug}"));
    assert_eq!(line["status"], "fail", "{line:#}");
    let verdict = line["verdict"].as_str().unwrap();
    assert!(
        verdict.contains(&format!("{stream} max_msg_size is 1000")),
        "{verdict}"
    );
    let action = line["action"].as_str().unwrap();
    assert!(
        action.contains(&format!(
            "ai-crew-sync team stream --team {slug} --nats-url {url} --update-quotas"
        )),
        "{action}"
    );
    // The other checks are unaffected.
    assert_eq!(named(&checks, "max_payload")["status"], "ok");

    // The fix it names works.
    ok(
        &db,
        &[
            "team",
            "stream",
            "--team",
            &slug,
            "--nats-url",
            &url,
            "--update-quotas",
        ],
    );
    let (success, checks) = doctor(&db, &["--nats-url", &url]);
    assert!(success, "{checks:#?}");
    assert_eq!(named(&checks, &format!("streams:{slug}"))["status"], "ok");
}
