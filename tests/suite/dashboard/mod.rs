//! The read-only dashboard at `/dashboard`: in a real headless browser
//! (`browser`: sign in through the form, see the agents, a task appear
//! without a reload, a hostile task title shown as text and never run, every
//! section of a populated page) and over plain HTTP (`plain_http`: the
//! protective headers, credentials refused in the URL, a bad token, a
//! tampered cookie, the cookie refused by `/mcp` and `/admin`, revocation,
//! and what `/dashboard/data` never carries), and the sign-ins the server
//! keeps (`sessions`: sign-out ends every copy of a cookie on every replica,
//! the form's slot and 4 KiB cap, the per-principal rate limit, and when the
//! cookie is `Secure`, down to `serve`'s own flags), and the path
//! reservations panel (`reservations`), and a person writing from the page
//! (`people` over plain HTTP, `people_browser` in the browser). This file
//! holds the helpers:
//! an HTTP client that shows redirects and signs in (for the plain-HTTP
//! tests) and a team with private conversations (for both).
//!
//! `DASHBOARD_SCREENSHOT=path` makes the populated-page test write a PNG of
//! the page there (how docs/dashboard.png is made); without it nothing is
//! written.

use ai_crew_sync::store::identity::teams;
use reqwest::header;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::{McpClient, TestApp, test_actor};

mod browser;
mod overdue_acks;
mod people;
mod people_browser;
mod plain_http;
mod reservations;
mod sessions;

/// A client that shows redirects instead of following them.
fn client() -> reqwest::Client {
    crate::support::install_crypto_provider();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A form-urlencoded body, as a browser posts the sign-in form.
trait FormBody {
    fn form_body(self, fields: &[(&str, &str)]) -> Self;
}

impl FormBody for reqwest::RequestBuilder {
    fn form_body(self, fields: &[(&str, &str)]) -> Self {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        self.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
    }
}

struct Answer {
    status: u16,
    headers: header::HeaderMap,
    body: String,
}

impl Answer {
    async fn of(response: reqwest::Response) -> Answer {
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.unwrap(),
        }
    }

    /// `name=value` of the cookie this answer sets, if it sets one.
    fn cookie(&self) -> Option<String> {
        let set = self.headers.get(header::SET_COOKIE)?.to_str().ok()?;
        Some(set.split(';').next()?.to_string())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

async fn sign_in(app: &TestApp, token: &str, team: &str) -> Answer {
    Answer::of(
        client()
            .post(app.url("/dashboard/sign-in"))
            .form_body(&[("token", token), ("team", team)])
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// The cookie an agent token (or an admin credential for `team`) signs in to.
async fn cookie_for(app: &TestApp, token: &str, team: &str) -> String {
    let answer = sign_in(app, token, team).await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    answer.cookie().expect("a signed-in answer sets the cookie")
}

async fn get(app: &TestApp, path: &str, cookie: Option<&str>) -> Answer {
    let mut request = client().get(app.url(path));
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    Answer::of(request.send().await.unwrap()).await
}

async fn team_with_conversations(app: &TestApp, slug: &str) {
    app.team(slug).await;
    teams::capability(&app.pool, slug, Some(true), &test_actor())
        .await
        .unwrap();
}

async fn send(client: &McpClient, conversation: &str, body: &str) {
    client
        .call(
            "send_conversation_message",
            json!({"conversation_id": conversation, "body": body,
                   "request_id": Uuid::new_v4().to_string()}),
        )
        .await
        .unwrap();
}

/// A private conversation `owner` opens with `invitee` (its address), who
/// joins through `invitee_client`; its id.
async fn private_conversation(
    owner: &McpClient,
    title: &str,
    invitee: &str,
    invitee_client: &McpClient,
) -> String {
    let created = owner
        .call(
            "create_conversation",
            json!({"title": title, "private": true, "invite": [invitee]}),
        )
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    invitee_client
        .call("join_conversation", json!({"conversation_id": id}))
        .await
        .unwrap();
    id
}
