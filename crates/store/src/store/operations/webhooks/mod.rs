//! Outgoing webhooks: a team's hooks (`webhook add|list|pause|resume|remove`,
//! the same over `/admin`), and the delivery rows the dispatcher works
//! through.
//!
//! Enqueueing is not here: triggers of migration 0025 write one delivery row
//! per (event, matching hook) inside the transaction of the change, so a
//! delivery exists exactly when its change committed, once, whichever replica
//! (or CLI) made it, and a tool call never waits on a receiver. That file
//! also says what is never forwarded (direct messages, private
//! conversations, conversation bodies, note values).
//!
//! [`delivery`] claims and settles rows for the dispatcher
//! (`workers/webhook_dispatcher.rs`); [`payload`] shapes and signs what is
//! sent; [`address`] decides where a hook may point.
//!
//! Every change is audited in its own transaction, naming the receiver's
//! origin only: a hook's URL may carry a secret in its path (Slack's and
//! Discord's do).

pub mod address;
pub mod delivery;
pub mod payload;

use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::{BusError, BusResult};
use crate::store::identity::admin::{Authority, Reach, TeamScope};
use crate::store::{identity::audit, identity::teams, messaging::channels, text};

/// The event families a hook may subscribe to.
pub const EVENT_FAMILIES: &[&str] = &[
    "message",
    "announcement",
    "task",
    "lock",
    "note",
    "conversation",
    "ack",
];
/// At most this many channels narrow one hook.
pub const CHANNELS_MAX: usize = 32;
/// At most this many hooks per team: each one is a delivery row per event.
pub const WEBHOOKS_PER_TEAM_MAX: i64 = 20;
/// Failed deliveries a listing shows per hook (newest first).
pub const FAILURES_SHOWN: i64 = 5;

acs_wire::text_enum! {
    /// What a receiver is: a generic JSON endpoint (signed envelope), or a chat
    /// service's incoming webhook (a short text).
    /// Stored as text in `webhooks.kind`.
    pub enum WebhookKind {
        Generic = "generic",
        Slack = "slack",
        Discord = "discord",
    }
}
crate::text_column!(WebhookKind);

impl WebhookKind {
    pub fn parse(raw: &str) -> BusResult<WebhookKind> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "generic" => Ok(WebhookKind::Generic),
            "slack" => Ok(WebhookKind::Slack),
            "discord" => Ok(WebhookKind::Discord),
            _ => Err(BusError::invalid(format!(
                "webhook kind {} is not known: use `generic` (signed JSON), `slack` or `discord`.",
                text::quote(raw)
            ))),
        }
    }
}

/// A hook to add. `events` empty means every family; `channels` empty means
/// every channel.
#[derive(Clone, Debug)]
pub struct NewWebhook {
    pub url: String,
    pub kind: WebhookKind,
    pub events: Vec<String>,
    pub channels: Vec<String>,
    /// `Some`: the hook may reach private, loopback and link-local addresses.
    pub allow_private: Option<PrivateTargets>,
}

/// Permission for a hook to reach non-public addresses (`--allow-private`,
/// `allow_private: true` over `/admin`), made only by [`PrivateTargets::grant`].
/// Such a hook makes the server POST wherever its host points: the metrics
/// listener, a cloud metadata address, a database's HTTP port. That is a
/// decision about the server's network, not about one team, so only the
/// operator beside the database and a global admin credential may make it;
/// a credential confined to a team may not.
#[derive(Clone, Debug)]
pub struct PrivateTargets(crate::store::Actor);

impl PrivateTargets {
    pub fn grant(authority: &Authority) -> BusResult<PrivateTargets> {
        if let Authority::Admin(me) = authority
            && let Some(team) = &me.team
        {
            return Err(BusError::forbidden(format!(
                "only a global admin credential or the operator on the server can let a webhook \
                 reach private, loopback or link-local addresses (allow_private); this credential \
                 is confined to team `{team}`, so nothing was added. Point the webhook at a \
                 public address and leave allow_private out, or ask the operator to add it \
                 (`ai-crew-sync webhook add --allow-private`)."
            )));
        }
        Ok(PrivateTargets(authority.actor()))
    }

    /// Who allowed it.
    pub fn actor(&self) -> &crate::store::Actor {
        &self.0
    }
}

