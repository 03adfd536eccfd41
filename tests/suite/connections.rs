//! Connection hygiene over real TCP: the caps on open connections (per client
//! address and overall, where a newcomer evicts a waiting connection), the
//! header and idle timeouts, the body time limit on every route, and long
//! polls left alone while they wait.
//!
//! Clients take distinct loopback addresses (127.0.0.2, .3, …: all of
//! 127.0.0.0/8 is this machine) so the server sees a flooder and a health
//! check as different clients, as it would across a network. The server runs
//! in this process, so the sockets it holds for its port are counted from
//! /proc: that is the descriptor count a flood must not grow.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ai_crew_sync::config::HttpSettings;
use ai_crew_sync::store::identity::admin;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{TestApp, eventually, install_crypto_provider, test_actor};

const FLOODER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const HEALTH_CHECKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A TCP connection to `server` from the loopback address `from`.
async fn connect_from(from: Ipv4Addr, server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::new(IpAddr::V4(from), 0))
        .expect("bind a loopback address");
    socket.connect(server).await.expect("connect")
}

/// What became of a connection within a wait.
enum Outcome<S> {
    /// The server closed it; what it sent before closing.
    Closed(String),
    /// Still open, nothing received.
    Open(S),
}

/// Read `stream` until the server closes it, or `wait` passes with it open.
async fn outcome<S: AsyncRead + Unpin>(mut stream: S, wait: Duration) -> Outcome<S> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut received = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return Outcome::Closed(String::from_utf8_lossy(&received).into_owned());
            }
            Ok(Ok(n)) => received.extend_from_slice(&chunk[..n]),
            Err(_) if received.is_empty() => return Outcome::Open(stream),
            Err(_) => panic!(
                "the server answered and kept the connection open: {}",
                String::from_utf8_lossy(&received)
            ),
        }
    }
}

/// One HTTP answer read from `stream`: status and JSON body (by Content-Length).
async fn read_answer(stream: &mut (impl AsyncRead + Unpin), wait: Duration) -> (u16, Value) {
    let deadline = tokio::time::Instant::now() + wait;
    let mut buffer = Vec::new();
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                let body = serde_json::from_slice(&buffer[end + 4..end + 4 + length])
                    .unwrap_or(Value::Null);
                return (status, body);
            }
        }
        let mut chunk = [0u8; 8192];
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buffer.extend_from_slice(&chunk[..n]),
            other => panic!(
                "no whole answer ({other:?}); received: {}",
                String::from_utf8_lossy(&buffer)
            ),
        }
    }
}

/// `GET /health` over HTTP from the loopback address `from`.
async fn health_from(app: &TestApp, from: Ipv4Addr) -> (u16, Value) {
    install_crypto_provider();
    let client = reqwest::Client::builder()
        .local_address(IpAddr::V4(from))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let response = client
        .get(app.url("/health"))
        .send()
        .await
        .expect("/health answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Sockets this process holds for connections on `port` (server side):
/// /proc/net/tcp's entries with that local port, not listening, whose inode
/// is one of this process's open descriptors.
fn server_sockets(port: u16) -> usize {
    let mine: HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let mut count = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields[1]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            let listening = fields[3] == "0A";
            if local_port == Some(port) && !listening && mine.contains(fields[9]) {
                count += 1;
            }
        }
    }
    count
}

/// A request line and part of the headers: a request that never finishes.
const UNFINISHED: &[u8] = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Len";

fn call_body(tool: &str, arguments: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": tool, "arguments": arguments}})
    .to_string()
}

/// A whole `tools/call` POST to /mcp with `token`.
fn tool_request(app: &TestApp, token: &str, body: &str) -> String {
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        app.addr,
        body.len()
    )
}

