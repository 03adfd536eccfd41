//! A team's posts commit in parallel (issue 34 item 2, migration 0031), and
//! issue 19's two guarantees hold all the same: (a) a reader never skips a
//! message that a slower writer of its team commits later; (b) an open
//! transaction anywhere else (another application's, another team's post)
//! holds back no read. A writer is driven by hand here: the server's SQL
//! function `post_message` called inside a transaction the test keeps open,
//! so a writer can be caught holding its position, or rolled back; and one
//! step by step, caught between taking its position and locking it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ai_crew_sync::db;
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::eventually;
use crate::support::postgres::fresh_database_url;
use crate::support::{McpClient, spawn_app};
use crate::write_fence::waiting_on;

/// A hang guard for a read that must not wait (never a timing assertion: a
/// read held back waits for minutes, a free one answers in milliseconds).
const HANG: Duration = Duration::from_secs(60);

fn bodies(read: &Value) -> Vec<String> {
    read["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("a page of messages: {read}"))
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_string())
        .collect()
}

async fn read_new(client: &McpClient, scope: &str) -> Value {
    client
        .call("read_messages", json!({"scope": scope, "only_new": true}))
        .await
        .expect("read_messages")
}

/// A writer of `team`'s channel `channel` as `sender`, caught in its
/// transaction: the position taken (and its lock held) and the message
/// inserted, not committed.
pub(crate) async fn open_post(
    pool: &PgPool,
    team: &str,
    channel: &str,
    sender: &str,
    body: &str,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, i64) {
    let mut tx = pool.begin().await.unwrap();
    let position: Option<i64> = sqlx::query_scalar(
        "SELECT p.message_position
         FROM teams t JOIN agents a ON a.team_id = t.id AND a.name = $3
         CROSS JOIN LATERAL (SELECT k.id FROM agent_tokens k
                              WHERE k.team_id = t.id AND k.agent_id = a.id LIMIT 1) k
         CROSS JOIN LATERAL post_message(t.id, a.id, '', k.id, NULL, NULL, gen_random_uuid(),
                                         $2, false, NULL, NULL, NULL, $4, false, false, NULL,
                                         NULL, 0, 1073741824) p
         WHERE t.slug = $1",
    )
    .bind(team)
    .bind(channel)
    .bind(sender)
    .bind(body)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    (tx, position.expect("the post was placed"))
}

async fn team_id(pool: &PgPool, slug: &str) -> Uuid {
    sqlx::query_scalar("SELECT id FROM teams WHERE slug = $1")
        .bind(slug)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn two_agents_and_a_channel(app: &crate::support::TestApp) -> (McpClient, McpClient) {
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    alice
        .call("create_channel", json!({"name": "ops"}))
        .await
        .unwrap();
    (alice, bob)
}

// A slower writer holds position p; a later post commits at p + 1. A reader
// meets the gap at p below the newest position and waits for p's writer
// (seen waiting on an advisory lock), then reads both, in position order;
// nothing is read twice. Breaking the reader's wait (in read.rs, `if
// !gaps.is_empty()` -> `if false`) makes it return "fast one" alone and pass
// the cursor over "slow one": this test fails.
#[tokio::test]
async fn a_reader_waits_for_the_writer_of_a_gap_and_reads_its_message() {
    let app = spawn_app().await;
    let (alice, bob) = two_agents_and_a_channel(&app).await;
    let (slow, _) = open_post(&app.pool, "acme", "ops", "alice", "slow one").await;
    alice
        .call(
            "post_message",
            json!({"channel": "ops", "body": "fast one"}),
        )
        .await
        .expect("a post does not wait for another writer of its team");

    let bob = Arc::new(bob);
    let reader = bob.clone();
    let read = tokio::spawn(async move { read_new(&reader, "ops").await });
    eventually("the reader waits for the slow writer", async || {
        waiting_on(&app.pool, true).await > 0
    })
    .await;
    slow.commit().await.unwrap();
    let page = read.await.unwrap();
    assert_eq!(bodies(&page), ["slow one", "fast one"], "{page}");
    assert!(bodies(&read_new(&bob, "ops").await).is_empty());
}

// A writer between taking its position and locking it (it holds the team's
// entry lock and has its number, nothing else) while a later post commits:
// the reader finds the gap's lock free and the message still missing, so it
// waits for the team's entry lock, i.e. for that writer, and then reads its
// message. Without that wait (in message_positions_wait, dropping the
// `PERFORM pg_advisory_xact_lock(1094931309, …)`) the reader passes the gap
// and never reads "between": this test fails.
#[tokio::test]
async fn a_writer_between_its_position_and_its_lock_is_waited_for() {
    let app = spawn_app().await;
    let (alice, bob) = two_agents_and_a_channel(&app).await;
    let team = team_id(&app.pool, "acme").await;
    let mut between = app.pool.begin().await.unwrap();
    let position: i64 = sqlx::query_scalar(
        "SELECT nextval(message_position_sequence($1)::regclass)
           FROM (SELECT pg_advisory_xact_lock_shared(1094931309, hashtext($1::text))) entry",
    )
    .bind(team)
    .fetch_one(&mut *between)
    .await
    .unwrap();
    alice
        .call("post_message", json!({"channel": "ops", "body": "after"}))
        .await
        .unwrap();

    let bob = Arc::new(bob);
    let reader = bob.clone();
    let read = tokio::spawn(async move { read_new(&reader, "ops").await });
    eventually("the reader waits for the team's writers", async || {
        waiting_on(&app.pool, true).await > 0
    })
    .await;
    sqlx::query("SELECT pg_advisory_xact_lock(message_position_key($1, $2))")
        .bind(team)
        .bind(position)
        .execute(&mut *between)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO messages (id, team_id, channel_id, sender_id, sender_session, body, position)
         SELECT gen_random_uuid(), $1, c.id, a.id, '', 'between', $2
         FROM channels c JOIN agents a ON a.team_id = c.team_id AND a.name = 'alice'
         WHERE c.team_id = $1 AND c.name = 'ops'",
    )
    .bind(team)
    .bind(position)
    .execute(&mut *between)
    .await
    .unwrap();
    between.commit().await.unwrap();
    let page = read.await.unwrap();
    assert_eq!(bodies(&page), ["between", "after"], "{page}");
}

