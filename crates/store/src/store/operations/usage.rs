//! What a team stores, counted, and the one quota that caps it.
//!
//! `team usage` counts rows and bytes per kind of history, never content.
//! Bytes are octet lengths of what each row carries for the team: message
//! bodies and their metadata's JSON text, note values, task title,
//! description, result and metadata, event and audit details, attachment
//! sizes, webhook deliveries' payloads and errors. Conversation messages count their body where it is kept: the row's
//! text on PostgreSQL, the recorded `body_bytes` on JetStream (a released
//! message counts nothing); local copies of JetStream bodies and outbox
//! payloads are shown apart and not counted twice. Webhook deliveries are
//! counted against the quota although their payload repeats an event (a
//! post's body, say): unlike a local copy, which the sweep releases, a
//! delivery row stays as long as the hook's receiver lets it (a failed one
//! until `team prune`), once per hook, so it is storage the team's hooks
//! add, and `team prune` removes the settled ones.
//!
//! The quota (`team quota --bytes N`) caps the kinds marked `in_quota`: what
//! agents write. Audit rows and inbox references are the bus's own records and
//! are not charged to the team. The check, [`check_quota`], is the one rule
//! every write path calls: `used + this write > limit` refuses and writes
//! nothing. A write that is one SQL call (a post, the task writes, `set_note`,
//! a conversation send) checks it there, with `storage_quota_refusal`
//! (migration 0031), and words it through [`quota_refusal`]. `used` is the last recount (`team_quotas.storage_bytes_used`), read
//! without a lock, because counting a team's history on each write is far too
//! slow and a counter row bumped by every write would make a team's writes
//! queue on one row (conversation sends are benchmarked). Recounts run every
//! [`RECOUNT_INTERVAL`] (`workers::storage_recount`) and after `team usage`,
//! `team quota` and `team prune --apply`. So the overshoot is bounded by what
//! the team writes between two recounts, at most one interval's worth;
//! attachments, the large writes, are also checked exactly under the quota
//! row's lock (`store::messaging::attachments`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use crate::error::{BusError, BusResult};
use crate::store::delivery::outbox;
use crate::store::identity::admin::TeamScope;
use crate::store::messaging::attachments::TEAM_QUOTA_DEFAULT_BYTES;
use crate::store::{Actor, identity::audit, identity::teams};

/// How often the worker recounts every team's usage.
pub const RECOUNT_INTERVAL: Duration = Duration::from_secs(60);
/// A quota this full gets a warning.
pub const QUOTA_WARN_PERCENT: f64 = 80.0;
/// An outbox slot pending longer than this gets a warning.
pub const OUTBOX_WARN_SECONDS: i64 = 5 * 60;

/// One kind of history: how many rows and bytes.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KindUsage {
    pub kind: &'static str,
    pub rows: i64,
    pub bytes: i64,
    /// Whether these bytes count against the quota.
    pub in_quota: bool,
}

/// `team usage`.
#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub team: String,
    pub counted_at: DateTime<Utc>,
    pub kinds: Vec<KindUsage>,
    /// Inbox references not yet delivered (a subset of `inbox_references`).
    pub inbox_owed: i64,
    pub outbox: outbox::Status,
    /// The outbox's failed slots and their payload bytes.
    pub outbox_failed_bytes: i64,
    /// Sum of the `in_quota` kinds: what the quota is compared with.
    pub used_bytes: i64,
    pub quota_bytes: i64,
    pub percent_used: f64,
    pub warnings: Vec<String>,
}

impl Usage {
    pub fn kind(&self, kind: &str) -> Option<&KindUsage> {
        self.kinds.iter().find(|k| k.kind == kind)
    }
}

