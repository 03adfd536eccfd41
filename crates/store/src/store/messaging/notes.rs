//! Notes: the team's shared memory. A note is a text value under a key inside
//! a scope (`global` unless said otherwise), with up to 16 tags.
//!
//! Every change keeps a revision (number, value, tags, author agent and
//! window, time), deletions included, so nothing a teammate wrote is lost to
//! an overwrite. A `set_note` that changes nothing (same value, same tags) is
//! not a change: no revision, no event. A deleted note keeps its row (value
//! and tags emptied, `deleted_at` set) so its revision numbers keep growing
//! if the key is set again; reads treat it as absent.
//!
//! Keys are case-sensitive one-line text, tags one-line and lower-cased
//! (`store::text`: trimmed, NFC); scopes are ASCII, lower-cased. Search is
//! PostgreSQL full text (English stemming) over the key, the tags and the
//! first 100,000 characters of the value, plus emoji and other symbols as
//! written. Listings show a preview, never whole values: a value can be 1 MiB.
//!
//! Changes emit a `note` event after commit (id = the key), which wakes
//! waiting windows of the team.
//!
//! Size: about 650 lines of one concept (a note's write, read and search share
//! the key, scope and tag rules), plus its unit tests.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::events::{BusEvent, EventKind};
use crate::store::messaging::attachments::TEAM_QUOTA_DEFAULT_BYTES;
use crate::store::requests::Writer;
use crate::store::{fenced, identity::sessions, limits, operations::usage, text};

pub const DEFAULT_SCOPE: &str = "global";
pub const SCOPE_MAX_BYTES: usize = 64;
pub const KEY_MAX_BYTES: usize = 256;
pub const VALUE_MAX_BYTES: usize = 1024 * 1024;
pub const TAGS_MAX: usize = 16;
pub const TAG_MAX_BYTES: usize = 64;
pub const QUERY_MAX_BYTES: usize = 1024;
/// Characters of the value shown in listings and search results (the literal
/// in `summary_columns!` must match).
pub const PREVIEW_CHARS: usize = 160;
/// Most notes a listing returns (most recently updated first).
pub const LISTED_MAX: i64 = 200;
/// Most notes a search returns (best match first).
pub const FOUND_MAX: i64 = 50;
/// A search ranks only the most recently updated notes that match, at most
/// this many, so its cost is bounded by its page, not by the team's notes.
pub const RANKED_AMONG: i64 = 500;

/// Scopes: trimmed, lower-cased, ASCII letters, digits and `._:/-`, starting
/// with a letter or digit, 1..=64 bytes. `None` or empty is [`DEFAULT_SCOPE`].
pub fn normalize_scope(raw: Option<&str>) -> BusResult<String> {
    let scope = raw.unwrap_or("").trim().to_ascii_lowercase();
    if scope.is_empty() {
        return Ok(DEFAULT_SCOPE.to_string());
    }
    let ok = scope.len() <= SCOPE_MAX_BYTES
        && scope.as_bytes()[0].is_ascii_alphanumeric()
        && scope
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'));
    if !ok {
        return Err(BusError::invalid(format!(
            "scope {} is not valid: use 1-{SCOPE_MAX_BYTES} ASCII letters, digits and `._:/-`, \
             starting with a letter or digit (for example `global` or `project:web`). Nothing was \
             written. Omit scope for `{DEFAULT_SCOPE}`.",
            text::quote(raw.unwrap_or_default())
        )));
    }
    Ok(scope)
}

/// A key to write: one line ([`text::one_line`]), 1..=256 bytes; case is kept.
pub fn check_key(raw: &str) -> BusResult<String> {
    let key = text::one_line("note key", raw)?;
    check_key_size(key)
}

/// A key to look up: normalised like [`check_key`], never refused for its
/// characters ([`text::lookup`]).
pub fn lookup_key(raw: &str) -> BusResult<String> {
    check_key_size(text::lookup(raw))
}

fn check_key_size(key: String) -> BusResult<String> {
    if key.is_empty() {
        return Err(BusError::invalid(
            "key is empty; a note needs a key of 1-256 bytes (for example `build/commands`). \
             Nothing was written.",
        ));
    }
    limits::bytes_at_most_spelled(
        key.len(),
        KEY_MAX_BYTES,
        "key",
        "Nothing was written. Use a short key and put the detail in the value.",
    )?;
    Ok(key)
}

