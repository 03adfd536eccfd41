//! Where a database's schema stands against this binary's migrations, read
//! without changing anything: what `doctor` reports (and what a refusal of a
//! database ahead of the binary, or `migrate --dry-run`, can build on).
//!
//! sqlx records every applied migration in `_sqlx_migrations`; this compares
//! that record with the migrations embedded in the binary ([`super::migrator`]).

use std::fmt;

use sqlx::PgPool;

/// One migration, by version and the name of its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationName {
    pub version: i64,
    pub description: String,
}

impl fmt::Display for MigrationName {
    /// As the file is named: `0018_stream_identity`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04}_{}",
            self.version,
            self.description.replace(' ', "_")
        )
    }
}

/// The database's schema against this binary's migrations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchemaState {
    /// Known to this binary and applied, oldest first.
    pub applied: Vec<MigrationName>,
    /// Known to this binary and not applied (`migrate` would run them).
    pub pending: Vec<MigrationName>,
    /// Applied, and unknown to this binary: a newer binary migrated the database.
    pub unknown: Vec<MigrationName>,
}

/// Read the schema's state; a database never migrated has every migration pending.
pub async fn schema_state(pool: &PgPool) -> Result<SchemaState, sqlx::Error> {
    let recorded: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    let done: Vec<(i64, String)> = if recorded {
        // A failed (dirty) migration is not applied.
        sqlx::query_as(
            "SELECT version, description FROM _sqlx_migrations WHERE success ORDER BY version",
        )
        .fetch_all(pool)
        .await?
    } else {
        Vec::new()
    };
    let migrator = super::migrator();
    let known: Vec<MigrationName> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| MigrationName {
            version: m.version,
            description: m.description.to_string(),
        })
        .collect();
    let mut state = SchemaState::default();
    for migration in known {
        if done
            .iter()
            .any(|(version, _)| *version == migration.version)
        {
            state.applied.push(migration);
        } else {
            state.pending.push(migration);
        }
    }
    state.unknown = done
        .into_iter()
        .filter(|(version, _)| !migrator.version_exists(*version))
        .map(|(version, description)| MigrationName {
            version,
            description,
        })
        .collect();
    Ok(state)
}
