//! Seeding a team's history with set-based SQL (`INSERT … SELECT
//! generate_series`) on the real schema: every row is one the bus itself
//! could have written, every constraint holds, and the triggers run (seat
//! activity is written by its trigger when the seats are inserted).
//!
//! A history has a fixed cast (40 agents, `bench` and `a01`..`a39`, each
//! with 3 windows `w1`..`w3` of which two are live; 50 channels) and
//! a size that scales everything else together: channel and direct
//! messages, tasks with their events, notes with their revisions, and one
//! conversation with its receipts. `SMALL` is 1 000 messages (and a full
//! page of tasks and notes); `LARGE` is a thousand times the messages.

use anyhow::{Context as _, Result};
use sqlx::PgPool;
use uuid::Uuid;

use ai_crew_sync::store::{Actor, Source, identity::agents};

/// The rare word of messages: in message 1 and every 100 000th after it.
pub const RARE_WORD: &str = "xylophone";
/// The word in every message.
pub const COMMON_WORD: &str = "work";
/// The rare word of notes: in note 1 and every 1 000th after it.
pub const RARE_NOTE_WORD: &str = "quokka";
/// Seats of the conversation: `bench/desk` (the one measured) and three
/// other agents' shared windows; each message has the other three seats as
/// recipients.
const SEATS: i64 = 4;

/// How much history a team gets.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub name: &'static str,
    /// Channel and direct messages together.
    pub messages: i64,
    pub tasks: i64,
    pub notes: i64,
    /// Messages of the one conversation.
    pub conversation_messages: i64,
}

pub const SMALL: Size = Size {
    name: "small",
    messages: 1_000,
    // At least a full page of what list_tasks (open tasks) and list_notes
    // return, so the pair compares pages, not a short answer with a long one.
    tasks: 2_000,
    notes: 400,
    conversation_messages: 100,
};

pub const LARGE: Size = Size {
    name: "large",
    messages: 1_000_000,
    tasks: 20_000,
    notes: 10_000,
    conversation_messages: 100_000,
};

/// A seeded team: what the measured calls need.
pub struct Team {
    pub id: Uuid,
    /// Agent `bench` and its token.
    pub agent_id: Uuid,
    pub token: String,
    pub task_key: String,
    pub conversation_id: Uuid,
    /// `after_seq` of the deep page: the last 50 messages of the conversation.
    pub deep_after_seq: i64,
    /// A message in the middle of the conversation, sent by `bench/desk`.
    pub receipts_message_id: Uuid,
}

/// Create team `hist-<size>` and seed it; returns the team.
pub async fn seed(pool: &PgPool, size: Size) -> Result<Team> {
    let actor = Actor {
        name: "bench".into(),
        source: Source::Cli,
        admin_credential: None,
    };
    let slug = format!("hist-{}", size.name);
    let token = agents::quickstart(pool, &slug, "bench", &actor)
        .await
        .with_context(|| format!("creating team {slug}"))?
        .issued
        .token;
    let (id, agent_id): (Uuid, Uuid) = sqlx::query_as(
        "UPDATE teams t SET conversations_enabled = true FROM agents a
         WHERE a.team_id = t.id AND t.slug = $1 AND a.name = 'bench'
         RETURNING t.id, a.id",
    )
    .bind(&slug)
    .fetch_one(pool)
    .await
    .context("turning conversations on")?;
    let mut tx = pool.begin().await?;
    for &(what, sql) in CAST {
        sqlx::query(sql)
            .bind(id)
            .bind(agent_id)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("seeding {what}"))?;
    }
    sqlx::query(MESSAGES)
        .bind(id)
        .bind(size.messages)
        .execute(&mut *tx)
        .await
        .context("seeding messages")?;
    sqlx::query(MESSAGE_COUNTERS)
        .bind(id)
        .bind(size.messages)
        .execute(&mut *tx)
        .await
        .context("seeding the message counters")?;
    for (what, sql, count) in [
        ("tasks", TASKS, size.tasks),
        ("task events", TASK_EVENTS, size.tasks),
        ("notes", NOTES, size.notes),
        ("note revisions", NOTE_REVISIONS, size.notes),
        ("the conversation", CONVERSATION, size.conversation_messages),
        ("its seats", SEATS_SQL, size.conversation_messages),
        (
            "its messages",
            CONVERSATION_MESSAGES,
            size.conversation_messages,
        ),
        ("its receipts", RECEIPTS, size.conversation_messages),
    ] {
        sqlx::query(sql)
            .bind(id)
            .bind(count)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("seeding {what}"))?;
    }
    tx.commit().await?;
    for statement in [
        "VACUUM ANALYZE messages",
        "VACUUM ANALYZE tasks",
        "VACUUM ANALYZE task_events",
        "VACUUM ANALYZE notes",
        "VACUUM ANALYZE note_revisions",
        "VACUUM ANALYZE conversation_messages",
        "VACUUM ANALYZE message_receipts",
    ] {
        sqlx::query(statement)
            .execute(pool)
            .await
            .with_context(|| statement.to_string())?;
    }
    let conversation_id: Uuid =
        sqlx::query_scalar("SELECT id FROM conversations WHERE team_id = $1")
            .bind(id)
            .fetch_one(pool)
            .await?;
    // Sent by bench/desk (seq = 1 mod 4), in the middle of the conversation.
    let receipts_message_id: Uuid = sqlx::query_scalar(
        "SELECT id FROM conversation_messages
         WHERE team_id = $1 AND conversation_id = $2 AND seq = ($3 / 2 / $4) * $4 + 1",
    )
    .bind(id)
    .bind(conversation_id)
    .bind(size.conversation_messages)
    .bind(SEATS)
    .fetch_one(pool)
    .await?;
    Ok(Team {
        id,
        agent_id,
        token,
        task_key: format!("task-{}", size.tasks / 2),
        conversation_id,
        deep_after_seq: size.conversation_messages - 50,
        receipts_message_id,
    })
}

