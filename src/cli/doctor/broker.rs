//! `doctor`'s broker checks: the broker answers with JetStream, its
//! `max_payload` takes a full body, and each team's streams are present, not
//! full and in the layout the bus relies on (judged by
//! `backend::jetstream::inspect`; conditions by `store::delivery::broker_conditions`).

use sqlx::PgPool;

use super::{Check, DoctorArgs, NOTHING_TO_DO, Status, check, error_text};
use acs_store::backend::jetstream::{Broker, ConditionKind, REQUIRED_MAX_PAYLOAD};
use acs_store::error::BusError;
use acs_store::store::delivery::broker_conditions;

pub(super) async fn broker_checks(
    args: &DoctorArgs,
    pool: Option<&PgPool>,
    checks: &mut Vec<Check>,
) {
    let teams = match pool {
        Some(pool) => match broker_conditions::teams_with_streams(pool).await {
            Ok(teams) => Some(teams),
            Err(err) => {
                checks.push(check(
                    "streams",
                    Status::Fail,
                    format!(
                        "could not read which teams use JetStream: {}",
                        error_text(&err)
                    ),
                    "check the database",
                ));
                None
            }
        },
        None => None,
    };
    let nats = &args.nats;
    let Some(url) = &nats.nats_url else {
        checks.push(not_configured_check(teams.as_deref()));
        return;
    };
    let broker = match Broker::connect_to_inspect(url, nats.nats_credentials.as_deref()).await {
        Ok(broker) => broker,
        Err(err) => {
            let action = match err {
                BusError::Unavailable(_) => {
                    "start nats-server with JetStream on (`nats-server -js`), or fix --nats-url \
                     (BUS_NATS_URL); meanwhile sends to teams on JetStream wait in the outbox"
                }
                _ => "fix the broker settings as said, then run doctor again",
            };
            checks.push(check("broker", Status::Fail, err.to_string(), action));
            for name in ["max_payload", "streams"] {
                checks.push(check(
                    name,
                    Status::Skip,
                    "not checked: the broker is not available",
                    "fix the broker first (see its line)",
                ));
            }
            return;
        }
    };
    checks.push(check(
        "broker",
        Status::Ok,
        format!("{} answers, with JetStream", broker.url()),
        NOTHING_TO_DO,
    ));
    checks.push(max_payload_check(broker.max_payload()));
    let Some(teams) = teams else {
        checks.push(check(
            "streams",
            Status::Skip,
            "not checked: which teams use JetStream is in the database, which is not available",
            "fix the database first (see its line)",
        ));
        return;
    };
    if teams.is_empty() {
        checks.push(check(
            "streams",
            Status::Ok,
            "no team keeps bodies on JetStream or has streams recorded",
            NOTHING_TO_DO,
        ));
    }
    for team in &teams {
        checks.push(team_streams_check(&broker, team, url).await);
    }
}

/// The broker's line without a NATS URL: fine, unless a team keeps its
/// bodies on JetStream (`teams`: `None` when the database could not say).
fn not_configured_check(teams: Option<&[broker_conditions::TeamWithStreams]>) -> Check {
    let routed: Vec<&str> = teams
        .iter()
        .copied()
        .flatten()
        .filter(|t| t.routed)
        .map(|t| t.slug.as_str())
        .collect();
    if routed.is_empty() {
        return check(
            "broker",
            Status::Ok,
            "not configured (no --nats-url or BUS_NATS_URL): bodies stay on PostgreSQL",
            NOTHING_TO_DO,
        );
    }
    check(
        "broker",
        Status::Warn,
        format!(
            "not configured, but team(s) {} keep conversation bodies on JetStream: \
             neither the broker nor their streams were checked",
            routed.join(", ")
        ),
        "pass --nats-url (or BUS_NATS_URL) and --nats-credentials as `serve` has them",
    )
}

/// Whether the broker takes a full body plus headers in one message.
fn max_payload_check(max_payload: usize) -> Check {
    if max_payload >= REQUIRED_MAX_PAYLOAD {
        return check(
            "max_payload",
            Status::Ok,
            format!(
                "{max_payload} bytes per message: a full body plus headers \
                 ({REQUIRED_MAX_PAYLOAD} bytes) fits"
            ),
            NOTHING_TO_DO,
        );
    }
    check(
        "max_payload",
        Status::Fail,
        format!(
            "the broker takes at most {max_payload} bytes per message, below \
             {REQUIRED_MAX_PAYLOAD} (a full 1 MiB body plus headers): `serve` refuses it"
        ),
        "raise it in nats-server.conf (`max_payload: 2MB`) and restart nats-server",
    )
}

async fn team_streams_check(
    broker: &Broker,
    team: &broker_conditions::TeamWithStreams,
    url: &str,
) -> Check {
    let name = format!("streams:{}", team.slug);
    let inspected = match broker.inspect_team_streams(team.id, &team.slug).await {
        Ok(inspected) => inspected,
        Err(err) => {
            return check(
                &name,
                Status::Fail,
                format!("could not read the team's streams: {err}"),
                "check the broker, then run doctor again",
            );
        }
    };
    let mut serious = Vec::new();
    let mut minor = Vec::new();
    let mut actions: Vec<String> = Vec::new();
    for stream in &inspected {
        if !stream.present {
            serious.push(format!("{} is missing", stream.name));
            actions.push(format!(
                "`ai-crew-sync team stream --team {} --nats-url {url}`",
                team.slug
            ));
        }
        for f in &stream.findings {
            let said = format!(
                "{} {} is {}, expected {} ({})",
                stream.name, f.limit, f.found, f.expected, f.consequence
            );
            if f.serious { &mut serious } else { &mut minor }.push(said);
            actions.push(format!("{} {}: {}", stream.name, f.limit, f.fix));
        }
    }
    // Full, or out of storage, as the broker says now (missing is above, so
    // asked only of streams that exist).
    let present = inspected.iter().all(|s| s.present);
    if present && let Ok(conditions) = broker_conditions::of_team(broker, team.id, &team.slug).await
    {
        for c in conditions
            .iter()
            .filter(|c| c.condition != ConditionKind::StreamMissing)
        {
            serious.push(c.why.clone());
            actions.push(format!("`{}`", c.fix));
        }
    }
    actions.dedup();
    let uses = if team.routed {
        "the team keeps bodies on JetStream"
    } else {
        "provisioned; nothing of the team is on JetStream yet"
    };
    if serious.is_empty() && minor.is_empty() {
        let names: Vec<&str> = inspected.iter().map(|s| s.name.as_str()).collect();
        return check(
            &name,
            Status::Ok,
            format!(
                "{} present with the layout the bus expects ({uses})",
                names.join(" and ")
            ),
            NOTHING_TO_DO,
        );
    }
    let status = if !serious.is_empty() && team.routed {
        Status::Fail
    } else {
        Status::Warn
    };
    serious.extend(minor);
    check(
        &name,
        status,
        format!("{} ({uses})", serious.join("; ")),
        actions.join("; "),
    )
}
