//! Dashboard sign-ins as the server keeps them (issue 33 item 7): signing
//! out ends the sign-in on the server, so a copied cookie stops working on
//! every replica; a principal keeps a bounded number of sign-ins; the
//! sign-in form takes a request slot and is capped at 4 KiB; the pages are
//! rate-limited per principal; and the cookie is `Secure` unless the
//! listener is plain http (loopback, or `--dashboard-plain-http`), as the
//! real binary decides it.

use std::process::{Child, Command, Stdio};

use ai_crew_sync::config::{DashboardCookie, HttpSettings};
use ai_crew_sync::store::{identity::agents, identity::teams};
use reqwest::header;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{Answer, FormBody, client, cookie_for, get, sign_in};
use crate::support::postgres::fresh_database_url;
use crate::support::{TestApp, eventually, free_port, globally, http_client, in_team, spawn_app};

async fn sign_out(app: &TestApp, cookie: &str) -> Answer {
    Answer::of(
        client()
            .post(app.url("/dashboard/sign-out"))
            .header(header::COOKIE, cookie)
            .send()
            .await
            .unwrap(),
    )
    .await
}

#[tokio::test]
async fn signing_out_ends_the_sign_in_on_the_server_for_every_copy_and_replica() {
    let secret = "a dashboard secret shared by both replicas".to_string();
    let settings = HttpSettings {
        dashboard_secret: Some(secret.clone()),
        ..HttpSettings::default()
    };
    let app = TestApp::builder().http(settings.clone()).spawn().await;
    let replica = app.replica().http(settings).spawn().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;

    let cookie = cookie_for(&app, &alice, "").await;
    let other = cookie_for(&app, &alice, "").await;
    for server in [&app, &replica] {
        assert_eq!(
            get(server, "/dashboard/data", Some(&cookie)).await.status,
            200
        );
    }
    // The browser signs out on one replica; a copy of its cookie is tried on both.
    let out = sign_out(&replica, &cookie).await;
    assert_eq!(out.status, 303);
    assert_eq!(out.cookie().as_deref(), Some("crew_dashboard="));
    for server in [&app, &replica] {
        let copied = get(server, "/dashboard/data", Some(&cookie)).await;
        assert_eq!(copied.status, 401, "{}", copied.body);
        assert!(copied.body.contains("signed out"), "{}", copied.body);
        let page = get(server, "/dashboard", Some(&cookie)).await;
        assert_eq!(page.status, 401);
        assert!(page.body.contains("name=\"token\""), "the form again");
    }
    // Another sign-in of the same agent is its own, and goes on.
    assert_eq!(get(&app, "/dashboard/data", Some(&other)).await.status, 200);
}

