//! A minimal HTTP/1.1 client for the agent's unix socket: one request per connection
//! (`Connection: close`), JSON bodies with `Content-Length`, responses framed by
//! `Content-Length`, chunked transfer coding, or end of stream. The whole exchange, connect
//! included, is bounded by one deadline.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use allot_api::ErrorBody;

use crate::error::CniError;

/// Responses larger than this are refused (the API's biggest answer is a few KiB).
const MAX_RESPONSE: usize = 16 << 20;

/// How often an ADD looks for an agent that is not listening yet.
pub const AGENT_RETRY: Duration = Duration::from_millis(250);

/// How a call went wrong. The verbs decide what each means (DEL forgives the transport
/// failures; STATUS turns them into code 50; ADD and CHECK into code 11).
#[derive(Debug)]
pub enum CallError {
    /// Could not connect: no socket file, nobody listening, or connect timed out.
    Unreachable(io::Error),
    /// Connected, but no complete answer before the deadline.
    TimedOut,
    /// Connected, but the connection failed or closed before a complete answer.
    Broken(String),
    /// The agent answered something that is not HTTP or not the API.
    Protocol(String),
    /// The agent answered non-2xx with an [`ErrorBody`].
    Agent(CniError),
    /// The agent answered non-2xx without an [`ErrorBody`].
    Status(u16, String),
}

impl CallError {
    /// Whether the agent can be presumed down or stuck (as opposed to having answered).
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            CallError::Unreachable(_) | CallError::TimedOut | CallError::Broken(_)
        )
    }

    /// A one-line description naming the socket.
    pub fn describe(&self, socket: &Path, timeout: Duration) -> String {
        let socket = socket.display();
        match self {
            CallError::Unreachable(e) => {
                format!("allot-agent is not reachable at {socket}: {e}")
            }
            CallError::TimedOut => format!(
                "allot-agent at {socket} did not answer within {} ms",
                timeout.as_millis()
            ),
            CallError::Broken(e) => {
                format!("the connection to allot-agent at {socket} failed: {e}")
            }
            CallError::Protocol(e) => {
                format!("allot-agent at {socket} answered something unexpected: {e}")
            }
            CallError::Agent(e) => e.to_string(),
            CallError::Status(code, body) => {
                format!("allot-agent at {socket} answered HTTP {code}: {body}")
            }
        }
    }
}

pub struct Client {
    pub socket: PathBuf,
    pub timeout: Duration,
}

impl Client {
    pub fn new(socket: PathBuf, timeout: Duration) -> Self {
        Client { socket, timeout }
    }

    /// POST `body` as JSON to `path`; the 2xx body on success.
    pub fn post<T: serde::Serialize>(&self, path: &str, body: &T) -> Result<Vec<u8>, CallError> {
        let json = serde_json::to_vec(body)
            .map_err(|e| CallError::Protocol(format!("cannot encode the request: {e}")))?;
        self.call("POST", path, Some(&json))
    }

    /// POST as [`Client::post`], but while the agent cannot be reached at all (no socket file,
    /// nobody listening: it is starting or restarting, as in a rolling update of its
    /// DaemonSet) try again every [`AGENT_RETRY`] until the timeout has passed. A request that
    /// was never delivered is safe to send again; the runtime's call then succeeds once the
    /// agent is back instead of failing into the kubelet's back-off.
    pub fn post_waiting_for_agent<T: serde::Serialize>(
        &self,
        path: &str,
        body: &T,
    ) -> Result<Vec<u8>, CallError> {
        let started = Instant::now();
        loop {
            let left = self.timeout.saturating_sub(started.elapsed());
            let attempt = Client::new(self.socket.clone(), left);
            match attempt.post(path, body) {
                Err(CallError::Unreachable(_)) if left > AGENT_RETRY * 2 => {
                    thread::sleep(AGENT_RETRY)
                }
                other => return other,
            }
        }
    }

