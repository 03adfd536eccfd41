//! Conversation membership over real HTTP, as several windows: visibility,
//! roles, the member cap, re-admission, transfer, recovery, and a storm of
//! concurrent membership changes.

use std::sync::Arc;

use ai_crew_sync::store::{conversations, identity::teams};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{McpClient, TestApp, spawn_app, test_actor};

pub(crate) async fn team_with_conversations(app: &TestApp, slug: &str) {
    app.team(slug).await;
    teams::capability(&app.pool, slug, Some(true), &test_actor())
        .await
        .unwrap();
}

fn id_of(value: &Value) -> Uuid {
    value["id"].as_str().unwrap().parse().unwrap()
}

fn message(refusal: &Value) -> &str {
    refusal["message"].as_str().unwrap()
}

async fn titles(client: &McpClient) -> Vec<(String, String)> {
    let listed = client.call("list_conversations", json!({})).await.unwrap();
    let mut out: Vec<(String, String)> = listed["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["title"].as_str().unwrap().to_string(),
                c["access"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

/// (address, role, state) of every seat, ordered by address.
async fn seats(app: &TestApp, id: Uuid) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT CASE WHEN m.session = '' THEN a.name ELSE a.name || '/' || m.session END AS address,
                m.role, m.state
         FROM conversation_members m JOIN agents a ON a.id = m.agent_id
         WHERE m.conversation_id = $1 ORDER BY 1",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

async fn audit_actions(app: &TestApp, id: Uuid) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT action FROM conversation_audit WHERE conversation_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn five_windows_of_two_agents_see_only_what_membership_and_grants_allow() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let alice_w1 = app.mcp(&alice, Some("w1")).await;
    let alice_w2 = app.mcp(&alice, Some("w2")).await;
    let alice_shared = app.mcp(&alice, None).await;
    let bob_w1 = app.mcp(&bob, Some("w1")).await;
    let bob_w2 = app.mcp(&bob, Some("w2")).await;

    alice_w1
        .call("create_project", json!({"project": "web"}))
        .await
        .unwrap();
    let plan = alice_w1
        .call(
            "create_conversation",
            json!({"title": "Plan", "project": "web", "invite": ["bob/w1"]}),
        )
        .await
        .unwrap();
    assert_eq!(plan["visibility"], "project");
    assert_eq!(plan["role"], "owner");
    assert_eq!(plan["state"], "active");
    assert_eq!(plan["members"], 2);
    let secret = alice_w1
        .call(
            "create_conversation",
            json!({"title": "Secret", "private": true, "invite": ["alice/w2"]}),
        )
        .await
        .unwrap();
    let secret_id = id_of(&secret);

    let s = |t: &str, a: &str| (t.to_string(), a.to_string());
    assert_eq!(
        titles(&alice_w1).await,
        [s("Plan", "member"), s("Secret", "member")]
    );
    assert_eq!(
        titles(&alice_w2).await,
        [s("Plan", "project_grant"), s("Secret", "invited")]
    );
    assert_eq!(titles(&alice_shared).await, [s("Plan", "project_grant")]);
    assert_eq!(titles(&bob_w1).await, [s("Plan", "invited")]);
    assert!(titles(&bob_w2).await.is_empty(), "no seat, no grant");

    // A private conversation: a non-member window, a window of the same agent
    // that is not in it, and a foreign team all get the one "not found".
    let expected = conversations::not_found(secret_id).to_string();
    app.team("other").await;
    teams::capability(&app.pool, "other", Some(true), &test_actor())
        .await
        .unwrap();
    let eve = app.mcp(&app.agent("other", "eve").await, None).await;
    let before = seats(&app, secret_id).await;
    for (who, client) in [
        ("bob/w2", &bob_w2),
        ("alice (shared)", &alice_shared),
        ("eve", &eve),
    ] {
        for (tool, args) in [
            ("join_conversation", json!({"conversation_id": secret_id})),
            ("leave_conversation", json!({"conversation_id": secret_id})),
            (
                "archive_conversation",
                json!({"conversation_id": secret_id}),
            ),
            (
                "invite_to_conversation",
                json!({"conversation_id": secret_id, "address": "bob", "role": "participant"}),
            ),
        ] {
            let refused = client.call(tool, args).await.unwrap_err();
            assert_eq!(refused["error"], "not_found", "{who} {tool}: {refused}");
            assert_eq!(message(&refused), expected, "{who} {tool}");
        }
    }
    assert_eq!(seats(&app, secret_id).await, before, "nothing changed");

    // The invited window joins and then sees it as a member; bob/w1 joins the project one.
    alice_w2
        .call("join_conversation", json!({"conversation_id": secret_id}))
        .await
        .unwrap();
    bob_w1
        .call(
            "join_conversation",
            json!({"conversation_id": id_of(&plan)}),
        )
        .await
        .unwrap();
    assert_eq!(
        titles(&alice_w2).await,
        [s("Plan", "project_grant"), s("Secret", "member")]
    );
    assert_eq!(titles(&bob_w1).await, [s("Plan", "member")]);
    // A grant holder without a seat cannot join uninvited.
    let uninvited = alice_shared
        .call(
            "join_conversation",
            json!({"conversation_id": id_of(&plan)}),
        )
        .await
        .unwrap_err();
    assert_eq!(uninvited["error"], "forbidden");
    assert!(message(&uninvited).contains("no invitation"), "{uninvited}");

    // Creation refusals change nothing.
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM conversations")
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    for (args, needle) in [
        (json!({"title": "x"}), "`private: true`"),
        (
            json!({"title": "x", "private": true, "project": "web"}),
            "not both",
        ),
        (json!({"title": "a\u{7}b", "private": true}), "control"),
        (
            json!({"title": "x".repeat(201), "private": true}),
            "1-200 bytes",
        ),
        (
            json!({"title": "x", "private": true, "invite": ["nobody"]}),
            "no agent",
        ),
        (
            json!({"title": "x", "private": true, "invite": ["alice/w1"]}),
            "this window",
        ),
    ] {
        let refused = alice_w1
            .call("create_conversation", args)
            .await
            .unwrap_err();
        assert!(message(&refused).contains(needle), "{needle}: {refused}");
    }
    let no_grant = bob_w2
        .call(
            "create_conversation",
            json!({"title": "x", "project": "web"}),
        )
        .await
        .unwrap_err();
    assert_eq!(no_grant["error"], "forbidden");
    assert!(
        message(&no_grant).contains("grant_project_access"),
        "{no_grant}"
    );
    assert_eq!(count().await, 2);
}

#[tokio::test]
async fn only_owners_and_moderators_manage_and_only_an_owner_removes_an_owner() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let alice = app.mcp(&alice_token, None).await;
    let alice_w2 = app.mcp(&alice_token, Some("w2")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    app.agent("acme", "carol").await;
    app.agent("acme", "dave").await;

    let conv = alice
        .call(
            "create_conversation",
            json!({"title": "Ops", "private": true, "invite": ["bob"]}),
        )
        .await
        .unwrap();
    let id = id_of(&conv);

    // An invitee is not a member: it cannot manage, and must join first.
    let before = seats(&app, id).await;
    let refused = bob
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "carol", "role": "participant"}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden");
    assert!(
        message(&refused).contains("only an active owner or moderator"),
        "{refused}"
    );
    assert!(message(&refused).contains("invited"), "{refused}");
    let refused = bob
        .call(
            "transfer_membership",
            json!({"conversation_id": id, "to": "w9"}),
        )
        .await
        .unwrap_err();
    assert!(message(&refused).contains("Join first"), "{refused}");
    assert_eq!(seats(&app, id).await, before);

    bob.call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    // A participant manages nothing.
    let before = seats(&app, id).await;
    for (tool, args) in [
        (
            "remove_conversation_member",
            json!({"conversation_id": id, "address": "alice"}),
        ),
        ("archive_conversation", json!({"conversation_id": id})),
        (
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "carol", "role": "observer"}),
        ),
    ] {
        let refused = bob.call(tool, args).await.unwrap_err();
        assert_eq!(refused["error"], "forbidden", "{tool}");
        assert!(
            message(&refused).contains("an active participant"),
            "{refused}"
        );
    }
    assert_eq!(seats(&app, id).await, before, "refusals change nothing");
    let archived: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT archived_at FROM conversations WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(archived.is_none());

    // The owner makes bob a moderator (a role change, audited as such).
    let promoted = alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "bob", "role": "moderator"}),
        )
        .await
        .unwrap();
    assert_eq!(promoted["outcome"], "role_changed");
    assert_eq!(promoted["role"], "moderator");
    let bad_role = alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "carol", "role": "owner"}),
        )
        .await
        .unwrap_err();
    assert_eq!(bad_role["error"], "invalid");

    // A moderator invites and removes, but never an owner.
    bob.call(
        "invite_to_conversation",
        json!({"conversation_id": id, "address": "carol", "role": "participant"}),
    )
    .await
    .unwrap();
    alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "alice/w2", "role": "moderator"}),
        )
        .await
        .unwrap();
    alice_w2
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    let before = seats(&app, id).await;
    let refused = bob
        .call(
            "remove_conversation_member",
            json!({"conversation_id": id, "address": "alice"}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "forbidden");
    assert!(
        message(&refused).contains("only an owner removes an owner"),
        "{refused}"
    );
    let refused = bob
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "alice", "role": "observer"}),
        )
        .await
        .unwrap_err();
    assert!(
        message(&refused).contains("only an owner changes an owner"),
        "{refused}"
    );
    let refused = bob
        .call(
            "remove_conversation_member",
            json!({"conversation_id": id, "address": "dave"}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "not_found");
    assert!(
        message(&refused).contains("holds no invited or active seat"),
        "{refused}"
    );
    assert_eq!(seats(&app, id).await, before);

    let removed = bob
        .call(
            "remove_conversation_member",
            json!({"conversation_id": id, "address": "alice/w2"}),
        )
        .await
        .unwrap();
    assert_eq!(removed["state"], "removed");
    let archived = bob
        .call("archive_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    assert!(archived["archived_at"].is_string());
    assert!(
        titles(&bob).await.is_empty(),
        "archived is hidden by default"
    );
    let listed = bob
        .call("list_conversations", json!({"include_archived": true}))
        .await
        .unwrap();
    assert_eq!(listed["conversations"][0]["title"], "Ops");
    // The owner removes the moderator.
    alice
        .call(
            "remove_conversation_member",
            json!({"conversation_id": id, "address": "bob"}),
        )
        .await
        .unwrap();

    assert_eq!(
        seats(&app, id).await,
        [
            ("alice".into(), "owner".into(), "active".into()),
            ("alice/w2".into(), "moderator".into(), "removed".into()),
            ("bob".into(), "moderator".into(), "removed".into()),
            ("carol".into(), "participant".into(), "invited".into()),
        ]
    );
    assert_eq!(
        audit_actions(&app, id).await,
        [
            "create", "invite", "join", "role", "invite", "invite", "join", "remove", "archive",
            "remove"
        ]
    );
}

#[tokio::test]
async fn the_member_cap_of_200_is_counted_under_the_conversation_lock() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    app.agent("acme", "filler").await;
    app.agent("acme", "bob").await;
    app.agent("acme", "carol").await;
    let id = id_of(
        &alice
            .call(
                "create_conversation",
                json!({"title": "Big", "private": true}),
            )
            .await
            .unwrap(),
    );
    // 198 invited seats of one agent's windows: with the owner, 199.
    sqlx::query(
        "INSERT INTO conversation_members
             (id, team_id, conversation_id, agent_id, session, role, state, history_from_seq)
         SELECT gen_random_uuid(), a.team_id, $1, a.id, 'f' || g, 'participant', 'invited', 1
         FROM agents a, generate_series(1, 198) g WHERE a.name = 'filler'",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();

    let two_hundredth = alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "bob", "role": "participant"}),
        )
        .await
        .unwrap();
    assert_eq!(two_hundredth["state"], "invited");
    let before = seats(&app, id).await;
    let refused = alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "carol", "role": "participant"}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(
        message(&refused).contains("already has 200 members"),
        "{refused}"
    );
    assert!(message(&refused).contains("the limit is 200"), "{refused}");
    assert!(
        message(&refused).contains("remove_conversation_member"),
        "{refused}"
    );
    assert_eq!(seats(&app, id).await, before, "carol got no seat");

    alice
        .call(
            "remove_conversation_member",
            json!({"conversation_id": id, "address": "bob"}),
        )
        .await
        .unwrap();
    alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "carol", "role": "participant"}),
        )
        .await
        .expect("a freed seat can be taken");
    // Re-admitting bob would be the 201st.
    let refused = alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "bob", "role": "participant"}),
        )
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    let state: String = sqlx::query_scalar(
        "SELECT m.state FROM conversation_members m JOIN agents a ON a.id = m.agent_id
         WHERE m.conversation_id = $1 AND a.name = 'bob'",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(state, "removed");
}

