//! `ai-crew-sync doctor [--json] [--strict]`: look at everything the bus
//! depends on and say, one line per check, what is wrong and what to do.
//!
//! The checks: the embedded cluster (when there is no `DATABASE_URL`), the
//! database, its schema against this binary's migrations, the event
//! listener (a LISTEN/NOTIFY round trip), the clock against PostgreSQL's,
//! the outbox, the broker and its `max_payload` (when a NATS URL is
//! configured, by the same flags and environment as `serve`), each team's
//! JetStream streams, the allowed Host names for the bind address, and the
//! server the settings name (the profile's URL, the address the last `serve`
//! on this database recorded) and whether it answers `GET /health` (the last
//! three in `doctor/broker.rs`, `doctor/hosts.rs` and `doctor/server.rs`).
//!
//! Statuses: `fail` (the bus cannot do its job as configured: exit 1),
//! `warn` (it works, something deserves a look: exit 0, or 1 with
//! `--strict`), `ok`, and `skip` (not checked because what it needs failed
//! or is missing; the failure that caused it is its own line).
//!
//! Doctor inspects, it does not repair: it never migrates, provisions or
//! retries anything. It only starts a stopped embedded cluster for the
//! checks, as every command does, and stops it again; a data directory with
//! no cluster is reported, not created.

mod broker;
mod hosts;
mod server;

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use serde::Serialize;
use sqlx::PgPool;

use super::args::NatsArgs;
use super::{COMMAND_CONNECTIONS, Context, output};
use acs_store::db::embedded::{EmbeddedError, EmbeddedPostgres, EmbeddedStatus};
use acs_store::db::schema::{self, MigrationInfo};
use acs_store::error::BusError;
use acs_store::store::identity::admin::Authority;
use acs_store::store::{delivery::outbox, identity::teams};

/// A message waiting longer than this for publication is stuck: retries back
/// off to at most 64 s and fail after 8 attempts, and a team waiting on a
/// stream condition is tried every 10 s.
const OUTBOX_STUCK_SECS: i64 = 300;
/// Clock skew past this between this host and PostgreSQL is reported.
const CLOCK_SKEW_WARN: Duration = Duration::from_secs(2);
/// How long a NOTIFY may take to come back.
const EVENTS_WITHIN: Duration = Duration::from_secs(5);

