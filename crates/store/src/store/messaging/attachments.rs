//! Attachments: small files on messages and tasks.
//!
//! At most 256 KiB each and 8 per message or task. Every upload counts
//! against the team's byte quota, checked and charged in the same transaction
//! as the insert, under the quota row's lock: two concurrent uploads take
//! turns, so they cannot both take the last bytes. Who may read an attachment
//! is who may read its owner: a task's are team-wide, a message's follow the
//! message (a DM's only its sender and recipient windows).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};
use crate::store::requests::Writer;
use crate::store::{identity::sessions, operations::usage, text};

pub const ATTACHMENT_MAX_BYTES: usize = 256 * 1024;
pub const PER_OWNER_MAX: i64 = 8;
pub const FILENAME_MAX_BYTES: usize = 255;
pub const CONTENT_TYPE_MAX_BYTES: usize = 127;
/// The quota a team starts with; `ai-crew-sync team quota` changes it.
pub const TEAM_QUOTA_DEFAULT_BYTES: i64 = 1024 * 1024 * 1024;

/// A checked upload, decoded and ready to store.
#[derive(Clone, Debug)]
pub struct Upload {
    pub filename: String,
    pub content_type: String,
    pub data: Vec<u8>,
}

/// What listings show of an attachment (never its bytes).
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct AttachmentInfo {
    pub id: Uuid,
    pub filename: String,
    pub content_type: String,
    pub size_bytes: i32,
}

/// `get_attachment`'s answer.
#[derive(Clone, Debug, Serialize)]
pub struct AttachmentData {
    pub id: Uuid,
    pub filename: String,
    pub content_type: String,
    pub size_bytes: i32,
    pub sha256: String,
    pub data_base64: String,
    /// The uploader's address.
    pub uploaded_by: String,
    pub created_at: DateTime<Utc>,
    pub message_id: Option<Uuid>,
    pub task: Option<String>,
}

/// Check and decode one upload; nothing is written.
pub fn decode(filename: &str, content_type: &str, data_base64: &str) -> BusResult<Upload> {
    let filename = text::one_line("attachment filename", filename)?;
    if filename.is_empty()
        || filename.len() > FILENAME_MAX_BYTES
        || filename.chars().any(|c| c == '/' || c == '\\')
    {
        return Err(BusError::invalid(format!(
            "attachment filename {} is not valid: 1-{FILENAME_MAX_BYTES} bytes of one line, no \
             slashes (for example `trace.log`).",
            text::quote(&filename)
        )));
    }
    let content_type = text::one_line("content_type", content_type)?;
    if content_type.is_empty()
        || content_type.len() > CONTENT_TYPE_MAX_BYTES
        || !content_type.contains('/')
        || content_type
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(BusError::invalid(format!(
            "content_type {} is not a media type such as `text/plain` or \
             `application/json` (at most {CONTENT_TYPE_MAX_BYTES} bytes).",
            text::quote(&content_type)
        )));
    }
    // Reject before decoding what cannot fit: base64 is 4 bytes per 3.
    if data_base64.len() > ATTACHMENT_MAX_BYTES.div_ceil(3) * 4 + 4 {
        return Err(too_big(data_base64.len() / 4 * 3));
    }
    let data = STANDARD.decode(data_base64.trim()).map_err(|e| {
        BusError::invalid(format!(
            "data_base64 of {} is not standard base64 ({e}). Encode the file's bytes with \
             standard base64 (RFC 4648, with padding).",
            text::quote(&filename)
        ))
    })?;
    if data.len() > ATTACHMENT_MAX_BYTES {
        return Err(too_big(data.len()));
    }
    Ok(Upload {
        filename,
        content_type,
        data,
    })
}

fn too_big(size: usize) -> BusError {
    BusError::invalid(format!(
        "the attachment is {size} bytes; the limit is {ATTACHMENT_MAX_BYTES} (256 KiB) per file. Attach a \
         smaller excerpt, or split it across files (at most {PER_OWNER_MAX} per message or task)."
    ))
}

