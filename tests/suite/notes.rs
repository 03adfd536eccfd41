//! Notes: the team's shared memory. Revisions per change, tags, scopes,
//! full-text search, idempotent delete, limits, tenancy and wake-ups.

use std::time::Duration;

use ai_crew_sync::events::EventKind;
use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, spawn_app};

async fn set(client: &McpClient, args: Value) -> Value {
    client
        .call("set_note", args.clone())
        .await
        .unwrap_or_else(|e| panic!("set_note {args}: {e}"))
}

/// (notes rows, revision rows) as text: a refused call must leave both as they were.
async fn tables(app: &TestApp) -> (Vec<String>, Vec<String>) {
    let notes = sqlx::query_scalar("SELECT n::text FROM notes n ORDER BY scope, key")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    let revisions =
        sqlx::query_scalar("SELECT r::text FROM note_revisions r ORDER BY note_id, revision")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    (notes, revisions)
}

fn keys(list: &Value, field: &str) -> Vec<String> {
    list[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["key"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn each_change_keeps_a_revision_with_its_value_tags_and_author() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let alice_w1 = app.mcp(&alice, Some("w1")).await;
    let bob_shared = app.mcp(&bob, None).await;

    let first = set(
        &alice_w1,
        json!({ "key": "build/commands", "value": "cargo build", "tags": ["Build", "ci"] }),
    )
    .await;
    assert_eq!(first["scope"], "global");
    assert_eq!(first["revision"], 1);
    assert_eq!(
        (&first["changed"], &first["created"]),
        (&json!(true), &json!(true))
    );
    assert_eq!(first["tags"], json!(["build", "ci"]));
    assert_eq!(first["updated_by"], "alice/w1");

    // Another agent replaces the value; tags omitted are kept.
    let second = set(
        &bob_shared,
        json!({ "key": "build/commands", "value": "cargo build --locked" }),
    )
    .await;
    assert_eq!(second["revision"], 2);
    assert_eq!(second["created"], false);
    assert_eq!(second["tags"], json!(["build", "ci"]));

    // The same value and tags again is not a change.
    let same = set(
        &bob_shared,
        json!({ "key": "build/commands", "value": "cargo build --locked", "tags": ["ci", "build"] }),
    )
    .await;
    assert_eq!(
        (&same["changed"], &same["revision"]),
        (&json!(false), &json!(2))
    );
    assert_eq!(same["updated_by"], "bob");

    // Only the tags change: a revision; [] clears them.
    let cleared = set(
        &alice_w1,
        json!({ "key": "build/commands", "value": "cargo build --locked", "tags": [] }),
    )
    .await;
    assert_eq!(
        (&cleared["revision"], &cleared["tags"]),
        (&json!(3), &json!([]))
    );

    let note = alice_w1
        .call("get_note", json!({ "key": "build/commands" }))
        .await
        .unwrap();
    assert_eq!(note["found"], true);
    assert_eq!(note["value"], "cargo build --locked");
    assert_eq!(note["revision"], 3);
    assert_eq!(note["created_by"], "alice/w1");
    assert_eq!(note["updated_by"], "alice/w1");

    #[derive(sqlx::FromRow, Debug)]
    struct Revision {
        revision: i64,
        action: String,
        value: Option<String>,
        tags: Option<Vec<String>>,
        author: String,
        author_session: String,
    }
    let history: Vec<Revision> = sqlx::query_as(
        "SELECT r.revision, r.action, r.value, r.tags, a.name AS author, r.author_session
         FROM note_revisions r JOIN agents a ON a.team_id = r.team_id AND a.id = r.author_agent_id
         ORDER BY r.revision",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(history.len(), 3, "{history:?}");
    assert_eq!(
        history
            .iter()
            .map(|r| (
                r.revision,
                r.action.as_str(),
                r.value.as_deref().unwrap(),
                r.tags.clone().unwrap(),
                r.author.as_str(),
                r.author_session.as_str()
            ))
            .collect::<Vec<_>>(),
        vec![
            (
                1,
                "set",
                "cargo build",
                vec!["build".to_string(), "ci".to_string()],
                "alice",
                "w1"
            ),
            (
                2,
                "set",
                "cargo build --locked",
                vec!["build".to_string(), "ci".to_string()],
                "bob",
                ""
            ),
            (3, "set", "cargo build --locked", vec![], "alice", "w1"),
        ]
    );
}

#[tokio::test]
async fn a_missing_note_is_found_false_and_scopes_keep_keys_apart() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, None).await;

    let tools = client.list_tool_names().await;
    for tool in [
        "set_note",
        "get_note",
        "list_notes",
        "search_notes",
        "delete_note",
    ] {
        assert!(tools.iter().any(|t| t == tool), "{tool} in {tools:?}");
    }
    let missing = client
        .call("get_note", json!({ "key": "nothing-here" }))
        .await
        .unwrap();
    assert_eq!(missing["found"], false);
    assert_eq!(missing["key"], "nothing-here");
    assert!(missing.get("value").is_none());

    set(&client, json!({ "key": "owner", "value": "global owner" })).await;
    set(
        &client,
        json!({ "scope": "Project:Web", "key": "owner", "value": "web owner", "tags": ["people"] }),
    )
    .await;
    let web = client
        .call(
            "get_note",
            json!({ "scope": "project:web", "key": "owner" }),
        )
        .await
        .unwrap();
    assert_eq!(
        (&web["scope"], &web["value"]),
        (&json!("project:web"), &json!("web owner"))
    );
    let global = client
        .call("get_note", json!({ "key": "owner" }))
        .await
        .unwrap();
    assert_eq!(global["value"], "global owner");
    assert_eq!(
        client
            .call("get_note", json!({ "key": "Owner" }))
            .await
            .unwrap()["found"],
        false,
        "keys are case-sensitive"
    );

    // Listings never carry whole values: a preview, and how big the value is.
    let long = format!("{}TAIL", "word ".repeat(100));
    set(&client, json!({ "key": "long", "value": long })).await;
    let all = client.call("list_notes", json!({})).await.unwrap();
    assert_eq!(all["truncated"], false);
    let mut listed = keys(&all, "notes");
    listed.sort();
    assert_eq!(listed, ["long", "owner", "owner"], "every scope by default");
    let long_entry = all["notes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["key"] == "long")
        .unwrap();
    assert!(long_entry.get("value").is_none());
    assert_eq!(long_entry["bytes"], long.len());
    assert_eq!(long_entry["preview"].as_str().unwrap().chars().count(), 160);
    assert_eq!(long_entry["preview_truncated"], true);

    let web_only = client
        .call("list_notes", json!({ "scope": "project:web" }))
        .await
        .unwrap();
    assert_eq!(keys(&web_only, "notes"), ["owner"]);
    assert_eq!(web_only["notes"][0]["preview"], "web owner");
    assert_eq!(web_only["notes"][0]["preview_truncated"], false);
    let people = client
        .call("list_notes", json!({ "tag": "PEOPLE" }))
        .await
        .unwrap();
    assert_eq!(keys(&people, "notes"), ["owner"]);
    assert_eq!(people["notes"][0]["scope"], "project:web");
}

#[tokio::test]
async fn tags_are_normalised_and_limited_to_16_of_64_bytes() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, None).await;

    let sixteen: Vec<String> = (0..16).map(|i| format!("tag-{i}")).collect();
    let mut with_duplicates = sixteen[..15].to_vec();
    with_duplicates.push(" TAG-3 ".into());
    let ok = set(
        &client,
        json!({ "key": "k", "value": "v", "tags": with_duplicates }),
    )
    .await;
    assert_eq!(ok["tags"].as_array().unwrap().len(), 15, "duplicates merge");
    let full = set(
        &client,
        json!({ "key": "k16", "value": "v", "tags": sixteen }),
    )
    .await;
    assert_eq!(
        full["tags"].as_array().unwrap().len(),
        16,
        "sixteen is the limit"
    );
    let max_tag = "t".repeat(64);
    set(
        &client,
        json!({ "key": "k2", "value": "v", "tags": [max_tag] }),
    )
    .await;
    let before = tables(&app).await;

    let mut seventeen = sixteen.clone();
    seventeen.push("one-too-many".into());
    let err = client
        .call(
            "set_note",
            json!({ "key": "k", "value": "new", "tags": seventeen }),
        )
        .await
        .unwrap_err();
    assert_eq!(err["error"], "invalid");
    let message = err["message"].as_str().unwrap();
    assert!(
        message.contains("tags holds 17 entries") && message.contains("at most 16"),
        "{message}"
    );

    let err = client
        .call(
            "set_note",
            json!({ "key": "k3", "value": "v", "tags": ["t".repeat(65)] }),
        )
        .await
        .unwrap_err();
    assert!(
        err["message"].as_str().unwrap().contains("1-64 bytes"),
        "{err}"
    );
    let err = client
        .call(
            "set_note",
            json!({ "key": "k3", "value": "v", "tags": [""] }),
        )
        .await
        .unwrap_err();
    assert_eq!(err["error"], "invalid");

    assert_eq!(tables(&app).await, before, "refused tags wrote nothing");
    let note = client
        .call("get_note", json!({ "key": "k" }))
        .await
        .unwrap();
    assert_eq!(
        (&note["value"], &note["revision"]),
        (&json!("v"), &json!(1))
    );
}