    pub fn get(&self, path: &str) -> Result<Vec<u8>, CallError> {
        self.call("GET", path, None)
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Vec<u8>, CallError> {
        let deadline = Instant::now() + self.timeout;
        let mut stream = connect(&self.socket, self.timeout).map_err(CallError::Unreachable)?;
        let request = build_request(method, path, body);
        let written =
            set_timeout(&stream, deadline, true).and_then(|()| stream.write_all(&request));
        let response = read_response(&mut stream, deadline);
        let response = match (written, response) {
            (_, Ok(r)) => r,
            // The agent may answer (an error) and close before reading everything we sent;
            // prefer its answer, else report the write failure.
            (Err(w), Err(ReadError::Io(_))) => return Err(io_failure(w)),
            (_, Err(ReadError::Io(e))) => return Err(io_failure(e)),
            (_, Err(ReadError::Parse(e))) => return Err(CallError::Protocol(e)),
        };
        if (200..300).contains(&response.status) {
            return Ok(response.body);
        }
        match serde_json::from_slice::<ErrorBody>(&response.body) {
            Ok(body) => Err(CallError::Agent(body.into())),
            Err(_) => Err(CallError::Status(response.status, snippet(&response.body))),
        }
    }
}

fn io_failure(e: io::Error) -> CallError {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => CallError::TimedOut,
        _ => CallError::Broken(e.to_string()),
    }
}

/// `UnixStream::connect` blocks while the listener's backlog is full, and std offers no
/// connect timeout for unix sockets: connect on a helper thread and stop waiting at the
/// deadline (the process exits soon after anyway).
fn connect(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let (tx, rx) = mpsc::channel();
    let owned = path.to_owned();
    let spawned = thread::Builder::new()
        .name("connect".into())
        .spawn(move || {
            let _ = tx.send(UnixStream::connect(owned));
        });
    if spawned.is_err() {
        return UnixStream::connect(path);
    }
    match rx.recv_timeout(timeout) {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connect timed out after {} ms", timeout.as_millis()),
        )),
    }
}

fn set_timeout(stream: &UnixStream, deadline: Instant, write: bool) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    if write {
        stream.set_write_timeout(Some(left))
    } else {
        stream.set_read_timeout(Some(left))
    }
}

pub fn build_request(method: &str, path: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: allot-agent\r\nUser-Agent: allot-cni/{}\r\n\
         Accept: application/json\r\nConnection: close\r\n",
        env!("CARGO_PKG_VERSION")
    )
    .into_bytes();
    if let Some(body) = body {
        req.extend_from_slice(
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
            .as_bytes(),
        );
    }
    req.extend_from_slice(b"\r\n");
    if let Some(body) = body {
        req.extend_from_slice(body);
    }
    req
}

enum ReadError {
    Io(io::Error),
    Parse(String),
}

fn read_response(stream: &mut UnixStream, deadline: Instant) -> Result<Response, ReadError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 8192];
    loop {
        set_timeout(stream, deadline, false).map_err(ReadError::Io)?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // A reset after a complete response is still a response.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && !buf.is_empty() => 0,
            Err(e) => return Err(ReadError::Io(e)),
        };
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_RESPONSE {
            return Err(ReadError::Parse(format!(
                "response larger than {MAX_RESPONSE} bytes"
            )));
        }
        let eof = n == 0;
        match parse_response(&buf, eof) {
            Ok(Some(r)) => return Ok(r),
            Ok(None) if eof => {
                let what = if buf.is_empty() {
                    "the agent closed the connection without answering"
                } else {
                    "the agent closed the connection in the middle of its answer"
                };
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    what,
                )));
            }
            Ok(None) => {}
            Err(e) => return Err(ReadError::Parse(e.to_string())),
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Why the bytes read are not a valid HTTP/1.1 response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    #[error("malformed HTTP response: {0}")]
    Malformed(#[source] httparse::Error),
    #[error("malformed Content-Length")]
    ContentLength,
    #[error("conflicting Content-Length headers")]
    ConflictingContentLength,
    /// A Content-Length past what the plugin reads ([`MAX_RESPONSE`]).
    #[error("Content-Length {0} is too large")]
    TooLarge(usize),
    #[error("malformed chunk size")]
    ChunkSize,
    /// Chunks that add up past [`MAX_RESPONSE`].
    #[error("chunked body too large")]
    ChunkedTooLarge,
    #[error("chunk not followed by CRLF")]
    ChunkNotTerminated,
}