/// The fixed cast; binds $1 team, $2 agent `bench`.
const CAST: &[(&str, &str)] = &[
    (
        "agents",
        "INSERT INTO agents (id, team_id, name)
         SELECT gen_random_uuid(), $1, 'a' || lpad(g::text, 2, '0')
         FROM generate_series(1, 39) AS g WHERE $2::uuid IS NOT NULL",
    ),
    (
        "windows",
        "INSERT INTO presence (team_id, agent_id, session, status, project, role, ttl_seconds,
                               first_seen_at, last_seen_at, expires_at)
         SELECT $1, a.id, 'w' || w, 'active', 'proj-' || (w % 3), 'role-' || (w % 2), 3600,
                now() - interval '1 day', now() - make_interval(mins => w),
                CASE WHEN w < 3 THEN now() + interval '1 hour' ELSE now() - interval '1 hour' END
         FROM agents a CROSS JOIN generate_series(1, 3) AS w
         WHERE a.team_id = $1 AND $2::uuid IS NOT NULL",
    ),
    (
        "channels",
        "INSERT INTO channels (id, team_id, name, topic, created_by)
         SELECT gen_random_uuid(), $1, 'ch-' || lpad(g::text, 2, '0'), 'channel ' || g, $2
         FROM generate_series(1, 50) AS g",
    ),
];

/// THE MESSAGES STATEMENT: every channel and direct message of a history,
/// in one statement (binds $1 team, $2 count). Message g (1..count) is the
/// g-th in commit order: its per-team `position` is `g`, and
/// [`MESSAGE_COUNTERS`] then sets the team's counter to `count` and each
/// channel's counters, as a post keeps them.
///
/// One message in 5 is a DM to an agent as a whole (every window),
/// round-robin over the 40 agents, so `bench` gets count/200; the rest go
/// round-robin to the 50 channels. Senders are round-robin too, from their
/// window `w1`; times spread over the last 30 days, oldest first. Every
/// body holds COMMON_WORD; RARE_WORD is in message 1 and every 100 000th.
const MESSAGES: &str = "
    WITH cast_ AS (
        SELECT (SELECT array_agg(id ORDER BY name) FROM channels WHERE team_id = $1) AS channels,
               (SELECT array_agg(id ORDER BY name) FROM agents WHERE team_id = $1) AS agents)
    INSERT INTO messages (id, team_id, position, channel_id, sender_id, sender_session,
                          recipient_id, recipient_session, body, created_at)
    SELECT gen_random_uuid(), $1, g,
           CASE WHEN g % 5 <> 0 THEN c.channels[1 + g % 50] END,
           c.agents[1 + g % 40], 'w1',
           CASE WHEN g % 5 = 0 THEN c.agents[1 + (g / 5 + 1) % 40] END,
           NULL,
           'message ' || g || ' about the work at hand, with a few more words of status'
               || CASE WHEN g % 100000 = 1 THEN ' xylophone' ELSE '' END,
           now() - make_interval(secs => ($2 - g) * 2592000.0 / $2)
    FROM generate_series(1, $2) AS g CROSS JOIN cast_ c
    ORDER BY g";