#[tokio::test]
async fn search_finds_notes_by_words_in_the_value_key_and_tags() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.team("other").await;
    let alice = app.agent("acme", "alice").await;
    let mallory = app.agent("other", "mallory").await;
    let client = app.mcp(&alice, None).await;
    set(
        &client,
        json!({ "key": "release process",
                "value": "Deploying to staging happens from the release branch after CI is green." }),
    )
    .await;
    set(
        &client,
        json!({ "key": "database", "value": "PostgreSQL 15 runs locally on port 5432.",
                "tags": ["infra"] }),
    )
    .await;
    set(
        &client,
        json!({ "scope": "project:web", "key": "frontend", "value": "The web app deploys itself on merge." }),
    )
    .await;

    let found = client
        .call("search_notes", json!({ "query": "deploy staging" }))
        .await
        .unwrap();
    assert_eq!(keys(&found, "results"), ["release process"], "{found}");
    let snippet = found["results"][0]["snippet"].as_str().unwrap();
    assert!(snippet.contains("**staging**"), "{snippet}");
    assert!(found["results"][0].get("value").is_none());

    // Stemming, and every scope unless one is named.
    let deploys = client
        .call("search_notes", json!({ "query": "deploy" }))
        .await
        .unwrap();
    let mut hits = keys(&deploys, "results");
    hits.sort();
    assert_eq!(hits, ["frontend", "release process"]);
    let scoped = client
        .call(
            "search_notes",
            json!({ "query": "deploy", "scope": "project:web" }),
        )
        .await
        .unwrap();
    assert_eq!(keys(&scoped, "results"), ["frontend"]);

    // Keys and tags are searched too; web-search syntax excludes words.
    let by_tag = client
        .call("search_notes", json!({ "query": "infra" }))
        .await
        .unwrap();
    assert_eq!(keys(&by_tag, "results"), ["database"]);
    let by_key = client
        .call("search_notes", json!({ "query": "release -merge" }))
        .await
        .unwrap();
    assert_eq!(keys(&by_key, "results"), ["release process"]);
    let none = client
        .call("search_notes", json!({ "query": "kubernetes" }))
        .await
        .unwrap();
    assert_eq!(none["results"], json!([]));

    // Another team finds nothing of acme's.
    let foreign = app
        .mcp(&mallory, None)
        .await
        .call("search_notes", json!({ "query": "deploy" }))
        .await
        .unwrap();
    assert_eq!(foreign["results"], json!([]));

    let err = client
        .call("search_notes", json!({ "query": "   " }))
        .await
        .unwrap_err();
    assert_eq!(err["error"], "invalid");
    let err = client
        .call("search_notes", json!({ "query": "q".repeat(1025) }))
        .await
        .unwrap_err();
    assert!(
        err["message"].as_str().unwrap().contains("limit is 1024"),
        "{err}"
    );
}