#[tokio::test]
async fn readmission_after_removal_is_audited_and_starts_from_now() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let id = id_of(
        &alice
            .call(
                "create_conversation",
                json!({"title": "R", "private": true}),
            )
            .await
            .unwrap(),
    );
    let invited = alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "bob", "role": "participant",
                   "history_from_start": true}),
        )
        .await
        .unwrap();
    assert_eq!(invited["history_from_seq"], 1);
    bob.call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    // Five messages have gone by (the sequence allocator says so).
    sqlx::query("UPDATE conversations SET last_seq = 5 WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    alice
        .call(
            "remove_conversation_member",
            json!({"conversation_id": id, "address": "bob"}),
        )
        .await
        .unwrap();
    let gone = bob
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap_err();
    assert_eq!(message(&gone), conversations::not_found(id).to_string());

    let readmitted = alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "bob", "role": "observer",
                   "history_from_start": true}),
        )
        .await
        .unwrap();
    assert_eq!(readmitted["outcome"], "readmitted");
    assert_eq!(
        readmitted["history_from_seq"], 6,
        "from now, not from the start"
    );
    assert!(readmitted["note"].as_str().unwrap().contains("from now"));
    let joined = bob
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    assert_eq!(joined["history_from_seq"], 6);
    assert_eq!(joined["role"], "observer");
    assert_eq!(
        audit_actions(&app, id).await,
        ["create", "invite", "join", "remove", "readmit", "join"]
    );
    let detail: Value = sqlx::query_scalar(
        "SELECT detail FROM conversation_audit WHERE conversation_id = $1 AND action = 'readmit'",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(detail["history_from_seq"], 6);
    assert_eq!(detail["previous_state"], "removed");
}