pub fn check_count(count: usize) -> BusResult<()> {
    if count as i64 > PER_OWNER_MAX {
        return Err(BusError::invalid(format!(
            "{count} attachments given; the limit is {PER_OWNER_MAX} per message or task. Zip them \
             together or spread them over several messages."
        )));
    }
    Ok(())
}

/// Where attachments hang.
#[derive(Clone, Copy, Debug)]
pub enum Owner {
    Message(Uuid),
    Task(Uuid),
}

/// Store `uploads` on `owner` inside the caller's transaction: the owner's
/// count and the team's quota are checked under locks, then charged.
pub(crate) async fn insert_all(
    conn: &mut PgConnection,
    me: &Identity,
    owner: Owner,
    uploads: &[Upload],
) -> BusResult<Vec<AttachmentInfo>> {
    if uploads.is_empty() {
        return Ok(Vec::new());
    }
    let (message_id, task_id) = match owner {
        Owner::Message(id) => (Some(id), None),
        Owner::Task(id) => (None, Some(id)),
    };
    let existing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM attachments
         WHERE team_id = $1 AND (message_id = $2 OR task_id = $3)",
    )
    .bind(me.team_id)
    .bind(message_id)
    .bind(task_id)
    .fetch_one(&mut *conn)
    .await?;
    if existing + uploads.len() as i64 > PER_OWNER_MAX {
        return Err(BusError::conflict(format!(
            "this already has {existing} attachment(s); the limit is {PER_OWNER_MAX} per message or \
             task. Attach to a new message instead."
        )));
    }
    let bytes: i64 = uploads.iter().map(|u| u.data.len() as i64).sum();
    // The caller checked the whole write against the quota (`usage`);
    // attachments are also checked exactly, under the quota row's lock, so
    // two concurrent uploads cannot both take its last bytes.
    let (limit, used) = lock_quota(conn, me.team_id).await?;
    if used + bytes > limit {
        return Err(BusError::conflict(format!(
            "the team's storage quota is {limit} bytes and attachments alone use {used}; these \
             {bytes} bytes do not fit, so nothing was written. An operator can trim old history \
             with `ai-crew-sync team prune --team {team} --older-than-days N` or raise the quota \
             with `ai-crew-sync team quota --team {team} --bytes N`.",
            team = me.team
        )));
    }
    sqlx::query("UPDATE team_quotas SET attachment_bytes_used = attachment_bytes_used + $2 WHERE team_id = $1")
        .bind(me.team_id)
        .bind(bytes)
        .execute(&mut *conn)
        .await?;
    let mut stored = Vec::with_capacity(uploads.len());
    for upload in uploads {
        let id = Uuid::new_v4();
        let sha256: [u8; 32] = Sha256::digest(&upload.data).into();
        sqlx::query(
            "INSERT INTO attachments (id, team_id, message_id, task_id, filename, content_type,
                                      size_bytes, data, sha256, uploaded_by, uploaded_session)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(id)
        .bind(me.team_id)
        .bind(message_id)
        .bind(task_id)
        .bind(&upload.filename)
        .bind(&upload.content_type)
        .bind(upload.data.len() as i32)
        .bind(&upload.data)
        .bind(&sha256[..])
        .bind(me.agent_id)
        .bind(&me.window)
        .execute(&mut *conn)
        .await?;
        stored.push(AttachmentInfo {
            id,
            filename: upload.filename.clone(),
            content_type: upload.content_type.clone(),
            size_bytes: upload.data.len() as i32,
        });
    }
    Ok(stored)
}