#[tokio::test]
async fn delete_is_idempotent_and_kept_in_the_history() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, Some("w1")).await;
    set(
        &client,
        json!({ "key": "temp", "value": "scratch words", "tags": ["x"] }),
    )
    .await;

    let deleted = client
        .call("delete_note", json!({ "key": "temp" }))
        .await
        .unwrap();
    assert_eq!(
        (&deleted["deleted"], &deleted["revision"]),
        (&json!(true), &json!(2))
    );
    let again = client
        .call("delete_note", json!({ "key": "temp" }))
        .await
        .unwrap();
    assert_eq!(again["deleted"], false);
    let never = client
        .call(
            "delete_note",
            json!({ "key": "never-existed", "scope": "elsewhere" }),
        )
        .await
        .unwrap();
    assert_eq!(never["deleted"], false);

    let gone = client
        .call("get_note", json!({ "key": "temp" }))
        .await
        .unwrap();
    assert_eq!(gone["found"], false);
    assert!(gone["deleted_at"].is_string(), "{gone}");
    assert_eq!(
        client.call("list_notes", json!({})).await.unwrap()["notes"],
        json!([])
    );
    assert_eq!(
        client
            .call("search_notes", json!({ "query": "scratch" }))
            .await
            .unwrap()["results"],
        json!([])
    );

    let history: Vec<(i64, String, Option<String>, String)> = sqlx::query_as(
        "SELECT revision, action, value, author_session FROM note_revisions ORDER BY revision",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        history,
        vec![
            (1, "set".into(), Some("scratch words".into()), "w1".into()),
            (2, "delete".into(), None, "w1".into()),
        ]
    );

    // Set again: a new life, numbered after the deletion.
    let back = set(&client, json!({ "key": "temp", "value": "back" })).await;
    assert_eq!(
        (&back["revision"], &back["created"]),
        (&json!(3), &json!(true))
    );
    assert_eq!(
        back["tags"],
        json!([]),
        "the deleted note's tags are not revived"
    );
}

