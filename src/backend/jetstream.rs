//! The JetStream backend (NATS): per-team body stream `ACS_T_<team>` and inbox
//! stream `ACS_I_<team>`, `Nats-Msg-Id` = the publish key, locator
//! `jetstream:<stream>:<sequence>`. See `../shared/spec/conversations.md`,
//! "Backends".
//!
//! Not built yet: every operation answers "unavailable", so a team cannot be
//! routed here (routing refuses a server without a broker first).

use uuid::Uuid;

use super::{Envelope, Locator, MessagingBackend, Published};
use crate::error::{BusError, BusResult};

/// A connection to the NATS server this process publishes to.
#[derive(Clone)]
pub struct Broker {
    _private: (),
}

impl Broker {
    /// Connect to a NATS server with JetStream.
    pub async fn connect(_url: &str, _credentials: Option<&std::path::Path>) -> BusResult<Broker> {
        Err(not_built())
    }

    /// Whether the broker answers now.
    pub async fn reachable(&self) -> bool {
        false
    }
}

/// The JetStream backend for one team.
#[derive(Clone)]
pub struct JetStreamBackend {
    pub broker: Broker,
    pub team_id: Uuid,
}

impl JetStreamBackend {
    pub const NAME: &'static str = "jetstream";

    pub fn new(broker: Broker, team_id: Uuid) -> Self {
        Self { broker, team_id }
    }
}

fn not_built() -> BusError {
    BusError::unavailable("the jetstream backend is not available in this build")
}

impl MessagingBackend for JetStreamBackend {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    async fn publish(&self, _envelope: &Envelope) -> Published {
        Published::Retryable(not_built().to_string())
    }

    async fn fetch(&self, _locator: &Locator, _message_id: Uuid) -> BusResult<Option<String>> {
        Err(not_built())
    }

    async fn retain(&self, _before: chrono::DateTime<chrono::Utc>) -> BusResult<u64> {
        Err(not_built())
    }

    async fn reconcile(&self, _envelope: &Envelope) -> BusResult<Option<Locator>> {
        Err(not_built())
    }
}
