//! `team prune`: trimming a team's history, and `conversations retention`,
//! how long one conversation keeps its messages.
//!
//! A dry run (the default) counts, per kind, what `--apply` would remove,
//! with the same predicate the apply uses (`kinds.rs`: one definition per
//! kind), so the numbers agree unless the team writes or reads in between.
//! `--apply` removes it in batches of [`BATCH`] rows, each its own short
//! transaction that skips rows another transaction holds instead of waiting:
//! no long lock on any table, and a post, send or read runs between batches.
//! Before the first batch a `team.prune_started` audit row is written under
//! the admin write fence, and every batch of every kind takes that fence
//! first ([`fence_batch`]), so revoking the credential stops the prune at its
//! next batch.
//!
//! What goes: channel and direct messages older than `--older-than-days`
//! (with their attachments), note revisions that are not their note's
//! current one, events of finished tasks, settled webhook deliveries
//! (delivered or failed: their payloads carry what the event said), audit
//! rows past the operator's `--audit-older-than-days` (kept when it is not
//! given; at least [`AUDIT_DAYS_MIN`], for a global authority only), and conversation
//! messages past their conversation's `retention_days` (released: tombstoned
//! and their body dropped, on JetStream through the backend's retention path;
//! the row and seq stay so a reader sees an explained gap).
//!
//! What never goes: a message a live reader has not read (kinds.rs says what
//! a reader and "read" are), a note or its current value, a task or an open
//! task's events, a conversation message with an unacknowledged receipt, an
//! inbox reference still owed, or an outbox slot not settled.
//!
//! Positions stay true: a message's position is never reused or renumbered;
//! cursors, unread counts and pages are ranges of positions, so removing
//! rows below a cursor changes none of them. A channel's `message_count`
//! (how many messages it holds) drops by what went.

mod kinds;
mod release;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::backend::Backends;
use crate::error::{BusError, BusResult};
use crate::store::identity::admin::TeamScope;
use crate::store::{Actor, identity::audit, identity::teams, operations::usage};

pub use release::{BrokerDrop, Retention, set_retention};

/// Rows removed per transaction.
pub const BATCH: i64 = 1000;
/// The longest retention a day count may name (100 years).
pub const DAYS_MAX: i64 = 36500;
/// The youngest audit rows a prune may remove. The audit trail is how a
/// change is traced back to who made it; a prune that could take the last
/// weeks of it (`0`: everything) would let whoever holds a credential erase
/// the record of what it just did. A month is longer than any of this
/// product's other windows (rollback 7 days, inbox retention 7 days).
pub const AUDIT_DAYS_MIN: i64 = 30;

/// What `team prune` is asked.
#[derive(Clone, Debug)]
pub struct PruneRequest {
    /// Messages, revisions and task events older than this many days.
    pub older_than_days: i64,
    /// Audit rows older than this many days (at least [`AUDIT_DAYS_MIN`],
    /// for a global authority only); `None` keeps them all.
    pub audit_older_than_days: Option<i64>,
    /// Remove (otherwise only count).
    pub apply: bool,
}

/// One kind: how many rows and bytes (would) go.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KindPruned {
    pub kind: &'static str,
    pub rows: i64,
    pub bytes: i64,
}

/// `team prune`'s answer.
#[derive(Clone, Debug, Serialize)]
pub struct Prune {
    pub team: String,
    pub applied: bool,
    pub older_than_days: i64,
    pub cutoff: DateTime<Utc>,
    pub audit_older_than_days: Option<i64>,
    pub kinds: Vec<KindPruned>,
    pub total_rows: i64,
    pub total_bytes: i64,
    /// With `--apply`: the team's usage counted afterwards.
    pub used_bytes_after: Option<i64>,
    /// With `--apply`: released JetStream bodies dropped from the broker,
    /// and those still waiting for it.
    pub broker: Option<BrokerDrop>,
}

