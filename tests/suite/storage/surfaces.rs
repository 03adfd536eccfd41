//! The operator surfaces for storage: the `bus` binary shows usage, sets
//! the quota and a conversation's retention and prunes (dry run and
//! `--apply`), and the `/admin` routes show usage and prune only within the
//! credential's scope, audited as the admin who asked.

use ai_crew_sync::store::admin;
use reqwest::Method;
use serde_json::json;

use super::{kind, prunable_history};
use crate::admin::api;
use crate::cli::{bus, ok_json};
use crate::support::{spawn_app, test_actor};

#[tokio::test]
async fn the_operator_binary_shows_usage_sets_quota_and_retention_and_prunes() {
    let app = spawn_app().await;
    let history = prunable_history(&app).await;
    let db = app.database_url.clone();
    let talk = history.conversation.to_string();

    let used = ok_json(&db, &["team", "usage", "--team", "acme", "--json"]);
    assert_eq!(kind(&used, "channel_messages")["rows"], 5);
    assert_eq!(kind(&used, "direct_messages")["rows"], 2);
    let shown = bus(&db, &["team", "usage", "--team", "acme"]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("\nchannel_messages "), "{shown}");
    assert!(
        shown.contains(&format!("{} of 1073741824 bytes used", used["used_bytes"])),
        "{shown}"
    );

    let quota = ok_json(
        &db,
        &[
            "team", "quota", "--team", "acme", "--bytes", "100000", "--json",
        ],
    );
    assert_eq!(quota["attachment_bytes_limit"], 100000);
    assert_eq!(quota["storage_bytes_limit"], 100000);
    assert_eq!(quota["storage_bytes_used"], used["used_bytes"]);

    let set = ok_json(
        &db,
        &[
            "conversations",
            "retention",
            "--team",
            "acme",
            "--conversation",
            &talk,
            "--days",
            "2",
            "--json",
        ],
    );
    assert_eq!(set["retention_days"], 2);
    let refused = bus(
        &db,
        &[
            "conversations",
            "retention",
            "--team",
            "acme",
            "--conversation",
            &talk,
            "--days",
            "0",
        ],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("1 to 36500"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let shown = bus(
        &db,
        &[
            "team",
            "prune",
            "--team",
            "acme",
            "--older-than-days",
            "30",
            "--audit-older-than-days",
            "30",
        ],
    );
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("dry run, nothing removed"), "{shown}");
    assert!(shown.contains("\nchannel_messages   "), "{shown}");

    let dry = ok_json(
        &db,
        &[
            "team",
            "prune",
            "--team",
            "acme",
            "--older-than-days",
            "30",
            "--json",
        ],
    );
    assert_eq!(dry["applied"], false);
    assert_eq!(kind(&dry, "channel_messages")["rows"], 3);
    let applied = ok_json(
        &db,
        &[
            "team",
            "prune",
            "--team",
            "acme",
            "--older-than-days",
            "30",
            "--apply",
            "--json",
        ],
    );
    assert_eq!(applied["kinds"], dry["kinds"]);
    let text = bus(
        &db,
        &["team", "prune", "--team", "acme", "--older-than-days", "30"],
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("dry run, nothing removed"), "{text}");
    assert!(text.contains("total: 0 rows, 0 bytes"), "{text}");

    let out = bus(
        &db,
        &["team", "prune", "--team", "acme", "--older-than-days=-1"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("from 0 to 36500"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_admin_routes_show_usage_and_prune_within_the_credential_scope() {
    let app = spawn_app().await;
    prunable_history(&app).await;
    app.team("other").await;
    let root = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;
    let (_, granted) = api(
        &app,
        &root,
        Method::POST,
        "/admin/credentials",
        Some(json!({"team": "other"})),
    )
    .await;
    let other_only = granted["credential"].as_str().unwrap().to_owned();

    let (status, used) = api(&app, &root, Method::GET, "/admin/teams/acme/usage", None).await;
    assert_eq!(status, 200, "{used}");
    assert_eq!(kind(&used, "channel_messages")["rows"], 5);

    let (status, dry) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/prune",
        Some(json!({"older_than_days": 30})),
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["applied"], false);
    let (status, applied) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/prune",
        Some(json!({"older_than_days": 30, "apply": true})),
    )
    .await;
    assert_eq!(status, 200, "{applied}");
    assert_eq!(applied["kinds"], dry["kinds"]);

    let (status, refused) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/prune",
        Some(json!({"older_than_days": 30, "everything": true})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    let (status, _) = api(
        &app,
        &other_only,
        Method::GET,
        "/admin/teams/acme/usage",
        None,
    )
    .await;
    assert_eq!(status, 403, "a credential of another team");
    let actor: String = sqlx::query_scalar(
        "SELECT actor FROM audit_log WHERE action = 'team.prune' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(actor.starts_with("admin:"), "{actor}");
}
