//! The dashboard in a real headless browser: signing in through the form
//! shows the team's agents and a new task appears without a reload, a task
//! title holding markup and script shows as text and never runs, and a
//! populated page shows every section (agents, tasks, locks, path
//! reservations, messages, conversations with their receipts) and keeps
//! redrawing without error;
//! each window shows its state, and revoked or long-gone windows do not
//! crowd the agents table.

use std::time::Duration;

use serde_json::{Value, json};

use super::{private_conversation, send, team_with_conversations};
use crate::support::browser::Browser;
use crate::support::{TestApp, eventually, spawn_app};

const XSS_TITLE: &str =
    r#"<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>"#;

async fn open_signed_in(app: &TestApp, token: &str) -> Browser {
    let browser = Browser::start().await;
    browser.goto(&app.url("/dashboard")).await;
    browser.type_into("#token", token).await;
    browser.click("#sign-in").await;
    // The click may return before the form's navigation has begun: a page
    // read now could still be the sign-in form.
    eventually("the dashboard after signing in", async || {
        browser
            .script(
                "return document.readyState === 'complete' && !!document.body \
                 && !document.body.classList.contains('sign-in');",
            )
            .await
            == json!(true)
    })
    .await;
    browser
}

#[tokio::test]
async fn signing_in_through_the_form_shows_the_agents_and_a_new_task_appears_without_reload() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    app.agent("acme", "bob").await;
    let alice_mcp = app.mcp(&alice, Some("editor")).await;
    alice_mcp
        .call(
            "heartbeat",
            json!({"status": "busy", "activity": "writing the release notes", "role": "writer"}),
        )
        .await
        .unwrap();

    let browser = open_signed_in(&app, &alice).await;
    // The agents table after signing in.
    browser.wait_for_text("writing the release notes").await;
    let text = browser.text().await;
    let who = browser
        .script("return document.querySelector('header .who strong').textContent;")
        .await;
    assert_eq!(who, json!("alice"), "{text}");
    assert!(text.contains("bob"), "every agent of the team is listed");
    assert!(text.contains("editor"), "the window");
    assert!(
        !browser.source().await.contains(&alice),
        "the token never reaches the page"
    );

    // A mark the page would lose on a reload.
    browser
        .script("window.__stayed = 'yes'; return null;")
        .await;
    alice_mcp
        .call(
            "create_task",
            json!({"key": "ship-dashboard", "title": "Ship the dashboard"}),
        )
        .await
        .unwrap();
    // The new task appears on the open page.
    browser.wait_for_text("Ship the dashboard").await;
    assert_eq!(
        browser.script("return window.__stayed || null;").await,
        json!("yes"),
        "the task appeared without a reload"
    );
    browser.quit().await;
}

#[tokio::test]
async fn a_task_title_holding_markup_and_script_shows_as_text_and_never_runs() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let alice_mcp = app.mcp(&alice, None).await;
    // One in the server's first render, one drawn by app.js afterwards.
    alice_mcp
        .call("create_task", json!({"key": "xss-1", "title": XSS_TITLE}))
        .await
        .unwrap();

    let browser = open_signed_in(&app, &alice).await;
    // The title shows as literal text.
    browser.wait_for_text(XSS_TITLE).await;
    let later = r#"<b>bold?</b><img src=y onerror="window.__pwned=3">"#;
    alice_mcp
        .call("create_task", json!({"key": "xss-2", "title": later}))
        .await
        .unwrap();
    browser.wait_for_text(later).await;
    // Give an injected handler every chance to have run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        browser.script("return typeof window.__pwned;").await,
        json!("undefined")
    );
    assert_eq!(
        browser
            .script(
                "return document.querySelectorAll('#tasks img, #tasks script, #tasks b').length;"
            )
            .await,
        json!(0),
        "no element was made from a title"
    );
    browser.quit().await;
}

