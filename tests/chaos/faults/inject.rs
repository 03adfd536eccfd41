//! Applying a schedule to a running cluster: sleep until each fault's start,
//! apply it, heal it when its duration is over, and record both times.

use std::time::Duration;

use anyhow::Context as _;
use sqlx::PgPool;

use super::{Fault, Link, Schedule, kind_name};
use crate::cluster::{Cluster, NATS_NODES};
use crate::model::{self, AppliedFault, Clock, FaultKind};

/// How long to look for a replica holding slots, or for a stream leader.
const FIND_LIMIT: Duration = Duration::from_secs(5);

/// Runs the schedule over the load period (its times count from the call,
/// which is when the clients start), then heals whatever is still
/// broken and waits until every replica answers /health. An error means a
/// fault could not be applied or healed (a process would not start again):
/// the run cannot be judged.
pub async fn inject(
    cluster: &mut Cluster,
    schedule: &Schedule,
    clock: Clock,
) -> anyhow::Result<Vec<AppliedFault>> {
    let database = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(&cluster.target().database_url)
        .context("a pool on the run's database")?;
    // (run time, is the end, fault index); ends first at the same moment.
    let load_started = clock.now_ms();
    eprintln!(
        "chaos: {:>7.1} s the clients start; the schedule's times count from here",
        load_started as f64 / 1000.0
    );
    let mut steps: Vec<(u64, bool, usize)> = schedule
        .faults
        .iter()
        .enumerate()
        .flat_map(|(i, f)| {
            [
                (load_started + f.at_ms, false, i),
                (load_started + f.end_ms(), true, i),
            ]
        })
        .collect();
    steps.sort_by_key(|&(at, end, _)| (at, !end));
    let mut applied: Vec<AppliedFault> = Vec::new();
    // Per fault: where it landed in `applied` and what it actually hit.
    let mut hit: Vec<Option<(usize, usize)>> = vec![None; schedule.faults.len()];
    for (at, end, i) in steps {
        let now = clock.now_ms();
        if at > now {
            tokio::time::sleep(Duration::from_millis(at - now)).await;
        }
        let fault = &schedule.faults[i];
        if end {
            let Some((slot, target)) = hit[i] else {
                continue;
            };
            heal(cluster, fault, target)
                .await
                .with_context(|| format!("healing {}", applied[slot].target))?;
            applied[slot].ended_ms = Some(clock.now_ms());
            eprintln!(
                "chaos: {:>7.1} s healed {} ({})",
                clock.now_ms() as f64 / 1000.0,
                kind_name(fault.kind),
                applied[slot].target
            );
        } else {
            let started_ms = clock.now_ms();
            let (target, label) = apply(cluster, fault, &database)
                .await
                .with_context(|| format!("applying {}", kind_name(fault.kind)))?;
            eprintln!(
                "chaos: {:>7.1} s {} ({label})",
                started_ms as f64 / 1000.0,
                kind_name(fault.kind)
            );
            hit[i] = Some((applied.len(), target));
            applied.push(AppliedFault {
                kind: fault.kind,
                target: label,
                started_ms,
                ended_ms: None,
            });
        }
    }
    database.close().await;
    cluster
        .heal_all()
        .await
        .context("healing every fault after the schedule")?;
    eprintln!(
        "chaos: {:>7.1} s every fault healed, every replica answers /health",
        clock.now_ms() as f64 / 1000.0
    );
    Ok(applied)
}

