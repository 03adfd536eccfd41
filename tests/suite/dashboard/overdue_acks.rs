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
