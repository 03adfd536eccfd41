//! The task writes that are one round trip each (issue 34, item 1):
//! `claim_task`, `claim_next_task`, `renew_task_lease`, `release_task` and
//! `complete_task` are each one call of a SQL function (migration 0032) that
//! runs the write fence, the quota, the locks and the writes inside.
//!
//! Shown here over MCP: each of the five, started while an agent disable, a
//! token revocation or a `revoke_session` is in flight, waits on the fence
//! inside its one call and is then refused with the fence's words, changing
//! nothing (an agent disable or a token revocation itself releases the
//! window's claim: issue 37); `complete_task` past the quota is refused with the quota's words
//! at exactly the old boundary; many windows claiming next at once never
//! share a task, and each claim leaves exactly one event.

use std::collections::HashMap;

use ai_crew_sync::store::{identity::agents, identity::tokens, operations::usage};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{McpClient, TestApp, in_team, spawn_app, test_actor};
use crate::write_fence::{hold_row, race};

/// The five tools, each with the arguments that would succeed: `held` is a
/// task the writing window holds, `free` an open one.
const WRITES: [(&str, &str); 5] = [
    ("claim_task", r#"{"key": "free"}"#),
    ("claim_next_task", r#"{}"#),
    (
        "renew_task_lease",
        r#"{"key": "held", "lease_seconds": 600}"#,
    ),
    ("release_task", r#"{"key": "held"}"#),
    ("complete_task", r#"{"key": "held", "result": "late"}"#),
];

/// What a team's tasks are, row by row, and how many events they have:
/// equal before and after means nothing changed.
async fn team_tasks(pool: &PgPool, team: &str) -> (Vec<Value>, i64) {
    let rows: Vec<Value> = sqlx::query_scalar(
        "SELECT to_jsonb(t) FROM tasks t JOIN teams tm ON tm.id = t.team_id
          WHERE tm.slug = $1 ORDER BY t.seq",
    )
    .bind(team)
    .fetch_all(pool)
    .await
    .unwrap();
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM task_events e JOIN teams tm ON tm.id = e.team_id
          WHERE tm.slug = $1",
    )
    .bind(team)
    .fetch_one(pool)
    .await
    .unwrap();
    (rows, events)
}

/// The revocations the fence must stop a write behind.
#[derive(Clone, Copy, Debug)]
enum Revocation {
    /// `agent disable`; the write comes from a window's session credential.
    AgentDisabled,
    /// `token revoke`; the write comes from the bare agent token.
    TokenRevoked,
    /// `revoke_session` by the agent's token; the write from that window.
    WindowRevoked,
}

impl Revocation {
    fn name(self) -> &'static str {
        match self {
            Revocation::AgentDisabled => "disabled",
            Revocation::TokenRevoked => "token",
            Revocation::WindowRevoked => "window",
        }
    }
}

/// A team `team` with agent alice, her window `w` on a session credential,
/// `held` claimed by the writing client and `free` open. The agent token's
/// client, the writing client and the token's id.
async fn fenced_team(app: &TestApp, team: &str, kind: Revocation) -> (McpClient, McpClient, Uuid) {
    app.team(team).await;
    let token = app.agent(team, "alice").await;
    let agent = app.mcp(&token, None).await;
    let issued = agent
        .call("register_session", json!({ "session": "w" }))
        .await
        .unwrap();
    let writer = match kind {
        Revocation::TokenRevoked => app.mcp(&token, None).await,
        _ => app.mcp(issued["credential"].as_str().unwrap(), None).await,
    };
    for key in ["held", "free"] {
        writer
            .call(
                "create_task",
                json!({ "key": key, "title": format!("do {key}") }),
            )
            .await
            .unwrap();
    }
    writer
        .call("claim_task", json!({ "key": "held" }))
        .await
        .unwrap();
    let token_id: Uuid = sqlx::query_scalar(
        "SELECT k.id FROM agent_tokens k JOIN teams t ON t.id = k.team_id WHERE t.slug = $1",
    )
    .bind(team)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    (agent, writer, token_id)
}

#[tokio::test]
async fn each_task_write_in_flight_across_a_revocation_waits_on_the_fence_is_refused_and_changes_nothing()
 {
    let app = spawn_app().await;
    for kind in [
        Revocation::AgentDisabled,
        Revocation::TokenRevoked,
        Revocation::WindowRevoked,
    ] {
        for (tool, arguments) in WRITES {
            let team = format!("{}-{}", kind.name(), tool.replace('_', "-"));
            let (agent, writer, token_id) = fenced_team(&app, &team, kind).await;
            let before = team_tasks(&app.pool, &team).await;
            let (sql, id): (&'static str, Uuid) = match kind {
                Revocation::AgentDisabled => (
                    "SELECT 1 FROM agents WHERE id = $1 FOR NO KEY UPDATE",
                    sqlx::query_scalar(
                        "SELECT a.id FROM agents a JOIN teams t ON t.id = a.team_id
                          WHERE t.slug = $1",
                    )
                    .bind(&team)
                    .fetch_one(&app.pool)
                    .await
                    .unwrap(),
                ),
                Revocation::TokenRevoked => (
                    "SELECT 1 FROM agent_tokens WHERE id = $1 FOR NO KEY UPDATE",
                    token_id,
                ),
                Revocation::WindowRevoked => (
                    "SELECT 1 FROM agent_sessions WHERE id = $1 FOR NO KEY UPDATE",
                    sqlx::query_scalar("SELECT id FROM agent_sessions WHERE token_id = $1")
                        .bind(token_id)
                        .fetch_one(&app.pool)
                        .await
                        .unwrap(),
                ),
            };
            let held = hold_row(&app.pool, sql, id).await;
            let pool = app.pool.clone();
            let slug = team.clone();
            let revocation = async move {
                match kind {
                    Revocation::AgentDisabled => {
                        agents::set_disabled(&pool, &in_team(&slug), "alice", true)
                            .await
                            .unwrap();
                    }
                    Revocation::TokenRevoked => {
                        tokens::revoke(&pool, token_id, &in_team(&slug))
                            .await
                            .unwrap();
                    }
                    Revocation::WindowRevoked => {
                        agent
                            .call("revoke_session", json!({ "session": "w" }))
                            .await
                            .unwrap();
                    }
                }
            };
            let arguments: Value = serde_json::from_str(arguments).unwrap();
            let write = async move { writer.call(tool, arguments).await };
            let answer = race(&app.pool, held, revocation, write).await;

            let refusal = answer.expect_err(&format!("{tool} after {kind:?}"));
            let words = refusal["message"].as_str().unwrap_or_default();
            let expected = match kind {
                Revocation::AgentDisabled => format!(
                    "agent `alice` of team `{team}` is disabled; every token and window of it is \
                     refused. An operator can re-enable it with `ai-crew-sync agent enable --team \
                     {team} --name alice`."
                ),
                Revocation::TokenRevoked => "this agent token was revoked at ".to_string(),
                Revocation::WindowRevoked => "session `w` was revoked at ".to_string(),
            };
            assert!(
                words.starts_with(&expected),
                "{tool} after {kind:?}: {refusal}"
            );
            assert!(
                words.contains("nothing was written") || words.contains("is disabled"),
                "{tool} after {kind:?}: {refusal}"
            );
            if let Revocation::WindowRevoked = kind {
                // revoke_session leaves the release to the departures pass.
                assert_eq!(
                    team_tasks(&app.pool, &team).await,
                    before,
                    "{tool} after {kind:?} changed nothing"
                );
                continue;
            }
            // The revocation itself released the window's claim on `held`
            // (issue 37: one `released` event by the bus); the refused write
            // changed nothing.
            let (rows, events) = team_tasks(&app.pool, &team).await;
            assert_eq!(events, before.1 + 1, "{tool} after {kind:?}: {rows:?}");
            assert_eq!(
                rows[1], before.0[1],
                "{tool} after {kind:?}: `free` untouched"
            );
            assert_eq!(
                (rows[0]["key"].as_str(), rows[0]["status"].as_str()),
                (Some("held"), Some("open")),
                "{tool} after {kind:?}: {rows:?}"
            );
            assert_eq!(rows[0]["holder_agent_id"], Value::Null, "{rows:?}");
            let why: String = sqlx::query_scalar(
                "SELECT e.detail->>'why' FROM task_events e JOIN teams tm ON tm.id = e.team_id
                  WHERE tm.slug = $1 ORDER BY e.id DESC LIMIT 1",
            )
            .bind(&team)
            .fetch_one(&app.pool)
            .await
            .unwrap();
            let expected_why = match kind {
                Revocation::AgentDisabled => "agent_disabled",
                Revocation::TokenRevoked | Revocation::WindowRevoked => "token_revoked",
            };
            assert_eq!(why, expected_why, "{tool} after {kind:?}");
        }
    }
}

#[tokio::test]
async fn complete_task_past_the_quota_is_refused_in_the_same_words_at_the_same_boundary() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w")).await;
    for key in ["a", "b"] {
        alice
            .call("create_task", json!({ "key": key, "title": "T" }))
            .await
            .unwrap();
        alice
            .call("claim_task", json!({ "key": key }))
            .await
            .unwrap();
    }
    // Count the usage now, and leave room for exactly 40 more bytes.
    let used = usage::quota(&app.pool, "acme", None, &test_actor())
        .await
        .unwrap()
        .storage_bytes_used;
    let limit = used + 40;
    usage::quota(&app.pool, "acme", Some(limit), &test_actor())
        .await
        .unwrap();
    let before = team_tasks(&app.pool, "acme").await;

    let refused = alice
        .call(
            "complete_task",
            json!({ "key": "a", "result": "r".repeat(41) }),
        )
        .await
        .expect_err("one byte past the quota");
    assert_eq!(refused["error"], "conflict", "{refused}");
    assert_eq!(
        refused["message"],
        format!(
            "the team's storage quota is {limit} bytes and {used} are used; this write of 41 \
             bytes would pass it, so nothing was written. An operator can trim old history with \
             `ai-crew-sync team prune --team acme --older-than-days N` or raise the quota with \
             `ai-crew-sync team quota --team acme --bytes N`."
        ),
        "{refused}"
    );
    // The quota is read before the task: a missing one is refused the same.
    let missing = alice
        .call(
            "complete_task",
            json!({ "key": "nope", "result": "r".repeat(41) }),
        )
        .await
        .expect_err("past the quota, and no such task");
    assert!(
        missing["message"]
            .as_str()
            .unwrap()
            .starts_with("the team's storage quota is"),
        "{missing}"
    );
    assert_eq!(
        team_tasks(&app.pool, "acme").await,
        before,
        "nothing changed"
    );

    // Exactly at the limit is still within it.
    let done = alice
        .call(
            "complete_task",
            json!({ "key": "b", "result": "r".repeat(40) }),
        )
        .await
        .unwrap();
    assert_eq!(done["status"], "done", "{done}");
    // The holder's other tools write no bytes and are not held back.
    let renewed = alice
        .call("renew_task_lease", json!({ "key": "a" }))
        .await
        .unwrap();
    assert_eq!(renewed["status"], "claimed", "{renewed}");
}

/// 24 windows of 3 agents claim next from one queue at once, each claiming
/// and releasing or completing as it goes: no task is ever held by two
/// windows, every task ends done exactly once, and each claim left one
/// `claimed` event naming the window that got it.
#[tokio::test]
async fn many_windows_claiming_next_at_once_never_share_a_task() {
    const TASKS: usize = 120;
    let app = spawn_app().await;
    app.team("acme").await;
    let planner = app.mcp(&app.agent("acme", "planner").await, None).await;
    for i in 0..TASKS {
        planner
            .call(
                "create_task",
                json!({ "key": format!("t{i:03}"), "title": "work" }),
            )
            .await
            .unwrap();
    }
    let mut workers = tokio::task::JoinSet::new();
    for a in 0..3 {
        let token = app.agent("acme", &format!("agent{a}")).await;
        for w in 0..8 {
            let client = app.mcp(&token, Some(&format!("w{w}"))).await;
            let me = format!("agent{a}/w{w}");
            workers.spawn(async move {
                let mut claims = Vec::new();
                let mut completed = Vec::new();
                loop {
                    let next = client
                        .call("claim_next_task", json!({}))
                        .await
                        .unwrap_or_else(|e| panic!("{me}: claim_next_task refused: {e}"));
                    if next["claimed"] == false {
                        break;
                    }
                    let key = next["task"]["key"].as_str().unwrap().to_string();
                    assert_eq!(next["task"]["holder"]["address"], me.as_str(), "{next}");
                    claims.push(key.clone());
                    // Every third claim is handed back, to be claimed again.
                    let (tool, arguments) = if claims.len() % 3 == 0 {
                        ("release_task", json!({ "key": key }))
                    } else {
                        ("complete_task", json!({ "key": key, "result": me }))
                    };
                    let answer = client
                        .call(tool, arguments)
                        .await
                        .unwrap_or_else(|e| panic!("{me}: {tool} {key} refused: {e}"));
                    if tool == "complete_task" {
                        assert_eq!(answer["completed_by"], me.as_str(), "{answer}");
                        completed.push(key);
                    }
                }
                (me, claims, completed)
            });
        }
    }
    let mut done_by: HashMap<String, String> = HashMap::new();
    let mut claims_by_window: HashMap<(String, String), i64> = HashMap::new();
    while let Some(joined) = workers.join_next().await {
        let (me, claims, completed) = joined.unwrap();
        for key in claims {
            *claims_by_window.entry((key, me.clone())).or_default() += 1;
        }
        for key in completed {
            if let Some(first) = done_by.insert(key.clone(), me.clone()) {
                panic!("{key} was completed by both {first} and {me}");
            }
        }
    }
    assert_eq!(
        done_by.len(),
        TASKS,
        "every task was completed exactly once"
    );

    // The history agrees with what each window was told, claim for claim.
    let events: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT t.key, a.name || '/' || e.session, count(*)
           FROM task_events e JOIN tasks t ON t.id = e.task_id
           JOIN agents a ON a.id = e.agent_id
          WHERE e.kind = 'claimed' GROUP BY 1, 2",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let recorded: HashMap<(String, String), i64> = events
        .into_iter()
        .map(|(key, window, n)| ((key, window), n))
        .collect();
    assert_eq!(recorded, claims_by_window, "one claimed event per claim");
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status <> 'done'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(open, 0);
}

/// `task_row_of` (migration 0036), which the task writes answer with, builds
/// from a tasks row what the view `task_rows` answers for it, in every state
/// a task can be in: open, with a description and metadata, held, lapsed,
/// done, cancelled, and waiting on done, open and cancelled prerequisites.
#[tokio::test]
async fn task_row_of_answers_what_the_view_answers() {
    let app = spawn_app().await;
    app.team("acme").await;
    let planner = app.mcp(&app.agent("acme", "planner").await, None).await;
    let worker = app
        .mcp(&app.agent("acme", "worker").await, Some("w1"))
        .await;
    let create = |key: &'static str, extra: Value| {
        let mut args = json!({ "key": key, "title": format!("do {key}") });
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        planner.call("create_task", args)
    };
    create(
        "open",
        json!({ "description": "the details", "metadata": { "area": "api" } }),
    )
    .await
    .unwrap();
    for key in ["done", "held", "lapsed", "cancelled", "waiting"] {
        create(key, json!({})).await.unwrap();
    }
    create(
        "child",
        json!({ "depends_on": ["done", "waiting", "cancelled"] }),
    )
    .await
    .unwrap();
    for key in ["done", "held", "lapsed"] {
        worker
            .call("claim_task", json!({ "key": key }))
            .await
            .unwrap();
    }
    worker
        .call(
            "complete_task",
            json!({ "key": "done", "result": "shipped" }),
        )
        .await
        .unwrap();
    planner
        .call(
            "cancel_task",
            json!({ "key": "cancelled", "reason": "not needed" }),
        )
        .await
        .unwrap();
    sqlx::query(
        "UPDATE tasks SET lease_expires_at = now() - interval '1 minute' WHERE key = 'lapsed'",
    )
    .execute(&app.pool)
    .await
    .unwrap();

    let rows: Vec<(String, Value, Value)> = sqlx::query_as(
        "SELECT t.key, to_jsonb(task_row_of(t)), to_jsonb(v)
           FROM tasks t JOIN task_rows v ON v.id = t.id ORDER BY t.seq",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 7);
    for (key, built, viewed) in &rows {
        assert_eq!(built, viewed, "{key}");
    }
    let child = &rows.iter().find(|(key, ..)| key == "child").unwrap().1;
    assert_eq!(
        child["blocked_by"],
        json!(["cancelled", "waiting"]),
        "{child}"
    );
    assert_eq!(
        child["blocked_by_cancelled"],
        json!(["cancelled"]),
        "{child}"
    );
    let lapsed = &rows.iter().find(|(key, ..)| key == "lapsed").unwrap().1;
    assert_eq!(lapsed["lapsed"], true, "{lapsed}");
}