/// A tag to write: one line, lower-cased, 1..=64 bytes.
fn normalize_tag(raw: &str) -> BusResult<String> {
    check_tag_size(raw, text::one_line_lower("tag", raw)?)
}

fn check_tag_size(raw: &str, tag: String) -> BusResult<String> {
    if tag.is_empty() || tag.len() > TAG_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "tag {} is not valid: each tag is 1-{TAG_MAX_BYTES} bytes of one-line text (this one \
             is {} bytes). Nothing was written. Use short tags such as `ci` or `decision`.",
            text::quote(raw),
            tag.len()
        )));
    }
    Ok(tag)
}

/// Tags: at most 16 given (duplicates count), each normalised, duplicates
/// merged, sorted.
pub fn normalize_tags(raw: &[String]) -> BusResult<Vec<String>> {
    // The raw length, before any per-tag work.
    if raw.len() > TAGS_MAX {
        return Err(BusError::invalid(format!(
            "tags holds {} entries; a note has at most {TAGS_MAX} tags (duplicates count). \
             Nothing was written. Give each tag once, keep the ones that help find the note and \
             put the rest in the value.",
            raw.len()
        )));
    }
    let mut tags = raw
        .iter()
        .map(|t| normalize_tag(t))
        .collect::<BusResult<Vec<_>>>()?;
    tags.sort();
    tags.dedup();
    Ok(tags)
}

fn check_value(value: &str) -> BusResult<()> {
    limits::bytes_at_most_spelled(
        value.len(),
        VALUE_MAX_BYTES,
        "value",
        "Nothing was written. Split it across several notes (for example `{key}/part-1`, \
         `{key}/part-2`) or keep only what teammates need.",
    )
}

/// The answer to `set_note`.
#[derive(Clone, Debug, Serialize)]
pub struct NoteSet {
    pub scope: String,
    pub key: String,
    /// The note's revision after this call.
    pub revision: i64,
    /// False when the note already held this value and these tags: nothing
    /// was written and no revision was added.
    pub changed: bool,
    /// True when this call created the note (or set it again after a delete).
    pub created: bool,
    pub tags: Vec<String>,
    pub bytes: i64,
    pub updated_at: DateTime<Utc>,
    /// Who made the note's current revision: `agent` or `agent/window`.
    pub updated_by: String,
}

/// A whole note, as `get_note` returns it (beside its scope and key).
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Note {
    pub value: String,
    pub tags: Vec<String>,
    pub revision: i64,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    pub updated_at: DateTime<Utc>,
    pub updated_by: String,
}

/// The answer to `get_note`: `found` says whether `note` is there.
#[derive(Clone, Debug, Serialize)]
pub struct NoteLookup {
    pub found: bool,
    pub scope: String,
    pub key: String,
    #[serde(flatten)]
    pub note: Option<Note>,
    /// When the note was deleted, if it existed and was deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<DateTime<Utc>>,
}

/// A note in a listing: everything but the value, plus a preview of it.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct NoteSummary {
    pub scope: String,
    pub key: String,
    pub tags: Vec<String>,
    /// Size of the whole value in bytes.
    pub bytes: i64,
    /// The value's first characters (160 at most).
    pub preview: String,
    /// True when the preview is not the whole value: call get_note for it.
    pub preview_truncated: bool,
    pub revision: i64,
    pub updated_at: DateTime<Utc>,
    pub updated_by: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct NoteList {
    pub notes: Vec<NoteSummary>,
    /// True when more notes matched than a listing returns (200): narrow by
    /// scope or tag, or use search_notes.
    pub truncated: bool,
}

/// A search hit: the summary plus the passages that matched.
#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct NoteHit {
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub note: NoteSummary,
    /// Passages of the value around the matched words (in `**bold**`); the
    /// start of the value when only the key or tags matched.
    pub snippet: String,
    pub rank: f32,
}

#[derive(Clone, Debug, Serialize)]
pub struct SearchResult {
    pub query: String,
    pub results: Vec<NoteHit>,
    /// True when more notes matched than a search returns (50).
    pub truncated: bool,
}

