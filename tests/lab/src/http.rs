//! A plain HTTP/1.1 GET over TCP: etcd's health endpoint and kubelet-style httpGet probes need
//! the status code and a little of the body, nothing more.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response: status code and (at most 64 KiB of) body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// GET `path` from `addr` with `headers`, within `timeout`.
pub async fn get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(String, String)],
    timeout: Duration,
) -> Result<Response> {
    tokio::time::timeout(timeout, get_inner(addr, host, path, headers))
        .await
        .with_context(|| format!("GET http://{addr}{path}: no answer within {timeout:?}"))?
}

async fn get_inner(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(String, String)],
) -> Result<Response> {
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    // The kubelet's probes send these unless the probe sets its own.
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    if !has("User-Agent") {
        request.push_str("User-Agent: kube-probe/1.35\r\n");
    }
    if !has("Accept") {
        request.push_str("Accept: */*\r\n");
    }
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || buf.len() > 64 * 1024 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    let status_line = text.lines().next().unwrap_or_default();
    let Some(code) = status_line.split_whitespace().nth(1) else {
        bail!("{addr}: not an HTTP response: {status_line:?}");
    };
    let status = code
        .parse()
        .with_context(|| format!("{addr}: bad status line {status_line:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok(Response { status, body })
}
