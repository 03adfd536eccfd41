//! `GET /health`: 200 while the database answers, with a JSON body saying so,
//! the event listener's state (`live`, `silent`, `detached`), the outbox
//! (`publication`) and the broker. A broker outage does not fail it: the bus
//! still accepts sends (they queue), so the status is `degraded`, still 200.
//! `?broker=check` pings the broker and looks at the streams of every team
//! routed to jetstream; without it the broker is only reported as configured
//! or not (or unreachable, when it has not answered since the start), so a
//! load balancer's probe costs no broker round trip. `broker_conditions`
//! lists every team stream that is missing, full or without a leader (which
//! team, which stream, why, the fixing command); any makes the status
//! `degraded`.
//!
//! The route is unauthenticated, so it answers in fixed words only: a driver's
//! error text (host names, database and role names, the server's own wording)
//! goes to the log, never to the caller. Which team a broker condition
//! concerns is an operator's business: without a credential a condition
//! says its kind and where to look; with an admin credential (`acsa_…`) it
//! names the team, the stream and the fixing command (a team's credential
//! sees its own team's only).
//!
//! A plain probe is answered from one snapshot of the installation that one
//! task refreshes ([`Looks`], [`refresh`]): no request takes a pool
//! connection or calls the broker, so a flood of probes, complete requests
//! from many connections, costs the database one look a second and each
//! probe a moment of its connection, which is then idle (and can be evicted
//! for a newcomer such as an `/mcp` call). The snapshot is at most a second
//! old while probes keep coming; after a quiet spell the first probe waits
//! for a look begun after it arrived. `?broker=check`, an operator's explicit
//! check, always waits for a look begun after it arrived; one such look is
//! taken at a time and shared by the checks that came meanwhile.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::AppState;
use acs_store::auth;
use acs_store::error::BusError;
use acs_store::store::delivery::broker_conditions::Reported;
use acs_store::store::identity::admin::{self, AdminIdentity};

#[derive(Debug, Default, Deserialize)]
pub struct HealthQuery {
    /// `check`: ping the broker.
    broker: Option<String>,
}

/// How long each part of a look may take before it is reported unavailable.
const PART_TIMEOUT: Duration = Duration::from_secs(3);

/// What one look at the installation found: everything `/health` answers but
/// what the caller's credential may see of the conditions.
#[derive(Clone)]
struct Look {
    /// When the look began: it answers requests that arrived before that.
    began: Instant,
    database: Result<(), &'static str>,
    broker: &'static str,
    publication: Value,
    conditions: Vec<Reported>,
}

/// How often the snapshot is refreshed while probes keep coming.
const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// A snapshot older than this is not answered: the probe waits for the
/// next look (every part of a look is bounded by [`PART_TIMEOUT`], so a
/// slow database still refreshes well within it).
const STALE_AFTER: Duration = Duration::from_secs(15);
/// How long a probe waits for a look begun after it arrived.
const LOOK_WAIT: Duration = Duration::from_secs(10);

/// The snapshot plain probes are answered from, refreshed by [`refresh`],
/// and the latest `?broker=check` look. `/health` is unauthenticated and a
/// look costs database queries (and, checked, broker round trips for every
/// jetstream team), so a flood of probes must not become a flood of those.
pub struct Looks {
    plain: tokio::sync::watch::Sender<Option<Look>>,
    /// A probe found the snapshot older than [`REFRESH_EVERY`].
    wanted: tokio::sync::Notify,
    checked: tokio::sync::Mutex<Option<Look>>,
}

impl Default for Looks {
    fn default() -> Self {
        Looks {
            plain: tokio::sync::watch::channel(None).0,
            wanted: tokio::sync::Notify::new(),
            checked: tokio::sync::Mutex::new(None),
        }
    }
}

impl Looks {
    async fn get(&self, state: &AppState, check_broker: bool) -> Look {
        let arrived = Instant::now();
        if !check_broker {
            return self.snapshot(arrived).await;
        }
        let mut latest = self.checked.lock().await;
        if let Some(look) = latest.as_ref().filter(|l| l.began >= arrived) {
            return look.clone();
        }
        let look = look(state, true).await;
        *latest = Some(look.clone());
        look
    }

    /// The snapshot, asking for a newer one when it is past
    /// [`REFRESH_EVERY`]; waiting for one begun after `arrived` only when
    /// there is none yet or it is past [`STALE_AFTER`].
    async fn snapshot(&self, arrived: Instant) -> Look {
        let current = self.plain.borrow().clone();
        if let Some(look) = current.as_ref() {
            let age = arrived.saturating_duration_since(look.began);
            if age > REFRESH_EVERY {
                self.wanted.notify_one();
            }
            if age <= STALE_AFTER {
                return look.clone();
            }
        }
        let mut changes = self.plain.subscribe();
        self.wanted.notify_one();
        let fresh = changes.wait_for(|l| l.as_ref().is_some_and(|l| l.began >= arrived));
        match tokio::time::timeout(LOOK_WAIT, fresh).await {
            Ok(Ok(look)) => look.clone().expect("checked by wait_for"),
            // No look in time (or the refresher stopped with the server):
            // the latest there is, or the database reported unreachable.
            _ => self.plain.borrow().clone().unwrap_or(Look {
                began: arrived,
                database: Err("unreachable"),
                broker: "unknown",
                publication: Value::Null,
                conditions: Vec::new(),
            }),
        }
    }
}