/// The answer to `delete_note`.
#[derive(Clone, Debug, Serialize)]
pub struct NoteDeleted {
    pub scope: String,
    pub key: String,
    /// False when there was no such note (or it was already deleted): nothing changed.
    pub deleted: bool,
    /// The revision that records the deletion.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
}

/// The address (`agent` or `agent/window`) of a note's last author, over
/// `notes n JOIN agents u`; macros so queries can `concat!` a literal.
macro_rules! updated_by {
    () => {
        "CASE WHEN n.updated_by_session = '' THEN u.name
              ELSE u.name || '/' || n.updated_by_session END"
    };
}

/// The columns of a [`NoteSummary`] over `notes n JOIN agents u`.
macro_rules! summary_columns {
    () => {
        concat!(
            "n.scope, n.key, n.tags, octet_length(n.value)::bigint AS bytes,
             left(n.value, 160) AS preview, length(n.value) > 160 AS preview_truncated,
             n.revision, n.updated_at, ",
            updated_by!(),
            " AS updated_by"
        )
    };
}

/// A note holds every literal of `$5` and none of `$6` ([`text::Literals`])
/// in its key, tags or the searched part of its value.
macro_rules! literals_match {
    () => {
        "NOT EXISTS (SELECT 1 FROM unnest($5::text[]) l
                     WHERE strpos(n.key || ' ' || array_to_string(n.tags, ' ') || ' '
                                  || left(n.value, 100000), l) = 0)
         AND NOT EXISTS (SELECT 1 FROM unnest($6::text[]) l
                         WHERE strpos(n.key || ' ' || array_to_string(n.tags, ' ') || ' '
                                      || left(n.value, 100000), l) > 0)"
    };
}

/// `notes n` joined to its last author `u`.
macro_rules! notes_with_author {
    () => {
        "notes n JOIN agents u ON u.team_id = n.team_id AND u.id = n.updated_by_agent_id"
    };
}

