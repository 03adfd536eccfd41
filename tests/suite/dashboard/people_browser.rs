//! A person on the dashboard in a real headless browser (issue 38 item 1):
//! signed in, they post to a channel and an agent reads it over MCP with
//! `from_person: true`; an agent's blocked `ask_agent` to the person shows
//! on the open page as waiting, is answered from the page, and the agent's
//! call returns that answer; a form
//! on another origin posting to the write endpoint changes nothing.

use serde_json::json;

use super::people::person;
use crate::support::browser::Browser;
use crate::support::{TestApp, eventually, spawn_app};

async fn signed_in(app: &TestApp, credential: &str) -> Browser {
    let browser = Browser::start().await;
    browser.goto(&app.url("/dashboard")).await;
    browser.type_into("#token", credential).await;
    browser.click("#sign-in").await;
    eventually("the person's page after signing in", async || {
        browser
            .script("return !!document.getElementById('person-writes');")
            .await
            == json!(true)
    })
    .await;
    browser
}

async fn messages_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM messages")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_person_posts_from_the_page_and_an_agent_reads_it_with_from_person() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let dana = person(&app, "acme", "dana").await;
    let browser = signed_in(&app, &dana).await;

    let body = "Freeze merges until the release is out <b>today</b>";
    browser
        .type_into("#post-form input[name=channel]", "general")
        .await;
    browser
        .type_into("#post-form textarea[name=body]", body)
        .await;
    browser.click("#post-form input[name=announce]").await;
    browser.click("#post-form button").await;
    // Back on the page, the post shows, as text.
    browser.wait_for_text(body).await;
    assert_eq!(
        browser
            .script("return document.querySelectorAll('#messages b').length;")
            .await,
        json!(0)
    );

    let mcp = app.mcp(&alice, None).await;
    let read = mcp
        .call("read_messages", json!({"scope": "general"}))
        .await
        .unwrap();
    let m = &read["messages"][0];
    assert_eq!(m["body"], body, "{read}");
    assert_eq!(m["from"], "dana");
    assert_eq!(m["from_person"], true);
    assert_eq!(m["announce"], true);
    browser.quit().await;
}

#[tokio::test]
async fn an_agents_ask_agent_to_a_person_is_answered_from_the_page() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let dana = person(&app, "acme", "dana").await;
    // The page is open before the question comes.
    let browser = signed_in(&app, &dana).await;
    browser.wait_for_text("No questions waiting for you.").await;
    let mcp = app.mcp(&alice, Some("release")).await;
    let asking = tokio::spawn(async move {
        mcp.call(
            "ask_agent",
            json!({"to": "dana", "question": "May I tag v2.0 now?", "timeout_seconds": 120}),
        )
        .await
    });
    // The question is stored (the call now waits for its answer).
    eventually("the question to be asked", async || {
        messages_count(&app).await == 1
    })
    .await;

    // The open page says a question is waiting; a reload shows it.
    browser
        .wait_for_text("1 question(s) waiting now: reload the page")
        .await;
    browser.goto(&app.url("/dashboard")).await;
    browser.wait_for_text("May I tag v2.0 now?").await;
    browser.wait_for_text("alice/release").await;
    browser
        .type_into("form.answer textarea[name=body]", "Yes, tag it.")
        .await;
    browser.click("form.answer button").await;
    browser.wait_for_text("No questions waiting for you.").await;

    let answer = asking.await.unwrap().unwrap();
    assert_eq!(answer["answered"], true, "{answer}");
    assert_eq!(answer["answer"], "Yes, tag it.");
    assert_eq!(answer["answered_by"], "dana");
    assert_eq!(answer["from_person"], true);
    browser.quit().await;
}

#[tokio::test]
async fn a_form_on_another_origin_posting_to_the_write_endpoint_changes_nothing() {
    let app = spawn_app().await;
    app.team("acme").await;
    let dana = person(&app, "acme", "dana").await;
    let browser = signed_in(&app, &dana).await;

    // A page elsewhere (a data: URL: an opaque, foreign origin) that posts
    // a well-formed write to the dashboard as soon as it loads.
    let action = app.url("/dashboard/write/post");
    let evil = format!(
        "<!doctype html><form method=post action='{action}'>\
         <input name=channel value=general><input name=body value='pwned from afar'>\
         <input name=csrf value=guess></form>\
         <script>document.forms[0].submit()</script>"
    );
    let url = format!("data:text/html,{}", urlencoding(&evil));
    browser.goto(&url).await;
    // The browser lands on the dashboard's refusal.
    eventually("the refusal page", async || {
        let text = browser.text().await;
        (text.contains("Not done") || text.contains("not signed in"))
            .then_some(())
            .ok_or(text)
    })
    .await;
    assert_eq!(messages_count(&app).await, 0, "nothing was posted");
    // The sign-in itself still works from its own page.
    browser.goto(&app.url("/dashboard")).await;
    browser.wait_for_text("Write as dana").await;
    browser.quit().await;
}

/// Percent-encode a data: URL's payload.
fn urlencoding(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}
