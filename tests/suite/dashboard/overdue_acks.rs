//! The overdue acknowledgements panel: `/dashboard/data` lists, per message
//! and agent that still owes it, the acknowledgements past their due time
//! (never a body), and the page draws the panel.

use serde_json::json;
use uuid::Uuid;

use super::{cookie_for, get};
use crate::support::spawn_app;

#[tokio::test]
async fn the_dashboard_lists_overdue_acknowledgements_without_their_bodies() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let alice = app.mcp(&alice_token, None).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    app.agent("acme", "carol").await;
    let cookie = cookie_for(&app, &alice_token, "").await;

    let posted = alice
        .call(
            "post_message",
            json!({"channel": "ops", "body": "secret freeze plan", "ack_required": true,
                   "ack_within_seconds": 60}),
        )
        .await
        .unwrap();
    let id = posted["message"]["id"].as_str().unwrap().to_string();
    let data = get(&app, "/dashboard/data", Some(&cookie)).await.json();
    assert_eq!(data["overdue_acks"], json!([]), "not due yet: {data}");

    bob.call("ack_message", json!({"message_id": id}))
        .await
        .unwrap();
    sqlx::query("UPDATE messages SET ack_due_at = now() - interval '1 second' WHERE id = $1")
        .bind(id.parse::<Uuid>().unwrap())
        .execute(&app.pool)
        .await
        .unwrap();

    let data = get(&app, "/dashboard/data", Some(&cookie)).await.json();
    let overdue = data["overdue_acks"].as_array().unwrap();
    assert_eq!(overdue.len(), 1, "carol only (bob acked): {data}");
    assert_eq!(overdue[0]["debtor"], "carol");
    assert_eq!(overdue[0]["from"], "alice");
    assert_eq!(overdue[0]["channel"], "ops");
    assert_eq!(overdue[0]["message_id"], id.as_str());
    let page = get(&app, "/dashboard", Some(&cookie)).await.body;
    assert!(page.contains("Overdue acknowledgements"), "the panel");
    let panel = page.split("id=\"overdue-acks\"").nth(1).unwrap();
    let panel = panel.split("</section>").next().unwrap();
    assert!(panel.contains("carol") && panel.contains("#ops"), "{panel}");
    assert!(!panel.contains("secret freeze plan"), "never a body");
}

/// In a real browser: an acknowledgement that becomes overdue while the page
/// is open shows in the panel at the next redraw, without a reload, naming
/// who owes it; the message's body, which holds markup, is never drawn.
#[tokio::test]
async fn an_acknowledgement_that_falls_overdue_appears_on_the_open_page() {
    use crate::support::browser::Browser;
    use crate::support::eventually;

    let app = spawn_app().await;
    app.team("acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let alice = app.mcp(&alice_token, None).await;
    app.agent("acme", "carol").await;
    let posted = alice
        .call(
            "post_message",
            json!({"to": "carol", "body": "<b id=\"leak\">rotate the keys</b>",
                   "ack_required": true, "ack_within_seconds": 600}),
        )
        .await
        .unwrap();
    let id: Uuid = posted["message"]["id"].as_str().unwrap().parse().unwrap();

    let browser = Browser::start().await;
    browser.goto(&app.url("/dashboard")).await;
    browser.type_into("#token", &alice_token).await;
    browser.click("#sign-in").await;
    browser
        .wait_for_text("No acknowledgement is overdue.")
        .await;

    sqlx::query("UPDATE messages SET ack_due_at = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    eventually("the overdue acknowledgement on the open page", async || {
        let panel = browser
            .script("return document.getElementById('overdue-acks').textContent;")
            .await;
        panel.as_str().is_some_and(|p| p.contains("carol"))
    })
    .await;
    let panel = browser
        .script("return document.getElementById('overdue-acks').textContent;")
        .await;
    assert!(
        !panel.as_str().unwrap().contains("rotate the keys"),
        "{panel}"
    );
    assert_eq!(
        browser
            .script("return document.getElementById('leak') === null;")
            .await,
        json!(true)
    );
    browser.quit().await;
}
