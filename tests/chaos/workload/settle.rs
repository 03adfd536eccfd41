//! The quiet period: faults healed, no new load. Every send whose outcome is
//! still unknown is retried with its request_id until answered, the outbox
//! drains, every window's inbox is fetched and confirmed until nothing is
//! owed, and every conversation and channel is read to its end. What is
//! left when the time runs out is said, and left for the checker to judge.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;
use uuid::Uuid;

use super::client::{Client, arguments_of};
use super::{Fixture, pause};
use crate::history::{History, Op, OpKind};
use crate::model::Target;

/// Beyond the profile's quiet period: a reference handed out whose
/// confirmation was lost is handed out again only after 60 s.
const MARGIN: Duration = Duration::from_secs(75);

pub async fn settle(
    target: &Target,
    fixture: &Fixture,
    history: &History,
    quiet: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + quiet + MARGIN;
    let mut clients: Vec<Client> = (0..fixture.seats.len())
        .map(|i| Client::new(target, fixture, history, i, 0, "settle"))
        .collect::<anyhow::Result<_>>()?;
    let mut remains = Vec::new();

    let mut still = 0;
    for (request_id, (client, conversation, body)) in unknown_sends(history) {
        let c = &mut clients[client];
        let mut known = false;
        while !known && Instant::now() < deadline {
            known = c.send(conversation, request_id, &body, 1).await.1;
            if !known {
                pause(500).await;
            }
        }
        still += usize::from(!known);
    }
    if still > 0 {
        remains.push(format!("{still} sends still without an answer"));
    }
    let still = finish_writes(&mut clients, history, deadline).await;
    if still > 0 {
        remains.push(format!(
            "{still} posts, claims, completions, locks or reservations still without an answer"
        ));
    }

    let pool = sqlx::PgPool::connect(&target.database_url)
        .await
        .context("connecting to the bus's database")?;
    let pending = loop {
        let pending: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM conversation_messages
             WHERE team_id = $1 AND publication_state = 'pending_publication'",
        )
        .bind(fixture.team_id)
        .fetch_one(&pool)
        .await?;
        if pending == 0 || Instant::now() >= deadline {
            break pending;
        }
        pause(500).await;
    };
    pool.close().await;
    if pending > 0 {
        remains.push(format!(
            "{pending} outbox messages still pending publication"
        ));
    }

    let drained = futures::future::join_all(
        clients
            .iter_mut()
            .map(|client| drain_inbox(client, deadline)),
    )
    .await;
    let undrained = drained.iter().filter(|done| !**done).count();
    if undrained > 0 {
        remains.push(format!("{undrained} windows' inboxes not drained"));
    }

    let reader = &mut clients[0];
    for conversation in &fixture.conversations {
        let mut after = 0;
        while Instant::now() < deadline {
            match reader.read_page(conversation.id, after, 200).await {
                Some(next) if next > after => after = next,
                Some(_) => break,
                None => pause(200).await,
            }
        }
    }
    for client in clients.iter_mut() {
        for channel in &fixture.channels {
            while Instant::now() < deadline {
                match client.read_channel_named(channel).await {
                    Some(0) => break,
                    Some(_) => {}
                    None => pause(200).await,
                }
            }
        }
    }
    if remains.is_empty() {
        eprintln!("chaos: settled");
    } else {
        eprintln!(
            "chaos: the quiet period ({} s) ended with work left: {}",
            (quiet + MARGIN).as_secs(),
            remains.join("; ")
        );
    }
    Ok(())
}

/// Fetch and confirm until the window owes nothing; false on the deadline.
async fn drain_inbox(client: &mut Client, deadline: Instant) -> bool {
    while Instant::now() < deadline {
        let (_, handed_out, more) = client
            .inbox_round(ai_crew_sync::store::conversations::inbox::FETCH_MAX)
            .await;
        if handed_out || more {
            continue;
        }
        let status = client
            .window
            .call(0, "conversation_inbox_status", json!({}))
            .await;
        if status.ok().and_then(|s| s["owed"].as_i64()) == Some(0) {
            return true;
        }
        pause(1_000).await;
    }
    false
}

/// Sends no attempt of which was answered for good: request_id → (client,
/// conversation, body).
fn unknown_sends(history: &History) -> BTreeMap<Uuid, (usize, Uuid, String)> {
    let ops = history.ops();
    let answered: HashSet<&str> = ops
        .iter()
        .filter(|op| op.kind == OpKind::Send && !op.outcome.retryable())
        .filter_map(|op| op.args["request_id"].as_str())
        .collect();
    let mut unknown = BTreeMap::new();
    for op in ops.iter().filter(|op| op.kind == OpKind::Send) {
        let args = &op.args;
        let (Some(request), Some(conversation), Some(body)) = (
            args["request_id"].as_str(),
            args["conversation_id"].as_str(),
            args["body"].as_str(),
        ) else {
            continue;
        };
        if answered.contains(request) {
            continue;
        }
        if let (Ok(request), Ok(conversation)) = (request.parse(), conversation.parse()) {
            unknown.insert(request, (op.client, conversation, body.to_string()));
        }
    }
    unknown
}

/// Every write other than a send (those are finished above) no attempt of
/// which was answered for good, sent again with its request_id until
/// answered: how many are still unknown at the deadline.
async fn finish_writes(clients: &mut [Client], history: &History, deadline: Instant) -> usize {
    let ops = history.ops();
    let answered: HashSet<&str> = ops
        .iter()
        .filter(|op| op.kind.carries_request_id() && !op.outcome.retryable())
        .filter_map(|op| op.args["request_id"].as_str())
        .collect();
    // request_id → its last attempt, in the order first sent.
    let mut unknown: Vec<&Op> = Vec::new();
    let mut seen = HashSet::new();
    for op in ops.iter().rev() {
        if op.kind == OpKind::Send || !op.kind.carries_request_id() {
            continue;
        }
        let Some(request) = op.args["request_id"].as_str() else {
            continue;
        };
        if !answered.contains(request) && seen.insert(request) {
            unknown.push(op);
        }
    }
    unknown.reverse();
    let mut still = 0;
    for last in unknown {
        let client = &mut clients[last.client];
        let arguments = arguments_of(last);
        let mut attempt = last.args["attempt"].as_u64().unwrap_or(0) + 1;
        let mut known = false;
        while !known && Instant::now() < deadline {
            let mut noted = json!({"attempt": attempt});
            for key in ["sha256", "late"] {
                if !last.args[key].is_null() {
                    noted[key] = last.args[key].clone();
                }
            }
            let op = client.call(last.kind, arguments.clone(), noted).await;
            known = !op.outcome.retryable();
            attempt += 1;
            if !known {
                pause(500).await;
            }
        }
        still += usize::from(!known);
    }
    still
}
