//! The PostgreSQL the tests use: `TEST_DATABASE_URL` when given, otherwise a
//! throwaway cluster started once per test process by the embedded manager
//! (the same code `serve` uses) and stopped when the process exits.
//!
//! Each test gets a database of its own, so tests run in parallel without
//! seeing each other's rows. Databases made here are dropped at exit.

use std::sync::{Mutex, OnceLock};

use ai_crew_sync::db::{self, embedded::EmbeddedPostgres};
use sqlx::PgPool;
use uuid::Uuid;

struct Server {
    /// URL of the maintenance database (`postgres`) on the server.
    admin_url: String,
    embedded: Option<EmbeddedPostgres>,
    _dir: Option<tempfile::TempDir>,
}

static SERVER: OnceLock<Server> = OnceLock::new();
static CREATED: Mutex<Vec<String>> = Mutex::new(Vec::new());

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
        // A shared server keeps running: drop what this process created.
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(async {
                if let Ok(pool) = db::connect(&server.admin_url, 1).await {
                    for name in names {
                        let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                        let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await;
                    }
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

/// The URL of a new, empty database on the test server.
pub async fn fresh_database_url() -> String {
    let admin_url = server().admin_url.clone();
    let name = format!("acs_test_{}", Uuid::new_v4().simple());
    db::create_database_if_missing(&admin_url, &name)
        .await
        .expect("create a test database");
    CREATED.lock().unwrap().push(name.clone());
    with_database(&admin_url, &name)
}

/// A migrated pool on a new database.
pub async fn fresh_pool() -> (PgPool, String) {
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

/// `url` with its database name replaced by `name`, keeping the query (`?host=`).
fn with_database(url: &str, name: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("a valid database URL");
    parsed.set_path(&format!("/{name}"));
    parsed.to_string()
}