/// The team's quota row, created with the default on first use, locked.
pub(crate) async fn lock_quota(conn: &mut PgConnection, team_id: Uuid) -> BusResult<(i64, i64)> {
    sqlx::query(
        "INSERT INTO team_quotas (team_id, attachment_bytes_limit) VALUES ($1, $2)
         ON CONFLICT (team_id) DO NOTHING",
    )
    .bind(team_id)
    .bind(TEAM_QUOTA_DEFAULT_BYTES)
    .execute(&mut *conn)
    .await?;
    Ok(sqlx::query_as(
        "SELECT attachment_bytes_limit, attachment_bytes_used FROM team_quotas
         WHERE team_id = $1 FOR UPDATE",
    )
    .bind(team_id)
    .fetch_one(&mut *conn)
    .await?)
}

/// `attach_file`: one file on a task (by key).
pub async fn attach_to_task(
    w: &mut Writer,
    me: &Identity,
    task_key: &str,
    upload: Upload,
) -> BusResult<AttachmentInfo> {
    let task_key = text::lookup(task_key);
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    usage::check_quota(&mut *tx, me.team_id, &me.team, upload.data.len()).await?;
    // The task row's lock orders concurrent attaches to one task for the count.
    let task_id: Option<Uuid> =
        sqlx::query_scalar("SELECT id FROM tasks WHERE team_id = $1 AND key = $2 FOR UPDATE")
            .bind(me.team_id)
            .bind(&task_key)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(task_id) = task_id else {
        return Err(BusError::not_found(format!(
            "no task `{task_key}` in your team. list_tasks shows the keys."
        )));
    };
    let info = insert_all(
        &mut tx,
        me,
        Owner::Task(task_id),
        std::slice::from_ref(&upload),
    )
    .await?
    .remove(0);
    tx.commit().await?;
    w.emit(BusEvent::new(me.team_id, EventKind::Task, &task_key).by(me));
    Ok(info)
}

/// `get_attachment`: the bytes, if this window may read the owner.
pub async fn get(bus: &Bus, me: &Identity, id: Uuid) -> BusResult<AttachmentData> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: Uuid,
        filename: String,
        content_type: String,
        size_bytes: i32,
        sha256: Vec<u8>,
        data: Vec<u8>,
        uploaded_by: String,
        created_at: DateTime<Utc>,
        message_id: Option<Uuid>,
        task: Option<String>,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT a.id, a.filename, a.content_type, a.size_bytes, a.sha256, a.data, a.created_at,
                a.message_id, t.key AS task,
                CASE WHEN a.uploaded_session = '' THEN u.name ELSE u.name || '/' || a.uploaded_session END
                    AS uploaded_by
         FROM attachments a
         JOIN agents u ON u.team_id = a.team_id AND u.id = a.uploaded_by
         LEFT JOIN tasks t ON t.team_id = a.team_id AND t.id = a.task_id
         LEFT JOIN messages m ON m.team_id = a.team_id AND m.id = a.message_id
         WHERE a.team_id = $1 AND a.id = $2
           AND (a.task_id IS NOT NULL
                OR m.channel_id IS NOT NULL
                OR (m.recipient_id = $3 AND (m.recipient_session IS NULL OR m.recipient_session = $4))
                OR (m.sender_id = $3 AND m.sender_session = $4))",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(&bus.pool)
    .await?;
    let row = row.ok_or_else(|| {
        BusError::not_found(format!(
            "no attachment {id} that this window may read. Attachment ids come with the message or \
             task they belong to."
        ))
    })?;
    Ok(AttachmentData {
        id: row.id,
        filename: row.filename,
        content_type: row.content_type,
        size_bytes: row.size_bytes,
        sha256: hex::encode(row.sha256),
        data_base64: STANDARD.encode(row.data),
        uploaded_by: row.uploaded_by,
        created_at: row.created_at,
        message_id: row.message_id,
        task: row.task,
    })
}

/// `team quota` moved to [`crate::store::operations::usage`], where the quota now caps
/// everything a team stores; kept here under its first name.
pub use crate::store::operations::usage::{Quota, quota};