#[tokio::test]
async fn every_note_limit_is_refused_with_its_number_and_writes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, None).await;

    // Exactly 1 MiB is accepted and searchable, even made of distinct words
    // (the most a search index has to hold).
    let mut mib = String::from("needle");
    let mut i = 0u32;
    while mib.len() < 1024 * 1024 - 16 {
        mib.push_str(&format!(" w{i:x}"));
        i += 1;
    }
    mib.push_str(&"z".repeat(1024 * 1024 - mib.len()));
    assert_eq!(mib.len(), 1024 * 1024);
    let big = set(&client, json!({ "key": "big", "value": mib })).await;
    assert_eq!(big["bytes"], 1024 * 1024);
    let hit = client
        .call("search_notes", json!({ "query": "needle" }))
        .await
        .unwrap();
    assert_eq!(keys(&hit, "results"), ["big"]);
    set(
        &client,
        json!({ "key": &"k".repeat(256), "value": "longest key" }),
    )
    .await;
    let before = tables(&app).await;

    let over = "a".repeat(1024 * 1024 + 1);
    let refusals = [
        (
            "set_note",
            json!({ "key": "big", "value": over }),
            "limit is 1048576 bytes",
        ),
        (
            "set_note",
            json!({ "key": "k".repeat(257), "value": "v" }),
            "limit is 256 bytes",
        ),
        (
            "set_note",
            json!({ "key": "  ", "value": "v" }),
            "1-256 bytes",
        ),
        (
            "set_note",
            json!({ "key": "a\nb", "value": "v" }),
            "control character",
        ),
        (
            "set_note",
            json!({ "scope": "has space", "key": "k", "value": "v" }),
            "1-64 ASCII letters",
        ),
        (
            "set_note",
            json!({ "scope": "s".repeat(65), "key": "k", "value": "v" }),
            "1-64 ASCII letters",
        ),
        ("get_note", json!({ "key": "" }), "1-256 bytes"),
        (
            "delete_note",
            json!({ "key": "k".repeat(257) }),
            "limit is 256 bytes",
        ),
        (
            "list_notes",
            json!({ "scope": "-bad" }),
            "1-64 ASCII letters",
        ),
        ("list_notes", json!({ "tag": "t".repeat(65) }), "1-64 bytes"),
    ];
    for (tool, args, says) in refusals {
        let err = client.call(tool, args.clone()).await.unwrap_err();
        assert_eq!(err["error"], "invalid", "{tool}: {err}");
        let message = err["message"].as_str().unwrap();
        assert!(message.contains(says), "{tool}: {message}");
    }
    assert_eq!(tables(&app).await, before, "refused calls wrote nothing");
}

