//! The dashboard's path reservations panel (issue 37): the first render and
//! `/dashboard/data` list every live reservation with its holder, mode,
//! project, reason and expiry, as text; a released one is gone.

use serde_json::json;

use super::{cookie_for, get};
use crate::support::spawn_app;

#[tokio::test]
async fn the_dashboard_lists_live_path_reservations_as_text() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let bob_mcp = app.mcp(&bob, Some("frontend")).await;
    bob_mcp
        .call("heartbeat", json!({"project": "shop"}))
        .await
        .unwrap();
    bob_mcp
        .call(
            "reserve_paths",
            json!({"paths": ["src/<b>api</b>/**"], "reason": "renaming <orders> & co"}),
        )
        .await
        .unwrap();
    bob_mcp
        .call(
            "reserve_paths",
            json!({"paths": ["docs/"], "exclusive": false}),
        )
        .await
        .unwrap();

    let cookie = cookie_for(&app, &alice, "").await;
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let panel = page
        .body
        .split("id=\"reservations\">")
        .nth(1)
        .and_then(|rest| rest.split("</section>").next())
        .unwrap_or_else(|| panic!("no reservations panel in {}", page.body));
    for expected in [
        "src/&lt;b&gt;api&lt;/b&gt;/**",
        "bob/frontend",
        "pill-exclusive",
        "renaming &lt;orders&gt; &amp; co",
        "**/docs",
        "pill-shared",
        "shop",
    ] {
        assert!(
            panel.contains(expected),
            "{expected:?} missing from {panel}"
        );
    }
    assert!(!panel.contains("<b>"), "data is shown as text: {panel}");

    let data = get(&app, "/dashboard/data", Some(&cookie)).await.json();
    let listed = data["reservations"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{data}");
    let api = listed
        .iter()
        .find(|r| r["pattern"] == "src/<b>api</b>/**")
        .unwrap_or_else(|| panic!("{data}"));
    assert_eq!(api["holder"], "bob/frontend");
    assert_eq!(api["exclusive"], true);
    assert_eq!(api["project"], "shop");
    assert_eq!(api["reason"], "renaming <orders> & co");
    assert_eq!(data["limits"]["reservations"], 100);

    bob_mcp.call("release_paths", json!({})).await.unwrap();
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    assert!(page.body.contains("No paths reserved."), "{}", page.body);
}