/// Every count in one statement (one snapshot). $1 team.
const COUNTS: &str = "
SELECT
  (SELECT count(*) FROM messages WHERE team_id = $1 AND channel_id IS NOT NULL),
  (SELECT coalesce(sum(octet_length(body) + coalesce(octet_length(metadata::text), 0)), 0)::bigint
     FROM messages WHERE team_id = $1 AND channel_id IS NOT NULL),
  (SELECT count(*) FROM messages WHERE team_id = $1 AND recipient_id IS NOT NULL),
  (SELECT coalesce(sum(octet_length(body) + coalesce(octet_length(metadata::text), 0)), 0)::bigint
     FROM messages WHERE team_id = $1 AND recipient_id IS NOT NULL),
  (SELECT count(*) FROM conversation_messages WHERE team_id = $1 AND backend = 'postgres'),
  (SELECT coalesce(sum(octet_length(body) + coalesce(octet_length(metadata::text), 0)), 0)::bigint
     FROM conversation_messages WHERE team_id = $1 AND backend = 'postgres'),
  (SELECT count(*) FROM conversation_messages WHERE team_id = $1 AND backend = 'jetstream'),
  (SELECT coalesce(sum(CASE WHEN tombstoned_at IS NULL THEN body_bytes ELSE 0 END
                       + coalesce(octet_length(metadata::text), 0)), 0)::bigint
     FROM conversation_messages WHERE team_id = $1 AND backend = 'jetstream'),
  (SELECT count(*) FROM conversation_messages
    WHERE team_id = $1 AND backend = 'jetstream' AND body <> ''),
  (SELECT coalesce(sum(octet_length(body)), 0)::bigint FROM conversation_messages
    WHERE team_id = $1 AND backend = 'jetstream' AND body <> ''),
  (SELECT count(*) FROM notes WHERE team_id = $1),
  (SELECT coalesce(sum(octet_length(value)), 0)::bigint FROM notes WHERE team_id = $1),
  (SELECT count(*) FROM note_revisions WHERE team_id = $1),
  (SELECT coalesce(sum(octet_length(value)), 0)::bigint FROM note_revisions WHERE team_id = $1),
  (SELECT count(*) FROM tasks WHERE team_id = $1),
  (SELECT coalesce(sum(octet_length(title) + coalesce(octet_length(description), 0)
                       + coalesce(octet_length(result), 0) + octet_length(metadata::text)), 0)::bigint
     FROM tasks WHERE team_id = $1),
  (SELECT count(*) FROM task_events WHERE team_id = $1),
  (SELECT coalesce(sum(octet_length(detail::text)), 0)::bigint FROM task_events WHERE team_id = $1),
  (SELECT count(*) FROM attachments WHERE team_id = $1),
  (SELECT coalesce(sum(size_bytes), 0)::bigint FROM attachments WHERE team_id = $1),
  (SELECT count(*) FROM webhook_deliveries WHERE team_id = $1),
  (SELECT coalesce(sum(octet_length(payload::text) + coalesce(octet_length(last_error), 0)), 0)::bigint
     FROM webhook_deliveries WHERE team_id = $1),
  (SELECT count(*) FROM audit_log WHERE team_id = $1),
  (SELECT coalesce(sum(octet_length(detail::text)), 0)::bigint FROM audit_log WHERE team_id = $1),
  (SELECT count(*) FROM conversation_audit WHERE team_id = $1),
  (SELECT coalesce(sum(octet_length(detail::text)), 0)::bigint FROM conversation_audit WHERE team_id = $1),
  (SELECT count(*) FROM agent_sessions WHERE team_id = $1), 0::bigint,
  (SELECT count(*) FROM presence WHERE team_id = $1), 0::bigint,
  (SELECT count(*) FROM read_cursors WHERE team_id = $1), 0::bigint,
  (SELECT count(*) FROM inbox_references WHERE team_id = $1),
  (SELECT count(*) FROM inbox_references WHERE team_id = $1 AND delivered_at IS NULL),
  (SELECT coalesce(sum(payload_bytes), 0)::bigint FROM conversation_outbox
    WHERE team_id = $1 AND state = 'failed'),
  (SELECT attachment_bytes_limit FROM team_quotas WHERE team_id = $1),
  now()";

/// (kind, counted against the quota), in the order [`COUNTS`] reads them
/// (rows then bytes each), up to `inbox_references`.
/// Windows' rows (session credentials, presence, read cursors) are the bus's
/// bookkeeping of what agents do, not history they write: counted so an
/// operator sees an agent that mints windows without end, not charged (live
/// sessions are capped per agent instead, `serve --max-sessions-per-agent`).
const KINDS: [(&str, bool); 16] = [
    ("channel_messages", true),
    ("direct_messages", true),
    ("conversation_messages_postgres", true),
    ("conversation_messages_jetstream", true),
    ("conversation_bodies_held_locally", false),
    ("notes", true),
    ("note_revisions", true),
    ("tasks", true),
    ("task_events", true),
    ("attachments", true),
    ("webhook_deliveries", true),
    ("audit", false),
    ("conversation_audit", false),
    ("sessions", false),
    ("presence", false),
    ("read_cursors", false),
];

