//! What `doctor` checks of a team's two streams: that both exist and keep
//! the layout the bus relies on. `provision.rs` creates them that way (its
//! `body_config` and `inbox_config` are the reference here); an adopted
//! stream, or one edited by hand since, may not.
//!
//! What it deliberately does not judge: quotas (bytes, messages), replicas
//! and placement are the operator's to choose (`team stream` reports them),
//! and whether a stream is full is a condition (`conditions.rs`).

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};
use serde::Serialize;
use uuid::Uuid;

use super::provision::{body_config, inbox_config};
use super::{Broker, REQUIRED_MAX_PAYLOAD, StreamSizes};
use crate::error::BusResult;

/// One setting of a stream that differs from what the bus expects.
#[derive(Clone, Debug, Serialize)]
pub struct LimitFinding {
    /// The stream setting, as NATS names it (`max_msg_size`, `storage`, …).
    pub limit: &'static str,
    pub found: String,
    pub expected: String,
    /// What goes wrong because of it.
    pub consequence: &'static str,
    /// Bodies or their delivery are at stake (`doctor` fails), rather than
    /// something the bus works around (`doctor` warns).
    pub serious: bool,
    /// How to fix it.
    pub fix: String,
}

/// One of the team's streams as the broker has it.
#[derive(Clone, Debug, Serialize)]
pub struct StreamInspection {
    pub name: String,
    pub present: bool,
    pub findings: Vec<LimitFinding>,
}

/// Which kind of stream, for what may differ without harm.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Body,
    Inbox,
}

impl Broker {
    /// Both of `team_id`'s streams (body first) against the bus's layout.
    /// `team` (the slug) goes into the fixing commands. An unreachable broker
    /// is an error: unknown is not missing.
    pub async fn inspect_team_streams(
        &self,
        team_id: Uuid,
        team: &str,
    ) -> BusResult<Vec<StreamInspection>> {
        let sizes = StreamSizes::default();
        let mut out = Vec::new();
        for (kind, wanted) in [
            (Kind::Body, body_config(team_id, &sizes)),
            (Kind::Inbox, inbox_config(team_id, &sizes)),
        ] {
            let found = self.stream_info(&wanted.name).await?;
            out.push(StreamInspection {
                name: wanted.name.clone(),
                present: found.is_some(),
                findings: match found {
                    Some(info) => compare(kind, &info.config, &wanted, team, self.url()),
                    None => Vec::new(),
                },
            });
        }
        Ok(out)
    }
}

/// Every setting of `found` the bus relies on that differs from `wanted`.
fn compare(
    kind: Kind,
    found: &Config,
    wanted: &Config,
    team: &str,
    url: &str,
) -> Vec<LimitFinding> {
    let name = &wanted.name;
    let body = kind == Kind::Body;
    let update_quotas =
        format!("ai-crew-sync team stream --team {team} --nats-url {url} --update-quotas");
    let edit = |what: &str| format!("set {what} with `nats stream edit {name}`");
    let recreate = format!(
        "it cannot change on an existing stream: move the team's conversations to postgres \
         (`ai-crew-sync conversations migrate --team {team} --to postgres --nats-url {url} \
         --apply`), then `ai-crew-sync team stream --team {team} --nats-url {url} --remove` \
         and `ai-crew-sync team stream --team {team} --nats-url {url}`"
    );
    let by_kind = |for_body: &'static str, for_inbox: &'static str| {
        if body { for_body } else { for_inbox }
    };
    // NATS reads 0 and -1 as "no limit".
    let needed = if body {
        REQUIRED_MAX_PAYLOAD as i32
    } else {
        wanted.max_message_size
    };
    // One row per setting: whether it differs, and what to say when it does.
    let table = [
        (
            found.subjects != wanted.subjects,
            LimitFinding {
                limit: "subjects",
                found: found.subjects.join(", "),
                expected: wanted.subjects.join(", "),
                consequence: by_kind(
                    "bodies the bus publishes to the team's subjects are not stored here",
                    "inbox references the bus publishes are not stored here",
                ),
                serious: true,
                fix: edit(&format!("the subjects to {}", wanted.subjects.join(", "))),
            },
        ),
        (
            found.max_message_size > 0 && found.max_message_size < needed,
            LimitFinding {
                limit: "max_msg_size",
                found: found.max_message_size.to_string(),
                expected: format!("at least {needed} bytes, or no limit"),
                consequence: by_kind(
                    "a full 1 MiB body plus its headers is refused, and its message fails",
                    "a larger reference is refused (PostgreSQL still delivers it, later)",
                ),
                serious: body,
                fix: format!("`{update_quotas}` (sets {})", wanted.max_message_size),
            },
        ),
        (
            found.discard != wanted.discard,
            LimitFinding {
                limit: "discard",
                found: discard_name(found.discard).into(),
                expected: discard_name(wanted.discard).into(),
                consequence: by_kind(
                    "a full stream drops its oldest bodies instead of refusing new ones",
                    "a full inbox refuses new references instead of dropping old ones",
                ),
                serious: body,
                fix: edit(&format!("discard to {}", discard_name(wanted.discard))),
            },
        ),
        (
            body && !found.max_age.is_zero(),
            LimitFinding {
                limit: "max_age",
                found: format!("{} s", found.max_age.as_secs()),
                expected: "none (bodies are kept whatever their age)".into(),
                consequence: "the broker drops bodies older than that",
                serious: true,
                fix: edit("max_age to none (0)"),
            },
        ),
        (
            found.duplicate_window < wanted.duplicate_window,
            LimitFinding {
                limit: "duplicate_window",
                found: format!("{} s", found.duplicate_window.as_secs()),
                expected: format!("at least {} s", wanted.duplicate_window.as_secs()),
                consequence: "a publish presented again after an unanswered one can be stored \
                              twice",
                serious: false,
                fix: edit(&format!(
                    "duplicate_window to {} s",
                    wanted.duplicate_window.as_secs()
                )),
            },
        ),
    ];
    let [subjects, max_msg_size, discard, max_age, duplicate_window] = table;
    let [storage, retention, sealed] = fixed_at_creation(found, wanted, body, &recreate);
    // `doctor` lists them in this order: where bodies go and what fits, how
    // the stream keeps them, and last whether it takes anything at all.
    [
        subjects,
        max_msg_size,
        storage,
        retention,
        discard,
        max_age,
        duplicate_window,
        sealed,
    ]
    .into_iter()
    .filter_map(|(differs, finding)| differs.then_some(finding))
    .collect()
}