/// A page on another site posting to sign-out (a browser names it in
/// `Sec-Fetch-Site` or `Origin`) is refused and the sign-in goes on; from
/// this dashboard's own page it ends. Without the origin check in
/// `sign_out` the foreign post answers 303 and ends it: this test fails.
#[tokio::test]
async fn another_sites_page_cannot_sign_a_browser_out() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let cookie = cookie_for(&app, &alice, "").await;
    for (name, value) in [
        ("sec-fetch-site", "cross-site"),
        ("origin", "https://evil.example"),
    ] {
        let out = Answer::of(
            client()
                .post(app.url("/dashboard/sign-out"))
                .header(header::COOKIE, &cookie)
                .header(name, value)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(out.status, 403, "{name}: {}", out.body);
        assert!(out.body.contains("another site"), "{}", out.body);
        assert_eq!(out.cookie(), None, "the browser keeps its cookie");
        assert_eq!(
            get(&app, "/dashboard/data", Some(&cookie)).await.status,
            200
        );
    }
    let own = Answer::of(
        client()
            .post(app.url("/dashboard/sign-out"))
            .header(header::COOKIE, &cookie)
            .header("sec-fetch-site", "same-origin")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(own.status, 303);
    assert_eq!(
        get(&app, "/dashboard/data", Some(&cookie)).await.status,
        401
    );
}

#[tokio::test]
async fn a_principal_keeps_its_newest_sign_ins_and_the_oldest_ends() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let bobs = cookie_for(&app, &bob, "").await;
    let first = cookie_for(&app, &alice, "").await;
    let max = ai_crew_sync::store::operations::dashboard::SIGN_INS_PER_PRINCIPAL;
    let mut newest = String::new();
    for _ in 0..max {
        newest = cookie_for(&app, &alice, "").await;
    }
    let ended = get(&app, "/dashboard/data", Some(&first)).await;
    assert_eq!(ended.status, 401, "{}", ended.body);
    assert!(ended.body.contains("newer sign-in"), "{}", ended.body);
    assert_eq!(
        get(&app, "/dashboard/data", Some(&newest)).await.status,
        200
    );
    assert_eq!(
        get(&app, "/dashboard/data", Some(&bobs)).await.status,
        200,
        "another principal's sign-in is not touched"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM dashboard_sessions")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(rows, max + 1, "alice's newest and bob's");
}

#[tokio::test]
async fn a_sign_in_form_over_4_kib_is_refused_with_413_and_no_cookie() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let padding = "x".repeat(5 * 1024);
    let answer = Answer::of(
        client()
            .post(app.url("/dashboard/sign-in"))
            .form_body(&[("token", alice.as_str()), ("padding", &padding)])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(answer.cookie().is_none());
    assert!(
        answer.body.contains("larger than 4096 bytes"),
        "{}",
        answer.body
    );
    assert!(answer.body.contains("Paste just the"), "{}", answer.body);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM dashboard_sessions")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing was signed in");
    // A form within the cap signs in.
    assert_eq!(sign_in(&app, &alice, "").await.status, 303);
}

