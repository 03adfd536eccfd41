//! What `GET /metrics` reads at scrape time: the state of this server's
//! pool and event listener, and a few bounded counts from the database,
//! each from its aggregate's own function (the outbox's status as `/health`
//! reports it, the inbox's owed count, the open moves). One scrape costs a
//! handful of index reads whatever the history holds.
//!
//! The rendering is `acs_metrics`'s business; this only gathers.

use sqlx::PgPool;

use crate::error::BusResult;
use crate::events::{Events, ListenerState};
use crate::store::{conversations::inbox, delivery::moves, delivery::outbox};

/// Inbox references counted at most (a count at the cap means "at least").
pub const INBOX_OWED_CAP: i64 = 10_000;

/// How long a scrape waits for the database before serving without its state.
const READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

pub use outbox::TeamBacklog as TeamOutbox;

/// Everything the scrape-time gauges show.
pub struct Scraped {
    pub pool_size: u32,
    pub pool_idle: usize,
    pub pool_max: u32,
    pub listener_state: &'static str,
    /// `None` when the database did not answer (the recorder's numbers are
    /// still served).
    pub database: Option<DatabaseState>,
}

pub struct DatabaseState {
    pub outbox: outbox::Status,
    pub teams: Vec<TeamOutbox>,
    pub inbox_owed: i64,
    pub moves_running: i64,
    pub moves_paused: i64,
}

pub async fn scrape(pool: &PgPool, events: &Events) -> Scraped {
    let read = tokio::time::timeout(READ_LIMIT, database_state(pool)).await;
    let database = match read {
        Ok(Ok(state)) => Some(state),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "metrics: the database state could not be read");
            None
        }
        Err(_) => {
            tracing::warn!("metrics: the database state was not read within 3 s");
            None
        }
    };
    Scraped {
        pool_size: pool.size(),
        pool_idle: pool.num_idle(),
        pool_max: pool.options().get_max_connections(),
        listener_state: match events.state() {
            ListenerState::Live => "live",
            ListenerState::Silent => "silent",
            ListenerState::Detached => "detached",
        },
        database,
    }
}

async fn database_state(pool: &PgPool) -> BusResult<DatabaseState> {
    let (outbox, teams, inbox_owed, (moves_running, moves_paused)) = tokio::try_join!(
        outbox::installation_status(pool),
        outbox::backlog_by_team(pool),
        inbox::owed_installation(pool, INBOX_OWED_CAP),
        moves::open_counts(pool),
    )?;
    Ok(DatabaseState {
        outbox,
        teams,
        inbox_owed,
        moves_running,
        moves_paused,
    })
}