#[tokio::test]
async fn a_populated_dashboard_shows_every_section_in_the_browser() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    app.agent("acme", "carol").await;
    let alice_mcp = app.mcp(&alice, Some("backend")).await;
    let bob_mcp = app.mcp(&bob, Some("frontend")).await;
    alice_mcp
        .call(
            "heartbeat",
            json!({"status": "busy", "activity": "migrating the billing schema",
                   "project": "billing", "role": "backend"}),
        )
        .await
        .unwrap();
    bob_mcp
        .call(
            "heartbeat",
            json!({"status": "active", "activity": "reviewing PR 42", "project": "web",
                   "role": "reviewer"}),
        )
        .await
        .unwrap();
    for (key, title) in [
        ("api-rate-limits", "Add rate limits to the public API"),
        ("billing-schema", "Migrate the billing schema"),
        ("docs-quickstart", "Rewrite the quickstart"),
        ("flaky-ci", "Fix the flaky CI job"),
    ] {
        alice_mcp
            .call("create_task", json!({"key": key, "title": title}))
            .await
            .unwrap();
    }
    alice_mcp
        .call(
            "claim_task",
            json!({"key": "billing-schema", "lease_seconds": 900}),
        )
        .await
        .unwrap();
    bob_mcp
        .call("claim_task", json!({"key": "docs-quickstart"}))
        .await
        .unwrap();
    bob_mcp
        .call(
            "complete_task",
            json!({"key": "docs-quickstart", "result": "merged"}),
        )
        .await
        .unwrap();
    alice_mcp
        .call(
            "acquire_lock",
            json!({"name": "db/migrations", "ttl_seconds": 600, "purpose": "schema change"}),
        )
        .await
        .unwrap();
    bob_mcp
        .call(
            "reserve_paths",
            json!({"paths": ["web/src/checkout/**"], "reason": "PR 42 review fixes"}),
        )
        .await
        .unwrap();
    alice_mcp
        .call(
            "post_message",
            json!({"channel": "general", "body": "Deploy freeze starts at 18:00 UTC.",
                   "announce": true}),
        )
        .await
        .unwrap();
    bob_mcp
        .call(
            "post_message",
            json!({"channel": "web", "body": "PR 42 is ready for a second look."}),
        )
        .await
        .unwrap();
    let id = private_conversation(&alice_mcp, "Billing cut-over", "bob/frontend", &bob_mcp).await;
    send(&alice_mcp, &id, "Cut-over plan: freeze, migrate, verify.").await;

    let browser = open_signed_in(&app, &alice).await;
    browser.wait_for_text("migrating the billing schema").await;
    let text = browser.text().await;
    for expected in [
        "reviewing PR 42",
        "Add rate limits to the public API",
        "held by alice/backend",
        "Rewrite the quickstart",
        "db/migrations",
        "schema change",
        "web/src/checkout/**",
        "PR 42 review fixes",
        "Deploy freeze starts at 18:00 UTC.",
        "announcement",
        "PR 42 is ready for a second look.",
        "Billing cut-over",
        "Cut-over plan: freeze, migrate, verify.",
        "stored 1/1",
        "carol",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from: {text}");
    }
    // The poll redraws the same content, and says when.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let redrawn = browser.text().await;
    assert!(redrawn.contains("Cut-over plan"));
    assert!(
        redrawn.contains("web/src/checkout/**"),
        "app.js draws the reservations"
    );
    assert_eq!(
        browser
            .script("return document.body.classList.contains('stale');")
            .await,
        json!(false),
        "the last poll was drawn without an error"
    );
    let updated = browser
        .script("return document.getElementById('updated').textContent;")
        .await;
    assert!(
        updated.as_str().unwrap().starts_with("updated 20"),
        "{updated}"
    );

    if let Ok(path) = std::env::var("DASHBOARD_SCREENSHOT") {
        browser.resize(1400, 1200).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::fs::write(&path, browser.screenshot().await).expect("write the screenshot");
    }
    browser.quit().await;
}

