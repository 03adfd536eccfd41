//! Message positions (issue 19 item 6): a per-team, commit-ordered position
//! orders every message, so a read never waits on another transaction of the
//! server and a late-committing writer of the team is never skipped; and
//! migration 0021 turns an existing history and its cursors into positions.

use std::collections::HashSet;
use std::sync::Arc;

use ai_crew_sync::db;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::postgres::fresh_database_url;
use crate::support::{McpClient, TestApp, spawn_app};

/// whoami's unread direct messages: `[count, at_least]`.
async fn unread_dms(client: &McpClient) -> Value {
    let me = client.call("whoami", json!({})).await.unwrap();
    pair(
        &me,
        "unread_direct_messages",
        "unread_direct_messages_at_least",
    )
}

/// Two fields of an answer, as one value to compare.
fn pair(v: &Value, a: &str, b: &str) -> Value {
    json!([v[a], v[b]])
}

fn ids(read: &Value) -> Vec<Uuid> {
    read["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("a page of messages: {read}"))
        .iter()
        .map(|m| m["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

async fn read_new(client: &McpClient, scope: &str, limit: i64) -> Value {
    client
        .call(
            "read_messages",
            json!({"scope": scope, "only_new": true, "limit": limit}),
        )
        .await
        .expect("read_messages")
}

// A session of another application, idle in a transaction that holds an xid,
// in another database of the same PostgreSQL server, holds back the server's
// xmin horizon. A read of new messages answers what was posted all the same
// (the horizon-wait design answered an empty page with `more: true`).
#[tokio::test]
async fn an_idle_transaction_in_another_database_holds_back_no_read() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;

    let elsewhere = db::connect(&fresh_database_url().await, 1).await.unwrap();
    let mut idle = elsewhere.begin().await.unwrap();
    sqlx::query("CREATE TEMP TABLE holding (x int)")
        .execute(&mut *idle)
        .await
        .unwrap();
    let _xid: i64 = sqlx::query_scalar("SELECT txid_current()")
        .fetch_one(&mut *idle)
        .await
        .unwrap();

    for (to, body) in [
        (json!({"channel": "ops"}), "on the channel"),
        (json!({"to": "bob"}), "to bob"),
    ] {
        let mut args = to;
        args["body"] = json!(body);
        alice.call("post_message", args).await.unwrap();
    }
    let all = read_new(&bob, "all", 50).await;
    let bodies: Vec<&str> = all["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["on the channel", "to bob"], "{all}");
    assert_eq!(all["more"], false, "{all}");
    let channel = read_new(&alice, "ops", 50).await;
    assert_eq!(
        ids(&channel),
        Vec::<Uuid>::new(),
        "a window's own post is not new to it: {channel}"
    );
    idle.rollback().await.unwrap();
}

// Many posters of one team commit concurrently while several windows read
// only_new pages of the channel; at the end every window has seen every
// message exactly once, in position order. Positions commit out of order
// since migration 0031: not waiting for the writer of a gap (in read.rs,
// `if !gaps.is_empty()` -> `if false`) makes a reader skip messages that
// commit late (parallel_posts.rs has the same with a slow writer).
#[tokio::test]
async fn concurrent_posters_and_readers_see_every_message_once_in_position_order() {
    // Posters and readers together stay below the test server's pool (8
    // connections): every call runs at once, none waits for a connection.
    const POSTERS: usize = 4;
    const EACH: usize = 40;
    const READERS: usize = 3;
    let app = spawn_app().await;
    app.team("acme").await;
    let mut posters = Vec::new();
    for i in 0..POSTERS {
        let token = app.agent("acme", &format!("poster{i}")).await;
        posters.push(app.mcp(&token, None).await);
    }
    let reader_token = app.agent("acme", "reader").await;
    let mut readers = Vec::new();
    for i in 0..READERS {
        readers.push(Arc::new(
            app.mcp(&reader_token, Some(&format!("w{i}"))).await,
        ));
    }
    posters[0]
        .call("create_channel", json!({"name": "busy"}))
        .await
        .unwrap();

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut reading = Vec::new();
    for reader in &readers {
        let reader = reader.clone();
        let done = done.clone();
        reading.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let page = ids(&read_new(&reader, "busy", 7).await);
                let empty = page.is_empty();
                seen.extend(page);
                if finished && empty {
                    return seen;
                }
            }
        }));
    }
    let mut posting = Vec::new();
    for (i, poster) in posters.into_iter().enumerate() {
        posting.push(tokio::spawn(async move {
            let mut posted: Vec<Uuid> = Vec::new();
            for n in 0..EACH {
                let out = poster
                    .call(
                        "post_message",
                        json!({"channel": "busy", "body": format!("{i}-{n}")}),
                    )
                    .await
                    .unwrap();
                posted.push(out["message"]["id"].as_str().unwrap().parse().unwrap());
            }
            posted
        }));
    }
    let mut posted: HashSet<Uuid> = HashSet::new();
    for task in posting {
        posted.extend(task.await.unwrap());
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(posted.len(), POSTERS * EACH);

    let positions = positions(&app.pool).await;
    for task in reading {
        let seen = task.await.unwrap();
        let unique: HashSet<Uuid> = seen.iter().copied().collect();
        assert_eq!(unique.len(), seen.len(), "a message was returned twice");
        let missed = posted.difference(&unique).count();
        assert_eq!(missed, 0, "a reader skipped {missed} message(s)");
        let order: Vec<i64> = seen.iter().map(|id| positions[id]).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "read in position order: {order:?}"
        );
    }
    assert_eq!(
        positions.values().copied().collect::<HashSet<_>>(),
        (1..=(POSTERS * EACH) as i64).collect::<HashSet<_>>(),
        "no post rolled back, so no position was left empty"
    );
}

