//! Where the database comes from, and its schema.
//!
//! `DATABASE_URL` names a PostgreSQL the operator runs; without it the
//! embedded cluster in the data directory is started or joined
//! ([`embedded`]) and the bus connects to it as its own unprivileged role. Either way the caller gets one [`Database`]: a pool, and the
//! duty to [`Database::close`] it so an owned embedded cluster is stopped.

pub mod embedded;
pub mod schema;

use std::path::Path;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use thiserror::Error;

use embedded::{EmbeddedError, EmbeddedPostgres};

/// The embedded migrations. sqlx takes its PostgreSQL advisory lock around a
/// run (`locking`, on by default and kept on); [`Database::migrate`] holds
/// [`MIGRATION_LOCK`] around that and its own checks. A database migrated by
/// a newer binary is refused ([`schema::SchemaState::refusal`]), not
/// ignored: this binary's queries would meet tables and columns it does not
/// know.
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("../../migrations")
}

/// The advisory lock (PostgreSQL scopes it to the database) a migrating
/// process holds from before it reads the schema's state until its last
/// migration is applied, so replicas starting at once migrate once, one after
/// the other, each checking what the previous one left.
pub const MIGRATION_LOCK: i64 = 0x6163_735f_6d69_6772; // "acs_migr"

#[derive(Debug, Error)]
pub enum OpenError {
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    #[error("could not connect to PostgreSQL at {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("could not migrate the database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("could not read or lock the database's migration state: {0}")]
    ReadSchema(#[from] sqlx::Error),
    /// The schema is not one this binary may run against (the message says why and what to do).
    #[error("{0}")]
    Schema(String),
}

/// A connected database, and the embedded cluster behind it if there is one.
pub struct Database {
    pub pool: PgPool,
    embedded: Option<EmbeddedPostgres>,
    /// What to tell a human about where the data lives (never a password).
    pub location: String,
}

impl Database {
    /// Connect to `database_url`, or start/join the embedded cluster in `data_dir`.
    pub async fn open(
        database_url: Option<&str>,
        data_dir: &Path,
        max_connections: u32,
    ) -> Result<Database, OpenError> {
        match database_url.filter(|u| !u.trim().is_empty()) {
            Some(url) => {
                let pool = connect(url, max_connections).await?;
                Ok(Database {
                    pool,
                    embedded: None,
                    location: redact(url),
                })
            }
            None => {
                let data_dir = data_dir.to_path_buf();
                let embedded =
                    tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&data_dir))
                        .await
                        .expect("embedded start does not panic")?;
                // The superuser sets the role up; the pool (and with it every
                // migration and query of the bus) is the role, which cannot
                // reach the host's files or programs.
                let opened = async {
                    embedded.provision_bus_role().await?;
                    connect(&embedded.bus_url(), max_connections).await
                }
                .await;
                match opened {
                    Ok(pool) => Ok(Database {
                        pool,
                        location: format!(
                            "embedded PostgreSQL, data in {}",
                            embedded.pgdata().display()
                        ),
                        embedded: Some(embedded),
                    }),
                    Err(err) => {
                        let _ = tokio::task::spawn_blocking(move || embedded.stop()).await;
                        Err(err)
                    }
                }
            }
        }
    }

    /// Apply every migration not yet applied, under [`MIGRATION_LOCK`]; the
    /// ones applied, in order. Refused, changing nothing, when the database
    /// was migrated by a newer build ([`schema::SchemaState::refusal`]).
    /// Replicas already running are not affected: only a start checks.
    pub async fn migrate(&self) -> Result<Vec<schema::MigrationInfo>, OpenError> {
        let mut conn = self.pool.acquire().await?;
        let result = migrate_on(&mut conn).await;
        // Closing the session releases its advisory locks, whatever happened
        // (sqlx keeps its own lock when a migration fails).
        let _ = conn.close().await;
        result
    }

    /// Refuse, changing nothing, unless the schema is exactly this binary's:
    /// what `serve --auto-migrate=false` checks before it serves.
    pub async fn check_schema(&self) -> Result<(), OpenError> {
        let state = schema::schema_state(&self.pool).await?;
        match state.refusal().or_else(|| state.pending_refusal()) {
            Some(refusal) => Err(OpenError::Schema(refusal)),
            None => Ok(()),
        }
    }

    /// Close the pool and leave the embedded cluster (stopping it if we own it).
    pub async fn close(self) {
        self.pool.close().await;
        if let Some(embedded) = self.embedded {
            match tokio::task::spawn_blocking(move || embedded.stop()).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::error!(error = %err, "could not stop the embedded PostgreSQL")
                }
                Err(err) => tracing::error!(error = %err, "embedded PostgreSQL stop panicked"),
            }
        }
    }
}

