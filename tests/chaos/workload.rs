//! The clients of a chaos run (stub: to be built).

use std::time::Duration;

use crate::Profile;
use crate::history::History;
use crate::model::Target;

/// Team, agents, credentials and conversations the clients use.
#[derive(Clone)]
pub struct Fixture {}

pub async fn prepare(_target: &Target, _profile: &Profile) -> anyhow::Result<Fixture> {
    todo!("create the team, agents, conversations and the R3 stream")
}

pub async fn run(
    _target: Target,
    _fixture: Fixture,
    _history: History,
    _seed: u64,
    _profile: Profile,
) -> anyhow::Result<()> {
    todo!("run the clients until the load period ends")
}

/// The quiet period: no faults; drain every inbox, read every conversation.
pub async fn settle(
    _target: &Target,
    _fixture: &Fixture,
    _history: &History,
    _quiet: Duration,
) -> anyhow::Result<()> {
    todo!()
}