impl Prune {
    pub fn kind(&self, kind: &str) -> Option<&KindPruned> {
        self.kinds.iter().find(|k| k.kind == kind)
    }
}

/// Where an `--apply` is: which kind, how many of its rows are done.
#[derive(Clone, Debug)]
pub struct Progress {
    pub kind: &'static str,
    pub done: i64,
    pub total: i64,
}

fn check_audit_days(days: i64) -> BusResult<()> {
    check_days("--audit-older-than-days", days)?;
    if days < AUDIT_DAYS_MIN {
        return Err(BusError::invalid(format!(
            "--audit-older-than-days {days} is below the minimum of {AUDIT_DAYS_MIN} days: the \
             audit trail of the last {AUDIT_DAYS_MIN} days is never pruned. Give \
             {AUDIT_DAYS_MIN} or more, or leave it out to keep every audit row. Nothing was \
             removed."
        )));
    }
    Ok(())
}

fn check_days(flag: &str, days: i64) -> BusResult<()> {
    if !(0..=DAYS_MAX).contains(&days) {
        return Err(BusError::invalid(format!(
            "{flag} {days} is out of range: give a number of days from 0 to {DAYS_MAX} (0 means \
             everything older than now). Nothing was removed."
        )));
    }
    Ok(())
}

/// `team prune`: count (dry run) or remove what the team's history no longer
/// needs; with `apply`, audited with the counts and the usage recounted.
/// `progress` hears each batch.
pub async fn prune(
    pool: &PgPool,
    backends: &Backends,
    team: &TeamScope,
    request: &PruneRequest,
    progress: &(dyn Fn(&Progress) + Sync),
) -> BusResult<Prune> {
    check_days("--older-than-days", request.older_than_days)?;
    if let Some(days) = request.audit_older_than_days {
        check_audit_days(days)?;
        // The team's audit trail records what its own admins did: a
        // credential confined to the team may not erase it.
        team.global("prune a team's audit trail (--audit-older-than-days)")?;
    }
    let actor = team.actor().clone();
    let team = teams::find(pool, team.slug()).await?;
    // Every cut-off from the database's clock, read once: the dry run and
    // the batches compare against the same instants.
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let cutoff = now - chrono::Duration::days(request.older_than_days);
    let audit_cutoff = request
        .audit_older_than_days
        .map(|days| now - chrono::Duration::days(days));

    if request.apply {
        record_started(pool, &team, &actor, request).await?;
    }
    let mut kinds = Vec::new();
    let mut attachments_removed = (0, 0);
    for kind in Kind::ALL {
        let at = match kind {
            Kind::Audit | Kind::ConversationAudit => match audit_cutoff {
                Some(at) => at,
                None => {
                    kinds.push(KindPruned {
                        kind: kind.name(),
                        rows: 0,
                        bytes: 0,
                    });
                    continue;
                }
            },
            Kind::ConversationMessages => now,
            _ => cutoff,
        };
        let counted = prune_kind(
            pool,
            team.id,
            kind,
            at,
            &actor,
            request.apply,
            progress,
            &mut attachments_removed,
        )
        .await?;
        kinds.push(KindPruned {
            kind: kind.name(),
            rows: counted.0,
            bytes: counted.1,
        });
    }
    if request.apply
        && let Some(k) = kinds
            .iter_mut()
            .find(|k| k.kind == Kind::Attachments.name())
    {
        (k.rows, k.bytes) = attachments_removed;
    }
    let total_rows = kinds.iter().map(|k| k.rows).sum();
    let total_bytes = kinds.iter().map(|k| k.bytes).sum();
    let mut result = Prune {
        team: team.slug.clone(),
        applied: request.apply,
        older_than_days: request.older_than_days,
        cutoff,
        audit_older_than_days: request.audit_older_than_days,
        kinds,
        total_rows,
        total_bytes,
        used_bytes_after: None,
        broker: None,
    };
    if request.apply {
        result.broker = Some(release::drop_broker_bodies(pool, backends, team.id).await?);
        record_finished(pool, &team, &actor, request, &result).await?;
        let after = usage::count(pool, team.id, &team.slug).await?;
        result.used_bytes_after = Some(after.used_bytes);
    }
    Ok(result)
}