/// `set_note`: create or replace a note. `tags: None` keeps the current tags
/// (none on a new note); `Some(vec![])` clears them. One round trip:
/// `store_note` (migration 0033) runs the write fence, the quota (the value
/// is stored twice: on the note and in its revision), the upsert and the
/// revision.
pub async fn set(
    w: &mut Writer,
    me: &Identity,
    scope: Option<&str>,
    key: &str,
    value: &str,
    tags: Option<&[String]>,
) -> BusResult<NoteSet> {
    let scope = normalize_scope(scope)?;
    let key = check_key(key)?;
    check_value(value)?;
    let tags = tags.map(normalize_tags).transpose()?;

    #[derive(serde::Deserialize)]
    struct Stored {
        revision: i64,
        created: bool,
        tags: Vec<String>,
        bytes: i64,
        updated_at: DateTime<Utc>,
        updated_by: String,
    }
    let (outcome, detail) = fenced::call(
        "SELECT refusal, session_epoch, refused_since, outcome, detail
         FROM store_note($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        me,
    )
    .bind(&me.window)
    .bind(Uuid::new_v4())
    .bind(&scope)
    .bind(&key)
    .bind(value)
    .bind(&tags)
    .bind(TEAM_QUOTA_DEFAULT_BYTES)
    .fetch_one(w.conn())
    .await?
    .outcome(me)?;
    if outcome == "quota" {
        return Err(usage::QuotaRefusal::from_detail(detail)?.refusal(&me.team));
    }
    let changed = outcome == "set";
    let stored: Stored = fenced::detail(detail)?;
    if changed {
        w.emit(BusEvent::new(me.team_id, EventKind::Note, key.clone()).by(me));
    }
    Ok(NoteSet {
        scope,
        key,
        revision: stored.revision,
        changed,
        created: stored.created,
        tags: stored.tags,
        bytes: stored.bytes,
        updated_at: stored.updated_at,
        updated_by: stored.updated_by,
    })
}

/// `get_note`: the whole note, or `found: false` (not an error).
pub async fn get(
    bus: &Bus,
    me: &Identity,
    scope: Option<&str>,
    key: &str,
) -> BusResult<NoteLookup> {
    let scope = normalize_scope(scope)?;
    let key = lookup_key(key)?;
    #[derive(sqlx::FromRow)]
    struct Row {
        deleted_at: Option<DateTime<Utc>>,
        #[sqlx(flatten)]
        note: Note,
    }
    let row: Option<Row> = sqlx::query_as(concat!(
        "SELECT n.deleted_at, n.value, n.tags, n.revision, n.created_at,
                CASE WHEN n.created_by_session = '' THEN c.name
                     ELSE c.name || '/' || n.created_by_session END AS created_by,
                n.updated_at, ",
        updated_by!(),
        " AS updated_by FROM ",
        notes_with_author!(),
        " JOIN agents c ON c.team_id = n.team_id AND c.id = n.created_by_agent_id
          WHERE n.team_id = $1 AND n.scope = $2 AND n.key = $3"
    ))
    .bind(me.team_id)
    .bind(&scope)
    .bind(&key)
    .fetch_optional(&bus.pool)
    .await?;
    let (note, deleted_at) = match row {
        Some(Row {
            deleted_at: None,
            note,
        }) => (Some(note), None),
        Some(Row { deleted_at, .. }) => (None, deleted_at),
        None => (None, None),
    };
    Ok(NoteLookup {
        found: note.is_some(),
        scope,
        key,
        note,
        deleted_at,
    })
}

/// `list_notes`: notes of one scope (or every scope when `scope` is None),
/// optionally only those carrying `tag`; most recently updated first.
pub async fn list(
    bus: &Bus,
    me: &Identity,
    scope: Option<&str>,
    tag: Option<&str>,
) -> BusResult<NoteList> {
    let scope = scope
        .filter(|s| !s.trim().is_empty())
        .map(|s| normalize_scope(Some(s)))
        .transpose()?;
    let tag = tag
        .filter(|t| !t.trim().is_empty())
        .map(|t| check_tag_size(t, text::lookup_lower(t)))
        .transpose()?;
    let mut notes: Vec<NoteSummary> = sqlx::query_as(concat!(
        "SELECT ",
        summary_columns!(),
        " FROM ",
        notes_with_author!(),
        " WHERE n.team_id = $1 AND n.deleted_at IS NULL
            AND ($2::text IS NULL OR n.scope = $2)
            AND ($3::text IS NULL OR n.tags @> ARRAY[$3::text])
          ORDER BY n.updated_at DESC, n.scope, n.key
          LIMIT $4"
    ))
    .bind(me.team_id)
    .bind(&scope)
    .bind(&tag)
    .bind(LISTED_MAX + 1)
    .fetch_all(&bus.pool)
    .await?;
    let truncated = limits::cut_page(&mut notes, LISTED_MAX);
    Ok(NoteList { notes, truncated })
}

/// `search_notes`: full-text search (web-search syntax: words, "quoted
/// phrases", `or`, `-excluded`) over key, tags and value; best match first.
pub async fn search(
    bus: &Bus,
    me: &Identity,
    query: &str,
    scope: Option<&str>,
) -> BusResult<SearchResult> {
    let query = text::lookup(query);
    if query.is_empty() {
        return Err(BusError::invalid(
            "query is empty. Give a few words to look for (for example `deploy staging`); \
             list_notes shows every note without searching.",
        ));
    }
    limits::bytes_at_most(
        query.len(),
        QUERY_MAX_BYTES,
        "query",
        "Search for a few distinctive words instead of a passage.",
    )?;
    let scope = scope
        .filter(|s| !s.trim().is_empty())
        .map(|s| normalize_scope(Some(s)))
        .transpose()?;
    let literals = text::Literals::of(&query);
    let sql = if text::has_words(&bus.pool, "english", &query, &literals).await? {
        // Ranked within the RANKED_AMONG most recently updated matches: a
        // word in every note walks the recency index and stops there,
        // instead of ranking the team's every note.
        concat!(
            "SELECT ",
            summary_columns!(),
            ", ts_headline('english', left(n.value, 100000), q,
                                'StartSel=**, StopSel=**, MaxFragments=2, MaxWords=24, MinWords=8, FragmentDelimiter=\" … \"')
                        AS snippet,
                    ts_rank(n.search, q) AS rank
             FROM (SELECT n.* FROM notes n
                    WHERE n.team_id = $1 AND n.deleted_at IS NULL
                      AND n.search @@ websearch_to_tsquery('english', $2)
                      AND ($3::text IS NULL OR n.scope = $3)
                      AND ",
            literals_match!(),
            "     ORDER BY n.updated_at DESC
                    LIMIT $7) n
             JOIN agents u ON u.team_id = n.team_id AND u.id = n.updated_by_agent_id,
             websearch_to_tsquery('english', $2) q
             ORDER BY rank DESC, n.updated_at DESC
             LIMIT $4"
        )
    } else {
        // Only symbols: no index can help (full text drops them), so this
        // reads the team's notes, most recently updated first.
        concat!(
            "SELECT ",
            summary_columns!(),
            ", CASE WHEN cardinality($5::text[]) > 0 AND strpos(left(n.value, 100000), $5[1]) > 0
                    THEN replace(substr(n.value, greatest(1, strpos(n.value, $5[1]) - 60), 160),
                                 $5[1], '**' || $5[1] || '**')
                    ELSE left(n.value, 160) END AS snippet,
                    0::real AS rank
             FROM ",
            notes_with_author!(),
            " WHERE n.team_id = $1 AND n.deleted_at IS NULL
                AND ($3::text IS NULL OR n.scope = $3)
                AND ",
            literals_match!(),
            " ORDER BY n.updated_at DESC
              LIMIT $4"
        )
    };
    let mut results: Vec<NoteHit> = sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(&query)
        .bind(&scope)
        .bind(FOUND_MAX + 1)
        .bind(&literals.required)
        .bind(&literals.excluded)
        .bind(RANKED_AMONG)
        .fetch_all(&bus.pool)
        .await?;
    let truncated = limits::cut_page(&mut results, FOUND_MAX);
    Ok(SearchResult {
        query,
        results,
        truncated,
    })
}

