//! The checker over a run's history (stub: to be built).

use crate::Profile;
use crate::faults::Schedule;
use crate::history::History;
use crate::model::{AppliedFault, Target};
use crate::workload::Fixture;

pub struct Report {
    pub violations: Vec<String>,
}

impl Report {
    pub fn print(
        &self,
        _seed: u64,
        _profile: &Profile,
        _schedule: &Schedule,
        _applied: &[AppliedFault],
    ) {
    }
}

pub async fn check(
    _target: &Target,
    _fixture: &Fixture,
    _history: &History,
    _applied: &[AppliedFault],
) -> anyhow::Result<Report> {
    todo!()
}