async fn positions(pool: &PgPool) -> std::collections::HashMap<Uuid, i64> {
    sqlx::query_as::<_, (Uuid, i64)>("SELECT id, position FROM messages")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// The embedded migrations up to `version`: a schema of the past.
pub(crate) fn migrator_up_to(version: i64) -> sqlx::migrate::Migrator {
    let mut migrator = db::migrator();
    migrator
        .migrations
        .to_mut()
        .retain(|m| m.version <= version);
    migrator
}

// Migration 0021 on a database at 0020 with history in two teams whose
// (xact_id, seq) interleave: positions are 1..N per team in (xact_id, seq)
// order, the counters equal the max, the channel counters count, and each
// cursor maps to the last position at or below its old (last_xact, last_seq).
#[tokio::test]
async fn migration_0021_numbers_history_per_team_and_converts_cursors() {
    let url = fresh_database_url().await;
    let pool = db::connect(&url, 4).await.unwrap();
    migrator_up_to(20).run(&pool).await.unwrap();
    let app = TestApp::builder()
        .database(pool.clone(), url.clone())
        .spawn()
        .await;
    app.team("one").await;
    app.team("two").await;
    app.agent("one", "alice").await;
    app.agent("two", "bob").await;
    drop(app);
    sqlx::query(
        "INSERT INTO channels (id, team_id, name, created_by)
         SELECT gen_random_uuid(), t.id, 'main', a.id
         FROM teams t JOIN agents a ON a.team_id = t.id",
    )
    .execute(&pool)
    .await
    .unwrap();
    // (team, xact_id, seq, body): inserted out of order on purpose.
    let rows = [
        ("one", 500, 3, "one-c"),
        ("two", 400, 1, "two-a"),
        ("one", 100, 7, "one-a"),
        ("one", 100, 9, "one-b"),
        ("two", 900, 2, "two-b"),
        ("one", 700, 4, "one-d"),
    ];
    for (team, xact, seq, body) in rows {
        sqlx::query(
            "INSERT INTO messages (id, team_id, seq, xact_id, channel_id, sender_id, sender_session,
                                   body)
             OVERRIDING SYSTEM VALUE
             SELECT gen_random_uuid(), t.id, $3, $2, c.id, a.id, '', $4
             FROM teams t JOIN agents a ON a.team_id = t.id JOIN channels c ON c.team_id = t.id
             WHERE t.slug = $1",
        )
        .bind(team)
        .bind(xact as i64)
        .bind(seq as i64)
        .bind(body)
        .execute(&pool)
        .await
        .unwrap();
    }
    // (team, scope, last_xact, last_seq, expected position)
    let cursors = [
        ("one", "#main", 100, 9, 2),  // exactly one-b
        ("one", "all", 600, 0, 3),    // between one-c and one-d
        ("one", "inbox", 50, 0, 0),   // before everything
        ("two", "#main", 1000, 0, 2), // past everything
        ("two", "all", 400, 1, 1),    // exactly two-a
    ];
    for (team, scope, xact, seq, _) in cursors {
        sqlx::query(
            "INSERT INTO read_cursors (team_id, agent_id, session, scope, last_xact, last_seq)
             SELECT t.id, a.id, 'w', $2, $3, $4
             FROM teams t JOIN agents a ON a.team_id = t.id WHERE t.slug = $1",
        )
        .bind(team)
        .bind(scope)
        .bind(xact as i64)
        .bind(seq as i64)
        .execute(&pool)
        .await
        .unwrap();
    }

    db::migrator().run(&pool).await.unwrap();

    let numbered: Vec<(String, i64)> = sqlx::query_as(
        "SELECT m.body, m.position FROM messages m JOIN teams t ON t.id = m.team_id
         ORDER BY t.slug, m.position",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected: Vec<(String, i64)> = [
        ("one-a", 1),
        ("one-b", 2),
        ("one-c", 3),
        ("one-d", 4),
        ("two-a", 1),
        ("two-b", 2),
    ]
    .iter()
    .map(|(b, p)| (b.to_string(), *p))
    .collect();
    assert_eq!(numbered, expected);
    let counters: Vec<(String, i64)> = sqlx::query_as(
        "SELECT t.slug, k.last_position FROM message_counters k JOIN teams t ON t.id = k.team_id
         ORDER BY t.slug",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(counters, [("one".into(), 4), ("two".into(), 2)]);
    let channels: Vec<(String, i64, Option<i64>)> = sqlx::query_as(
        "SELECT t.slug, c.message_count, c.last_position FROM channels c
         JOIN teams t ON t.id = c.team_id ORDER BY t.slug",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        channels,
        [("one".into(), 4, Some(4)), ("two".into(), 2, Some(2))]
    );
    for (team, scope, _, _, position) in cursors {
        let got: i64 = sqlx::query_scalar(
            "SELECT r.last_position FROM read_cursors r JOIN teams t ON t.id = r.team_id
             WHERE t.slug = $1 AND r.scope = $2",
        )
        .bind(team)
        .bind(scope)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(got, position, "cursor {scope} of team {team}");
    }

    // And the migrated history reads on: the next post takes position 5.
    let app = TestApp::builder().database(pool.clone(), url).spawn().await;
    let token = app.agent("one", "carol").await;
    let carol = app.mcp(&token, None).await;
    carol
        .call("post_message", json!({"channel": "main", "body": "one-e"}))
        .await
        .unwrap();
    let page = carol
        .call("read_messages", json!({"scope": "main", "only_new": true}))
        .await
        .unwrap();
    let bodies: Vec<&str> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["one-a", "one-b", "one-c", "one-d"], "{page}");
    let last: i64 = sqlx::query_scalar("SELECT max(position) FROM messages WHERE body = 'one-e'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(last, 5);
}

/// Seeds `n` channel messages from `sender` into `channel` (created if new)
/// of `team` as the benchmark does, set-based: positions continue the team's
/// counter, the counter and the channel's counters follow. `body` is an SQL
/// expression over `g` (1..=n).
async fn seed_channel(pool: &PgPool, team: &str, channel: &str, sender: &str, n: i64, body: &str) {
    let sql = format!(
        "WITH t AS (SELECT id FROM teams WHERE slug = $1),
              base AS (SELECT coalesce(pg_sequence_last_value(
                                   message_position_sequence((SELECT id FROM t))::regclass), 0) AS p),
              inserted AS (
                  INSERT INTO messages (id, team_id, channel_id, sender_id, sender_session, body,
                                        position)
                  SELECT gen_random_uuid(), t.id, c.id, a.id, '', {body}, base.p + g
                  FROM t, base, generate_series(1, $4::bigint) g
                  JOIN channels c ON c.name = $2 JOIN agents a ON a.name = $3
                  WHERE c.team_id = (SELECT id FROM t) AND a.team_id = (SELECT id FROM t)
                  RETURNING team_id, channel_id, position, created_at),
              counter AS (
                  INSERT INTO message_counters (team_id, last_position)
                  SELECT team_id, max(position) FROM inserted GROUP BY team_id
                  ON CONFLICT (team_id) DO UPDATE SET last_position = excluded.last_position)
         UPDATE channels c SET message_count = c.message_count + s.n, last_position = s.p,
                               last_message_at = s.at
         FROM (SELECT channel_id, count(*) AS n, max(position) AS p, max(created_at) AS at
               FROM inserted GROUP BY channel_id) s
         WHERE c.id = s.channel_id"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(team)
        .bind(channel)
        .bind(sender)
        .bind(n)
        .execute(pool)
        .await
        .unwrap();
}

// Issue 19 item 2, the bounded shapes: past their caps list_channels' unread
// (100 a channel), team_digest's per-channel count (10) and whoami's unread
// DMs (1000) say "at least"; below them they are exact and match what is
// there; search ranks the newest 1000 matches of a word in every message and
// still finds a rare word in the oldest one.
#[tokio::test]
async fn counts_stop_at_their_caps_and_search_ranks_the_newest_matches() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, Some("w1")).await;
    alice
        .call(
            "post_message",
            json!({"channel": "quiet", "body": "first and rare: zebrafish"}),
        )
        .await
        .unwrap();
    seed_channel(&app.pool, "acme", "quiet", "alice", 4, "'common ' || g").await;
    alice
        .call(
            "post_message",
            json!({"channel": "busy", "body": "common opener"}),
        )
        .await
        .unwrap();
    seed_channel(&app.pool, "acme", "busy", "alice", 1500, "'common ' || g").await;

    let listed = bob.call("list_channels", json!({})).await.unwrap();
    let channels = listed["channels"].as_array().unwrap();
    let counts = |name: &str| {
        let c = channels.iter().find(|c| c["name"] == name).unwrap();
        json!([c["messages"], c["unread"], c["unread_at_least"]])
    };
    assert_eq!(
        (counts("quiet"), counts("busy")),
        (json!([5, 5, false]), json!([1501, 100, true])),
        "{listed}"
    );
    // Reading moves the count: after the quiet channel's page, nothing unread there.
    read_new(&bob, "quiet", 50).await;
    let listed = bob.call("list_channels", json!({})).await.unwrap();
    let quiet = listed["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "quiet")
        .unwrap()
        .clone();
    assert_eq!(quiet["unread"], 0, "{listed}");
    // The sender's own posts are not unread to it.
    let mine = alice.call("list_channels", json!({})).await.unwrap();
    assert!(
        mine["channels"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["unread"] == 0),
        "{mine}"
    );

    let digest = bob
        .call("team_digest", json!({"all_channels": true}))
        .await
        .unwrap();
    let activity = digest["channels"].as_array().unwrap();
    let busy = activity.iter().find(|c| c["channel"] == "busy").unwrap();
    assert_eq!(
        pair(busy, "messages", "messages_at_least"),
        json!([10, true]),
        "{digest}"
    );
    let quiet = activity.iter().find(|c| c["channel"] == "quiet").unwrap();
    assert_eq!(
        pair(quiet, "messages", "messages_at_least"),
        json!([5, false]),
        "{digest}"
    );

    let rare = bob
        .call("search_messages", json!({"query": "zebrafish"}))
        .await
        .unwrap();
    let bodies: Vec<&str> = rare["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, ["first and rare: zebrafish"], "{rare}");
    let common = bob
        .call("search_messages", json!({"query": "common", "limit": 200}))
        .await
        .unwrap();
    let found: Vec<Uuid> = common["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(found.len(), 200, "{common}");
    let positions = positions(&app.pool).await;
    let newest = positions.values().max().copied().unwrap();
    assert!(
        found.iter().all(|id| positions[id] > newest - 1000),
        "ranked among the newest 1000 matches"
    );

    // whoami: exact below 1000 unread DMs, "at least" past it.
    assert_eq!(unread_dms(&bob).await, json!([0, false]));
    sqlx::query(
        "WITH t AS (SELECT id FROM teams WHERE slug = 'acme'),
              base AS (SELECT pg_sequence_last_value(
                                  message_position_sequence((SELECT id FROM t))::regclass) AS p),
              inserted AS (
                  INSERT INTO messages (id, team_id, sender_id, sender_session, recipient_id,
                                        recipient_session, body, position)
                  SELECT gen_random_uuid(), t.id, a.id, '', b.id,
                         CASE WHEN g % 2 = 0 THEN 'w1' END, 'dm ' || g, base.p + g
                  FROM t, base, generate_series(1, 1001) g
                  JOIN agents a ON a.name = 'alice' JOIN agents b ON b.name = 'bob'
                  WHERE a.team_id = (SELECT id FROM t) AND b.team_id = (SELECT id FROM t)
                  RETURNING team_id, position)
         UPDATE message_counters k SET last_position = (SELECT max(position) FROM inserted)
         WHERE k.team_id = (SELECT id FROM t)",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(unread_dms(&bob).await, json!([1000, true]));
    let page = bob
        .call("read_messages", json!({"scope": "inbox", "limit": 200}))
        .await
        .unwrap();
    assert_eq!(page["messages"][0]["body"], "dm 1", "{page}");
    for _ in 0..4 {
        bob.call("read_messages", json!({"scope": "inbox", "limit": 200}))
            .await
            .unwrap();
    }
    assert_eq!(unread_dms(&bob).await, json!([1, false]));
}