#[tokio::test]
async fn signing_in_takes_one_of_the_servers_request_slots() {
    let app = TestApp::builder()
        .http(HttpSettings {
            max_in_flight: 1,
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    // A sign-in whose form never arrives holds the only slot while it waits.
    let mut stalled = TcpStream::connect(app.addr).await.unwrap();
    stalled
        .write_all(
            format!(
                "POST /dashboard/sign-in HTTP/1.1\r\nHost: {}\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n",
                app.addr
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let refused = eventually("a sign-in to find no free slot", async || {
        let answer = sign_in(&app, &alice, "").await;
        (answer.status != 303).then_some(answer)
    })
    .await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.cookie().is_none());
    assert!(
        refused.body.contains("maximum of 1 requests at once"),
        "{}",
        refused.body
    );
    assert!(refused.headers.contains_key(header::RETRY_AFTER));
    drop(stalled);
    eventually(
        "the slot to come back (a sign-in answered 303)",
        async || {
            let answer = sign_in(&app, &alice, "").await;
            (answer.status == 303).then_some(()).ok_or(answer.body)
        },
    )
    .await;
}

#[tokio::test]
async fn the_dashboards_pages_are_rate_limited_per_principal() {
    // A tenth of 20 a minute: two pages.
    let app = TestApp::builder()
        .http(HttpSettings {
            rate_limit_per_minute: 20,
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app.agent("acme", "bob").await;
    let alices = cookie_for(&app, &alice, "").await;
    let bobs = cookie_for(&app, &bob, "").await;
    assert_eq!(get(&app, "/dashboard", Some(&alices)).await.status, 200);
    assert_eq!(
        get(&app, "/dashboard/data", Some(&alices)).await.status,
        200
    );
    let limited = get(&app, "/dashboard/data", Some(&alices)).await;
    assert_eq!(limited.status, 429, "{}", limited.body);
    assert!(limited.headers.contains_key(header::RETRY_AFTER));
    let message = limited.json()["message"].as_str().unwrap().to_string();
    assert!(message.contains("more than 2 pages a minute"), "{message}");
    // Another sign-in of the same agent shares its allowance.
    let again = cookie_for(&app, &alice, "").await;
    assert_eq!(get(&app, "/dashboard", Some(&again)).await.status, 429);
    // Another principal has its own.
    assert_eq!(get(&app, "/dashboard/data", Some(&bobs)).await.status, 200);
}

#[tokio::test]
async fn the_cookie_is_secure_unless_the_dashboard_is_served_over_plain_http() {
    let app = TestApp::builder()
        .http(HttpSettings {
            dashboard_cookie: DashboardCookie::Secure,
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let signed_in = sign_in(&app, &alice, "").await;
    let set = signed_in.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(set.ends_with("; Secure"), "{set}");
    let cookie = signed_in.cookie().unwrap();
    let out = sign_out(&app, &cookie).await;
    let cleared = out.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.contains("Max-Age=0") && cleared.ends_with("; Secure"),
        "{cleared}"
    );
    // The form says why a sign-in over plain http may come back to it.
    let form = get(&app, "/dashboard", None).await;
    assert!(
        form.body.contains("id=\"secure-cookie-note\""),
        "{}",
        form.body
    );
    assert!(
        form.body.contains("--dashboard-plain-http"),
        "{}",
        form.body
    );

    let plain = spawn_app().await;
    let form = get(&plain, "/dashboard", None).await;
    assert!(!form.body.contains("secure-cookie-note"), "{}", form.body);
}

/// `serve` on `bind_ip` and a free port with `extra` flags.
fn spawn_serve(database_url: &str, bind_ip: &str, extra: &[&str]) -> (Child, u16) {
    let port = free_port();
    let bind = format!("{bind_ip}:{port}");
    let child = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(["serve", "--bind", &bind, "--metrics-bind", "off"])
        .args(extra)
        .env("DATABASE_URL", database_url)
        .env_remove("BUS_DASHBOARD_PLAIN_HTTP")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn serve");
    (child, port)
}

/// `serve` as [`spawn_serve`] starts it, once `/health` answers.
async fn serve(database_url: &str, bind_ip: &str, extra: &[&str]) -> (Child, u16) {
    let (mut child, port) = spawn_serve(database_url, bind_ip, extra);
    eventually(
        &format!("serve on {bind_ip}:{port} to be healthy"),
        async || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("serve on {bind_ip}:{port} exited ({status})");
            }
            http_client()
                .get(format!("http://127.0.0.1:{port}/health"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;
    (child, port)
}

#[tokio::test]
async fn serve_marks_the_cookie_secure_off_loopback_unless_told_the_dashboard_is_plain_http() {
    let url = fresh_database_url().await;
    let mut token = None;
    for (bind, extra, secure) in [
        ("0.0.0.0", &[][..], true),
        ("0.0.0.0", &["--dashboard-plain-http"][..], false),
        ("127.0.0.1", &[][..], false),
    ] {
        let (mut child, port) = serve(&url, bind, extra).await;
        let token = match &token {
            Some(token) => token,
            None => {
                // serve has migrated the database.
                let pool = ai_crew_sync::db::connect(&url, 2).await.unwrap();
                teams::create(&pool, &globally(), "acme", "Acme")
                    .await
                    .unwrap();
                let alice = agents::add(&pool, &in_team("acme"), "alice").await.unwrap();
                token.insert(alice.token)
            }
        };
        let answer = Answer::of(
            client()
                .post(format!("http://127.0.0.1:{port}/dashboard/sign-in"))
                .form_body(&[("token", token.as_str())])
                .send()
                .await
                .unwrap(),
        )
        .await;
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(answer.status, 303, "{bind} {extra:?}: {}", answer.body);
        let set = answer.headers[header::SET_COOKIE].to_str().unwrap();
        assert_eq!(set.contains("; Secure"), secure, "{bind} {extra:?}: {set}");
    }
}
