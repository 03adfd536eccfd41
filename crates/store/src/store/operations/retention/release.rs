//! The batches that need more than one statement: channel and direct
//! messages (with their attachments, replies and channel counts) and
//! conversation messages (released under their conversation's lock); and
//! setting a conversation's retention.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::{BATCH, DAYS_MAX, fence_batch, kinds};
use crate::backend::{BackendKind, Backends, Locator, MessagingBackend};
use crate::error::{BusError, BusResult};
use crate::store::identity::admin::TeamScope;
use crate::store::{Actor, identity::audit, identity::teams};

/// What one kind of message batches removed.
pub(super) struct MessagesGone {
    pub rows: i64,
    pub bytes: i64,
    pub attachments: i64,
    pub attachment_bytes: i64,
}

/// Delete channel (`channel`) or direct messages the predicate allows, a
/// batch per transaction. A post no longer writes its channel's row (its
/// count goes to a stripe, migration 0031), so the batch's channel rows are
/// locked `FOR NO KEY UPDATE`, which a post's reference to its channel does
/// not wait for (nor it for the post, which may hold that reference while
/// its attachments wait for the quota row): the batch is chosen without
/// locks, the team's quota row and the batch's channel rows are locked, the
/// batch's messages are deleted if the predicate still allows them (a cursor
/// made meanwhile keeps its messages), replies to them forget what they
/// answered (`reply_to` cleared: the original is gone), their attachments
/// go and leave the attachment quota, and each channel's `message_count`
/// drops by what it lost. Positions are untouched.
pub(super) async fn delete_messages(
    pool: &PgPool,
    team_id: Uuid,
    cutoff: DateTime<Utc>,
    channel: bool,
    actor: &Actor,
    report: &(dyn Fn(i64) + Sync),
) -> BusResult<MessagesGone> {
    let kind = if channel {
        "channel_messages"
    } else {
        "direct_messages"
    };
    let (batch_sql, delete_sql) = if channel {
        (
            kinds::CHANNEL_MESSAGES_BATCH,
            kinds::CHANNEL_MESSAGES_DELETE,
        )
    } else {
        (kinds::DIRECT_MESSAGES_BATCH, kinds::DIRECT_MESSAGES_DELETE)
    };
    let mut gone = MessagesGone {
        rows: 0,
        bytes: 0,
        attachments: 0,
        attachment_bytes: 0,
    };
    loop {
        let mut tx = pool.begin().await?;
        fence_batch(&mut tx, actor, kind, gone.rows).await?;
        let batch: Vec<(Uuid, Option<Uuid>)> = sqlx::query_as(batch_sql)
            .bind(team_id)
            .bind(cutoff)
            .bind(BATCH)
            .fetch_all(&mut *tx)
            .await?;
        if batch.is_empty() {
            tx.rollback().await?;
            return Ok(gone);
        }
        let ids: Vec<Uuid> = batch.iter().map(|(id, _)| *id).collect();
        let channels: Vec<Uuid> = batch.iter().filter_map(|(_, c)| *c).collect();
        sqlx::query("SELECT 1 FROM team_quotas WHERE team_id = $1 FOR UPDATE")
            .bind(team_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "SELECT 1 FROM channels WHERE team_id = $1 AND id = ANY($2) ORDER BY id
             FOR NO KEY UPDATE",
        )
        .bind(team_id)
        .bind(&channels)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE messages SET reply_to = NULL
              WHERE team_id = $1 AND reply_to = ANY($2) AND NOT (id = ANY($2))",
        )
        .bind(team_id)
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        // The attachments go after their messages, in this transaction.
        sqlx::query("SET CONSTRAINTS attachments_team_id_message_id_fkey DEFERRED")
            .execute(&mut *tx)
            .await?;
        let deleted: Vec<Deleted> = sqlx::query_as(delete_sql)
            .bind(team_id)
            .bind(cutoff)
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?;
        let deleted_ids: Vec<Uuid> = deleted.iter().map(|d| d.0).collect();
        record_marks(&mut tx, team_id, &deleted).await?;
        let (attachments, attachment_bytes): (i64, i64) = sqlx::query_as(
            "WITH d AS (DELETE FROM attachments WHERE team_id = $1 AND message_id = ANY($2)
                        RETURNING size_bytes)
             SELECT count(*), coalesce(sum(size_bytes), 0)::bigint FROM d",
        )
        .bind(team_id)
        .bind(&deleted_ids)
        .fetch_one(&mut *tx)
        .await?;
        if attachment_bytes > 0 {
            sqlx::query(
                "UPDATE team_quotas
                    SET attachment_bytes_used = greatest(attachment_bytes_used - $2, 0)
                  WHERE team_id = $1",
            )
            .bind(team_id)
            .bind(attachment_bytes)
            .execute(&mut *tx)
            .await?;
        }
        let lost: Vec<Uuid> = deleted.iter().filter_map(|d| d.1).collect();
        if !lost.is_empty() {
            sqlx::query(
                "UPDATE channels c SET message_count = c.message_count - g.n
                   FROM (SELECT id, count(*) AS n FROM unnest($2::uuid[]) AS id GROUP BY id) g
                  WHERE c.team_id = $1 AND c.id = g.id",
            )
            .bind(team_id)
            .bind(&lost)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if deleted.is_empty() {
            // Everything chosen is needed after all (a reader came):
            // nothing more this kind can take now.
            return Ok(gone);
        }
        gone.rows += deleted.len() as i64;
        gone.bytes += deleted.iter().map(|d| d.2).sum::<i64>();
        gone.attachments += attachments;
        gone.attachment_bytes += attachment_bytes;
        report(gone.rows);
    }
}

