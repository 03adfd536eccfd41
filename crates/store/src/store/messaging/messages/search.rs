//! `search_messages`: full text over what the caller may see.

use super::{MessageView, QUERY_MAX_BYTES, check_limit};
use crate::Bus;
use crate::auth::Identity;
use crate::error::{BusError, BusResult};
use crate::store::text;

/// What `search_messages` may return: channel messages and this window's DMs
/// (sent or received; $1 team, $2 agent, $3 window) whose searched part (the
/// first 100,000 characters) holds every literal of $6 and none of $7.
macro_rules! searchable {
    () => {
        "m.team_id = $1
         AND (m.channel_id IS NOT NULL
              OR (m.recipient_id = $2 AND (m.recipient_session IS NULL OR m.recipient_session = $3))
              OR (m.recipient_id IS NOT NULL AND m.sender_id = $2 AND m.sender_session = $3))
         AND NOT EXISTS (SELECT 1 FROM unnest($6::text[]) l WHERE strpos(left(m.body, 100000), l) = 0)
         AND NOT EXISTS (SELECT 1 FROM unnest($7::text[]) l WHERE strpos(left(m.body, 100000), l) > 0)"
    };
}

/// How many of the newest matches a word search ranks: a word in every
/// message ranks this many, not the history.
pub const SEARCH_CANDIDATES: i64 = 1000;

/// `search_messages`: full text over channel messages and this window's DMs
/// (sent or received), best match first among the newest
/// [`SEARCH_CANDIDATES`] matches; emoji and other symbols the full
/// text drops match as written ([`text::Literals`]).
pub async fn search(
    bus: &Bus,
    me: &Identity,
    query: &str,
    limit: Option<i64>,
) -> BusResult<Vec<MessageView>> {
    let limit = check_limit(limit)?;
    let query = text::lookup(query);
    if query.is_empty() || query.len() > QUERY_MAX_BYTES {
        return Err(BusError::invalid(format!(
            "query must be 1-{QUERY_MAX_BYTES} bytes of words to look for (got {} bytes); quotes, \
             OR and -word work as in a web search.",
            query.len()
        )));
    }
    let literals = text::Literals::of(&query);
    let sql = if text::has_words(&bus.pool, "simple", &query, &literals).await? {
        // Ranked within a bounded candidate set: the newest
        // SEARCH_CANDIDATES matches by position. The planner walks the
        // position index back for a common word (stopping at the set) or
        // the GIN index for a rare one (all its matches, however old).
        concat!(
            "SELECT ",
            view_columns_from!(),
            " FROM (
                 SELECT c.id, ts_rank(c.search, c.q) AS rank, c.created_at FROM (
                     SELECT m.id, m.search, m.created_at, q.q
                     FROM messages m, websearch_to_tsquery('simple', $4) AS q (q)
                     WHERE m.search @@ q.q AND ",
            searchable!(),
            "        ORDER BY m.position DESC LIMIT $8) c
                 ORDER BY rank DESC, c.created_at DESC LIMIT $5)",
            page_lookup!(),
            view_joins!(),
            " WHERE m.team_id = $1 ORDER BY page_ids.rank DESC, page_ids.created_at DESC"
        )
    } else {
        // Only symbols: no index helps, so this reads the team's history
        // newest first until it has `limit` hits (much of it, if few match).
        concat!(
            "SELECT ",
            view_columns!(),
            " WHERE ",
            searchable!(),
            " ORDER BY m.position DESC LIMIT $5"
        )
    };
    // Planned with its own words: a generic plan cannot tell a word in
    // every message from a rare one. The statement stays prepared (parsed
    // once a connection); `force_custom_plan` plans each call anew.
    let mut tx = crate::store::custom_plans(&bus.pool).await?;
    let found = sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(&query)
        .bind(limit)
        .bind(&literals.required)
        .bind(&literals.excluded)
        .bind(SEARCH_CANDIDATES)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(found)
}
