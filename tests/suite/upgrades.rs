//! Upgrades as an operator runs them, with the real binary against a real
//! PostgreSQL: a database at the previous landed schema, with data in it,
//! upgraded by `migrate`; replicas starting at once on an empty database
//! migrating once; a binary older than the schema (or facing an edited
//! migration) refusing to start; `migrate --dry-run` applying nothing;
//! `serve --auto-migrate=false` refusing a schema that is behind.

use std::process::{Child, Command, Output, Stdio};

use ai_crew_sync::db::{self, Database, schema};
use ai_crew_sync::store::identity::teams;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::postgres::{fresh_database_url, pool_migrated_from_scratch};
use crate::support::{TestApp, eventually, free_port, http_client, test_actor};

fn bus(database_url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"));
    command
        .args(args)
        .env("DATABASE_URL", database_url)
        .env_remove("BUS_AUTO_MIGRATE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

async fn run(database_url: &str, args: &[&str]) -> Output {
    let mut command = bus(database_url, args);
    tokio::task::spawn_blocking(move || command.output().expect("run ai-crew-sync"))
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The embedded migrations without the last: the previous landed schema.
fn previous_migrator() -> sqlx::migrate::Migrator {
    let mut migrator = db::migrator();
    migrator.migrations.to_mut().pop();
    migrator
}

/// The newest migration this binary has, as the CLI names it.
fn newest() -> schema::MigrationInfo {
    let m = db::migrator().iter().last().unwrap().clone();
    schema::MigrationInfo {
        version: m.version,
        description: m.description.to_string(),
    }
}

fn known_versions() -> Vec<i64> {
    db::migrator().iter().map(|m| m.version).collect()
}

async fn recorded_versions(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A database at the previous landed schema: its URL and a pool on it.
async fn previous_schema() -> (String, PgPool) {
    let url = fresh_database_url().await;
    let pool = db::connect(&url, 4).await.unwrap();
    previous_migrator().run(&pool).await.unwrap();
    (url, pool)
}

/// `serve` on a free port; the child and the port.
fn start_serve(database_url: &str, extra: &[&str]) -> (Child, u16) {
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    // Tests run servers side by side: none takes the default metrics port.
    let mut args = vec!["serve", "--bind", &bind, "--metrics-bind", "off"];
    args.extend_from_slice(extra);
    let child = bus(database_url, &args).spawn().expect("spawn serve");
    (child, port)
}

async fn healthy(port: u16) -> bool {
    matches!(
        http_client()
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await,
        Ok(response) if response.status().is_success()
    )
}

/// Every table and column of the bus's schema, and every function: what a
/// migration that ran would have changed.
async fn schema_shape(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT table_name || '.' || column_name || ' ' || data_type
           FROM information_schema.columns WHERE table_schema = current_schema()
         UNION ALL
         SELECT p.oid::regprocedure::text || ' ' || md5(p.prosrc)
           FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// SIGTERM, then everything it printed.
async fn stop(child: Child) -> Output {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}

/// A `serve` that must refuse to start: it exits, unsuccessfully, without
/// ever answering /health. Its stderr.
async fn refused_serve(database_url: &str, extra: &[&str]) -> String {
    let (mut child, port) = start_serve(database_url, extra);
    // Some(status) once it exits; None if it answers /health instead.
    let exited = eventually("serve to exit (or answer /health)", async || {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(Some(status));
        }
        healthy(port).await.then_some(None)
    })
    .await;
    let Some(status) = exited else {
        let out = stop(child).await;
        panic!("serve started instead of refusing: {}", text(&out.stderr));
    };
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(!status.success(), "serve exited 0: {}", text(&out.stderr));
    text(&out.stderr)
}

// Issue 17 item 6: a database created by the previous landed schema, with a
// team, agents, a direct message, a task and a conversation with a message
// in it, is upgraded by the binary's `migrate`; everything reads back the
// same through MCP afterwards, and writes work on the new schema. (The data
// is written by this build's tools on the old schema: what the previous
// release wrote there uses the same tables and columns.)
#[tokio::test]
async fn a_database_at_the_previous_schema_upgrades_with_its_data() {
    let (url, pool) = previous_schema().await;
    assert_eq!(
        schema::schema_state(&pool).await.unwrap().pending,
        [newest()],
        "the database starts one migration behind"
    );

    let app = TestApp::builder()
        .database(pool.clone(), url.clone())
        .spawn()
        .await;
    app.team("upg").await;
    teams::capability(&app.pool, "upg", Some(true), &test_actor())
        .await
        .unwrap();
    let alice_token = app.agent("upg", "alice").await;
    let bob_token = app.agent("upg", "bob").await;
    let alice = app.mcp(&alice_token, None).await;
    let bob = app.mcp(&bob_token, Some("w1")).await;
    // Before migration 0047 (post_message asking for acknowledgements) this
    // build cannot post; the message is then written as the earlier schema
    // has it.
    let positions_landed: bool =
        sqlx::query_scalar("SELECT to_regprocedure('post_message(uuid, uuid, text, uuid, uuid, bigint, uuid, text, boolean, text, text, text, text, boolean, boolean, uuid, jsonb, bigint, bigint, boolean, integer)') IS NOT NULL")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    if positions_landed {
        alice
            .call(
                "post_message",
                json!({"to": "bob", "body": "written before the upgrade"}),
            )
            .await
            .unwrap();
    } else {
        sqlx::query(
            "WITH pos AS (
                 INSERT INTO message_counters (team_id, last_position)
                 SELECT id, 1 FROM teams WHERE slug = 'upg'
                 ON CONFLICT (team_id) DO UPDATE
                    SET last_position = message_counters.last_position + 1
                 RETURNING last_position)
             INSERT INTO messages (id, team_id, sender_id, sender_session, recipient_id, body,
                                   position)
             SELECT gen_random_uuid(), t.id, a.id, '', b.id, 'written before the upgrade',
                    pos.last_position
             FROM pos, teams t JOIN agents a ON a.team_id = t.id AND a.name = 'alice'
             JOIN agents b ON b.team_id = t.id AND b.name = 'bob'
             WHERE t.slug = 'upg'",
        )
        .execute(&app.pool)
        .await
        .unwrap();
    }
    // The task is written as the schema of the first tasks migration (0004)
    // has it: this build's task tools already need the newest columns.
    sqlx::query(
        "INSERT INTO tasks (id, team_id, key, title, created_by, created_session)
         SELECT gen_random_uuid(), t.id, 'upgrade-me', 'survive the upgrade', a.id, 'default'
         FROM teams t JOIN agents a ON a.team_id = t.id
         WHERE t.slug = 'upg' AND a.name = 'alice'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let created = alice
        .call(
            "create_conversation",
            json!({"title": "before", "private": true, "invite": ["bob/w1"]}),
        )
        .await
        .unwrap();
    let conversation: Uuid = created["id"].as_str().unwrap().parse().unwrap();
    bob.call(
        "join_conversation",
        json!({"conversation_id": conversation}),
    )
    .await
    .unwrap();
    let sent = alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": conversation, "body": "a body from before",
                   "request_id": Uuid::new_v4()}),
        )
        .await
        .unwrap();
    assert_eq!(sent["seq"], 1);
    drop((alice, bob, app));
    pool.close().await;

    let out = run(&url, &["migrate"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    let line = format!("{:04}  {}", newest().version, newest().description);
    assert!(
        said.contains("applied 1 migration(s)") && said.contains(&line),
        "{said}"
    );

    let pool = db::connect(&url, 4).await.unwrap();
    assert_eq!(recorded_versions(&pool).await, known_versions());
    let state = schema::schema_state(&pool).await.unwrap();
    assert!(
        state.pending.is_empty() && state.unknown.is_empty() && state.changed.is_empty(),
        "{state:?}"
    );

    let app = TestApp::builder().database(pool, url.clone()).spawn().await;
    let alice = app.mcp(&alice_token, None).await;
    let bob = app.mcp(&bob_token, Some("w1")).await;
    let me = bob.call("whoami", json!({})).await.unwrap();
    assert_eq!(
        (me["team"].clone(), me["agent"].clone()),
        (json!("upg"), json!("bob")),
        "{me}"
    );
    let inbox = bob
        .call(
            "read_messages",
            json!({"scope": "inbox", "only_new": false}),
        )
        .await
        .unwrap();
    assert_eq!(
        inbox["messages"][0]["body"], "written before the upgrade",
        "{inbox}"
    );
    let task = bob
        .call("get_task", json!({"key": "upgrade-me"}))
        .await
        .unwrap();
    assert_eq!(task["title"], "survive the upgrade", "{task}");
    let page = bob
        .call(
            "read_conversation",
            json!({"conversation_id": conversation, "after_seq": 0, "limit": 50}),
        )
        .await
        .unwrap();
    assert_eq!(page["messages"][0]["body"], "a body from before", "{page}");
    let after = alice
        .call(
            "send_conversation_message",
            json!({"conversation_id": conversation, "body": "and one after",
                   "request_id": Uuid::new_v4()}),
        )
        .await
        .unwrap();
    assert_eq!(after["seq"], 2, "{after}");
}

// sqlx's migration lock stays on (our own lock is around it, not instead).
#[test]
fn the_migrator_keeps_sqlx_own_advisory_lock() {
    assert!(db::migrator().locking);
}

// Several replicas started at once against an empty database: one migrates
// (under the advisory lock), the others wait, find the schema current and
// apply nothing; every version is recorded once, and every replica serves.
#[tokio::test]
async fn two_replicas_starting_at_once_on_an_empty_database_both_serve_and_migrate_once() {
    let url = fresh_database_url().await;
    let (a, port_a) = start_serve(&url, &[]);
    let (b, port_b) = start_serve(&url, &[]);
    let mut children = [Some(a), Some(b)];
    for (i, port) in [port_a, port_b].into_iter().enumerate() {
        eventually(&format!("replica {i} to come up"), async || {
            if healthy(port).await {
                return true;
            }
            if let Some(status) = children[i].as_mut().unwrap().try_wait().unwrap() {
                let out = children[i].take().unwrap().wait_with_output().unwrap();
                panic!("replica {i} exited ({status}): {}", text(&out.stderr));
            }
            false
        })
        .await;
    }
    let mut applied_lines = Vec::new();
    for child in children.into_iter().flatten() {
        let out = stop(child).await;
        let lines: Vec<String> = text(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("migrated: applied "))
            .map(str::to_owned)
            .collect();
        applied_lines.push(lines);
    }
    let pool = db::connect(&url, 2).await.unwrap();
    // Every migration is recorded (the primary key keeps each version once,
    // so this alone proves nothing about the lock) ...
    assert_eq!(recorded_versions(&pool).await, known_versions());
    // ... and what proves it: one replica applied every migration, the other
    // none (without the lock both report applying them, and one fails).
    let mut sizes: Vec<usize> = applied_lines.iter().map(Vec::len).collect();
    sizes.sort();
    assert_eq!(sizes, [0, known_versions().len()], "{applied_lines:?}");
}

// The same race on the library: four pools migrating one empty database at
// once all succeed, and what they report as applied adds up to each
// migration exactly once (a report computed outside the lock would count
// them again).
#[tokio::test]
async fn concurrent_migrations_each_apply_a_disjoint_share() {
    let url = fresh_database_url().await;
    let dir = tempfile::tempdir().unwrap();
    let mut databases = Vec::new();
    for _ in 0..4 {
        databases.push(Database::open(Some(&url), dir.path(), 2).await.unwrap());
    }
    let results =
        futures::future::join_all(databases.iter().map(|database| database.migrate())).await;
    let mut applied: Vec<i64> = Vec::new();
    for result in results {
        applied.extend(
            result
                .expect("every replica's migrate succeeds")
                .iter()
                .map(|m| m.version),
        );
    }
    applied.sort();
    assert_eq!(applied, known_versions());
    for database in databases {
        database.close().await;
    }
}

// A database a newer ai-crew-sync migrated (here: a version 9999 this binary
// does not have): `serve` (with or without --auto-migrate), `migrate`, its
// dry run and any command that opens the database refuse, saying what
// happened and what to run, and change nothing.
#[tokio::test]
async fn a_binary_older_than_the_schema_refuses_to_start() {
    let (pool, url) = pool_migrated_from_scratch().await;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (9999, 'from the future', true, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let before = recorded_versions(&pool).await;
    let expected = format!(
        "the database schema is at version 9999 (from the future) but this binary knows only up to {}: \
         it was upgraded by a newer ai-crew-sync",
        newest()
    );

    for extra in [&[][..], &["--auto-migrate=false"][..]] {
        let said = refused_serve(&url, extra).await;
        assert!(said.contains(&expected), "{extra:?}: {said}");
        assert!(
            said.contains("Run the newer ai-crew-sync") && said.contains("Nothing was changed"),
            "{said}"
        );
    }
    for args in [
        &["migrate"][..],
        &["migrate", "--dry-run"],
        &["team", "list"],
    ] {
        let out = run(&url, args).await;
        assert!(!out.status.success(), "{args:?} did not refuse");
        assert!(
            text(&out.stderr).contains(&expected),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    assert_eq!(
        recorded_versions(&pool).await,
        before,
        "nothing was changed"
    );
    let state = schema::schema_state(&pool).await.unwrap();
    assert_eq!(
        state.unknown,
        [schema::MigrationInfo {
            version: 9999,
            description: "from the future".into()
        }]
    );
    assert!(state.pending.is_empty());
}

// A landed migration applied from another text than the one built in (its
// checksum differs): the binary does not start, naming the migration.
#[tokio::test]
async fn an_applied_migration_whose_text_differs_is_refused() {
    let (pool, url) = pool_migrated_from_scratch().await;
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 1")
        .execute(&pool)
        .await
        .unwrap();
    let first = db::migrator()
        .iter()
        .next()
        .unwrap()
        .description
        .to_string();
    let said = refused_serve(&url, &[]).await;
    assert!(
        said.contains(&format!(
            "migration 0001 ({first}) was applied to this database from a text other than the \
             one built into this binary"
        )),
        "{said}"
    );
    assert!(
        said.contains("Run the build that migrated this database"),
        "{said}"
    );
}

// `migrate --dry-run` on a database one migration behind lists it and
// applies nothing; `serve --auto-migrate=false` refuses it, naming the
// pending migration and the command; `migrate` then applies exactly it.
#[tokio::test]
async fn migrate_dry_run_lists_the_pending_migration_and_applies_nothing() {
    let (url, pool) = previous_schema().await;
    let before = recorded_versions(&pool).await;
    let shape_before = schema_shape(&pool).await;
    let line = format!("{:04}  {}", newest().version, newest().description);

    let out = run(&url, &["migrate", "--dry-run"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("would apply 1 migration(s)") && said.contains(&line),
        "{said}"
    );
    assert_eq!(
        recorded_versions(&pool).await,
        before,
        "a dry run applies nothing"
    );
    assert_eq!(
        schema_shape(&pool).await,
        shape_before,
        "the pending migration did not run"
    );

    let said = refused_serve(&url, &["--auto-migrate=false"]).await;
    assert!(
        said.contains(&format!("pending migrations: {}", newest()))
            && said.contains("Run `ai-crew-sync migrate`"),
        "{said}"
    );
    assert_eq!(recorded_versions(&pool).await, before);

    let out = run(&url, &["migrate"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&line), "{}", text(&out.stdout));
    assert_eq!(recorded_versions(&pool).await, known_versions());
    let out = run(&url, &["migrate", "--dry-run"]).await;
    assert!(
        text(&out.stdout).contains("nothing to apply"),
        "{}",
        text(&out.stdout)
    );
}

// A dry run on a database never migrated lists every migration and leaves
// the database as it was: not even sqlx's bookkeeping table is created.
#[tokio::test]
async fn migrate_dry_run_on_an_empty_database_creates_nothing() {
    let url = fresh_database_url().await;
    let out = run(&url, &["migrate", "--dry-run"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("the database has no schema yet"), "{said}");
    for m in db::migrator().iter() {
        assert!(
            said.contains(&format!("{:04}  {}", m.version, m.description)),
            "{said}"
        );
    }
    let pool = db::connect(&url, 1).await.unwrap();
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'public'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(tables, 0, "nothing was created");
}
