//! One JSON request to the loopback HTTP APIs of our Go stand-ins (`kubelet-dm`,
//! `kubelet-node`): HTTP/1.0, so the server closes the connection after the answer.

use anyhow::{Context, Result, anyhow};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `method path` with an optional JSON body to `addr` (`127.0.0.1:port`); returns the status
/// and the JSON body (`Null` when empty). `who` names the server in errors.
pub async fn request(
    who: &str,
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value)> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {who} at {addr}"))?;
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await?;
    let text = String::from_utf8(buf)?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("malformed HTTP response from {who}: {text:?}"))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow!("no status in {head:?}"))?
        .parse()?;
    let value = if body.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).with_context(|| format!("{who} {path} returned {body:?}"))?
    };
    Ok((status, value))
}