/// The `team.prune_started` row, before the first batch, under the admin
/// write fence: a revoked credential removes nothing, and a prune that stops
/// half-way (a revocation between batches, a crash) is still on record.
async fn record_started(
    pool: &PgPool,
    team: &teams::Team,
    actor: &Actor,
    request: &PruneRequest,
) -> BusResult<()> {
    let mut tx = pool.begin().await?;
    audit::record(
        &mut tx,
        Some(team.id),
        actor,
        "team.prune_started",
        &team.slug,
        json!({
            "older_than_days": request.older_than_days,
            "audit_older_than_days": request.audit_older_than_days,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// One kind's rows older than `at`: counted, and with `apply` removed in
/// batches (`progress` hears each). Attachments are removed with their
/// messages and added to `attachments_removed`.
#[allow(clippy::too_many_arguments)]
async fn prune_kind(
    pool: &PgPool,
    team_id: Uuid,
    kind: Kind,
    at: DateTime<Utc>,
    actor: &Actor,
    apply: bool,
    progress: &(dyn Fn(&Progress) + Sync),
    attachments_removed: &mut (i64, i64),
) -> BusResult<(i64, i64)> {
    let (rows, bytes): (i64, i64) = sqlx::query_as(kind.count_sql())
        .bind(team_id)
        .bind(at)
        .fetch_one(pool)
        .await?;
    Ok(if apply && rows > 0 {
        let report = |done| {
            progress(&Progress {
                kind: kind.name(),
                done,
                total: rows,
            })
        };
        match kind {
            Kind::ChannelMessages | Kind::DirectMessages => {
                let channel = kind == Kind::ChannelMessages;
                let gone =
                    release::delete_messages(pool, team_id, at, channel, actor, &report).await?;
                attachments_removed.0 += gone.attachments;
                attachments_removed.1 += gone.attachment_bytes;
                (gone.rows, gone.bytes)
            }
            Kind::ConversationMessages => {
                release::release_conversation_messages(pool, team_id, at, actor, &report).await?
            }
            // Removed with their messages (above), counted as they go.
            Kind::Attachments => (0, 0),
            _ => kind.apply(pool, team_id, at, actor, &report).await?,
        }
    } else {
        (rows, bytes)
    })
}

/// The closing `team.prune` row with the counts. Revoked after the last
/// batch: everything asked was removed, only this closing row is refused,
/// and the refusal says so.
async fn record_finished(
    pool: &PgPool,
    team: &teams::Team,
    actor: &Actor,
    request: &PruneRequest,
    result: &Prune,
) -> BusResult<()> {
    let mut tx = pool.begin().await?;
    audit::fence(
        &mut tx,
        actor,
        &format!(
            "the prune removed all it was asked to ({} rows) but its closing \
             team.prune audit row was not written (the team.prune_started row records who \
             began it)",
            result.total_rows
        ),
    )
    .await?;
    audit::record(
        &mut tx,
        Some(team.id),
        actor,
        "team.prune",
        &team.slug,
        json!({
            "older_than_days": request.older_than_days,
            "audit_older_than_days": request.audit_older_than_days,
            "kinds": result.kinds,
            "total_rows": result.total_rows,
            "total_bytes": result.total_bytes,
        }),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The kinds, in the order they are shown and removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    ChannelMessages,
    DirectMessages,
    Attachments,
    NoteRevisions,
    TaskEvents,
    WebhookDeliveries,
    ConversationMessages,
    Audit,
    ConversationAudit,
}

impl Kind {
    /// Attachments before the messages they hang on would be counted after
    /// them: their count comes first, from the same predicate.
    const ALL: [Kind; 9] = [
        Kind::Attachments,
        Kind::ChannelMessages,
        Kind::DirectMessages,
        Kind::NoteRevisions,
        Kind::TaskEvents,
        Kind::WebhookDeliveries,
        Kind::ConversationMessages,
        Kind::Audit,
        Kind::ConversationAudit,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::ChannelMessages => "channel_messages",
            Kind::DirectMessages => "direct_messages",
            Kind::Attachments => "message_attachments",
            Kind::NoteRevisions => "note_revisions",
            Kind::TaskEvents => "task_events",
            Kind::WebhookDeliveries => "webhook_deliveries",
            Kind::ConversationMessages => "conversation_messages_released",
            Kind::Audit => "audit",
            Kind::ConversationAudit => "conversation_audit",
        }
    }

    fn count_sql(self) -> &'static str {
        match self {
            Kind::ChannelMessages => kinds::CHANNEL_MESSAGES_COUNT,
            Kind::DirectMessages => kinds::DIRECT_MESSAGES_COUNT,
            Kind::Attachments => kinds::ATTACHMENTS_COUNT,
            Kind::NoteRevisions => kinds::NOTE_REVISIONS_COUNT,
            Kind::TaskEvents => kinds::TASK_EVENTS_COUNT,
            Kind::WebhookDeliveries => kinds::WEBHOOK_DELIVERIES_COUNT,
            Kind::ConversationMessages => kinds::CONVERSATION_MESSAGES_COUNT,
            Kind::Audit => kinds::AUDIT_COUNT,
            Kind::ConversationAudit => kinds::CONVERSATION_AUDIT_COUNT,
        }
    }

    /// Remove this kind batch by batch: (rows, bytes) removed. Each batch
    /// takes `actor`'s admin write fence first (as the audit row of a
    /// one-transaction change does), so revoking the credential stops the
    /// prune at the next batch.
    async fn apply(
        self,
        pool: &PgPool,
        team_id: Uuid,
        at: DateTime<Utc>,
        actor: &Actor,
        report: &(dyn Fn(i64) + Sync),
    ) -> BusResult<(i64, i64)> {
        let statement = match self {
            Kind::NoteRevisions => kinds::NOTE_REVISIONS_BATCH,
            Kind::TaskEvents => kinds::TASK_EVENTS_BATCH,
            Kind::WebhookDeliveries => kinds::WEBHOOK_DELIVERIES_BATCH,
            Kind::Audit => kinds::AUDIT_BATCH,
            Kind::ConversationAudit => kinds::CONVERSATION_AUDIT_BATCH,
            // Each has its own batches (`release.rs`).
            Kind::ChannelMessages
            | Kind::DirectMessages
            | Kind::Attachments
            | Kind::ConversationMessages => return Ok((0, 0)),
        };
        let (mut rows, mut bytes) = (0, 0);
        loop {
            let mut tx = pool.begin().await?;
            fence_batch(&mut tx, actor, self.name(), rows).await?;
            let (n, b): (i64, i64) = sqlx::query_as(statement)
                .bind(team_id)
                .bind(at)
                .bind(BATCH)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            rows += n;
            bytes += b;
            report(rows);
            if n == 0 {
                return Ok((rows, bytes));
            }
        }
    }
}

/// The first statement of every prune batch's transaction: `actor`'s admin
/// write fence, so a credential revoked mid-prune stops it at the next batch
/// of whatever kind it is removing (messages, conversation messages, audit).
pub(super) async fn fence_batch(
    tx: &mut sqlx::PgConnection,
    actor: &Actor,
    kind: &str,
    rows: i64,
) -> BusResult<()> {
    audit::fence(
        tx,
        actor,
        &format!(
            "the prune stopped at {kind} after {rows} rows; what it removed before stays \
             removed (the team.prune_started audit row records who began it)"
        ),
    )
    .await
}
