//! The PostgreSQL the tests use: `TEST_DATABASE_URL` when given, otherwise a
//! throwaway cluster started once per test process by the embedded manager
//! (the same code `serve` uses) and stopped when the process exits.
//!
//! Each test gets a database of its own, so tests run in parallel without
//! seeing each other's rows. Databases made here are dropped at exit.
//!
//! A migrated database is a copy of a template (`CREATE DATABASE ... TEMPLATE`)
//! migrated once per schema, not a migration of its own: copying is a few
//! file writes, migrating is dozens of DDL transactions. The template's name
//! carries a digest of the embedded migrations ([`migrations_digest`]), so a
//! new or edited migration makes a new template; it is built under another
//! name and renamed only once migrated (a half-built template is never
//! used), by one process at a time (an advisory lock on the maintenance
//! database), and nobody connects to it once built (it refuses connections;
//! `TEMPLATE` refuses a source with sessions on it). Templates of other
//! digests are dropped when no process still uses them (each process holds a
//! shared advisory lock on its digest until it exits). Tests of migrating
//! itself start from an empty database ([`fresh_database_url`],
//! [`pool_migrated_from_scratch`]).

use std::sync::{Mutex, OnceLock};

use ai_crew_sync::db::{self, embedded::EmbeddedPostgres};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

struct Server {
    /// URL of the maintenance database (`postgres`) on the server.
    admin_url: String,
    embedded: Option<EmbeddedPostgres>,
    _dir: Option<tempfile::TempDir>,
}

static SERVER: OnceLock<Server> = OnceLock::new();
static CREATED: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The name of this process's migrated template, once it is ready.
static TEMPLATE: OnceLock<String> = OnceLock::new();

/// The advisory lock space of the templates (first key): "ACST".
const LOCK_SPACE: i32 = 0x4143_5354;
/// The second key of the lock builders take turns under.
const BUILD_LOCK: i32 = 0;
/// Template names: this prefix and a digest of the migrations.
const TEMPLATE_PREFIX: &str = "acs_template_";
/// A template still being migrated: this prefix and the digest.
const BUILDING_PREFIX: &str = "acs_building_";
/// How many of this process's databases are dropped at once at exit.
const DROPS_AT_ONCE: usize = 16;

fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        let server = match std::env::var("TEST_DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty())
        {
            Some(url) => Server {
                admin_url: url,
                embedded: None,
                _dir: None,
            },
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("acs-test-pg-")
                    .tempdir()
                    .expect("a temp dir for the throwaway PostgreSQL");
                let embedded = EmbeddedPostgres::start(dir.path()).unwrap_or_else(|e| {
                    panic!("no TEST_DATABASE_URL and the throwaway PostgreSQL could not start: {e}")
                });
                Server {
                    admin_url: embedded.database_url("postgres"),
                    embedded: Some(embedded),
                    _dir: Some(dir),
                }
            }
        };
        // SAFETY: registering a plain extern "C" fn; it runs once at process exit.
        unsafe { libc::atexit(cleanup_at_exit) };
        server
    })
}

extern "C" fn cleanup_at_exit() {
    let Some(server) = SERVER.get() else { return };
    let names: Vec<String> =
        std::mem::take(&mut *CREATED.lock().unwrap_or_else(|p| p.into_inner()));
    if server.embedded.is_none() && !names.is_empty() {
        // A shared server keeps running: drop what this process created
        // (the template stays for the next run). PostgreSQL 15 ends each
        // DROP DATABASE with a checkpoint; drops running side by side wait
        // for the same one, where one after the other each waits for its own.
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(async {
                if let Ok(pool) = db::connect(&server.admin_url, DROPS_AT_ONCE as u32).await {
                    futures::stream::iter(names)
                        .for_each_concurrent(DROPS_AT_ONCE, |name| {
                            let pool = &pool;
                            async move {
                                let sql =
                                    format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                                let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await;
                            }
                        })
                        .await;
                    pool.close().await;
                }
            });
        }
    }
    if let Some(embedded) = &server.embedded {
        let _ = embedded.stop();
        // Statics are never dropped, so the temp dir is removed here.
        let _ = std::fs::remove_dir_all(embedded.data_dir());
    }
}