#[derive(Args, Debug)]
#[command(mut_arg("nats_credentials", |a| a.requires("nats_url")))]
pub struct DoctorArgs {
    /// The address `serve` listens on (as `serve --bind`), to check the allowed hosts against.
    #[arg(long, env = "BUS_BIND", default_value = super::serve::DEFAULT_BIND)]
    bind: SocketAddr,
    /// The Host names `serve` allows (as `serve --allowed-hosts`; comma-separated).
    #[arg(long, env = "BUS_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    #[command(flatten)]
    nats: NatsArgs,
    /// The local profile whose server to check [default: the one .acs.toml names, else the
    /// default profile].
    #[arg(long, env = "BUS_PROFILE")]
    profile: Option<String>,
    /// Exit 1 on warnings too (by default only a failure does).
    #[arg(long)]
    strict: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Ok,
    Warn,
    Fail,
    Skip,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One line of the report.
#[derive(Debug, Serialize)]
struct Check {
    check: String,
    status: Status,
    verdict: String,
    action: String,
}

fn check(
    name: &str,
    status: Status,
    verdict: impl Into<String>,
    action: impl Into<String>,
) -> Check {
    Check {
        check: name.to_owned(),
        status,
        verdict: verdict.into(),
        action: action.into(),
    }
}

const NOTHING_TO_DO: &str = "nothing to do";

pub async fn run(ctx: &Context, args: DoctorArgs, json: bool) -> anyhow::Result<()> {
    let mut checks = Vec::new();
    let db = open_database(ctx, &mut checks).await;
    let pool = db.as_ref().map(|db| &db.pool);
    match pool {
        Some(pool) => {
            checks.push(schema_check(pool).await);
            checks.push(events_check(pool).await);
            checks.push(clock_check(pool).await);
            checks.push(outbox_check(pool).await);
        }
        None => {
            for name in ["schema", "events", "clock", "outbox"] {
                checks.push(check(
                    name,
                    Status::Skip,
                    "not checked: the database is not available",
                    "fix the database first (see its line)",
                ));
            }
        }
    }
    broker::broker_checks(&args, pool, &mut checks).await;
    checks.push(hosts::allowed_hosts_check(args.bind, &args.allowed_hosts));
    checks.extend(server::server_checks(args.profile.clone(), pool).await);
    if let Some(db) = db {
        db.close().await;
    }

    if json {
        output::json(&checks)?;
    } else {
        let width = checks.iter().map(|c| c.check.len()).max().unwrap_or(0);
        for c in &checks {
            println!(
                "{:<4}  {:<width$}  {} — {}",
                c.status.as_str(),
                c.check,
                one_line(&c.verdict),
                one_line(&c.action)
            );
        }
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warned = checks.iter().filter(|c| c.status == Status::Warn).count();
    if failed > 0 || (args.strict && warned > 0) {
        anyhow::bail!(
            "doctor found {failed} failure(s) and {warned} warning(s); each line says what to do"
        );
    }
    Ok(())
}

/// Foreign text (a driver's or a broker's error) on one clean line.
fn one_line(text: &str) -> String {
    output::clean(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A store error with the driver's text (doctor's reader is the operator).
fn error_text(err: &BusError) -> String {
    match err {
        BusError::Db(source) => format!("the database failed: {source}"),
        other => other.to_string(),
    }
}

/// The embedded cluster's state (without DATABASE_URL), then the database,
/// opened without migrating. `None` when it cannot be used.
async fn open_database(ctx: &Context, checks: &mut Vec<Check>) -> Option<acs_store::db::Database> {
    let embedded = ctx
        .database_url
        .as_deref()
        .is_none_or(|u| u.trim().is_empty());
    if embedded {
        let dir = ctx.data_dir.clone();
        let inspected = tokio::task::spawn_blocking(move || EmbeddedPostgres::inspect(&dir))
            .await
            .expect("inspecting the embedded cluster does not panic");
        let (line, usable) = embedded_check(inspected);
        checks.push(line);
        if !usable {
            checks.push(check(
                "database",
                Status::Skip,
                "not checked: there is no database to connect to",
                "see the embedded line",
            ));
            return None;
        }
    }
    match ctx.open_database(COMMAND_CONNECTIONS).await {
        Ok(db) => {
            checks.push(check(
                "database",
                Status::Ok,
                format!("reachable ({})", db.location),
                NOTHING_TO_DO,
            ));
            Some(db)
        }
        Err(err) => {
            let action = if embedded {
                format!(
                    "read the cluster's log in {}, or set DATABASE_URL",
                    ctx.data_dir.join("pgrun/postgres.log").display()
                )
            } else {
                "check DATABASE_URL (host, port, database, user, password) and that PostgreSQL \
                 runs and accepts connections from this host"
                    .to_owned()
            };
            checks.push(check("database", Status::Fail, format!("{err:#}"), action));
            None
        }
    }
}

/// The embedded cluster's line, and whether it holds a database to connect to.
fn embedded_check(inspected: Result<EmbeddedStatus, EmbeddedError>) -> (Check, bool) {
    let state = match inspected {
        Err(EmbeddedError::NoBinaries { searched }) => {
            let line = check(
                "embedded",
                Status::Fail,
                format!(
                    "no DATABASE_URL, and no PostgreSQL server binaries (initdb, pg_ctl) \
                     {searched}"
                ),
                "install them (Debian/Ubuntu: `apt-get install postgresql`, or `scripts/run` \
                 from a source checkout; Fedora: `dnf install postgresql-server`; macOS: \
                 `brew install postgresql`), or set DATABASE_URL to a PostgreSQL you run",
            );
            return (line, false);
        }
        Err(err) => {
            let line = check(
                "embedded",
                Status::Fail,
                format!("the embedded PostgreSQL cannot be used: {err}"),
                "fix that, or set DATABASE_URL to a PostgreSQL you run",
            );
            return (line, false);
        }
        Ok(state) => state,
    };
    if !state.initialized {
        let line = check(
            "embedded",
            Status::Warn,
            format!(
                "no DATABASE_URL, and no cluster in {} yet",
                state.data_dir.join("pgdata").display()
            ),
            "the first `ai-crew-sync serve` (or `quickstart`) creates it; if the bus's \
             data is elsewhere, pass --data-dir (BUS_DATA_DIR) or DATABASE_URL",
        );
        return (line, false);
    }
    let pgdata = state.data_dir.join("pgdata");
    let users = state.users.len();
    let (status, verdict, action) = match (state.running, state.owner) {
        (false, _) => (
            Status::Ok,
            format!(
                "stopped (cluster in {}); doctor starts it for these checks and \
                 stops it again",
                pgdata.display()
            ),
            "nothing to do: `serve` and every command start it when needed".to_owned(),
        ),
        (true, Some((pid, true))) => (
            Status::Ok,
            format!(
                "running (cluster in {}), owned by process {pid}, which stops it \
                 when done; {users} process(es) registered as using it",
                pgdata.display()
            ),
            NOTHING_TO_DO.to_owned(),
        ),
        (true, owner) => (
            Status::Warn,
            format!(
                "running (cluster in {}), but {}",
                pgdata.display(),
                match owner {
                    Some((pid, _)) => format!("its owner, process {pid}, is gone"),
                    None => "no process is recorded as its owner".to_owned(),
                }
            ),
            format!(
                "nothing breaks: the next command or `serve` adopts it and stops it \
                 when done; to stop it now, `pg_ctl stop -D {}`",
                pgdata.display()
            ),
        ),
    };
    (check("embedded", status, verdict, action), true)
}

/// At most five names, then how many more.
fn names(list: &[MigrationInfo]) -> String {
    let mut shown: Vec<String> = list.iter().take(5).map(ToString::to_string).collect();
    if list.len() > 5 {
        shown.push(format!("and {} more", list.len() - 5));
    }
    shown.join(", ")
}

async fn schema_check(pool: &PgPool) -> Check {
    let version = env!("CARGO_PKG_VERSION");
    let state = match schema::schema_state(pool).await {
        Ok(state) => state,
        Err(err) => {
            return check(
                "schema",
                Status::Fail,
                format!("could not read the applied migrations: {err}"),
                "check that DATABASE_URL's user may read the bus's tables",
            );
        }
    };
    let mut verdicts = Vec::new();
    let mut actions = Vec::new();
    if !state.unknown.is_empty() {
        verdicts.push(format!(
            "the database is ahead of this binary (ai-crew-sync {version}): {} migration(s) \
             applied that it does not know ({})",
            state.unknown.len(),
            names(&state.unknown)
        ));
        actions.push(
            "run the newer binary that applied them (upgrade this one); an older binary does not \
             know what the newer schema expects",
        );
    }
    if !state.changed.is_empty() {
        verdicts.push(format!(
            "{} migration(s) applied from a text other than the one built into this binary \
             (checksums differ: {})",
            state.changed.len(),
            names(&state.changed)
        ));
        actions.push(
            "run the build that migrated this database; a landed migration never changes (a \
             change is a new migration)",
        );
    }
    if !state.pending.is_empty() {
        verdicts.push(format!(
            "{} migration(s) of this binary not applied: {}",
            state.pending.len(),
            names(&state.pending)
        ));
        actions.push(
            "`ai-crew-sync migrate` applies them (as does `serve`, unless --auto-migrate false)",
        );
    }
    if verdicts.is_empty() {
        let last = state
            .applied
            .last()
            .map_or("none".to_owned(), ToString::to_string);
        return check(
            "schema",
            Status::Ok,
            format!(
                "at this binary's schema: {} migrations applied, the last {last}",
                state.applied.len()
            ),
            NOTHING_TO_DO,
        );
    }
    check(
        "schema",
        Status::Fail,
        verdicts.join("; "),
        actions.join("; "),
    )
}

async fn events_check(pool: &PgPool) -> Check {
    match acs_store::events::round_trip(pool, EVENTS_WITHIN).await {
        Ok(took) => check(
            "events",
            Status::Ok,
            format!(
                "a NOTIFY on `{}` reached a LISTEN in {} ms",
                acs_store::events::CHANNEL,
                took.as_millis()
            ),
            NOTHING_TO_DO,
        ),
        Err(err) => check(
            "events",
            Status::Fail,
            format!("{err}: waiting calls on other replicas would wake only on their timer"),
            "connect the bus to PostgreSQL directly or through a pooler in session mode \
             (PgBouncer's transaction mode drops LISTEN), and check the server's log",
        ),
    }
}

async fn clock_check(pool: &PgPool) -> Check {
    // The reading with the shortest round trip compares best.
    let mut best: Option<(
        chrono::TimeDelta,
        chrono::DateTime<chrono::Utc>,
        chrono::DateTime<chrono::Utc>,
    )> = None;
    for _ in 0..3 {
        let before = chrono::Utc::now();
        let theirs = match acs_store::db::server_time(pool).await {
            Ok(t) => t,
            Err(err) => {
                return check(
                    "clock",
                    Status::Fail,
                    format!("could not read PostgreSQL's clock: {err}"),
                    "check the database",
                );
            }
        };
        let round_trip = chrono::Utc::now() - before;
        if best.is_none_or(|(shortest, _, _)| round_trip < shortest) {
            best = Some((round_trip, before + round_trip / 2, theirs));
        }
    }
    let (round_trip, ours, theirs) = best.expect("three readings were taken");
    let skew_ms = (theirs - ours).num_milliseconds();
    // The query's own round trip bounds how well the two can be compared.
    let uncertain_ms = round_trip.num_milliseconds() / 2;
    let beyond = skew_ms
        .unsigned_abs()
        .saturating_sub(uncertain_ms.unsigned_abs());
    let said = format!(
        "PostgreSQL's clock is {} ms {} this host's (± {uncertain_ms} ms)",
        skew_ms.abs(),
        if skew_ms >= 0 { "ahead of" } else { "behind" }
    );
    if beyond > CLOCK_SKEW_WARN.as_millis() as u64 {
        check(
            "clock",
            Status::Warn,
            format!(
                "{said}, over {} s: times the bus reports mix both clocks (its log, a \
                 paused write's age) and disagree",
                CLOCK_SKEW_WARN.as_secs()
            ),
            "synchronise both hosts' clocks (NTP: chrony or systemd-timesyncd)",
        )
    } else {
        check("clock", Status::Ok, said, NOTHING_TO_DO)
    }
}

async fn outbox_check(pool: &PgPool) -> Check {
    let status = match outbox::installation_status(pool).await {
        Ok(status) => status,
        Err(err) => {
            return check(
                "outbox",
                Status::Fail,
                format!("could not read the outbox: {}", error_text(&err)),
                "check the database",
            );
        }
    };
    let summary = format!(
        "{} pending, {} leased, {} failed, {} uncertain, {}",
        status.pending,
        status.leased,
        status.failed,
        status.uncertain,
        status
            .oldest_pending_seconds
            .map_or("nothing waiting".to_owned(), |s| format!(
                "the oldest waiting {s} s"
            ))
    );
    let stuck = status
        .oldest_pending_seconds
        .is_some_and(|s| s > OUTBOX_STUCK_SECS);
    if status.failed == 0 && !stuck {
        return check("outbox", Status::Ok, summary, NOTHING_TO_DO);
    }
    // Which teams, so the commands can be run as printed.
    let mut failing = Vec::new();
    let mut waiting = Vec::new();
    if let Ok(all) = teams::list(pool, &Authority::local()).await {
        for team in all {
            if let Ok(s) = outbox::status(pool, team.id).await {
                if s.failed > 0 {
                    failing.push(format!("{} ({})", team.slug, s.failed));
                }
                if s.oldest_pending_seconds
                    .is_some_and(|s| s > OUTBOX_STUCK_SECS)
                {
                    waiting.push(team.slug.clone());
                }
            }
        }
    }
    let mut verdict = summary;
    let mut actions = Vec::new();
    if status.failed > 0 {
        verdict.push_str(&format!("; failed messages in {}", failing.join(", ")));
        actions.push(
            "`ai-crew-sync conversations status --team T --nats-url URL` says why; once the \
             cause is fixed, `ai-crew-sync conversations retry --team T --nats-url URL --apply`"
                .to_owned(),
        );
    }
    if stuck {
        verdict.push_str(&format!(
            "; messages waiting over {OUTBOX_STUCK_SECS} s in {}",
            waiting.join(", ")
        ));
        actions.push(
            "a `serve --nats-url URL` with --publication-worker true must run and reach the \
             broker; `ai-crew-sync conversations status --team T --nats-url URL` says what \
             they wait for"
                .to_owned(),
        );
    }
    check("outbox", Status::Warn, verdict, actions.join("; "))
}