/// The settings a stream keeps from its creation: the fix is to recreate
/// it (`recreate` says how).
fn fixed_at_creation(
    found: &Config,
    wanted: &Config,
    body: bool,
    recreate: &str,
) -> [(bool, LimitFinding); 3] {
    let by_kind = |for_body, for_inbox| if body { for_body } else { for_inbox };
    [
        (
            found.storage != wanted.storage,
            LimitFinding {
                limit: "storage",
                found: storage_name(found.storage).into(),
                expected: storage_name(wanted.storage).into(),
                consequence: by_kind(
                    "every body is lost when the broker restarts",
                    "references are lost when the broker restarts (PostgreSQL rebuilds them)",
                ),
                serious: body,
                fix: recreate.to_string(),
            },
        ),
        (
            found.retention != wanted.retention,
            LimitFinding {
                limit: "retention",
                found: retention_name(found.retention).into(),
                expected: retention_name(wanted.retention).into(),
                consequence: by_kind(
                    "the broker deletes bodies that PostgreSQL still points at",
                    "acknowledged references are not removed, or unread ones are",
                ),
                serious: body,
                fix: recreate.to_string(),
            },
        ),
        (
            found.sealed,
            LimitFinding {
                limit: "sealed",
                found: "true".into(),
                expected: "false".into(),
                consequence: "a sealed stream takes nothing new",
                serious: true,
                fix: recreate.to_string(),
            },
        ),
    ]
}

fn storage_name(storage: StorageType) -> &'static str {
    match storage {
        StorageType::File => "file",
        StorageType::Memory => "memory",
    }
}

fn retention_name(retention: RetentionPolicy) -> &'static str {
    match retention {
        RetentionPolicy::Limits => "limits",
        RetentionPolicy::Interest => "interest",
        RetentionPolicy::WorkQueue => "workqueue",
    }
}

fn discard_name(discard: DiscardPolicy) -> &'static str {
    match discard {
        DiscardPolicy::New => "new",
        DiscardPolicy::Old => "old",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn findings(kind: Kind, edit: impl Fn(&mut Config)) -> Vec<(&'static str, bool)> {
        let team = Uuid::new_v4();
        let sizes = StreamSizes::default();
        let wanted = match kind {
            Kind::Body => body_config(team, &sizes),
            Kind::Inbox => inbox_config(team, &sizes),
        };
        let mut found = wanted.clone();
        edit(&mut found);
        compare(kind, &found, &wanted, "acme", "nats://h:4222")
            .into_iter()
            .map(|f| (f.limit, f.serious))
            .collect()
    }

    #[test]
    fn the_layout_provision_creates_has_no_findings_and_quotas_are_not_judged() {
        assert!(findings(Kind::Body, |_| {}).is_empty());
        assert!(findings(Kind::Inbox, |_| {}).is_empty());
        let quotas = |c: &mut Config| {
            c.max_bytes = 1 << 40;
            c.max_messages = 7;
            c.num_replicas = 3;
            c.allow_direct = false;
            c.max_message_size = -1;
        };
        assert!(findings(Kind::Body, quotas).is_empty());
        assert!(findings(Kind::Inbox, quotas).is_empty());
    }

    #[test]
    fn what_loses_bodies_is_serious_on_the_body_stream_and_not_on_the_inbox() {
        let breakage = |c: &mut Config| {
            c.max_message_size = 1000;
            c.storage = StorageType::Memory;
            c.retention = RetentionPolicy::Interest;
            c.discard = if c.discard == DiscardPolicy::New {
                DiscardPolicy::Old
            } else {
                DiscardPolicy::New
            };
            c.duplicate_window = Duration::from_secs(60);
        };
        assert_eq!(
            findings(Kind::Body, breakage),
            [
                ("max_msg_size", true),
                ("storage", true),
                ("retention", true),
                ("discard", true),
                ("duplicate_window", false)
            ]
        );
        assert_eq!(
            findings(Kind::Inbox, breakage),
            [
                ("max_msg_size", false),
                ("storage", false),
                ("retention", false),
                ("discard", false),
                ("duplicate_window", false)
            ]
        );
    }

    #[test]
    fn wrong_subjects_an_age_limit_on_bodies_and_a_seal_are_serious() {
        let body = findings(Kind::Body, |c| {
            c.subjects = vec!["elsewhere.>".into()];
            c.max_age = Duration::from_secs(3600);
            c.sealed = true;
        });
        assert_eq!(
            body,
            [("subjects", true), ("max_age", true), ("sealed", true)]
        );
        // The inbox's max age is its design (7 days).
        assert!(findings(Kind::Inbox, |c| c.max_age = Duration::from_secs(3600)).is_empty());
    }
}