/// `delete_note`: delete a note, recording the deletion as a revision.
/// Deleting a missing (or already deleted) note answers `deleted: false`.
pub async fn delete(
    w: &mut Writer,
    me: &Identity,
    scope: Option<&str>,
    key: &str,
) -> BusResult<NoteDeleted> {
    let scope = normalize_scope(scope)?;
    let key = lookup_key(key)?;
    let mut tx = w.begin().await?;
    sessions::guard(&mut tx, me).await?;
    let deleted: Option<(Uuid, i64)> = sqlx::query_as(
        "UPDATE notes SET value = '', tags = '{}', revision = revision + 1, deleted_at = now(),
                          updated_at = now(), updated_by_agent_id = $4, updated_by_session = $5
         WHERE team_id = $1 AND scope = $2 AND key = $3 AND deleted_at IS NULL
         RETURNING id, revision",
    )
    .bind(me.team_id)
    .bind(&scope)
    .bind(&key)
    .bind(me.agent_id)
    .bind(&me.window)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((id, revision)) = deleted else {
        tx.commit().await?;
        return Ok(NoteDeleted {
            scope,
            key,
            deleted: false,
            revision: None,
        });
    };
    sqlx::query(
        "INSERT INTO note_revisions (team_id, note_id, revision, action, author_agent_id, author_session)
         VALUES ($1, $2, $3, 'delete', $4, $5)",
    )
    .bind(me.team_id)
    .bind(id)
    .bind(revision)
    .bind(me.agent_id)
    .bind(&me.window)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    w.emit(BusEvent::new(me.team_id, EventKind::Note, key.clone()).by(me));
    Ok(NoteDeleted {
        scope,
        key,
        deleted: true,
        revision: Some(revision),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_keys_and_tags_are_normalised_or_refused() {
        assert_eq!(normalize_scope(None).unwrap(), "global");
        assert_eq!(normalize_scope(Some("  ")).unwrap(), "global");
        assert_eq!(
            normalize_scope(Some(" Project:Web/API ")).unwrap(),
            "project:web/api"
        );
        assert!(normalize_scope(Some("-x")).is_err());
        assert!(normalize_scope(Some("a b")).is_err());
        assert!(normalize_scope(Some(&"s".repeat(65))).is_err());
        assert_eq!(check_key(" Build Commands ").unwrap(), "Build Commands");
        assert!(check_key("a\nb").is_err());
        assert!(check_key(&"k".repeat(257)).is_err());
        assert_eq!(
            normalize_tags(&["CI".into(), "ci".into(), " deploy ".into()]).unwrap(),
            vec!["ci", "deploy"]
        );
        assert!(normalize_tags(&["".into()]).is_err());
    }
}
