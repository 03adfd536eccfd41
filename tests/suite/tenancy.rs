//! Teams are tenants: nothing crosses them, and the database itself refuses a
//! row that points into another team. (Receipts are the exception: they carry
//! no key since migration 0014, and are only ever written with their message,
//! in the one statement that inserts it.)

use ai_crew_sync::store::{identity::agents, identity::tokens};
use serde_json::json;
use uuid::Uuid;

use crate::support::{in_team, spawn_app};

#[tokio::test]
async fn two_teams_cannot_see_each_other() {
    let app = spawn_app().await;
    app.team("red").await;
    app.team("blue").await;
    let red = app.agent("red", "alice").await;
    let blue = app.agent("blue", "alice").await;

    let red_me = app
        .mcp(&red, None)
        .await
        .call("whoami", json!({}))
        .await
        .unwrap();
    let blue_me = app
        .mcp(&blue, None)
        .await
        .call("whoami", json!({}))
        .await
        .unwrap();
    assert_eq!(red_me["team"], "red");
    assert_eq!(blue_me["team"], "blue");
    assert_ne!(
        red_me["agent_id"], blue_me["agent_id"],
        "same name, different agents"
    );

    let red_tokens = tokens::list(&app.pool, &in_team("red")).await.unwrap();
    assert!(red_tokens.iter().all(|t| t.team == "red"));
    assert_eq!(
        agents::list(&app.pool, &in_team("blue"))
            .await
            .unwrap()
            .len(),
        1
    );

    // Disabling red's alice leaves blue's alice working.
    agents::set_disabled(&app.pool, &in_team("red"), "alice", true)
        .await
        .unwrap();
    assert!(
        app.mcp(&blue, None)
            .await
            .call("whoami", json!({}))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn the_database_refuses_a_token_row_pointing_into_another_team() {
    let app = spawn_app().await;
    app.team("red").await;
    app.team("blue").await;
    app.agent("red", "alice").await;
    let red_agent: Uuid = sqlx::query_scalar(
        "SELECT a.id FROM agents a JOIN teams t ON t.id = a.team_id WHERE t.slug = 'red'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let blue_team: Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = 'blue'")
        .fetch_one(&app.pool)
        .await
        .unwrap();

    let err = sqlx::query(
        "INSERT INTO agent_tokens (id, team_id, agent_id, token_sha256, display_prefix)
         VALUES ($1, $2, $3, $4, 'acs_00000000')",
    )
    .bind(Uuid::new_v4())
    .bind(blue_team)
    .bind(red_agent)
    .bind(vec![7u8; 32])
    .execute(&app.pool)
    .await
    .expect_err("a blue token for a red agent must be refused");
    assert_eq!(
        err.as_database_error().and_then(|e| e.code()).as_deref(),
        Some("23503"),
        "{err}"
    );
}
