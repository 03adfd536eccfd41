//! The database's schema against the migrations built into this binary.
//!
//! sqlx records every applied migration in `_sqlx_migrations` (version,
//! description, checksum of its text). [`schema_state`] reads that table,
//! and nothing else, and sorts each migration into one of:
//!
//! - `applied`: recorded in the database (the schema's version is the last);
//! - `pending`: built into this binary, not applied yet (`migrate` runs them);
//! - `unknown`: applied, but not built into this binary: a newer (or another)
//!   build of ai-crew-sync migrated the database, and this binary's queries do
//!   not know the tables and columns those migrations made;
//! - `changed`: applied from a text other than the one built in (a landed
//!   migration was edited), so the schema is not what this binary expects.
//!
//! The refusals a binary gives before it starts against such a database are
//! written here ([`SchemaState::refusal`], [`SchemaState::pending_refusal`]),
//! so `serve`, `migrate`, `migrate --dry-run` and every command word them
//! the same way.

use std::collections::BTreeMap;

use sqlx::{PgConnection, PgPool};

/// One migration: its version and its description (the file name's words).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationInfo {
    pub version: i64,
    pub description: String,
}

impl std::fmt::Display for MigrationInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04} ({})", self.version, self.description)
    }
}

/// The database's migrations against this binary's. Every list is in
/// version order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchemaState {
    /// Applied to the database, as recorded there.
    pub applied: Vec<MigrationInfo>,
    /// Built into this binary and not applied.
    pub pending: Vec<MigrationInfo>,
    /// Applied and not built into this binary.
    pub unknown: Vec<MigrationInfo>,
    /// Applied and built in, but from a different text (checksums differ).
    pub changed: Vec<MigrationInfo>,
}

/// Read the schema's state. Pure read: a database never migrated (no
/// `_sqlx_migrations` table) has everything pending, and is left as it is.
pub async fn schema_state(pool: &PgPool) -> Result<SchemaState, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    schema_state_on(&mut conn).await
}

/// [`schema_state`] on one connection (the migration lock's holder).
pub(crate) async fn schema_state_on(conn: &mut PgConnection) -> Result<SchemaState, sqlx::Error> {
    let migrated: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    let recorded: Vec<(i64, String, Vec<u8>)> = if migrated {
        sqlx::query_as(
            "SELECT version, description, checksum FROM _sqlx_migrations ORDER BY version",
        )
        .fetch_all(&mut *conn)
        .await?
    } else {
        Vec::new()
    };
    Ok(compare(&super::migrator(), recorded))
}

fn compare(
    migrator: &sqlx::migrate::Migrator,
    recorded: Vec<(i64, String, Vec<u8>)>,
) -> SchemaState {
    let known: BTreeMap<i64, &sqlx::migrate::Migration> = migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| (m.version, m))
        .collect();
    let mut state = SchemaState::default();
    for (version, description, checksum) in recorded {
        let info = MigrationInfo {
            version,
            description,
        };
        match known.get(&version) {
            None => state.unknown.push(info.clone()),
            Some(m) if *m.checksum != *checksum => state.changed.push(info.clone()),
            Some(_) => {}
        }
        state.applied.push(info);
    }
    state.pending = known
        .values()
        .filter(|m| !state.applied.iter().any(|a| a.version == m.version))
        .map(|m| MigrationInfo {
            version: m.version,
            description: m.description.to_string(),
        })
        .collect();
    state
}

impl SchemaState {
    /// The schema's version: the last migration applied.
    pub fn version(&self) -> Option<&MigrationInfo> {
        self.applied.last()
    }

    /// Why this binary must not run against the database at all (a newer or
    /// another build migrated it, or a landed migration changed), or `None`.
    /// Migrating would not help: the refusal says what would.
    pub fn refusal(&self) -> Option<String> {
        let newest_known = super::migrator()
            .iter()
            .map(|m| MigrationInfo {
                version: m.version,
                description: m.description.to_string(),
            })
            .next_back();
        let knows = newest_known
            .as_ref()
            .map_or_else(|| "none".to_owned(), MigrationInfo::to_string);
        if let Some(newest) = self.unknown.last() {
            let newer = newest_known
                .as_ref()
                .is_none_or(|k| self.unknown.iter().all(|u| u.version > k.version));
            let also = match self.unknown.len() {
                1 => String::new(),
                _ => format!(" (it does not have {})", list(&self.unknown)),
            };
            return Some(if newer {
                format!(
                    "the database schema is at version {newest} but this binary knows only up to \
                     {knows}{also}: it was upgraded by a newer ai-crew-sync. This binary would run \
                     against tables and columns it does not know, so it refuses to run. Run the \
                     newer ai-crew-sync (or a later one) against this database; to go back to \
                     this version, restore a backup taken before the upgrade. Nothing was changed."
                )
            } else {
                format!(
                    "the database has {} this binary does not have: {} (this binary knows up to \
                     {knows}): another build of ai-crew-sync migrated it. This binary would run \
                     against tables and columns it does not know, so it refuses to run. Run the \
                     build that migrated this database. Nothing was changed.",
                    plural(self.unknown.len(), "migration", "migrations"),
                    list(&self.unknown)
                )
            });
        }
        if !self.changed.is_empty() {
            return Some(format!(
                "{} {} applied to this database from a text other than the one built into this \
                 binary (the checksums differ): one of the two builds carries an edited \
                 migration, so the schema is not the one this binary expects and it refuses to \
                 run. Run the build that migrated this database; a landed migration never \
                 changes (a change is a new migration). Nothing was changed.",
                plural(self.changed.len(), "migration", "migrations"),
                list(&self.changed) + plural(self.changed.len(), " was", " were"),
            ));
        }
        None
    }

    /// Why a binary that is not to migrate (`serve --auto-migrate=false`)
    /// must not start: its migrations are not all applied. `None` when the
    /// schema is exactly this binary's. [`refusal`](Self::refusal) first.
    pub fn pending_refusal(&self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let at = self.version().map_or_else(
            || "has no schema yet".to_owned(),
            |v| format!("is at version {v}"),
        );
        Some(format!(
            "the database schema {at} and this binary needs {} more: pending migrations: {}. \
             Run `ai-crew-sync migrate` (`ai-crew-sync migrate --dry-run` lists them first), or \
             start with --auto-migrate=true. Nothing was changed.",
            self.pending.len(),
            list(&self.pending)
        ))
    }
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

fn list(migrations: &[MigrationInfo]) -> String {
    migrations
        .iter()
        .map(MigrationInfo::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
