//! The servers a chaos run owns (stub: to be built).

use crate::Profile;
use crate::model::Target;

pub struct Cluster {}

impl Cluster {
    pub async fn start(_profile: &Profile) -> anyhow::Result<Cluster> {
        todo!("start PostgreSQL, a 3-node NATS cluster and 3 replicas")
    }

    pub fn target(&self) -> Target {
        todo!()
    }

    pub async fn stop(self) {}
}
