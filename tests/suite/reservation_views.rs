//! Where path reservations show beside the windows that hold them (issue 37,
//! item 4): `list_agents` and `team_digest` give each window's live
//! reservations, bounded; the proxy's instructions teach reserve -> edit ->
//! release and name the team's reserved paths. (The dashboard's panel is
//! `dashboard/reservations.rs`; the `/reserve` recipe is checked with the
//! plugin's other commands in `plugin.rs`.)

use serde_json::{Value, json};

use crate::proxy::{Machine, calls};
use crate::support::spawn_app;

/// The window at `address` in a `list_agents` answer.
fn window<'a>(agents: &'a Value, address: &str) -> &'a Value {
    agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["windows"].as_array().unwrap())
        .find(|w| w["address"] == address)
        .unwrap_or_else(|| panic!("no window {address} in {agents}"))
}

#[tokio::test]
async fn list_agents_and_team_digest_show_each_windows_reservations_bounded() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let alice = app.mcp(&alice, Some("backend")).await;
    let bob = app.mcp(&bob, Some("frontend")).await;
    for client in [&alice, &bob] {
        client
            .call("heartbeat", json!({"project": "shop"}))
            .await
            .unwrap();
    }
    alice
        .call(
            "reserve_paths",
            json!({"paths": ["src/api/", "/schema.sql"], "reason": "renaming the orders API",
                   "ttl_seconds": 600}),
        )
        .await
        .unwrap();
    bob.call(
        "reserve_paths",
        json!({"paths": ["web/**"], "exclusive": false}),
    )
    .await
    .unwrap();

    let agents = bob.call("list_agents", json!({})).await.unwrap();
    let held = &window(&agents, "alice/backend")["reservations"];
    assert_eq!(held["count"], 2, "{held}");
    let items = held["items"].as_array().unwrap();
    let patterns: Vec<&str> = items
        .iter()
        .map(|r| r["pattern"].as_str().unwrap())
        .collect();
    assert_eq!(
        patterns,
        ["schema.sql", "src/api"],
        "normalised, by pattern"
    );
    for r in items {
        assert_eq!(r["exclusive"], true, "{r}");
        assert_eq!(r["project"], "shop", "{r}");
        assert_eq!(r["reason"], "renaming the orders API", "{r}");
        assert!(r["expires_at"].as_str().unwrap().starts_with("20"), "{r}");
    }
    let shared = &window(&agents, "bob/frontend")["reservations"];
    assert_eq!(shared["items"][0]["pattern"], "web/**");
    assert_eq!(shared["items"][0]["exclusive"], false);

    let digest = bob.call("team_digest", json!({})).await.unwrap();
    let holders: Vec<(&str, i64)> = digest["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["holder"].as_str().unwrap(), w["count"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        holders,
        [("alice/backend", 2), ("bob/frontend", 1)],
        "{digest}"
    );

    // Bounded: a window holding many shows its first 10 and its count.
    let many: Vec<String> = (0..15).map(|k| format!("gen/f{k:02}.rs")).collect();
    alice
        .call("reserve_paths", json!({"paths": many}))
        .await
        .unwrap();
    let agents = bob.call("list_agents", json!({})).await.unwrap();
    let held = &window(&agents, "alice/backend")["reservations"];
    assert_eq!(held["count"], 17, "{held}");
    assert_eq!(held["items"].as_array().unwrap().len(), 10, "{held}");
    let digest = alice.call("team_digest", json!({})).await.unwrap();
    assert_eq!(digest["reservations"][0]["count"], 17, "{digest}");
    assert_eq!(
        digest["reservations"][0]["items"].as_array().unwrap().len(),
        10
    );

    // Released: no longer shown; a window holding none has no field at all.
    alice.call("release_paths", json!({})).await.unwrap();
    let agents = bob.call("list_agents", json!({})).await.unwrap();
    assert!(
        window(&agents, "alice/backend")
            .get("reservations")
            .is_none(),
        "{agents}"
    );
    let digest = bob.call("team_digest", json!({})).await.unwrap();
    assert_eq!(
        digest["reservations"].as_array().unwrap().len(),
        1,
        "{digest}"
    );
}

#[tokio::test]
async fn the_proxys_instructions_teach_reserve_edit_release_and_name_reserved_paths() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let bob = app.mcp(&bob, Some("frontend")).await;
    bob.call(
        "reserve_paths",
        json!({"paths": ["/src/api/**"], "reason": "new endpoints"}),
    )
    .await
    .unwrap();
    let machine = Machine::with_profiles(&app, &[("work", "alice", &alice)]);
    let lines = machine
        .drive(
            &["--host-session", "conv-7"],
            json!([{"op": "call", "tool": "session_status"}]),
        )
        .await;
    assert_eq!(calls(&lines)[0]["is_error"], false, "{lines:#?}");
    let instructions = lines
        .iter()
        .find(|l| l["step"] == "initialize")
        .and_then(|l| l["instructions"].as_str())
        .unwrap_or_else(|| panic!("no instructions in {lines:#?}"));
    for expected in [
        "reserve_paths",
        "then edit, then release_paths",
        "Paths reserved: src/api/** by bob/frontend (exclusive, until ",
    ] {
        assert!(
            instructions.contains(expected),
            "{expected:?} in {instructions}"
        );
    }
    assert!(instructions.chars().count() <= 2_000);
}