/// Count what `team_id` stores, record the total as its usage, and say what
/// needs attention.
pub async fn count(pool: &PgPool, team_id: Uuid, slug: &str) -> BusResult<Usage> {
    // Planned for this team (the benchmark's team of 300 000 messages and a
    // new one of ten do not share a good plan): a generic plan read ~11
    // times the buffers, and the recount of every team, once a minute,
    // took a core for seconds.
    let mut tx = crate::store::custom_plans(pool).await?;
    let row = sqlx::query(COUNTS)
        .bind(team_id)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    use sqlx::Row;
    let mut kinds = Vec::with_capacity(KINDS.len() + 1);
    for (i, (kind, in_quota)) in KINDS.iter().enumerate() {
        kinds.push(KindUsage {
            kind,
            rows: row.try_get(2 * i)?,
            bytes: row.try_get(2 * i + 1)?,
            in_quota: *in_quota,
        });
    }
    let at = 2 * KINDS.len();
    kinds.push(KindUsage {
        kind: "inbox_references",
        rows: row.try_get(at)?,
        bytes: 0,
        in_quota: false,
    });
    let inbox_owed: i64 = row.try_get(at + 1)?;
    let outbox_failed_bytes: i64 = row.try_get(at + 2)?;
    let quota_bytes = row
        .try_get::<Option<i64>, _>(at + 3)?
        .unwrap_or(TEAM_QUOTA_DEFAULT_BYTES);
    let counted_at: DateTime<Utc> = row.try_get(at + 4)?;
    let used_bytes: i64 = kinds.iter().filter(|k| k.in_quota).map(|k| k.bytes).sum();
    record_count(pool, team_id, used_bytes, counted_at).await?;
    let outbox = outbox::status(pool, team_id).await?;

    let percent_used = percent(used_bytes, quota_bytes);
    let mut warnings = Vec::new();
    if percent_used > QUOTA_WARN_PERCENT {
        warnings.push(format!(
            "storage is {percent_used:.1} % of the quota ({used_bytes} of {quota_bytes} bytes): \
             writes past it are refused. Trim history with `ai-crew-sync team prune --team {slug} \
             --older-than-days N` or raise the quota with `ai-crew-sync team quota --team {slug} \
             --bytes N`."
        ));
    }
    if let Some(age) = outbox.oldest_pending_seconds
        && age > OUTBOX_WARN_SECONDS
    {
        warnings.push(format!(
            "the outbox's oldest pending message has waited {age} s (more than \
             {OUTBOX_WARN_SECONDS} s): publication is stuck or slow. \
             `ai-crew-sync conversations status --team {slug}` shows why."
        ));
    }
    Ok(Usage {
        team: slug.to_owned(),
        counted_at,
        kinds,
        inbox_owed,
        outbox,
        outbox_failed_bytes,
        used_bytes,
        quota_bytes,
        percent_used,
        warnings,
    })
}

fn percent(used: i64, limit: i64) -> f64 {
    if limit <= 0 {
        return if used > 0 { 100.0 } else { 0.0 };
    }
    ((used as f64) * 1000.0 / (limit as f64)).round() / 10.0
}

/// The recount's result, kept for [`check_quota`]. A short upsert of the
/// team's quota row; an older count never overwrites a newer one.
async fn record_count(pool: &PgPool, team_id: Uuid, used: i64, at: DateTime<Utc>) -> BusResult<()> {
    sqlx::query(
        "INSERT INTO team_quotas (team_id, attachment_bytes_limit, storage_bytes_used, storage_counted_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (team_id) DO UPDATE
            SET storage_bytes_used = EXCLUDED.storage_bytes_used,
                storage_counted_at = EXCLUDED.storage_counted_at
          WHERE team_quotas.storage_counted_at IS NULL
             OR team_quotas.storage_counted_at <= EXCLUDED.storage_counted_at",
    )
    .bind(team_id)
    .bind(TEAM_QUOTA_DEFAULT_BYTES)
    .bind(used)
    .bind(at)
    .execute(pool)
    .await?;
    Ok(())
}

/// `team usage`.
pub async fn usage(pool: &PgPool, team: &TeamScope) -> BusResult<Usage> {
    let team = teams::find(pool, team.slug()).await?;
    count(pool, team.id, &team.slug).await
}

/// Recount every team not counted lately (the worker's pass); how many
/// teams were counted.
pub async fn recount_all(pool: &PgPool) -> BusResult<usize> {
    // A team another replica counted within most of an interval is skipped:
    // with N replicas a team is still counted about once per interval, not
    // N times (a count reads every row the team stores).
    let teams: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT t.id, t.slug FROM teams t
           LEFT JOIN team_quotas q ON q.team_id = t.id
          WHERE q.storage_counted_at IS NULL
             OR q.storage_counted_at < now() - make_interval(secs => $1)
          ORDER BY t.slug",
    )
    .bind(RECOUNT_INTERVAL.as_secs_f64() * 0.8)
    .fetch_all(pool)
    .await?;
    for (id, slug) in &teams {
        count(pool, *id, slug).await?;
    }
    Ok(teams.len())
}

