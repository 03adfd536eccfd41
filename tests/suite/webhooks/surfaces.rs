//! The operator surfaces for webhooks: `bus webhook add|list|pause|resume|remove` (the
//! secret shown once and never listed, private addresses refused without
//! `--allow-private`, every change audited by origin only) and the
//! `/admin/teams/{team}/webhooks` routes, which a credential may use only
//! within its own team and which take a hook's deliveries with it.

use reqwest::Method;
use serde_json::json;

use super::{Receiver, deliveries, eventually, in_state};
use crate::admin::{api, global_and_confined};
use crate::cli::{bus, ok_json};
use crate::support::{postgres::fresh_database_url, spawn_app};

/// `words` split on spaces, as a shell would (no quoting needed here).
fn argv(words: &str) -> Vec<&str> {
    words.split_whitespace().collect()
}

#[tokio::test]
async fn the_cli_adds_lists_and_removes_webhooks_and_audits_them() {
    let db = fresh_database_url().await;
    ok_json(&db, &argv("team create --slug acme --name Acme --json"));

    let refused = bus(
        &db,
        &argv("webhook add --team acme --url http://127.0.0.1:9/hook"),
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--allow-private"), "{stderr}");

    let added = ok_json(
        &db,
        &argv(
            "webhook add --team acme --url http://127.0.0.1:9/hook --kind discord \
             --events task,lock --channel ops --allow-private --json",
        ),
    );
    let secret = added["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"));
    assert_eq!(added["events"], json!(["task", "lock"]));
    assert_eq!(added["kind"], "discord");
    let id = added["id"].as_str().unwrap();

    let text = bus(
        &db,
        &argv("webhook add --team acme --url http://127.0.0.1:9/x --allow-private"),
    );
    let shown = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.status.success() && shown.contains("shown once"),
        "{shown}"
    );

    let list = argv("webhook list --team acme --json");
    let listed = ok_json(&db, &list);
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["channels"], json!(["ops"]));
    assert!(!listed.to_string().contains(secret), "never the secret");
    let table = bus(&db, &argv("webhook list --team acme"));
    assert!(String::from_utf8_lossy(&table.stdout).contains(id));
    assert_eq!(listed[0]["paused_at"], json!(null));

    let paused = ok_json(&db, &["webhook", "pause", "--id", id, "--json"]);
    assert_eq!(paused["changed"], true, "{paused}");
    assert!(paused["paused_at"].is_string(), "{paused}");
    assert!(
        paused["paused_by"].as_str().unwrap().starts_with("cli:"),
        "the operator who paused it: {paused}"
    );
    let again = ok_json(&db, &["webhook", "pause", "--id", id, "--json"]);
    assert_eq!(again["changed"], false, "pausing twice changes nothing");
    assert_eq!(again["paused_at"], paused["paused_at"]);
    let table = bus(&db, &argv("webhook list --team acme"));
    let row = String::from_utf8_lossy(&table.stdout)
        .lines()
        .find(|l| l.contains(id))
        .map(str::to_owned)
        .unwrap();
    assert!(row.contains("paused"), "{row}");
    let said = bus(&db, &["webhook", "resume", "--id", id]);
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(said.contains("resumed"), "{said}");
    let resumed = ok_json(&db, &list);
    assert_eq!(resumed[0]["paused_at"], json!(null));
    let unknown = bus(
        &db,
        &argv("webhook pause --id 00000000-0000-4000-8000-000000000000"),
    );
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no webhook with id"));

    let removed = ok_json(&db, &["webhook", "remove", "--id", id, "--json"]);
    assert_eq!(removed["id"], id);
    assert_eq!(ok_json(&db, &list).as_array().unwrap().len(), 1);
    let again = bus(&db, &["webhook", "remove", "--id", id]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("no webhook with id"));

    let pool = ai_crew_sync::db::connect(&db, 2).await.unwrap();
    let actions: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, detail::text FROM audit_log WHERE action LIKE 'webhook.%' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let names: Vec<&str> = actions.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(
        names,
        [
            "webhook.add",
            "webhook.add",
            "webhook.pause",
            "webhook.resume",
            "webhook.remove"
        ]
    );
    assert!(
        actions[0].1.contains("http://127.0.0.1:9"),
        "{}",
        actions[0].1
    );
    assert!(
        !actions[0].1.contains("/hook"),
        "the audit names the origin only"
    );
}

