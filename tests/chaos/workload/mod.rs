//! The clients of a chaos run: [`prepare`] the team and its conversations,
//! [`run`] concurrent clients for the load period, then [`settle`] once the
//! faults are healed so the checker reads a quiet system.
//!
//! Each client is one window of one agent (clients of the same agent use
//! distinct window labels) and picks a replica at random for every call.
//! Every call is recorded in the [`History`] with what the checks need.

mod client;
mod mcp;
mod settle;
mod setup;

use std::time::{Duration, Instant};

use anyhow::Context as _;
use uuid::Uuid;

use crate::Profile;
use crate::history::History;
use crate::model::Target;

pub use client::compact;
pub use settle::settle;
pub use setup::prepare;

/// An agent of the team and its token.
#[derive(Clone, Debug)]
pub struct Agent {
    pub name: String,
    pub token: String,
}

/// One client's window: which agent, its label, its address.
#[derive(Clone, Debug)]
pub struct Seat {
    /// Index into [`Fixture::agents`].
    pub agent: usize,
    pub label: String,
    /// `agent/label`, as the server names the window.
    pub address: String,
}

/// Where a conversation's bodies go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// PostgreSQL, stored at commit.
    Sync,
    /// The outbox, drained to the team's JetStream body stream.
    Outbox,
}

#[derive(Clone, Debug)]
pub struct Conversation {
    pub id: Uuid,
    pub mode: Mode,
}

/// Team, agents, credentials and conversations the clients use.
#[derive(Clone, Debug)]
pub struct Fixture {
    pub team_id: Uuid,
    pub agents: Vec<Agent>,
    /// One per client, in client order; every seat is an active member of
    /// every conversation.
    pub seats: Vec<Seat>,
    pub conversations: Vec<Conversation>,
    pub channels: Vec<String>,
    /// The lease clients ask for (the profile's, raised to the server's
    /// minimum of 30 s).
    pub lease_secs: u64,
}

impl Fixture {
    /// The team's JetStream body stream (`ACS_T_<team>`): the stream whose
    /// leader a fault kills.
    pub fn stream_name(&self) -> String {
        ai_crew_sync::backend::jetstream::body_stream_name(self.team_id)
    }
}

/// `profile.clients` concurrent clients until `profile.load` has elapsed
/// (from now), each with its own seeded random choices.
pub async fn run(
    target: Target,
    fixture: Fixture,
    history: History,
    seed: u64,
    profile: Profile,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + profile.load;
    let mut clients = tokio::task::JoinSet::new();
    for index in 0..fixture.seats.len() {
        let client = client::Client::new(&target, &fixture, &history, index, seed, "load")?;
        clients.spawn(client.run_until(deadline));
    }
    let mut operations = 0;
    while let Some(done) = clients.join_next().await {
        operations += done.context("a chaos client panicked")?;
    }
    let secs = profile.load.as_secs_f64().max(1.0);
    eprintln!(
        "chaos: load done, {operations} operations ({:.0}/s)",
        operations as f64 / secs
    );
    Ok(())
}

/// Sleep a little between retries.
async fn pause(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}
