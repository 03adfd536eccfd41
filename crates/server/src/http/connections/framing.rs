//! Where one request ends and the next begins in the bytes a connection
//! reads, so a connection's timeouts can tell "waiting for a next request"
//! (the idle timeout) from "part of a next request has arrived" (the header
//! timeout). hyper reads ahead: the start of a pipelined request often
//! arrives in the same read as the end of the one before, or while that one
//! is still being answered, and then sits in hyper's buffer where no later
//! read reveals it. [`Framing`] follows the HTTP/1 message framing over the
//! bytes as they are read (the head up to its blank line, then a body by its
//! `Content-Length` or its chunks) and says when a head begins.
//!
//! It only times connections: hyper still parses every request. Anything it
//! cannot follow (a head larger than it keeps, a malformed length) makes it
//! give up for the rest of the connection ([`Framing::lost`]), and the
//! connection is then timed as before, by bytes read while no request is
//! open.

/// A head larger than this is not followed (hyper refuses far smaller ones).
const HEAD_MAX_BYTES: usize = 64 * 1024;
/// A chunk-size line or trailer line longer than this is not followed.
const LINE_MAX_BYTES: usize = 4 * 1024;

/// The framing of the bytes read so far on one connection.
pub(super) struct Framing {
    state: State,
}

enum State {
    /// Between messages: blank lines may precede a request line.
    Between,
    /// Inside a head: its bytes so far.
    Head(Vec<u8>),
    /// Inside a body of known length: bytes still to come.
    Body(u64),
    /// A chunk-size line (or, after the last chunk, a trailer line): its bytes so far.
    ChunkSize(Vec<u8>),
    /// Inside a chunk's data: bytes still to come, then its CRLF.
    ChunkData(u64),
    /// The CRLF after a chunk's data: bytes of it still to come.
    ChunkEnd(u8),
    /// After the last chunk: trailer lines until a blank one.
    Trailers(Vec<u8>),
    /// Gave up: not followed any more.
    Lost,
}

impl Framing {
    pub(super) fn new() -> Framing {
        Framing {
            state: State::Between,
        }
    }

    /// Whether this connection's framing is no longer followed.
    pub(super) fn lost(&self) -> bool {
        matches!(self.state, State::Lost)
    }

    /// Follow `bytes`; the number of request heads that began in them.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) -> usize {
        let mut begun = 0;
        while !bytes.is_empty() {
            match &mut self.state {
                State::Lost => return begun,
                State::Between => {
                    let skip = bytes
                        .iter()
                        .take_while(|b| **b == b'\r' || **b == b'\n')
                        .count();
                    bytes = &bytes[skip..];
                    if !bytes.is_empty() {
                        begun += 1;
                        self.state = State::Head(Vec::new());
                    }
                }
                State::Head(head) => {
                    let before = head.len();
                    head.extend_from_slice(bytes);
                    let Some(end) = head_end(head) else {
                        if head.len() > HEAD_MAX_BYTES {
                            self.state = State::Lost;
                        }
                        return begun;
                    };
                    bytes = &bytes[end - before..];
                    head.truncate(end);
                    self.state = match body_of(head) {
                        Some(Body::None) => State::Between,
                        Some(Body::Length(n)) => State::Body(n),
                        Some(Body::Chunked) => State::ChunkSize(Vec::new()),
                        None => State::Lost,
                    };
                }
                State::Body(remaining) => {
                    let take =
                        usize::try_from(*remaining).map_or(bytes.len(), |r| r.min(bytes.len()));
                    *remaining -= take as u64;
                    bytes = &bytes[take..];
                    if *remaining == 0 {
                        self.state = State::Between;
                    }
                }
                State::ChunkSize(line) | State::Trailers(line) => {
                    let Some(newline) = bytes.iter().position(|b| *b == b'\n') else {
                        line.extend_from_slice(bytes);
                        if line.len() > LINE_MAX_BYTES {
                            self.state = State::Lost;
                        }
                        return begun;
                    };
                    line.extend_from_slice(&bytes[..newline]);
                    bytes = &bytes[newline + 1..];
                    let text = String::from_utf8_lossy(line).trim().to_string();
                    self.state = if matches!(self.state, State::Trailers(_)) {
                        if text.is_empty() {
                            State::Between
                        } else {
                            State::Trailers(Vec::new())
                        }
                    } else {
                        let size = text.split(';').next().unwrap_or("").trim();
                        match u64::from_str_radix(size, 16) {
                            Ok(0) => State::Trailers(Vec::new()),
                            Ok(n) => State::ChunkData(n),
                            Err(_) => State::Lost,
                        }
                    };
                }
                State::ChunkData(remaining) => {
                    let take =
                        usize::try_from(*remaining).map_or(bytes.len(), |r| r.min(bytes.len()));
                    *remaining -= take as u64;
                    bytes = &bytes[take..];
                    if *remaining == 0 {
                        self.state = State::ChunkEnd(2);
                    }
                }
                State::ChunkEnd(left) => {
                    // CRLF, or a bare LF (which hyper also takes).
                    if bytes[0] == b'\r' && *left == 2 {
                        *left = 1;
                        bytes = &bytes[1..];
                    } else if bytes[0] == b'\n' {
                        bytes = &bytes[1..];
                        self.state = State::ChunkSize(Vec::new());
                    } else {
                        self.state = State::Lost;
                    }
                }
            }
        }
        begun
    }
}

/// The length of a head up to and including its blank line, if it is there.
fn head_end(head: &[u8]) -> Option<usize> {
    let crlf = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = head.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

enum Body {
    None,
    Length(u64),
    Chunked,
}

/// What body follows `head`, as hyper reads it: chunked when
/// `Transfer-Encoding` is given, else `Content-Length`, else none. `None`
/// when that cannot be told (hyper then refuses the request anyway).
fn body_of(head: &[u8]) -> Option<Body> {
    let text = std::str::from_utf8(head).ok()?;
    let mut length = None;
    for line in text.lines().skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return value
                .to_ascii_lowercase()
                .trim_end()
                .ends_with("chunked")
                .then_some(Body::Chunked);
        }
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.parse::<u64>().ok()?);
        }
    }
    Some(length.map_or(Body::None, Body::Length))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipelined_head_is_seen_wherever_the_reads_split() {
        let wire: &[u8] = b"POST /mcp HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello\
GET /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n\r\nGET /a HTTP/1.1\r\nHo";
        let heads_at = |split: usize| {
            let mut framing = Framing::new();
            let begun = framing.feed(&wire[..split]) + framing.feed(&wire[split..]);
            assert!(!framing.lost());
            begun
        };
        for split in 0..=wire.len() {
            assert_eq!(heads_at(split), 3, "split at {split}");
        }
        let mut framing = Framing::new();
        assert_eq!(
            framing.feed(b"POST / HTTP/1.1\r\nContent-Length: 4\r\n\r\nGET "),
            1
        );
        assert_eq!(
            framing.feed(b"/"),
            1,
            "the next head, once the body is done"
        );
    }

    #[test]
    fn what_it_cannot_follow_it_gives_up() {
        let mut framing = Framing::new();
        framing.feed(b"POST / HTTP/1.1\r\nContent-Length: many\r\n\r\n");
        assert!(framing.lost());
        assert_eq!(framing.feed(b"GET / HTTP/1.1\r\n\r\n"), 0);
    }
}
