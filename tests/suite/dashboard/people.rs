//! People on the dashboard over plain HTTP (issue 38 item 1): the binary's
//! `person add|list|revoke`, a revocation ending the sign-in, a person's
//! credential refused on `/mcp`, `list_agents` showing people apart, every
//! write audited with the person's name (and read by agents with
//! `from_person`), a person's input shown as text, and writes without the
//! sign-in's token, from another origin, by an agent, or of anything that
//! would claim or lock refused with nothing changed.

use std::process::{Command, Stdio};

use ai_crew_sync::store::identity::people;
use reqwest::header;
use serde_json::{Value, json};

use super::{Answer, FormBody, client, cookie_for, get};
use crate::support::{TestApp, in_team, spawn_app};

/// Run the binary against the app's database; (succeeded, stdout, stderr).
async fn cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let database_url = app.database_url.clone();
    let config = tempfile::tempdir().unwrap();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .args(&args)
            .env("DATABASE_URL", &database_url)
            .env("BUS_CONFIG_DIR", config.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// A person of `team` and their credential, made in the store.
pub(super) async fn person(app: &TestApp, team: &str, name: &str) -> String {
    people::add(&app.pool, &in_team(team), name)
        .await
        .expect("add person")
        .token
}

/// The sign-in's write token, as the page's forms carry it.
pub(super) async fn write_token(app: &TestApp, cookie: &str) -> String {
    let page = get(app, "/dashboard", Some(cookie)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let at = page
        .body
        .find("name=\"csrf\" value=\"")
        .expect("a person's page carries write forms");
    let rest = &page.body[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// A person's write as the page's form posts it.
pub(super) async fn write(
    app: &TestApp,
    cookie: &str,
    action: &str,
    fields: &[(&str, &str)],
) -> Answer {
    Answer::of(
        client()
            .post(app.url(&format!("/dashboard/write/{action}")))
            .header(header::COOKIE, cookie)
            .form_body(fields)
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn audit_actions(app: &TestApp, actor: &str) -> Vec<(String, String)> {
    sqlx::query_as("SELECT action, subject FROM audit_log WHERE actor = $1 ORDER BY id")
        .bind(actor)
        .fetch_all(&app.pool)
        .await
        .unwrap()
}

async fn messages_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_binary_adds_lists_and_revokes_a_person_and_revoking_ends_their_sign_in() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.agent("acme", "alice").await;

    let (ok, out, err) = cli(&app, &["person", "add", "--team", "acme", "--name", "dana"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("person `dana` added to team `acme`"), "{out}");
    let credential = out
        .split_whitespace()
        .find(|w| w.starts_with("acs_"))
        .expect("the credential, shown once")
        .to_string();
    // The name is one namespace with agents.
    let (ok, _, err) = cli(
        &app,
        &["person", "add", "--team", "acme", "--name", "alice"],
    )
    .await;
    assert!(!ok && err.contains("is taken"), "{err}");

    let cookie = cookie_for(&app, &credential, "").await;
    let data = get(&app, "/dashboard/data", Some(&cookie)).await;
    assert_eq!(data.status, 200, "{}", data.body);
    assert_eq!(data.json()["viewer"]["kind"], "person");
    assert_eq!(data.json()["viewer"]["name"], "dana");

    let (ok, out, err) = cli(&app, &["person", "list", "--team", "acme", "--json"]).await;
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "people only: {list}");
    assert_eq!(list[0]["name"], "dana");
    assert_eq!(list[0]["active_credentials"], 1);
    assert!(list[0]["last_signed_in_at"].is_string(), "{list}");
    assert!(!out.contains(&credential), "never the secret");
    let (ok, out, _) = cli(&app, &["agent", "list", "--team", "acme", "--json"]).await;
    assert!(
        ok && !out.contains("dana"),
        "agent list shows agents: {out}"
    );

    let (ok, out, err) = cli(
        &app,
        &["person", "revoke", "--team", "acme", "--name", "dana"],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("1 credential(s) revoked"), "{out}");
    // The open sign-in ends at its next request.
    let after = get(&app, "/dashboard/data", Some(&cookie)).await;
    assert_eq!(after.status, 401, "{}", after.body);
    assert!(after.body.contains("revoked"), "{}", after.body);
    let (ok, out, _) = cli(&app, &["person", "list", "--team", "acme"]).await;
    assert!(ok && out.contains("revoked"), "{out}");

    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action FROM audit_log WHERE subject = 'dana' ORDER BY id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(actions, ["person.add", "token.issue", "person.revoke"]);
}

#[tokio::test]
async fn a_persons_credential_is_refused_on_mcp_with_what_to_do_instead() {
    let app = spawn_app().await;
    app.team("acme").await;
    let dana = person(&app, "acme", "dana").await;
    let answer = app
        .raw_tool_call("whoami")
        .header(header::AUTHORIZATION, format!("Bearer {dana}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 403);
    let body = answer.text().await.unwrap();
    assert!(
        body.contains("a person of the team, not an agent") && body.contains("/dashboard"),
        "{body}"
    );
    // The official client cannot even connect with it.
    assert!(
        crate::support::McpClient::connect(&app.mcp_url(), &dana, None)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn list_agents_shows_people_apart_and_never_online() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let dana = person(&app, "acme", "dana").await;
    cookie_for(&app, &dana, "").await;
    let mcp = app.mcp(&alice, None).await;
    mcp.call("heartbeat", json!({"status": "active"}))
        .await
        .unwrap();
    let listed = mcp.call("list_agents", json!({})).await.unwrap();
    let agents: Vec<&str> = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["agent"].as_str().unwrap())
        .collect();
    assert_eq!(agents, ["alice"], "{listed}");
    assert_eq!(listed["online_count"], 1);
    assert_eq!(listed["people"][0]["name"], "dana", "{listed}");
    assert!(listed["people"][0]["last_signed_in_at"].is_string());

    // quickstart never turns a person into an agent (nor mints them a token).
    let refused = ai_crew_sync::store::identity::agents::quickstart(
        &app.pool,
        "acme",
        "dana",
        &crate::support::test_actor(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(refused.contains("is a person"), "{refused}");
}

#[tokio::test]
async fn every_write_of_a_person_is_audited_with_their_name_and_agents_see_from_person() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let dana = person(&app, "acme", "dana").await;
    let cookie = cookie_for(&app, &dana, "").await;
    let token = write_token(&app, &cookie).await;
    let alice_mcp = app.mcp(&alice, Some("editor")).await;

    let script = "<script>window.__pwned=1</script> ship it";
    for (action, fields) in [
        (
            "post",
            vec![("channel", "general"), ("body", script), ("announce", "1")],
        ),
        ("post", vec![("to", "alice/editor"), ("body", "a word")]),
        (
            "task-create",
            vec![("key", "ship"), ("title", "Ship it"), ("priority", "high")],
        ),
        (
            "task-priority",
            vec![("key", "ship"), ("priority", "urgent")],
        ),
        ("task-cancel", vec![("key", "ship"), ("reason", "not now")]),
    ] {
        let mut fields = fields;
        fields.push(("csrf", &token));
        let answer = write(&app, &cookie, action, &fields).await;
        assert_eq!(answer.status, 303, "{action}: {}", answer.body);
    }
    assert_eq!(
        audit_actions(&app, "dana").await,
        [
            ("dashboard.post".to_string(), "#general".to_string()),
            ("dashboard.post".to_string(), "alice/editor".to_string()),
            ("dashboard.task_create".to_string(), "ship".to_string()),
            ("dashboard.task_priority".to_string(), "ship".to_string()),
            ("dashboard.task_cancel".to_string(), "ship".to_string()),
        ]
    );

    // The agent reads both messages over MCP, marked as a person's.
    let read = alice_mcp
        .call("read_messages", json!({"scope": "all"}))
        .await
        .unwrap();
    let messages = read["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{read}");
    for m in messages {
        assert_eq!(m["from"], "dana", "{m}");
        assert_eq!(m["from_person"], true, "{m}");
    }
    let task = alice_mcp
        .call("get_task", json!({"key": "ship"}))
        .await
        .unwrap();
    assert_eq!(task["status"], "cancelled", "{task}");

    // A direct message to the person shows on their page, as text.
    alice_mcp
        .call(
            "post_message",
            json!({"to": "dana", "body": "thanks <i>dana</i>"}),
        )
        .await
        .unwrap();
    // What the person typed shows as text on the page.
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    assert!(
        page.body.contains("thanks &lt;i&gt;dana&lt;/i&gt;"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("&lt;script&gt;window.__pwned=1&lt;/script&gt; ship it"),
        "{}",
        page.body
    );
    assert!(!page.body.contains("<script>window.__pwned"));
}

#[tokio::test]
async fn writes_without_the_token_from_another_origin_or_by_an_agent_change_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let dana = person(&app, "acme", "dana").await;
    let cookie = cookie_for(&app, &dana, "").await;
    let token = write_token(&app, &cookie).await;
    let post = [("channel", "general"), ("body", "hello")];

    // No token, and a wrong one.
    let none = write(&app, &cookie, "post", &post).await;
    assert_eq!(none.status, 403, "{}", none.body);
    assert!(none.body.contains("write token"), "{}", none.body);
    let wrong = [post[0], post[1], ("csrf", "AAAA")];
    assert_eq!(write(&app, &cookie, "post", &wrong).await.status, 403);

    // The right token, but posted by another site's page.
    let with = [post[0], post[1], ("csrf", token.as_str())];
    for (name, value) in [
        ("origin", "http://evil.example"),
        ("sec-fetch-site", "cross-site"),
    ] {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(with)
            .finish();
        let answer = Answer::of(
            client()
                .post(app.url("/dashboard/write/post"))
                .header(header::COOKIE, &cookie)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(name, value)
                .body(body)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(answer.status, 403, "{name}: {}", answer.body);
        assert!(answer.body.contains("another site"), "{}", answer.body);
    }

    // Another sign-in's token does not open this one.
    let other = cookie_for(&app, &dana, "").await;
    assert_eq!(write(&app, &other, "post", &with).await.status, 403);

    // An agent signed in only looks.
    let agent_cookie = cookie_for(&app, &alice, "").await;
    let agent_token = {
        let page = get(&app, "/dashboard", Some(&agent_cookie)).await;
        assert!(
            !page.body.contains("name=\"csrf\""),
            "no forms for an agent"
        );
        "x".to_string()
    };
    let by_agent = [post[0], post[1], ("csrf", agent_token.as_str())];
    let refused = write(&app, &agent_cookie, "post", &by_agent).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.body.contains("only a person"), "{}", refused.body);

    // No write claims, leases or locks: there is no such action.
    for action in ["claim", "claim-task", "lock", "reserve"] {
        let answer = write(&app, &cookie, action, &with).await;
        assert_eq!(answer.status, 404, "{action}: {}", answer.body);
    }
    assert_eq!(messages_count(&app).await, 0, "nothing was posted");
    assert!(audit_actions(&app, "dana").await.is_empty());
    // And with everything right, it goes through.
    assert_eq!(write(&app, &cookie, "post", &with).await.status, 303);
    assert_eq!(messages_count(&app).await, 1);
}

#[tokio::test]
async fn a_person_joins_a_conversation_from_the_page_and_acknowledges_a_message_to_them() {
    let app = spawn_app().await;
    super::team_with_conversations(&app, "acme").await;
    let alice = app.agent("acme", "alice").await;
    let dana = person(&app, "acme", "dana").await;
    let cookie = cookie_for(&app, &dana, "").await;
    let token = write_token(&app, &cookie).await;
    let alice_mcp = app.mcp(&alice, None).await;
    let created = alice_mcp
        .call(
            "create_conversation",
            json!({"title": "Release v2", "private": true, "invite": ["dana"]}),
        )
        .await
        .unwrap();
    let conversation = created["id"].as_str().unwrap().to_string();
    // The invitation shows on the person's page, with its join form.
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    assert!(page.body.contains("Release v2"), "{}", page.body);
    let joined = write(
        &app,
        &cookie,
        "conversation-join",
        &[("conversation_id", &conversation), ("csrf", &token)],
    )
    .await;
    assert_eq!(joined.status, 303, "{}", joined.body);

    let sent = alice_mcp
        .call(
            "send_conversation_message",
            json!({"conversation_id": conversation, "body": "Please confirm the freeze",
                   "request_id": uuid::Uuid::new_v4().to_string()}),
        )
        .await
        .unwrap();
    let message_id = sent["message_id"]
        .as_str()
        .or(sent["id"].as_str())
        .unwrap_or_else(|| panic!("{sent}"))
        .to_string();
    // The page shows it with its id, which the acknowledgement form takes.
    let data = get(&app, "/dashboard/data", Some(&cookie)).await.json();
    assert_eq!(
        data["conversations"]["items"][0]["messages"][0]["id"], message_id,
        "{data}"
    );
    let acked = write(
        &app,
        &cookie,
        "ack",
        &[("message_id", &message_id), ("csrf", &token)],
    )
    .await;
    assert_eq!(acked.status, 303, "{}", acked.body);
    let receipts = alice_mcp
        .call("get_message_receipts", json!({"message_id": message_id}))
        .await
        .unwrap();
    assert!(
        receipts.to_string().contains("acknowledged_at\":\"2"),
        "{receipts}"
    );
    let actions: Vec<String> = audit_actions(&app, "dana")
        .await
        .into_iter()
        .map(|(action, _)| action)
        .collect();
    assert_eq!(actions, ["dashboard.join", "dashboard.ack"]);
}

#[tokio::test]
async fn admin_person_over_http_adds_lists_and_revokes_within_the_credentials_team() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.team("other").await;
    let (_, confined) = crate::admin::global_and_confined(&app, "acme").await;
    let api = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut request = crate::support::http_client()
            .request(method, app.url(path))
            .bearer_auth(&confined);
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (status, added) = api(
        reqwest::Method::POST,
        "/admin/teams/acme/people",
        Some(json!({"name": "dana"})),
    )
    .await;
    assert_eq!(status, 201, "{added}");
    let credential = added["token"].as_str().unwrap().to_string();
    let cookie = cookie_for(&app, &credential, "").await;
    let (status, _) = api(
        reqwest::Method::POST,
        "/admin/teams/other/people",
        Some(json!({"name": "eve"})),
    )
    .await;
    assert_eq!(
        status, 403,
        "another team is out of this credential's reach"
    );
    let (status, listed) = api(reqwest::Method::GET, "/admin/teams/acme/people", None).await;
    assert_eq!(status, 200);
    assert_eq!(listed[0]["name"], "dana", "{listed}");
    let (status, revoked) = api(
        reqwest::Method::POST,
        "/admin/teams/acme/people/dana/revoke",
        None,
    )
    .await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(revoked["credentials_revoked"], 1);
    assert_eq!(
        get(&app, "/dashboard/data", Some(&cookie)).await.status,
        401,
        "the open sign-in ended"
    );
    let actors: Vec<(String, String)> =
        sqlx::query_as("SELECT action, actor FROM audit_log WHERE subject = 'dana' ORDER BY id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(actors.len(), 3, "{actors:?}");
    assert!(
        actors
            .iter()
            .all(|(_, actor)| actor.starts_with("admin:acsa_"))
    );
}

#[tokio::test]
async fn a_person_acknowledges_a_direct_and_a_channel_message_that_ask_them_to() {
    // A person owes the acknowledgements agents ask of them (a DM to them; a
    // channel post, as every other member of the team): the page's ack form
    // must clear them, or they stay owed and turn overdue for ever.
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let dana = person(&app, "acme", "dana").await;
    let cookie = cookie_for(&app, &dana, "").await;
    let token = write_token(&app, &cookie).await;
    let alice_mcp = app.mcp(&alice, None).await;
    let dm = alice_mcp
        .call(
            "post_message",
            json!({"to": "dana", "body": "Approve the freeze?", "ack_required": true}),
        )
        .await
        .unwrap();
    let post = alice_mcp
        .call(
            "post_message",
            json!({"channel": "ops", "body": "Freeze at 5", "ack_required": true}),
        )
        .await
        .unwrap();
    let owed = alice_mcp.call("list_owed", json!({})).await.unwrap();
    assert_eq!(owed["owed_to_me"].as_array().unwrap().len(), 2, "{owed}");
    // The direct message shows on the page with its acknowledge form.
    let dm_id = dm["message"]["id"].as_str().unwrap();
    let field = format!("name=\"message_id\" value=\"{dm_id}\"");
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    assert!(page.body.contains(&field), "{}", page.body);
    // Both are listed among the acknowledgements asked of the person, the
    // channel post too (its body is read in the channel list), each with its
    // acknowledge form.
    let post_id = post["message"]["id"].as_str().unwrap();
    let post_field = format!("name=\"message_id\" value=\"{post_id}\"");
    let owed_list = page
        .body
        .split("id=\"owed-list\"")
        .nth(1)
        .unwrap_or_default();
    let owed_list = owed_list.split("</ul>").next().unwrap();
    assert!(
        owed_list.contains(&field) && owed_list.contains(&post_field) && owed_list.contains("#ops"),
        "{}",
        page.body
    );
    for posted in [&dm, &post] {
        let id = posted["message"]["id"].as_str().unwrap();
        let acked = write(
            &app,
            &cookie,
            "ack",
            &[("message_id", id), ("csrf", &token)],
        )
        .await;
        assert_eq!(acked.status, 303, "{}", acked.body);
    }
    let owed = alice_mcp.call("list_owed", json!({})).await.unwrap();
    assert_eq!(owed["owed_to_me"], json!([]), "{owed}");
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    assert!(!page.body.contains(&field), "acknowledged: {}", page.body);
    assert!(
        !page.body.contains(&post_field),
        "acknowledged: {}",
        page.body
    );
    assert!(page.body.contains("No acknowledgement asked of you."));
    let actions: Vec<String> = audit_actions(&app, "dana")
        .await
        .into_iter()
        .map(|(action, _)| action)
        .collect();
    assert_eq!(actions, ["dashboard.ack", "dashboard.ack"]);
}
