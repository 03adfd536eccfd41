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

/// `search_messages`: full text over channel messages and this window's DMs
/// (sent or received), best match first; emoji and other symbols the full
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
        concat!(
            "SELECT ",
            view_columns!(),
            " , websearch_to_tsquery('simple', $4) AS q WHERE m.search @@ q AND ",
            searchable!(),
            " ORDER BY ts_rank(m.search, q) DESC, m.created_at DESC LIMIT $5"
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
    Ok(sqlx::query_as(sql)
        .bind(me.team_id)
        .bind(me.agent_id)
        .bind(&me.window)
        .bind(&query)
        .bind(limit)
        .bind(&literals.required)
        .bind(&literals.excluded)
        .fetch_all(&bus.pool)
        .await?)
}