/// The quota rule: a write of `incoming` bytes is refused when the team's
/// last counted usage plus it passes the limit. The writes that are one SQL
/// call apply the same rule inside it (`storage_quota_refusal`, migration 0031)
/// and word it with [`quota_refusal`]; this reads the row itself so that a
/// build one migration ahead of its schema still writes.
/// Reads the quota row without a lock (see the module comment for the
/// bounded overshoot this allows). Call it before writing anything.
pub async fn check_quota(
    db: impl PgExecutor<'_>,
    team_id: Uuid,
    team_slug: &str,
    incoming: usize,
) -> BusResult<()> {
    // The count is read through `to_jsonb` so that this build, one migration
    // ahead of a schema without the column (the upgrade test writes the
    // previous schema's data with it), still writes: no count is no usage.
    let row: Option<(i64, i64)> = sqlx::query_as(
        "SELECT attachment_bytes_limit,
                coalesce((to_jsonb(q) ->> 'storage_bytes_used')::bigint, 0)
           FROM team_quotas q WHERE team_id = $1",
    )
    .bind(team_id)
    .fetch_optional(db)
    .await?;
    let (limit, used) = row.unwrap_or((TEAM_QUOTA_DEFAULT_BYTES, 0));
    let incoming = incoming as i64;
    if used.saturating_add(incoming) > limit {
        return Err(quota_refusal(limit, used, incoming, team_slug));
    }
    Ok(())
}

/// A write the quota refused, as the writes of migration 0033 answer it in
/// their detail: `storage_quota_refusal`'s figures (migration 0031), worded
/// by [`quota_refusal`].
#[derive(serde::Deserialize)]
pub(crate) struct QuotaRefusal {
    limit: i64,
    used: i64,
    incoming: i64,
}

impl QuotaRefusal {
    pub(crate) fn from_detail(detail: Option<serde_json::Value>) -> BusResult<QuotaRefusal> {
        crate::store::fenced::detail(detail)
    }

    /// The refusal in words, the same for every write the quota stops.
    pub(crate) fn refusal(&self, team_slug: &str) -> BusError {
        quota_refusal(self.limit, self.used, self.incoming, team_slug)
    }
}

/// The quota refusal's words, for [`check_quota`] and for the writes whose
/// one SQL call checks the quota itself (the SQL function
/// `storage_quota_refusal`, migration 0031, states the same rule) and answers
/// the figures.
pub(crate) fn quota_refusal(limit: i64, used: i64, incoming: i64, team_slug: &str) -> BusError {
    BusError::conflict(format!(
        "the team's storage quota is {limit} bytes and {used} are used; this write of \
         {incoming} bytes would pass it, so nothing was written. An operator can trim old \
         history with `ai-crew-sync team prune --team {team_slug} --older-than-days N` or raise \
         the quota with `ai-crew-sync team quota --team {team_slug} --bytes N`."
    ))
}

/// `team quota`'s answer. The attachment fields are kept from when the quota
/// capped attachments only: `attachment_bytes_limit` is the same limit.
#[derive(Clone, Debug, Serialize)]
pub struct Quota {
    pub team: String,
    pub attachment_bytes_limit: i64,
    pub attachment_bytes_used: i64,
    pub storage_bytes_limit: i64,
    pub storage_bytes_used: i64,
    pub percent_used: f64,
    pub counted_at: DateTime<Utc>,
}

/// `team quota`: show the quota, or set it (audited), with the usage counted
/// now. Lowering it below what is used refuses new writes, never drops
/// stored history.
pub async fn quota(
    pool: &PgPool,
    team: &str,
    set_bytes: Option<i64>,
    actor: &Actor,
) -> BusResult<Quota> {
    if let Some(bytes) = set_bytes
        && bytes < 0
    {
        return Err(BusError::invalid(format!(
            "--bytes must be 0 or more (got {bytes}); 0 refuses every new write that stores bytes."
        )));
    }
    let team = teams::find(pool, team).await?;
    let mut tx = pool.begin().await?;
    let (mut limit, attachment_used) =
        crate::store::messaging::attachments::lock_quota(&mut tx, team.id).await?;
    if let Some(bytes) = set_bytes
        && bytes != limit
    {
        sqlx::query("UPDATE team_quotas SET attachment_bytes_limit = $2 WHERE team_id = $1")
            .bind(team.id)
            .bind(bytes)
            .execute(&mut *tx)
            .await?;
        audit::record(
            &mut tx,
            Some(team.id),
            actor,
            "team.quota",
            &team.slug,
            json!({ "storage_bytes_limit": bytes, "previous": limit }),
        )
        .await?;
        limit = bytes;
    }
    tx.commit().await?;
    let usage = count(pool, team.id, &team.slug).await?;
    Ok(Quota {
        team: team.slug,
        attachment_bytes_limit: limit,
        attachment_bytes_used: attachment_used,
        storage_bytes_limit: limit,
        storage_bytes_used: usage.used_bytes,
        percent_used: percent(usage.used_bytes, limit),
        counted_at: usage.counted_at,
    })
}