#[tokio::test]
async fn transfer_moves_a_seat_and_its_receipts_without_forging_a_timestamp() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob_token = app.agent("acme", "bob").await;
    let bob = app.mcp(&bob_token, None).await;
    let bob_w2 = app.mcp(&bob_token, Some("w2")).await;
    let id = id_of(
        &alice
            .call(
                "create_conversation",
                json!({"title": "T", "private": true, "invite": ["bob"]}),
            )
            .await
            .unwrap(),
    );
    alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "bob", "role": "moderator"}),
        )
        .await
        .unwrap();
    bob.call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    alice
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "bob", "role": "moderator"}),
        )
        .await
        .unwrap();

    // A message from alice with a receipt for bob's seat, observed at fixed times.
    let old_seat: Uuid = sqlx::query_scalar(
        "SELECT m.id FROM conversation_members m JOIN agents a ON a.id = m.agent_id
         WHERE m.conversation_id = $1 AND a.name = 'bob' AND m.session = ''",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let message_id = Uuid::new_v4();
    sqlx::query(
        "WITH s AS (SELECT m.id, m.team_id, m.agent_id FROM conversation_members m
                    JOIN agents a ON a.id = m.agent_id
                    WHERE m.conversation_id = $1 AND a.name = 'alice')
         INSERT INTO conversation_messages (id, team_id, conversation_id, seq, sender_member_id,
             sender_id, sender_session, request_id, body, body_sha256, body_bytes)
         SELECT $2, s.team_id, $1, 1, s.id, s.agent_id, '', gen_random_uuid(), 'hello',
                sha256('hello'::bytea), 5 FROM s",
    )
    .bind(id)
    .bind(message_id)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE conversations SET last_seq = 1 WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO message_receipts (team_id, message_id, member_id, recipient_id,
             recipient_session, stored_at, delivered_at, acknowledged_at)
         SELECT m.team_id, $2, m.id, m.agent_id, '', '2024-01-02T03:04:05.123456Z',
                '2024-01-02T03:04:06Z', '2024-01-02T03:04:07Z'
         FROM conversation_members m WHERE m.id = $1",
    )
    .bind(old_seat)
    .bind(message_id)
    .execute(&app.pool)
    .await
    .unwrap();
    type Receipt = (
        Uuid,
        String,
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
    );
    let receipts = || async {
        sqlx::query_as::<_, Receipt>(
            "SELECT member_id, recipient_session, stored_at, delivered_at, presented_at,
                    acknowledged_at
             FROM message_receipts WHERE message_id = $1",
        )
        .bind(message_id)
        .fetch_all(&app.pool)
        .await
        .unwrap()
    };
    let original = receipts().await;

    // Refusals first: another agent's window, this window itself; nothing changes.
    let before = seats(&app, id).await;
    let other_agent = bob
        .call(
            "transfer_membership",
            json!({"conversation_id": id, "to": "alice/w2"}),
        )
        .await
        .unwrap_err();
    assert!(
        message(&other_agent).contains("same agent"),
        "{other_agent}"
    );
    let itself = bob
        .call(
            "transfer_membership",
            json!({"conversation_id": id, "to": ""}),
        )
        .await
        .unwrap_err();
    assert!(message(&itself).contains("this window itself"), "{itself}");
    assert_eq!(seats(&app, id).await, before);

    let proposed = bob
        .call(
            "transfer_membership",
            json!({"conversation_id": id, "to": "w2"}),
        )
        .await
        .unwrap();
    assert_eq!(proposed["outcome"], "transfer_proposed");
    assert_eq!(
        seats(&app, id).await,
        before,
        "nothing moves before the join"
    );

    let moved = bob_w2
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    assert_eq!(moved["outcome"], "transferred");
    assert_eq!(moved["address"], "bob/w2");
    assert_eq!(moved["role"], "moderator", "the role moves with the seat");
    assert_eq!(moved["history_from_seq"], 1);

    let new_seat: Uuid = sqlx::query_scalar(
        "SELECT m.id FROM conversation_members m JOIN agents a ON a.id = m.agent_id
         WHERE m.conversation_id = $1 AND a.name = 'bob' AND m.session = 'w2'",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let (state, superseded_by): (String, Option<Uuid>) =
        sqlx::query_as("SELECT state, superseded_by FROM conversation_members WHERE id = $1")
            .bind(old_seat)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), superseded_by), ("left", Some(new_seat)));

    let after = receipts().await;
    assert_eq!(after.len(), 1, "moved, not copied; nothing forged");
    assert_eq!(after[0].0, new_seat);
    assert_eq!(
        (&after[0].1, after[0].2, after[0].3, after[0].4, after[0].5),
        (
            &original[0].1,
            original[0].2,
            original[0].3,
            original[0].4,
            original[0].5
        ),
        "every observed fact keeps its timestamp"
    );
    assert_eq!(
        titles(&bob).await,
        Vec::<(String, String)>::new(),
        "the old window is out"
    );
    assert_eq!(
        titles(&bob_w2).await,
        [("T".to_string(), "member".to_string())]
    );
    let transfers: Vec<Value> = sqlx::query_scalar(
        "SELECT detail FROM conversation_audit WHERE conversation_id = $1 AND action = 'transfer'
         ORDER BY id",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(transfers.len(), 2);
    assert_eq!(transfers[0]["phase"], "proposed");
    assert_eq!(transfers[1]["phase"], "completed");
    assert_eq!(transfers[1]["receipts_moved"], 1);
    // The new seat manages as the old one did.
    bob_w2
        .call(
            "invite_to_conversation",
            json!({"conversation_id": id, "address": "bob", "role": "observer"}),
        )
        .await
        .expect("a moderator seat, moved");
}