/// The URL of a new, empty database on the test server (for tests of
/// migrating, and of a binary that migrates on start).
pub async fn fresh_database_url() -> String {
    let admin_url = server().admin_url.clone();
    let name = new_name();
    db::create_database_if_missing(&admin_url, &name)
        .await
        .expect("create a test database");
    CREATED.lock().unwrap().push(name.clone());
    with_database(&admin_url, &name)
}

/// The URL of a new database at the latest schema: a copy of the template.
pub async fn migrated_database_url() -> String {
    let admin_url = server().admin_url.clone();
    let template = template().await;
    let name = new_name();
    let mut conn = PgConnection::connect(&admin_url)
        .await
        .expect("connect to the test server's maintenance database");
    let sql = format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\"");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("create a test database from {template}: {e}"));
    // Recorded before anything can fail, so exit drops it.
    CREATED.lock().unwrap().push(name.clone());
    let _ = conn.close().await;
    with_database(&admin_url, &name)
}

/// A pool on a new database at the latest schema (a copy of the template).
pub async fn fresh_pool() -> (PgPool, String) {
    let url = migrated_database_url().await;
    let pool = db::connect(&url, 8)
        .await
        .expect("connect to the test database");
    (pool, url)
}

/// A pool on a new database migrated by the migrator itself, from empty (for
/// tests whose subject is what migrating leaves).
pub async fn pool_migrated_from_scratch() -> (PgPool, String) {
    let url = fresh_database_url().await;
    let pool = db::connect(&url, 8)
        .await
        .expect("connect to the test database");
    db::migrator()
        .run(&pool)
        .await
        .expect("migrate the test database");
    (pool, url)
}

fn new_name() -> String {
    format!("acs_test_{}", Uuid::new_v4().simple())
}

/// A digest of every embedded migration (version, description, checksum of
/// its text): what a database migrated by this binary has applied.
pub fn migrations_digest() -> String {
    let mut digest = Sha256::new();
    for m in db::migrator().iter() {
        digest.update(m.version.to_be_bytes());
        digest.update(m.description.as_bytes());
        digest.update([0]);
        digest.update(&*m.checksum);
    }
    hex::encode(&digest.finalize()[..8])
}

/// The second key of the shared lock a process holds while it uses the
/// template of `digest` (16 hex digits): its first 32 bits.
fn in_use_key(digest: &str) -> Option<i32> {
    u32::from_str_radix(digest.get(..8)?, 16)
        .ok()
        .map(|k| k as i32)
}

/// This process's template, built if no process built it before. The first
/// caller waits for it; the lock-holding connection lives on a thread of its
/// own for the rest of the process (a test's runtime ends with the test).
async fn template() -> &'static str {
    if let Some(name) = TEMPLATE.get() {
        return name;
    }
    let admin_url = server().admin_url.clone();
    tokio::task::spawn_blocking(move || {
        TEMPLATE
            .get_or_init(|| {
                let (ready, answer) = std::sync::mpsc::channel();
                std::thread::Builder::new()
                    .name("test-template".into())
                    .spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .expect("a runtime for the template's connection");
                        rt.block_on(async move {
                            match prepare_template(&admin_url).await {
                                Ok((name, conn)) => {
                                    // Holds the in-use lock until the process exits.
                                    let _in_use = conn;
                                    let _ = ready.send(Ok(name));
                                    std::future::pending::<()>().await;
                                }
                                Err(e) => {
                                    let _ = ready.send(Err(e.to_string()));
                                }
                            }
                        })
                    })
                    .expect("start the template's thread");
                answer
                    .recv()
                    .expect("the template's thread answers")
                    .unwrap_or_else(|e| panic!("the migrated template database: {e}"))
            })
            .as_str()
    })
    .await
    .expect("the template is prepared without panicking")
}

