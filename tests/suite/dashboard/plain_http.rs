//! The dashboard over plain HTTP: every answer carries the protective
//! headers; a credential in the query string, a bad token, a tampered or
//! foreign cookie are refused; the cookie opens neither `/mcp` nor `/admin`;
//! revoking the token or disabling the agent ends the session; an admin
//! credential signs in only for a team it may see; and `/dashboard/data`
//! never carries a direct message or a conversation the signer is not in.

use ai_crew_sync::store::{identity::admin, identity::agents, identity::tokens};
use reqwest::header;
use serde_json::json;

use super::{
    Answer, FormBody, client, cookie_for, get, private_conversation, send, sign_in,
    team_with_conversations,
};
use crate::support::{globally, in_team, spawn_app, test_actor};

#[tokio::test]
async fn every_dashboard_answer_carries_the_protective_headers() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let cookie = cookie_for(&app, &alice, "").await;
    let answers = [
        get(&app, "/dashboard", None).await,
        get(&app, "/dashboard", Some(&cookie)).await,
        get(&app, "/dashboard/data", Some(&cookie)).await,
        get(&app, "/dashboard/data", None).await,
        get(&app, "/dashboard/app.js", None).await,
        get(&app, "/dashboard/app.css", None).await,
        get(&app, "/dashboard?token=x", None).await,
        sign_in(&app, "acs_nonsense", "").await,
    ];
    for answer in &answers {
        let h = |name: &str| {
            answer
                .headers
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(h("cache-control").as_deref(), Some("no-store"));
        assert_eq!(h("referrer-policy").as_deref(), Some("no-referrer"));
        assert_eq!(h("x-content-type-options").as_deref(), Some("nosniff"));
        assert_eq!(h("x-frame-options").as_deref(), Some("DENY"));
        let csp = h("content-security-policy").unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "form-action 'self'",
            "base-uri 'none'",
        ] {
            assert!(csp.contains(directive), "{csp}");
        }
    }
    let page = &answers[1];
    assert_eq!(page.status, 200);
    assert!(page.body.contains("signed in as <strong>alice</strong>"));
    assert!(!page.body.contains("<style"), "no inline style");
    assert_eq!(page.body.matches("<script").count(), 1, "only app.js");
    assert!(answers[4].body.contains("textContent"));
    assert_eq!(
        answers[4].headers[header::CONTENT_TYPE],
        "text/javascript; charset=utf-8"
    );
    assert_eq!(answers[3].status, 401);
}

#[tokio::test]
async fn a_credential_in_the_query_string_is_refused() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    for query in [
        format!("token={alice}"),
        format!("access_token={alice}"),
        format!("x={alice}"),
        "auth_token=whatever".to_string(),
    ] {
        for path in ["/dashboard", "/dashboard/data"] {
            let answer = get(&app, &format!("{path}?{query}"), None).await;
            assert_eq!(answer.status, 400, "{path}?{query}");
            assert!(answer.cookie().is_none());
            let message = answer.json()["message"].as_str().unwrap().to_string();
            assert!(message.contains("sign-in form"), "{message}");
            assert!(!message.contains(&alice), "the token is not echoed");
        }
    }
    let answer = Answer::of(
        client()
            .post(app.url(&format!("/dashboard/sign-in?token={alice}")))
            .form_body(&[("token", alice.as_str())])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        answer.status, 400,
        "a sign-in with the token in the URL too"
    );
    assert!(answer.cookie().is_none());
}

#[tokio::test]
async fn a_bad_credential_gets_the_form_again_with_an_error_and_no_cookie() {
    let app = spawn_app().await;
    app.team("acme").await;
    let unknown = format!("acs_{}", "0".repeat(64));
    for (token, team, says) in [
        ("", "", "paste an agent token"),
        ("acs_123", "", "malformed agent token"),
        (unknown.as_str(), "", "unknown agent token"),
        ("hunter2", "", "not an agent token"),
    ] {
        let answer = sign_in(&app, token, team).await;
        assert!(answer.status >= 400, "{token:?}: {}", answer.status);
        assert!(answer.cookie().is_none(), "{token:?} got a cookie");
        assert!(
            answer.body.contains("id=\"sign-in-error\""),
            "{}",
            answer.body
        );
        assert!(answer.body.contains(says), "{token:?}: {}", answer.body);
        assert!(answer.body.contains("name=\"token\""), "the form again");
    }
    // The refusal escapes what it repeats.
    let answer = sign_in(&app, "<script>alert(1)</script>", "").await;
    assert!(!answer.body.contains("<script>alert"));
}

