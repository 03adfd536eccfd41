//! Path reservations over MCP: globs that overlap both ways, exclusive and
//! shared, owned by one window, scoped to its project, expiring on the
//! database's clock. What reads answer, wake-ups, races, the console and
//! a window's presence: `windows.rs`.

mod windows;

use serde_json::{Value, json};

use crate::client::Console;
use crate::support::eventually::eventually;
use crate::support::{McpClient, TestApp, spawn_app};

fn message(refusal: &Value) -> &str {
    refusal["message"].as_str().unwrap_or_default()
}

/// Every row as (project, pattern, holder window, exclusive, reason,
/// expires_at as text): what a refusal must leave as it was.
async fn rows(app: &TestApp) -> Vec<(String, String, String, bool, Option<String>, String)> {
    sqlx::query_as(
        "SELECT project, pattern, holder_session, exclusive, reason, expires_at::text
         FROM path_reservations ORDER BY project, pattern, holder_session",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

async fn window(app: &TestApp, agent: &str, session: Option<&str>) -> McpClient {
    let token = app.agent("acme", agent).await;
    app.mcp(&token, session).await
}

async fn reserve(client: &McpClient, args: Value) -> Result<Value, Value> {
    client.call("reserve_paths", args).await
}

fn patterns(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|r| r["pattern"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn overlapping_patterns_refuse_each_other_both_ways_and_disjoint_ones_coexist() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", Some("w1")).await;

    // (held, asked): some path matches both, whichever way round.
    let overlapping = [
        ("src/api/users.rs", "src/api/users.rs"),
        ("src/api", "src/api/users.rs"),
        ("src/api/**", "src/api/v2/users.rs"),
        ("src/**/test.rs", "src/a/b/test.rs"),
        ("src/**", "src/api/*.rs"),
        ("src/[ab].rs", "src/a.rs"),
        ("docs/*.md", "docs/[rR]EADME.md"),
    ];
    for (one, other) in overlapping {
        for (held, asked) in [(one, other), (other, one)] {
            reserve(
                &alice,
                json!({"paths": [held], "reason": "refactor the api"}),
            )
            .await
            .unwrap();
            let before = rows(&app).await;
            let refused = reserve(&bob, json!({"paths": [asked]}))
                .await
                .expect_err(&format!("{asked} overlaps {held}"));
            assert_eq!(refused["error"], "conflict", "{refused}");
            let text = message(&refused);
            assert!(
                text.contains(&format!("`{held}`")),
                "names the held pattern: {text}"
            );
            assert!(text.contains("agent `alice` in window `w1`"), "{text}");
            assert!(text.contains("exclusively"), "{text}");
            assert!(text.contains("\"refactor the api\""), "the reason: {text}");
            assert!(text.contains(" s left"), "the expiry: {text}");
            assert!(text.contains("partial: true"), "what to do: {text}");
            assert!(text.contains("check_paths"), "{text}");
            assert_eq!(rows(&app).await, before, "a conflict writes nothing");
            let released = alice.call("release_paths", json!({})).await.unwrap();
            assert_eq!(patterns_of(&released["released"]), vec![held]);
        }
    }

    let disjoint = [
        ("src/api/**", "src/apix.rs"),
        ("src/[ab].rs", "src/c.rs"),
        ("src/a.rs", "src/b.rs"),
        ("docs/*.md", "docs/guide/intro.md"),
    ];
    for (one, other) in disjoint {
        for (held, asked) in [(one, other), (other, one)] {
            reserve(&alice, json!({"paths": [held]})).await.unwrap();
            let taken = reserve(&bob, json!({"paths": [asked]}))
                .await
                .unwrap_or_else(|e| panic!("{asked} does not overlap {held}: {e}"));
            assert_eq!(patterns(&taken["granted"]), vec![asked]);
            alice.call("release_paths", json!({})).await.unwrap();
            bob.call("release_paths", json!({})).await.unwrap();
        }
    }
}

fn patterns_of(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn shared_reservations_coexist_and_exclusive_ones_exclude_every_other_window() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", None).await;
    let carol = window(&app, "carol", Some("c")).await;

    let shared = reserve(&alice, json!({"paths": ["src/**"], "exclusive": false}))
        .await
        .unwrap();
    assert_eq!(shared["granted"][0]["exclusive"], false);
    assert_eq!(shared["granted"][0]["holder"], "alice/w1");
    assert_eq!(shared["project"], "");
    reserve(&bob, json!({"paths": ["src/a.rs"], "exclusive": false}))
        .await
        .expect("shared beside shared");

    let refused = reserve(&carol, json!({"paths": ["src/a.rs"]}))
        .await
        .unwrap_err();
    let text = message(&refused);
    assert!(
        text.contains("`src/**` held shared by agent `alice`"),
        "{text}"
    );
    assert!(
        text.contains("`src/a.rs` held shared by agent `bob` in its shared session"),
        "{text}"
    );
    // Bob turning his shared reservation exclusive meets alice's shared one.
    let refused = reserve(&bob, json!({"paths": ["src/a.rs"], "exclusive": true}))
        .await
        .unwrap_err();
    assert!(message(&refused).contains("agent `alice`"), "{refused}");
    assert!(
        !message(&refused).contains("agent `bob`"),
        "never itself: {refused}"
    );

    reserve(&carol, json!({"paths": ["docs/**"]}))
        .await
        .unwrap();
    let refused = reserve(&alice, json!({"paths": ["docs/x.md"], "exclusive": false}))
        .await
        .unwrap_err();
    assert!(
        message(&refused).contains("held exclusively by agent `carol`"),
        "{refused}"
    );
}

#[tokio::test]
async fn the_holding_window_extends_its_reservation_and_a_sibling_window_is_another_holder() {
    let app = spawn_app().await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let w1 = app.mcp(&token, Some("w1")).await;
    let w2 = app.mcp(&token, Some("w2")).await;

    let first = reserve(
        &w1,
        json!({"paths": ["/src/./a.rs"], "ttl_seconds": 60, "reason": "split a"}),
    )
    .await
    .unwrap();
    let granted = &first["granted"][0];
    assert_eq!(granted["pattern"], "src/a.rs", "stored normalised");
    assert_eq!(granted["extended"], false);
    assert!(granted["seconds_left"].as_i64().unwrap() <= 60);

    let again = reserve(
        &w1,
        json!({"paths": ["src/a.rs"], "ttl_seconds": 600, "exclusive": false}),
    )
    .await
    .unwrap();
    let again = &again["granted"][0];
    assert_eq!(again["extended"], true);
    assert_eq!(again["created_at"], granted["created_at"]);
    assert!(again["seconds_left"].as_i64().unwrap() > 500);
    assert_eq!(again["exclusive"], false, "exclusive follows the new call");
    assert_eq!(again["reason"], "split a", "an omitted reason is kept");
    assert_eq!(rows(&app).await.len(), 1, "extended in place");

    reserve(&w1, json!({"paths": ["src/a.rs"]})).await.unwrap();
    let before = rows(&app).await;
    let refused = reserve(&w2, json!({"paths": ["src/*.rs"], "exclusive": false}))
        .await
        .unwrap_err();
    assert!(message(&refused).contains("window `w1`"), "{refused}");
    assert!(
        message(&refused).contains("another window of your agent"),
        "{refused}"
    );
    let not_mine = w2
        .call("release_paths", json!({"paths": ["src/a.rs"]}))
        .await
        .unwrap();
    assert_eq!(patterns_of(&not_mine["not_held"]), vec!["src/a.rs"]);
    assert_eq!(patterns_of(&not_mine["released"]), Vec::<&str>::new());
    assert_eq!(rows(&app).await, before, "a sibling releases nothing");

    // A pattern without `/` matches at any depth and is stored with its
    // `**/`; a leading `/` anchors it at the root. Either is released as
    // the answer showed it or as it was written.
    let forms = reserve(&w1, json!({"paths": ["Cargo.toml", "/README.md"]}))
        .await
        .unwrap();
    assert_eq!(
        patterns(&forms["granted"]),
        vec!["**/Cargo.toml", "README.md"]
    );
    let refused = reserve(&w2, json!({"paths": ["crates/x/Cargo.toml"]}))
        .await
        .unwrap_err();
    assert!(message(&refused).contains("`**/Cargo.toml`"), "{refused}");
    let checked = w2
        .call(
            "check_paths",
            json!({"paths": ["docs/README.md", "README.md", "crates/x/Cargo.toml"]}),
        )
        .await
        .unwrap();
    assert_eq!(
        checked["exclusive_elsewhere"],
        json!(["README.md", "crates/x/Cargo.toml"]),
        "the root's README.md only, Cargo.toml at any depth"
    );
    let released = w1
        .call(
            "release_paths",
            json!({"paths": ["Cargo.toml", "README.md"]}),
        )
        .await
        .unwrap();
    assert_eq!(
        patterns_of(&released["released"]),
        vec!["**/Cargo.toml", "README.md"]
    );
    assert_eq!(released["not_held"], json!([]));

    let renewed = w1
        .call("renew_reservations", json!({"ttl_seconds": 3600}))
        .await
        .unwrap();
    assert_eq!(renewed["count"], 1);
    assert!(renewed["reservations"][0]["seconds_left"].as_i64().unwrap() > 3500);
    let none = w2.call("renew_reservations", json!({})).await.unwrap();
    assert_eq!(none["count"], 0);
}

#[tokio::test]
async fn reservations_of_different_projects_never_meet() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", Some("w1")).await;
    let carol = window(&app, "carol", Some("w1")).await;
    for (client, project) in [(&alice, "web"), (&bob, "api"), (&carol, "Web")] {
        client
            .call("heartbeat", json!({"project": project}))
            .await
            .unwrap();
    }

    let web = reserve(&alice, json!({"paths": ["src/**"]})).await.unwrap();
    assert_eq!(web["project"], "web");
    assert_eq!(web["granted"][0]["project"], "web");
    let api = reserve(&bob, json!({"paths": ["src/**"]})).await.unwrap();
    assert_eq!(api["project"], "api");
    let refused = reserve(&carol, json!({"paths": ["src/main.rs"]}))
        .await
        .unwrap_err();
    assert!(
        message(&refused).contains("project `web`"),
        "case does not split a project: {refused}"
    );
    assert!(message(&refused).contains("agent `alice`"), "{refused}");

    let checked = bob
        .call("check_paths", json!({"paths": ["src/main.rs"]}))
        .await
        .unwrap();
    assert_eq!(checked["project"], "api");
    let covering = &checked["paths"][0]["reservations"];
    assert_eq!(covering.as_array().unwrap().len(), 1, "{checked}");
    assert_eq!(covering[0]["holder"], "bob/w1");
    assert_eq!(covering[0]["mine"], true);
    assert_eq!(checked["exclusive_elsewhere"], json!([]));
    let listed = bob.call("list_reservations", json!({})).await.unwrap();
    assert_eq!(listed["count"], 1);
    assert_eq!(listed["reservations"][0]["project"], "api");

    // Another project is read by naming it (the git guard's shared window
    // does), and only read: bob's own project is unchanged.
    let there = bob
        .call(
            "check_paths",
            json!({"paths": ["src/main.rs"], "project": " WEB "}),
        )
        .await
        .unwrap();
    assert_eq!(there["project"], "web");
    assert_eq!(there["exclusive_elsewhere"], json!(["src/main.rs"]));
    assert_eq!(there["paths"][0]["reservations"][0]["holder"], "alice/w1");
    let listed = bob
        .call("list_reservations", json!({"project": "web"}))
        .await
        .unwrap();
    assert_eq!(listed["reservations"][0]["holder"], "alice/w1");
    let long = bob
        .call(
            "check_paths",
            json!({"paths": ["a"], "project": "p".repeat(257)}),
        )
        .await
        .unwrap_err();
    assert!(message(&long).contains("256"), "{long}");
    let home = bob
        .call("check_paths", json!({"paths": ["src/main.rs"]}))
        .await
        .unwrap();
    assert_eq!(home["project"], "api");
}

#[tokio::test]
async fn a_reservation_expires_on_the_database_clock_and_then_frees_its_paths() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", Some("w1")).await;
    reserve(&alice, json!({"paths": ["ci/**"], "ttl_seconds": 5}))
        .await
        .unwrap();
    reserve(&bob, json!({"paths": ["ci/deploy.yml"]}))
        .await
        .unwrap_err();
    let checked = bob
        .call("check_paths", json!({"paths": ["ci/deploy.yml"]}))
        .await
        .unwrap();
    assert_eq!(checked["exclusive_elsewhere"], json!(["ci/deploy.yml"]));

    eventually("alice's reservation to expire", async || {
        let checked = bob
            .call("check_paths", json!({"paths": ["ci/deploy.yml"]}))
            .await
            .unwrap();
        checked["exclusive_elsewhere"] == json!([])
    })
    .await;
    let listed = bob.call("list_reservations", json!({})).await.unwrap();
    assert_eq!(listed["count"], 0, "expired ones are not listed: {listed}");
    let renewed = alice.call("renew_reservations", json!({})).await.unwrap();
    assert_eq!(renewed["count"], 0, "an expired one is not revived");

    let taken = reserve(&bob, json!({"paths": ["ci/deploy.yml"]}))
        .await
        .unwrap();
    assert_eq!(taken["granted"][0]["holder"], "bob/w1");
    let left = rows(&app).await;
    assert_eq!(
        left.len(),
        1,
        "the reserve deleted the expired row: {left:?}"
    );
    assert_eq!(left[0].1, "ci/deploy.yml");
}

#[tokio::test]
async fn partial_takes_what_is_free_and_all_or_nothing_takes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", Some("w1")).await;
    reserve(&alice, json!({"paths": ["src/a.rs"], "reason": "fixing a"}))
        .await
        .unwrap();
    let before = rows(&app).await;

    let refused = reserve(&bob, json!({"paths": ["src/a.rs", "src/b.rs"]}))
        .await
        .unwrap_err();
    assert!(message(&refused).contains("1 of 2 patterns"), "{refused}");
    assert_eq!(rows(&app).await, before, "all or nothing");

    let partial = reserve(
        &bob,
        json!({"paths": ["src/a.rs", "src/b.rs"], "partial": true}),
    )
    .await
    .unwrap();
    assert_eq!(patterns(&partial["granted"]), vec!["src/b.rs"]);
    let refused = &partial["refused"][0];
    assert_eq!(refused["pattern"], "src/a.rs");
    assert_eq!(refused["conflicts"][0]["holder"], "alice/w1");
    assert_eq!(refused["conflicts"][0]["reason"], "fixing a");
    assert_eq!(refused["conflicts"][0]["exclusive"], true);
    assert!(refused["conflicts"][0]["seconds_left"].as_i64().unwrap() > 0);

    let nothing = reserve(&bob, json!({"paths": ["src/a.rs"], "partial": true}))
        .await
        .unwrap();
    assert_eq!(nothing["granted"], json!([]));
    assert_eq!(rows(&app).await.len(), 2);
}