#[tokio::test]
async fn recovery_refuses_while_any_session_is_live_and_never_posts() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    let bob_token = app.agent("acme", "bob").await;
    let bob = app.mcp(&bob_token, None).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;
    let w1 = bob
        .call("register_session", json!({"session": "w1"}))
        .await
        .unwrap();
    let bob_w1 = app.mcp(w1["credential"].as_str().unwrap(), None).await;
    let id = id_of(
        &bob_w1
            .call(
                "create_conversation",
                json!({"title": "Lost", "private": true, "invite": ["alice"]}),
            )
            .await
            .unwrap(),
    );
    alice
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    sqlx::query(
        "WITH s AS (SELECT m.id, m.team_id, m.agent_id FROM conversation_members m
                    JOIN agents a ON a.id = m.agent_id
                    WHERE m.conversation_id = $1 AND a.name = 'alice')
         INSERT INTO conversation_messages (id, team_id, conversation_id, seq, sender_member_id,
             sender_id, sender_session, request_id, body, body_sha256, body_bytes)
         SELECT gen_random_uuid(), s.team_id, $1, 1, s.id, s.agent_id, '', gen_random_uuid(),
                'where were we', sha256('where were we'::bytea), 13 FROM s",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE conversations SET last_seq = 1 WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    let recovers = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM conversation_audit WHERE action = 'recover'",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap()
    };

    let live = bob
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id}),
        )
        .await
        .unwrap_err();
    assert_eq!(live["error"], "forbidden");
    assert!(
        message(&live).contains("1 session is still live (w1)"),
        "{live}"
    );
    assert!(message(&live).contains("revoke_session"), "{live}");
    let with_session = bob_w1
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id}),
        )
        .await
        .unwrap_err();
    assert!(
        message(&with_session).contains("agent token"),
        "{with_session}"
    );
    assert_eq!(recovers().await, 0, "a refusal is not a recovery");

    bob.call("revoke_session", json!({"session": "w1"}))
        .await
        .unwrap();
    let seats_before = seats(&app, id).await;
    let recovered = bob
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id}),
        )
        .await
        .unwrap();
    assert_eq!(recovered["read_only"], true);
    // Recovery reads; it never opens a way to post or acknowledge.
    let post = bob
        .call(
            "send_conversation_message",
            json!({"conversation_id": id, "body": "back", "request_id": uuid::Uuid::new_v4().to_string()}),
        )
        .await
        .unwrap_err();
    assert_eq!(post["error"], "not_found", "{post}");
    let ack = bob
        .call(
            "ack_message",
            json!({"message_id": recovered["messages"][0]["message_id"]}),
        )
        .await
        .unwrap_err();
    assert!(
        ack["error"] == "not_found" || ack["error"] == "forbidden",
        "{ack}"
    );
    assert_eq!(recovered["next_after_seq"], 1);
    assert_eq!(recovered["messages"][0]["from"], "alice");
    assert_eq!(recovered["messages"][0]["body"], "where were we");
    assert_eq!(recovers().await, 1, "audited");
    let page = bob
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id, "after_seq": 1}),
        )
        .await
        .unwrap();
    assert_eq!(page["messages"], json!([]));
    assert_eq!(
        seats(&app, id).await,
        seats_before,
        "no seat came from recovery"
    );

    // Recovery gives no voice: the agent token has no seat to post or ack with.
    let no_seat = bob
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap_err();
    assert_eq!(no_seat["error"], "not_found");
    let posted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM conversation_messages WHERE conversation_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(posted, 1);

    // An agent never in it gets the one "not found".
    let stranger = carol
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id}),
        )
        .await
        .unwrap_err();
    assert_eq!(message(&stranger), conversations::not_found(id).to_string());
}