async fn migrate_on(
    conn: &mut sqlx::PgConnection,
) -> Result<Vec<schema::MigrationInfo>, OpenError> {
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await?;
    let state = schema::schema_state_on(conn).await?;
    if let Some(refusal) = state.refusal() {
        return Err(OpenError::Schema(refusal));
    }
    migrator().run(&mut *conn).await?;
    Ok(state.pending)
}

/// One trivial query: whether the database answers at all.
pub async fn ping(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query_scalar::<_, i32>("SELECT 1")
        .fetch_one(pool)
        .await
        .map(|_| ())
}

/// PostgreSQL's clock now (`clock_timestamp()`, not the transaction's start).
pub async fn server_time(pool: &PgPool) -> Result<chrono::DateTime<chrono::Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
}

/// A pooled connection idle at least this long is pinged before it is handed out.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A pool on `url`; statement logging is off (it would log every heartbeat).
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, OpenError> {
    let options: PgConnectOptions = url.parse().map_err(|source| OpenError::Connect {
        target: redact(url),
        source,
    })?;
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        // sqlx pings every connection it hands out by default: one extra
        // round trip per operation under load, on connections returned
        // microseconds earlier. Only a connection idle for a while (it may
        // have been cut by a restart or a proxy) is pinged now; a broken one
        // is dropped and another taken, as before.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        // No JIT: the bus runs short, index-bound statements, but the
        // planner, which cannot know how few rows a page or a bounded count
        // touches, estimates some past `jit_above_cost` on a large history;
        // compiling them took ~1.5 s where running them takes under 1 ms.
        // Generic plans only: the statements are written for them (a page
        // cut by LIMIT, one index range a branch) and the functions force
        // them already. PostgreSQL's default re-plans a prepared statement
        // for every call whenever its generic plan looks dearer than the
        // custom ones it tried: in `capacity`'s 5 000-agent step half of all
        // calls were planned again (read_messages, the unread counts, the
        // inbox status, the task list: 1-2 ms of planning each), more CPU
        // than PostgreSQL spent running statements. A statement that needs
        // its values to be planned (search's words) asks for a custom plan
        // in a transaction of its own (`store::custom_plans`).
        .connect_with(
            options
                .options([("jit", "off"), ("plan_cache_mode", "force_generic_plan")])
                .disable_statement_logging(),
        )
        .await
        .map_err(|source| OpenError::Connect {
            target: redact(url),
            source,
        })
}

/// `CREATE DATABASE name` unless it exists, through the maintenance database at `admin_url`.
pub async fn create_database_if_missing(admin_url: &str, name: &str) -> Result<(), OpenError> {
    let connect_err = |source| OpenError::Connect {
        target: redact(admin_url),
        source,
    };
    let mut conn = sqlx::PgConnection::connect(admin_url)
        .await
        .map_err(connect_err)?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .map_err(connect_err)?;
    if !exists {
        // An identifier cannot be a bind parameter; the name is quoted with
        // embedded quotes doubled, which is PostgreSQL's escaping for identifiers.
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        if let Err(err) = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
        {
            // Another process may have created it between the check and here.
            let raced = err
                .as_database_error()
                .and_then(|e| e.code())
                .is_some_and(|code| code == "42P04" || code == "23505");
            if !raced {
                return Err(connect_err(err));
            }
        }
    }
    let _ = conn.close().await;
    Ok(())
}

/// The URL without its password, for messages and logs.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) => parsed.to_string(),
        Err(_) => "(unparseable DATABASE_URL)".to_string(),
    }
}
