//! The fault schedule drawn from a seed, and its injection (stub: to be built).

use crate::Profile;
use crate::cluster::Cluster;
use crate::model::{AppliedFault, Clock};

pub struct Schedule {}

impl Schedule {
    pub fn draw(_seed: u64, _profile: &Profile) -> Schedule {
        Schedule {}
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(no faults yet)")
    }
}

/// Runs the schedule over the load period; every fault healed at the end.
pub async fn inject(
    _cluster: &mut Cluster,
    _schedule: &Schedule,
    _clock: Clock,
) -> Vec<AppliedFault> {
    Vec::new()
}
