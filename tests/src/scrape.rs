//! A host's HTTP listener (`[service] listen`) as tests read it: one
//! `GET`, and `/metrics` as samples.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::time::Duration;

/// `GET path` on `127.0.0.1:port`: `(status, body)`, `None` when nothing
/// answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// `/metrics` parsed: each sample's name with its labels, and its value.
///
/// # Panics
/// Nothing answers, the status is not 200, or a line is no sample.
pub fn scrape(port: u16) -> BTreeMap<String, f64> {
    let (status, body) = http_get(port, "/metrics").expect("no /metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').unwrap();
            (key.to_string(), value.parse::<f64>().unwrap())
        })
        .collect()
}

/// Waits until `host` answers `/readyz` on `port` with 200 (its streams
/// and consumers are there), 60 s at most.
///
/// # Panics
/// The host exits or does not get ready in time (with its log).
pub async fn until_ready(host: &mut crate::chaos::HostProcess, port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while http_get(port, "/readyz").map(|r| r.0) != Some(200) {
        assert!(
            host.exited().is_none() && std::time::Instant::now() < deadline,
            "the host did not get ready; log:\n{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