/// The seqs of a recovery page.
fn recovered_seqs(page: &Value) -> Vec<i64> {
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect()
}

/// Every seq `who` recovers, paging `limit` at a time.
async fn recover_all(who: &McpClient, id: Uuid, limit: i64) -> (Vec<i64>, Value) {
    let mut seqs = Vec::new();
    let mut after = 0;
    loop {
        let page = who
            .call(
                "recover_conversation_history",
                json!({"conversation_id": id, "after_seq": after, "limit": limit}),
            )
            .await
            .unwrap();
        let got = recovered_seqs(&page);
        if got.is_empty() {
            return (seqs, page["entitled"].clone());
        }
        after = page["next_after_seq"].as_i64().unwrap();
        seqs.extend(got);
    }
}

#[tokio::test]
async fn recovery_returns_only_what_a_seat_of_the_agent_could_read_while_active() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.mcp(&app.agent("acme", "alice").await, None).await;
    // Bob is removed and re-admitted, carol leaves and is invited back, dave
    // leaves for good, erin's seat moves from window w1 to w2 and is then
    // removed. None of them registers a session, so each recovers with its
    // agent token at once.
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;
    let dave = app.mcp(&app.agent("acme", "dave").await, None).await;
    let erin_token = app.agent("acme", "erin").await;
    let erin_w1 = app.mcp(&erin_token, Some("w1")).await;
    let erin_w2 = app.mcp(&erin_token, Some("w2")).await;
    let erin = app.mcp(&erin_token, None).await;
    let id = id_of(
        &alice
            .call(
                "create_conversation",
                json!({"title": "Need to know", "private": true,
                       "invite": ["bob", "carol", "dave", "erin/w1"]}),
            )
            .await
            .unwrap(),
    );
    for member in [&bob, &carol, &dave, &erin_w1] {
        member
            .call("join_conversation", json!({"conversation_id": id}))
            .await
            .unwrap();
    }
    let send = |n: i64| {
        let alice = &alice;
        async move {
            let sent = alice
                .call(
                    "send_conversation_message",
                    json!({"conversation_id": id, "body": format!("message {n}"),
                           "request_id": Uuid::new_v4().to_string()}),
                )
                .await
                .unwrap();
            assert_eq!(sent["seq"], n, "{sent}");
        }
    };
    let manage = |tool: &'static str, address: &'static str| {
        let alice = &alice;
        let mut args = json!({"conversation_id": id, "address": address});
        if tool == "invite_to_conversation" {
            args["role"] = json!("participant");
        }
        async move {
            alice.call(tool, args).await.unwrap();
        }
    };

    send(1).await;
    send(2).await;
    erin_w1
        .call(
            "transfer_membership",
            json!({"conversation_id": id, "to": "w2"}),
        )
        .await
        .unwrap();
    erin_w2
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    send(3).await;
    manage("remove_conversation_member", "bob").await;
    carol
        .call("leave_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    dave.call("leave_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    for n in 4..=5 {
        send(n).await;
    }
    manage("remove_conversation_member", "erin/w2").await;
    send(6).await;
    manage("invite_to_conversation", "bob").await;
    manage("invite_to_conversation", "carol").await;
    bob.call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    carol
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    send(7).await;
    send(8).await;

    // Pages of 2 cross the gap without returning a message twice or one of
    // the gap.
    let (seqs, entitled) = recover_all(&bob, id, 2).await;
    assert_eq!(seqs, [1, 2, 3, 7, 8], "removed at 3, re-admitted from 7");
    assert_eq!(
        entitled,
        json!([{"from_seq": 1, "to_seq": 3}, {"from_seq": 7, "to_seq": null}])
    );
    let (seqs, _) = recover_all(&carol, id, 50).await;
    assert_eq!(seqs, [1, 2, 3, 7, 8], "left at 3, invited back from 7");
    let (seqs, entitled) = recover_all(&dave, id, 50).await;
    assert_eq!(seqs, [1, 2, 3], "left at 3 for good");
    assert_eq!(entitled, json!([{"from_seq": 1, "to_seq": 3}]));
    let (seqs, _) = recover_all(&erin, id, 50).await;
    assert_eq!(
        seqs,
        [1, 2, 3, 4, 5],
        "the transfer kept 1..2 with the agent; removed at 5"
    );
    let page = bob
        .call(
            "recover_conversation_history",
            json!({"conversation_id": id}),
        )
        .await
        .unwrap();
    assert!(
        !page.to_string().contains("message 4"),
        "nothing sent while bob was out: {page}"
    );
}