// Two reads of the same window and scope at once never hand out a message
// twice: a read moves the cursor only from the position its own statement
// read (read.rs, `MOVE_CURSOR`), and a read that finds it moved reads again
// from there. Both reads here have read the same page and wait at the cursor
// row, which a test transaction holds. Dropping the compare (`AND
// r.last_position = (SELECT after FROM cursor)`) makes both return "one",
// "two": this test fails.
#[tokio::test]
async fn two_reads_of_one_window_at_once_hand_out_each_message_once() {
    let app = spawn_app().await;
    let (alice, bob) = two_agents_and_a_channel(&app).await;
    assert!(bodies(&read_new(&bob, "ops").await).is_empty());
    for body in ["one", "two"] {
        alice
            .call("post_message", json!({"channel": "ops", "body": body}))
            .await
            .unwrap();
    }
    let mut held = app.pool.begin().await.unwrap();
    sqlx::query(
        "SELECT 1 FROM read_cursors r JOIN agents a ON a.team_id = r.team_id AND a.id = r.agent_id
          WHERE a.name = 'bob' AND r.scope = '#ops' FOR UPDATE OF r",
    )
    .fetch_one(&mut *held)
    .await
    .expect("bob's first read left a cursor");

    let bob = Arc::new(bob);
    let reads: Vec<_> = (0..2)
        .map(|_| {
            let bob = bob.clone();
            tokio::spawn(async move { read_new(&bob, "ops").await })
        })
        .collect();
    eventually("both reads wait at the cursor row", async || {
        waiting_on(&app.pool, false).await >= 2
    })
    .await;
    held.commit().await.unwrap();
    let mut read = Vec::new();
    for page in reads {
        read.extend(bodies(&page.await.unwrap()));
    }
    read.sort();
    assert_eq!(read, ["one", "two"], "each message once across both reads");
}

// A post that rolls back leaves its position empty for good: readers pass
// the gap and read what came after it, once.
#[tokio::test]
async fn a_rolled_back_post_leaves_a_gap_that_readers_pass() {
    let app = spawn_app().await;
    let (alice, bob) = two_agents_and_a_channel(&app).await;
    let (gone, gap) = open_post(&app.pool, "acme", "ops", "alice", "never").await;
    alice
        .call("post_message", json!({"channel": "ops", "body": "kept"}))
        .await
        .unwrap();
    gone.rollback().await.unwrap();
    let page = tokio::time::timeout(HANG, read_new(&bob, "ops"))
        .await
        .expect("a gap whose writer is gone holds back no read");
    assert_eq!(bodies(&page), ["kept"], "{page}");
    let positions: Vec<i64> = sqlx::query_scalar("SELECT position FROM messages ORDER BY position")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(positions, [gap + 1], "the rolled-back position stays empty");
    assert!(bodies(&read_new(&bob, "ops").await).is_empty());
    let listed = bob.call("list_channels", json!({})).await.unwrap();
    assert_eq!(listed["channels"][0]["messages"], 1, "{listed}");
}