/// The counters a post keeps (binds $1 team, $2 count): the team's last
/// position, and each channel's message count, last position and time.
const MESSAGE_COUNTERS: &str = "
    WITH team_ AS (
        INSERT INTO message_counters (team_id, last_position) VALUES ($1, $2)
        ON CONFLICT (team_id) DO UPDATE SET last_position = EXCLUDED.last_position)
    UPDATE channels c SET message_count = s.n, last_position = s.last_position,
                          last_message_at = s.last_at
    FROM (SELECT channel_id, count(*) AS n, max(position) AS last_position,
                 max(created_at) AS last_at
          FROM messages WHERE team_id = $1 AND channel_id IS NOT NULL GROUP BY channel_id) s
    WHERE c.team_id = $1 AND c.id = s.channel_id";

/// Tasks (binds $1 team, $2 count): one in 20 open, one in 20 claimed by a
/// live lease, the rest done; creators, holders and completers round-robin.
const TASKS: &str = "
    WITH cast_ AS (SELECT array_agg(id ORDER BY name) AS agents FROM agents WHERE team_id = $1)
    INSERT INTO tasks (id, team_id, key, title, description, status, created_by, created_session,
                       holder_agent_id, holder_session, lease_expires_at, claimed_at,
                       completed_by, completed_session, completed_at, result,
                       created_at, updated_at)
    SELECT gen_random_uuid(), $1, 'task-' || g, 'task ' || g || ' of the history',
           'what task ' || g || ' is about', s.status, c.agents[1 + g % 40], 'w1',
           CASE WHEN s.status = 'claimed' THEN c.agents[1 + (g + 1) % 40] END,
           CASE WHEN s.status = 'claimed' THEN 'w2' END,
           CASE WHEN s.status = 'claimed' THEN now() + interval '1 hour' END,
           CASE WHEN s.status <> 'open' THEN s.at + interval '1 minute' END,
           CASE WHEN s.status = 'done' THEN c.agents[1 + (g + 1) % 40] END,
           CASE WHEN s.status = 'done' THEN 'w2' END,
           CASE WHEN s.status = 'done' THEN s.at + interval '1 hour' END,
           CASE WHEN s.status = 'done' THEN 'done' END,
           s.at, s.at + interval '1 hour'
    FROM generate_series(1, $2) AS g CROSS JOIN cast_ c
    CROSS JOIN LATERAL (SELECT CASE g % 20 WHEN 0 THEN 'open' WHEN 1 THEN 'claimed'
                                           ELSE 'done' END AS status,
                               now() - make_interval(secs => ($2 - g) * 2592000.0 / $2) AS at) s
    ORDER BY g";

/// Each task's events: created, then claimed and completed as its status
/// says (binds $1 team, $2 unused).
const TASK_EVENTS: &str = "
    INSERT INTO task_events (team_id, task_id, at, kind, agent_id, session)
    SELECT t.team_id, t.id, e.at, e.kind, e.agent, e.session
    FROM tasks t CROSS JOIN LATERAL (VALUES
        (t.created_at, 'created', t.created_by, t.created_session, true),
        (t.claimed_at, 'claimed', coalesce(t.holder_agent_id, t.completed_by), 'w2',
         t.claimed_at IS NOT NULL),
        (t.completed_at, 'completed', t.completed_by, 'w2', t.completed_at IS NOT NULL)
    ) AS e(at, kind, agent, session, happened)
    WHERE t.team_id = $1 AND e.happened AND $2 > 0
    ORDER BY t.seq, e.at";

/// Notes (binds $1 team, $2 count), at revision 4, in 10 scopes;
/// one in three tagged.
const NOTES: &str = "
    WITH cast_ AS (SELECT array_agg(id ORDER BY name) AS agents FROM agents WHERE team_id = $1)
    INSERT INTO notes (id, team_id, scope, key, value, tags, revision,
                       created_by_agent_id, created_by_session,
                       updated_by_agent_id, updated_by_session, created_at, updated_at)
    SELECT gen_random_uuid(), $1, 'scope-' || (g % 10), 'note-' || g,
           'how we deploy part ' || g || ' of the service, and what to check after'
               || CASE WHEN g % 1000 = 1 THEN ' quokka' ELSE '' END,
           CASE WHEN g % 3 = 0 THEN ARRAY['ops'] ELSE '{}'::text[] END, 4,
           c.agents[1 + g % 40], 'w1', c.agents[1 + (g + 1) % 40], 'w1',
           now() - make_interval(secs => ($2 - g) * 2592000.0 / $2) - interval '3 hours',
           now() - make_interval(secs => ($2 - g) * 2592000.0 / $2)
    FROM generate_series(1, $2) AS g CROSS JOIN cast_ c
    ORDER BY g";