#[tokio::test]
async fn a_flood_of_unfinished_requests_from_one_address_leaves_health_answering() {
    let app = TestApp::builder()
        .http(HttpSettings {
            max_connections: 32,
            max_connections_per_address: 8,
            header_read_timeout: Duration::from_secs(120),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    let port = app.addr.port();

    let mut flood = Vec::new();
    for _ in 0..40 {
        flood.push(connect_from(FLOODER, app.addr).await);
    }
    let outcomes = futures::future::join_all(
        flood
            .into_iter()
            .map(|s| outcome(s, Duration::from_secs(2))),
    )
    .await;
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for outcome in outcomes {
        match outcome {
            Outcome::Open(stream) => held.push(stream),
            Outcome::Closed(text) => refused.push(text),
        }
    }
    assert_eq!(held.len(), 8, "the address's cap is held");
    assert_eq!(refused.len(), 32, "the rest are closed at once");
    for text in &refused {
        assert!(text.starts_with("HTTP/1.1 503"), "{text}");
        assert!(
            text.contains("\"overloaded\"") && text.contains("already has 8 connections open"),
            "{text}"
        );
    }
    for stream in &mut held {
        stream.write_all(UNFINISHED).await.unwrap();
    }

    // Another client is answered while the flood holds its share.
    let (status, health) = health_from(&app, HEALTH_CHECKER).await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["database"], "ok");
    // The flooder still gets no more.
    let more = connect_from(FLOODER, app.addr).await;
    assert!(
        matches!(outcome(more, Duration::from_secs(2)).await, Outcome::Closed(text) if text.starts_with("HTTP/1.1 503"))
    );
    // The server holds the flood's 8 and the health check's one, not 40.
    let sockets = server_sockets(port);
    assert!(
        (8..=9).contains(&sockets),
        "the server holds {sockets} sockets on its port"
    );
    for stream in held {
        assert!(
            matches!(
                outcome(stream, Duration::from_millis(200)).await,
                Outcome::Open(_)
            ),
            "a connection within the cap stays open until its header timeout"
        );
    }
}

#[tokio::test]
async fn at_the_connection_cap_a_newcomer_evicts_the_longest_waiting_connection() {
    let app = TestApp::builder()
        .http(HttpSettings {
            max_connections: 6,
            max_connections_per_address: 6,
            header_read_timeout: Duration::from_secs(120),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;

    // The oldest connection is busy: a long poll in flight.
    let mut long_poll = connect_from(Ipv4Addr::new(127, 0, 0, 3), app.addr).await;
    let wait = call_body("wait_for_updates", json!({"timeout_seconds": 4}));
    long_poll
        .write_all(tool_request(&app, &alice, &wait).as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The other five wait for headers that never come, oldest first.
    let mut waiting = Vec::new();
    for _ in 0..5 {
        let mut stream = connect_from(Ipv4Addr::new(127, 0, 0, 4), app.addr).await;
        stream.write_all(UNFINISHED).await.unwrap();
        waiting.push(stream);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A newcomer at the cap is let in: /health answers.
    let (status, health) = health_from(&app, HEALTH_CHECKER).await;
    assert_eq!(status, 200, "{health}");
    // The evicted connection's close lands a moment after the newcomer's
    // answer: the count settles at the cap, never above it for good.
    let port = app.addr.port();
    eventually(
        "the cap to hold: at most 6 sockets on the server's port",
        async || server_sockets(port) <= 6,
    )
    .await;

    // It took the place of the connection that had waited longest.
    let mut outcomes = Vec::new();
    for stream in waiting {
        outcomes.push(outcome(stream, Duration::from_millis(300)).await);
    }
    assert!(
        matches!(&outcomes[0], Outcome::Closed(text) if text.is_empty()),
        "the longest-waiting connection was closed"
    );
    assert!(
        outcomes[1..].iter().all(|o| matches!(o, Outcome::Open(_))),
        "the others stay open"
    );
    // The long poll, older still but busy, was left alone and answers.
    let (status, answer) = read_answer(&mut long_poll, Duration::from_secs(20)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["result"]["structuredContent"]["timed_out"], true,
        "{answer}"
    );
}

#[tokio::test]
async fn headers_that_do_not_arrive_in_time_close_the_connection() {
    let app = TestApp::builder()
        .http(HttpSettings {
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(120),
            ..HttpSettings::default()
        })
        .spawn()
        .await;

    // A request that stops halfway through its headers.
    let mut unfinished = TcpStream::connect(app.addr).await.unwrap();
    unfinished.write_all(UNFINISHED).await.unwrap();
    // A connection that never sends a byte.
    let silent = TcpStream::connect(app.addr).await.unwrap();
    // Headers trickled a byte at a time: the time limit counts from the
    // accept, so bytes arriving do not extend it.
    let trickled = TcpStream::connect(app.addr).await.unwrap();
    let (mut read_half, mut write_half) = trickled.into_split();
    let trickle = tokio::spawn(async move {
        for byte in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".repeat(10) {
            if write_half.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    for (what, stream) in [("unfinished", unfinished), ("silent", silent)] {
        assert!(
            matches!(
                outcome(stream, Duration::from_secs(10)).await,
                Outcome::Closed(text) if text.is_empty()
            ),
            "the {what} connection is closed after the header timeout"
        );
    }
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), read_half.read_to_end(&mut rest))
        .await
        .is_ok();
    assert!(
        closed,
        "the trickled connection is closed after the header timeout"
    );
    trickle.abort();

    // A request sent whole is answered as ever.
    let mut whole = TcpStream::connect(app.addr).await.unwrap();
    whole
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_answer(&mut whole, Duration::from_secs(10)).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let app = TestApp::builder()
        .http(HttpSettings {
            header_read_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(1),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_answer(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(status, 200, "answered, and the connection kept alive");
    assert!(
        matches!(
            outcome(stream, Duration::from_secs(10)).await,
            Outcome::Closed(text) if text.is_empty()
        ),
        "closed once idle past the idle timeout"
    );
}

/// A POST to `path` with `authorization` declaring a 200-byte body, sent one
/// byte every 200 ms (it would take 40 s); the read side, to await the answer on.
async fn trickle_body(app: &TestApp, path: &str, authorization: &str) -> OwnedReadHalf {
    let stream = TcpStream::connect(app.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {authorization}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: 200\r\n\r\n"
    );
    let (read_half, mut write_half) = stream.into_split();
    write_half.write_all(head.as_bytes()).await.unwrap();
    tokio::spawn(async move {
        for _ in 0..200 {
            if write_half.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    read_half
}

#[tokio::test]
async fn a_trickled_body_is_cut_off_with_408_on_every_route() {
    let app = TestApp::builder()
        .http(HttpSettings {
            body_read_timeout: Duration::from_secs(1),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let admin = admin::bootstrap(&app.pool, None, false, &test_actor())
        .await
        .unwrap()
        .credential;

    for (path, credential) in [("/admin/teams", &admin), ("/mcp", &alice)] {
        let mut stream = trickle_body(&app, path, credential).await;
        let (status, body) = read_answer(&mut stream, Duration::from_secs(10)).await;
        assert_eq!(status, 408, "{path}: {body}");
        assert_eq!(body["error"], "timeout", "{path}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("did not arrive within 1 s"),
            "{path}: {body}"
        );
        assert!(
            matches!(
                outcome(stream, Duration::from_secs(5)).await,
                Outcome::Closed(_)
            ),
            "{path}: the connection is closed after the 408"
        );
    }
}

#[tokio::test]
async fn a_long_poll_outliving_the_idle_and_header_timeouts_gets_its_answer() {
    let app = TestApp::builder()
        .http(HttpSettings {
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let alice_token = app.agent("acme", "alice").await;
    let bob_token = app.agent("acme", "bob").await;
    let alice = app.mcp(&alice_token, Some("w1")).await;
    let bob = app.mcp(&bob_token, Some("w1")).await;

    let quiet = alice
        .call("wait_for_updates", json!({"timeout_seconds": 3}))
        .await
        .unwrap();
    assert_eq!(
        (&quiet["woke"], &quiet["timed_out"]),
        (&json!(false), &json!(true))
    );

    let (woke, _) = tokio::join!(
        alice.call("wait_for_updates", json!({"timeout_seconds": 30})),
        async {
            tokio::time::sleep(Duration::from_millis(2500)).await;
            bob.call(
                "post_message",
                json!({"to": "alice/w1", "body": "still there?"}),
            )
            .await
            .unwrap()
        }
    );
    let woke = woke.unwrap();
    assert_eq!(woke["woke"], true, "{woke}");
    assert_eq!(woke["events"][0]["preview"], "still there?", "{woke}");
}

/// A flood of complete `/health` requests, one per connection on every
/// connection the server allows, while a look at the installation waits in
/// the database (the outbox table is locked): every probe is answered at
/// once from the snapshot, so its connection goes idle, and an `/mcp` call
/// on a new connection takes the place of one of them and is served.
#[tokio::test]
async fn a_flood_of_complete_health_requests_leaves_room_for_mcp() {
    let app = TestApp::builder()
        .http(HttpSettings {
            max_connections: 8,
            max_connections_per_address: 8,
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let (status, health) = health_from(&app, HEALTH_CHECKER).await;
    assert_eq!(status, 200, "{health}");

    // From now on every look waits in the database.
    let mut lock = app.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE conversation_outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let mut probes = Vec::new();
    for _ in 0..8 {
        let mut stream = connect_from(FLOODER, app.addr).await;
        let request = format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", app.addr);
        stream.write_all(request.as_bytes()).await.unwrap();
        probes.push(stream);
    }
    // Let the server take the probes up (not an assertion: a probe it has
    // not begun yet could be evicted either way).
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Every connection the server allows is held by the flood: the call
    // takes the place of a probe already answered and is served, though
    // looks at the installation still wait in the database.
    let mut call = connect_from(HEALTH_CHECKER, app.addr).await;
    let request = tool_request(&app, &token, &call_body("whoami", json!({})));
    call.write_all(request.as_bytes()).await.unwrap();
    let (status, body) = read_answer(&mut call, Duration::from_secs(10)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"]["structuredContent"]["agent"], "alice",
        "{body}"
    );

    // Each probe was answered from the snapshot taken before the lock, not
    // by a look of its own (which would report the outbox unavailable).
    for stream in &mut probes {
        let (status, health) = read_answer(stream, Duration::from_secs(10)).await;
        assert_eq!(status, 200, "{health}");
        assert!(health["publication"]["pending"].is_i64(), "{health}");
    }
    lock.rollback().await.unwrap();
}

/// A request pipelined behind another, of which only part has come, is a
/// request still sending its headers: its connection is closed by the header
/// timeout (1 s here), not kept for the idle timeout (120 s) as if it were
/// waiting. Beside it, a connection whose one request was answered in full
/// (a body included) is idle and stays open past the header timeout.
#[tokio::test]
async fn a_pipelined_partial_request_is_timed_by_the_header_deadline() {
    let app = TestApp::builder()
        .http(HttpSettings {
            header_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(120),
            ..HttpSettings::default()
        })
        .spawn()
        .await;
    app.team("acme").await;
    let token = app.agent("acme", "alice").await;
    let call = tool_request(&app, &token, &call_body("whoami", json!({})));

    // One write: a whole call with its body, then the start of a next request.
    let mut pipelined = TcpStream::connect(app.addr).await.unwrap();
    let wire = format!("{call}GET /health HTTP/1.1\r\nHo");
    pipelined.write_all(wire.as_bytes()).await.unwrap();
    // The same again, the partial request sent while the call is answered.
    let mut behind = TcpStream::connect(app.addr).await.unwrap();
    behind.write_all(call.as_bytes()).await.unwrap();
    behind.write_all(b"GET /health HT").await.unwrap();
    // A whole call and nothing after it.
    let mut idle = TcpStream::connect(app.addr).await.unwrap();
    idle.write_all(call.as_bytes()).await.unwrap();

    for stream in [&mut pipelined, &mut behind, &mut idle] {
        let (status, body) = read_answer(stream, Duration::from_secs(10)).await;
        assert_eq!(status, 200, "{body}");
    }
    for stream in [pipelined, behind] {
        assert!(
            matches!(
                outcome(stream, Duration::from_secs(30)).await,
                Outcome::Closed(text) if text.is_empty()
            ),
            "the unfinished headers are cut off by the header timeout, not kept for the idle one"
        );
    }
    assert!(
        matches!(
            outcome(idle, Duration::from_secs(3)).await,
            Outcome::Open(_)
        ),
        "a connection with nothing more to read is idle, not late with headers"
    );
}
