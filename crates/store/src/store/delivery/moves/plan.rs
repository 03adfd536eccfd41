//! Step 1, the plan: what moving each conversation would take and what
//! blocks it, and whether the target can take the bodies at all. Writes
//! nothing; it is all `conversations migrate` does without `--apply`.

use sqlx::PgPool;
use uuid::Uuid;

use super::{Blocked, Direction, Plan};
use crate::backend::jetstream::{REQUIRED_MAX_PAYLOAD, body_stream_name, inbox_stream_name};
use crate::backend::{BackendKind, Backends};
use crate::error::{BusError, BusResult};
use crate::store::delivery::lost_bodies;

/// Plan a move for every conversation of a team, or the chosen ones (M2).
/// Writes nothing. Refused when the target cannot take the bodies (not
/// reachable, or the team's streams missing or too small for a full body):
/// better said here than after half a thread is copied.
pub async fn plan(
    pool: &PgPool,
    backends: &Backends,
    team_id: Uuid,
    direction: Direction,
    only: &[Uuid],
) -> BusResult<Vec<Plan>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        conversation_id: Uuid,
        title: String,
        current_backend: BackendKind,
        paused: bool,
        messages: i64,
        bytes: i64,
        already_there: i64,
        in_flight: i64,
        failed: i64,
        open_same: i64,
        open_other: i64,
    }
    let rows: Vec<Row> = sqlx::query_as(concat!(
        "SELECT c.id AS conversation_id, c.title, c.backend AS current_backend,
                c.write_paused_at IS NOT NULL AS paused,
                m.messages, m.bytes, m.already_there, m.in_flight, m.failed,
                (SELECT count(*) FROM conversation_migrations g
                  WHERE g.conversation_id = c.id AND g.direction = $4
                    AND g.state IN ('planned', 'copying', 'verified')) AS open_same,
                (SELECT count(*) FROM conversation_migrations g
                  WHERE g.conversation_id = c.id AND g.direction <> $4
                    AND g.state IN ('planned', 'copying', 'verified')) AS open_other
           FROM conversations c
           CROSS JOIN LATERAL (
                SELECT count(*) AS messages, ",
        bytes_of_messages!(),
        " AS bytes,
                       count(*) FILTER (WHERE m.publication_state = 'stored'
                                          AND m.backend = $3) AS already_there,
                       count(*) FILTER (WHERE m.publication_state = 'pending_publication')
                           AS in_flight,
                       count(*) FILTER (WHERE m.publication_state = 'failed') AS failed
                  FROM conversation_messages m
                 WHERE m.team_id = c.team_id AND m.conversation_id = c.id
                   AND m.tombstoned_at IS NULL) m
          WHERE c.team_id = $1 AND (cardinality($2::uuid[]) = 0 OR c.id = ANY($2))
          ORDER BY c.created_at, c.id"
    ))
    .bind(team_id)
    .bind(only)
    .bind(direction.target())
    .bind(direction)
    .fetch_all(pool)
    .await?;
    if let Some(missing) = only
        .iter()
        .find(|id| !rows.iter().any(|r| r.conversation_id == **id))
    {
        return Err(BusError::not_found(format!(
            "no conversation {missing} in this team. `conversations status --team T` lists the \
             team's conversations off the plain synchronous path; omit --conversation to plan \
             every conversation."
        )));
    }
    check_target(backends, team_id, direction).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.conversation_id).collect();
    let mut lost = lost_bodies::known_lost(pool, team_id, &ids).await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let resuming = r.open_same > 0;
            let blocked = if r.open_other > 0 {
                Some(Blocked::Refused(format!(
                    "a move of this conversation the other way is open; let it finish (run it \
                     again) before moving it to {}",
                    direction.target()
                )))
            } else if r.failed > 0 {
                // A failed message has no copy on its backend; a move would
                // either stop on it half-way or cut over leaving it behind.
                Some(Blocked::Refused(format!(
                    "{} message(s) of this conversation failed publication for good and are \
                     stored on no backend (their bodies are still in PostgreSQL); a move would \
                     leave them behind. `conversations status` shows them; tombstone each \
                     deliberately (`conversations tombstone --team T --conversation C --seq N \
                     --reason …`), then run the same command again",
                    r.failed
                )))
            } else if r.current_backend == direction.target()
                && r.already_there == r.messages
                && !resuming
            {
                Some(Blocked::AlreadyThere(direction.target()))
            } else if r.paused && !resuming {
                Some(Blocked::Refused(
                    "writes are paused and no move owns the pause; `conversations unpause` lifts \
                     it (refused while a move is open), then run the same command again"
                        .to_owned(),
                ))
            } else {
                None
            };
            let (here, rest) = std::mem::take(&mut lost)
                .into_iter()
                .partition(|(c, _)| *c == r.conversation_id);
            lost = rest;
            Plan {
                lost: here.into_iter().map(|(_, l)| l).collect(),
                conversation_id: r.conversation_id,
                title: r.title,
                current_backend: r.current_backend,
                messages: r.messages,
                bytes: r.bytes,
                already_there: r.already_there,
                in_flight: r.in_flight,
                failed: r.failed,
                blocked,
                resuming,
            }
        })
        .collect())
}

/// The target answers and can take every body of the team: for jetstream,
/// the broker replies and both of the team's streams exist, the body stream
/// taking a full 1 MiB body plus headers. PostgreSQL is where this runs.
async fn check_target(backends: &Backends, team_id: Uuid, direction: Direction) -> BusResult<()> {
    if direction != Direction::ToJetStream {
        return Ok(());
    }
    // Configured, connected: the same refusal a send would get otherwise.
    backends.for_message(BackendKind::Jetstream, team_id)?;
    let Some(broker) = backends.broker() else {
        return Err(crate::backend::routing::no_broker());
    };
    if !broker.reachable().await {
        return Err(BusError::unavailable(format!(
            "the NATS broker at {} does not answer, so nothing can be copied to it. Nothing \
             was written; run the same command again once it answers.",
            broker.url()
        )));
    }
    let (body, inbox) = broker.team_streams(team_id).await?;
    let missing: Vec<String> = [
        (body.is_none(), body_stream_name(team_id)),
        (inbox.is_none(), inbox_stream_name(team_id)),
    ]
    .into_iter()
    .filter_map(|(missing, name)| missing.then_some(name))
    .collect();
    if !missing.is_empty() {
        return Err(BusError::conflict(format!(
            "the team's stream(s) {} do not exist on the broker at {}, so no body can be \
             stored there. Nothing was written. Provision them with `ai-crew-sync team stream \
             --team TEAM --nats-url URL`, then run the same command again.",
            missing.join(" and "),
            broker.url()
        )));
    }
    if let Some(body) = body
        && body.max_message_size >= 0
        && (body.max_message_size as usize) < REQUIRED_MAX_PAYLOAD
    {
        return Err(BusError::conflict(format!(
            "stream {} takes at most {} bytes per message, and a conversation body can be 1 MiB \
             plus headers ({REQUIRED_MAX_PAYLOAD} bytes). Nothing was written. Raise it with \
             `ai-crew-sync team stream --team TEAM --nats-url URL --update-quotas`, then run the \
             same command again.",
            body.name, body.max_message_size
        )));
    }
    Ok(())
}