#[tokio::test]
async fn admin_routes_add_list_and_remove_within_the_credentials_team() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.team("other").await;
    let (root, scoped) = global_and_confined(&app, "other").await;

    let receiver = Receiver::start().await;
    let (status, refused) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/webhooks",
        Some(json!({"url": receiver.url()})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("allow_private")
    );

    let (status, added) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/webhooks",
        Some(json!({"url": receiver.url(), "events": ["task"], "allow_private": true})),
    )
    .await;
    assert_eq!(status, 201, "{added}");
    assert!(added["secret"].as_str().unwrap().starts_with("whsec_"));
    let id = added["id"].as_str().unwrap().to_owned();

    let (status, _) = api(
        &app,
        &scoped,
        Method::GET,
        "/admin/teams/acme/webhooks",
        None,
    )
    .await;
    assert_eq!(status, 403, "a credential of another team");
    let (status, _) = api(
        &app,
        &scoped,
        Method::DELETE,
        &format!("/admin/teams/acme/webhooks/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = api(
        &app,
        &scoped,
        Method::DELETE,
        &format!("/admin/teams/other/webhooks/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "another team's hook is not found from here");
    for action in ["pause", "resume"] {
        let (status, _) = api(
            &app,
            &scoped,
            Method::POST,
            &format!("/admin/teams/acme/webhooks/{id}/{action}"),
            None,
        )
        .await;
        assert_eq!(status, 403, "{action} by a credential of another team");
        let (status, _) = api(
            &app,
            &scoped,
            Method::POST,
            &format!("/admin/teams/other/webhooks/{id}/{action}"),
            None,
        )
        .await;
        assert_eq!(status, 404, "{action}: another team's hook is not found");
    }
    let (status, paused) = api(
        &app,
        &root,
        Method::POST,
        &format!("/admin/teams/acme/webhooks/{id}/pause"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["changed"], true);
    assert!(paused["paused_at"].is_string(), "{paused}");
    let (status, resumed) = api(
        &app,
        &root,
        Method::POST,
        &format!("/admin/teams/acme/webhooks/{id}/resume"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["paused_at"], json!(null));

    // A task event is delivered; the listing counts it.
    let token = app.agent("acme", "alice").await;
    app.mcp(&token, None)
        .await
        .call("create_task", json!({"key": "t", "title": "a task"}))
        .await
        .unwrap();
    eventually("the task event delivered", || async {
        in_state(&app, "delivered").await == 1
    })
    .await;
    let (status, listed) = api(&app, &root, Method::GET, "/admin/teams/acme/webhooks", None).await;
    assert_eq!(status, 200);
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["deliveries"]["delivered"], 1);
    assert!(listed[0].get("secret").is_none());
    assert_eq!(receiver.requests()[0].json()["event"], "task.created");

    let (status, removed) = api(
        &app,
        &root,
        Method::DELETE,
        &format!("/admin/teams/acme/webhooks/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{removed}");
    let (_, listed) = api(&app, &root, Method::GET, "/admin/teams/acme/webhooks", None).await;
    assert_eq!(listed, json!([]));
    assert_eq!(
        deliveries(&app).await.len(),
        0,
        "deliveries go with their hook"
    );

    let audit: Vec<(String, String)> = sqlx::query_as(
        "SELECT action, source FROM audit_log WHERE action LIKE 'webhook.%' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        audit,
        ["add", "pause", "resume", "remove"].map(|a| (format!("webhook.{a}"), "http".to_owned()))
    );
}

/// A hook with `allow_private` makes the server POST wherever its host
/// points (the metrics listener, a cloud metadata address): a credential
/// confined to a team may not set it, a global one may (and so may the local
/// CLI, above). What a refusing receiver answered never reaches a listing:
/// the status and its standard phrase only, never the body.
#[tokio::test]
async fn only_a_global_admin_lets_a_hook_reach_private_addresses_and_no_reply_is_echoed() {
    let app = spawn_app().await;
    app.team("acme").await;
    let (root, scoped) = global_and_confined(&app, "acme").await;
    let receiver = Receiver::start().await;
    receiver.answer_first(&[(404, "instance-id: i-0metadata-secret")]);

    let (status, refused) = api(
        &app,
        &scoped,
        Method::POST,
        "/admin/teams/acme/webhooks",
        Some(json!({"url": receiver.url(), "events": ["task"], "allow_private": true})),
    )
    .await;
    assert_eq!(status, 403, "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("global admin credential") && message.contains("nothing was added"),
        "{message}"
    );
    let (hooks, audits): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM webhooks),
                (SELECT count(*) FROM audit_log WHERE action LIKE 'webhook.%')",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((hooks, audits), (0, 0), "a refused add writes nothing");
    // The same credential still adds a hook to a public address.
    let (status, public) = api(
        &app,
        &scoped,
        Method::POST,
        "/admin/teams/acme/webhooks",
        Some(json!({"url": "http://93.184.216.34/hook", "events": ["lock"]})),
    )
    .await;
    assert_eq!(status, 201, "{public}");
    assert_eq!(public["allow_private"], false);

    let (status, added) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/webhooks",
        Some(json!({"url": receiver.url(), "events": ["task"], "allow_private": true})),
    )
    .await;
    assert_eq!(status, 201, "a global credential may: {added}");
    let token = app.agent("acme", "alice").await;
    app.mcp(&token, None)
        .await
        .call("create_task", json!({"key": "t", "title": "a task"}))
        .await
        .unwrap();
    eventually("the refused delivery failed", || async {
        in_state(&app, "failed").await == 1
    })
    .await;
    assert_eq!(receiver.requests().len(), 1);
    let (status, listed) = api(
        &app,
        &scoped,
        Method::GET,
        "/admin/teams/acme/webhooks",
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    let hook = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["id"] == added["id"])
        .unwrap();
    assert_eq!(
        hook["failures"][0]["last_error"],
        "the receiver answered 404 Not Found"
    );
    assert!(
        !listed.to_string().contains("metadata-secret"),
        "the reply's body is never listed: {listed}"
    );
}