/// Apply one fault; returns the replica or node it hit and a label for it.
async fn apply(
    cluster: &mut Cluster,
    fault: &Fault,
    database: &PgPool,
) -> anyhow::Result<(usize, String)> {
    let r = fault.target;
    Ok(match fault.kind {
        FaultKind::KillReplica => {
            cluster.kill_replica(r);
            (r, format!("replica {r}"))
        }
        FaultKind::PauseDrainReplica => {
            // Its NATS links drop every reply, so its drain's publishes
            // wait for acknowledgements with their slots leased; once it
            // holds some, it stops. The links are cut while it is stopped:
            // it wakes to closed connections, its acknowledgements lost.
            for relay in cluster.nats_relays(r) {
                relay.black_hole_replies();
            }
            let held = slots_held_by(cluster, r, database).await;
            cluster.pause_replica(r);
            for relay in cluster.nats_relays(r) {
                relay.pass();
                relay.cut();
            }
            let label = match held {
                Some(n) => format!("replica {r}, holding {n} outbox slots"),
                None => format!("replica {r}, no outbox slot seen within 5 s"),
            };
            (r, label)
        }
        FaultKind::PartitionReplicaPostgres => {
            cluster.pg_relay(r).black_hole();
            (r, format!("replica {r} ↔ postgres"))
        }
        FaultKind::PartitionReplicaNats => {
            for relay in cluster.nats_relays(r) {
                relay.black_hole();
            }
            (r, format!("replica {r} ↔ nats"))
        }
        FaultKind::DelayReplicaLink => {
            let by = Duration::from_millis(fault.delay_ms);
            match fault.link {
                Link::Postgres => cluster.pg_relay(r).delay(by),
                Link::Nats => cluster.nats_relays(r).iter().for_each(|p| p.delay(by)),
            }
            let link = match fault.link {
                Link::Postgres => "postgres",
                Link::Nats => "nats",
            };
            (r, format!("replica {r} ↔ {link}, +{} ms", fault.delay_ms))
        }
        FaultKind::RestartPostgres => {
            cluster.crash_postgres()?;
            (0, "postgres".into())
        }
        FaultKind::KillNatsNode => {
            let leader = stream_leader(cluster, database).await;
            let node = if leader == Some(fault.target) {
                (fault.target + 1) % NATS_NODES
            } else {
                fault.target
            };
            cluster.kill_nats(node);
            let leads = match leader {
                Some(l) => format!("leader is node {l}"),
                None => "no leader found".into(),
            };
            (node, format!("nats node {node} ({leads})"))
        }
        FaultKind::KillStreamLeader => match stream_leader(cluster, database).await {
            Some(node) => {
                cluster.kill_nats(node);
                (node, format!("nats node {node}, the stream leader"))
            }
            None => {
                let node = fault.target;
                cluster.kill_nats(node);
                (node, format!("nats node {node} (no stream leader found)"))
            }
        },
        FaultKind::RestartAllNats => {
            cluster.shut_down_all_nats();
            (0, "every nats node".into())
        }
    })
}

async fn heal(cluster: &mut Cluster, fault: &Fault, target: usize) -> anyhow::Result<()> {
    match fault.kind {
        FaultKind::KillReplica => cluster.restart_replica(target).await?,
        FaultKind::PauseDrainReplica => cluster.resume_replica(target),
        FaultKind::PartitionReplicaPostgres => {
            // Bytes were dropped mid-stream: the connections are cut, the
            // replica opens new ones.
            let relay = cluster.pg_relay(target);
            relay.pass();
            relay.cut();
        }
        FaultKind::PartitionReplicaNats => {
            for relay in cluster.nats_relays(target) {
                relay.pass();
                relay.cut();
            }
        }
        FaultKind::DelayReplicaLink => match fault.link {
            Link::Postgres => cluster.pg_relay(target).pass(),
            Link::Nats => cluster.nats_relays(target).iter().for_each(|p| p.pass()),
        },
        FaultKind::RestartPostgres => cluster.restart_postgres()?,
        FaultKind::KillNatsNode | FaultKind::KillStreamLeader => cluster.restart_nats(target)?,
        FaultKind::RestartAllNats => {
            for node in 0..NATS_NODES {
                cluster.restart_nats(node)?;
            }
        }
    }
    Ok(())
}

/// Wait (up to [`FIND_LIMIT`]) until replica `r` holds unexpired outbox
/// slots; how many. A drain lane's worker name carries its process id
/// (`drain-<pid>-<uuid>`).
async fn slots_held_by(cluster: &Cluster, r: usize, database: &PgPool) -> Option<i64> {
    let pid = cluster.replica_pid(r)?;
    let prefix = format!("drain-{pid}-%");
    let deadline = tokio::time::Instant::now() + FIND_LIMIT;
    while tokio::time::Instant::now() < deadline {
        let held: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_outbox
              WHERE state = 'leased' AND lease_expires_at > now() AND leased_by LIKE $1",
        )
        .bind(&prefix)
        .fetch_one(database)
        .await;
        if let Ok(n) = held
            && n > 0
        {
            return Some(n);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// The node leading the body stream of the workload's team, waiting out an
/// election (up to [`FIND_LIMIT`]).
async fn stream_leader(cluster: &Cluster, database: &PgPool) -> Option<usize> {
    let team: uuid::Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = $1")
        .bind(model::TEAM)
        .fetch_optional(database)
        .await
        .ok()
        .flatten()?;
    let stream = ai_crew_sync::backend::jetstream::body_stream_name(team);
    let deadline = tokio::time::Instant::now() + FIND_LIMIT;
    while tokio::time::Instant::now() < deadline {
        if let Some(node) = cluster.stream_leader(&stream).await {
            return Some(node);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}