/// Under the builders' lock: mark the template of this binary's migrations
/// in use (shared lock until the connection closes), build it if missing,
/// drop templates nobody uses. The template's name and the connection.
async fn prepare_template(admin_url: &str) -> Result<(String, PgConnection), sqlx::Error> {
    let digest = migrations_digest();
    let name = format!("{TEMPLATE_PREFIX}{digest}");
    let mut conn = PgConnection::connect(admin_url).await?;
    sqlx::query("SELECT pg_advisory_lock($1, $2)")
        .bind(LOCK_SPACE)
        .bind(BUILD_LOCK)
        .execute(&mut conn)
        .await?;
    let prepared = async {
        sqlx::query("SELECT pg_advisory_lock_shared($1, $2)")
            .bind(LOCK_SPACE)
            .bind(in_use_key(&digest).expect("a hex digest"))
            .execute(&mut conn)
            .await?;
        if !database_exists(&mut conn, &name).await? {
            build_template(&mut conn, admin_url, &digest, &name).await?;
        }
        drop_unused_templates(&mut conn, &name).await
    }
    .await;
    sqlx::query("SELECT pg_advisory_unlock($1, $2)")
        .bind(LOCK_SPACE)
        .bind(BUILD_LOCK)
        .execute(&mut conn)
        .await?;
    prepared.map(|()| (name, conn))
}

async fn database_exists(conn: &mut PgConnection, name: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(name)
        .fetch_one(conn)
        .await
}

/// Migrate a database under a building name, then close every connection to
/// it, forbid new ones and give it the template's name. A builder that died
/// half-way left its building database behind: the next one (holding the
/// builders' lock, so no builder is running) drops it first.
async fn build_template(
    conn: &mut PgConnection,
    admin_url: &str,
    digest: &str,
    name: &str,
) -> Result<(), sqlx::Error> {
    let building = format!("{BUILDING_PREFIX}{digest}");
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"),
        format!("CREATE DATABASE \"{building}\""),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await?;
    }
    let pool = db::connect(&with_database(admin_url, &building), 1)
        .await
        .map_err(|e| sqlx::Error::Protocol(format!("connect to {building}: {e}")))?;
    let migrated = db::migrator().run(&pool).await;
    pool.close().await;
    migrated.map_err(|e| sqlx::Error::Protocol(format!("migrate {building}: {e}")))?;
    for sql in [
        // RENAME waits (up to 5 s) for the closed pool's session to end.
        format!("ALTER DATABASE \"{building}\" RENAME TO \"{name}\""),
        format!("ALTER DATABASE \"{name}\" WITH ALLOW_CONNECTIONS false"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Drop every template but `keep` that no process marks in use (its shared
/// lock is free, taken here exclusively while dropping, so none starts
/// using it meanwhile), and every building database (the builders' lock is
/// held, so none is being built).
async fn drop_unused_templates(conn: &mut PgConnection, keep: &str) -> Result<(), sqlx::Error> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE starts_with(datname, $1) OR starts_with(datname, $2)",
    )
    .bind(TEMPLATE_PREFIX)
    .bind(BUILDING_PREFIX)
    .fetch_all(&mut *conn)
    .await?;
    for other in names.into_iter().filter(|n| n != keep) {
        let drop = format!("DROP DATABASE IF EXISTS \"{other}\" WITH (FORCE)");
        let Some(digest) = other.strip_prefix(TEMPLATE_PREFIX) else {
            sqlx::query(sqlx::AssertSqlSafe(drop))
                .execute(&mut *conn)
                .await?;
            continue;
        };
        let Some(key) = in_use_key(digest) else {
            continue;
        };
        let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(LOCK_SPACE)
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        if free {
            let dropped = sqlx::query(sqlx::AssertSqlSafe(drop))
                .execute(&mut *conn)
                .await;
            sqlx::query("SELECT pg_advisory_unlock($1, $2)")
                .bind(LOCK_SPACE)
                .bind(key)
                .execute(&mut *conn)
                .await?;
            dropped?;
        }
    }
    Ok(())
}

/// `url` with its database name replaced by `name`, keeping the query (`?host=`).
fn with_database(url: &str, name: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("a valid database URL");
    parsed.set_path(&format!("/{name}"));
    parsed.to_string()
}