/// Deliveries of one hook by state.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub pending: i64,
    pub delivering: i64,
    pub delivered: i64,
    pub failed: i64,
}

/// A delivery that gave up, with why.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct FailedDelivery {
    pub id: Uuid,
    pub event: String,
    pub attempts: i32,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A hook as listings show it: never its secret.
#[derive(Clone, Debug, Serialize)]
pub struct WebhookSummary {
    pub id: Uuid,
    pub team: String,
    pub url: String,
    pub kind: WebhookKind,
    pub events: Vec<String>,
    /// `None`: every channel.
    pub channels: Option<Vec<String>>,
    pub allow_private: bool,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    /// Set while the hook is paused: nothing is queued for it, and what was
    /// queued before waits for `webhook resume`.
    pub paused_at: Option<DateTime<Utc>>,
    pub paused_by: Option<String>,
    pub deliveries: DeliveryCounts,
    /// The newest failed deliveries (at most [`FAILURES_SHOWN`]).
    pub failures: Vec<FailedDelivery>,
}

/// A hook just added. `secret` is shown this once.
#[derive(Clone, Debug, Serialize)]
pub struct CreatedWebhook {
    #[serde(flatten)]
    pub webhook: WebhookSummary,
    /// The HMAC-SHA256 key of `X-Bus-Signature`; shown once.
    pub secret: String,
}

#[derive(sqlx::FromRow)]
struct WebhookRow {
    id: Uuid,
    team: String,
    url: String,
    kind: WebhookKind,
    events: Vec<String>,
    channels: Option<Vec<String>>,
    allow_private: bool,
    created_by: String,
    created_at: DateTime<Utc>,
    paused_at: Option<DateTime<Utc>>,
    paused_by: Option<String>,
}

fn check_events(raw: &[String]) -> BusResult<Vec<String>> {
    let mut events: Vec<String> = Vec::new();
    for item in raw.iter().flat_map(|r| r.split(',')) {
        let name = item.trim().to_ascii_lowercase();
        if name.is_empty() {
            continue;
        }
        if !EVENT_FAMILIES.contains(&name.as_str()) {
            return Err(BusError::invalid(format!(
                "webhook event {} is not known: use any of {} (comma-separated), or omit \
                 --events for all of them.",
                text::quote(item),
                EVENT_FAMILIES.join(", ")
            )));
        }
        if !events.contains(&name) {
            events.push(name);
        }
    }
    if events.is_empty() {
        events = EVENT_FAMILIES.iter().map(|e| e.to_string()).collect();
    }
    Ok(events)
}