/// Every revision of every note; the last one carries the note's value
/// (binds $1 team, $2 unused).
const NOTE_REVISIONS: &str = "
    INSERT INTO note_revisions (team_id, note_id, revision, action, value, tags,
                                author_agent_id, author_session, at)
    SELECT n.team_id, n.id, r,
           'set', CASE WHEN r = 4 THEN n.value ELSE 'an earlier draft ' || r END,
           CASE WHEN r = 4 THEN n.tags ELSE '{}'::text[] END,
           n.updated_by_agent_id, 'w1', n.created_at + make_interval(hours => r - 1)
    FROM notes n CROSS JOIN generate_series(1, 4) AS r
    WHERE n.team_id = $1 AND $2 > 0";

/// The conversation, its counter at the last seq (binds $1 team, $2 count).
const CONVERSATION: &str = "
    INSERT INTO conversations (id, team_id, title, visibility, created_by, created_session,
                               last_seq, created_at)
    SELECT gen_random_uuid(), $1, 'the long thread', 'private', a.id, 'desk', $2,
           now() - interval '30 days'
    FROM agents a WHERE a.team_id = $1 AND a.name = 'bench'";

/// Its seats: bench/desk (owner) and the shared windows of a01..a03, all
/// active from seq 1 (the seat-activity trigger opens their intervals).
const SEATS_SQL: &str = "
    INSERT INTO conversation_members (id, team_id, conversation_id, agent_id, session, role,
                                      state, history_from_seq, joined_at, created_at)
    SELECT gen_random_uuid(), $1, c.id, a.id,
           CASE WHEN a.name = 'bench' THEN 'desk' ELSE '' END,
           CASE WHEN a.name = 'bench' THEN 'owner' ELSE 'participant' END,
           'active', 1, c.created_at, c.created_at
    FROM conversations c JOIN agents a ON a.team_id = c.team_id
    WHERE c.team_id = $1 AND a.name IN ('bench', 'a01', 'a02', 'a03') AND $2 > 0";

/// Its messages, seq 1..count, sent round-robin by the four seats (bench/desk
/// at seq = 1 mod 4), stored (synchronous publication: locator = id).
const CONVERSATION_MESSAGES: &str = "
    WITH seats AS (
        SELECT m.conversation_id, array_agg(m.id ORDER BY m.session DESC, a.name) AS ids,
               array_agg(m.agent_id ORDER BY m.session DESC, a.name) AS agents,
               array_agg(m.session ORDER BY m.session DESC, a.name) AS sessions
        FROM conversation_members m JOIN agents a ON a.team_id = m.team_id AND a.id = m.agent_id
        WHERE m.team_id = $1 GROUP BY m.conversation_id),
    bodies AS (
        SELECT g, s.*, gen_random_uuid() AS id,
               'reply ' || g || ' in the long thread, about the work at hand' AS body
        FROM generate_series(1, $2) AS g CROSS JOIN seats s)
    INSERT INTO conversation_messages (id, team_id, conversation_id, seq, sender_member_id,
                                       sender_id, sender_session, request_id, body, body_sha256,
                                       body_bytes, canonical_locator, created_at)
    SELECT b.id, $1, b.conversation_id, b.g, b.ids[1 + (b.g - 1) % 4],
           b.agents[1 + (b.g - 1) % 4], b.sessions[1 + (b.g - 1) % 4], gen_random_uuid(),
           b.body, sha256(convert_to(b.body, 'UTF8')), octet_length(b.body), b.id::text,
           now() - make_interval(secs => ($2 - b.g) * 2592000.0 / $2)
    FROM bodies b
    ORDER BY b.g";

/// One receipt per message for each seat but the sender's: stored; the last
/// 1 % (at least 10) not yet delivered or acknowledged, the rest delivered,
/// presented and acknowledged (binds $1 team, $2 count).
const RECEIPTS: &str = "
    INSERT INTO message_receipts (team_id, message_id, member_id, recipient_id,
                                  recipient_session, stored_at, delivered_at, presented_at,
                                  acknowledged_at)
    SELECT $1, m.id, s.id, s.agent_id, s.session, m.created_at,
           CASE WHEN m.seq <= $2 - greatest($2 / 100, 10) THEN m.created_at END,
           CASE WHEN m.seq <= $2 - greatest($2 / 100, 10) THEN m.created_at END,
           CASE WHEN m.seq <= $2 - greatest($2 / 100, 10) THEN m.created_at END
    FROM conversation_messages m
    JOIN conversation_members s ON s.team_id = m.team_id AND s.conversation_id = m.conversation_id
    WHERE m.team_id = $1 AND s.id <> m.sender_member_id
    ORDER BY m.seq, s.id";
