//! A small HTTP/1.1 client over a tokio `TcpStream`, for tests that drive real web servers on
//! loopback: one request per connection (`Connection: close`), the whole answer read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one exchange may take before the test fails.
pub const BOUND: Duration = Duration::from_secs(20);

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Response {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Sends one request with an optional JSON body and reads the whole answer. Panics (it is test
/// support) when the server does not answer a well-formed HTTP/1.1 response within [`BOUND`].
pub async fn request(addr: SocketAddr, method: &str, path: &str, json: Option<&str>) -> Response {
    request_with(addr, method, path, &[], json).await
}

/// [`request`] with more headers (`(name, value)`).
pub async fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    json: Option<&str>,
) -> Response {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(body) = json {
            request.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
        }
        request.push_str("\r\n");
        request.push_str(json.unwrap_or(""));
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("receive");
        String::from_utf8(raw).expect("utf-8 response")
    };
    let raw = tokio::time::timeout(BOUND, exchange)
        .await
        .unwrap_or_else(|_| panic!("no answer to {method} {path} on {addr} within {BOUND:?}"));
    parse(&raw)
}

/// `POST path` with a JSON body.
pub async fn post_json(addr: SocketAddr, path: &str, json: &str) -> Response {
    request(addr, "POST", path, Some(json)).await
}

fn parse(raw: &str) -> Response {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no end of headers in {raw:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked { dechunk(body) } else { body.to_owned() };
    Response { status, headers, body }
}

fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).expect("chunk size");
        if size == 0 {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").unwrap_or(&after[size..]);
    }
    body
}