/// Channel names (or a channel's id, turned into its name), `#` optional.
async fn check_channels(pool: &PgPool, team_id: Uuid, raw: &[String]) -> BusResult<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for item in raw.iter().flat_map(|r| r.split(',')) {
        if item.trim().is_empty() {
            continue;
        }
        let name = match item.trim().parse::<Uuid>() {
            Ok(id) => {
                sqlx::query_scalar("SELECT name FROM channels WHERE team_id = $1 AND id = $2")
                    .bind(team_id)
                    .bind(id)
                    .fetch_optional(pool)
                    .await?
                    .ok_or_else(|| {
                        BusError::not_found(format!(
                            "no channel with id {id} in this team. Give the channel's name instead \
                         (a channel that does not exist yet may be named)."
                        ))
                    })?
            }
            Err(_) => channels::normalize_name(item)?,
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.len() > CHANNELS_MAX {
        return Err(BusError::invalid(format!(
            "{} channels were named; a webhook takes at most {CHANNELS_MAX}. Add a second webhook \
             for the rest, or omit --channel for every channel.",
            names.len()
        )));
    }
    Ok(names)
}

/// `scheme://host[:port]`: what the audit log says about a receiver.
fn origin(url: &url::Url) -> String {
    url.origin().ascii_serialization()
}

/// Add a hook. Everything is checked before anything is written (the URL,
/// its addresses, events, channels); the secret is returned this once.
pub async fn add(pool: &PgPool, team: &TeamScope, new: NewWebhook) -> BusResult<CreatedWebhook> {
    let url = address::check_url(&new.url)?;
    let events = check_events(&new.events)?;
    let found = teams::find(pool, team.slug()).await?;
    let channels = check_channels(pool, found.id, &new.channels).await?;
    let allow_private = new.allow_private.is_some();
    address::check_destination(&url, allow_private).await?;
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    let secret = format!("whsec_{}", hex::encode(key));
    let id = Uuid::new_v4();
    let actor = team.actor();
    let mut tx = pool.begin().await?;
    // The team row serialises adds, so two cannot both take the last place;
    // NO KEY: writes that reference the team (their foreign keys take KEY
    // SHARE) are not held up.
    sqlx::query("SELECT 1 FROM teams WHERE id = $1 FOR NO KEY UPDATE")
        .bind(found.id)
        .execute(&mut *tx)
        .await?;
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM webhooks WHERE team_id = $1")
        .bind(found.id)
        .fetch_one(&mut *tx)
        .await?;
    if count >= WEBHOOKS_PER_TEAM_MAX {
        return Err(BusError::conflict(format!(
            "team `{}` already has {count} webhooks, the most a team may have; nothing was added. \
             Remove one (`ai-crew-sync webhook list --team {}` shows them), or point one \
             receiver at several event families.",
            found.slug, found.slug
        )));
    }
    sqlx::query(
        "INSERT INTO webhooks (id, team_id, url, kind, events, channels, secret, allow_private,
                               created_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(id)
    .bind(found.id)
    .bind(url.as_str())
    .bind(new.kind)
    .bind(&events)
    .bind((!channels.is_empty()).then_some(&channels))
    .bind(&secret)
    .bind(allow_private)
    .bind(&actor.name)
    .execute(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        Some(found.id),
        actor,
        "webhook.add",
        &id.to_string(),
        json!({
            "origin": origin(&url), "kind": new.kind.as_str(), "events": events,
            "channels": channels, "allow_private": allow_private,
        }),
    )
    .await?;
    tx.commit().await?;
    let webhook = summaries(pool, Some(found.id), Some(id))
        .await?
        .pop()
        .ok_or_else(|| BusError::conflict("the webhook vanished right after it was added."))?;
    Ok(CreatedWebhook { webhook, secret })
}

/// Every hook of the team with its delivery counts and newest failures.
pub async fn list(pool: &PgPool, team: &TeamScope) -> BusResult<Vec<WebhookSummary>> {
    let found = teams::find(pool, team.slug()).await?;
    summaries(pool, Some(found.id), None).await
}

/// Remove a hook; its pending and past deliveries go with it (a delivery
/// being sent right now still completes, and its settle finds nothing).
/// Within one team, another team's hook is "not found".
pub async fn remove<'a>(
    pool: &PgPool,
    id: Uuid,
    within: impl Into<Reach<'a>>,
) -> BusResult<WebhookSummary> {
    let within = within.into();
    let team_id = match within.team() {
        Some(slug) => Some(teams::find(pool, slug).await?.id),
        None => None,
    };
    let not_found = || {
        BusError::not_found(format!(
            "no webhook with id {id}. `ai-crew-sync webhook list --team T` shows webhook ids."
        ))
    };
    let summary = summaries(pool, team_id, Some(id))
        .await?
        .pop()
        .ok_or_else(not_found)?;
    let mut tx = pool.begin().await?;
    let removed: Option<(Uuid, String)> = sqlx::query_as(
        "DELETE FROM webhooks WHERE id = $1 AND ($2::uuid IS NULL OR team_id = $2)
         RETURNING team_id, url",
    )
    .bind(id)
    .bind(team_id)
    .fetch_optional(&mut *tx)
    .await?;
    let (removed_team, url) = removed.ok_or_else(not_found)?;
    let origin = url::Url::parse(&url)
        .map(|u| origin(&u))
        .unwrap_or_default();
    audit::record(
        &mut tx,
        Some(removed_team),
        within.actor(),
        "webhook.remove",
        &id.to_string(),
        json!({ "origin": origin, "deliveries": summary.deliveries }),
    )
    .await?;
    tx.commit().await?;
    Ok(summary)
}

/// What [`set_paused`] did.
#[derive(Clone, Debug, Serialize)]
pub struct PauseChange {
    #[serde(flatten)]
    pub webhook: WebhookSummary,
    /// False when the hook already was as asked (nothing written, nothing
    /// audited).
    pub changed: bool,
}

/// Pause a hook (`paused`) or resume it. While paused, events are not queued
/// for it and the deliveries queued before wait; on resume they go out,
/// oldest first (migration 0027 says why). Asking for the state a hook is
/// already in changes nothing and says so. Within one team, another team's
/// hook is "not found".
pub async fn set_paused<'a>(
    pool: &PgPool,
    id: Uuid,
    within: impl Into<Reach<'a>>,
    paused: bool,
) -> BusResult<PauseChange> {
    let within = within.into();
    let team_id = match within.team() {
        Some(slug) => Some(teams::find(pool, slug).await?.id),
        None => None,
    };
    let actor = within.actor();
    let mut tx = pool.begin().await?;
    // The hook's row is locked while the pause commits: a claim in progress
    // (which reads it FOR SHARE) finishes first, and any later one sees it.
    let found: Option<(Uuid, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT team_id, paused_at FROM webhooks
          WHERE id = $1 AND ($2::uuid IS NULL OR team_id = $2)
          FOR NO KEY UPDATE",
    )
    .bind(id)
    .bind(team_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((hook_team, paused_at)) = found else {
        return Err(BusError::not_found(format!(
            "no webhook with id {id}. `ai-crew-sync webhook list --team T` shows webhook ids."
        )));
    };
    let changed = paused_at.is_some() != paused;
    if changed {
        sqlx::query(
            "UPDATE webhooks SET paused_at = CASE WHEN $2 THEN now() END,
                                 paused_by = CASE WHEN $2 THEN $3 END
              WHERE id = $1",
        )
        .bind(id)
        .bind(paused)
        .bind(&actor.name)
        .execute(&mut *tx)
        .await?;
        let action = if paused {
            "webhook.pause"
        } else {
            "webhook.resume"
        };
        audit::record(
            &mut tx,
            Some(hook_team),
            actor,
            action,
            &id.to_string(),
            json!({}),
        )
        .await?;
    }
    tx.commit().await?;
    let webhook = summaries(pool, Some(hook_team), Some(id))
        .await?
        .pop()
        .ok_or_else(|| BusError::not_found(format!("webhook {id} was removed meanwhile.")))?;
    Ok(PauseChange { webhook, changed })
}

/// Hooks of `team_id` (or any team), or the one hook `id`.
async fn summaries(
    pool: &PgPool,
    team_id: Option<Uuid>,
    id: Option<Uuid>,
) -> BusResult<Vec<WebhookSummary>> {
    let rows: Vec<WebhookRow> = sqlx::query_as(
        "SELECT w.id, t.slug AS team, w.url, w.kind, w.events, w.channels, w.allow_private,
                w.created_by, w.created_at, w.paused_at, w.paused_by
         FROM webhooks w JOIN teams t ON t.id = w.team_id
         WHERE ($1::uuid IS NULL OR w.team_id = $1) AND ($2::uuid IS NULL OR w.id = $2)
         ORDER BY w.created_at, w.id",
    )
    .bind(team_id)
    .bind(id)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let counts: Vec<(String, i64)> = sqlx::query_as(
            "SELECT state, count(*) FROM webhook_deliveries WHERE webhook_id = $1 GROUP BY state",
        )
        .bind(row.id)
        .fetch_all(pool)
        .await?;
        let mut deliveries = DeliveryCounts::default();
        for (state, n) in counts {
            match state.as_str() {
                "pending" => deliveries.pending = n,
                "delivering" => deliveries.delivering = n,
                "delivered" => deliveries.delivered = n,
                _ => deliveries.failed = n,
            }
        }
        let failures: Vec<FailedDelivery> = sqlx::query_as(
            "SELECT id, event, attempts, last_status, last_error, created_at
             FROM webhook_deliveries WHERE webhook_id = $1 AND state = 'failed'
             ORDER BY created_at DESC LIMIT $2",
        )
        .bind(row.id)
        .bind(FAILURES_SHOWN)
        .fetch_all(pool)
        .await?;
        out.push(WebhookSummary {
            id: row.id,
            team: row.team,
            url: row.url,
            kind: row.kind,
            events: row.events,
            channels: row.channels,
            allow_private: row.allow_private,
            created_by: row.created_by,
            created_at: row.created_at,
            paused_at: row.paused_at,
            paused_by: row.paused_by,
            deliveries,
            failures,
        });
    }
    Ok(out)
}