/// A deleted message: id, channel, weight, position, recipient.
type Deleted = (Uuid, Option<Uuid>, i64, i64, Option<Uuid>);

/// Raise the prune marks (migration 0048) to the highest position this
/// batch deleted, per channel and per recipient of direct messages, in the
/// batch's transaction: a read from a position below a mark is refused
/// (`read_messages {after}`), never answered with what is left as if it
/// were all.
async fn record_marks(
    tx: &mut sqlx::PgConnection,
    team_id: Uuid,
    deleted: &[Deleted],
) -> BusResult<()> {
    let mut kinds = Vec::with_capacity(deleted.len());
    let mut keys = Vec::with_capacity(deleted.len());
    let mut positions = Vec::with_capacity(deleted.len());
    for (_, channel, _, position, recipient) in deleted {
        let (kind, key) = match (channel, recipient) {
            (Some(channel), _) => ("channel", *channel),
            (None, Some(agent)) => ("direct", *agent),
            (None, None) => continue,
        };
        kinds.push(kind);
        keys.push(key);
        positions.push(*position);
    }
    if kinds.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO message_prune_marks (team_id, kind, key, pruned_through)
         SELECT $1, kind, key, max(position)
           FROM unnest($2::text[], $3::uuid[], $4::bigint[]) AS d(kind, key, position)
          GROUP BY kind, key
         ON CONFLICT (team_id, kind, key) DO UPDATE
            SET pruned_through = greatest(message_prune_marks.pruned_through,
                                          EXCLUDED.pruned_through),
                updated_at = now()",
    )
    .bind(team_id)
    .bind(&kinds)
    .bind(&keys)
    .bind(&positions)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Release the team's conversation messages past their conversation's
/// retention, one conversation and one batch at a time, each batch under the
/// conversation row's lock (taken first, as every conversation writer does).
/// Returns (rows, bytes) released.
pub(super) async fn release_conversation_messages(
    pool: &PgPool,
    team_id: Uuid,
    now: DateTime<Utc>,
    actor: &Actor,
    report: &(dyn Fn(i64) + Sync),
) -> BusResult<(i64, i64)> {
    let conversations: Vec<(Uuid, i32)> = sqlx::query_as(
        "SELECT id, retention_days FROM conversations
          WHERE team_id = $1 AND retention_days IS NOT NULL ORDER BY id",
    )
    .bind(team_id)
    .fetch_all(pool)
    .await?;
    let (mut rows, mut bytes) = (0i64, 0i64);
    for (conversation_id, days) in conversations {
        let reason = format!(
            "{RELEASED_BY_RETENTION}: this conversation keeps messages {days} day(s) \
             (`ai-crew-sync team prune`)"
        );
        loop {
            let mut tx = pool.begin().await?;
            fence_batch(&mut tx, actor, "conversation_messages", rows).await?;
            sqlx::query("SELECT 1 FROM conversations WHERE team_id = $1 AND id = $2 FOR UPDATE")
                .bind(team_id)
                .bind(conversation_id)
                .execute(&mut *tx)
                .await?;
            let released: Vec<(Uuid, String, Option<String>, i64)> =
                sqlx::query_as(kinds::CONVERSATION_MESSAGES_BATCH)
                    .bind(team_id)
                    .bind(now)
                    .bind(BATCH)
                    .bind(conversation_id)
                    .bind(&reason)
                    .fetch_all(&mut *tx)
                    .await?;
            tx.commit().await?;
            if released.is_empty() {
                break;
            }
            rows += released.len() as i64;
            bytes += released.iter().map(|r| r.3).sum::<i64>();
            report(rows);
        }
    }
    Ok((rows, bytes))
}

/// How a retention release's tombstone reason starts; the broker drop below
/// finds the messages it still owes a drop by it.
const RELEASED_BY_RETENTION: &str = "released by retention";

