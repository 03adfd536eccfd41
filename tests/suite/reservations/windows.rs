//! Path reservations as readers, waiters, racers and the console see them,
//! and what a window's presence does to its reservations.

use super::*;

#[tokio::test]
async fn check_paths_and_list_reservations_answer_who_holds_what() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", Some("w1")).await;
    reserve(&alice, json!({"paths": ["src/api/**"], "reason": "api v2"}))
        .await
        .unwrap();
    reserve(
        &bob,
        json!({"paths": ["docs/**", "src/api/README.md"], "exclusive": false}),
    )
    .await
    .unwrap_err();
    reserve(&bob, json!({"paths": ["docs/**"], "exclusive": false}))
        .await
        .unwrap();

    let paths = json!({"paths": ["src/api/users.rs", "docs/a.md", "README.md"]});
    let mine = alice.call("check_paths", paths.clone()).await.unwrap();
    assert_eq!(mine["exclusive_elsewhere"], json!([]), "{mine}");
    assert_eq!(mine["paths"][0]["path"], "src/api/users.rs");
    assert_eq!(mine["paths"][0]["reservations"][0]["mine"], true);
    assert_eq!(mine["paths"][1]["reservations"][0]["holder"], "bob/w1");
    assert_eq!(mine["paths"][1]["reservations"][0]["mine"], false);
    assert_eq!(mine["paths"][2]["reservations"], json!([]));

    let theirs = bob.call("check_paths", paths).await.unwrap();
    assert_eq!(theirs["exclusive_elsewhere"], json!(["src/api/users.rs"]));
    let held = &theirs["paths"][0]["reservations"][0];
    assert_eq!(held["pattern"], "src/api/**");
    assert_eq!(held["reason"], "api v2");
    assert_eq!(held["agent"], "alice");
    assert_eq!(held["session"], "w1");

    let all = bob.call("list_reservations", json!({})).await.unwrap();
    assert_eq!(all["count"], 2);
    assert_eq!(all["more"], false);
    let by_path = bob
        .call("list_reservations", json!({"path": "docs/guide/a.md"}))
        .await
        .unwrap();
    assert_eq!(patterns(&by_path["reservations"]), vec!["docs/**"]);
    let by_agent = bob
        .call("list_reservations", json!({"agent": "Alice"}))
        .await
        .unwrap();
    assert_eq!(patterns(&by_agent["reservations"]), vec!["src/api/**"]);
    // An agent not in the team is refused, not listed as holding nothing
    // (issue 38 item 4: never silently empty).
    let nobody = bob
        .call("list_reservations", json!({"agent": "dave"}))
        .await
        .unwrap_err();
    assert_eq!(nobody["error"], "not_found", "{nobody}");
}

#[tokio::test]
async fn a_reserve_and_a_release_wake_a_window_waiting_for_reservations() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = std::sync::Arc::new(window(&app, "bob", Some("w1")).await);
    let wait = || {
        let bob = bob.clone();
        tokio::spawn(async move {
            bob.call(
                "wait_for_updates",
                json!({"kinds": ["reservation"], "timeout_seconds": 60}),
            )
            .await
        })
    };

    let waiting = wait();
    app.until_waiting(1).await;
    reserve(&alice, json!({"paths": ["src/**", "lib/**"]}))
        .await
        .unwrap();
    let woke = waiting.await.unwrap().unwrap();
    assert_eq!(woke["events"][0]["kind"], "reservation", "{woke}");
    // Woken by the reserve's event, the wait names the call ("src/** (+1
    // more)"); when the reserve commits between the wait's registration and
    // its first look at the database, that look finds the rows and names
    // each pattern ("src/**" first). Either way it woke for alice's reserve.
    let id = woke["events"][0]["id"].as_str().unwrap();
    assert!(id == "src/** (+1 more)" || id == "src/**", "{woke}");
    assert_eq!(woke["events"][0]["by"], "alice/w1");

    let waiting = wait();
    app.until_waiting(1).await;
    let released = alice
        .call("release_paths", json!({"paths": ["src/**", "docs/**"]}))
        .await
        .unwrap();
    assert_eq!(patterns_of(&released["released"]), vec!["src/**"]);
    assert_eq!(patterns_of(&released["not_held"]), vec!["docs/**"]);
    let woke = waiting.await.unwrap().unwrap();
    assert_eq!(woke["events"][0]["kind"], "reservation", "{woke}");
    assert_eq!(woke["events"][0]["id"], "src/**");
}

#[tokio::test]
async fn windows_racing_for_overlapping_patterns_leave_exactly_one_holder() {
    let app = spawn_app().await;
    app.team("acme").await;
    let mut racers = tokio::task::JoinSet::new();
    for a in 0..4 {
        let token = app.agent("acme", &format!("agent{a}")).await;
        for w in 0..2 {
            let client = app.mcp(&token, Some(&format!("w{w}"))).await;
            let pattern = if (a + w) % 2 == 0 {
                "src/**"
            } else {
                "src/main.rs"
            };
            racers.spawn(async move {
                client
                    .call("reserve_paths", json!({"paths": [pattern]}))
                    .await
            });
        }
    }
    let mut won = 0;
    while let Some(joined) = racers.join_next().await {
        match joined.unwrap() {
            Ok(_) => won += 1,
            Err(refusal) => assert_eq!(refusal["error"], "conflict", "{refusal}"),
        }
    }
    assert_eq!(won, 1, "overlapping exclusive reservations: one winner");
    assert_eq!(rows(&app).await.len(), 1);
}

