//! The operator surfaces for storage: the `bus` binary shows usage, sets
//! the quota and a conversation's retention and prunes (dry run and
//! `--apply`), and the `/admin` routes show usage and prune only within the
//! credential's scope, audited as the admin who asked.

use ai_crew_sync::store::identity::admin;
use reqwest::Method;
use serde_json::json;

use super::{kind, prunable_history};
use crate::admin::{api, global_and_confined};
use crate::cli::{bus, ok_json};
use crate::support::spawn_app;

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
    let (root, other_only) = global_and_confined(&app, "other").await;

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

/// Team acme's audit rows older than the cut-off: what an audit prune may take.
async fn old_audit_rows(app: &crate::support::TestApp) -> i64 {
    super::count(
        app,
        "SELECT (SELECT count(*) FROM audit_log x JOIN teams t ON t.id = x.team_id
                  WHERE t.slug = 'acme' AND x.at < now() - interval '30 days')
              + (SELECT count(*) FROM conversation_audit x JOIN teams t ON t.id = x.team_id
                  WHERE t.slug = 'acme' AND x.at < now() - interval '30 days')",
    )
    .await
}

/// Issue 33 item 4: a team's audit trail is pruned only by a global admin or
/// the local operator, never younger than the minimum, and a prune writes a
/// fenced `team.prune_started` row before its first batch: a revoked
/// credential removes nothing, and one revoked between batches stops it.
#[tokio::test]
async fn only_a_global_authority_prunes_the_audit_trail_past_the_minimum_and_revocation_stops_it() {
    use ai_crew_sync::auth;
    use ai_crew_sync::store::identity::admin::Authority;
    use ai_crew_sync::store::operations::retention::{self, PruneRequest};

    let app = spawn_app().await;
    prunable_history(&app).await;
    let (root, acme_only) = global_and_confined(&app, "acme").await;
    let audit_before = old_audit_rows(&app).await;
    assert!(audit_before > 0);
    let messages = "SELECT count(*) FROM messages";
    let messages_before = super::count(&app, messages).await;

    // The team's own admin: refused, nothing removed, not even its messages.
    let (status, refused) = api(
        &app,
        &acme_only,
        Method::POST,
        "/admin/teams/acme/prune",
        Some(json!({"older_than_days": 30, "audit_older_than_days": 30, "apply": true})),
    )
    .await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused
            .to_string()
            .contains("only a global admin credential can prune a team's audit trail"),
        "{refused}"
    );
    // A global admin below the minimum: refused with the minimum named.
    let (status, refused) = api(
        &app,
        &root,
        Method::POST,
        "/admin/teams/acme/prune",
        Some(json!({"older_than_days": 30, "audit_older_than_days": 0, "apply": true})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused.to_string().contains("minimum of 30 days"),
        "{refused}"
    );
    assert_eq!(old_audit_rows(&app).await, audit_before);
    assert_eq!(super::count(&app, messages).await, messages_before);

    // A global credential revoked after it was checked (a request in
    // flight): the fenced start row refuses the prune before any batch.
    let request = PruneRequest {
        older_than_days: 30,
        audit_older_than_days: Some(30),
        apply: true,
    };
    let as_admin = async |credential: &str| {
        let digest = auth::parse_admin_credential(credential).unwrap();
        let me = admin::authenticate(&app.pool, &digest).await.unwrap();
        (me.credential_id, Authority::Admin(me).team("acme").unwrap())
    };
    let (root_id, scope) = as_admin(&root).await;
    let second = admin::grant(&app.pool, &crate::support::globally(), None, None)
        .await
        .unwrap();
    admin::revoke(&app.pool, &crate::support::globally(), root_id)
        .await
        .unwrap();
    let err = retention::prune(&app.pool, &app.bus.backends, &scope, &request, &|_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("was revoked"), "{err}");
    assert_eq!(
        super::count(&app, messages).await,
        messages_before,
        "nothing removed"
    );
    assert_eq!(old_audit_rows(&app).await, audit_before);

    // Revoked between batches (after the first one, of channel messages,
    // reports): the very next batch is refused, whatever its kind (without
    // the fence on the message batches the prune ran on to note revisions),
    // and what it had not reached stays.
    let (second_id, scope) = as_admin(&second.credential).await;
    let database_url = app.database_url.clone();
    let revoked = std::sync::Once::new();
    let err = retention::prune(&app.pool, &app.bus.backends, &scope, &request, &|_| {
        revoked.call_once(|| {
            let database_url = database_url.clone();
            std::thread::spawn(move || {
                tokio::runtime::Runtime::new().unwrap().block_on(async {
                    let pool = sqlx::PgPool::connect(&database_url).await.unwrap();
                    admin::revoke(&pool, &crate::support::globally(), second_id)
                        .await
                        .unwrap();
                })
            })
            .join()
            .unwrap();
        })
    })
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("the prune stopped at channel_messages after"),
        "{err}"
    );
    assert_eq!(
        old_audit_rows(&app).await,
        audit_before,
        "no audit row went"
    );
    let started: Vec<String> = sqlx::query_scalar(
        "SELECT actor FROM audit_log WHERE action = 'team.prune_started' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        started.len(),
        1,
        "the second credential's start: {started:?}"
    );
    assert!(started[0].starts_with("admin:"), "{started:?}");

    // The local operator may, past the minimum.
    let pruned = retention::prune(
        &app.pool,
        &app.bus.backends,
        &crate::support::in_team("acme"),
        &request,
        &|_| {},
    )
    .await
    .unwrap();
    assert_eq!(
        pruned.kind("audit").unwrap().rows + pruned.kind("conversation_audit").unwrap().rows,
        audit_before
    );
    assert_eq!(old_audit_rows(&app).await, 0);
}