/// The one task that refreshes the snapshot: a look when a probe asked for
/// one, at most one every [`REFRESH_EVERY`], until `stopping`.
pub async fn refresh(state: std::sync::Weak<AppState>, stopping: CancellationToken) {
    let mut last: Option<Instant> = None;
    loop {
        let Some(looks) = state.upgrade() else { return };
        let wanted = async {
            looks.health.wanted.notified().await;
            if let Some(last) = last {
                tokio::time::sleep_until((last + REFRESH_EVERY).into()).await;
            }
        };
        tokio::select! {
            () = wanted => {}
            () = stopping.cancelled() => return,
        }
        let look = tokio::select! {
            look = look(&looks, false) => look,
            () = stopping.cancelled() => return,
        };
        last = Some(look.began);
        looks.health.plain.send_replace(Some(look));
    }
}

pub async fn health(
    State(state): State<Arc<AppState>>,
    Query(query): Query<HealthQuery>,
    connection: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
) -> (StatusCode, Json<Value>) {
    let check_broker = query.broker.as_deref() == Some("check");
    let look = state.health.get(&state, check_broker).await;
    let version = env!("CARGO_PKG_VERSION");
    // The listener's state is this process's own, read now.
    let (broker, events) = (look.broker, state.events.state());
    if let Err(detail) = look.database {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                json!({ "status": "unavailable", "database": detail, "broker": broker,
                         "events": events, "version": version }),
            ),
        );
    }
    // A credential is looked up only when there is something to show.
    let viewer = match look.conditions.is_empty() {
        true => None,
        false => {
            viewer(
                &state,
                &headers,
                connection.map(|Extension(ConnectInfo(a))| a.ip()),
            )
            .await
        }
    };
    let conditions = shown_to(viewer.as_ref(), look.conditions);
    let status = if broker == "unreachable" || !conditions.is_empty() {
        "degraded"
    } else {
        "ok"
    };
    (
        StatusCode::OK,
        Json(
            json!({ "status": status, "database": "ok", "broker": broker, "events": events,
                     "publication": look.publication, "broker_conditions": conditions,
                     "version": version }),
        ),
    )
}

/// Take a look: the database, the broker, the outbox and the streams' conditions.
async fn look(state: &AppState, check_broker: bool) -> Look {
    let began = Instant::now();
    let database = match tokio::time::timeout(PART_TIMEOUT, acs_store::db::ping(&state.pool)).await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "health: the database check failed");
            Err("unreachable")
        }
        Err(_) => {
            tracing::warn!("health: the database did not answer within 3 s");
            Err("unreachable")
        }
    };
    let broker = match (state.backends.broker_configured(), check_broker) {
        (false, _) => "not_configured",
        (true, false) if state.backends.broker().is_none() => "unreachable",
        (true, false) => "configured",
        (true, true) => {
            let reachable = state.backends.broker_reachable();
            match tokio::time::timeout(PART_TIMEOUT, reachable).await {
                Ok(Some(true)) => "ok",
                _ => "unreachable",
            }
        }
    };
    let mut look = Look {
        began,
        database,
        broker,
        publication: Value::Null,
        conditions: Vec::new(),
    };
    if look.database.is_err() {
        return look;
    }
    let status = acs_store::store::delivery::outbox::installation_status(&state.pool);
    look.publication = match tokio::time::timeout(PART_TIMEOUT, status).await {
        Ok(Ok(status)) => json!(status),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "health: the outbox status could not be read");
            json!({ "error": "unavailable" })
        }
        Err(_) => {
            tracing::warn!("health: the outbox status took longer than 3 s");
            json!({ "error": "unavailable" })
        }
    };
    // Conditions of teams' streams an operator must fix: which team, which
    // stream, why, the command. In the bus's own fixed words (the broker's
    // text stays in the log); with `?broker=check` every team routed to
    // jetstream is looked at, otherwise what the drain learned.
    let conditions = acs_store::store::delivery::broker_conditions::installation(
        &state.pool,
        &state.backends,
        check_broker,
    );
    look.conditions = match tokio::time::timeout(PART_TIMEOUT, conditions).await {
        Ok(Ok(conditions)) => conditions,
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "health: the broker conditions could not be read");
            Vec::new()
        }
        Err(_) => Vec::new(),
    };
    look
}

/// The admin credential the request carries, if any and valid. Anything else
/// (none, another class, unknown, revoked) is an anonymous caller here: the
/// probe never answers 401. Looking an admin credential up costs a database
/// query, so an unknown or revoked one spends the address's allowance of
/// failed authentications as on `/admin`: once a flood of made-up
/// credentials from one address has spent it, that address's probes are
/// answered as anonymous without a lookup.
async fn viewer(
    state: &AppState,
    headers: &HeaderMap,
    address: Option<IpAddr>,
) -> Option<AdminIdentity> {
    let bearer = super::bearer(headers).ok()?;
    // Another class of credential, or none well formed, costs no lookup.
    let digest = auth::parse_admin_credential(bearer).ok()?;
    let limits = &state.limits;
    let address = limits.client_address(address, headers);
    let _turn = limits.lookup_turn(address).await;
    match admin::authenticate(&state.pool, &digest).await {
        Ok(me) => Some(me),
        Err(BusError::Unauthenticated(_)) => {
            limits.failed_authentication(address);
            None
        }
        Err(_) => None,
    }
}

/// What of each condition `viewer` may see (see the module docs).
fn shown_to(viewer: Option<&AdminIdentity>, conditions: Vec<Reported>) -> Vec<Value> {
    conditions
        .into_iter()
        .filter_map(|c| match viewer {
            Some(me) if me.team.as_deref().is_none_or(|own| own == c.team) => Some(json!(c)),
            Some(_) => None,
            None => Some(json!({
                "condition": c.condition,
                "since_seconds": c.since_seconds,
                "fix": "a team's JetStream stream needs an operator: `ai-crew-sync conversations \
                        status --team T --nats-url URL` names it and the command, or call \
                        /health with an admin credential (Authorization: Bearer acsa_…)",
            })),
        })
        .collect()
}