#[tokio::test]
async fn every_refusal_names_its_limit_and_changes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    reserve(&alice, json!({"paths": ["held/**"], "ttl_seconds": 300}))
        .await
        .unwrap();
    let before = rows(&app).await;
    let many: Vec<String> = (0..101).map(|i| format!("f{i}.rs")).collect();
    let too_many_paths: Vec<String> = (0..201).map(|i| format!("f{i}.rs")).collect();
    let cases: Vec<(&str, Value, &str)> = vec![
        ("reserve_paths", json!({"paths": many}), "100"),
        ("reserve_paths", json!({"paths": []}), "empty"),
        ("reserve_paths", json!({"paths": ["a.rs", ""]}), "paths[1]"),
        (
            "reserve_paths",
            json!({"paths": ["x"], "ttl_seconds": 4}),
            "between 5 and 86400",
        ),
        (
            "reserve_paths",
            json!({"paths": ["x"], "ttl_seconds": 86_401}),
            "86400",
        ),
        (
            "reserve_paths",
            json!({"paths": ["x"], "reason": "r".repeat(257)}),
            "256",
        ),
        (
            "reserve_paths",
            json!({"paths": ["x"], "reason": "two\nlines"}),
            "reason",
        ),
        ("release_paths", json!({"paths": []}), "Omit `paths`"),
        (
            "renew_reservations",
            json!({"ttl_seconds": 4}),
            "between 5 and 86400",
        ),
        ("check_paths", json!({"paths": too_many_paths}), "200"),
        (
            "check_paths",
            json!({"paths": ["src/../../etc"]}),
            "paths[0]",
        ),
        ("list_reservations", json!({"path": "../etc"}), "`..`"),
        ("reserve_paths", json!({"paths": ["!src/a.rs"]}), "paths[0]"),
    ];
    for (tool, args, limit) in cases {
        let refused = alice.call(tool, args).await.expect_err("must refuse");
        assert_eq!(refused["error"], "invalid", "{tool}: {refused}");
        assert!(
            message(&refused).contains(limit),
            "{tool} must name {limit:?}: {refused}"
        );
    }
    assert_eq!(rows(&app).await, before, "nothing was written");

    // The window's cap: 500 live reservations, then a refusal naming it.
    for batch in 0..5 {
        let paths: Vec<String> = (0..100).map(|i| format!("d{batch}/f{i}.rs")).collect();
        let partial = batch == 4;
        let mut paths = paths;
        if partial {
            paths.pop();
        }
        reserve(&alice, json!({"paths": paths})).await.unwrap();
    }
    let full = rows(&app).await;
    assert_eq!(full.len(), 500);
    let refused = reserve(&alice, json!({"paths": ["one/more.rs", "two/more.rs"]}))
        .await
        .unwrap_err();
    assert_eq!(refused["error"], "conflict");
    assert!(message(&refused).contains("500 per window"), "{refused}");
    assert!(message(&refused).contains("release_paths"), "{refused}");
    assert_eq!(rows(&app).await, full);
    // Extending what it holds adds nothing, so it is not refused.
    reserve(&alice, json!({"paths": ["held/**"]}))
        .await
        .unwrap();
}