#[tokio::test]
async fn a_storm_of_invites_removals_and_role_changes_ends_without_deadlock_or_database_error() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let bob_token = app.agent("acme", "bob").await;
    let alice = app.mcp(&alice_token, None).await;
    let id = id_of(
        &alice
            .call(
                "create_conversation",
                json!({"title": "Storm", "private": true}),
            )
            .await
            .unwrap(),
    );
    // 16 moderator windows and 8 target windows, all active before the storm.
    let mut managers = Vec::new();
    for m in 0..16 {
        let label = format!("m{m}");
        alice
            .call(
                "invite_to_conversation",
                json!({"conversation_id": id, "address": format!("alice/{label}"), "role": "moderator"}),
            )
            .await
            .unwrap();
        let client = app.mcp(&alice_token, Some(&label)).await;
        client
            .call("join_conversation", json!({"conversation_id": id}))
            .await
            .unwrap();
        managers.push(Arc::new(client));
    }
    let mut targets = Vec::new();
    for t in 0..8 {
        let label = format!("t{t}");
        alice
            .call(
                "invite_to_conversation",
                json!({"conversation_id": id, "address": format!("bob/{label}"), "role": "participant"}),
            )
            .await
            .unwrap();
        let client = app.mcp(&bob_token, Some(&label)).await;
        client
            .call("join_conversation", json!({"conversation_id": id}))
            .await
            .unwrap();
        targets.push(Arc::new(client));
    }
    let audited_before = audit_actions(&app, id).await.len();

    let mut tasks = Vec::new();
    for (k, manager) in managers.iter().enumerate() {
        let manager = manager.clone();
        let targets = targets.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for j in 0..10usize {
                let t = (k + j) % 8;
                let address = format!("bob/t{t}");
                let result = match (k + j) % 4 {
                    0 => {
                        manager
                            .call(
                                "invite_to_conversation",
                                json!({"conversation_id": id, "address": address, "role": "participant"}),
                            )
                            .await
                    }
                    1 => {
                        manager
                            .call(
                                "invite_to_conversation",
                                json!({"conversation_id": id, "address": address, "role": "observer"}),
                            )
                            .await
                    }
                    2 => {
                        manager
                            .call(
                                "remove_conversation_member",
                                json!({"conversation_id": id, "address": address}),
                            )
                            .await
                    }
                    _ => {
                        targets[t]
                            .call("join_conversation", json!({"conversation_id": id}))
                            .await
                    }
                };
                outcomes.push(result);
            }
            outcomes
        }));
    }
    let all = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.unwrap());
        }
        all
    })
    .await
    .expect("the storm finishes: no deadlock");
    assert_eq!(all.len(), 160);

    let mut changes = 0;
    for result in &all {
        match result {
            Ok(done) => {
                if done["outcome"] != "unchanged" {
                    changes += 1;
                }
            }
            Err(refused) => {
                let kind = refused["error"].as_str().unwrap();
                assert!(
                    ["not_found", "forbidden", "conflict", "invalid"].contains(&kind),
                    "no database error in a storm: {refused}"
                );
                assert!(
                    !message(refused).to_lowercase().contains("database"),
                    "{refused}"
                );
            }
        }
    }
    assert!(changes > 0, "the storm changed something");
    // Consistency: one audit row per change, one seat per window, the owner and
    // the moderators untouched, and every seat in a legal state.
    assert_eq!(
        audit_actions(&app, id).await.len() - audited_before,
        changes
    );
    let seats = seats(&app, id).await;
    assert_eq!(seats.len(), 1 + 16 + 8);
    assert_eq!(seats[0], ("alice".into(), "owner".into(), "active".into()));
    for (address, role, state) in &seats {
        if address.starts_with("alice/m") {
            assert_eq!((role.as_str(), state.as_str()), ("moderator", "active"));
        } else if address.starts_with("bob/t") {
            assert!(
                ["participant", "observer"].contains(&role.as_str()),
                "{role}"
            );
            assert!(
                ["invited", "active", "removed"].contains(&state.as_str()),
                "{state}"
            );
        }
    }
    let taken: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM conversation_members
         WHERE conversation_id = $1 AND state IN ('invited', 'active')",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(taken <= 200);
}