// Guarantee (b): while another application's transaction holds an xid open
// in another database, and another team's post is open (holding its
// position and its team's entry lock), a reader of this team that meets a
// gap whose writer is gone (so it waits for its own team's writers) answers.
// Keying the entry lock by a constant instead of the team (in
// message_position_take and message_positions_wait, `hashtext(p_team::text)`
// -> `hashtext('all')`) makes this reader wait for the other team's open
// post, and the hang guard fails this test.
#[tokio::test]
async fn open_transactions_of_others_hold_back_no_read() {
    let app = spawn_app().await;
    let (alice, bob) = two_agents_and_a_channel(&app).await;
    app.team("other").await;
    let carol = app.mcp(&app.agent("other", "carol").await, None).await;
    carol
        .call("create_channel", json!({"name": "ops"}))
        .await
        .unwrap();

    let elsewhere = db::connect(&fresh_database_url().await, 1).await.unwrap();
    let mut idle = elsewhere.begin().await.unwrap();
    let _xid: i64 = sqlx::query_scalar("SELECT txid_current()")
        .fetch_one(&mut *idle)
        .await
        .unwrap();
    let mut idle_here = app.pool.begin().await.unwrap();
    let _xid: i64 = sqlx::query_scalar("SELECT txid_current()")
        .fetch_one(&mut *idle_here)
        .await
        .unwrap();
    let (other_team, _) = open_post(&app.pool, "other", "ops", "carol", "open elsewhere").await;
    let (gone, _) = open_post(&app.pool, "acme", "ops", "alice", "never").await;
    alice
        .call("post_message", json!({"channel": "ops", "body": "mine"}))
        .await
        .unwrap();
    gone.rollback().await.unwrap();

    let page = tokio::time::timeout(HANG, read_new(&bob, "ops"))
        .await
        .expect("a read waits for no transaction of another team or application");
    assert_eq!(bodies(&page), ["mine"], "{page}");
    other_team.rollback().await.unwrap();
    idle_here.rollback().await.unwrap();
    idle.rollback().await.unwrap();
}

/// Every message's position.
async fn positions(pool: &PgPool) -> HashMap<Uuid, i64> {
    sqlx::query_as::<_, (Uuid, i64)>("SELECT id, position FROM messages")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

fn ids(read: &Value) -> Vec<Uuid> {
    read["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("a page of messages: {read}"))
        .iter()
        .map(|m| m["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

// Many posters of one team at once, and beside them a slow writer that holds
// each of its positions open for a while (committing half, rolling back the
// other half), while readers read only_new pages again and again: every
// committed message is read by every reader exactly once, in position
// order, and no rolled-back one is. Breaking the reader's wait (in read.rs,
// `if !gaps.is_empty()` -> `if false`) makes readers skip the slow writer's
// messages: this test fails.
#[tokio::test]
async fn concurrent_posters_a_slow_writer_and_readers_read_everything_once() {
    const POSTERS: usize = 4;
    const EACH: usize = 25;
    const SLOW: usize = 10;
    const READERS: usize = 2;
    let app = spawn_app().await;
    let (first, _) = two_agents_and_a_channel(&app).await;
    let mut posters = vec![first];
    for i in 1..POSTERS {
        let token = app.agent("acme", &format!("poster{i}")).await;
        posters.push(app.mcp(&token, None).await);
    }
    let reader_token = app.agent("acme", "reader").await;
    let mut readers = Vec::new();
    for i in 0..READERS {
        readers.push(app.mcp(&reader_token, Some(&format!("w{i}"))).await);
    }

    let done = Arc::new(AtomicBool::new(false));
    let mut reading = Vec::new();
    for reader in readers {
        let done = done.clone();
        reading.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let finished = done.load(Ordering::SeqCst);
                let page = ids(&read_new(&reader, "ops").await);
                let empty = page.is_empty();
                seen.extend(page);
                if finished && empty {
                    return seen;
                }
            }
        }));
    }
    let pool = app.pool.clone();
    let slow = tokio::spawn(async move {
        let mut kept = Vec::new();
        for n in 0..SLOW {
            let (tx, position) =
                open_post(&pool, "acme", "ops", "alice", &format!("slow {n}")).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
            if n % 2 == 0 {
                tx.commit().await.unwrap();
                kept.push(position);
            } else {
                tx.rollback().await.unwrap();
            }
        }
        kept
    });
    let mut posting = Vec::new();
    for (i, poster) in posters.into_iter().enumerate() {
        posting.push(tokio::spawn(async move {
            let mut posted: Vec<Uuid> = Vec::new();
            for n in 0..EACH {
                let out = poster
                    .call(
                        "post_message",
                        json!({"channel": "ops", "body": format!("{i}-{n}")}),
                    )
                    .await
                    .unwrap();
                posted.push(out["message"]["id"].as_str().unwrap().parse().unwrap());
            }
            posted
        }));
    }
    let mut committed: HashSet<Uuid> = HashSet::new();
    for task in posting {
        committed.extend(task.await.unwrap());
    }
    let slow_kept = slow.await.unwrap();
    done.store(true, Ordering::SeqCst);
    let positions = positions(&app.pool).await;
    committed.extend(
        positions
            .iter()
            .filter(|(_, p)| slow_kept.contains(p))
            .map(|(id, _)| *id),
    );
    assert_eq!(committed.len(), POSTERS * EACH + SLOW / 2);
    assert_eq!(
        positions.len(),
        committed.len(),
        "rolled-back posts left nothing"
    );

    for task in reading {
        let seen = task.await.unwrap();
        let unique: HashSet<Uuid> = seen.iter().copied().collect();
        assert_eq!(unique.len(), seen.len(), "a message was returned twice");
        let missed = committed.difference(&unique).count();
        assert_eq!(missed, 0, "a reader skipped {missed} message(s)");
        let order: Vec<i64> = seen.iter().map(|id| positions[id]).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "read in position order: {order:?}"
        );
    }
    let listed = first_channel_count(&app).await;
    assert_eq!(
        listed,
        json!(committed.len()),
        "list_channels counts them all"
    );
}