#[tokio::test]
async fn a_tampered_or_foreign_cookie_is_refused() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let cookie = cookie_for(&app, &alice, "").await;
    assert_eq!(
        get(&app, "/dashboard/data", Some(&cookie)).await.status,
        200
    );

    let (name, value) = cookie.split_once('=').unwrap();
    let (payload, signature) = value.split_once('.').unwrap();
    let mut flipped = signature.chars().collect::<Vec<_>>();
    flipped[0] = if flipped[0] == 'A' { 'B' } else { 'A' };
    let flipped: String = flipped.into_iter().collect();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let text = String::from_utf8(b64.decode(payload).unwrap()).unwrap();
    let later = text.rsplit_once('|').unwrap().0.to_string() + "|9999999999";
    for forged in [
        format!("{name}={payload}.{flipped}"),
        format!("{name}={}.{signature}", b64.encode(later)),
        format!(
            "{name}={}.{signature}",
            b64.encode(text.replacen("agent", "admin", 1))
        ),
        format!("{name}=garbage"),
    ] {
        let data = get(&app, "/dashboard/data", Some(&forged)).await;
        assert_eq!(data.status, 401, "{forged}");
        assert!(data.body.contains("Sign in again"), "{}", data.body);
        let page = get(&app, "/dashboard", Some(&forged)).await;
        assert_eq!(page.status, 401);
        assert!(page.body.contains("name=\"token\""), "the form");
        assert!(!page.body.contains("signed in as"));
    }

    // Another server (another per-process key) does not take it either.
    let other = crate::support::TestApp::builder()
        .database(app.pool.clone(), app.database_url.clone())
        .spawn()
        .await;
    assert_eq!(
        get(&other, "/dashboard/data", Some(&cookie)).await.status,
        401
    );
}