#[tokio::test]
async fn another_team_sees_no_notes() {
    let app = spawn_app().await;
    app.team("red").await;
    app.team("blue").await;
    let red = app.agent("red", "alice").await;
    let blue = app.agent("blue", "bob").await;
    let red_client = app.mcp(&red, None).await;
    let blue_client = app.mcp(&blue, None).await;
    set(&red_client, json!({ "key": "plan", "value": "red plan" })).await;

    let probe = blue_client
        .call("get_note", json!({ "key": "plan" }))
        .await
        .unwrap();
    assert_eq!(probe["found"], false);
    assert_eq!(
        blue_client.call("list_notes", json!({})).await.unwrap()["notes"],
        json!([])
    );
    // Blue's delete and set of the same key touch only blue's note.
    let deleted = blue_client
        .call("delete_note", json!({ "key": "plan" }))
        .await
        .unwrap();
    assert_eq!(deleted["deleted"], false);
    let blue_set = set(&blue_client, json!({ "key": "plan", "value": "blue plan" })).await;
    assert_eq!(blue_set["revision"], 1);
    let red_note = red_client
        .call("get_note", json!({ "key": "plan" }))
        .await
        .unwrap();
    assert_eq!(
        (&red_note["value"], &red_note["revision"]),
        (&json!("red plan"), &json!(1))
    );
}

#[tokio::test]
async fn a_note_change_wakes_subscribers_and_an_unchanged_set_does_not() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let client = app.mcp(&alice, Some("w1")).await;
    let team_id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = 'acme'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let mut events = app.bus.events.subscribe();
    // The note events this window's calls sent, up to and including the
    // one for `marker`. Each step ends with a marker note of its own, so two
    // identical events (which one notification batch carries once, by
    // design) never meet in one batch and each step's events are counted.
    let mut until = async |marker: &str| {
        let mut seen = Vec::new();
        while seen.last().map(String::as_str) != Some(marker) {
            // A hang guard, not a timing assertion: a loaded CI machine once
            // took more than 10 s to hear one.
            let event = tokio::time::timeout(Duration::from_secs(60), events.recv())
                .await
                .expect("note events arrive")
                .unwrap();
            if event.team_id == team_id && event.kind == EventKind::Note {
                assert_eq!(event.actor_session.as_deref(), Some("w1"));
                seen.push(event.id.clone());
            }
        }
        seen
    };

    set(&client, json!({ "key": "wake", "value": "one" })).await;
    assert_eq!(until("wake").await, ["wake"], "a new note wakes");
    // The same value and tags again is no change: no event before `m1`.
    set(&client, json!({ "key": "wake", "value": "one" })).await;
    set(&client, json!({ "key": "m1", "value": "x" })).await;
    assert_eq!(until("m1").await, ["m1"], "an unchanged set sends nothing");
    client
        .call("delete_note", json!({ "key": "wake" }))
        .await
        .unwrap();
    assert_eq!(until("wake").await, ["wake"], "a deletion wakes");
    // Deleting what is already gone sends nothing.
    client
        .call("delete_note", json!({ "key": "wake" }))
        .await
        .unwrap();
    set(&client, json!({ "key": "m2", "value": "x" })).await;
    assert_eq!(until("m2").await, ["m2"], "a second deletion sends nothing");
}
