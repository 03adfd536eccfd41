//! A real headless browser for the dashboard tests: Debian's `chromium`,
//! driven by `chromedriver` over the W3C WebDriver HTTP protocol with
//! reqwest. Only what the tests use: navigate, find, type, click, run a
//! script, read the source, take a screenshot.
//!
//! A missing browser or driver fails the test with what to install
//! (`scripts/test` installs both when it can); it never skips.

use std::process::Stdio;

use base64::Engine;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::{eventually, free_port, http_client};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The key W3C WebDriver names an element reference by.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    base: String,
    http: reqwest::Client,
}

impl Browser {
    /// Start chromedriver on a free port and open a headless session.
    pub async fn start() -> Browser {
        for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
            assert!(
                std::path::Path::new(path).exists(),
                "{path} is missing: the dashboard tests need a real headless browser. Install it \
                 with `apt-get install -y chromium chromium-driver` (scripts/test does this as \
                 root), package {package}."
            );
        }
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so the browser it starts ends with it
            // (see Drop) even when a test fails before `quit`.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let http = http_client();
        let driver_url = format!("http://127.0.0.1:{port}");
        eventually("chromedriver to be ready", async || {
            let ready = http.get(format!("{driver_url}/status")).send().await;
            if let Ok(response) = ready
                && let Ok(status) = response.json::<Value>().await
            {
                return status["value"]["ready"] == true;
            }
            false
        })
        .await;
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"],
            },
        }}});
        let created: Value = http
            .post(format!("{driver_url}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("create a WebDriver session")
            .json()
            .await
            .expect("a WebDriver answer");
        let id = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromium did not start: {created}"));
        Browser {
            base: format!("{driver_url}/session/{id}"),
            driver,
            http,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request
            .send()
            .await
            .expect("a WebDriver command")
            .json()
            .await
            .expect("a WebDriver answer");
        if let Some(error) = answer["value"]["error"].as_str() {
            panic!("WebDriver {path}: {error}: {}", answer["value"]["message"]);
        }
        answer["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// The element `css` selects (the first one), by its reference.
    pub async fn find(&self, css: &str) -> String {
        let found = self
            .command(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found[ELEMENT_KEY].as_str().unwrap().to_string()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.command(
            reqwest::Method::POST,
            &format!("/element/{element}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Run `script` (a function body; `return` gives its value) in the page.
    pub async fn script(&self, script: &str) -> Value {
        self.command(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    /// The text of the page as a person reads it.
    pub async fn text(&self) -> String {
        self.script("return document.body ? document.body.innerText : '';")
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn source(&self) -> String {
        self.command(reqwest::Method::GET, "/source", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Until the page's text holds `needle` (failing with the text last seen).
    pub async fn wait_for_text(&self, needle: &str) {
        eventually(&format!("the page to show {needle:?}"), async || {
            let text = self.text().await;
            text.contains(needle).then_some(()).ok_or(text)
        })
        .await
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        let encoded = self
            .command(reqwest::Method::GET, "/screenshot", None)
            .await;
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap())
            .expect("a base64 PNG")
    }

    /// Resize the window (for a screenshot of the whole page).
    pub async fn resize(&self, width: u32, height: u32) {
        self.command(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    /// End the session (closing chromium), then chromedriver.
    pub async fn quit(self) {
        let _ = self.http.delete(&self.base).send().await;
    }
}

impl Drop for Browser {
    /// chromedriver's whole process group: the driver and the browser it
    /// started, so a failed test leaves no chromium behind.
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id() {
            // SAFETY: kill(2) on the group this Browser created; no memory is touched.
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
            }
        }
    }
}