#[tokio::test]
async fn the_dashboard_cookie_opens_neither_mcp_nor_admin() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let root = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;
    for (token, team) in [(alice.as_str(), ""), (root.as_str(), "acme")] {
        let cookie = cookie_for(&app, token, team).await;
        let mcp = app
            .raw_tool_call("whoami")
            .header(header::COOKIE, &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(mcp.status(), 401, "/mcp with only the cookie");
        let admin = client()
            .get(app.url("/admin/whoami"))
            .header(header::COOKIE, &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(admin.status(), 401, "/admin with only the cookie");
        // The cookie itself is kept to the dashboard and away from scripts.
        let set = sign_in(&app, token, team).await;
        let attributes = set.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .to_string();
        for attribute in ["Path=/dashboard", "HttpOnly", "SameSite=Strict"] {
            assert!(attributes.contains(attribute), "{attributes}");
        }
        assert!(!attributes.contains("Secure"), "plain http on loopback");
    }
    let over_https = Answer::of(
        client()
            .post(app.url("/dashboard/sign-in"))
            .header("X-Forwarded-Proto", "https")
            .form_body(&[("token", alice.as_str())])
            .send()
            .await
            .unwrap(),
    )
    .await;
    for (name, value) in [
        ("origin", "https://evil.example"),
        ("sec-fetch-site", "cross-site"),
    ] {
        let elsewhere = Answer::of(
            client()
                .post(app.url("/dashboard/sign-in"))
                .header(name, value)
                .form_body(&[("token", alice.as_str())])
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(elsewhere.status, 403, "a sign-in posted from another site");
        assert!(elsewhere.cookie().is_none());
    }
    assert!(
        over_https.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("; Secure")
    );
}

#[tokio::test]
async fn a_revoked_token_or_a_disabled_agent_ends_the_session_at_the_next_request() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;

    let cookie = cookie_for(&app, &alice, "").await;
    assert_eq!(
        get(&app, "/dashboard/data", Some(&cookie)).await.status,
        200
    );
    let id = tokens::list(&app.pool, &in_team("acme"))
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.agent == "alice")
        .unwrap()
        .id;
    tokens::revoke(&app.pool, id, &globally()).await.unwrap();
    let after = get(&app, "/dashboard/data", Some(&cookie)).await;
    assert_eq!(after.status, 401);
    assert!(after.body.contains("revoked"), "{}", after.body);
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    assert!(page.body.contains("name=\"token\""));
    assert!(
        page.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0"),
        "the dead cookie is cleared"
    );

    let cookie = cookie_for(&app, &bob, "").await;
    agents::set_disabled(&app.pool, &in_team("acme"), "bob", true)
        .await
        .unwrap();
    assert_eq!(
        get(&app, "/dashboard/data", Some(&cookie)).await.status,
        401
    );
    let refused = sign_in(&app, &bob, "").await;
    assert!(
        refused.cookie().is_none(),
        "a disabled agent cannot sign in"
    );

    // Sign-out clears the cookie.
    agents::set_disabled(&app.pool, &in_team("acme"), "bob", false)
        .await
        .unwrap();
    cookie_for(&app, &bob, "").await;
    let out = Answer::of(
        client()
            .post(app.url("/dashboard/sign-out"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(out.status, 303);
    assert_eq!(out.cookie().as_deref(), Some("crew_dashboard="));
}

#[tokio::test]
async fn data_never_carries_a_direct_message_or_a_conversation_the_signer_is_not_in() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let carol = app.agent("acme", "carol").await;
    let (alice_mcp, bob_mcp, carol_mcp) = (
        app.mcp(&alice, None).await,
        app.mcp(&bob, None).await,
        app.mcp(&carol, None).await,
    );
    bob_mcp
        .call(
            "post_message",
            json!({"to": "carol", "body": "dm-bob-to-carol-7f3a"}),
        )
        .await
        .unwrap();
    alice_mcp
        .call(
            "post_message",
            json!({"to": "bob", "body": "dm-alice-to-bob-91c2"}),
        )
        .await
        .unwrap();
    alice_mcp
        .call(
            "post_message",
            json!({"channel": "general", "body": "channel-hello-5e1d"}),
        )
        .await
        .unwrap();
    let secret_id = private_conversation(&bob_mcp, "Bob and Carol only", "carol", &carol_mcp).await;
    send(&bob_mcp, &secret_id, "secret-body-b0b-ca401").await;
    let ours_id = private_conversation(&alice_mcp, "Alice and Bob", "bob", &bob_mcp).await;
    send(&alice_mcp, &ours_id, "ours-body-a11ce-b0b").await;

    let cookie = cookie_for(&app, &alice, "").await;
    let data = get(&app, "/dashboard/data", Some(&cookie)).await;
    assert_eq!(data.status, 200);
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    for body in [&data.body, &page.body] {
        for never in [
            "dm-bob-to-carol-7f3a",
            "dm-alice-to-bob-91c2",
            "secret-body-b0b-ca401",
            "Bob and Carol only",
        ] {
            assert!(!body.contains(never), "{never} leaked into {body}");
        }
        assert!(body.contains("channel-hello-5e1d"));
        assert!(body.contains("ours-body-a11ce-b0b"));
    }
    let json = data.json();
    let conversations = json["conversations"]["items"].as_array().unwrap();
    assert_eq!(conversations.len(), 1, "{json}");
    let message = &conversations[0]["messages"][0];
    assert_eq!(message["body"], "ours-body-a11ce-b0b");
    assert_eq!(message["recipients"], 1, "bob: {message}");
    assert_eq!(message["stored"], 1);
    assert_eq!(message["acknowledged"], 0);

    // An admin sees every conversation's metadata and receipt counts, never a body.
    let root = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;
    let cookie = cookie_for(&app, &root, "acme").await;
    let data = get(&app, "/dashboard/data", Some(&cookie)).await;
    assert_eq!(data.status, 200);
    for never in [
        "dm-bob-to-carol-7f3a",
        "dm-alice-to-bob-91c2",
        "secret-body-b0b-ca401",
        "ours-body-a11ce-b0b",
    ] {
        assert!(!data.body.contains(never), "{never} shown to an admin");
    }
    let json = data.json();
    assert_eq!(json["viewer"]["kind"], "admin");
    assert_eq!(json["conversations"]["bodies_shown"], false);
    let titles: Vec<&str> = json["conversations"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["title"].as_str().unwrap())
        .collect();
    assert!(titles.contains(&"Bob and Carol only") && titles.contains(&"Alice and Bob"));
    assert!(
        json["conversations"]["note"]
            .as_str()
            .unwrap()
            .contains("no message bodies")
    );
}

#[tokio::test]
async fn an_admin_credential_signs_in_only_for_a_team_it_may_see() {
    let app = spawn_app().await;
    app.team("acme").await;
    app.team("other").await;
    let root = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;
    let confined = admin::grant(&app.pool, &globally(), Some("other"), None)
        .await
        .unwrap()
        .credential;

    let no_team = sign_in(&app, &root, "").await;
    assert_eq!(no_team.status, 400);
    assert!(
        no_team.body.contains("fill in the team field"),
        "{}",
        no_team.body
    );
    let foreign = sign_in(&app, &confined, "acme").await;
    assert_eq!(foreign.status, 403);
    assert!(foreign.cookie().is_none());
    assert!(
        foreign.body.contains("confined to team"),
        "{}",
        foreign.body
    );
    let missing = sign_in(&app, &root, "nope").await;
    assert_eq!(missing.status, 404);
    assert!(missing.cookie().is_none());

    let cookie = cookie_for(&app, &confined, "other").await;
    let data = get(&app, "/dashboard/data", Some(&cookie)).await.json();
    assert_eq!(data["viewer"]["team"], "other");
    assert_eq!(data["viewer"]["kind"], "admin");
}

// Issue 33 item 3: a registered window's private data is not for the bare
// agent token (identity.md). `/mcp` refuses the token wearing the window's
// label; the dashboard, signed in with that token, leaves the window's
// conversations out by the same rule, and shows them again once the window's
// session is revoked (as `/mcp` then lets the bare token read them).
#[tokio::test]
async fn a_registered_windows_conversations_are_not_shown_to_the_agent_token() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let alice_mcp = app.mcp(&alice, None).await;
    let bob_mcp = app.mcp(&bob, None).await;
    let w1 = alice_mcp
        .call("register_session", json!({"session": "w1"}))
        .await
        .unwrap();
    let alice_w1 = app.mcp(w1["credential"].as_str().unwrap(), None).await;
    let private = private_conversation(&bob_mcp, "Bob and alice/w1", "alice/w1", &alice_w1).await;
    send(&bob_mcp, &private, "w1-private-body-5d2e").await;
    let shared = private_conversation(&bob_mcp, "Bob and alice", "alice", &alice_mcp).await;
    send(&bob_mcp, &shared, "shared-window-body-8c1f").await;

    // What /mcp says to the bare token wearing the label.
    let borrowed = app.mcp(&alice, Some("w1")).await;
    let refused = borrowed
        .call("read_conversation", json!({"conversation_id": private}))
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("registered as an authenticated window"),
        "{refused}"
    );

    let cookie = cookie_for(&app, &alice, "").await;
    let data = get(&app, "/dashboard/data", Some(&cookie)).await;
    let page = get(&app, "/dashboard", Some(&cookie)).await;
    for body in [&data.body, &page.body] {
        assert!(body.contains("shared-window-body-8c1f"), "{body}");
        for never in ["w1-private-body-5d2e", "Bob and alice/w1"] {
            assert!(
                !body.contains(never),
                "{never} shown to the agent token: {body}"
            );
        }
    }

    // Revoked, the label is no longer a registered window's.
    alice_w1.call("revoke_session", json!({})).await.unwrap();
    let data = get(&app, "/dashboard/data", Some(&cookie)).await;
    assert!(data.body.contains("w1-private-body-5d2e"), "{}", data.body);
}