/// Parses a complete response from `buf`, or `Ok(None)` when it is incomplete. `eof` says the
/// stream has ended, which completes a body that has no framing. Interim 1xx responses are
/// skipped. `Err` means the bytes are not a valid HTTP/1.1 response.
pub fn parse_response(buf: &[u8], eof: bool) -> Result<Option<Response>, ResponseError> {
    let mut offset = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let head_len = match resp.parse(&buf[offset..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(ResponseError::Malformed(e)),
        };
        let status = resp.code.unwrap_or(0);
        let body_start = offset + head_len;
        if (100..200).contains(&status) && status != 101 {
            offset = body_start;
            continue;
        }
        let mut content_length: Option<usize> = None;
        let mut chunked = false;
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let v = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .ok_or(ResponseError::ContentLength)?;
                if content_length.is_some_and(|c| c != v) {
                    return Err(ResponseError::ConflictingContentLength);
                }
                content_length = Some(v);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
                chunked = v
                    .rsplit(',')
                    .next()
                    .is_some_and(|last| last.trim() == "chunked");
            }
        }
        let rest = &buf[body_start..];
        let done = |body: Vec<u8>| Ok(Some(Response { status, body }));
        if status == 204 || status == 304 {
            return done(Vec::new());
        }
        if chunked {
            return match decode_chunked(rest)? {
                Some(body) => done(body),
                None => Ok(None),
            };
        }
        if let Some(len) = content_length {
            if len > MAX_RESPONSE {
                return Err(ResponseError::TooLarge(len));
            }
            return if rest.len() >= len {
                done(rest[..len].to_vec())
            } else {
                Ok(None)
            };
        }
        return if eof { done(rest.to_vec()) } else { Ok(None) };
    }
}

