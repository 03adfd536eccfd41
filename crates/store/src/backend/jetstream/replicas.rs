//! Replicas of a team's streams (`team stream --replicas N`): which counts
//! the bus asks for, what it refuses before writing anything, how a broker's
//! refusal to place them reads, and undoing the inbox stream's change when
//! the body stream is then refused (so a refused `team stream` changes
//! nothing).
//!
//! The copies themselves are the cluster's: a publish is acknowledged by the
//! stream leader once a majority of the replicas stored it, and a leader
//! change is an election among them. Nothing here runs on the publish path.

use async_nats::jetstream::context::{CreateStreamError, CreateStreamErrorKind};
use async_nats::jetstream::stream::{Config, Info};

use super::Broker;
use super::provision::{StreamReport, broker_error};
use crate::error::{BusError, BusResult};

/// The replica counts the bus asks for: odd, so a majority is left when a
/// server is lost, and within JetStream's maximum of 5.
pub const ALLOWED: [usize; 3] = [1, 3, 5];

/// JetStream's answers meaning "these replicas cannot be placed": no
/// suitable peers (10005), not enough resources on the peers (10023), and
/// replicas asked of a server that is not clustered (10074).
const PLACEMENT_CODES: [u64; 3] = [10005, 10023, 10074];

impl Broker {
    /// Refuse, before anything is written: more than one replica on a
    /// server that is not part of a cluster (NATS 2.9 takes such an update
    /// and keeps one copy), and with `update_quotas`, fewer replicas than a
    /// stream has now.
    pub(super) fn check_replicas<'a>(
        &self,
        asked: Option<usize>,
        update_quotas: bool,
        existing: impl Iterator<Item = &'a Info>,
    ) -> BusResult<()> {
        let Some(asked) = asked else {
            return Ok(());
        };
        if asked > 1 && self.client().server_info().cluster.is_none() {
            return Err(BusError::invalid(format!(
                "--replicas {asked}: the NATS server at {} is not part of a cluster (its config \
                 has no `cluster` block), and a single server keeps one copy of a stream. \
                 Nothing was changed. Run a JetStream cluster of at least {asked} servers and \
                 name them in --nats-url, or leave --replicas out (1).",
                self.url()
            )));
        }
        if !update_quotas {
            return Ok(());
        }
        for info in existing {
            let kept = info.config.num_replicas;
            if asked < kept {
                let name = &info.config.name;
                return Err(BusError::conflict(format!(
                    "stream {name} has {kept} replicas and --replicas {asked} would lower that. \
                     The NATS server allows it, but the bus refuses it as unsafe: bodies \
                     acknowledged so far were stored on a majority of {kept} servers, and with \
                     {asked} the loss of a server and its disk can lose bodies PostgreSQL still \
                     points at (they would then read as lost). Nothing was changed. Leave \
                     --replicas out to keep {kept}; to lower it anyway, do it yourself: `nats \
                     stream edit {name} --replicas {asked}`."
                )));
            }
        }
        Ok(())
    }

    /// A refused create or update of a stream, as the operator reads it:
    /// replicas the cluster cannot place say so, anything else is the
    /// broker's answer.
    pub(super) fn refused(&self, what: &str, replicas: usize, err: &CreateStreamError) -> BusError {
        let code = match err.kind() {
            CreateStreamErrorKind::JetStream(js) => Some(js.error_code().0),
            _ => None,
        };
        if !code.is_some_and(|c| PLACEMENT_CODES.contains(&c)) {
            return broker_error(what, err);
        }
        BusError::invalid(format!(
            "the NATS cluster at {} could not place {replicas} replica(s) while {what} ({err}): \
             a stream with N replicas needs N JetStream servers in the cluster, each with room \
             for its limits. Nothing was changed. Add servers to the cluster, or ask for fewer \
             replicas (--replicas {}).",
            self.url(),
            if replicas > 3 { "3 or 1" } else { "1" }
        ))
    }

    /// The body stream was refused after the inbox stream was created or
    /// updated: put the inbox stream back as it was (deleted if created:
    /// whatever it took meanwhile PostgreSQL still owes), and return the
    /// refusal, or both when the undoing failed too.
    pub(super) async fn undo(
        &self,
        inbox: &StreamReport,
        before: Option<Config>,
        refused: BusError,
    ) -> BusError {
        let undone = match (inbox.state, before) {
            ("created", _) => self
                .js()
                .delete_stream(&inbox.name)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            ("updated", Some(config)) => self
                .js()
                .update_stream(config)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            _ => Ok(()),
        };
        match undone {
            Ok(()) => refused,
            Err(e) => BusError::unavailable(format!(
                "{refused} And putting stream {} back as it was failed ({e}): run the same \
                 `team stream` again, or check it with `nats stream info {}`.",
                inbox.name, inbox.name
            )),
        }
    }
}