async fn first_channel_count(app: &crate::support::TestApp) -> Value {
    let bob = app.mcp(&app.agent("acme", "counter").await, None).await;
    let listed = bob.call("list_channels", json!({})).await.unwrap();
    listed["channels"][0]["messages"].clone()
}

// post_message's refusals, now worded from the codes its one SQL call
// returns: the same words as when each check was its own statement, and
// nothing written. Letting the function go on past the fence's refusal (in
// post_message, `IF refusal IS NOT NULL THEN` -> `IF false THEN`) stores the
// disabled agent's post although Rust still words the refusal: this test
// fails.
#[tokio::test]
async fn post_message_refusals_keep_their_words_and_write_nothing() {
    let app = spawn_app().await;
    let (alice, _) = two_agents_and_a_channel(&app).await;
    let message = |refused: Value| refused["message"].as_str().unwrap().to_string();
    let nobody = alice
        .call("post_message", json!({"to": "nobody", "body": "hi"}))
        .await
        .unwrap_err();
    assert_eq!(
        message(nobody),
        "no agent `nobody` in your team. list_agents shows who is here."
    );
    let stray = Uuid::new_v4();
    let bad_reply = alice
        .call(
            "post_message",
            json!({"channel": "ops", "body": "hi", "reply_to": stray}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        message(bad_reply),
        format!(
            "reply_to {stray} is not a message of your team. Use the id read_messages returned."
        )
    );
    let reserved = alice
        .call("post_message", json!({"channel": "inbox", "body": "hi"}))
        .await
        .unwrap_err();
    assert!(
        message(reserved).starts_with("`inbox` cannot be a channel name"),
        "reserved names are never created"
    );
    let no_default = alice
        .call("post_message", json!({"body": "where to?"}))
        .await
        .unwrap_err();
    assert!(
        message(no_default).starts_with("no `channel` or `to`, and this window has no default"),
        "the shared window has no default channel"
    );
    // A project label that names no valid channel is no default either.
    alice
        .call("heartbeat", json!({"project": "not a channel!"}))
        .await
        .unwrap();
    let bad_project = message(
        alice
            .call("post_message", json!({"body": "where to?"}))
            .await
            .unwrap_err(),
    );
    assert!(
        bad_project.starts_with("no `channel` or `to`, and this window has no default"),
        "{bad_project}"
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "a refused post writes nothing");
    let channels: Vec<String> = sqlx::query_scalar("SELECT name FROM channels ORDER BY name")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(channels, ["ops"]);

    // A disabled agent's post is refused by the fence inside the same call
    // (or, once the server's credential cache has let the entry go, by the
    // HTTP layer before it, in the same words); nothing is written.
    sqlx::query("UPDATE agents SET disabled_at = now() WHERE name = 'alice'")
        .execute(&app.pool)
        .await
        .unwrap();
    let disabled = alice
        .refusal_text("post_message", json!({"channel": "ops", "body": "hi"}))
        .await;
    assert!(
        disabled.contains("agent `alice` of team `acme` is disabled"),
        "{disabled}"
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "the fenced post wrote nothing");
}