#[tokio::test]
async fn the_console_client_reserves_checks_and_releases_paths() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = Console::new(&app, "alice", Some("w1")).await;
    let bob = Console::new(&app, "bob", None).await;

    let reserved = alice
        .ok(&["paths", "reserve", "src/api/**", "--reason", "api v2"])
        .await;
    assert!(
        reserved.starts_with("reserved src/api/** (exclusive) until"),
        "{reserved}"
    );
    let refused = bob.run(&["paths", "reserve", "src/api/users.rs"]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("alice/w1") && refused.stderr.contains("api v2"),
        "the refusal names the holder and its reason: {}",
        refused.stderr
    );
    let partial = bob
        .json(&[
            "paths",
            "reserve",
            "src/api/users.rs",
            "docs/**",
            "--shared",
            "--partial",
        ])
        .await;
    assert_eq!(patterns(&partial["granted"]), vec!["docs/**"]);

    let check = bob
        .run(&["paths", "check", "src/api/users.rs", "README.md"])
        .await;
    assert_eq!(check.code, Some(1), "held exclusively elsewhere: {check:?}");
    assert!(check.stdout.contains("README.md: free"), "{check:?}");
    assert!(check.stderr.contains("src/api/users.rs"), "{check:?}");
    let free = bob.run(&["paths", "check", "docs/a.md"]).await;
    assert_eq!(free.code, Some(0), "its own shared reservation: {free:?}");

    let listed = bob.ok(&["paths", "list", "--agent", "alice"]).await;
    assert!(
        listed.contains("src/api/**") && listed.contains("alice/w1"),
        "{listed}"
    );
    let released = alice.ok(&["paths", "release"]).await;
    assert_eq!(released.trim(), "released src/api/**");
    bob.ok(&["paths", "check", "src/api/users.rs"]).await;
}

/// A project named in a call is the project a heartbeat named the same way,
/// whatever its letters: one rule lower-cases both (`text::lookup_lower`).
/// With PostgreSQL's `lower` for the one and Rust's for the other, a final
/// `Σ` and `İ` (and, on a database whose ctype is C, every non-ASCII
/// capital) made two projects, and the git guard's shared window, which
/// names `.acs.toml`'s project, checked the wrong one.
#[tokio::test]
async fn a_project_named_in_a_call_is_the_project_a_heartbeat_named() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", Some("w1")).await;
    let mut failures = Vec::new();
    for project in ["ΟΔΟΣ", "İzmir"] {
        alice
            .call("heartbeat", json!({"project": project}))
            .await
            .unwrap();
        let taken = reserve(&alice, json!({"paths": ["src/**"]})).await.unwrap();
        let checked = bob
            .call(
                "check_paths",
                json!({"paths": ["src/main.rs"], "project": project}),
            )
            .await
            .unwrap();
        if checked["exclusive_elsewhere"] != json!(["src/main.rs"]) {
            failures.push(format!(
                "{project}: reserved in {:?}, checked in {:?}",
                taken["project"], checked["project"]
            ));
        }
        alice.call("release_paths", json!({})).await.unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A window that left holds nothing: a reserve that lands after its
/// `heartbeat {offline: true}` (a tool call in flight as the proxy leaves,
/// or a client that keeps calling) is refused until a heartbeat brings it
/// back, so it cannot block others for its TTL (up to 24 h).
#[tokio::test]
async fn a_window_that_left_cannot_reserve_until_it_beats_again() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", Some("w1")).await;
    alice.call("heartbeat", json!({})).await.unwrap();
    alice
        .call("heartbeat", json!({"offline": true}))
        .await
        .unwrap();
    let late = reserve(&alice, json!({"paths": ["src/**"], "ttl_seconds": 86_400}))
        .await
        .unwrap_err();
    assert!(message(&late).contains("left"), "{late}");
    assert!(message(&late).contains("heartbeat"), "{late}");
    assert!(rows(&app).await.is_empty(), "nothing was written");
    reserve(&bob, json!({"paths": ["src/main.rs"]}))
        .await
        .unwrap();
    bob.call("release_paths", json!({})).await.unwrap();

    alice.call("heartbeat", json!({})).await.unwrap();
    reserve(&alice, json!({"paths": ["src/**"]})).await.unwrap();
}

/// A window whose presence lapsed (it stopped beating: a crashed host)
/// blocks nobody, even before the departures worker deletes its rows.
#[tokio::test]
async fn a_window_whose_presence_lapsed_blocks_nobody() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = window(&app, "alice", Some("w1")).await;
    let bob = window(&app, "bob", Some("w1")).await;
    alice.call("heartbeat", json!({})).await.unwrap();
    reserve(&alice, json!({"paths": ["src/**"]})).await.unwrap();
    let held = bob
        .call("check_paths", json!({"paths": ["src/main.rs"]}))
        .await
        .unwrap();
    assert_eq!(held["exclusive_elsewhere"], json!(["src/main.rs"]));
    // Its presence lapses (as a crash leaves it: no offline heartbeat).
    sqlx::query("UPDATE presence SET expires_at = now() - interval '1 second'")
        .execute(&app.pool)
        .await
        .unwrap();
    let free = bob
        .call("check_paths", json!({"paths": ["src/main.rs"]}))
        .await
        .unwrap();
    assert_eq!(free["exclusive_elsewhere"], json!([]), "{free}");
    reserve(&bob, json!({"paths": ["src/main.rs"]}))
        .await
        .unwrap();
}