/// Decodes a chunked body, or `Ok(None)` when incomplete. Chunk extensions and trailers are
/// ignored.
fn decode_chunked(buf: &[u8]) -> Result<Option<Vec<u8>>, ResponseError> {
    let mut body = Vec::new();
    let mut pos = 0;
    loop {
        let (consumed, size) = match httparse::parse_chunk_size(&buf[pos..]) {
            Ok(httparse::Status::Complete(x)) => x,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(ResponseError::ChunkSize),
        };
        pos += consumed;
        if size == 0 {
            // Trailer lines, then an empty line.
            loop {
                let Some(end) = find_crlf(&buf[pos..]) else {
                    return Ok(None);
                };
                pos += end + 2;
                if end == 0 {
                    return Ok(Some(body));
                }
            }
        }
        let size = usize::try_from(size)
            .ok()
            .filter(|s| body.len().saturating_add(*s) <= MAX_RESPONSE)
            .ok_or(ResponseError::ChunkedTooLarge)?;
        let Some(chunk_end) = pos.checked_add(size) else {
            return Err(ResponseError::ChunkedTooLarge);
        };
        if buf.len() < chunk_end + 2 {
            return Ok(None);
        }
        if &buf[chunk_end..chunk_end + 2] != b"\r\n" {
            return Err(ResponseError::ChunkNotTerminated);
        }
        body.extend_from_slice(&buf[pos..chunk_end]);
        pos = chunk_end + 2;
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

/// The start of a body, for error messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(no body)".into();
    }
    let mut s: String = text.chars().take(200).collect();
    if text.chars().count() > 200 {
        s.push('…');
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn requests_are_framed() {
        let r = build_request("POST", "/v1/add", Some(b"{\"a\":1}"));
        let text = String::from_utf8(r).unwrap();
        assert!(
            text.starts_with("POST /v1/add HTTP/1.1\r\nHost: allot-agent\r\n"),
            "{text}"
        );
        assert!(text.contains("\r\nContent-Length: 7\r\n"), "{text}");
        assert!(text.contains("\r\nConnection: close\r\n"), "{text}");
        assert!(text.ends_with("\r\n\r\n{\"a\":1}"), "{text}");
        let g = String::from_utf8(build_request("GET", "/v1/status", None)).unwrap();
        assert!(
            !g.contains("Content-Length") && g.ends_with("\r\n\r\n"),
            "{g}"
        );
        // Parses as HTTP.
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut headers);
        assert!(req.parse(g.as_bytes()).unwrap().is_complete());
    }

    #[test]
    fn content_length_bodies() {
        let full = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        for cut in 0..full.len() {
            assert_eq!(parse_response(&full[..cut], false), Ok(None), "cut {cut}");
            assert_eq!(parse_response(&full[..cut], true), Ok(None), "cut {cut}");
        }
        assert_eq!(
            parse_response(full, false),
            Ok(Some(Response {
                status: 200,
                body: b"{}".to_vec()
            }))
        );
        // Extra bytes after the body are ignored.
        let more = b"HTTP/1.1 500 Oops\r\ncontent-length: 1\r\n\r\nxyz";
        assert_eq!(parse_response(more, false).unwrap().unwrap().body, b"x");
    }

    #[test]
    fn unframed_bodies_end_at_eof() {
        let r = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello";
        assert_eq!(parse_response(r, false), Ok(None));
        assert_eq!(parse_response(r, true).unwrap().unwrap().body, b"hello");
    }

    #[test]
    fn chunked_bodies() {
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3;ext=1\r\n:1}\r\n0\r\nX-T: y\r\n\r\n";
        for cut in 0..r.len() {
            assert_eq!(parse_response(&r[..cut], false), Ok(None), "cut {cut}");
        }
        assert_eq!(
            parse_response(r, false).unwrap().unwrap().body,
            b"{\"a\":1}"
        );
        let bad = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n";
        assert_eq!(
            parse_response(bad, false),
            Err(ResponseError::ChunkNotTerminated)
        );
    }

    #[test]
    fn no_content_and_interim_responses() {
        let r = b"HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(
            parse_response(r, false).unwrap().unwrap(),
            Response {
                status: 204,
                body: vec![]
            }
        );
        let r = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx";
        assert_eq!(parse_response(r, false).unwrap().unwrap().status, 200);
    }

    #[test]
    fn garbage_is_an_error() {
        let ssh = parse_response(b"SSH-2.0-OpenSSH\r\n\r\n", false).unwrap_err();
        assert!(matches!(ssh, ResponseError::Malformed(_)), "{ssh}");
        assert!(
            ssh.to_string().starts_with("malformed HTTP response: "),
            "{ssh}"
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", false),
            Err(ResponseError::ContentLength)
        );
        assert_eq!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
                false
            ),
            Err(ResponseError::ConflictingContentLength)
        );
    }

    #[test]
    fn snippets_are_short() {
        assert_eq!(snippet(b"  "), "(no body)");
        assert_eq!(snippet(&[b'a'; 300]).chars().count(), 201);
    }

    pub(crate) fn http(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    #[test]
    fn a_request_waits_for_an_agent_that_starts_listening_within_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let late = path.clone();
        let agent = thread::spawn(move || {
            thread::sleep(Duration::from_millis(600));
            let listener = UnixListener::bind(&late).unwrap();
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                .unwrap();
        });
        let client = Client::new(path.clone(), Duration::from_secs(10));
        let started = Instant::now();
        let body = client
            .post_waiting_for_agent("/v1/add", &serde_json::json!({}))
            .unwrap();
        assert_eq!(body, b"{}");
        assert!(started.elapsed() >= Duration::from_millis(500));
        agent.join().unwrap();

        // Nobody ever listens: the ADD gives up at its timeout, as unreachable.
        let nobody = Client::new(dir.path().join("none.sock"), Duration::from_millis(800));
        let started = Instant::now();
        let err = nobody
            .post_waiting_for_agent("/v1/add", &serde_json::json!({}))
            .unwrap_err();
        assert!(matches!(err, CallError::Unreachable(_)), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// A fake agent: answers one request on a fresh socket with `answer`; the join handle
    /// returns the request's bytes.
    pub(crate) fn serve_once(
        answer: Vec<u8>,
    ) -> (tempfile::TempDir, PathBuf, thread::JoinHandle<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let handle = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            loop {
                let n = s.read(&mut chunk).unwrap();
                buf.extend_from_slice(&chunk[..n]);
                let mut h = [httparse::EMPTY_HEADER; 16];
                let mut req = httparse::Request::new(&mut h);
                if let Ok(httparse::Status::Complete(head)) = req.parse(&buf) {
                    let len = req
                        .headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                        .map(|h| {
                            std::str::from_utf8(h.value)
                                .unwrap()
                                .parse::<usize>()
                                .unwrap()
                        })
                        .unwrap_or(0);
                    if buf.len() >= head + len {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            s.write_all(&answer).unwrap();
            buf
        });
        (dir, path, handle)
    }

    #[test]
    fn round_trip_over_a_socket() {
        let (_dir, path, h) = serve_once(http("200 OK", r#"{"ok":true}"#));
        let c = Client::new(path, Duration::from_secs(5));
        let body = c.post("/v1/del", &serde_json::json!({"x": 1})).unwrap();
        assert_eq!(body, b"{\"ok\":true}");
        let req = String::from_utf8(h.join().unwrap()).unwrap();
        assert!(
            req.starts_with("POST /v1/del HTTP/1.1\r\n") && req.ends_with("{\"x\":1}"),
            "{req}"
        );
    }

    #[test]
    fn error_bodies_become_agent_errors() {
        let (_dir, path, h) = serve_once(http(
            "409 Conflict",
            r#"{"code":100,"msg":"full","details":"p1: 0"}"#,
        ));
        let c = Client::new(path, Duration::from_secs(5));
        match c.get("/v1/status") {
            Err(CallError::Agent(e)) => {
                assert_eq!(e, CniError::new(100, "full").with_details("p1: 0"))
            }
            other => panic!("{other:?}"),
        }
        h.join().unwrap();
        let (_dir, path, h) = serve_once(http("502 Bad Gateway", "nope"));
        match Client::new(path, Duration::from_secs(5)).get("/x") {
            Err(CallError::Status(502, body)) => assert_eq!(body, "nope"),
            other => panic!("{other:?}"),
        }
        h.join().unwrap();
    }

    #[test]
    fn missing_socket_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let c = Client::new(dir.path().join("none.sock"), Duration::from_secs(1));
        let e = c.get("/v1/status").unwrap_err();
        assert!(
            matches!(e, CallError::Unreachable(_)) && e.is_transport(),
            "{e:?}"
        );
        assert!(e.describe(&c.socket, c.timeout).contains("none.sock"));
    }

    #[test]
    fn silent_agent_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slow.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let h = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            thread::sleep(Duration::from_millis(600));
            drop(s);
        });
        let start = Instant::now();
        let e = Client::new(path, Duration::from_millis(200))
            .get("/v1/status")
            .unwrap_err();
        assert!(matches!(e, CallError::TimedOut), "{e:?}");
        assert!(start.elapsed() < Duration::from_millis(550));
        h.join().unwrap();
    }
}