/// What the broker was asked to drop after a release.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct BrokerDrop {
    /// Bodies the broker dropped.
    pub dropped: i64,
    /// Released messages whose broker body is still to drop (no broker
    /// here, or it did not answer); the next `team prune --apply` with the
    /// broker drops them.
    pub waiting: i64,
    /// Why some wait.
    pub why: Option<String>,
}

/// Drop from the broker the bodies of the team's JetStream messages a
/// release tombstoned, through the backend's retention path
/// (`MessagingBackend::retain`), a batch at a time with nothing held; each
/// dropped message's locator is then cleared, so a later prune does not ask
/// again. Without a broker, or when it fails, the rest waits.
pub(super) async fn drop_broker_bodies(
    pool: &PgPool,
    backends: &Backends,
    team_id: Uuid,
) -> BusResult<BrokerDrop> {
    let mut result = BrokerDrop::default();
    let owed = format!("{RELEASED_BY_RETENTION}%");
    loop {
        let batch: Vec<(Uuid, String)> = sqlx::query_as(
            "SELECT id, canonical_locator FROM conversation_messages
              WHERE team_id = $1 AND backend = 'jetstream' AND canonical_locator IS NOT NULL
                AND tombstone_reason LIKE $2
              ORDER BY id LIMIT $3",
        )
        .bind(team_id)
        .bind(&owed)
        .bind(BATCH)
        .fetch_all(pool)
        .await?;
        if batch.is_empty() {
            return Ok(result);
        }
        let locators: Vec<Locator> = batch.iter().map(|(_, l)| Locator(l.clone())).collect();
        let dropped = match backends.for_message(BackendKind::Jetstream, team_id) {
            Ok(backend) => backend.retain(&locators).await,
            Err(err) => Err(err),
        };
        if let Err(err) = dropped {
            result.waiting = sqlx::query_scalar(
                "SELECT count(*) FROM conversation_messages
                  WHERE team_id = $1 AND backend = 'jetstream' AND canonical_locator IS NOT NULL
                    AND tombstone_reason LIKE $2",
            )
            .bind(team_id)
            .bind(&owed)
            .fetch_one(pool)
            .await?;
            result.why = Some(err.to_string());
            return Ok(result);
        }
        let ids: Vec<Uuid> = batch.iter().map(|(id, _)| *id).collect();
        let cleared = sqlx::query(
            "UPDATE conversation_messages SET canonical_locator = NULL
              WHERE team_id = $1 AND id = ANY($2) AND tombstone_reason LIKE $3",
        )
        .bind(team_id)
        .bind(&ids)
        .bind(&owed)
        .execute(pool)
        .await?;
        result.dropped += cleared.rows_affected() as i64;
    }
}

/// `conversations retention`'s answer.
#[derive(Clone, Debug, Serialize)]
pub struct Retention {
    pub team: String,
    pub conversation_id: Uuid,
    /// None: kept for ever.
    pub retention_days: Option<i32>,
}

/// `conversations retention`: how many days a conversation keeps its
/// messages before `team prune` releases them (`None` clears it: kept for
/// ever). Audited. Nothing is released here; the next prune does it.
pub async fn set_retention(
    pool: &PgPool,
    team: &TeamScope,
    conversation_id: Uuid,
    days: Option<i64>,
) -> BusResult<Retention> {
    if let Some(days) = days
        && !(1..=DAYS_MAX).contains(&days)
    {
        return Err(BusError::invalid(format!(
            "--days {days} is out of range: a conversation keeps its messages 1 to {DAYS_MAX} \
             days (or give --forever to keep them for ever). Nothing was changed."
        )));
    }
    let actor = team.actor().clone();
    let team = teams::find(pool, team.slug()).await?;
    let mut tx = pool.begin().await?;
    // The fence before the conversation's row, as a prune batch takes them:
    // the other order closes a cycle with a prune and a queued revocation.
    audit::fence(&mut tx, &actor, "nothing was changed").await?;
    let previous: Option<Option<i32>> = sqlx::query_scalar(
        "SELECT retention_days FROM conversations WHERE team_id = $1 AND id = $2 FOR UPDATE",
    )
    .bind(team.id)
    .bind(conversation_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(previous) = previous else {
        return Err(BusError::not_found(format!(
            "team `{}` has no conversation {conversation_id}. `ai-crew-sync conversations status \
             --team {}` lists the team's conversations.",
            team.slug, team.slug
        )));
    };
    let days = days.map(|d| d as i32);
    if previous != days {
        sqlx::query("UPDATE conversations SET retention_days = $3 WHERE team_id = $1 AND id = $2")
            .bind(team.id)
            .bind(conversation_id)
            .bind(days)
            .execute(&mut *tx)
            .await?;
        audit::record(
            &mut tx,
            Some(team.id),
            &actor,
            "conversation.retention",
            &conversation_id.to_string(),
            json!({ "retention_days": days, "previous": previous }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Retention {
        team: team.slug,
        conversation_id,
        retention_days: days,
    })
}