// Issue 33 item 8: a body holding bidirectional embeddings, overrides and
// isolates is shown with them spelled out (`<U+202E>`), in the server's first
// render and in what app.js redraws later; `/dashboard/data` keeps the text.
#[tokio::test]
async fn bidirectional_formatting_characters_in_bodies_are_shown_spelled_out() {
    let app = spawn_app().await;
    team_with_conversations(&app, "acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let alice_mcp = app.mcp(&alice, None).await;
    let bob_mcp = app.mcp(&bob, None).await;
    let first = "first_\u{202E}fdp.exe\u{202C} \u{2066}iso\u{2069}";
    alice_mcp
        .call("post_message", json!({"channel": "general", "body": first}))
        .await
        .unwrap();
    let id = private_conversation(&alice_mcp, "Bidi", "bob", &bob_mcp).await;
    send(&bob_mcp, &id, "conv_\u{202B}abc\u{202C}").await;

    let browser = open_signed_in(&app, &alice).await;
    // The first render, before any redraw.
    let source = browser.source().await;
    assert!(
        source
            .contains("first_&lt;U+202E&gt;fdp.exe&lt;U+202C&gt; &lt;U+2066&gt;iso&lt;U+2069&gt;"),
        "{source}"
    );
    // A message that only app.js can draw.
    let later = "later_\u{202D}txt.exe\u{202C} \u{2067}\u{2068}x\u{2069}";
    alice_mcp
        .call("post_message", json!({"channel": "general", "body": later}))
        .await
        .unwrap();
    let drawn = "later_<U+202D>txt.exe<U+202C> <U+2067><U+2068>x<U+2069>";
    browser.wait_for_text(drawn).await;
    let text = browser.text().await;
    assert!(
        text.contains("first_<U+202E>fdp.exe<U+202C> <U+2066>iso<U+2069>"),
        "{text}"
    );
    assert!(text.contains("conv_<U+202B>abc<U+202C>"), "{text}");
    for c in ai_crew_sync::store::text::BIDI_CONTROLS {
        assert!(!text.contains(c), "U+{:04X} drawn raw: {text}", c as u32);
    }
    browser.quit().await;

    // The JSON the page polls keeps the text as it is.
    let cookie = super::cookie_for(&app, &alice, "").await;
    let data = super::get(&app, "/dashboard/data", Some(&cookie)).await;
    let bodies: Vec<String> = data.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap().to_string())
        .collect();
    assert!(bodies.contains(&later.to_string()), "{bodies:?}");
}

/// Issue 36 item 4: each window shows its state (online, idle, offline);
/// a revoked window is not shown, and windows offline for more than a day are
/// one line; the server's first render and app.js's redraw agree.
#[tokio::test]
async fn each_window_shows_its_state_and_old_or_revoked_windows_do_not_crowd_the_table() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    app.agent("acme", "bob").await;
    let beat = async |window: &str, args: Value| {
        app.mcp(&alice, Some(window))
            .await
            .call("heartbeat", args)
            .await
            .unwrap();
    };
    beat("editor", json!({"status": "busy"})).await;
    beat("reader", json!({"status": "idle"})).await;
    beat("gone", json!({"status": "idle", "offline": true})).await;
    for old in ["ancient-1", "ancient-2"] {
        beat(old, json!({})).await;
    }
    sqlx::query(
        "UPDATE presence SET expires_at = now() - interval '3 days' WHERE session LIKE 'ancient-%'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let agent = app.mcp(&alice, None).await;
    let issued = agent
        .call("register_session", json!({"session": "provisional"}))
        .await
        .unwrap();
    app.mcp(issued["credential"].as_str().unwrap(), None)
        .await
        .call("heartbeat", json!({}))
        .await
        .unwrap();
    agent
        .call("revoke_session", json!({"session": "provisional"}))
        .await
        .unwrap();

    let browser = open_signed_in(&app, &alice).await;
    let rows = async || -> Value {
        browser
            .script(
                "return Array.from(document.querySelectorAll('#agents tbody tr')).map(\
                   r => Array.from(r.cells).map(c => c.textContent.trim()).slice(0, 4));",
            )
            .await
    };
    let expected = |rows: &Value| {
        let rows = rows.as_array().unwrap();
        let has = |cells: &[&str]| {
            rows.iter()
                .any(|r| cells.iter().enumerate().all(|(i, c)| r[i] == *c))
        };
        assert!(has(&["alice", "editor", "online", "busy"]), "{rows:?}");
        assert!(has(&["alice", "reader", "idle", "idle"]), "{rows:?}");
        assert!(has(&["alice", "gone", "offline", "idle"]), "{rows:?}");
        assert!(has(&["bob", "—", "offline"]), "{rows:?}");
        assert!(
            has(&[
                "alice",
                "+ 2 window(s) offline for more than a day (list_sessions {all: true} lists them)"
            ]),
            "{rows:?}"
        );
        let text = Value::Array(rows.clone()).to_string();
        assert!(
            !text.contains("ancient") && !text.contains("provisional"),
            "{text}"
        );
        assert_eq!(rows.len(), 5, "{rows:?}");
    };
    let first = rows().await;
    expected(&first);
    // The script's redraw: the table is replaced by the next poll.
    browser
        .script("document.querySelector('#agents table').dataset.first = 'yes'; return null;")
        .await;
    eventually("the agents table redrawn by app.js", async || {
        browser
            .script("return document.querySelector('#agents table').dataset.first || 'redrawn';")
            .await
            == json!("redrawn")
    })
    .await;
    expected(&rows().await);
    browser.quit().await;
}
